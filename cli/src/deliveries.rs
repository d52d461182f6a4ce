//! `hookledger deliveries`: routes' deliveries of an event, or a
//! destination's DEAD ones; `deliveries replay` gives DEAD deliveries a new
//! attempt with the same key (audited on the item; the sweep sends them).

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
    /// Why (kept on each item).
    #[arg(long)]
    reason: String,
    #[arg(long, env = "USER", default_value = "operator")]
    operator: String,
}

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
        _ => Err("name an event (--event KEY [--destination NAME]) or a destination's dead (--destination NAME --status dead)".into()),
    }
}

pub async fn run(
    args: DeliveriesArgs,
    wiring: &hookledger::wiring::Wiring,
    json: bool,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    match args.action {
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
            let (mut replayed, mut skipped) = (0, 0);
            for row in &rows {
                if deliveries.replay(row, &token, &r.operator, &r.reason, now_ms()).await.map_err(|e| e.to_string())? {
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
