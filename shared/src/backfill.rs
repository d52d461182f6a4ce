//! Backfill: recover what a provider sent and the intake never recorded, from
//! the provider's own list of events, through the same identity and claim as
//! a webhook delivery.
//!
//! A fetched event becomes a `NewEvent` with `via = backfill` for the same
//! key as its webhook (`provider#endpoint#event id`): one conditional write
//! either records it (then it is queued with its payload, like an accepted
//! delivery) or meets the record the webhook made (already recorded: nothing
//! written, nothing applied again). The body is the provider API's rendering,
//! so its bytes never match the webhook's: the intake does not call that a
//! conflict when the webhook comes late (`Via::compares_bytes_with`).
//!
//! A run covers one window and reads it page by page, newest first, by the
//! provider's opaque cursor. After each page is recorded, the cursor of the
//! next one is saved (`backfill#<endpoint>#<window>`), so a run that was
//! interrupted — by its time bound, a rate limit, a crash — resumes where it
//! stopped; a page is saved only once every event on it is in the ledger, so
//! a failure never skips an event (re-reading a page costs one failed
//! conditional write per event already recorded). Rate limits are honoured:
//! `Retry-After` when the provider sends it, else exponential backoff, and
//! never a retry the provider says not to make.
//!
//! Per-event failures are classified. Only what retrying can cure stops a
//! page: the provider unavailable (5xx, network), a rate limit beyond the
//! run's bounds, the ledger unavailable. An event its source cannot serve
//! ([`Unfetchable`]: no payload served, not JSON, a 4xx for that event,
//! larger than `max_body_bytes` or than a ledger without a payload bucket
//! stores) is recorded under its identity, PARKED
//! `backfill_unrecoverable:<cause>` with `payload_stored = false` (one
//! conditional put, as the claim), and the page goes on: one such event no
//! longer keeps its window open. A replay ([`Backfill::release`]) asks the
//! source for it again; a webhook delivery of the same identity supplies the
//! payload and releases it too (`Ledger::release_parked`).

use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::clock::Ambient;
use crate::identity::{EventKey, payload_hash};
use crate::ledger::{Claim, NewEvent, PortError, Release, SendLease, Status, Via};
use crate::policy::SEND_LEASE_MS;
use crate::ports::{
    BackfillLedger, BackfillProgress, BackfillSource, ScheduleState, SourceError, SourceEvent, Unfetchable,
    UnfetchedEvent, Window, WorkQueue,
};

/// The endpoint whose events are recovered: the identity's provider and
/// endpoint, and what its records carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub provider: String,
    pub endpoint: String,
    pub tenant: String,
    pub retention_days: u32,
    pub index_shards: u32,
    pub mode: Mode,
}

/// How a missing event is recovered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Record the body the provider's API returns (`via = backfill`).
    #[default]
    Import,
    /// Ask the provider to deliver it again: it comes back through the
    /// intake, signed, with the original bytes (GitHub).
    Redeliver,
}

/// An endpoint's scheduled backfill (the reconciler runs it; times in
/// seconds). One entry of `HOOKLEDGER_BACKFILL`, keyed by endpoint name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// `stripe` (the events list) or `github` (the hook's deliveries).
    pub provider: String,
    /// The endpoint's tenant (as in `HOOKLEDGER_ENDPOINTS`; default: its name).
    #[serde(default)]
    pub tenant: Option<String>,
    /// GitHub: the hook (`repos/OWNER/REPO/hooks/ID`, `orgs/ORG/hooks/ID`, `app/hook`).
    #[serde(default)]
    pub hook: Option<String>,
    /// Stripe Connect: the connected account (`Stripe-Account`).
    #[serde(default)]
    pub account: Option<String>,
    /// Events younger than this are left to their webhooks and retries.
    #[serde(default = "default_lag")]
    pub lag_secs: i64,
    /// Each window starts this long before the previous one ended (clock
    /// skew, events listed late); re-read events cost a failed claim each.
    #[serde(default = "default_overlap")]
    pub overlap_secs: i64,
    /// Where the first window starts (Stripe keeps 30 days, GitHub 3).
    #[serde(default = "default_lookback")]
    pub lookback_secs: i64,
    /// The longest window one run takes on.
    #[serde(default = "default_max_window")]
    pub max_window_secs: i64,
    /// Only these event types (empty: all).
    #[serde(default)]
    pub types: Vec<String>,
    #[serde(default)]
    pub mode: Mode,
}

fn default_lag() -> i64 {
    600
}
fn default_overlap() -> i64 {
    3_600
}
fn default_lookback() -> i64 {
    86_400
}
fn default_max_window() -> i64 {
    21_600
}

/// Parses `HOOKLEDGER_BACKFILL`: endpoint name → [`Schedule`].
pub fn parse_schedules(json: &str) -> Result<std::collections::BTreeMap<String, Schedule>, String> {
    let schedules: std::collections::BTreeMap<String, Schedule> =
        serde_json::from_str(json).map_err(|e| format!("HOOKLEDGER_BACKFILL: {e}"))?;
    for (endpoint, s) in &schedules {
        let bad = |why: &str| Err(format!("HOOKLEDGER_BACKFILL: {endpoint}: {why}"));
        match (s.provider.as_str(), &s.hook) {
            ("stripe", None) if s.mode == Mode::Redeliver => return bad("Stripe cannot redeliver"),
            ("stripe", None) => {}
            ("stripe", Some(_)) => return bad("\"hook\" is for GitHub"),
            ("github", Some(hook)) if crate::ports::valid_github_hook(hook) => {}
            ("github", _) => {
                return bad("GitHub needs \"hook\": repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app/hook");
            }
            (other, _) => return bad(&format!("provider {other:?} keeps no list to backfill from (stripe, github)")),
        }
        let positive = s.lag_secs >= 0 && s.overlap_secs >= 0 && s.lookback_secs > 0 && s.max_window_secs > 0;
        if !positive {
            return bad("lag and overlap must be ≥ 0, lookback and max window > 0");
        }
    }
    Ok(schedules)
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            provider: "stripe".into(),
            tenant: None,
            hook: None,
            account: None,
            lag_secs: default_lag(),
            overlap_secs: default_overlap(),
            lookback_secs: default_lookback(),
            max_window_secs: default_max_window(),
            types: Vec::new(),
            mode: Mode::Import,
        }
    }
}

/// The window a scheduled run reads: the one in progress, else the next
/// one after the high-water mark (less the overlap), at most
/// `max_window_secs` long and ending `lag_secs` before now. `None`: nothing
/// is due yet.
pub fn next_window(state: &ScheduleState, schedule: &Schedule, now_s: i64) -> Option<Window> {
    let types = schedule.types.clone();
    if let Some((since_s, until_s)) = state.current {
        return Some(Window { since_s, until_s, types });
    }
    let since_s = match state.high_water {
        Some(hw) => hw - schedule.overlap_secs,
        None => now_s - schedule.lookback_secs,
    };
    let until_s = (since_s + schedule.max_window_secs).min(now_s - schedule.lag_secs);
    // A window no longer than the overlap would only re-read what was read.
    let fresh = state.high_water.map_or(until_s > since_s, |hw| until_s > hw);
    fresh.then_some(Window { since_s, until_s, types })
}

/// Bounds of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackfillSettings {
    /// Pages read per run at most.
    pub max_pages: u32,
    /// Rate-limit waits per run at most.
    pub max_waits: u32,
    /// Backoff after a rate limit without `Retry-After`.
    pub backoff: Backoff,
    /// The largest body a backfill takes (`HOOKLEDGER_MAX_BACKFILL_BODY_BYTES`);
    /// a larger one is parked `too_large`.
    pub max_body_bytes: usize,
}

/// `HOOKLEDGER_MAX_BACKFILL_BODY_BYTES` by default: 25 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = crate::ports::DEFAULT_MAX_BACKFILL_BODY_BYTES;
/// The most `HOOKLEDGER_MAX_BACKFILL_BODY_BYTES` may be.
pub const MAX_MAX_BODY_BYTES: usize = crate::ports::MAX_MAX_BACKFILL_BODY_BYTES;

impl Default for BackfillSettings {
    fn default() -> Self {
        Self {
            max_pages: 50,
            max_waits: 5,
            backoff: Backoff { base_ms: 1_000, max_ms: 30_000 },
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// What a run did. In a dry run, `recovered` counts what a real run would
/// record, and nothing is written.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    pub seen: u64,
    pub already_recorded: u64,
    pub recovered: u64,
    /// Events the run could not record now (a transient failure: the page
    /// is read again by the next run).
    pub failed: u64,
    /// Events their source cannot serve, recorded PARKED
    /// `backfill_unrecoverable:<cause>` without a payload.
    pub parked: u64,
    pub pages: u64,
    pub rate_limit_waits: u64,
    /// Recovered records whose first send failed: they are durable and the
    /// reconciler sends them after the grace period.
    pub send_deferred: u64,
    /// Redeliveries asked for (`Mode::Redeliver`); they arrive through the intake.
    pub redeliveries_requested: u64,
    /// The window was read to its end.
    pub complete: bool,
    /// Why the run stopped before the end of the window.
    pub stopped: Option<String>,
}

pub struct Backfill<L, Q, S> {
    ledger: L,
    queue: Q,
    source: S,
    settings: BackfillSettings,
    ambient: Ambient,
}

impl<L: BackfillLedger, Q: WorkQueue, S: BackfillSource> Backfill<L, Q, S> {
    pub fn new(ledger: L, queue: Q, source: S, settings: BackfillSettings) -> Self {
        Self { ledger, queue, source, settings, ambient: Ambient::system() }
    }

    /// Reads time, sleeps and draws tokens and jitter through `ambient`.
    pub fn with_ambient(mut self, ambient: Ambient) -> Self {
        self.ambient = ambient;
        self
    }

    /// Reads `window` from where an earlier run of it stopped, records what
    /// is missing, and saves its progress page by page. `on_page` sees the
    /// running summary after each page (a progress bar).
    pub async fn run(
        &self,
        target: &Target,
        window: &Window,
        dry_run: bool,
        now_ms: i64,
        deadline: Instant,
        mut on_page: impl FnMut(&Summary),
    ) -> Summary {
        let run = window.run_id(&target.endpoint);
        let mut summary = Summary::default();
        let mut progress = if dry_run {
            BackfillProgress::default()
        } else {
            match self.ledger.progress(&run).await {
                Ok(p) => p.unwrap_or_default(),
                Err(e) => return stop(summary, format!("progress unreadable: {e}")),
            }
        };
        if progress.done {
            summary.complete = true;
            return summary;
        }
        let mut waits = 0;
        // Identities met in this run (a list may name one more than once:
        // GitHub lists each redelivery).
        let mut seen = std::collections::HashSet::new();
        loop {
            if summary.pages >= u64::from(self.settings.max_pages) {
                return stop(
                    summary,
                    format!("page bound ({}) reached; the next run resumes", self.settings.max_pages),
                );
            }
            if self.ambient.past(deadline) {
                return stop(summary, "time bound reached; the next run resumes".into());
            }
            let cursor = progress.cursor.clone();
            let page = match self
                .limited(deadline, &mut waits, &mut summary, || self.source.page(window, cursor.as_deref()))
                .await
            {
                Ok(page) => page,
                // A list that cannot be read is no single event's failure.
                Err(failure) => return stop(summary, failure.why()),
            };
            summary.pages += 1;
            for ev in &page.events {
                if !in_window(ev, window) || !seen.insert(ev.event_id.clone()) {
                    continue;
                }
                summary.seen += 1;
                if let Err(why) = self.recover(target, ev, dry_run, now_ms, deadline, &mut waits, &mut summary).await {
                    // Transient: the page's cursor is not saved, the next run reads it again.
                    summary.failed += 1;
                    return stop(summary, why);
                }
            }
            progress.seen += page.events.len() as u64;
            progress.cursor = page.next.clone();
            progress.done = page.next.is_none();
            progress.recovered = summary.recovered;
            if !dry_run {
                if let Err(e) = self.ledger.save_progress(&run, &progress, now_ms).await {
                    // The page is recorded; without its cursor the next run reads it again.
                    on_page(&summary);
                    return stop(summary, format!("progress not saved: {e}"));
                }
            }
            on_page(&summary);
            if progress.done {
                summary.complete = true;
                return summary;
            }
        }
    }
}

/// One scheduled run of an endpoint ([`Backfill::scheduled_run`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduledRun {
    /// The window read and what the run did (`None`: nothing was due).
    pub ran: Option<(Window, Summary)>,
    /// The endpoint's schedule state as the run left it (`None`: unreadable).
    pub state: Option<ScheduleState>,
    /// Why the run could not read or save its schedule.
    pub error: Option<String>,
}

impl<L: BackfillLedger, Q: WorkQueue, S: BackfillSource> Backfill<L, Q, S> {
    /// One scheduled run for `target`: reads the window due (resuming the
    /// one in progress) and, when it is complete, moves the high-water mark
    /// to its end. `None`: nothing was due.
    pub async fn scheduled(
        &self,
        target: &Target,
        schedule: &Schedule,
        now_ms: i64,
        deadline: Instant,
    ) -> Result<Option<(Window, Summary)>, String> {
        let run = self.scheduled_run(target, schedule, now_ms, deadline).await;
        match run.error {
            Some(e) => Err(e),
            None => Ok(run.ran),
        }
    }

    /// [`Backfill::scheduled`], with the state it left (for
    /// [`overdue`]).
    pub async fn scheduled_run(
        &self,
        target: &Target,
        schedule: &Schedule,
        now_ms: i64,
        deadline: Instant,
    ) -> ScheduledRun {
        let endpoint = &target.endpoint;
        let failed = |state, e: String| ScheduledRun { ran: None, state, error: Some(e) };
        let mut state = match self.ledger.schedule_state(endpoint).await {
            Ok(st) => st.unwrap_or_default(),
            Err(e) => return failed(None, format!("schedule unreadable: {e}")),
        };
        let Some(window) = next_window(&state, schedule, now_ms / 1000) else {
            return ScheduledRun { ran: None, state: Some(state), error: None };
        };
        if state.current != Some((window.since_s, window.until_s)) {
            // Fixed before reading, so a run that dies resumes this window's cursor.
            let before = state.clone();
            state.current = Some((window.since_s, window.until_s));
            if let Err(e) = self.ledger.save_schedule_state(endpoint, &state, now_ms).await {
                return failed(Some(before), format!("schedule: {e}"));
            }
        }
        let target = Target { mode: schedule.mode, ..target.clone() };
        let summary = self.run(&target, &window, false, now_ms, deadline, |_| {}).await;
        if summary.complete {
            let before = state.clone();
            state.high_water = Some(window.until_s);
            state.current = None;
            if let Err(e) = self.ledger.save_schedule_state(endpoint, &state, now_ms).await {
                return ScheduledRun {
                    ran: Some((window, summary)),
                    state: Some(before),
                    error: Some(format!("schedule: {e}")),
                };
            }
        }
        ScheduledRun { ran: Some((window, summary)), state: Some(state), error: None }
    }

    /// One listed event: already recorded, or recorded now (imported), or
    /// asked for again (redelivered), or parked (its source cannot serve
    /// it). `Err`: a transient failure; stop the run here.
    #[allow(clippy::too_many_arguments)]
    async fn recover(
        &self,
        target: &Target,
        ev: &SourceEvent,
        dry_run: bool,
        now_ms: i64,
        deadline: Instant,
        waits: &mut u32,
        summary: &mut Summary,
    ) -> Result<(), String> {
        let key = EventKey::new(&target.provider, &target.endpoint, &ev.event_id);
        // Without the body at hand (or to ask for a redelivery), look first:
        // a recorded event costs one read, not a fetch.
        let look_first = dry_run || ev.body.is_none() || target.mode == Mode::Redeliver;
        if look_first {
            let recorded = self.ledger.recorded(&key).await.map_err(|e| format!("ledger unavailable: {e}"))?;
            if recorded {
                summary.already_recorded += 1;
                return Ok(());
            }
            if dry_run {
                summary.recovered += 1;
                return Ok(());
            }
        }
        if target.mode == Mode::Redeliver {
            let handle = ev.handle.clone().unwrap_or_else(|| ev.event_id.clone());
            match self.limited(deadline, waits, summary, || self.source.redeliver(ev)).await {
                Ok(()) => {}
                Err(Failure::Unfetchable(cause, detail)) => {
                    return self.park(target, ev, cause, &detail, now_ms, summary).await;
                }
                Err(failure) => return Err(failure.why()),
            }
            self.ledger
                .note_redelivery(&key, &handle, now_ms)
                .await
                .map_err(|e| format!("redelivery asked for, not noted: {e}"))?;
            summary.redeliveries_requested += 1;
            return Ok(());
        }
        let body = match self.body(ev, deadline, waits, summary).await {
            Ok(body) => body,
            Err(Failure::Unfetchable(cause, detail)) => {
                return self.park(target, ev, cause, &detail, now_ms, summary).await;
            }
            Err(failure) => return Err(failure.why()),
        };
        let event = new_event(target, ev, &body, now_ms, self.ambient.token());
        match self.ledger.claim(&event, &body).await {
            Ok(Claim::Existing(_)) => summary.already_recorded += 1,
            Ok(Claim::New) => {
                summary.recovered += 1;
                if let Err(e) = self.queue.send_with_payload(&event.key, &body).await {
                    // Durable: the reconciler sends it after the grace period.
                    summary.send_deferred += 1;
                    tracing::warn!(key = %event.key, error = %e, "backfilled event not queued; the reconciler sends it");
                    if let Err(e) = self.ledger.release_send_lease(&event.key, &event.send).await {
                        tracing::warn!(key = %event.key, error = %e, "send lease not released; it lapses");
                    }
                }
            }
            // Larger, stored, than the ledger takes: no payload bucket here.
            Err(PortError::TooLarge { size, limit }) => {
                let detail = format!(
                    "{size} bytes stored exceed the {limit} a ledger item takes, and no payload bucket \
                     (HOOKLEDGER_PAYLOAD_BUCKET) is configured"
                );
                return self.park(target, ev, Unfetchable::TooLarge, &detail, now_ms, summary).await;
            }
            Err(e) => return Err(format!("ledger unavailable: {e}")),
        }
        Ok(())
    }

    /// The event's body: the one the list carried, or fetched, and checked
    /// against what a backfill takes (size, JSON).
    async fn body(
        &self,
        ev: &SourceEvent,
        deadline: Instant,
        waits: &mut u32,
        summary: &mut Summary,
    ) -> Result<Vec<u8>, Failure> {
        let body = match &ev.body {
            Some(body) => body.clone(),
            None => self.limited(deadline, waits, summary, || self.source.body(ev)).await?,
        };
        let limit = self.settings.max_body_bytes;
        if body.len() > limit {
            let detail = format!("{} bytes exceed HOOKLEDGER_MAX_BACKFILL_BODY_BYTES ({limit})", body.len());
            return Err(Failure::Unfetchable(Unfetchable::TooLarge, detail));
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err() {
            let detail = format!("the {} bytes served are not JSON", body.len());
            return Err(Failure::Unfetchable(Unfetchable::NotJson, detail));
        }
        Ok(body)
    }

    /// Records an event its source cannot serve under its identity, PARKED
    /// `backfill_unrecoverable:<cause>` without a payload, so the window
    /// moves on and the event is in `failures`, `list` and the console.
    async fn park(
        &self,
        target: &Target,
        ev: &SourceEvent,
        cause: Unfetchable,
        detail: &str,
        now_ms: i64,
        summary: &mut Summary,
    ) -> Result<(), String> {
        let mut event = new_event(target, ev, b"", now_ms, self.ambient.token());
        event.payload_hash = crate::ledger::NO_PAYLOAD_HASH.into();
        event.content_hash = String::new();
        let reason = cause.park_reason();
        let origin = self.source.origin();
        let unfetched = UnfetchedEvent {
            reason: &reason,
            detail,
            handle: ev.handle.as_deref(),
            origin: origin.as_deref(),
            created_s: ev.created_s,
        };
        match self.ledger.park(&event, &unfetched).await {
            Ok(Claim::New) => {
                summary.parked += 1;
                tracing::warn!(key = %event.key, reason = %reason, detail, "backfill parked an event its source cannot serve");
                Ok(())
            }
            Ok(Claim::Existing(_)) => {
                summary.already_recorded += 1;
                Ok(())
            }
            Err(e) => Err(format!("ledger unavailable: {e}")),
        }
    }

    /// Calls the provider, waiting out rate limits as it asks (`Retry-After`)
    /// or with backoff, within the run's bounds; never retries what the
    /// provider says not to. `Err`: why the run stops, or why this one event
    /// cannot be had.
    async fn limited<T, F, Fut>(
        &self,
        deadline: Instant,
        waits: &mut u32,
        summary: &mut Summary,
        mut call: F,
    ) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, SourceError>>,
    {
        loop {
            match call().await {
                Ok(v) => return Ok(v),
                Err(SourceError::RateLimited { should_retry: false, .. }) => {
                    return Err(Failure::Stop("rate limited, and the provider says not to retry".into()));
                }
                Err(SourceError::RateLimited { retry_after_s, .. }) => {
                    let wait_ms = match retry_after_s {
                        Some(s) => i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX),
                        None => self.settings.backoff.delay_ms(*waits + 1, self.ambient.jitter()),
                    };
                    let wait = Duration::from_millis(u64::try_from(wait_ms.max(0)).unwrap_or(u64::MAX));
                    if *waits >= self.settings.max_waits || self.ambient.instant() + wait >= deadline {
                        return Err(Failure::Stop("rate limited; the next run resumes".into()));
                    }
                    *waits += 1;
                    summary.rate_limit_waits += 1;
                    tracing::info!(wait_ms, "backfill rate limited; waiting");
                    self.ambient.clock.sleep(wait).await;
                }
                Err(SourceError::Unfetchable { cause, detail }) => return Err(Failure::Unfetchable(cause, detail)),
                Err(e) => return Err(Failure::Stop(e.to_string())),
            }
        }
    }
}

/// Why a call to the source did not give what was asked.
enum Failure {
    /// Retrying can cure it (later): the run stops here.
    Stop(String),
    /// This one event cannot be had: it is parked.
    Unfetchable(Unfetchable, String),
}

impl Failure {
    fn why(self) -> String {
        match self {
            Self::Stop(why) => why,
            Self::Unfetchable(cause, detail) => SourceError::Unfetchable { cause, detail }.to_string(),
        }
    }
}

/// A record a backfill parked without its payload, as the operator's `show`
/// gives it: what a replay needs to ask its source for it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedBackfill {
    pub key: EventKey,
    pub provider: String,
    pub endpoint: String,
    pub tenant: String,
    /// `backfill_unrecoverable:<cause>`.
    pub reason: String,
    /// [`BackfillSource::origin`] of the source that listed it.
    pub origin: Option<String>,
    /// The event as its source listed it (without a body).
    pub event: SourceEvent,
}

impl ParkedBackfill {
    /// The parked record in `row`, if it is one a backfill parked without its
    /// payload (PARKED `backfill_unrecoverable:…`, `payload_stored` false).
    pub fn from_row(row: &crate::ledger::Row) -> Option<Self> {
        let text = |k: &str| row.get(k).and_then(serde_json::Value::as_str).map(str::to_owned);
        let reason = text("park_reason").filter(|r| r.starts_with(crate::ledger::BACKFILL_UNRECOVERABLE))?;
        let stored = row.get("payload_stored").and_then(serde_json::Value::as_bool).unwrap_or(true);
        if text("status").as_deref() != Some(Status::Parked.as_str()) || stored {
            return None;
        }
        let key = EventKey::from_stored(&text("pk")?)?;
        Some(Self {
            key,
            provider: text("provider")?,
            endpoint: text("endpoint")?,
            tenant: text("tenant")?,
            reason,
            origin: text("backfill_origin"),
            event: SourceEvent {
                event_id: text("event_id")?,
                event_type: text("event_type"),
                created_s: row.get("backfill_created").and_then(serde_json::Value::as_i64).unwrap_or(0),
                body: None,
                handle: text("backfill_handle"),
            },
        })
    }
}

/// What a replay of a record parked without its payload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// Fetched, stored, RECEIVED, audited and queued (`queued` false: the
    /// send failed; the reconciler sends it after the grace period).
    Released { queued: bool },
    /// The source still cannot serve it: it stays parked.
    StillUnfetchable { cause: String, detail: String },
    /// It no longer awaits its payload (a webhook delivery released it, or
    /// an operator resolved it): nothing written.
    NotAwaiting,
}

impl<L: BackfillLedger, Q: WorkQueue, S: BackfillSource> Backfill<L, Q, S> {
    /// Replays a record a backfill parked without its payload: asks its
    /// source for that one event again (same identity, `via = backfill`)
    /// and, if it serves it now, stores the payload and releases the record
    /// (RECEIVED; one conditional write, which a webhook delivery releasing
    /// it at the same moment cannot also win), audits the replay in its
    /// history and queues it. `Err`: a transient failure (the provider or
    /// the ledger unavailable); run it again.
    pub async fn release(
        &self,
        target: &Target,
        parked: &ParkedBackfill,
        operator: &str,
        reason: &str,
        now_ms: i64,
        deadline: Instant,
    ) -> Result<Released, String> {
        let mut summary = Summary::default();
        let mut waits = 0;
        let still =
            |cause: Unfetchable, detail: String| Ok(Released::StillUnfetchable { cause: cause.cause(), detail });
        let body = match self.body(&parked.event, deadline, &mut waits, &mut summary).await {
            Ok(body) => body,
            Err(Failure::Unfetchable(cause, detail)) => return still(cause, detail),
            Err(failure) => return Err(failure.why()),
        };
        let event = new_event(target, &parked.event, &body, now_ms, self.ambient.token());
        match self.ledger.release(&event, &body, &format!("operator {operator}")).await {
            Ok(Release::Released) => {}
            Ok(Release::NotAwaiting) => return Ok(Released::NotAwaiting),
            Err(PortError::TooLarge { size, limit }) => {
                let detail = format!(
                    "{size} bytes stored exceed the {limit} a ledger item takes, and no payload bucket \
                     (HOOKLEDGER_PAYLOAD_BUCKET) is configured"
                );
                return still(Unfetchable::TooLarge, detail);
            }
            Err(e) => return Err(format!("ledger unavailable: {e}")),
        }
        let detail = format!("by {operator}: {reason} (fetched again from the provider; was {})", parked.reason);
        let noted = self.ledger.note(&event.key, "replay", &detail, now_ms).await;
        let queued = match self.queue.send_with_payload(&event.key, &body).await {
            Ok(()) => true,
            Err(e) => {
                // Durable and RECEIVED: the reconciler sends it after the grace period.
                tracing::warn!(key = %event.key, error = %e, "released event not queued; the reconciler sends it");
                if let Err(e) = self.ledger.release_send_lease(&event.key, &event.send).await {
                    tracing::warn!(key = %event.key, error = %e, "send lease not released; it lapses");
                }
                false
            }
        };
        noted.map_err(|e| format!("released, but the replay's audit entry was not written: {e}"))?;
        Ok(Released::Released { queued })
    }
}

/// Whether a scheduled endpoint is overdue (`backfill_overdue_windows`).
///
/// Its *edge* is the end (`until`) of its window in progress, or, with none,
/// its high-water mark: everything created before the edge has been read.
/// The endpoint is overdue when the edge is more than
/// `2 × max_window_secs + 1 h` behind `now − lag_secs` — when a healthy
/// schedule keeps it within one window of `now − lag` (and the window after
/// a complete one starts an overlap before it). Two cases are not overdue:
/// an endpoint with no state yet (it never ran, its first window starts
/// `lookback_secs` back by design), and one that completed a window in this
/// invocation (`advanced`): it is catching up, a window per run (after a
/// first deploy with a lookback longer than the bound, or an outage).
pub fn overdue(state: &ScheduleState, schedule: &Schedule, now_s: i64, advanced: bool) -> bool {
    if advanced {
        return false;
    }
    let Some(edge) = state.current.map(|(_, until)| until).or(state.high_water) else { return false };
    let bound = 2 * schedule.max_window_secs + 3_600;
    now_s - schedule.lag_secs - edge > bound
}

/// The metrics a scheduled backfill emits (labelled by endpoint).
/// `backfill_failed` counts what the run did not recover: events it could
/// not record now (transient) and events it parked; `backfill_parked` the
/// parked ones alone.
pub const METRICS: &[&str] =
    &["backfill_recovered", "backfill_already_recorded", "backfill_redeliveries", "backfill_failed", "backfill_parked"];

/// The gauges the reconciler sets on every invocation that has schedules,
/// without an endpoint label, so an alarm can watch one series each:
/// `backfill_failed_last_run` (events that failed or were parked in this
/// invocation's scheduled backfills, all endpoints) and
/// `backfill_overdue_windows` (scheduled endpoints [`overdue`] after it).
pub const ALARMED_METRICS: &[&str] = &["backfill_failed_last_run", "backfill_overdue_windows"];

/// Sets [`ALARMED_METRICS`].
pub fn emit_gauges(failed_last_run: u64, overdue_windows: u64) {
    metrics::gauge!("backfill_failed_last_run").set(failed_last_run as f64);
    metrics::gauge!("backfill_overdue_windows").set(overdue_windows as f64);
}

/// Counts one run's outcome and logs its summary.
pub fn emit(endpoint: &str, window: &Window, summary: &Summary) {
    let label = endpoint.to_owned();
    metrics::counter!("backfill_recovered", "endpoint" => label.clone()).increment(summary.recovered);
    metrics::counter!("backfill_already_recorded", "endpoint" => label.clone()).increment(summary.already_recorded);
    metrics::counter!("backfill_redeliveries", "endpoint" => label.clone()).increment(summary.redeliveries_requested);
    metrics::counter!("backfill_failed", "endpoint" => label.clone()).increment(summary.failed + summary.parked);
    metrics::counter!("backfill_parked", "endpoint" => label).increment(summary.parked);
    let text = serde_json::to_string(summary).unwrap_or_default();
    tracing::info!(endpoint, since = window.since_s, until = window.until_s, summary = %text, "backfill run");
}

fn stop(mut summary: Summary, why: String) -> Summary {
    tracing::warn!(reason = %why, "backfill stopped before the end of its window");
    summary.stopped = Some(why);
    summary
}

fn in_window(ev: &SourceEvent, window: &Window) -> bool {
    (window.since_s..window.until_s).contains(&ev.created_s)
        && (window.types.is_empty() || ev.event_type.as_ref().is_some_and(|t| window.types.contains(t)))
}

/// The record a fetched event claims: the webhook's identity, `via = backfill`.
pub fn new_event(target: &Target, ev: &SourceEvent, body: &[u8], now_ms: i64, send_token: String) -> NewEvent {
    let key = EventKey::new(&target.provider, &target.endpoint, &ev.event_id);
    NewEvent {
        shard: key.shard(target.index_shards),
        key,
        provider: target.provider.clone(),
        endpoint: target.endpoint.clone(),
        tenant: target.tenant.clone(),
        event_id: ev.event_id.clone(),
        event_type: ev.event_type.clone(),
        payload_hash: payload_hash(body),
        content_hash: crate::verify::hashes::content_hash(&target.provider, body),
        received_at_ms: now_ms,
        expires_at: crate::policy::expires_at(now_ms, target.retention_days),
        send: SendLease { token: send_token, until_ms: now_ms + SEND_LEASE_MS },
        via: Via::Backfill,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap, HashSet};
    use std::sync::Mutex;

    use super::*;
    use crate::ledger::{ExistingRecord, PortError, Status};
    use crate::ports::{SourcePage, Unfetchable, UnfetchedEvent};

    /// The provider's list: events newest first, pages of `per_page`, a
    /// cursor that is the last id of the page; scripted failures per call.
    struct List {
        events: Vec<SourceEvent>,
        per_page: usize,
        script: Mutex<Vec<Option<SourceError>>>,
        calls: Mutex<u32>,
        fetched: Mutex<Vec<String>>,
        redelivered: Mutex<Vec<String>>,
        /// What fetching an event's body answers, by event id (until removed).
        refusals: Mutex<HashMap<String, SourceError>>,
    }

    impl List {
        fn new(n: usize, per_page: usize) -> Self {
            let events = (0..n)
                .rev()
                .map(|i| SourceEvent {
                    event_id: format!("evt_{i:03}"),
                    event_type: Some(if i % 3 == 0 { "charge.refunded" } else { "invoice.paid" }.into()),
                    created_s: 1_000 + i as i64,
                    body: Some(format!(r#"{{"id":"evt_{i:03}","object":"event"}}"#).into_bytes()),
                    handle: Some(format!("d{i}")),
                })
                .collect();
            Self {
                events,
                per_page,
                script: Mutex::new(Vec::new()),
                calls: Mutex::new(0),
                fetched: Mutex::new(Vec::new()),
                redelivered: Mutex::new(Vec::new()),
                refusals: Mutex::new(HashMap::new()),
            }
        }

        /// Fetching `id`'s body answers `e` (and the list carries no body for it).
        fn refuse(&mut self, id: &str, e: SourceError) {
            self.without_body(id);
            self.refusals.lock().unwrap().insert(id.to_owned(), e);
        }

        fn without_body(&mut self, id: &str) {
            self.events.iter_mut().find(|e| e.event_id == id).unwrap().body = None;
        }

        fn listed_body(&mut self, id: &str, body: &[u8]) {
            self.events.iter_mut().find(|e| e.event_id == id).unwrap().body = Some(body.to_vec());
        }

        fn fail_next(&self, errors: Vec<Option<SourceError>>) {
            *self.script.lock().unwrap() = errors;
        }
    }

    impl BackfillSource for List {
        async fn page(&self, window: &Window, cursor: Option<&str>) -> Result<SourcePage, SourceError> {
            *self.calls.lock().unwrap() += 1;
            let scripted = {
                let mut s = self.script.lock().unwrap();
                if s.is_empty() { None } else { s.remove(0) }
            };
            if let Some(e) = scripted {
                return Err(e);
            }
            let matching: Vec<&SourceEvent> =
                self.events.iter().filter(|e| (window.since_s..window.until_s).contains(&e.created_s)).collect();
            let start = cursor.map_or(0, |c| matching.iter().position(|e| e.event_id == c).map_or(0, |i| i + 1));
            let page: Vec<SourceEvent> =
                matching.iter().skip(start).take(self.per_page).map(|e| (*e).clone()).collect();
            let next = (start + page.len() < matching.len()).then(|| page.last().unwrap().event_id.clone());
            Ok(SourcePage { events: page, next })
        }

        async fn body(&self, event: &SourceEvent) -> Result<Vec<u8>, SourceError> {
            self.fetched.lock().unwrap().push(event.event_id.clone());
            if let Some(e) = self.refusals.lock().unwrap().get(&event.event_id) {
                return Err(e.clone());
            }
            Ok(format!(r#"{{"fetched":"{}"}}"#, event.event_id).into_bytes())
        }

        fn origin(&self) -> Option<String> {
            Some("repos/o/r/hooks/1".into())
        }

        async fn redeliver(&self, event: &SourceEvent) -> Result<(), SourceError> {
            self.redelivered.lock().unwrap().push(event.handle.clone().unwrap());
            Ok(())
        }
    }

    /// A parked record: (reason, handle, origin).
    type Parked = (String, Option<String>, Option<String>);

    #[derive(Default)]
    struct Ledger {
        records: Mutex<BTreeMap<String, Via>>,
        claims: Mutex<HashMap<String, u32>>,
        progress: Mutex<HashMap<String, BackfillProgress>>,
        fail_claim: Mutex<HashSet<String>>,
        writes: Mutex<u32>,
        redeliveries: Mutex<Vec<(String, String)>>,
        schedules: Mutex<HashMap<String, ScheduleState>>,
        parked: Mutex<BTreeMap<String, Parked>>,
        /// Claims refused as too large for the ledger (no payload bucket).
        too_large: Mutex<HashSet<String>>,
        /// Parks that fail (the ledger unavailable), once each.
        fail_park: Mutex<HashSet<String>>,
        /// Released records: key → (payload, by).
        released: Mutex<BTreeMap<String, (Vec<u8>, String)>>,
        notes: Mutex<Vec<(String, String, String)>>,
    }

    impl BackfillLedger for Ledger {
        async fn claim(&self, event: &NewEvent, body: &[u8]) -> Result<Claim, PortError> {
            if self.fail_claim.lock().unwrap().remove(event.key.as_str()) {
                return Err(PortError::Unavailable { service: "dynamodb", message: "throttled".into() });
            }
            if self.too_large.lock().unwrap().contains(event.key.as_str()) {
                return Err(PortError::TooLarge { size: body.len(), limit: 10 });
            }
            *self.claims.lock().unwrap().entry(event.key.as_str().to_owned()).or_default() += 1;
            let mut r = self.records.lock().unwrap();
            if r.contains_key(event.key.as_str()) {
                return Ok(Claim::Existing(ExistingRecord {
                    status: Status::Processed,
                    payload_hash: String::new(),
                    content_hash: None,
                    enqueued_at_ms: None,
                    received_at_ms: 0,
                    send_lease_until_ms: None,
                    payload_stored: true,
                    via: Via::Webhook,
                }));
            }
            *self.writes.lock().unwrap() += 1;
            r.insert(event.key.as_str().to_owned(), event.via);
            Ok(Claim::New)
        }
        async fn release_send_lease(&self, _: &EventKey, _: &SendLease) -> Result<(), PortError> {
            Ok(())
        }
        async fn recorded(&self, key: &EventKey) -> Result<bool, PortError> {
            Ok(self.records.lock().unwrap().contains_key(key.as_str()))
        }
        async fn note_redelivery(&self, key: &EventKey, handle: &str, _: i64) -> Result<(), PortError> {
            self.redeliveries.lock().unwrap().push((key.as_str().to_owned(), handle.to_owned()));
            Ok(())
        }
        async fn progress(&self, run: &str) -> Result<Option<BackfillProgress>, PortError> {
            Ok(self.progress.lock().unwrap().get(run).cloned())
        }
        async fn save_progress(&self, run: &str, p: &BackfillProgress, _: i64) -> Result<(), PortError> {
            *self.writes.lock().unwrap() += 1;
            self.progress.lock().unwrap().insert(run.to_owned(), p.clone());
            Ok(())
        }
        async fn schedule_state(&self, endpoint: &str) -> Result<Option<ScheduleState>, PortError> {
            Ok(self.schedules.lock().unwrap().get(endpoint).cloned())
        }
        async fn save_schedule_state(&self, endpoint: &str, st: &ScheduleState, _: i64) -> Result<(), PortError> {
            self.schedules.lock().unwrap().insert(endpoint.to_owned(), st.clone());
            Ok(())
        }
        async fn park(&self, event: &NewEvent, u: &UnfetchedEvent<'_>) -> Result<Claim, PortError> {
            if self.fail_park.lock().unwrap().remove(event.key.as_str()) {
                return Err(PortError::Unavailable { service: "dynamodb", message: "throttled".into() });
            }
            assert_eq!((event.via, event.payload_hash.as_str()), (Via::Backfill, crate::ledger::NO_PAYLOAD_HASH));
            let mut r = self.records.lock().unwrap();
            if r.contains_key(event.key.as_str()) {
                return Ok(Claim::Existing(ExistingRecord {
                    status: Status::Parked,
                    payload_hash: String::new(),
                    content_hash: None,
                    enqueued_at_ms: None,
                    received_at_ms: 0,
                    send_lease_until_ms: None,
                    payload_stored: false,
                    via: Via::Backfill,
                }));
            }
            *self.writes.lock().unwrap() += 1;
            r.insert(event.key.as_str().to_owned(), Via::Backfill);
            let entry = (u.reason.to_owned(), u.handle.map(str::to_owned), u.origin.map(str::to_owned));
            self.parked.lock().unwrap().insert(event.key.as_str().to_owned(), entry);
            Ok(Claim::New)
        }
        async fn release(&self, event: &NewEvent, body: &[u8], by: &str) -> Result<crate::ledger::Release, PortError> {
            if self.parked.lock().unwrap().remove(event.key.as_str()).is_none() {
                return Ok(crate::ledger::Release::NotAwaiting);
            }
            self.records.lock().unwrap().insert(event.key.as_str().to_owned(), event.via);
            self.released.lock().unwrap().insert(event.key.as_str().to_owned(), (body.to_vec(), by.to_owned()));
            Ok(crate::ledger::Release::Released)
        }
        async fn note(&self, key: &EventKey, kind: &str, detail: &str, _: i64) -> Result<(), PortError> {
            self.notes.lock().unwrap().push((key.as_str().to_owned(), kind.to_owned(), detail.to_owned()));
            Ok(())
        }
    }

    #[derive(Default)]
    struct Queue(Mutex<Vec<String>>);

    impl WorkQueue for Queue {
        async fn send(&self, key: &EventKey) -> Result<(), PortError> {
            self.0.lock().unwrap().push(key.as_str().to_owned());
            Ok(())
        }
    }

    fn target() -> Target {
        Target {
            provider: "stripe".into(),
            endpoint: "stripe-a".into(),
            tenant: "t".into(),
            retention_days: 30,
            index_shards: 16,
            mode: Mode::Import,
        }
    }

    fn window() -> Window {
        Window { since_s: 1_000, until_s: 2_000, types: vec![] }
    }

    fn settings() -> BackfillSettings {
        BackfillSettings {
            max_pages: 50,
            max_waits: 3,
            backoff: Backoff { base_ms: 1, max_ms: 4 },
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    fn backfill(n: usize, per_page: usize, s: BackfillSettings) -> Backfill<Ledger, Queue, List> {
        Backfill::new(Ledger::default(), Queue::default(), List::new(n, per_page), s)
    }

    fn webhook(b: &Backfill<Ledger, Queue, List>, ids: &[&str]) {
        for id in ids {
            b.ledger.records.lock().unwrap().insert(format!("evt#stripe#stripe-a#{id}"), Via::Webhook);
        }
    }

    #[tokio::test]
    async fn missing_events_are_recovered_once_and_recorded_ones_are_not_touched() {
        let b = backfill(25, 10, settings());
        webhook(&b, &["evt_003", "evt_017", "evt_024"]);
        let mut pages = Vec::new();
        let s = b.run(&target(), &window(), false, 5_000, later(), |s| pages.push(s.seen)).await;
        assert_eq!((s.seen, s.already_recorded, s.recovered, s.failed), (25, 3, 22, 0));
        assert!(s.complete && s.stopped.is_none(), "{s:?}");
        assert_eq!(pages, [10, 20, 25], "progress after each page");
        assert_eq!(b.queue.0.lock().unwrap().len(), 22, "each recovered event queued once");
        let records = b.ledger.records.lock().unwrap().clone();
        assert_eq!(records.values().filter(|v| **v == Via::Backfill).count(), 22);
        assert_eq!(records["evt#stripe#stripe-a#evt_003"], Via::Webhook, "the webhook's record is kept");
        // The window is done: a second run reads nothing.
        let calls = *b.source.calls.lock().unwrap();
        let again = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
        assert!(again.complete && again.seen == 0);
        assert_eq!(*b.source.calls.lock().unwrap(), calls);
        // Another window over the same events: everything already recorded, nothing written.
        let writes = *b.ledger.writes.lock().unwrap();
        let other = Window { since_s: 1_000, until_s: 1_024, types: vec![] };
        let s = b.run(&target(), &other, false, 7_000, later(), |_| {}).await;
        assert_eq!((s.seen, s.already_recorded, s.recovered), (24, 24, 0));
        assert_eq!(*b.ledger.writes.lock().unwrap(), writes + 3, "only the progress of its 3 pages");
    }

    #[tokio::test]
    async fn an_interrupted_run_resumes_from_its_cursor_and_skips_nothing() {
        let b = backfill(25, 10, BackfillSettings { max_pages: 1, ..settings() });
        let first = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((first.recovered, first.complete), (10, false));
        assert!(first.stopped.as_deref().is_some_and(|w| w.contains("page bound")));
        let second = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
        let third = b.run(&target(), &window(), false, 7_000, later(), |_| {}).await;
        assert_eq!((second.recovered, third.recovered, third.complete), (10, 5, true));
        let claims = b.ledger.claims.lock().unwrap().clone();
        assert_eq!(claims.len(), 25);
        assert!(claims.values().all(|n| *n == 1), "no page read twice: {claims:?}");
    }

    #[tokio::test]
    async fn a_failed_claim_leaves_the_page_to_the_next_run() {
        let b = backfill(25, 10, settings());
        b.ledger.fail_claim.lock().unwrap().insert("evt#stripe#stripe-a#evt_012".into());
        let first = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((first.recovered, first.failed, first.complete), (10 + 2, 1, false), "{first:?}");
        let second = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
        assert!(second.complete);
        // The second page was read again: its first two events are already recorded.
        assert_eq!((second.already_recorded, second.recovered), (2, 13));
        assert_eq!(b.ledger.records.lock().unwrap().len(), 25, "nothing skipped");
    }

    #[tokio::test]
    async fn rate_limits_are_waited_out_or_end_the_run_when_the_provider_says_so() {
        let b = backfill(5, 10, settings());
        let limited = |after| Some(SourceError::RateLimited { retry_after_s: after, should_retry: true });
        b.source.fail_next(vec![limited(Some(0)), limited(None), limited(None)]);
        let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((s.rate_limit_waits, s.recovered, s.complete), (3, 5, true), "{s:?}");

        let b = backfill(5, 10, settings());
        b.source.fail_next(vec![Some(SourceError::RateLimited { retry_after_s: None, should_retry: false })]);
        let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((s.rate_limit_waits, s.recovered, s.complete), (0, 0, false));
        assert!(s.stopped.unwrap().contains("not to retry"));

        // More waits than the run allows, or a wait past its deadline: stop, resume later.
        let b = backfill(5, 10, settings());
        b.source.fail_next(vec![limited(None); 4]);
        let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((s.rate_limit_waits, s.complete), (3, false));
        let b = backfill(5, 10, settings());
        b.source.fail_next(vec![limited(Some(3_600))]);
        let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((s.rate_limit_waits, s.complete), (0, false));
        let resumed = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
        assert_eq!((resumed.recovered, resumed.complete), (5, true));
    }

    #[tokio::test]
    async fn a_dry_run_writes_nothing_and_counts_what_the_real_run_recovers() {
        let b = backfill(25, 10, settings());
        webhook(&b, &["evt_001", "evt_010"]);
        let dry = b.run(&target(), &window(), true, 5_000, later(), |_| {}).await;
        assert_eq!(*b.ledger.writes.lock().unwrap(), 0);
        assert!(b.queue.0.lock().unwrap().is_empty());
        let real = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((dry.seen, dry.already_recorded, dry.recovered), (real.seen, real.already_recorded, real.recovered));
        assert_eq!(real.recovered, 23);
    }

    #[tokio::test]
    async fn only_the_window_and_the_asked_types_are_recovered() {
        let b = backfill(25, 10, settings());
        let w = Window { since_s: 1_005, until_s: 1_015, types: vec!["charge.refunded".into()] };
        let s = b.run(&target(), &w, false, 5_000, later(), |_| {}).await;
        // 1005..1015 holds evt_005..evt_014; of those, 006, 009 and 012 are refunds.
        assert_eq!((s.seen, s.recovered), (3, 3));
        assert_eq!(w.run_id("stripe-a"), "stripe-a#1005#1015#charge.refunded");
    }

    /// A list without bodies (GitHub's deliveries): recorded events cost a
    /// read, only the missing ones are fetched; a redelivered identity is met once.
    #[tokio::test]
    async fn bodies_are_fetched_only_for_what_is_missing_and_repeated_identities_count_once() {
        let b = backfill(6, 10, settings());
        let mut events = b.source.events.clone();
        for e in &mut events {
            e.body = None;
        }
        // A redelivery of evt_004 in the list.
        events.insert(1, events[1].clone());
        let b = Backfill::new(Ledger::default(), Queue::default(), List { events, ..List::new(0, 10) }, settings());
        webhook(&b, &["evt_002"]);
        let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((s.seen, s.already_recorded, s.recovered), (6, 1, 5), "{s:?}");
        let mut fetched = b.source.fetched.lock().unwrap().clone();
        fetched.sort();
        assert_eq!(fetched, ["evt_000", "evt_001", "evt_003", "evt_004", "evt_005"]);
    }

    /// Redelivery mode asks the provider again for what is missing, notes
    /// the request under the event's key, and records nothing itself.
    #[tokio::test]
    async fn redelivery_mode_asks_for_the_missing_events_and_notes_it() {
        let b = backfill(4, 10, settings());
        webhook(&b, &["evt_001"]);
        let t = Target { mode: Mode::Redeliver, ..target() };
        let s = b.run(&t, &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((s.seen, s.already_recorded, s.redeliveries_requested, s.recovered), (4, 1, 3, 0));
        assert_eq!(*b.source.redelivered.lock().unwrap(), ["d3", "d2", "d0"]);
        let notes = b.ledger.redeliveries.lock().unwrap().clone();
        assert_eq!(notes[0], ("evt#stripe#stripe-a#evt_003".to_owned(), "d3".to_owned()));
        assert_eq!(b.ledger.records.lock().unwrap().len(), 1, "the redelivery records it, through the intake");
    }

    #[test]
    fn scheduled_windows_follow_the_high_water_mark_with_overlap_lag_and_a_bound() {
        let sc = Schedule {
            lag_secs: 100,
            overlap_secs: 50,
            lookback_secs: 1_000,
            max_window_secs: 400,
            ..Schedule::default()
        };
        let w = |st: &ScheduleState, now| next_window(st, &sc, now).map(|w| (w.since_s, w.until_s));
        let first = ScheduleState::default();
        assert_eq!(w(&first, 10_000), Some((9_000, 9_400)), "from the lookback, bounded");
        let hw = ScheduleState { high_water: Some(9_400), current: None };
        assert_eq!(w(&hw, 10_000), Some((9_350, 9_750)), "after the mark, less the overlap");
        let caught_up = ScheduleState { high_water: Some(9_880), current: None };
        assert_eq!(w(&caught_up, 10_000), Some((9_830, 9_900)), "ends lag before now");
        let done = ScheduleState { high_water: Some(9_900), current: None };
        assert_eq!(w(&done, 10_000), None, "nothing new yet");
        let busy = ScheduleState { high_water: Some(9_400), current: Some((9_350, 9_750)) };
        assert_eq!(w(&busy, 50_000), Some((9_350, 9_750)), "the window in progress is kept");
        let parsed = parse_schedules(r#"{"gh": {"provider": "github", "hook": "repos/o/r/hooks/1", "lag_secs": 60, "mode": "redeliver"}, "stripe-a": {"provider": "stripe"}}"#).unwrap();
        assert_eq!((parsed["gh"].lag_secs, parsed["gh"].overlap_secs, parsed["gh"].mode), (60, 3_600, Mode::Redeliver));
        assert_eq!(parsed["stripe-a"].mode, Mode::Import);
        for (bad, why) in [
            (r#"{"a": {"provider": "stripe", "lagsecs": 60}}"#, "unknown field"),
            (r#"{"a": {"provider": "stripe", "mode": "redeliver"}}"#, "cannot redeliver"),
            (r#"{"a": {"provider": "github"}}"#, "needs \"hook\""),
            (r#"{"a": {"provider": "github", "hook": "repos/x"}}"#, "needs \"hook\""),
            (r#"{"a": {"provider": "sns"}}"#, "keeps no list"),
            (r#"{"a": {"provider": "stripe", "max_window_secs": 0}}"#, "max window"),
        ] {
            let err = parse_schedules(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn scheduled_runs_advance_the_mark_only_when_a_window_is_complete() {
        let b = backfill(25, 10, BackfillSettings { max_pages: 2, ..settings() });
        // Events created 1000..1025; now 1200 s, lag 100, lookback 300: window [900, 1100).
        let sc = Schedule {
            lag_secs: 100,
            overlap_secs: 10,
            lookback_secs: 300,
            max_window_secs: 1_000,
            ..Schedule::default()
        };
        let (w1, s1) = b.scheduled(&target(), &sc, 1_200_000, later()).await.unwrap().unwrap();
        assert_eq!(((w1.since_s, w1.until_s), s1.recovered, s1.complete), ((900, 1_100), 20, false));
        let st = b.ledger.schedules.lock().unwrap()["stripe-a"].clone();
        assert_eq!(st, ScheduleState { high_water: None, current: Some((900, 1_100)) });
        // Later, the same window is resumed, not a new one.
        let (w2, s2) = b.scheduled(&target(), &sc, 1_500_000, later()).await.unwrap().unwrap();
        assert_eq!(((w2.since_s, w2.until_s), s2.recovered, s2.complete), ((900, 1_100), 5, true));
        let st = b.ledger.schedules.lock().unwrap()["stripe-a"].clone();
        assert_eq!(st, ScheduleState { high_water: Some(1_100), current: None });
        // The next window starts at the mark less the overlap.
        let (w3, s3) = b.scheduled(&target(), &sc, 1_500_000, later()).await.unwrap().unwrap();
        assert_eq!(((w3.since_s, w3.until_s), s3.seen), ((1_090, 1_400), 0));
    }

    #[test]
    fn a_backfilled_event_has_the_webhooks_identity_and_its_provenance() {
        let ev = SourceEvent { event_id: "evt_1".into(), event_type: None, created_s: 1, body: None, handle: None };
        let e = new_event(&target(), &ev, b"{}", 1_000, "t".into());
        assert_eq!((e.key.as_str(), e.via), ("evt#stripe#stripe-a#evt_1", Via::Backfill));
        assert!(!Via::Backfill.compares_bytes_with(Via::Webhook));
        assert!(!Via::Webhook.compares_bytes_with(Via::Backfill));
        assert!(Via::Webhook.compares_bytes_with(Via::Redelivery));
    }

    fn refused(cause: Unfetchable) -> SourceError {
        SourceError::Unfetchable { cause, detail: format!("the list's source says {}", cause.cause()) }
    }

    fn key(id: &str) -> String {
        format!("evt#stripe#stripe-a#{id}")
    }

    /// Issue 18.3: an event whose body the source does not serve (and one
    /// not JSON, one answered 404, one over the size bound, one too large for
    /// a ledger without a payload bucket) no longer stops the window: each is
    /// parked under its identity, the others are recovered, the cursor is
    /// saved and the window completes.
    #[tokio::test]
    async fn events_the_source_cannot_serve_are_parked_and_the_window_completes() {
        let mut list = List::new(8, 3);
        list.refuse("evt_006", refused(Unfetchable::NoPayload));
        list.listed_body("evt_005", b"<html>not json</html>");
        list.refuse("evt_004", refused(Unfetchable::Status(404)));
        list.listed_body("evt_003", format!(r#"{{"id":"evt_003","pad":"{}"}}"#, "x".repeat(300)).as_bytes());
        let b = Backfill::new(
            Ledger::default(),
            Queue::default(),
            list,
            BackfillSettings { max_body_bytes: 200, ..settings() },
        );
        b.ledger.too_large.lock().unwrap().insert(key("evt_002"));
        let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert!(s.complete && s.stopped.is_none(), "{s:?}");
        assert_eq!((s.seen, s.recovered, s.parked, s.failed, s.pages), (8, 3, 5, 0, 3), "{s:?}");
        let parked = b.ledger.parked.lock().unwrap().clone();
        let reason = |id: &str| parked.get(&key(id)).map(|p| p.0.as_str());
        assert_eq!(reason("evt_006"), Some("backfill_unrecoverable:no_payload"));
        assert_eq!(reason("evt_005"), Some("backfill_unrecoverable:not_json"));
        assert_eq!(reason("evt_004"), Some("backfill_unrecoverable:http_404"));
        assert_eq!(reason("evt_003"), Some("backfill_unrecoverable:too_large"), "over the backfill's bound");
        assert_eq!(reason("evt_002"), Some("backfill_unrecoverable:too_large"), "too large for the ledger");
        let (_, handle, origin) = &parked[&key("evt_006")];
        assert_eq!(
            (handle.as_deref(), origin.as_deref()),
            (Some("d6"), Some("repos/o/r/hooks/1")),
            "what a replay asks for"
        );
        assert_eq!(b.queue.0.lock().unwrap().len(), 3, "only the recovered events are queued");
        assert!(b.ledger.progress.lock().unwrap()[&window().run_id("stripe-a")].done, "the cursor moved on to the end");
        // A wider window reads them again: recorded (parked), nothing parked twice.
        let wider = Window { since_s: 999, ..window() };
        let again = b.run(&target(), &wider, false, 6_000, later(), |_| {}).await;
        assert_eq!((again.seen, again.already_recorded, again.parked, again.recovered), (8, 8, 0, 0), "{again:?}");
    }

    /// Issue 18.3: on a schedule, the window holding an unfetchable event
    /// completes, the high-water mark moves to its end, and the next run
    /// reads the next window (today the window in progress was kept forever).
    #[tokio::test]
    async fn a_scheduled_window_holding_an_unfetchable_event_completes_and_moves_the_mark() {
        let mut list = List::new(25, 10);
        list.refuse("evt_012", refused(Unfetchable::NoPayload));
        let b =
            Backfill::new(Ledger::default(), Queue::default(), list, BackfillSettings { max_pages: 5, ..settings() });
        let sc = Schedule {
            lag_secs: 100,
            overlap_secs: 10,
            lookback_secs: 300,
            max_window_secs: 1_000,
            ..Schedule::default()
        };
        let (w, s) = b.scheduled(&target(), &sc, 1_200_000, later()).await.unwrap().unwrap();
        assert_eq!(((w.since_s, w.until_s), s.complete, s.parked, s.recovered), ((900, 1_100), true, 1, 24), "{s:?}");
        let st = b.ledger.schedules.lock().unwrap()["stripe-a"].clone();
        assert_eq!(st, ScheduleState { high_water: Some(1_100), current: None });
        let (next, _) = b.scheduled(&target(), &sc, 1_500_000, later()).await.unwrap().unwrap();
        assert_eq!((next.since_s, next.until_s), (1_090, 1_400), "the next window, not the same one again");
    }

    /// Only what retrying can cure stops a page: a 5xx or a rate limit on the
    /// body, the ledger unavailable for the claim or the park. The page's
    /// cursor is not saved; the next run reads it again and skips nothing.
    #[tokio::test]
    async fn transient_failures_still_stop_the_page_without_saving_its_cursor() {
        let unavailable = SourceError::Unavailable("HTTP 502".into());
        let limited = SourceError::RateLimited { retry_after_s: None, should_retry: false };
        for case in ["5xx", "throttle", "claim", "park"] {
            let mut list = List::new(25, 10);
            match case {
                "5xx" => list.refuse("evt_012", unavailable.clone()),
                "throttle" => list.refuse("evt_012", limited.clone()),
                "park" => list.refuse("evt_012", refused(Unfetchable::NoPayload)),
                _ => {}
            }
            let b = Backfill::new(Ledger::default(), Queue::default(), list, settings());
            match case {
                "claim" => b.ledger.fail_claim.lock().unwrap().insert(key("evt_012")),
                "park" => b.ledger.fail_park.lock().unwrap().insert(key("evt_012")),
                _ => false,
            };
            let first = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
            assert_eq!((first.complete, first.failed, first.parked), (false, 1, 0), "{case}: {first:?}");
            assert!(first.stopped.is_some(), "{case}");
            let progress = b.ledger.progress.lock().unwrap()[&window().run_id("stripe-a")].clone();
            assert_eq!(progress.cursor.as_deref(), Some("evt_015"), "{case}: only the first page is saved");
            if case != "park" {
                b.source.refusals.lock().unwrap().clear();
            }
            let second = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
            assert!(second.complete, "{case}: {second:?}");
            assert_eq!(b.ledger.records.lock().unwrap().len(), 25, "{case}: nothing skipped");
            assert_eq!(b.ledger.parked.lock().unwrap().len(), usize::from(case == "park"), "{case}");
        }
    }

    fn parked_evt_001() -> ParkedBackfill {
        ParkedBackfill {
            key: EventKey::new("stripe", "stripe-a", "evt_001"),
            provider: "stripe".into(),
            endpoint: "stripe-a".into(),
            tenant: "t".into(),
            reason: "backfill_unrecoverable:no_payload".into(),
            origin: Some("repos/o/r/hooks/1".into()),
            event: SourceEvent {
                event_id: "evt_001".into(),
                event_type: Some("invoice.paid".into()),
                created_s: 1_001,
                body: None,
                handle: Some("d1".into()),
            },
        }
    }

    /// Issue 18.3: a replay asks the source for that one event again (same
    /// identity, `via = backfill`); while it still cannot serve it the record
    /// stays parked; once it can, the payload is stored, the record released
    /// and queued, the replay audited; a second replay finds nothing to do.
    #[tokio::test]
    async fn a_replay_fetches_a_parked_event_again_and_releases_it_once() {
        let mut list = List::new(3, 10);
        list.refuse("evt_001", refused(Unfetchable::NoPayload));
        let b = Backfill::new(Ledger::default(), Queue::default(), list, settings());
        assert_eq!(b.run(&target(), &window(), false, 5_000, later(), |_| {}).await.parked, 1);
        let parked = parked_evt_001();
        let still = b.release(&target(), &parked, "alice", "GitHub serves it now", 6_000, later()).await.unwrap();
        assert!(matches!(&still, Released::StillUnfetchable { cause, .. } if cause == "no_payload"), "{still:?}");
        assert_eq!(b.ledger.parked.lock().unwrap().len(), 1, "still parked");
        b.source.refusals.lock().unwrap().clear();
        let done = b.release(&target(), &parked, "alice", "GitHub serves it now", 7_000, later()).await.unwrap();
        assert_eq!(done, Released::Released { queued: true });
        let released = b.ledger.released.lock().unwrap().clone();
        assert_eq!(released[&key("evt_001")], (br#"{"fetched":"evt_001"}"#.to_vec(), "operator alice".to_owned()));
        assert_eq!(b.ledger.records.lock().unwrap()[&key("evt_001")], Via::Backfill);
        assert_eq!(b.queue.0.lock().unwrap().last().map(String::as_str), Some(key("evt_001").as_str()));
        let notes = b.ledger.notes.lock().unwrap().clone();
        assert!(
            notes.iter().any(|(k, kind, d)| *k == key("evt_001") && kind == "replay" && d.contains("alice")),
            "{notes:?}"
        );
        let again = b.release(&target(), &parked, "alice", "again", 8_000, later()).await.unwrap();
        assert_eq!(again, Released::NotAwaiting);
        assert_eq!(b.queue.0.lock().unwrap().len(), 3, "queued once");
    }

    #[test]
    fn a_parked_record_row_names_what_a_replay_asks_for() {
        let row = |extra: serde_json::Value| -> crate::ledger::Row {
            let mut r = serde_json::json!({
                "pk": "evt#stripe#stripe-a#evt_001", "provider": "stripe", "endpoint": "stripe-a", "tenant": "t",
                "event_id": "evt_001", "event_type": "invoice.paid", "status": "PARKED", "payload_stored": false,
                "via": "backfill", "park_reason": "backfill_unrecoverable:no_payload", "backfill_created": 1_001,
                "backfill_handle": "d1", "backfill_origin": "repos/o/r/hooks/1",
            });
            for (k, v) in extra.as_object().unwrap() {
                r[k] = v.clone();
            }
            r.as_object().unwrap().clone()
        };
        assert_eq!(ParkedBackfill::from_row(&row(serde_json::json!({}))), Some(parked_evt_001()));
        for other in [
            serde_json::json!({"park_reason": "gap"}),
            serde_json::json!({"status": "DEAD"}),
            serde_json::json!({"payload_stored": true}),
        ] {
            assert_eq!(ParkedBackfill::from_row(&row(other.clone())), None, "{other}");
        }
    }

    /// `backfill_overdue_windows`: the end of the window in progress, or with
    /// none the high-water mark, more than 2 × max window + 1 h behind
    /// now − lag; an endpoint that completed a window in this invocation is
    /// catching up, one that never ran has nothing to be behind.
    #[test]
    fn an_endpoint_is_overdue_when_its_window_or_mark_falls_behind_its_bound() {
        let sc = Schedule { lag_secs: 600, max_window_secs: 21_600, ..Schedule::default() };
        let now = 1_000_000;
        let edge = now - 600 - (2 * 21_600 + 3_600);
        let mark = |hw| ScheduleState { high_water: Some(hw), current: None };
        assert!(!overdue(&mark(edge), &sc, now, false), "at the bound");
        assert!(overdue(&mark(edge - 1), &sc, now, false), "past it");
        let stuck = ScheduleState { high_water: Some(now), current: Some((edge - 100, edge - 1)) };
        assert!(overdue(&stuck, &sc, now, false), "a window in progress counts by its end");
        let fresh = ScheduleState { high_water: Some(0), current: Some((edge - 100, edge)) };
        assert!(!overdue(&fresh, &sc, now, false));
        assert!(!overdue(&mark(edge - 1), &sc, now, true), "catching up: a window completed in this run");
        assert!(!overdue(&ScheduleState::default(), &sc, now, false), "never ran");
    }
}
