//! `hookledger backfill`: recover a window of an endpoint's events from the
//! provider's API (Stripe's events list, a GitHub hook's deliveries),
//! through the same identity and claim as its webhooks. Resumes an
//! interrupted run of the same window; `--dry-run` reports what a run would
//! recover and writes nothing; for GitHub, `--redeliver` asks GitHub to
//! deliver the missing ones again instead of importing their payloads.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Args;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::sources::ProviderSource;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::backfill::{Backfill, BackfillSettings, Mode, ParkedBackfill, Released, Summary, Target};
use hookledger::config::{self, ProviderKind};
use hookledger::ports::{BackfillSource, Window};
use hookledger::verify::provider::BackfillList as SourceList;
use hookledger::wiring::{LiveBackfill, SourceSpec, Wiring};

#[derive(Args)]
pub struct BackfillArgs {
    /// The endpoint (a name in HOOKLEDGER_ENDPOINTS) whose events to recover.
    #[arg(long)]
    endpoint: String,
    /// Events created at or after: unix seconds, or an age like 6h, 2d.
    #[arg(long, value_parser = parse_instant)]
    since: i64,
    /// Events created before: unix seconds, or an age (default: now).
    #[arg(long, value_parser = parse_instant)]
    until: Option<i64>,
    /// Only these event types (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    types: Vec<String>,
    /// Report what would be recovered; write nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    list: ListArgs,
    /// GitHub: ask GitHub to redeliver what is missing (original bytes,
    /// through the intake) instead of importing the kept payloads.
    #[arg(long)]
    redeliver: bool,
    /// The endpoints' configuration (as the intake reads it).
    #[arg(long, env = "HOOKLEDGER_ENDPOINTS")]
    endpoints: String,
    #[arg(long, env = "HOOKLEDGER_RETENTION_DAYS", default_value_t = 30)]
    retention_days: u32,
    /// Pages read at most (the next run resumes).
    #[arg(long, default_value_t = 200)]
    max_pages: u32,
    /// Stop after this many seconds (the next run resumes).
    #[arg(long, default_value_t = 600)]
    max_seconds: u64,
    /// The largest body taken; a larger one is parked `too_large`.
    #[arg(long, env = "HOOKLEDGER_MAX_BACKFILL_BODY_BYTES", default_value_t = hookledger::backfill::DEFAULT_MAX_BODY_BYTES, value_parser = parse_body_bytes)]
    max_backfill_body_bytes: usize,
}

/// Where an endpoint's provider list is read (a backfill's, an audit's):
/// Stripe's API and key, a connected account; a GitHub hook and token.
#[derive(Args)]
pub struct ListArgs {
    /// Stripe Connect: the connected account whose events the endpoint receives.
    #[arg(long)]
    pub(crate) account: Option<String>,
    /// Stripe: the API key, as a secret reference (env:NAME or ssm:/path).
    #[arg(long, env = "HOOKLEDGER_STRIPE_API_KEY")]
    pub(crate) api_key: Option<String>,
    #[arg(long, env = "HOOKLEDGER_STRIPE_API_BASE", default_value = "https://api.stripe.com")]
    pub(crate) api_base: String,
    /// GitHub: the hook (repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app/hook).
    #[arg(long)]
    pub(crate) github_hook: Option<String>,
    /// GitHub: a token that may read the hook's deliveries, as a secret reference.
    #[arg(long, env = "HOOKLEDGER_GITHUB_TOKEN")]
    pub(crate) github_token: Option<String>,
    #[arg(long, env = "HOOKLEDGER_GITHUB_API_BASE", default_value = "https://api.github.com")]
    pub(crate) github_api_base: String,
}

impl ListArgs {
    /// What a repair's `backfill` names besides the window, to read the same list.
    pub(crate) fn repair_flags(&self) -> String {
        match (&self.github_hook, &self.account) {
            (Some(hook), _) => format!(" --github-hook {hook}"),
            (None, Some(account)) => format!(" --account {account}"),
            (None, None) => String::new(),
        }
    }
}

/// Unix seconds, or an age before now (`30m`, `6h`, `2d`).
fn parse_instant(s: &str) -> Result<i64, String> {
    if let Ok(secs) = s.parse::<i64>() {
        return Ok(secs);
    }
    super::parse_time(s).map(|ms| ms / 1000)
}

/// The window the flags name at `now_s`: `--since` before `--until`
/// (default: now), and within the identity retention (`--retention-days`):
/// an event older than it may have lost its identity to the TTL, and would be
/// imported and applied again.
fn window_of(args: &BackfillArgs, now_s: i64) -> Result<Window, String> {
    let until = args.until.unwrap_or(now_s);
    if args.since >= until {
        return Err(format!("--since ({}) must be before --until ({until})", args.since));
    }
    hookledger::backfill::check_within_retention(args.since, now_s, args.retention_days)
        .map_err(|e| format!("--since {}: {e}; pass a later --since", args.since))?;
    Ok(Window { since_s: args.since, until_s: until, types: args.types.clone() })
}

impl BackfillArgs {
    /// The endpoint it recovers (the audit entry's target).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A dry run writes nothing (and is not audited).
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }
}

pub async fn run(
    args: BackfillArgs,
    wiring: &Wiring,
    ledger: DynamoLedger,
    queue: SqsQueue,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<Summary, String> {
    let specs = config::parse_endpoints(&args.endpoints).map_err(|e| e.to_string())?;
    let spec =
        specs.get(&args.endpoint).ok_or_else(|| format!("no endpoint {:?} in HOOKLEDGER_ENDPOINTS", args.endpoint))?;
    let window = window_of(&args, super::now_ms() / 1000)?;
    let until = window.until_s;
    let mode = if args.redeliver { Mode::Redeliver } else { Mode::Import };
    let target = Target {
        provider: spec.provider.as_str().to_owned(),
        endpoint: args.endpoint.clone(),
        tenant: spec.tenant.clone().unwrap_or_else(|| args.endpoint.clone()),
        retention_days: args.retention_days,
        index_shards: ledger.shards(),
        mode,
        payload: spec.payload.clone(),
        erasable: spec.erasable,
    };
    let settings = BackfillSettings {
        max_pages: args.max_pages,
        max_body_bytes: args.max_backfill_body_bytes,
        ..BackfillSettings::default()
    };
    let summary = match spec.provider.backfill() {
        Some(SourceList::StripeEvents) => {
            if args.redeliver {
                return Err("Stripe cannot redeliver: run without --redeliver".into());
            }
            let keys = Keys::of_backfill(&args);
            let source = wiring.provider_source(keys.stripe(args.list.account.clone())?).await?;
            execute(on(wiring, ledger, queue, source, settings), &target, &window, &args, json).await
        }
        Some(SourceList::GithubDeliveries) => {
            let hook = args.list.github_hook.as_deref().ok_or("GitHub needs --github-hook")?;
            let source = wiring.provider_source(Keys::of_backfill(&args).github(hook)?).await?;
            execute(on(wiring, ledger, queue, source, settings), &target, &window, &args, json).await
        }
        None => {
            return Err(format!(
                "endpoint {:?} is {}: it keeps no list to backfill from (Stripe and GitHub do; for SNS, replay the subscription's dead-letter queue)",
                args.endpoint, spec.provider
            ));
        }
    };
    report(&summary, &args, until, json, out)?;
    Ok(summary)
}

/// The provider flags a backfill, an audit and a replay from the source share.
pub(crate) struct Keys<'a> {
    api_key: Option<&'a str>,
    api_base: &'a str,
    github_token: Option<&'a str>,
    github_api_base: &'a str,
    max_body_bytes: usize,
}

impl<'a> Keys<'a> {
    fn of_backfill(a: &'a BackfillArgs) -> Self {
        Self { max_body_bytes: a.max_backfill_body_bytes, ..Self::of_list(&a.list) }
    }

    pub(crate) fn of_list(l: &'a ListArgs) -> Self {
        Self {
            api_key: l.api_key.as_deref(),
            api_base: &l.api_base,
            github_token: l.github_token.as_deref(),
            github_api_base: &l.github_api_base,
            max_body_bytes: hookledger::backfill::DEFAULT_MAX_BODY_BYTES,
        }
    }

    fn of_source(a: &'a SourceArgs) -> Self {
        Self {
            api_key: a.api_key.as_deref(),
            api_base: &a.api_base,
            github_token: a.github_token.as_deref(),
            github_api_base: &a.github_api_base,
            max_body_bytes: a.max_backfill_body_bytes,
        }
    }

    /// Stripe's event list (a connected account's when `account` is set).
    pub(crate) fn stripe(&self, account: Option<String>) -> Result<SourceSpec<'a>, String> {
        let secret = self.api_key.ok_or("Stripe needs --api-key or HOOKLEDGER_STRIPE_API_KEY")?;
        let base = Some(self.api_base);
        Ok(SourceSpec {
            list: SourceList::StripeEvents,
            base,
            hook: None,
            account,
            secret,
            max_body_bytes: self.max_body_bytes,
        })
    }

    /// A GitHub hook's deliveries.
    pub(crate) fn github(&self, hook: &'a str) -> Result<SourceSpec<'a>, String> {
        let secret = self.github_token.ok_or("GitHub needs --github-token or HOOKLEDGER_GITHUB_TOKEN")?;
        let (base, hook) = (Some(self.github_api_base), Some(hook));
        Ok(SourceSpec {
            list: SourceList::GithubDeliveries,
            base,
            hook,
            account: None,
            secret,
            max_body_bytes: self.max_body_bytes,
        })
    }
}

/// The backfill on this ledger and queue (the CLI's flags may name others
/// than the configured ones), with the wiring's clock and entropy.
fn on(
    wiring: &Wiring,
    ledger: DynamoLedger,
    queue: SqsQueue,
    source: ProviderSource,
    settings: BackfillSettings,
) -> LiveBackfill {
    let backfill = Backfill::new(ledger, queue, source, settings).with_ambient(wiring.ambient().clone());
    match wiring.keys() {
        Some(keys) => backfill.with_keys(keys),
        None => backfill,
    }
}

/// Runs the backfill with a progress spinner on a terminal.
async fn execute<S: BackfillSource>(
    backfill: Backfill<DynamoLedger, SqsQueue, S>,
    target: &Target,
    window: &Window,
    args: &BackfillArgs,
    json: bool,
) -> Summary {
    let bar = (std::io::stderr().is_terminal() && !json).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let verb = if args.dry_run { "would recover" } else { "recovered" };
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let summary = backfill
        .run(target, window, args.dry_run, super::now_ms(), deadline, |s| {
            if let Some(bar) = &bar {
                bar.set_message(format!(
                    "page {}: seen {}, already recorded {}, {verb} {}, redeliveries asked {}, parked {}, failed {}",
                    s.pages, s.seen, s.already_recorded, s.recovered, s.redeliveries_requested, s.parked, s.failed
                ));
            }
        })
        .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    summary
}

fn report(
    summary: &Summary,
    args: &BackfillArgs,
    until: i64,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), String> {
    let verb = if args.dry_run { "would recover" } else { "recovered" };
    if json {
        let v = serde_json::json!({ "endpoint": args.endpoint, "since": args.since, "until": until, "dry_run": args.dry_run, "summary": summary });
        writeln!(out, "{v}").map_err(|e| e.to_string())?;
        return Ok(());
    }
    let how = if args.dry_run { " (dry run: nothing written)" } else { "" };
    writeln!(out, "backfill {} [{}, {}){how}", args.endpoint, args.since, until).map_err(|e| e.to_string())?;
    writeln!(
        out,
        "seen {}, already recorded {}, {verb} {}, redeliveries asked {}, parked {}, failed {}, pages {}, rate-limit waits {}",
        summary.seen,
        summary.already_recorded,
        summary.recovered,
        summary.redeliveries_requested,
        summary.parked,
        summary.failed,
        summary.pages,
        summary.rate_limit_waits
    )
    .map_err(|e| e.to_string())?;
    if summary.parked > 0 {
        writeln!(
            out,
            "parked {}: the provider cannot serve them (hookledger list --status parked; replay them once it can)",
            summary.parked
        )
        .map_err(|e| e.to_string())?;
    }
    match &summary.stopped {
        Some(why) => writeln!(out, "stopped before the end of the window: {why}"),
        None => writeln!(out, "window complete"),
    }
    .map_err(|e| e.to_string())
}

/// Where `hookledger replay` fetches a record a backfill parked without its
/// payload again (the provider's API and key; the hook or the connected
/// account are the ones recorded on the record).
#[derive(Args)]
pub struct SourceArgs {
    /// Stripe: the API key, as a secret reference (env:NAME or ssm:/path).
    #[arg(long, env = "HOOKLEDGER_STRIPE_API_KEY")]
    api_key: Option<String>,
    #[arg(long, env = "HOOKLEDGER_STRIPE_API_BASE", default_value = "https://api.stripe.com")]
    api_base: String,
    /// GitHub: a token that may read the hook's deliveries, as a secret reference.
    #[arg(long, env = "HOOKLEDGER_GITHUB_TOKEN")]
    github_token: Option<String>,
    #[arg(long, env = "HOOKLEDGER_GITHUB_API_BASE", default_value = "https://api.github.com")]
    github_api_base: String,
    #[arg(long, env = "HOOKLEDGER_RETENTION_DAYS", default_value_t = 30)]
    retention_days: u32,
    /// The largest body taken (a larger one stays parked `too_large`).
    #[arg(long, env = "HOOKLEDGER_MAX_BACKFILL_BODY_BYTES", default_value_t = hookledger::backfill::DEFAULT_MAX_BODY_BYTES, value_parser = parse_body_bytes)]
    max_backfill_body_bytes: usize,
}

fn parse_body_bytes(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("{s:?} is not a number of bytes"))?;
    let max = hookledger::backfill::MAX_MAX_BODY_BYTES;
    if !(1024..=max).contains(&n) {
        return Err(format!("{n} is not between 1024 and {max}"));
    }
    Ok(n)
}

/// `hookledger replay` of a record a backfill parked without its payload
/// (`row`, as `show` reads it): asks its provider for that one event again
/// and, if it serves it now, stores the payload and releases the record
/// (RECEIVED, queued, the replay audited). `Ok`: how it went; `Err`: why it
/// stays parked (or could not be asked).
pub async fn replay_from_source(
    wiring: &Wiring,
    ledger: DynamoLedger,
    queue: SqsQueue,
    row: &hookledger::ledger::Row,
    operator: &str,
    reason: &str,
    args: &SourceArgs,
) -> Result<String, String> {
    let parked = ParkedBackfill::from_row(row).ok_or_else(|| {
        let status = row.get("status").and_then(|v| v.as_str()).unwrap_or("unknown");
        format!("nothing to fetch: the record is {status}, no longer parked without its payload")
    })?;
    // The fetched body is kept as a delivered one would be: the endpoint's
    // policy, which a record parked under a policy other than `keep` names.
    let marked = row.get("payload_policy").and_then(|v| v.as_str());
    let payload = match (wiring.settings.payload_policy(&parked.endpoint), marked) {
        (Some(policy), _) => policy,
        (None, None) => hookledger::redaction::PayloadPolicy::Keep,
        (None, Some(policy)) => {
            return Err(format!(
                "the record's endpoint {} keeps payloads under its {policy} policy: run with HOOKLEDGER_ENDPOINTS \
                 as the stack's, so the fetched body is kept as a delivered one would be",
                parked.endpoint
            ));
        }
    };
    let target = Target {
        provider: parked.provider.clone(),
        endpoint: parked.endpoint.clone(),
        tenant: parked.tenant.clone(),
        retention_days: args.retention_days,
        index_shards: ledger.shards(),
        mode: Mode::Import,
        payload,
        erasable: wiring.settings.erasable(&parked.endpoint),
    };
    let settings = BackfillSettings { max_body_bytes: args.max_backfill_body_bytes, ..BackfillSettings::default() };
    let list = ProviderKind::named(&parked.provider).and_then(|p| p.backfill());
    let released = match list {
        Some(SourceList::GithubDeliveries) => {
            let hook = parked.origin.as_deref().ok_or("the record names no GitHub hook to ask")?;
            let source = wiring.provider_source(Keys::of_source(args).github(hook)?).await?;
            release(on(wiring, ledger, queue, source, settings), &target, &parked, operator, reason).await?
        }
        Some(SourceList::StripeEvents) => {
            let source = wiring.provider_source(Keys::of_source(args).stripe(parked.origin.clone())?).await?;
            release(on(wiring, ledger, queue, source, settings), &target, &parked, operator, reason).await?
        }
        None => return Err(format!("{} keeps nothing to fetch it from", parked.provider)),
    };
    match released {
        Released::Released { queued: true } => Ok(format!("fetched again from {}, stored and queued", parked.provider)),
        Released::Released { queued: false } => {
            Ok(format!("fetched again from {} and stored; not queued now, the reconciler sends it", parked.provider))
        }
        Released::StillUnfetchable { cause, detail } => Err(format!(
            "cannot replay {}: {} still cannot serve it ({cause}: {detail}); it stays parked",
            parked.key, parked.provider
        )),
        Released::NotAwaiting => Ok("released meanwhile (by a delivery of it) or settled: nothing to do".into()),
    }
}

async fn release<S: BackfillSource>(
    backfill: Backfill<DynamoLedger, SqsQueue, S>,
    target: &Target,
    parked: &ParkedBackfill,
    operator: &str,
    reason: &str,
) -> Result<Released, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    backfill.release(target, parked, operator, reason, super::now_ms(), deadline).await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BackfillArgs,
    }

    fn args(extra: &[&str]) -> BackfillArgs {
        let mut argv = vec!["hookledger", "--endpoint", "stripe-a", "--endpoints", "{}"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().args
    }

    /// Issue 39.12: a `--since` older than the identity retention would
    /// re-import events whose identities the TTL already deleted, and apply
    /// them again: refused, naming the retention; inside it, the window is taken.
    #[test]
    fn a_since_beyond_the_identity_retention_is_refused_naming_it() {
        const NOW: i64 = 1_800_000_000;
        let day = 86_400;
        for (since, retention) in [(NOW - 30 * day, "30"), (NOW - 10 * day, "10"), (NOW - 400 * day, "30")] {
            let since = since.to_string();
            let a = args(&["--since", &since, "--until", &(NOW - 3_600).to_string(), "--retention-days", retention]);
            let err = window_of(&a, NOW).map(|_| ()).unwrap_err();
            assert!(err.contains("HOOKLEDGER_RETENTION_DAYS") && err.contains(retention), "{since}: {err}");
        }
        let inside = args(&["--since", &(NOW - 29 * day).to_string(), "--retention-days", "30"]);
        let w = window_of(&inside, NOW).unwrap();
        assert_eq!((w.since_s, w.until_s), (NOW - 29 * day, NOW));
        let reversed = args(&["--since", &NOW.to_string(), "--until", &(NOW - 1).to_string()]);
        assert!(window_of(&reversed, NOW).unwrap_err().contains("must be before --until"));
    }
}
