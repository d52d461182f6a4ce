//! A custom projection, as shown in docs/extending.md, registered
//! next to the reference application: `cargo run -p hookledger --example custom_projection`.

// --- begin readme ---
use hookledger::projection::snapshot::{Version, replace_if_newer};
use hookledger::projection::{Decision, EventContext, PlanFuture, Projection, ProjectionContext, n, s};

pub struct PlanLimits;

impl Projection for PlanLimits {
    fn name(&self) -> &'static str {
        "plan_limits"
    }
    fn handles(&self, _provider: &str, event_type: &str) -> bool {
        event_type == "plan.limits"
    }
    fn plan<'a>(&'a self, ev: &'a EventContext, cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let d = &ev.body["data"];
            let (Some(account), Some(rev)) = (d["account"].as_str(), d["revision"].as_i64()) else {
                return Err(hookledger::projection::ProjectionError::Permanent("missing account/revision".into()));
            };
            let attrs =
                [("limit".to_owned(), n(d["limit"].as_i64().unwrap_or(0))), ("account".to_owned(), s(account))].into();
            let pk = format!("proj#plan-limits#{}#{account}", ev.tenant);
            Ok(Decision::Apply(vec![replace_if_newer(&cx.table, &pk, Version { generation: 0, revision: rev }, attrs)]))
        })
    }
}
// --- end readme ---

fn main() {
    let registry = hookledger::app::reference_registry(None, None).register(PlanLimits);
    let matching: Vec<&str> = registry.matching("standard_webhooks", "plan.limits").iter().map(|p| p.name()).collect();
    println!("projections for plan.limits: {matching:?}");
}
