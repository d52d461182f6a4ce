//! `hookledger`: developer and operator tool, over the same library and AWS
//! configuration as the functions.
//!
//! - `setup`: create the ledger table and the work queue (idempotent).
//! - `send`: sign a delivery for a configured endpoint as its provider would, and POST it.
//! - `stats`, `failures`: bounded figures from the functions' metrics and the
//!   ledger's sparse indexes (never a scan, never PROCESSED records).
//! - `list`, `show`: what the ledger holds (sparse indexes; no scans).
//! - `replay`, `park`, `resolve`: audited, conditional operator transitions.
//! - `map-subject`: map a provider subject (a Stripe customer) to an account.
//! - `reconcile`: run one reconciliation now.
//! - `backfill`: recover an endpoint's events the intake never recorded from
//!   the provider's API (Stripe's events list, a GitHub hook's deliveries).
//! - `replay-sns`: send an SNS subscription's dead-letter queue through the intake.
//! - `audit-log`: every operator write (who, as AWS reports the caller; when;
//!   what; why; the result), by time or by record.
//!
//! Human-readable tables by default, `--json` for scripts.

mod audit;
mod backfill;
mod bridge;
pub mod console;
mod deliveries;
mod demo;
mod provider_audit;
pub mod replay_sns;
pub mod reported;
mod send;
mod table;

use std::ffi::OsString;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use hookledger::adapters::cloudwatch::CloudWatchMetrics;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::dynamodb::shards;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::config::ConfigError;
use hookledger::insight::Insight;
use hookledger::ledger::Status;
use hookledger::ops::{ListFilter, OpsError, parse_key};
use hookledger::ports::MetricWindow;
use hookledger::wiring::{LiveOps, Settings, Wiring};

#[derive(Parser)]
#[command(name = "hookledger", version, about = "Hookledger developer and operator tool")]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Global {
    /// Ledger table.
    #[arg(long, global = true, env = "HOOKLEDGER_TABLE")]
    table: Option<String>,
    /// Work queue URL (replay and reconcile send to it).
    #[arg(long, global = true, env = "HOOKLEDGER_QUEUE_URL")]
    queue_url: Option<String>,
    /// Where payloads too large for a DynamoDB item are (the functions'
    /// HOOKLEDGER_PAYLOAD_BUCKET); `show --payload` reads them there.
    #[arg(long, global = true, env = "HOOKLEDGER_PAYLOAD_BUCKET")]
    payload_bucket: Option<String>,
    /// Index shards. The count the table records (the reconciler's, which
    /// reads them) is used; this is needed only before one is recorded, and a
    /// different one is refused. `setup` records it (default: 80).
    #[arg(long, global = true, env = "HOOKLEDGER_INDEX_SHARDS")]
    shards: Option<u32>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    json: bool,
    /// Routes (the functions' HOOKLEDGER_ROUTES); `deliveries` reads their destinations.
    #[arg(long, global = true, env = "HOOKLEDGER_ROUTES", hide_env_values = true)]
    routes: Option<String>,
    /// Where secrets handed over at a handshake are kept (the functions'
    /// HOOKLEDGER_HANDSHAKE_PATH); `providers arm` opens windows there.
    #[arg(long, global = true, env = "HOOKLEDGER_HANDSHAKE_PATH")]
    handshake_path: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Create the ledger table, the work queue (with its DLQ) and the notification
    /// topic if they do not exist; print them as KEY=VALUE lines.
    Setup {
        #[arg(long, env = "HOOKLEDGER_QUEUE_NAME", default_value = "hookledger-work")]
        queue: String,
        /// Also routes for a local stack: a queue, and a bus whose rule forwards
        /// to a second queue; prints HOOKLEDGER_ROUTES and the two queues' URLs.
        #[arg(long)]
        with_routes: bool,
        /// With --with-routes: also an HTTPS destination at this URL (a
        /// consumer on loopback), signed with `env:DEV_DESTINATION_SECRET`.
        #[arg(long, requires = "with_routes")]
        consumer_url: Option<String>,
    },
    /// Print the table and queue definitions the code creates (JSON), for comparison with the SAM template.
    Schema,
    /// Local event-source bridge: SQS → processor invocations, timer → reconciler.
    Bridge(bridge::BridgeArgs),
    /// Send demo deliveries to the running local stack and show the outcome.
    Demo(demo::DemoArgs),
    /// Sign a delivery for a configured endpoint and send it.
    Send(send::SendArgs),
    /// The providers an endpoint can name: each preset, how it signs and
    /// identifies an event, and what its endpoint may set. `providers arm`
    /// opens an endpoint's handshake window.
    Providers {
        #[command(subcommand)]
        action: Option<send::ProvidersAction>,
    },
    /// Throughput, outcomes, latency and the duplicate rate from the functions'
    /// metrics; what is open, dead or parked now. Costs O(shards), never O(records).
    /// With --tenant: that tenant's records from the ledger's sparse sets, and its
    /// own metrics if it is listed in TenantMetrics.
    Stats(StatsArgs),
    /// Top failing types, subjects failing repeatedly, reasons, stuck leases,
    /// the oldest unprocessed event, the duplicate-rate trend and drift repairs.
    Failures(FailuresArgs),
    /// List records, newest first.
    List(ListArgs),
    /// One record with its history (payload only with --payload).
    Show {
        key: String,
        #[arg(long)]
        payload: bool,
    },
    /// Give DEAD or PARKED records a controlled new attempt (same identity, audited).
    /// A record a backfill parked without its payload is fetched from its
    /// provider again (the provider flags are for that case).
    Replay(ReplayArgs),
    /// Stop work on RECEIVED, RETRYABLE or DEAD records until replayed.
    Park(ActionArgs),
    /// Mark DEAD or PARKED records as settled outside Hookledger.
    Resolve(ActionArgs),
    /// An endpoint's window as its provider lists it (Stripe, GitHub) against
    /// the ledger and every route: missing, doubled, DEAD, PARKED, pending
    /// deliveries, each with its repair. Exits non-zero when anything is
    /// missing or doubled. Without a provider list: the ledger's view only.
    Audit(provider_audit::AuditArgs),
    /// Erase payloads: one event's (--event) or every event of an erasable
    /// endpoint noted under a subject (--subject). Destroys each event's data
    /// key, deletes the ledger's copies and marks the record erased (audited);
    /// identity, status and hashes stay. Finished records only.
    Erase(EraseArgs),
    /// Routes' deliveries: an event's to each destination, or a destination's
    /// DEAD ones; `deliveries replay` gives DEAD ones a new attempt, same key.
    Deliveries(deliveries::DeliveriesArgs),
    /// Map a provider subject to an account (events for unmapped subjects are parked).
    MapSubject {
        #[arg(long, default_value = "stripe")]
        provider: String,
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        subject: String,
        #[arg(long)]
        account: String,
        #[command(flatten)]
        who: audit::WhoArgs,
    },
    /// Bring the items an earlier release wrote to today's indexes (docs/operations.md,
    /// "Upgrading a deployed stack"); safe to run again, and while the functions work.
    Migrate {
        #[command(flatten)]
        who: audit::WhoArgs,
    },
    /// Recover a window of an endpoint's events from the provider's API (the
    /// same identity and claim as its webhooks; resumes an interrupted run).
    Backfill {
        #[command(flatten)]
        args: backfill::BackfillArgs,
        #[command(flatten)]
        who: audit::WhoArgs,
    },
    /// Send what SNS could not deliver (the subscription's dead-letter queue)
    /// through the intake's verification and claim.
    ReplaySns {
        #[command(flatten)]
        args: replay_sns::ReplaySnsArgs,
        #[command(flatten)]
        who: audit::WhoArgs,
    },
    /// The operator audit log: every operator write (replay, park, resolve,
    /// release, deliveries replay, map-subject, arm, migrate, backfill,
    /// replay-sns), oldest first, by time (paged) or by record.
    AuditLog(audit::AuditLogArgs),
    /// A local web console: overview with plots, search, timelines, audited
    /// (bulk) replay, park and resolve. Binds to 127.0.0.1 by default.
    Console(ConsoleArgs),
    /// Run one reconciliation now (what the scheduled function does).
    Reconcile {
        /// Items acted on, at most (default: HOOKLEDGER_RECONCILE_MAX_ITEMS, else 500).
        #[arg(long)]
        max_items: Option<usize>,
        /// Check entitlements against Stripe when their last check is older than this
        /// (default: HOOKLEDGER_DRIFT_INTERVAL_SECS, else 3600).
        #[arg(long)]
        drift_interval_secs: Option<i64>,
    },
}

impl Command {
    /// Whether the command computes or reads index partitions (so it must
    /// use the shard count the table records).
    fn reads_partitions(&self) -> bool {
        !matches!(
            self,
            Command::Setup { .. }
                | Command::Schema
                | Command::Send(_)
                | Command::Providers { .. }
                | Command::MapSubject { .. }
                | Command::AuditLog(_)
        )
    }
}

#[derive(Args)]
struct ListArgs {
    /// received, processing, retryable, processed, dead, parked (repeatable).
    #[arg(long = "status", value_parser = parse_status)]
    statuses: Vec<Status>,
    #[arg(long)]
    endpoint: Option<String>,
    #[arg(long = "type")]
    event_type: Option<String>,
    #[arg(long)]
    subject: Option<String>,
    /// Received at or after: unix ms, or an age like 30m, 6h, 2d.
    #[arg(long, value_parser = parse_time)]
    since: Option<i64>,
    /// Received at or before: unix ms, or an age.
    #[arg(long, value_parser = parse_time)]
    until: Option<i64>,
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// From the previous page's "next" line.
    #[arg(long, value_parser = parse_cursor)]
    cursor: Option<(i64, String)>,
}

#[derive(Args)]
struct WindowArgs {
    /// How far back the metrics go: an age like 30m, 6h, 2d.
    #[arg(long, default_value = "24h", value_parser = parse_age)]
    since: i64,
    /// Seconds per period (a multiple of 60; default: the window in 24 periods).
    #[arg(long)]
    period: Option<i64>,
    /// Metrics namespace (the functions' HOOKLEDGER_METRICS_NAMESPACE).
    #[arg(long, env = "HOOKLEDGER_METRICS_NAMESPACE", default_value = "Hookledger")]
    namespace: String,
    /// Rows read at most per shard from each sparse set.
    #[arg(long, default_value_t = hookledger::insight::DEFAULT_CAP_PER_SHARD)]
    cap: usize,
}

impl WindowArgs {
    fn window(&self, now: i64) -> Result<MetricWindow, CliError> {
        let span_s = (self.since / 1000).max(60);
        let period_s = self.period.unwrap_or(((span_s / 24).max(60) / 60) * 60);
        if period_s < 60 || period_s % 60 != 0 {
            return Err(CliError::Failed(format!("--period {period_s}: a multiple of 60 seconds")));
        }
        Ok(MetricWindow { since_ms: now - span_s * 1000, until_ms: now, period_s })
    }
}

#[derive(Args)]
struct ConsoleArgs {
    /// Where to listen. Anything but a loopback address needs --allow-remote.
    #[arg(long, default_value = "127.0.0.1:8088")]
    bind: std::net::SocketAddr,
    /// Allow a non-loopback --bind (the console acts with your AWS credentials).
    #[arg(long)]
    allow_remote: bool,
    /// Who is acting (kept with every action's reason).
    #[arg(long, env = "USER", default_value = "operator")]
    operator: String,
    /// Metrics namespace (the functions' HOOKLEDGER_METRICS_NAMESPACE).
    #[arg(long, env = "HOOKLEDGER_METRICS_NAMESPACE", default_value = "Hookledger")]
    namespace: String,
}

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    window: WindowArgs,
    /// One tenant's figures only.
    #[arg(long)]
    tenant: Option<String>,
}

#[derive(Args)]
struct FailuresArgs {
    #[command(flatten)]
    window: WindowArgs,
    /// Entries per list.
    #[arg(long, default_value_t = hookledger::insight::DEFAULT_TOP)]
    top: usize,
}

#[derive(Args)]
struct ActionArgs {
    /// Event keys (evt#<provider>#<endpoint>#<id>); or select with the filters.
    keys: Vec<String>,
    #[command(flatten)]
    select: SelectArgs,
    /// Who is acting (kept in the audit entry).
    #[arg(long, env = "USER", default_value = "operator")]
    operator: String,
    /// Why (kept in the audit entry).
    #[arg(long)]
    reason: String,
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["event", "subject"]))]
struct EraseArgs {
    /// One event's key (evt#<provider>#<endpoint>#<id>).
    #[arg(long)]
    event: Option<String>,
    /// Every event noted under this provider subject (a customer id, ...).
    #[arg(long)]
    subject: Option<String>,
    /// Only this endpoint's events of the subject.
    #[arg(long, requires = "subject")]
    endpoint: Option<String>,
    /// Print what would be erased; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Who is acting (kept in the audit entry).
    #[arg(long, env = "USER", default_value = "operator")]
    operator: String,
    /// Why (kept in the audit entry).
    #[arg(long)]
    reason: String,
}

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    action: ActionArgs,
    #[command(flatten)]
    bulk: BulkArgs,
    #[command(flatten)]
    source: backfill::SourceArgs,
}

/// A replay by filter: DEAD or PARKED records, counted first, replayed in
/// bounded batches; the filter and the reason name the run, and the same
/// command again resumes it without replaying anything twice.
#[derive(Args)]
struct BulkArgs {
    /// Only this provider's records.
    #[arg(long)]
    provider: Option<String>,
    /// Only this tenant's records.
    #[arg(long)]
    tenant: Option<String>,
    /// Received at or after (unix ms, or an age like 30m, 6h, 2d).
    #[arg(long, value_parser = parse_time)]
    since: Option<i64>,
    /// Received before (unix ms, or an age).
    #[arg(long, value_parser = parse_time)]
    until: Option<i64>,
    #[command(flatten)]
    run: deliveries::RunArgs,
}

impl BulkArgs {
    fn any(&self) -> bool {
        self.provider.is_some()
            || self.tenant.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.run.dry_run
    }
}

#[derive(Args)]
struct SelectArgs {
    #[arg(long = "status", value_parser = parse_status)]
    statuses: Vec<Status>,
    #[arg(long)]
    endpoint: Option<String>,
    #[arg(long = "type")]
    event_type: Option<String>,
    #[arg(long)]
    subject: Option<String>,
    /// Most records a filtered action touches.
    #[arg(long, default_value_t = 1000)]
    max: usize,
}

impl SelectArgs {
    fn any(&self) -> bool {
        !self.statuses.is_empty() || self.endpoint.is_some() || self.event_type.is_some() || self.subject.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(#[from] clap::Error),
    #[error("{0}")]
    Failed(String),
}

impl From<OpsError> for CliError {
    fn from(e: OpsError) -> Self {
        Self::Failed(e.to_string())
    }
}

impl From<hookledger::ledger::PortError> for CliError {
    fn from(e: hookledger::ledger::PortError) -> Self {
        Self::Failed(e.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        Self::Failed(e.to_string())
    }
}

fn parse_status(s: &str) -> Result<Status, String> {
    Status::parse(&s.to_ascii_uppercase())
        .ok_or_else(|| format!("unknown status {s:?} (received, processing, retryable, processed, dead, parked)"))
}

fn parse_cursor(s: &str) -> Result<(i64, String), String> {
    let bad = || format!("{s:?} is not a cursor (copy it from the previous page's \"next\" line)");
    let (at, pk) = s.split_once(':').ok_or_else(bad)?;
    Ok((at.parse().map_err(|_| bad())?, pk.to_owned()))
}

fn cursor_text(c: &(i64, String)) -> String {
    format!("{}:{}", c.0, c.1)
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// An age like 30m, 6h, 2d, in milliseconds.
fn parse_age(s: &str) -> Result<i64, String> {
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
    let n: i64 = num.parse().ok().filter(|n| *n > 0).ok_or_else(|| format!("{s:?} is not an age like 30m, 6h, 2d"))?;
    let ms = match unit {
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?}: unknown unit (m, h, d)")),
    };
    Ok(n * ms)
}

fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
    let n: i64 = num.parse().map_err(|_| format!("{s:?} is neither unix ms nor an age like 30m, 6h, 2d"))?;
    let ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?}: unknown unit (s, m, h, d)")),
    };
    Ok(now_ms() - n * ms)
}

struct Ctx {
    wiring: Wiring,
    global: Global,
}

impl From<ConfigError> for CliError {
    fn from(e: ConfigError) -> Self {
        Self::Failed(e.to_string())
    }
}

impl Ctx {
    /// Every adapter from the composition root, the flags in place of their
    /// variables, every call within the CLI's timeouts (it runs off AWS).
    /// A command that computes or reads index partitions takes the shard
    /// count the table records, read once here ([`shards::resolve`]).
    async fn new(global: Global, command: &Command) -> Result<Self, CliError> {
        use hookledger::{adapters::timeouts::Timeouts, wiring::load_aws};
        let aws = load_aws(Timeouts::CLI).await;
        let settings = |shards: Option<u32>| {
            let flags = global.clone();
            Settings::from_lookup(move |k| match k {
                "HOOKLEDGER_TABLE" => flags.table.clone(),
                "HOOKLEDGER_QUEUE_URL" => flags.queue_url.clone(),
                "HOOKLEDGER_PAYLOAD_BUCKET" => flags.payload_bucket.clone(),
                "HOOKLEDGER_INDEX_SHARDS" => shards.map(|n| n.to_string()),
                "HOOKLEDGER_ROUTES" => flags.routes.clone(),
                "HOOKLEDGER_HANDSHAKE_PATH" => flags.handshake_path.clone(),
                other => std::env::var(other).ok(),
            })
        };
        let mut wiring = Wiring::new(aws.clone(), settings(global.shards)?);
        if command.reads_partitions() && wiring.settings.table().is_ok() {
            let recorded = shards::recorded(&wiring.ledger()?).await.map_err(|e| CliError::Failed(e.to_string()))?;
            let count = shards::resolve(global.shards, recorded).map_err(|e| CliError::Failed(e.to_string()))?;
            wiring = Wiring::new(aws, settings(Some(count))?);
        }
        Ok(Self { wiring, global })
    }

    fn table(&self) -> Result<String, CliError> {
        self.wiring
            .settings
            .table()
            .map(str::to_owned)
            .map_err(|_| CliError::Failed("no table: set HOOKLEDGER_TABLE or pass --table".into()))
    }

    fn queue_url(&self) -> Result<String, CliError> {
        self.wiring
            .settings
            .queue_url()
            .map(str::to_owned)
            .map_err(|_| CliError::Failed("no queue: set HOOKLEDGER_QUEUE_URL or pass --queue-url".into()))
    }

    fn ledger(&self) -> Result<DynamoLedger, CliError> {
        self.table()?;
        Ok(self.wiring.ledger()?)
    }

    fn queue(&self) -> Result<SqsQueue, CliError> {
        self.queue_url()?;
        Ok(self.wiring.queue()?)
    }

    fn ops(&self) -> Result<LiveOps, CliError> {
        self.queue_url()?;
        self.table()?;
        Ok(self.wiring.ops()?)
    }

    fn insight(&self, w: &WindowArgs) -> Result<Insight<DynamoLedger, CloudWatchMetrics>, CliError> {
        let metrics = self.wiring.metrics(Some(w.namespace.clone()));
        Ok(Insight::new(self.ledger()?, metrics).with_limits(w.cap, hookledger::insight::DEFAULT_TOP))
    }

    /// Who is acting: the caller AWS reports and the name given.
    async fn caller(&self, operator: &str) -> Result<hookledger::audit::Caller, CliError> {
        audit::caller(self.wiring.aws(), operator).await.map_err(CliError::Failed)
    }

    fn ops_read_only(&self) -> Result<LiveOps, CliError> {
        self.table()?;
        Ok(self.wiring.ops_read_only()?)
    }
}

/// Runs the tool with `args` (program name first), writing results to `out`.
pub async fn run<I, T>(args: I, out: &mut (dyn Write + Send)) -> Result<(), CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    hookledger::adapters::tls::install_tls();
    let ctx = Ctx::new(cli.global, &cli.command).await?;
    let json = ctx.global.json;
    match cli.command {
        Command::Setup { queue, with_routes: routes, consumer_url } => {
            ctx.table()?;
            let created = ctx.wiring.setup(&queue).await.map_err(CliError::Failed)?;
            let (queues, topic, bucket) = (&created, &created.topic, &created.bucket);
            writeln!(out, "HOOKLEDGER_QUEUE_URL={}", queues.queue_url)?;
            writeln!(out, "HOOKLEDGER_DLQ_URL={}", queues.dead_letter_url)?;
            writeln!(out, "HOOKLEDGER_NOTIFY_TOPIC_ARN={topic}")?;
            writeln!(out, "HOOKLEDGER_PAYLOAD_BUCKET={bucket}")?;
            writeln!(out, "HOOKLEDGER_DELIVERY_QUEUE_URL={}", created.delivery_queue_url)?;
            writeln!(out, "HOOKLEDGER_KEYS_TABLE={}", created.keys_table)?;
            // The table records its shard count from the start, so the
            // operator's tools find it before the reconciler's first run.
            let recorded = shards::record(&ctx.ledger()?).await.map_err(|e| CliError::Failed(e.to_string()))?;
            writeln!(out, "HOOKLEDGER_INDEX_SHARDS={}", recorded.configured)?;
            if routes {
                let r = ctx.wiring.setup_routes(&queue, consumer_url.as_deref()).await.map_err(CliError::Failed)?;
                // Shell-quoted: the JSON holds no single quote.
                writeln!(out, "HOOKLEDGER_ROUTES='{}'", r.routes)?;
                writeln!(out, "HOOKLEDGER_ROUTED_QUEUE_URL={}", r.queue_url)?;
                writeln!(out, "HOOKLEDGER_BUS_QUEUE_URL={}", r.bus_queue_url)?;
            }
        }
        Command::Schema => {
            let v = serde_json::json!({
                "table": hookledger::adapters::dynamodb::table_definition(),
                "queue": {
                    "VisibilityTimeout": hookledger::adapters::sqs::WORK_QUEUE_VISIBILITY_SECS,
                    "maxReceiveCount": hookledger::adapters::sqs::MAX_RECEIVE_COUNT,
                },
                // The reconciler function's metrics, its scheduled backfills' gauges included.
                "metrics": { "reconciler": ([hookledger::reconciler::METRICS, hookledger::backfill::ALARMED_METRICS, hookledger::outbox::health::METRICS].concat()) },
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default())?;
        }
        Command::Bridge(args) => {
            let queue_url = ctx.queue_url()?;
            bridge::run(args, &ctx.wiring, &queue_url, out).await.map_err(CliError::Failed)?
        }
        Command::Demo(args) => {
            let stack = ctx.queue().is_ok().then_some(&ctx.wiring);
            demo::run(args, &ctx.wiring, &ctx.table()?, stack, json, out).await.map_err(CliError::Failed)?
        }
        Command::Send(args) => send::run(args, &ctx.wiring, out).await.map_err(CliError::Failed)?,
        Command::Deliveries(args) => deliveries::run(args, &ctx.wiring, json, out).await.map_err(CliError::Failed)?,
        Command::Providers { action: None } => send::providers(json, out).map_err(CliError::Failed)?,
        Command::Providers { action: Some(send::ProvidersAction::Arm(args)) } => {
            let (ledger, caller) = (ctx.ledger()?, ctx.caller(&args.who.operator).await?);
            let target = format!("endpoint {}", args.endpoint());
            let entry = audit::entry(&ledger, hookledger::audit::verb::ARM, &target, &caller, &args.who.reason);
            audit::around(&ledger, entry, send::arm(args, &ctx.wiring, out), |()| "window open".into())
                .await
                .map_err(CliError::Failed)?
        }
        Command::Stats(StatsArgs { window: w, tenant: Some(tenant) }) => {
            if !hookledger::config::valid_tenant(&tenant) {
                return Err(CliError::Failed(format!("--tenant {tenant:?}: {}", hookledger::config::TENANT_RULE)));
            }
            let now = now_ms();
            let stats = ctx.insight(&w)?.tenant_stats(&tenant, &w.window(now)?, now).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&stats).unwrap_or_default())?;
            } else {
                table::tenant_stats(out, &stats)?;
            }
        }
        Command::Stats(StatsArgs { window: w, tenant: None }) => {
            let now = now_ms();
            let stats = ctx.insight(&w)?.stats(&w.window(now)?, now).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&stats).unwrap_or_default())?;
            } else {
                table::stats(out, &stats)?;
            }
        }
        Command::Failures(a) => {
            let now = now_ms();
            let insight = ctx.insight(&a.window)?.with_limits(a.window.cap, a.top);
            let failures = insight.failures(&a.window.window(now)?, now).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&failures).unwrap_or_default())?;
            } else {
                table::failures(out, &failures)?;
            }
        }
        Command::List(a) => {
            let filter = ListFilter {
                statuses: a.statuses,
                endpoint: a.endpoint,
                event_type: a.event_type,
                subject: a.subject,
                since_ms: a.since,
                until_ms: a.until,
                limit: a.limit.max(1),
                cursor: a.cursor,
            };
            let (items, next) = ctx.ops_read_only()?.list(&filter).await?;
            if json {
                let v = serde_json::json!({ "items": items, "next_cursor": next.as_ref().map(cursor_text) });
                writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default())?;
            } else {
                table::list(out, &items)?;
                if let Some(c) = next {
                    writeln!(out, "next: --cursor '{}'", cursor_text(&c))?;
                }
            }
        }
        Command::Show { key, payload } => {
            let key = parse_key(&key)?;
            let (record, history, body) = ctx.ops_read_only()?.show(&key, payload).await?;
            if json {
                let v = serde_json::json!({
                    "record": record,
                    "history": history,
                    "payload": body.as_ref().map(|b| String::from_utf8_lossy(b).into_owned()),
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default())?;
            } else {
                table::show(out, &record, &history, body.as_deref(), payload)?;
            }
        }
        Command::Replay(a) if a.action.keys.is_empty() && (a.bulk.any() || a.action.select.any()) => {
            replay_by_filter(&ctx, out, a).await?
        }
        Command::Replay(a) => act(&ctx, out, a.action, Action::Replay, Some(&a.source)).await?,
        Command::Audit(a) => {
            if provider_audit::run(a, &ctx.wiring, ctx.global.json, out).await.map_err(CliError::Failed)? {
                return Err(CliError::Failed("the audit found events missing or doubled".into()));
            }
        }
        Command::Park(a) => act(&ctx, out, a, Action::Park, None).await?,
        Command::Resolve(a) => act(&ctx, out, a, Action::Resolve, None).await?,
        Command::Erase(a) => erase(&ctx, out, a).await?,
        Command::MapSubject { provider, tenant, subject, account, who } => {
            let (ledger, caller) = (ctx.ledger()?, ctx.caller(&who.operator).await?);
            let target = format!("subject {provider}/{tenant}/{subject} -> account {account}");
            let entry = audit::entry(&ledger, hookledger::audit::verb::MAP_SUBJECT, &target, &caller, &who.reason);
            map_subject_audited(&ledger, &provider, &tenant, &subject, &account, &entry)
                .await
                .map_err(CliError::Failed)?;
            writeln!(out, "mapped {provider} subject {subject} (tenant {tenant}) to account {account}")?;
        }
        Command::Backfill { args, who } => {
            let ledger = ctx.ledger()?;
            let caller = if args.dry_run() { Default::default() } else { ctx.caller(&who.operator).await? };
            let target = format!("endpoint {}", args.endpoint());
            let entry = audit::entry(&ledger, hookledger::audit::verb::BACKFILL, &target, &caller, &who.reason);
            let dry = args.dry_run();
            let run = backfill::run(args, &ctx.wiring, ctx.ledger()?, ctx.queue()?, json, out);
            let summary = if dry {
                run.await
            } else {
                audit::around(&ledger, entry, run, |s| serde_json::to_string(s).unwrap_or_default()).await
            }
            .map_err(CliError::Failed)?;
            if summary.failed > 0 {
                return Err(CliError::Failed(format!("{} events could not be recorded; run it again", summary.failed)));
            }
        }
        Command::ReplaySns { args, who } => {
            ctx.queue_url()?;
            let (ledger, caller) = (ctx.ledger()?, ctx.caller(&who.operator).await?);
            let target = format!("endpoint {}", args.endpoint());
            let entry = audit::entry(&ledger, hookledger::audit::verb::REPLAY_SNS, &target, &caller, &who.reason);
            let run = replay_sns::run(args, &ctx.wiring, json, out);
            let s = audit::around(&ledger, entry, run, |s| serde_json::to_string(s).unwrap_or_default())
                .await
                .map_err(CliError::Failed)?;
            if s.failed > 0 {
                return Err(CliError::Failed(format!("{} messages could not be taken now; run it again", s.failed)));
            }
        }
        Command::Migrate { who } => {
            let (ledger, caller) = (ctx.ledger()?, ctx.caller(&who.operator).await?);
            let entry = audit::entry(&ledger, hookledger::audit::verb::MIGRATE, ledger.table(), &caller, &who.reason);
            let done =
                audit::around(&ledger, entry, ledger.migrate(), |m| serde_json::to_string(m).unwrap_or_default())
                    .await
                    .map_err(CliError::Failed)?;
            writeln!(out, "{}", serde_json::to_string_pretty(&done).unwrap_or_default())?;
        }
        Command::AuditLog(args) => audit::run(args, &ctx.ledger()?, json, out).await.map_err(CliError::Failed)?,
        Command::Console(a) => {
            if !console::is_loopback(&a.bind) && !a.allow_remote {
                return Err(CliError::Failed(format!(
                    "refusing to listen on {}: the console acts with your AWS credentials; use a loopback address, \
                     or pass --allow-remote behind your own access control",
                    a.bind
                )));
            }
            let listener = tokio::net::TcpListener::bind(a.bind).await?;
            let metrics = ctx.wiring.metrics(Some(a.namespace.clone()));
            let endpoints = endpoint_names(std::env::var("HOOKLEDGER_ENDPOINTS").ok().as_deref());
            let destinations =
                ctx.wiring.settings.routes.destinations().iter().map(|d| (d.name.clone(), d.limits)).collect();
            let caller = ctx.caller(&a.operator).await?;
            let c = console::Console::new(ctx.ledger()?, ctx.queue()?, metrics, endpoints, caller)
                .with_deliveries(ctx.wiring.deliveries()?, destinations);
            writeln!(out, "console on http://{} (operator {}); Ctrl-C stops it", listener.local_addr()?, a.operator)?;
            out.flush()?;
            c.serve(listener).await?;
        }
        Command::Reconcile { max_items, drift_interval_secs } => {
            // The functions' settings, with what the flags change.
            let mut settings = ctx.wiring.settings.reconciler;
            settings.max_items = max_items.unwrap_or(settings.max_items);
            settings.drift_interval_ms = drift_interval_secs.map_or(settings.drift_interval_ms, |s| s * 1000);
            ctx.queue_url()?;
            ctx.table()?;
            let r = ctx.wiring.reconciler_with(app(&ctx.wiring)?.rechecks(), settings)?;
            let ambient = ctx.wiring.ambient();
            let run = r.run(ambient.now_ms(), ambient.instant() + std::time::Duration::from_secs(60));
            let summary = reported::reconciler_run(&ctx.wiring.metrics_writer_once(None), run).await;
            writeln!(out, "{}", serde_json::to_string_pretty(&summary).unwrap_or_default())?;
        }
    }
    Ok(())
}

/// (endpoint name, provider) of every endpoint in `HOOKLEDGER_ENDPOINTS`
/// (for the console's search by event id); none when unset or invalid.
pub fn endpoint_names(raw: Option<&str>) -> Vec<(String, String)> {
    raw.and_then(|r| hookledger::config::parse_endpoints(r).ok())
        .map(|specs| specs.into_iter().map(|(name, spec)| (name, spec.provider.as_str().to_owned())).collect())
        .unwrap_or_default()
}

#[derive(Clone, Copy)]
enum Action {
    Replay,
    Park,
    Resolve,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Self::Replay => "replayed",
            Self::Park => "parked",
            Self::Resolve => "resolved",
        }
    }
}

async fn act(
    ctx: &Ctx,
    out: &mut (dyn Write + Send),
    a: ActionArgs,
    action: Action,
    source: Option<&backfill::SourceArgs>,
) -> Result<(), CliError> {
    if a.reason.trim().is_empty() {
        return Err(CliError::Failed("--reason must say why (it is kept in the audit entry)".into()));
    }
    let ops = match action {
        Action::Replay => ctx.ops()?,
        _ => ctx.ops_read_only()?,
    };
    let caller = ctx.caller(&a.operator).await?;
    let filtered = !a.select.statuses.is_empty()
        || a.select.endpoint.is_some()
        || a.select.event_type.is_some()
        || a.select.subject.is_some();
    let keys: Vec<String> = match (a.keys.is_empty(), filtered) {
        (false, false) => a.keys.clone(),
        (true, true) => {
            let filter = ListFilter {
                statuses: a.select.statuses.clone(),
                endpoint: a.select.endpoint.clone(),
                event_type: a.select.event_type.clone(),
                subject: a.select.subject.clone(),
                limit: a.select.max,
                ..Default::default()
            };
            ops.list(&filter)
                .await?
                .0
                .iter()
                .filter_map(|i| i.get("pk").and_then(|v| v.as_str()).map(str::to_owned))
                .collect()
        }
        (false, true) => return Err(CliError::Failed("give event keys or filters, not both".into())),
        (true, false) => {
            return Err(CliError::Failed(
                "nothing selected: give event keys or filters (--status, --endpoint, --type, --subject)".into(),
            ));
        }
    };
    let total = keys.len();
    let (mut done, mut failed) = (0, Vec::new());
    for (i, raw) in keys.iter().enumerate() {
        let result = match parse_key(raw) {
            Err(e) => Err(e.to_string()),
            Ok(key) => match action {
                Action::Replay => match ops.replay(&key, &caller, &a.reason, now_ms()).await {
                    // A backfill parked it without its payload: fetch it from its provider again.
                    Err(e) if e.needs_its_source() => match (source, ops.show(&key, false).await) {
                        (Some(source), Ok((row, _, _))) => {
                            let (ledger, queue) = (ctx.ledger()?, ctx.queue()?);
                            let entry = audit::entry(
                                &ledger,
                                hookledger::audit::verb::RELEASE,
                                key.as_str(),
                                &caller,
                                &a.reason,
                            )
                            .on_record(&key);
                            let run = backfill::replay_from_source(
                                &ctx.wiring,
                                ledger.clone(),
                                queue,
                                &row,
                                &a.operator,
                                &a.reason,
                                source,
                            );
                            audit::around(&ledger, entry, run, String::clone).await.map(Some)
                        }
                        (_, Err(e)) => Err(e.to_string()),
                        (None, _) => Err(e.to_string()),
                    },
                    r => r.map(|()| None).map_err(|e| e.to_string()),
                },
                Action::Park => {
                    ops.park(&key, &caller, &a.reason, now_ms()).await.map(|()| None).map_err(|e| e.to_string())
                }
                Action::Resolve => {
                    ops.resolve(&key, &caller, &a.reason, now_ms()).await.map(|()| None).map_err(|e| e.to_string())
                }
            },
        };
        match result {
            Ok(how) => {
                done += 1;
                if !ctx.global.json {
                    let how = how.map(|h| format!(" ({h})")).unwrap_or_default();
                    writeln!(out, "[{}/{total}] {} {raw}{how}", i + 1, action.verb())?;
                }
            }
            Err(e) => {
                if !ctx.global.json {
                    writeln!(out, "[{}/{total}] failed: {e}", i + 1)?;
                }
                failed.push(e);
            }
        }
    }
    if ctx.global.json {
        writeln!(
            out,
            "{}",
            serde_json::json!({ "action": action.verb(), "selected": total, "done": done, "errors": failed })
        )?;
    } else {
        writeln!(out, "{} {done} of {total}", action.verb())?;
    }
    match (failed.len(), total) {
        (0, _) => Ok(()),
        (1, 1) => Err(CliError::Failed(failed.remove(0))),
        (n, _) => Err(CliError::Failed(format!("{n} of {total} failed"))),
    }
}

/// `hookledger replay` by filter: the matching DEAD or PARKED records
/// counted (`--dry-run`: the count and a sample, nothing changed), then
/// replayed in batches with a progress line, each audited in the run.
async fn replay_by_filter(ctx: &Ctx, out: &mut (dyn Write + Send), a: ReplayArgs) -> Result<(), CliError> {
    use hookledger::ops::bulk::RecordFilter;
    let (select, bulk) = (&a.action.select, &a.bulk);
    let filter = RecordFilter {
        provider: bulk.provider.clone(),
        endpoint: select.endpoint.clone(),
        tenant: bulk.tenant.clone(),
        event_type: select.event_type.clone(),
        subject: select.subject.clone(),
        statuses: select.statuses.clone(),
        since_ms: bulk.since,
        until_ms: bulk.until,
        reason: a.action.reason.clone(),
    };
    filter.check().map_err(CliError::Failed)?;
    let ops = if bulk.run.dry_run { ctx.ops_read_only()? } else { ctx.ops()? };
    let (selection, partial) = ops.matching(&filter, select.max).await?;
    let run = filter.run();
    let json = ctx.global.json;
    let more = if partial { " (a partition held more than --max: run again when these are done)" } else { "" };
    let count = selection.records.len();
    if bulk.run.dry_run {
        if json {
            let sample: Vec<_> = selection.records.iter().take(5).collect();
            let v = serde_json::json!({"run": run, "count": count, "partial": partial, "sample": sample,
                "replayed_by_this_run": selection.replayed_by_this_run, "need_their_source": selection.need_their_source});
            writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default())?;
            return Ok(());
        }
        writeln!(out, "{count} records would be replayed (run {run}){more}")?;
        for m in selection.records.iter().take(5) {
            writeln!(
                out,
                "  {}  {}  {}  {}",
                m.key,
                m.status,
                m.event_type.as_deref().unwrap_or("-"),
                m.reason.as_deref().unwrap_or("")
            )?;
        }
    } else {
        if count > bulk.run.max_without_yes && !bulk.run.yes {
            return Err(CliError::Failed(format!(
                "{count} records match, more than {}: look with --dry-run, then run again with --yes",
                bulk.run.max_without_yes
            )));
        }
        let caller = ctx.caller(&a.action.operator).await?;
        let (mut replayed, mut skipped) = (0, 0);
        for batch in selection.records.chunks(bulk.run.batch.max(1)) {
            let done = ops.replay_batch(&filter, batch, &caller, now_ms()).await?;
            replayed += done.replayed;
            skipped += done.skipped;
            if !json {
                eprintln!("{}", deliveries::progress(replayed + skipped, count));
            }
        }
        if json {
            let v = serde_json::json!({"run": run, "replayed": replayed, "skipped": skipped, "partial": partial,
                "replayed_by_this_run_before": selection.replayed_by_this_run, "need_their_source": selection.need_their_source});
            writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default())?;
            return Ok(());
        }
        writeln!(out, "{replayed} replayed, {skipped} moved meanwhile (left as they are); run {run}{more}")?;
    }
    if !json {
        if selection.replayed_by_this_run > 0 {
            writeln!(out, "{} replayed by this run before (not again)", selection.replayed_by_this_run)?;
        }
        if !selection.need_their_source.is_empty() {
            writeln!(
                out,
                "{} parked by a backfill without their payload: replay each by key with the provider's flags (hookledger replay KEY)",
                selection.need_their_source.len()
            )?;
        }
    }
    Ok(())
}

/// `hookledger erase`: each event it touched and what became of it. Fails
/// (non-zero) when an event is still in flight, so a script runs it again.
async fn erase(ctx: &Ctx, out: &mut (dyn Write + Send), a: EraseArgs) -> Result<(), CliError> {
    if a.reason.trim().is_empty() {
        return Err(CliError::Failed("--reason must say why (it is kept in the audit entry)".into()));
    }
    let ops = ctx.ops_read_only()?;
    let caller = ctx.caller(&a.operator).await?;
    let now = now_ms();
    let erased = match (&a.event, &a.subject) {
        (Some(raw), _) => {
            let key = parse_key(raw)?;
            vec![ops.erase(&key, &caller, &a.reason, now, a.dry_run).await?]
        }
        (None, Some(subject)) => ops
            .erase_subject(subject, a.endpoint.as_deref(), &caller, &a.reason, now, a.dry_run)
            .await
            .map_err(|e| CliError::Failed(e.to_string()))?,
        (None, None) => return Err(CliError::Failed("give --event or --subject".into())),
    };
    let in_flight = erased.iter().filter(|e| e.outcome == "in flight").count();
    if ctx.global.json {
        let v = serde_json::json!({ "dry_run": a.dry_run, "events": erased, "in_flight": in_flight });
        writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default())?;
    } else {
        for e in &erased {
            let sealed =
                if e.sealed { "sealed: every copy unreadable" } else { "not sealed: the ledger's copies only" };
            let status = e.status.as_deref().unwrap_or("-");
            writeln!(out, "{:<16} {status:<10} {}  ({sealed})", e.outcome, e.key)?;
        }
        writeln!(out, "{} event(s){}", erased.len(), if a.dry_run { ", nothing changed (dry run)" } else { "" })?;
    }
    if in_flight > 0 {
        return Err(CliError::Failed(format!(
            "{in_flight} event(s) still in flight were left alone: erase again once they settle"
        )));
    }
    Ok(())
}

/// The application the CLI runs with: the reference app, as the functions
/// register it (its re-checks for `reconcile`, its mapping for `map-subject`).
pub(crate) fn app(wiring: &hookledger::wiring::Wiring) -> Result<hookledger::projection::Registry, ConfigError> {
    Ok(hookledger_app::reference_registry(wiring.subscriptions()?, wiring.notify_topic()))
}

/// Maps a provider subject to an account (the reference app's mapping,
/// applied as one write): the demo's and the tests' seeding. An operator's
/// `map-subject` is [`map_subject_audited`].
pub async fn map_subject(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    provider: &str,
    tenant: &str,
    subject: &str,
    account: &str,
) -> Result<(), String> {
    let write = hookledger_app::subjects::mapping(provider, tenant, subject, account);
    hookledger::adapters::dynamodb::item::apply(ddb, table, &write).await.map_err(|e| e.to_string())
}

/// Maps a provider subject to an account (the reference app's mapping),
/// written with its audit entry as one transaction.
pub async fn map_subject_audited(
    ledger: &DynamoLedger,
    provider: &str,
    tenant: &str,
    subject: &str,
    account: &str,
    entry: &hookledger::audit::AuditEntry,
) -> Result<(), String> {
    let write = hookledger_app::subjects::mapping(provider, tenant, subject, account);
    match ledger.apply_audited(&write, entry).await.map_err(|e| e.to_string())? {
        true => Ok(()),
        false => Err(format!("the mapping of {provider} subject {subject} was refused by its condition")),
    }
}
