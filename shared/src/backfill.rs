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

use crate::admission::{Admission, Admitted, Arrival, Step, kept};
use crate::backoff::Backoff;
use crate::clock::Ambient;
use crate::config::ProviderKind;
use crate::identity::EventKey;
use crate::ledger::{Claim, NewEvent, PortError, Release, Status, Via};
use crate::ports::{
    BackfillLedger, BackfillProgress, BackfillSource, Ledger, SEND_BATCH_MAX, ScheduleState, SourceError, SourceEvent,
    Unfetchable, UnfetchedEvent, Window, WorkQueue,
};
use crate::verify::provider::BackfillList;
use crate::verify::registry::providers;

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
    /// The endpoint's payload policy: a fetched body is kept as a delivered one would be.
    pub payload: crate::redaction::PayloadPolicy,
    /// The endpoint's payloads are sealed ([`crate::sealing`]): so is a fetched one.
    pub erasable: bool,
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
    /// A provider that keeps a list to backfill from: `stripe` (the events
    /// list) or `github` (the hook's deliveries).
    pub provider: ProviderKind,
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
    /// Audit a window of this length behind the lag after each run
    /// ([`crate::completeness`]): the provider's list against the ledger and
    /// the routes, as `audit_missing` and `audit_doubled`, its summary kept
    /// for the console. Off when absent.
    #[serde(default)]
    pub audit_window_secs: Option<i64>,
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

/// How long before the identity retention ends a window must start: a
/// window may take several runs to read (each resumes it), and it must be
/// read while the identities of its oldest events are still kept.
pub const RETENTION_MARGIN_SECS: i64 = 86_400;

/// The furthest back a window may start: the identity retention less
/// [`RETENTION_MARGIN_SECS`]. An event older than the retention may have
/// had its identity deleted by its TTL: read again from the provider's list,
/// it would be recorded as new and applied again.
pub fn max_lookback_secs(retention_days: u32) -> i64 {
    i64::from(retention_days) * 86_400 - RETENTION_MARGIN_SECS
}

/// A window starting at `since_s` is refused at `now_s` when it reaches
/// further back than [`max_lookback_secs`]; the message names the retention.
pub fn check_within_retention(since_s: i64, now_s: i64, retention_days: u32) -> Result<(), String> {
    let most = max_lookback_secs(retention_days);
    if now_s - since_s <= most {
        return Ok(());
    }
    Err(format!(
        "the window starts {} before now, beyond the identity retention (HOOKLEDGER_RETENTION_DAYS = {retention_days} days, \
         less a day's margin: at most {most} s, since {}): events older than that may have had their identities \
         deleted by the TTL, and would be imported and applied again",
        age(now_s - since_s),
        now_s - most
    ))
}

/// `secs` as days and seconds, for a message.
fn age(secs: i64) -> String {
    format!("{secs} s ({:.1} days)", secs as f64 / 86_400.0)
}

/// Parses `HOOKLEDGER_BACKFILL`: endpoint name → [`Schedule`]; each
/// schedule's `lookback_secs` within the identity retention
/// ([`max_lookback_secs`] of `retention_days`).
pub fn parse_schedules(
    json: &str,
    retention_days: u32,
) -> Result<std::collections::BTreeMap<String, Schedule>, String> {
    let schedules: std::collections::BTreeMap<String, Schedule> =
        serde_json::from_str(json).map_err(|e| format!("HOOKLEDGER_BACKFILL: {e}"))?;
    for (endpoint, s) in &schedules {
        let bad = |why: &str| Err(format!("HOOKLEDGER_BACKFILL: {endpoint}: {why}"));
        match (s.provider.backfill(), &s.hook) {
            (Some(BackfillList::StripeEvents), None) if s.mode == Mode::Redeliver => {
                return bad("Stripe cannot redeliver");
            }
            (Some(BackfillList::StripeEvents), None) => {}
            (Some(BackfillList::StripeEvents), Some(_)) => return bad("\"hook\" is for GitHub"),
            (Some(BackfillList::GithubDeliveries), Some(hook)) if crate::ports::valid_github_hook(hook) => {}
            (Some(BackfillList::GithubDeliveries), _) => {
                return bad("GitHub needs \"hook\": repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app/hook");
            }
            (None, _) => {
                let listed: Vec<&str> = providers().filter(|p| p.backfill().is_some()).map(|p| p.name()).collect();
                return bad(&format!(
                    "provider {:?} keeps no list to backfill from ({})",
                    s.provider.as_str(),
                    listed.join(", ")
                ));
            }
        }
        if s.audit_window_secs.is_some_and(|w| !(60..=86_400).contains(&w)) {
            return bad("audit_window_secs must be within 60..=86400");
        }
        let positive = s.lag_secs >= 0 && s.overlap_secs >= 0 && s.lookback_secs > 0 && s.max_window_secs > 0;
        if !positive {
            return bad("lag and overlap must be ≥ 0, lookback and max window > 0");
        }
        let most = max_lookback_secs(retention_days);
        if s.lookback_secs > most {
            return bad(&format!(
                "lookback_secs {} reaches beyond the identity retention (HOOKLEDGER_RETENTION_DAYS = {retention_days} \
                 days, less a day's margin: at most {most}): events older than that may have had their identities \
                 deleted by the TTL, and would be imported and applied again",
                age(s.lookback_secs)
            ));
        }
    }
    Ok(schedules)
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            provider: ProviderKind::STRIPE,
            tenant: None,
            hook: None,
            account: None,
            lag_secs: default_lag(),
            overlap_secs: default_overlap(),
            lookback_secs: default_lookback(),
            max_window_secs: default_max_window(),
            types: Vec::new(),
            mode: Mode::Import,
            audit_window_secs: None,
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
    /// The data keys of erasable endpoints' payloads.
    keys: Option<std::sync::Arc<dyn crate::ports::PayloadKeys>>,
}

impl<L: BackfillLedger + Ledger, Q: WorkQueue, S: BackfillSource> Backfill<L, Q, S> {
    pub fn new(ledger: L, queue: Q, source: S, settings: BackfillSettings) -> Self {
        Self { ledger, queue, source, settings, ambient: Ambient::system(), keys: None }
    }

    /// Seals erasable endpoints' payloads under data keys kept in `keys`.
    pub fn with_keys(mut self, keys: std::sync::Arc<dyn crate::ports::PayloadKeys>) -> Self {
        self.keys = Some(keys);
        self
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
            let mut sends = Vec::new();
            for ev in &page.events {
                if !in_window(ev, window) || !seen.insert(ev.event_id.clone()) {
                    continue;
                }
                summary.seen += 1;
                let recovered = self.recover(target, ev, dry_run, now_ms, deadline, &mut waits, &mut summary).await;
                match recovered {
                    Ok(Some(send)) => sends.push(send),
                    Ok(None) => {}
                    Err(why) => {
                        // Transient: the page's cursor is not saved, the next run reads it again.
                        self.send_recovered(std::mem::take(&mut sends), &mut summary).await;
                        summary.failed += 1;
                        return stop(summary, why);
                    }
                }
                if sends.len() >= SEND_BATCH_MAX {
                    self.send_recovered(std::mem::take(&mut sends), &mut summary).await;
                }
            }
            self.send_recovered(sends, &mut summary).await;
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

/// An event a backfill read, to be admitted with its page's others.
struct Recovered {
    event: NewEvent,
    body: Vec<u8>,
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

impl<L: BackfillLedger + Ledger, Q: WorkQueue, S: BackfillSource> Backfill<L, Q, S> {
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

    /// The admission path, sealing for an erasable endpoint (`target`).
    fn admission(&self, target: Option<&Target>) -> Admission<'_, L, Q> {
        let keys = if target.is_some_and(|t| t.erasable) { self.keys.as_deref() } else { None };
        Admission { ledger: &self.ledger, queue: &self.queue, by: "backfill", keys }
    }

    /// Sends the events a page recorded, together (`SendMessageBatch`), each
    /// in its tenant's group. One not sent is durable: its send lease is
    /// given back and the reconciler sends it after the grace period.
    async fn send_recovered(&self, sends: Vec<Recovered>, summary: &mut Summary) {
        let events: Vec<(NewEvent, &[u8])> = sends.iter().map(|r| (r.event.clone(), r.body.as_slice())).collect();
        for (r, sent) in sends.iter().zip(self.admission(None).send(&events).await) {
            if let Admitted::Failed { error, .. } = sent {
                summary.send_deferred += 1;
                tracing::warn!(key = %r.event.key, error = %error, "backfilled event not queued; the reconciler sends it");
            }
        }
    }

    /// One listed event: already recorded, or recorded now (imported, and
    /// returned to be sent with the page's others), or asked for again
    /// (redelivered), or parked (its source cannot serve it). `Err`: a
    /// transient failure; stop the run here.
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
    ) -> Result<Option<Recovered>, String> {
        let key = EventKey::new(&target.provider, &target.endpoint, &ev.event_id);
        // Without the body at hand (or to ask for a redelivery), look first:
        // a recorded event costs one read, not a fetch.
        let look_first = dry_run || ev.body.is_none() || target.mode == Mode::Redeliver;
        if look_first {
            let recorded = self.ledger.recorded(&key).await.map_err(|e| format!("ledger unavailable: {e}"))?;
            if recorded {
                summary.already_recorded += 1;
                return Ok(None);
            }
            if dry_run {
                summary.recovered += 1;
                return Ok(None);
            }
        }
        if target.mode == Mode::Redeliver {
            let handle = ev.handle.clone().unwrap_or_else(|| ev.event_id.clone());
            match self.limited(deadline, waits, summary, || self.source.redeliver(ev)).await {
                Ok(()) => {}
                Err(Failure::Unfetchable(cause, detail)) => {
                    return self.park(target, ev, cause, &detail, now_ms, summary).await.map(|()| None);
                }
                Err(failure) => return Err(failure.why()),
            }
            self.ledger
                .note_redelivery(&key, &handle, now_ms)
                .await
                .map_err(|e| format!("redelivery asked for, not noted: {e}"))?;
            summary.redeliveries_requested += 1;
            return Ok(None);
        }
        let body = match self.body(ev, deadline, waits, summary).await {
            Ok(body) => body,
            Err(Failure::Unfetchable(cause, detail)) => {
                return self.park(target, ev, cause, &detail, now_ms, summary).await.map(|()| None);
            }
            Err(failure) => return Err(failure.why()),
        };
        let event = new_event(target, ev, &body, now_ms, self.ambient.token());
        let Ok((event, body)) = kept(&target.payload, event, &body).map(|(e, b)| (e, b.into_owned())) else {
            let detail = "the body is not JSON and the endpoint's policy redacts it";
            return self.park(target, ev, Unfetchable::NotJson, detail, now_ms, summary).await.map(|()| None);
        };
        // The one admission path's first step; the page sends the new ones together.
        let admission = self.admission(Some(target));
        // Sealed first for an erasable endpoint; an erased event is a duplicate.
        let (step, body) = match admission.sealed(&event, &body).await {
            Ok(sealed) => {
                let sealed = sealed.into_owned();
                (admission.claim(&event, &sealed).await, sealed)
            }
            Err(done) => (Step::Done(done), body),
        };
        match step {
            Step::Send(event) => {
                summary.recovered += 1;
                Ok(Some(Recovered { event: *event, body }))
            }
            Step::Done(Admitted::New | Admitted::Released { .. }) => {
                summary.recovered += 1;
                Ok(None)
            }
            Step::Done(Admitted::Duplicate { .. }) => {
                summary.already_recorded += 1;
                Ok(None)
            }
            // Larger, stored, than the ledger takes: no payload bucket here.
            Step::Done(Admitted::TooLarge { size, limit }) => {
                let detail = format!(
                    "{size} bytes stored exceed the {limit} a ledger item takes, and no payload bucket \
                     (HOOKLEDGER_PAYLOAD_BUCKET) is configured"
                );
                self.park(target, ev, Unfetchable::TooLarge, &detail, now_ms, summary).await.map(|()| None)
            }
            Step::Done(Admitted::Failed { error, .. }) => Err(format!("ledger unavailable: {error}")),
        }
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
        // Its endpoint's policy, named on the record: its release keeps the body the same way.
        if target.payload != crate::redaction::PayloadPolicy::Keep {
            event.kept = Some(crate::ledger::Kept { policy: target.payload.label(), verified_hash: None });
        }
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

impl<L: BackfillLedger + Ledger, Q: WorkQueue, S: BackfillSource> Backfill<L, Q, S> {
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
        let Ok((event, body)) = kept(&target.payload, event, &body) else {
            return still(Unfetchable::NotJson, "the body is not JSON and the endpoint's policy redacts it".into());
        };
        self.ledger.note_activity(now_ms).await;
        let tenant = match self.ledger.release(&event, &body, &format!("operator {operator}")).await {
            Ok(Release::Released { tenant }) => tenant,
            Ok(Release::NotAwaiting) => return Ok(Released::NotAwaiting),
            Err(PortError::TooLarge { size, limit }) => {
                let detail = format!(
                    "{size} bytes stored exceed the {limit} a ledger item takes, and no payload bucket \
                     (HOOKLEDGER_PAYLOAD_BUCKET) is configured"
                );
                return still(Unfetchable::TooLarge, detail);
            }
            Err(e) => return Err(format!("ledger unavailable: {e}")),
        };
        let detail = format!("by {operator}: {reason} (fetched again from the provider; was {})", parked.reason);
        let noted = self.ledger.note(&event.key, "replay", &detail, now_ms).await;
        let queued = match self.queue.send_with_payload(&event.key, &tenant, &body).await {
            Ok(()) => true,
            Err(e) => {
                // Durable and RECEIVED: the reconciler sends it after the grace period.
                tracing::warn!(key = %event.key, error = %e, "released event not queued; the reconciler sends it");
                if let Err(e) = BackfillLedger::release_send_lease(&self.ledger, &event.key, &event.send).await {
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

/// The scheduled audit's alarmed gauges (all audited endpoints): events
/// the provider listed and the ledger never recorded, and facts held twice.
pub const AUDIT_METRICS: &[&str] = &["audit_missing", "audit_doubled"];

/// Sets [`AUDIT_METRICS`].
pub fn emit_audit_gauges(missing: u64, doubled: u64) {
    metrics::gauge!("audit_missing").set(missing as f64);
    metrics::gauge!("audit_doubled").set(doubled as f64);
}

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
    let arrival = Arrival {
        provider: &target.provider,
        endpoint: &target.endpoint,
        tenant: &target.tenant,
        event_id: &ev.event_id,
        event_type: ev.event_type.as_deref(),
        body,
        hashes: None,
        via: Via::Backfill,
        batch_hash: None,
        retention_days: target.retention_days,
        index_shards: target.index_shards,
        notification: false,
        kept: None,
    };
    crate::admission::new_event(arrival, now_ms, send_token)
}

#[cfg(test)]
mod tests;
