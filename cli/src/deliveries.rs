//! `hookledger deliveries`: routes' deliveries of an event, a destination's
//! health (circuit, limits, pending, oldest pending, DEAD, last answers) or
//! its DEAD ones; `deliveries replay` gives DEAD deliveries a new attempt
//! with the same key (audited on the item; the sweep sends them at the
//! destination's limits): one event's, or a destination's by a filter, in
//! bounded, resumable batches, counted first (`--dry-run`).

use clap::{Args, Subcommand};
use hookledger::message::OutboxState;

#[derive(Args)]
pub struct DeliveriesArgs {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    select: Select,
}

#[derive(Subcommand)]
enum Action {
    /// DEAD deliveries due again now, the same key (the reconciler's sweep sends them).
    Replay(ReplayArgs),
}

#[derive(Args)]
struct Select {
    /// An event's key (`evt#…`): its delivery to each destination.
    #[arg(long)]
    event: Option<String>,
    /// A destination's name in HOOKLEDGER_ROUTES.
    #[arg(long)]
    destination: Option<String>,
    /// With --destination: only `dead` is listed (from the attention index).
    #[arg(long)]
    status: Option<String>,
    /// Most DEAD items read per shard.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    select: Select,
    /// Why (kept on each item). With --destination, the destination and the
    /// reason name the run: the same command again resumes it, never
    /// replaying twice what it replayed.
    #[arg(long)]
    reason: String,
    #[arg(long, env = "USER", default_value = "operator")]
    operator: String,
    /// With --destination: DEAD since (unix ms, or an age like 30m, 6h, 2d).
    #[arg(long, value_parser = crate::parse_time)]
    since: Option<i64>,
    /// With --destination: DEAD before (unix ms, or an age).
    #[arg(long, value_parser = crate::parse_time)]
    until: Option<i64>,
    #[command(flatten)]
    run: RunArgs,
}

/// How a replay by filter runs: counted first, in batches, over a limit
/// only when asked (the records' replay and the deliveries').
#[derive(Args)]
pub(crate) struct RunArgs {
    /// Print the count and a sample; replay nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Replay more than --max-without-yes.
    #[arg(long)]
    pub(crate) yes: bool,
    #[arg(long, default_value_t = 100)]
    pub(crate) max_without_yes: usize,
    /// Replayed per batch.
    #[arg(long, default_value_t = 100)]
    pub(crate) batch: usize,
}

/// The most DEAD deliveries read per shard for a replay by filter.
const FILTER_READS: usize = 10_000;
/// The most items a health census reads per partition.
const HEALTH_READS: usize = 10_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The deliveries `select` names.
async fn selected(select: &Select, wiring: &hookledger::wiring::Wiring) -> Result<Vec<OutboxState>, String> {
    let deliveries = wiring.deliveries().map_err(|e| e.to_string())?;
    let routes = &wiring.settings.routes;
    if let Some(name) = &select.destination {
        if routes.destination(name).is_none() {
            return Err(format!("no destination {name:?} in HOOKLEDGER_ROUTES"));
        }
    }
    match (&select.event, &select.destination, select.status.as_deref()) {
        (Some(event), destination, None) => {
            let key = hookledger::identity::EventKey::from_stored(event)
                .ok_or_else(|| format!("{event:?} is not an event key (evt#provider#endpoint#id)"))?;
            let names: Vec<&str> = match destination {
                Some(d) => vec![d.as_str()],
                None => routes.destinations().iter().map(|d| d.name.as_str()).collect(),
            };
            if names.is_empty() {
                return Err("HOOKLEDGER_ROUTES names no destination".into());
            }
            deliveries.of_event(&key, &names).await.map_err(|e| e.to_string())
        }
        (None, Some(destination), Some("dead")) => {
            deliveries.dead_of(destination, select.limit).await.map_err(|e| e.to_string())
        }
        _ => Err("name an event (--event KEY [--destination NAME]), a destination (--destination NAME) or its dead (--destination NAME --status dead)".into()),
    }
}

pub async fn run(
    args: DeliveriesArgs,
    wiring: &hookledger::wiring::Wiring,
    json: bool,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    match args.action {
        None if args.select.event.is_none() && args.select.status.is_none() => {
            let name = args.select.destination.as_deref().ok_or("name an event (--event KEY) or a destination")?;
            let d = wiring
                .settings
                .routes
                .destination(name)
                .ok_or_else(|| format!("no destination {name:?} in HOOKLEDGER_ROUTES"))?;
            let deliveries = wiring.deliveries().map_err(|e| e.to_string())?;
            let health = deliveries.health(name, d.limits, now_ms(), HEALTH_READS).await.map_err(|e| e.to_string())?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&health).unwrap_or_default())
                    .map_err(|e| e.to_string())
            } else {
                writeln!(out, "{}", show_health(&health, d.kind.label(), now_ms())).map_err(|e| e.to_string())
            }
        }
        Some(Action::Replay(r)) if r.select.event.is_none() => replay_by_filter(r, wiring, json, out).await,
        None => {
            let rows = selected(&args.select, wiring).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&rows).unwrap_or_default()).map_err(|e| e.to_string())
            } else {
                print(&rows, out)
            }
        }
        Some(Action::Replay(r)) => {
            let rows = selected(&r.select, wiring).await?;
            let deliveries = wiring.deliveries().map_err(|e| e.to_string())?;
            let token = wiring.ambient().token();
            let caller = crate::audit::caller(wiring.aws(), &r.operator).await?;
            let (mut replayed, mut skipped) = (0, 0);
            for row in &rows {
                if deliveries.replay(row, &token, &caller, &r.reason, now_ms()).await.map_err(|e| e.to_string())? {
                    replayed += 1;
                    writeln!(out, "replayed {} ({})", row.id, row.destination.as_deref().unwrap_or("-"))
                        .map_err(|e| e.to_string())?;
                } else {
                    skipped += 1;
                }
            }
            writeln!(out, "{replayed} replayed, {skipped} not DEAD (left as they are)").map_err(|e| e.to_string())
        }
    }
}

/// DEAD deliveries of a destination, by the filter: counted first, then
/// replayed in batches with a progress bar, each audited on its item; the
/// same command again resumes the run.
async fn replay_by_filter(
    r: ReplayArgs,
    wiring: &hookledger::wiring::Wiring,
    json: bool,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    use hookledger::outbox::health::ReplayFilter;
    let name =
        r.select.destination.clone().ok_or("name a destination (--destination NAME) or an event (--event KEY)")?;
    if wiring.settings.routes.destination(&name).is_none() {
        return Err(format!("no destination {name:?} in HOOKLEDGER_ROUTES"));
    }
    match r.select.status.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("dead") => {}
        _ => return Err("--status DEAD: only DEAD deliveries are replayed".into()),
    }
    if r.reason.trim().is_empty() {
        return Err("--reason: say why (kept on each item, and it names the run)".into());
    }
    let filter = ReplayFilter { destination: name.clone(), since: r.since, until: r.until, reason: r.reason.clone() };
    let deliveries = wiring.deliveries().map_err(|e| e.to_string())?;
    let (matched, partial) = deliveries.matching(&filter, FILTER_READS).await.map_err(|e| e.to_string())?;
    let w = |out: &mut (dyn std::io::Write + Send), s: String| writeln!(out, "{s}").map_err(|e| e.to_string());
    let more = if partial { " (a shard held more than was read: run again when these are done)" } else { "" };
    if r.run.dry_run {
        if json {
            let sample: Vec<&OutboxState> = matched.iter().take(5).collect();
            let v =
                serde_json::json!({"run": filter.run(), "count": matched.len(), "partial": partial, "sample": sample});
            return w(out, serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        w(out, format!("{} DEAD deliveries to {name} would be replayed (run {}){more}", matched.len(), filter.run()))?;
        let sample: Vec<OutboxState> = matched.iter().take(5).cloned().collect();
        return print(&sample, out);
    }
    if matched.len() > r.run.max_without_yes && !r.run.yes {
        return Err(format!(
            "{} deliveries match, more than {}: look with --dry-run, then run again with --yes",
            matched.len(),
            r.run.max_without_yes
        ));
    }
    let total = matched.len();
    let caller = crate::audit::caller(wiring.aws(), &r.operator).await?;
    let (mut replayed, mut skipped) = (0, 0);
    for batch in matched.chunks(r.run.batch.max(1)) {
        let done = deliveries.replay_batch(&filter, batch, &caller, now_ms()).await.map_err(|e| e.to_string())?;
        replayed += done.replayed;
        skipped += done.skipped;
        if !json {
            eprintln!("{}", progress(replayed + skipped, total));
        }
    }
    if json {
        let v = serde_json::json!({"run": filter.run(), "replayed": replayed, "skipped": skipped, "partial": partial});
        return w(out, serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    w(out, format!("{replayed} replayed, {skipped} not DEAD any more (left as they are); run {}{more}", filter.run()))
}

/// `[#####-----] 50/100`.
pub(crate) fn progress(done: usize, total: usize) -> String {
    let width = 30;
    let filled = (done * width).checked_div(total).unwrap_or(width);
    format!("[{}{}] {done}/{total}", "#".repeat(filled), "-".repeat(width - filled))
}

fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        s if s >= 3600 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m {}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// A destination's health, as lines.
pub fn show_health(h: &hookledger::outbox::health::Health, kind: &str, now: i64) -> String {
    let mut lines = vec![format!("destination   {} ({kind})", h.destination)];
    lines.push(match h.circuit {
        "closed" => format!("circuit       closed ({} failures in a row)", h.failures),
        state => format!(
            "circuit       {state}, open until {}",
            h.open_until.map_or("-".into(), |u| format!("in {}", age(u - now)))
        ),
    });
    let rate = match (h.limit_per_second, h.rate_in_force) {
        (Some(l), Some(f)) if (l - f).abs() > f64::EPSILON => format!(
            "{l}/s, {f}/s in force (throttled: lowered for {})",
            h.slowed_until.map_or("-".into(), |u| age(u - now))
        ),
        (Some(l), _) => format!("{l}/s"),
        (None, _) => "none".into(),
    };
    lines.push(format!("rate limit    {rate}"));
    lines.push(match h.max_in_flight {
        Some(m) => format!("in flight     {} of {m}", h.in_flight),
        None => "in flight     no limit".into(),
    });
    let oldest = h.oldest_pending_age_ms.map_or(String::new(), |a| format!(" (oldest {})", age(a)));
    lines.push(format!("pending       {}{oldest}", h.pending + h.waiting));
    lines.push(format!("  waiting     {} (for the circuit)", h.waiting));
    lines.push(format!("dead          {}", h.dead));
    if h.partial {
        lines.push("(a partition held more than was read: the counts are at least these)".into());
    }
    lines.push("last answers".into());
    if h.last_answers.is_empty() {
        lines.push("  (none failed)".into());
    }
    for (at, answer) in &h.last_answers {
        lines.push(format!("  {} ago  {answer}", age(now - at)));
    }
    lines.join("\n")
}

fn print(rows: &[OutboxState], out: &mut (dyn std::io::Write + Send)) -> Result<(), String> {
    let mut lines =
        vec![format!("{:<12} {:<8} {:>8}  {:<64}  {}", "DESTINATION", "STATUS", "ATTEMPTS", "KEY", "LAST ERROR")];
    for r in rows {
        lines.push(format!(
            "{:<12} {:<8} {:>8}  {:<64}  {}",
            r.destination.as_deref().unwrap_or("-"),
            r.status,
            r.attempts,
            r.idempotency_key,
            r.last_error.as_deref().unwrap_or("")
        ));
    }
    if rows.is_empty() {
        lines.push("(no deliveries)".into());
    }
    writeln!(out, "{}", lines.join("\n")).map_err(|e| e.to_string())
}
