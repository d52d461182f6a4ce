//! `hookledger audit`: an endpoint's window as its provider lists it (Stripe's
//! events, a GitHub hook's deliveries), side by side with the ledger and
//! every route ([`hookledger::completeness`]). Fails (non-zero) when an
//! event is missing or doubled, for cron and CI.

use std::io::Write;

use clap::Args;
use hookledger::adapters::dynamodb::outbox::DynamoOutbox;
use hookledger::completeness::{self, Audit, Report, Scope};
use hookledger::config;
use hookledger::ports::Window;
use hookledger::verify::provider::BackfillList;
use hookledger::wiring::Wiring;

use crate::backfill::{Keys, ListArgs};

#[derive(Args)]
pub struct AuditArgs {
    /// The endpoint (a name in HOOKLEDGER_ENDPOINTS).
    #[arg(long)]
    endpoint: String,
    /// Events created (listed) or received (no list) at or after: unix
    /// seconds, or an age like 6h, 2d.
    #[arg(long, value_parser = parse_instant)]
    since: i64,
    /// Before: unix seconds, or an age (default: now).
    #[arg(long, value_parser = parse_instant)]
    until: Option<i64>,
    /// Pages of the provider's list read at most.
    #[arg(long, default_value_t = completeness::DEFAULT_MAX_PAGES)]
    max_pages: u32,
    #[command(flatten)]
    list: ListArgs,
    /// How long identities are kept (the functions' setting): a window
    /// reaching beyond it is refused, since its expired records would be
    /// called missing.
    #[arg(long, env = "HOOKLEDGER_RETENTION_DAYS", default_value_t = 30)]
    retention_days: u32,
    /// The endpoints' configuration (as the intake reads it).
    #[arg(long, env = "HOOKLEDGER_ENDPOINTS")]
    endpoints: String,
}

fn parse_instant(s: &str) -> Result<i64, String> {
    if let Ok(secs) = s.parse::<i64>() {
        return Ok(secs);
    }
    super::parse_time(s).map(|ms| ms / 1000)
}

/// Runs the audit; the report, and whether it failed.
pub async fn run(args: AuditArgs, wiring: &Wiring, json: bool, out: &mut (dyn Write + Send)) -> Result<bool, String> {
    let specs = config::parse_endpoints(&args.endpoints).map_err(|e| e.to_string())?;
    let spec =
        specs.get(&args.endpoint).ok_or_else(|| format!("no endpoint {:?} in HOOKLEDGER_ENDPOINTS", args.endpoint))?;
    let now_ms = super::now_ms();
    let until = args.until.unwrap_or(now_ms / 1000);
    if args.since >= until {
        return Err(format!("--since ({}) must be before --until ({until})", args.since));
    }
    if hookledger::backfill::check_within_retention(args.since, now_ms / 1000, args.retention_days).is_err() {
        return Err(format!(
            "--since {} reaches beyond the identity retention (HOOKLEDGER_RETENTION_DAYS = {} days, less a day's \
             margin): records older than that may have expired, and the audit would call their events missing; \
             pass a later --since",
            args.since, args.retention_days
        ));
    }
    let ledger = wiring.ledger().map_err(|e| e.to_string())?;
    let outbox = DynamoOutbox::on(ledger.clone());
    let tenant = spec.tenant.clone().unwrap_or_else(|| args.endpoint.clone());
    let scope = Scope {
        provider: spec.provider.as_str(),
        endpoint: &args.endpoint,
        tenant: &tenant,
        since_s: args.since,
        until_s: until,
        routes: &wiring.settings.routes,
        now_ms,
        types: Default::default(),
        repair_flags: args.list.repair_flags(),
    };
    let audit = Audit { ledger: &ledger, outbox: &outbox };
    let keys = Keys::of_list(&args.list);
    let source_spec = match spec.provider.backfill() {
        Some(BackfillList::StripeEvents) => Some(keys.stripe(args.list.account.clone())?),
        Some(BackfillList::GithubDeliveries) => {
            Some(keys.github(args.list.github_hook.as_deref().ok_or("GitHub needs --github-hook")?)?)
        }
        None => None,
    };
    let report = match source_spec {
        Some(source_spec) => {
            let source = wiring.provider_source(source_spec).await?;
            let window = Window { since_s: args.since, until_s: until, types: Vec::new() };
            let (listed, pages, partial) =
                completeness::listed(&source, &window, args.max_pages).await.map_err(|e| e.to_string())?;
            audit.of_listed(&scope, &listed, pages, partial).await.map_err(|e| e.to_string())?
        }
        None => audit.without_list(&scope).await.map_err(|e| e.to_string())?,
    };
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report).unwrap_or_default()).map_err(|e| e.to_string())?;
    } else {
        writeln!(out, "{}", show(&report)).map_err(|e| e.to_string())?;
    }
    Ok(report.failed())
}

/// The report as lines.
pub fn show(r: &Report) -> String {
    let from = if r.provider_truth {
        let pages = if r.pages == 1 { "1 page".to_owned() } else { format!("{} pages", r.pages) };
        format!("against {}'s own list ({pages})", r.provider)
    } else {
        "from the ledger alone".to_owned()
    };
    let mut lines = vec![format!("audit {} [{}, {}) {from}", r.endpoint, r.since, r.until)];
    let listed = if r.provider_truth { r.listed.to_string() } else { "-".into() };
    let missing = if r.provider_truth { r.missing.to_string() } else { "-".into() };
    lines.push(format!(
        "listed {listed}  recorded {}  applied {}  ignored {}  parked {}  dead {}  in flight {}  missing {missing}  doubled {}",
        r.recorded, r.applied, r.ignored, r.parked, r.dead, r.in_flight, r.doubled
    ));
    if let (Some(p50), Some(p99)) = (r.outcome_p50_ms, r.outcome_p99_ms) {
        lines.push(format!("receipt to outcome: p50 {p50} ms, p99 {p99} ms"));
    }
    for (name, t) in &r.routes {
        let oldest = t.oldest_pending_ms.map_or(String::new(), |a| format!(" (oldest {} s)", a / 1000));
        lines.push(format!(
            "route {name}: delivered {}, pending {}{oldest}, dead {}, never queued {}",
            t.delivered, t.pending, t.dead, t.never_queued
        ));
    }
    for (title, items, total) in [
        ("missing", &r.missing_items, r.missing),
        ("doubled", &r.doubled_items, r.doubled),
        ("dead", &r.dead_items, r.dead),
        ("parked", &r.parked_items, r.parked),
        ("dead deliveries", &r.dead_deliveries, r.dead_deliveries.len() as u64),
    ] {
        if items.is_empty() {
            continue;
        }
        lines.push(format!("{title} ({total}):"));
        for n in items {
            let ty = n.event_type.as_deref().map(|t| format!(" ({t})")).unwrap_or_default();
            let why = n.why.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
            lines.push(format!("  {}{ty}{why}", n.key));
            if let Some(repair) = &n.repair {
                lines.push(format!("    repair: {repair}"));
            }
        }
    }
    for note in &r.notes {
        lines.push(format!("note: {note}"));
    }
    lines.join("\n")
}
