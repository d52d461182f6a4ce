//! A team's own application over Hookledger, as docs/extending.md shows it:
//! one projection (an account's plan limit, from `plan.limits` events) and
//! its re-check (the limit compared with the billing API), in a crate of
//! its own, tested on the memory world, registered by the functions'
//! `main.rs` without editing Hookledger.

// --- begin readme ---
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hookledger::projection::recheck::{CheckFuture, DEFAULT_INTERVAL_MS, Recheck, Repair, Verdict};
use hookledger::projection::snapshot::{Version, replace_if_newer};
use hookledger::projection::state::{required_n, required_s};
use hookledger::projection::{
    Decision, EventContext, Item, PlanFuture, Projection, ProjectionContext, ProjectionError, State, StateKey, get_s,
    n, s,
};

/// An account's plan limit as stored, with the revision it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub account: String,
    pub limit: i64,
    pub revision: i64,
}

impl State for Limit {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        Ok(Self {
            account: required_s(item, "account")?.to_owned(),
            limit: required_n(item, "limit")?,
            revision: required_n(item, "revision")?,
        })
    }
}

pub const PREFIX: &str = "proj#plan-limits#";

pub fn limit_key(tenant: &str, account: &str) -> StateKey<Limit> {
    StateKey::new(format!("{PREFIX}{tenant}#{account}"))
}

/// `plan.limits` events (`{"data": {"account", "revision", "limit"}}`): a
/// snapshot guarded by its revision.
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
            let (Some(account), Some(revision), Some(limit)) =
                (d["account"].as_str(), d["revision"].as_i64(), d["limit"].as_i64())
            else {
                return Err(ProjectionError::Permanent("plan.limits needs account, revision and limit".into()));
            };
            let mut attrs = Item::from([
                ("account".to_owned(), s(account)),
                ("limit".to_owned(), n(limit)),
                ("endpoint".to_owned(), s(&ev.endpoint)),
                ("tenant".to_owned(), s(&ev.tenant)),
            ]);
            // Compared with the billing API an interval after this attempt.
            attrs.extend(cx.recheck_at(account, ev.processing_at_ms + DEFAULT_INTERVAL_MS));
            let key = limit_key(&ev.tenant, account);
            Ok(Decision::Apply(vec![replace_if_newer(key.pk(), Version { generation: 0, revision }, attrs)]))
        })
    }
}

/// The billing API's answer: the account's limit now, and its revision.
pub type LimitFuture<'a> = Pin<Box<dyn Future<Output = Result<Option<(i64, i64)>, String>> + Send + 'a>>;

/// The billing API (its HTTPS client in production, a map in tests).
pub trait Billing: Send + Sync {
    fn limit<'a>(&'a self, account: &'a str) -> LimitFuture<'a>;
}

/// The re-check: a stored limit the billing API disagrees with is repaired
/// by the API's own snapshot, as a `plan.limits` event whose id names the
/// drift instance (the same answer, the same repair).
pub struct PlanLimitsDrift {
    pub billing: Arc<dyn Billing>,
}

impl Recheck for PlanLimitsDrift {
    fn name(&self) -> &'static str {
        "plan_limits"
    }

    fn prefix(&self) -> &'static str {
        PREFIX
    }

    fn check<'a>(&'a self, item: &'a Item, _now_ms: i64) -> CheckFuture<'a> {
        Box::pin(async move {
            let local = Limit::decode(item)?;
            let answer = self.billing.limit(&local.account).await.map_err(ProjectionError::Unavailable)?;
            let Some((limit, revision)) = answer.filter(|(limit, _)| *limit != local.limit) else {
                return Ok(Verdict::Same);
            };
            let event_id = format!("recon:{}:{revision}", local.account);
            let body = serde_json::json!({"id": event_id, "type": "plan.limits",
                "data": {"account": local.account, "revision": revision, "limit": limit}});
            Ok(Verdict::Drift(Repair {
                provider: "standard_webhooks".into(),
                endpoint: get_s(item, "endpoint").unwrap_or_default().to_owned(),
                tenant: get_s(item, "tenant").unwrap_or_default().to_owned(),
                event_id,
                event_type: "plan.limits".into(),
                body: body.to_string().into_bytes(),
                detail: format!("{}: limit {} here, {limit} at billing", local.account, local.limit),
            }))
        })
    }
}
// --- end readme ---

#[cfg(test)]
mod tests {
    // --- begin test ---
    use std::collections::HashMap;
    use std::sync::Mutex;

    use hookledger::adapters::memory::World;
    use hookledger::clock::Ambient;
    use hookledger::identity::EventKey;
    use hookledger::projection::get_n;

    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn limits(account: &str, revision: i64, limit: i64) -> EventContext {
        let body = serde_json::json!({"type": "plan.limits", "data": {"account": account, "revision": revision, "limit": limit}});
        EventContext {
            key: EventKey::new("standard_webhooks", "billing", &format!("evt_{revision}")),
            provider: "standard_webhooks".into(),
            endpoint: "billing".into(),
            tenant: "t1".into(),
            event_id: format!("evt_{revision}"),
            event_type: "plan.limits".into(),
            body,
            received_at_ms: NOW,
            processing_at_ms: NOW,
        }
    }

    #[derive(Default)]
    struct FakeBilling(Mutex<HashMap<String, (i64, i64)>>);

    impl Billing for FakeBilling {
        fn limit<'a>(&'a self, account: &'a str) -> LimitFuture<'a> {
            let answer = self.0.lock().unwrap().get(account).copied();
            Box::pin(async move { Ok(answer) })
        }
    }

    #[tokio::test]
    async fn a_limit_is_kept_by_revision_and_its_drift_repaired_by_one_event() {
        let world = World::new(Ambient::fixed(NOW, 1));
        let cx = world.projection_context();
        // Planned on the world's state, committed as the processor commits.
        let apply = |d: Decision| match d {
            Decision::Apply(ops) => world.apply(&ops),
            other => panic!("{other:?}"),
        };
        assert_eq!(apply(PlanLimits.plan(&limits("acct_1", 2, 10), &cx).await.unwrap()), Ok(()));
        assert_eq!(apply(PlanLimits.plan(&limits("acct_1", 1, 99), &cx).await.unwrap()), Err(vec![0]), "older");
        let stored = cx.read(&limit_key("t1", "acct_1")).await.unwrap();
        assert_eq!(stored, Some(Limit { account: "acct_1".into(), limit: 10, revision: 2 }));
        let item = world.state_item(limit_key("t1", "acct_1").pk()).unwrap();
        assert_eq!(get_n(&item, "due_at"), Some(NOW + DEFAULT_INTERVAL_MS), "re-checked an interval later");

        let billing = Arc::new(FakeBilling::default());
        let drift = PlanLimitsDrift { billing: billing.clone() };
        billing.0.lock().unwrap().insert("acct_1".into(), (10, 2));
        assert_eq!(drift.check(&item, NOW).await.unwrap(), Verdict::Same);
        billing.0.lock().unwrap().insert("acct_1".into(), (25, 3));
        let Verdict::Drift(repair) = drift.check(&item, NOW).await.unwrap() else { panic!("drift") };
        assert_eq!((repair.event_id.as_str(), repair.endpoint.as_str()), ("recon:acct_1:3", "billing"));
        // The repair goes through the pipeline like any event: applied once.
        let mut event = limits("acct_1", 3, 25);
        event.body = serde_json::from_slice(&repair.body).unwrap();
        assert_eq!(apply(PlanLimits.plan(&event, &cx).await.unwrap()), Ok(()));
        assert_eq!(cx.read(&limit_key("t1", "acct_1")).await.unwrap().map(|l| l.limit), Some(25));
    }
    // --- end test ---

    /// docs/extending.md shows this crate's code as it is.
    #[test]
    fn the_docs_show_this_crate_as_it_is() {
        let docs = include_str!("../../../docs/extending.md");
        let code = include_str!("lib.rs");
        for (begin, end) in [
            ("// --- begin readme ---\n", "// --- end readme ---"),
            ("    // --- begin test ---\n", "    // --- end test ---"),
        ] {
            let start = code.find(begin).map(|i| i + begin.len()).expect("begin marker");
            let stop = code.find(end).expect("end marker");
            let shown: String =
                code[start..stop].lines().map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l))).collect();
            let shown = if begin.starts_with(' ') { shown } else { code[start..stop].to_owned() };
            assert!(
                docs.contains(&format!("```rust\n{shown}```")),
                "docs/extending.md does not show {begin:?} as it is"
            );
        }
    }
}
