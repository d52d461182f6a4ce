//! The reconciler: finds what the webhooks alone cannot finish, through the
//! sparse, sharded `due` index (never a scan), and hands it back to the same
//! pipeline. Each phase sweeps its own partition of every shard:
//!
//! 1. records, `due#…`: RECEIVED records never sent or not picked up (due
//!    60 s after receipt), PROCESSING records whose lease expired (due at
//!    expiry), RETRYABLE records whose retry is due → re-driven to SQS. A
//!    completed record's entry stays where it was; each shard is read from
//!    the place the runs before passed to ([`crate::ledger::DueCursors`]:
//!    finished, gone and moved entries due [`CURSOR_SETTLE_MS`] ago or
//!    more), 15 minutes further back once an hour. Its pages reach
//!    [`ReconcilerSettings::lookahead_ms`] past now (at most
//!    [`LOOKAHEAD_PAGES`]), so the oldest open record's age is measured
//!    from the same reads;
//! 2. outbox, `out#…`: outbox items still pending, or claimed by a
//!    dispatcher that died → published (same idempotency key); a failed
//!    publish backs off and, its attempts exhausted, goes DEAD (see
//!    [`crate::outbox`]);
//! 3. re-checks, `chk#…`: projection state whose last provider check is
//!    older than the re-check interval → handed to the re-check plug-in
//!    registered for it ([`crate::projection::recheck`]), which compares it
//!    with the provider; drift is repaired by the plug-in's reconciliation
//!    event (its identity fixed by the drift instance) through the
//!    processor;
//!
//! then the parked gap waiters, `gap#…`, with their own bound
//! ([`waiter_share`], outside the shares below): the pointer of a record
//! parked at the gap bound → its stream read, the record woken and queued
//! once its predecessor committed; looked at less often the longer it waits.
//!
//! Each phase has a guaranteed share of the run's item budget ([`shares`]:
//! 60 / 30 / 10 %); what a phase leaves unused passes on to the phases that
//! ran out of theirs, records first. A phase that stops (throttled,
//! failures in a row) ends only its own sweep, so a re-check backlog or a
//! provider outage never keeps a 2xx'd record from being re-driven.
//!
//! Each item is claimed before it is acted on with a conditional update of
//! its `due_at` (from the value read to the next look) that also writes a
//! claim token, so two runs at once never both act on it, a rerun finds
//! nothing it already did, and a claim whose acknowledgement was lost is
//! recognised by its own SDK retry (the item met carries our token). A claimed
//! item stays in the index, due at its next look: if the run dies or the
//! action fails, a later run acts again. A record re-driven because it was
//! never sent is noted as sent (`enqueued_at`) only after the send.
//!
//! Failures are isolated: an item whose action fails is counted in
//! `Summary::errors` under its phase, logged, and left due; every phase runs
//! (a phase stops early only when throttled, or after
//! [`MAX_CONSECUTIVE_ERRORS`] failures in a row of its own ports: the
//! ledger, the queue); evidence is gathered and the metrics are emitted on
//! every run. A destination that refuses its deliveries is not the outbox
//! phase's failure: its items back off (or wait on its circuit) and the
//! sweep goes on to the other destinations' items. A run stops at its item budget or
//! deadline; what it did not reach stays due, so the next run continues.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::admission::{Admission, Admitted, Arrival};
use crate::clock::Ambient;
use crate::config::ReconcilerSettings;
use crate::identity::EventKey;
use crate::ledger::{
    ACTIVE_FOR_MS, Attention, CURSOR_REWIND_EVERY_MS, CURSOR_REWIND_MS, CURSOR_SETTLE_MS, CheckItem,
    DROP_AFTER_GRACE_MS, DROP_RECHECK_MS, Due, DueCursor, DueCursors, DueItem, DuePage, DuePartition, DueRecord,
    FULL_SWEEP_EVERY_MS, PayloadDrop, PortError, Status, Sweep, WaiterCheck, WaiterItem,
};
use crate::message::Dispatched;
use crate::ports::{Dispatch, DueLedger, Outgoing, SEND_BATCH_MAX, WorkQueue};
use crate::projection::ProjectionError;
use crate::projection::recheck::{Recheck, Rechecks, Verdict};

/// The records phase reads at most this many pages of a shard past now
/// (the look-ahead, for the oldest open record's age) in one walk; a shard
/// with more is a lower bound (`reconciler_incomplete`).
pub const LOOKAHEAD_PAGES: usize = 10;

/// A phase stops after this many item failures in a row (its dependency is
/// down); what it did not reach stays due for the next run.
pub const MAX_CONSECUTIVE_ERRORS: u32 = 5;

/// Metrics the reconciler emits (namespace from `HOOKLEDGER_METRICS_NAMESPACE`,
/// dimension `function = reconciler`); the SAM template's alarms must name
/// only these (checked by `infra/check_template.py` through `hookledger schema`).
pub const METRICS: &[&str] = &[
    "reconciler_runs",
    "reconciler_errors",
    "redriven",
    "outbox_republished",
    "dead_letters",
    "parked",
    "outbox_dead",
    "stuck_leases",
    "drift_found_last_run",
    "oldest_unprocessed_age",
    "reconciler_incomplete",
    "reconcile_duration",
];

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Re-driven records by reason: never_sent, not_picked_up, lease_expired, retry_due.
    pub redriven: BTreeMap<String, u64>,
    pub outbox_republished: u64,
    /// Outbox publishes that failed this run (each retried after a backoff, or dead).
    pub outbox_failed: u64,
    /// Outbox items that went DEAD this run.
    pub outbox_dead_lettered: u64,
    /// Deliveries not sent this run: their destination's circuit is open.
    pub outbox_waiting: u64,
    /// Due outbox items handed to the delivery queue this run.
    pub outbox_handed: u64,
    /// Destinations back whose waiting deliveries this run drains.
    pub outbox_drains: u64,
    /// Destinations whose circuit is open (their deliveries may be waiting).
    pub circuits_open: u64,
    pub drift_checked: u64,
    pub drift_found: u64,
    pub drift_repaired: u64,
    pub dead_letters: u64,
    pub parked: u64,
    /// Outbox items in DEAD (all, not only this run's).
    pub outbox_dead: u64,
    /// Expired leases seen (each also counted in `redriven.lease_expired`).
    pub stuck_leases: u64,
    /// Records parked at the gap bound whose predecessor had committed
    /// without waking them (its processor died in between): woken.
    pub gaps_woken: u64,
    /// Records whose re-drive was refused as invalid (a caller error):
    /// DEAD `caller_error`.
    pub caller_dead: u64,
    /// The oldest open record's age: max(now − open since) over the open
    /// records due up to the look-ahead (open since its receipt, or its
    /// last replay or wake-up from a gap); a lower bound when
    /// `incomplete_shards` > 0.
    pub oldest_unprocessed_age_ms: Option<i64>,
    /// Shards holding more open records in the look-ahead than the run read
    /// (the `reconciler_incomplete` metric).
    pub incomplete_shards: u64,
    /// Failures by phase (redrive, outbox, drift, evidence); each item's is
    /// logged, and the item stays due for a later run.
    pub errors: BTreeMap<String, u64>,
    /// False when the run stopped at its budget or deadline, was throttled,
    /// or a phase stopped after repeated failures.
    pub complete: bool,
    /// False when the evidence queries failed (its counts above are then not
    /// measured, and their metrics are not emitted).
    pub evidence: bool,
    /// Items due that this run reached (acted on or not); finished
    /// records' entries, which the records phase passes, are not counted.
    pub due_seen: u64,
    /// An idle run: nothing noted activity lately and the last full sweep
    /// was quiet, so no shard was read; the evidence is that sweep's.
    pub idle: bool,
    /// Payloads of finished `drop_after` records dropped this run.
    pub payloads_dropped: u64,
    /// Payloads of finished `drop_after` records kept this run because a
    /// delivery of theirs is not SENT yet (pending, or DEAD).
    pub payloads_waiting: u64,
}

impl Summary {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// What a drift check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drift {
    /// Local state and the provider agree.
    None,
    /// Drift whose repair an earlier run already submitted.
    Found,
    /// Drift, and this run submitted its repair.
    Repaired,
}

/// The shares of a run's item budget: records 60 %, outbox items 30 %,
/// re-checks 10 % (each at least one item when the budget allows), in the
/// order of [`DuePartition::ALL`].
pub fn shares(max_items: usize) -> [usize; 3] {
    let checks = if max_items >= 3 { (max_items / 10).max(1) } else { 0 };
    let outbox = if max_items >= 2 { (max_items * 3 / 10).max(1) } else { 0 };
    [max_items - outbox - checks, outbox, checks]
}

/// The longest a parked gap waiter waits between two looks.
pub const WAITER_LOOK_MAX_MS: i64 = 6 * 3_600_000;

/// The parked gap waiters a run looks at, at most: their own bound, 5 % of
/// the run's item budget (at least one), outside the three phases' shares.
pub fn waiter_share(max_items: usize) -> usize {
    (max_items / 20).max(usize::from(max_items > 0))
}

/// How a phase (or its sweep of one shard) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PhaseEnd {
    /// Everything due was reached.
    Done,
    /// Its share ran out with items still due.
    Budget,
    /// Throttled, or too many failures in a row: the next run continues.
    Stopped,
    /// The run's deadline passed.
    OutOfTime,
}

/// What one run keeps across its phases.
struct Run {
    phases: Phases,
    gauge: Gauge,
    /// Records claimed for a re-drive and not yet sent: sent together
    /// (`SendMessageBatch`) across shards, as soon as [`SEND_BATCH_MAX`]
    /// are claimed and at the end of each phase.
    sends: Vec<Redrive>,
    /// Due outbox items to hand to the delivery queue (when there is one),
    /// in tens, as [`Self::sends`].
    handovers: Vec<String>,
    /// Whether this run started the waiting deliveries' drains yet.
    drained: bool,
    /// Parked gap waiters this run may still look at ([`waiter_share`]).
    waiters_left: usize,
    /// The run's time (`now_ms` given to [`Reconciler::run`]) and the
    /// monotonic instant it started at: an item is claimed at the run's
    /// time plus what has elapsed since ([`Run::now`]).
    start_ms: i64,
    started: Instant,
    /// Where the records phase reads each shard from, and to.
    places: Places,
}

/// The records phase's places in one run ([`DueCursors`]): where each
/// shard's walk starts and how far it has passed.
#[derive(Default)]
struct Places {
    /// As read at the run's start (`None`: the read failed: nothing is
    /// written back, and each shard is read from [`CURSOR_REWIND_MS`] ago).
    stored: Option<DueCursors>,
    /// Where each shard's next walk starts: the place passed so far.
    at: BTreeMap<u32, DueCursor>,
    /// This run reads every shard from [`CURSOR_REWIND_MS`] before its
    /// place (the first walk of each shard).
    rewinding: bool,
    /// Shards walked at least once in this run.
    walked: std::collections::HashSet<u32>,
}

impl Places {
    fn new(stored: Option<DueCursors>, now_ms: i64) -> Self {
        let rewinding = stored.as_ref().is_some_and(|s| {
            !s.shards.is_empty() && s.rewound_at_ms.is_none_or(|at| now_ms - at >= CURSOR_REWIND_EVERY_MS)
        });
        let at = stored.as_ref().map(|s| s.shards.clone()).unwrap_or_default();
        Self { stored, at, rewinding, walked: Default::default() }
    }

    /// Where a walk of `shard` starts.
    fn start(&self, shard: u32, now_ms: i64) -> Option<DueCursor> {
        if self.stored.is_none() {
            return Some(DueCursor::from_ms(now_ms - CURSOR_REWIND_MS));
        }
        match self.at.get(&shard) {
            Some(p) if self.rewinding && !self.walked.contains(&shard) => {
                Some(DueCursor::from_ms(p.due_at_ms - CURSOR_REWIND_MS))
            }
            other => other.cloned(),
        }
    }

    /// What to keep at the run's end (`None`: nothing changed, or the
    /// places were not read).
    fn to_keep(&self, now_ms: i64) -> Option<DueCursors> {
        let stored = self.stored.as_ref()?;
        if self.at == stored.shards && !self.rewinding {
            return None;
        }
        let rewound_at_ms =
            if self.rewinding || stored.rewound_at_ms.is_none() { Some(now_ms) } else { stored.rewound_at_ms };
        Some(DueCursors { shards: self.at.clone(), rewound_at_ms, at_ms: now_ms })
    }
}

impl Run {
    fn new(start_ms: i64, started: Instant, waiters: usize) -> Self {
        Self {
            places: Places::default(),
            phases: Phases::default(),
            gauge: Gauge::default(),
            sends: Vec::new(),
            handovers: Vec::new(),
            drained: false,
            waiters_left: waiters,
            start_ms,
            started,
        }
    }

    /// The clock's current time on the run's time axis: a claim taken late
    /// in a long run lasts its whole lease from when it is taken.
    fn now(&self, ambient: &Ambient) -> i64 {
        let elapsed = ambient.instant().saturating_duration_since(self.started);
        self.start_ms.saturating_add(elapsed.as_millis() as i64)
    }

    fn failures(&self, partition: DuePartition) -> &Failures {
        match partition {
            DuePartition::Records => &self.phases.redrive,
            DuePartition::Outbox => &self.phases.outbox,
            DuePartition::Checks => &self.phases.drift,
            DuePartition::Waiters => &self.phases.waiters,
        }
    }
}

/// A record claimed for a re-drive, to be sent.
struct Redrive {
    key: EventKey,
    tenant: String,
    reason: &'static str,
    /// When it was claimed.
    at: i64,
}

/// Moves `shard`'s place over the entries of `page`, in index order, up
/// to the first whose item is still there and open, or due after `up_to`;
/// `false` once one stopped it (the rest of the walk moves it no further).
fn pass(places: &mut Places, shard: u32, page: &DuePage, passed: &[bool], up_to: i64) -> bool {
    for entry in &page.entries {
        // Gone since the index listed it: nothing is left to find there.
        let past = entry.item.is_none_or(|i| passed[i]);
        if entry.place.due_at_ms > up_to || !past {
            return false;
        }
        places.at.insert(shard, entry.place.clone());
    }
    true
}

/// The oldest open record: max(now − open since) over the open records
/// the records phase read (its pages reach `lookahead_ms` past now, so a
/// record waiting for its retry or lease is seen as well as one due).
#[derive(Default)]
struct Gauge {
    oldest_ms: Option<i64>,
    /// Whether any records page was read (else the gauge is not measured).
    measured: bool,
    /// Shards whose records partition was read to the end of the range; in
    /// the others more open records follow, and the age is a lower bound.
    complete: std::collections::HashSet<u32>,
}

impl Gauge {
    fn observe(&mut self, record: &DueRecord, now_ms: i64) {
        if matches!(record.status, Status::Received | Status::Processing | Status::Retryable) {
            // Open since its receipt, or since an operator's replay or a
            // wake-up from a gap: a replayed old record is not old.
            let age = (now_ms - record.open_since_ms).max(0);
            self.oldest_ms = Some(self.oldest_ms.map_or(age, |a| a.max(age)));
        }
    }

    fn incomplete(&self, shards: u32) -> u64 {
        u64::from(shards).saturating_sub(self.complete.len() as u64)
    }
}

/// The phases' failure records in one run.
#[derive(Default)]
struct Phases {
    redrive: Failures,
    outbox: Failures,
    drift: Failures,
    waiters: Failures,
}

/// A phase's record of failures in a row.
#[derive(Default)]
struct Failures {
    in_a_row: u32,
    /// The phase stopped (throttled, or too many failures in a row): its
    /// items are left for the next run.
    stopped: bool,
    /// Items that failed in this run: a further page of the same shard
    /// meets them again (they stay due) and they are not tried twice.
    failed: std::collections::HashSet<String>,
}

impl Failures {
    /// Whether `item` already failed in this run.
    fn failed_before(&self, item: &str) -> bool {
        self.failed.contains(item)
    }

    /// Counts and logs one item's failure; `true` when the phase should stop.
    fn item(&mut self, phase: &'static str, item: &str, e: &PortError, summary: &mut Summary) -> bool {
        self.failed.insert(item.to_owned());
        *summary.errors.entry(phase.to_owned()).or_default() += 1;
        tracing::warn!(phase, item, error = %e, "reconciler item failed; it stays due for a later run");
        self.in_a_row += 1;
        let stop = matches!(e, PortError::Throttled { .. }) || self.in_a_row >= MAX_CONSECUTIVE_ERRORS;
        if stop && !self.stopped {
            self.stopped = true;
            summary.complete = false;
            tracing::warn!(phase, failures_in_a_row = self.in_a_row, "phase stopped; the next run continues");
        }
        stop
    }

    fn ok(&mut self) {
        self.in_a_row = 0;
    }
}

/// The reconciler over its ports: the due index and evidence of the
/// ledger, the work queue, and the outbox dispatcher.
pub struct Reconciler<Q, L, D> {
    ledger: L,
    queue: Q,
    dispatcher: Option<D>,
    rechecks: Rechecks,
    settings: ReconcilerSettings,
    ambient: Ambient,
}

impl<Q: WorkQueue, L: DueLedger, D: Dispatch> Reconciler<Q, L, D> {
    pub fn new(ledger: L, queue: Q, dispatcher: Option<D>, rechecks: Rechecks, settings: ReconcilerSettings) -> Self {
        Self { ledger, queue, dispatcher, rechecks, settings, ambient: Ambient::system() }
    }

    /// Reads time and draws tokens from `ambient`.
    pub fn with_ambient(mut self, ambient: Ambient) -> Self {
        self.ambient = ambient;
        self
    }

    /// One bounded run. `deadline`: stop acting after this instant (the
    /// Lambda's remaining time minus a margin). Never fails: every failure is
    /// counted in the summary's `errors`, and the metrics are emitted.
    ///
    /// The phases run in order — records, outbox, re-checks — each over
    /// every shard of its own partition, with its share of the item budget
    /// ([`shares`]); what the phases leave unused then goes to those that
    /// ran out of theirs, in the same order.
    pub async fn run(&self, now_ms: i64, deadline: Instant) -> Summary {
        let started = self.ambient.instant();
        // A failed read of the last sweep is the same as none: a full run.
        let last = self.ledger.last_sweep().await.ok().flatten();
        if let Some(summary) = self.idle(last, now_ms, started).await {
            return summary;
        }
        let mut summary = Summary { complete: true, ..Default::default() };
        let mut run = Run::new(now_ms, started, waiter_share(self.settings.max_items));
        let stored = match self.ledger.due_cursors().await {
            Ok(c) => Some(c),
            Err(e) => {
                summary.complete = false;
                *summary.errors.entry("cursors".into()).or_default() += 1;
                tracing::warn!(error = %e, "the records phase's places were not read; this run reads the last minutes only");
                None
            }
        };
        run.places = Places::new(stored, now_ms);
        let mut left = 0;
        let mut cut = [false; 3];
        let order = DuePartition::ALL;
        let mut timed_out = false;
        for (i, (&partition, share)) in order.iter().zip(shares(self.settings.max_items)).enumerate() {
            let mut allowance = share;
            let end = self.phase(partition, now_ms, deadline, &mut allowance, &mut summary, &mut run).await;
            left += allowance;
            cut[i] = end == PhaseEnd::Budget;
            if end == PhaseEnd::OutOfTime {
                timed_out = true;
                break;
            }
        }
        // What the phases left unused goes to those cut short by their
        // share, records first.
        for (i, &partition) in order.iter().enumerate() {
            if timed_out || left == 0 || !cut[i] {
                continue;
            }
            let mut allowance = left;
            let end = self.phase(partition, now_ms, deadline, &mut allowance, &mut summary, &mut run).await;
            left = allowance;
            cut[i] = end == PhaseEnd::Budget;
            timed_out = end == PhaseEnd::OutOfTime;
        }
        // Then the parked gap waiters, with their own bound: never out of
        // the records' share, so re-drives never queue behind them.
        if !timed_out {
            let mut allowance = run.waiters_left;
            let end = self.phase(DuePartition::Waiters, now_ms, deadline, &mut allowance, &mut summary, &mut run).await;
            run.waiters_left = allowance;
            if end != PhaseEnd::Done {
                summary.complete = false;
            }
        }
        if timed_out || cut.iter().any(|c| *c) {
            summary.complete = false;
        }
        if let Some(keep) = run.places.to_keep(now_ms)
            && let Err(e) = self.ledger.keep_due_cursors(&keep).await
        {
            // The next run reads from the places kept before: again, not less.
            *summary.errors.entry("cursors".into()).or_default() += 1;
            tracing::warn!(error = %e, "the records phase's places were not kept");
        }
        summary.oldest_unprocessed_age_ms = run.gauge.oldest_ms;
        summary.incomplete_shards = run.gauge.incomplete(self.ledger.shards());
        match self.evidence(&mut summary).await {
            Ok(()) => summary.evidence = true,
            Err(e) => {
                *summary.errors.entry("evidence".into()).or_default() += 1;
                tracing::error!(error = %e, "reconciler evidence not gathered");
            }
        }
        self.keep_sweep(last, &mut summary, now_ms).await;
        self.emit(&summary, run.gauge.measured, started);
        summary
    }

    /// An idle run (docs/architecture.md "An idle reconciler"): the last run
    /// that read every shard was quiet and is less than
    /// [`FULL_SWEEP_EVERY_MS`] old, and no activity was noted in the last
    /// [`ACTIVE_FOR_MS`]: nothing can be due that the sweep did not see, so
    /// no shard is read. Two reads; the evidence is the sweep's. `None`: a
    /// full run is needed (a failed read counts as activity).
    async fn idle(&self, last: Option<Sweep>, now_ms: i64, started: Instant) -> Option<Summary> {
        let sweep = last.filter(|s| s.quiet && (0..FULL_SWEEP_EVERY_MS).contains(&(now_ms - s.at_ms)))?;
        if !matches!(self.ledger.active_since(now_ms - ACTIVE_FOR_MS).await, Ok(false)) {
            return None;
        }
        let summary = Summary {
            dead_letters: sweep.attention.dead_letters,
            parked: sweep.attention.parked,
            outbox_dead: sweep.attention.outbox_dead,
            complete: true,
            evidence: true,
            idle: true,
            ..Default::default()
        };
        // A quiet sweep saw no open record, and nothing was added since.
        self.emit(&summary, true, started);
        Some(summary)
    }

    /// Keeps what this full run found for the idle runs after it: written
    /// when it was quiet (every shard read, no error, nothing due, no open
    /// record, evidence measured), or to end a quiet one kept before.
    async fn keep_sweep(&self, last: Option<Sweep>, summary: &mut Summary, now_ms: i64) {
        let quiet = summary.complete
            && summary.errors.is_empty()
            && summary.evidence
            && summary.due_seen == 0
            && summary.outbox_drains + summary.outbox_republished + summary.circuits_open == 0
            && summary.oldest_unprocessed_age_ms.is_none();
        if !quiet && !last.is_some_and(|s| s.quiet) {
            return;
        }
        let attention =
            Attention { dead_letters: summary.dead_letters, parked: summary.parked, outbox_dead: summary.outbox_dead };
        if let Err(e) = self.ledger.record_sweep(&Sweep { at_ms: now_ms, quiet, attention }).await {
            // The next run reads every shard again (an earlier quiet sweep
            // ages out within the hour): nothing is skipped for it.
            *summary.errors.entry("sweep".into()).or_default() += 1;
            tracing::warn!(error = %e, "the sweep was not kept");
        }
    }

    /// One phase over every shard of its partition, starting at a shard
    /// that moves with time (a run cut short does not always favour the
    /// first shards). Spends `allowance` on the items it acts on.
    async fn phase(
        &self,
        partition: DuePartition,
        now_ms: i64,
        deadline: Instant,
        allowance: &mut usize,
        summary: &mut Summary,
        run: &mut Run,
    ) -> PhaseEnd {
        if partition == DuePartition::Outbox && !run.drained {
            run.drained = true;
            if let Some(d) = &self.dispatcher {
                // Destinations back with deliveries waiting: drained apart
                // (a queue), or by this run within its share.
                let drains = d.drains(now_ms, *allowance).await;
                summary.outbox_drains += u64::from(drains.started);
                summary.circuits_open += u64::from(drains.open);
                summary.outbox_republished += u64::from(drains.sent);
                *allowance = allowance.saturating_sub(drains.sent as usize);
            }
        }
        let shards = self.ledger.shards();
        let first = ((now_ms / 60_000) as u64 % u64::from(shards)) as u32;
        let mut end = PhaseEnd::Done;
        for i in 0..shards {
            let shard = (first + i) % shards;
            let end_of_shard = self.shard(partition, shard, now_ms, deadline, allowance, summary, run).await;
            match end_of_shard {
                PhaseEnd::Done => {}
                PhaseEnd::Budget => end = PhaseEnd::Budget,
                // The records phase reads every shard for the oldest age
                // even when its share is spent; the others stop.
                stop @ (PhaseEnd::Stopped | PhaseEnd::OutOfTime) => {
                    end = stop;
                    break;
                }
            }
            if end == PhaseEnd::Budget && partition != DuePartition::Records {
                break;
            }
        }
        // What the shards claimed and did not send yet goes together: the
        // re-drives of several shards share their requests.
        self.send_redrives(run, summary).await;
        self.hand_over(run, summary).await;
        end
    }

    /// One phase in one shard, page by page.
    #[allow(clippy::too_many_arguments)]
    async fn shard(
        &self,
        partition: DuePartition,
        shard: u32,
        now_ms: i64,
        deadline: Instant,
        allowance: &mut usize,
        summary: &mut Summary,
        run: &mut Run,
    ) -> PhaseEnd {
        // Records are read ahead of now, for the oldest open record's age;
        // outbox items younger than the grace are left to their processor.
        let (up_to, limit) = match partition {
            DuePartition::Records => (now_ms.saturating_add(self.settings.lookahead_ms.max(0)), 100),
            DuePartition::Outbox => (now_ms - self.settings.outbox_grace_ms, (*allowance).clamp(1, 100)),
            DuePartition::Checks | DuePartition::Waiters => (now_ms, (*allowance).clamp(1, 100)),
        };
        let records = partition == DuePartition::Records;
        let mut after: Option<DueCursor> = if records { run.places.start(shard, now_ms) } else { None };
        // The place moves only over entries due long enough ago, each
        // finished, gone or moved on.
        let pass_up_to = now_ms - CURSOR_SETTLE_MS;
        let mut passing = records && run.places.stored.is_some();
        // Pages read that reach past now (the look-ahead).
        let mut ahead = 0;
        if records {
            run.places.walked.insert(shard);
        }
        let mut end = PhaseEnd::Done;
        loop {
            if self.ambient.past(deadline) {
                return PhaseEnd::OutOfTime;
            }
            if run.failures(partition).stopped {
                return PhaseEnd::Stopped;
            }
            if partition != DuePartition::Records && *allowance == 0 {
                return PhaseEnd::Budget;
            }
            let page = match self.ledger.due(partition, shard, up_to, limit, after.as_ref()).await {
                Ok(page) => page,
                Err(e) => {
                    // Counted once per shard and phase; the other shards go on.
                    summary.complete = false;
                    *summary.errors.entry("due".to_owned()).or_default() += 1;
                    tracing::warn!(shard, partition = partition.name(), error = %e, "due query failed; the next run continues");
                    return end;
                }
            };
            if partition == DuePartition::Records {
                run.gauge.measured = true;
            }
            let mut due_beyond = false;
            // The items of this page finished or no longer where the index had them.
            let mut passed = vec![false; page.items.len()];
            for (i, due) in page.items.iter().enumerate() {
                if self.ambient.past(deadline) {
                    return PhaseEnd::OutOfTime;
                }
                if let Due::Record(record) = due
                    && record.status.is_terminal()
                {
                    match &record.drop {
                        // A finished record's entry, left by its completion.
                        None => passed[i] = true,
                        // Its payload to drop, not yet.
                        Some(_) if due.due_at_ms() > now_ms => due_beyond = true,
                        Some(_) if *allowance == 0 => end = PhaseEnd::Budget,
                        Some(drop) => {
                            summary.due_seen += 1;
                            let at = run.now(&self.ambient);
                            passed[i] = self.drop_one(record, drop, at, allowance, summary, run).await;
                        }
                    }
                    continue;
                }
                if due.due_at_ms() > now_ms {
                    // Read ahead for the gauge only: not due yet.
                    due_beyond = true;
                    if let Due::Record(record) = due {
                        run.gauge.observe(record, now_ms);
                    }
                    continue;
                }
                if let Due::Record(record) = due {
                    run.gauge.observe(record, now_ms);
                }
                summary.due_seen += 1;
                if *allowance == 0 {
                    end = PhaseEnd::Budget;
                    continue;
                }
                // Which items are due is the run's range (from its start);
                // each is claimed and acted on at the clock's current time.
                let at = run.now(&self.ambient);
                match due {
                    Due::Record(record) => {
                        passed[i] = self.redrive_one(record, at, allowance, summary, run).await;
                        if run.sends.len() >= SEND_BATCH_MAX {
                            self.send_redrives(run, summary).await;
                        }
                    }
                    // Outbox items and re-checked state in the records
                    // partition (a table not yet migrated) are acted on by
                    // their phase.
                    Due::Outbox { id, due_at_ms } => {
                        if *due_at_ms <= now_ms - self.settings.outbox_grace_ms {
                            passed[i] =
                                self.outbox_one(id, at, allowance, summary, &mut run.phases, &mut run.handovers).await;
                            if run.handovers.len() >= SEND_BATCH_MAX {
                                self.hand_over(run, summary).await;
                            }
                        }
                    }
                    Due::Check(item) => {
                        passed[i] = self.check_one(item, at, allowance, summary, &mut run.phases).await;
                    }
                    Due::Waiter(waiter) if partition == DuePartition::Waiters => {
                        self.waiter_one(waiter, at, allowance, summary, &mut run.phases).await;
                    }
                    // A pointer left in the records partition by the release
                    // before: under the waiters' bound, not the records'.
                    Due::Waiter(waiter) => {
                        if run.waiters_left > 0 {
                            passed[i] =
                                self.waiter_one(waiter, at, &mut run.waiters_left, summary, &mut run.phases).await;
                        }
                    }
                }
                if partition != DuePartition::Records && run.failures(partition).stopped {
                    return PhaseEnd::Stopped;
                }
            }
            if passing {
                passing = pass(&mut run.places, shard, &page, &passed, pass_up_to);
            }
            if due_beyond {
                ahead += 1;
            }
            match page.next {
                None => {
                    if partition == DuePartition::Records {
                        run.gauge.complete.insert(shard);
                    }
                    return end;
                }
                // This phase's share is spent; or what follows is due later
                // (records are read to the end of the look-ahead, where most
                // entries are finished records').
                Some(_) if end == PhaseEnd::Budget => return end,
                Some(_) if due_beyond && (!records || ahead >= LOOKAHEAD_PAGES) => return end,
                Some(_) if partition == DuePartition::Records && run.phases.redrive.stopped => return end,
                Some(next) => after = Some(next),
            }
        }
    }

    /// Hands the due outbox items gathered to the delivery queue.
    async fn hand_over(&self, run: &mut Run, summary: &mut Summary) {
        let Some(d) = &self.dispatcher else { return };
        if run.handovers.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut run.handovers);
        let handed = d.hand_over_ids(&ids).await;
        summary.outbox_handed += handed as u64;
        if handed < ids.len() {
            *summary.errors.entry("outbox".to_owned()).or_default() += (ids.len() - handed) as u64;
        }
    }

    /// Claims one due record for a re-drive and adds it to the run's sends;
    /// `true` when its entry is no longer where it was read (moved by this
    /// claim, or by another run's first).
    async fn redrive_one(
        &self,
        record: &DueRecord,
        now_ms: i64,
        budget: &mut usize,
        summary: &mut Summary,
        run: &mut Run,
    ) -> bool {
        let failures = &mut run.phases.redrive;
        let key = &record.key;
        if failures.stopped || failures.failed_before(key.as_str()) {
            return false;
        }
        let Some(reason) = record.redrive_reason(now_ms) else {
            // A live lease: look again when it ends (the lease does not move
            // the record in the index). Refused: another run moved it first.
            if let (Status::Processing, Some(end)) = (record.status, record.lease_expires_at_ms) {
                return match self.ledger.claim_due(DueItem::Record(key), record.due_at_ms, end + 1).await {
                    Ok(_) => true,
                    Err(e) => {
                        failures.item("redrive", key.as_str(), &e, summary);
                        false
                    }
                };
            }
            return false;
        };
        // Claimed, the record stays due at its next look: if the send below
        // fails or this invocation dies, a later run sends it again.
        let next = record.next_look(reason, self.settings.redrive_backoff_ms, now_ms);
        match self.ledger.claim_due(DueItem::Record(key), record.due_at_ms, next).await {
            Ok(Some(_)) => {}
            Ok(None) => return true,
            Err(e) => {
                failures.item("redrive", key.as_str(), &e, summary);
                return false;
            }
        }
        *budget -= 1;
        run.sends.push(Redrive { key: key.clone(), tenant: record.tenant.clone(), reason, at: now_ms });
        true
    }

    /// The payload of a finished record of the `drop_after` policy: dropped
    /// once [`DROP_AFTER_GRACE_MS`] have passed since its completion and its
    /// deliveries (one per destination of the routes, by their stable ids)
    /// are SENT or were never made; else looked at again then. Claimed
    /// first, like a re-drive: the entry moves to its next look, so a run
    /// that dies or fails after the claim leaves it to a later one, and each
    /// step of the drop is a no-op when repeated. `true` when its entry
    /// moved out of this run's range.
    async fn drop_one(
        &self,
        record: &DueRecord,
        drop: &PayloadDrop,
        now_ms: i64,
        budget: &mut usize,
        summary: &mut Summary,
        run: &mut Run,
    ) -> bool {
        let failures = &mut run.phases.redrive;
        let key = &record.key;
        if failures.stopped || failures.failed_before(key.as_str()) {
            return false;
        }
        let ready_at = drop.processed_at_ms.saturating_add(DROP_AFTER_GRACE_MS);
        let next = if ready_at > now_ms { ready_at } else { now_ms + DROP_RECHECK_MS };
        match self.ledger.claim_due(DueItem::Record(key), record.due_at_ms, next).await {
            Ok(Some(_)) => {}
            Ok(None) => return true,
            Err(e) => {
                failures.item("drop", key.as_str(), &e, summary);
                return false;
            }
        }
        *budget -= 1;
        if ready_at > now_ms {
            return true;
        }
        let destinations = self.dispatcher.as_ref().map(Dispatch::destinations).unwrap_or_default();
        let ids: Vec<String> = destinations
            .iter()
            .map(|d| crate::message::outbox_id(key.as_str(), &crate::routes::delivery_action(d)))
            .collect();
        match self.ledger.deliveries_settled(&ids).await {
            Ok(true) => {}
            Ok(false) => {
                summary.payloads_waiting += 1;
                return true;
            }
            Err(e) => {
                failures.item("drop", key.as_str(), &e, summary);
                return true;
            }
        }
        match self.ledger.drop_payload(key, drop, now_ms).await {
            Ok(dropped) => {
                failures.ok();
                if dropped {
                    summary.payloads_dropped += 1;
                    tracing::info!(key = %key, "payload dropped (drop_after)");
                }
            }
            Err(e) => {
                failures.item("drop", key.as_str(), &e, summary);
            }
        }
        true
    }

    /// Sends the records claimed for a re-drive, together, each in its
    /// tenant's group.
    async fn send_redrives(&self, run: &mut Run, summary: &mut Summary) {
        if run.sends.is_empty() {
            return;
        }
        let sends = std::mem::take(&mut run.sends);
        let messages: Vec<Outgoing<'_>> =
            sends.iter().map(|s| Outgoing { key: &s.key, tenant: &s.tenant, payload: None }).collect();
        let results = self.queue.send_all(&messages).await;
        for (sent, result) in sends.iter().zip(results) {
            self.redriven(sent, result, summary, &mut run.phases.redrive).await;
        }
    }

    /// What follows one re-drive's send.
    async fn redriven(
        &self,
        sent: &Redrive,
        result: Result<(), PortError>,
        summary: &mut Summary,
        failures: &mut Failures,
    ) {
        let (key, reason, now_ms) = (&sent.key, sent.reason, sent.at);
        if let Err(e) = result {
            if let PortError::Caller { .. } = &e {
                // The same send is refused on every look: dead now, with the answer.
                match self.ledger.dead_refused(key, &e.to_string(), now_ms).await {
                    Ok(true) => {
                        summary.caller_dead += 1;
                        tracing::error!(key = %key, error = %e, "re-drive refused as invalid; dead");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        failures.item("redrive", key.as_str(), &e, summary);
                    }
                }
                return;
            }
            failures.item("redrive", key.as_str(), &e, summary);
            return;
        }
        failures.ok();
        if reason == "never_sent" {
            // Only now is it sent. Best effort: without the note the record
            // is sent again after the backoff.
            if let Err(e) = self.ledger.note_enqueued(key, now_ms).await {
                failures.item("redrive", key.as_str(), &e, summary);
            }
        }
        if reason == "lease_expired" {
            summary.stuck_leases += 1;
        }
        *summary.redriven.entry(reason.to_owned()).or_default() += 1;
        tracing::info!(key = %key, reason, "re-driven");
    }

    /// Looks at the stream of one record parked at the gap bound (its waiter
    /// pointer is due): woken and queued if its predecessor committed (whose
    /// processor may have died before waking it), else looked at again
    /// later, the longer it has waited. `true` when it moved out of this
    /// run's range.
    async fn waiter_one(
        &self,
        w: &WaiterItem,
        now_ms: i64,
        budget: &mut usize,
        summary: &mut Summary,
        phases: &mut Phases,
    ) -> bool {
        let failures = &mut phases.waiters;
        let id = format!("{}#{}", w.stream, w.sk);
        if failures.stopped || failures.failed_before(&id) {
            return false;
        }
        // Looks space out as it waits: half its time parked ahead, at least
        // the re-drive backoff, at most WAITER_LOOK_MAX_MS.
        let backoff = self.settings.redrive_backoff_ms;
        let next = now_ms + ((now_ms - w.parked_at_ms) / 2).clamp(backoff, WAITER_LOOK_MAX_MS.max(backoff));
        match self.ledger.claim_due(DueItem::Waiter { stream: &w.stream, sk: &w.sk }, w.due_at_ms, next).await {
            Ok(Some(_)) => {}
            Ok(None) => return false,
            Err(e) => {
                failures.item("waiters", &id, &e, summary);
                return false;
            }
        }
        *budget -= 1;
        match self.ledger.look_at_waiter(w, now_ms).await {
            Ok(WaiterCheck::Woken { tenant }) => {
                failures.ok();
                summary.gaps_woken += 1;
                tracing::info!(key = %w.key, "a parked gap waiter's predecessor had committed: woken");
                // Best effort: woken, it is due now and the next run re-drives it anyway.
                if let Err(e) = self.queue.send(&w.key, &tenant).await {
                    failures.item("waiters", w.key.as_str(), &e, summary);
                }
            }
            Ok(WaiterCheck::Waiting | WaiterCheck::Gone) => failures.ok(),
            Err(e) => {
                failures.item("waiters", &id, &e, summary);
            }
        }
        true
    }

    /// Dispatches one outbox item left pending (or claimed by a dispatcher
    /// that died); `true` when it moved out of this run's range.
    #[allow(clippy::too_many_arguments)]
    async fn outbox_one(
        &self,
        id: &str,
        now_ms: i64,
        budget: &mut usize,
        summary: &mut Summary,
        phases: &mut Phases,
        handovers: &mut Vec<String>,
    ) -> bool {
        let Some(d) = &self.dispatcher else { return false };
        let failures = &mut phases.outbox;
        if failures.stopped || failures.failed_before(id) {
            return false;
        }
        if d.queued() {
            // Sent apart, by the dispatcher's concurrency: handed on in tens.
            if !handovers.contains(&id.to_owned()) {
                handovers.push(id.to_owned());
            }
            *budget -= 1;
            return true;
        }
        // Each outcome but `Skipped` moves the item out of this page's range
        // (sent, due later, or dead).
        let outcome = match d.dispatch(id, now_ms).await {
            Ok(outcome) => outcome,
            Err(e) => {
                failures.item("outbox", id, &e, summary);
                return false;
            }
        };
        match outcome {
            Dispatched::Skipped => return false,
            // Its destination's circuit is open: moved to when it may be tried.
            Dispatched::Waiting { .. } => summary.outbox_waiting += 1,
            // Its destination's limit: it waits for its turn (still claimed).
            Dispatched::Paced { .. } => summary.outbox_waiting += 1,
            Dispatched::Published => {
                failures.ok();
                summary.outbox_republished += 1;
            }
            // The destination refused it (the item backs off, or is dead):
            // counted, but not the phase's failure, so one failing
            // destination never ends the sweep for the others.
            Dispatched::Retrying { ref error, .. } | Dispatched::Dead { ref error, .. } => {
                summary.outbox_failed += 1;
                if matches!(outcome, Dispatched::Dead { .. }) {
                    summary.outbox_dead_lettered += 1;
                }
                *summary.errors.entry("outbox".to_owned()).or_default() += 1;
                tracing::warn!(item = id, error = %error, "outbox publish failed; it backs off");
            }
        }
        *budget -= 1;
        true
    }

    /// Re-checks one state item against the provider, by the plug-in
    /// registered for it; `true` when it moved out of this run's range. An
    /// item no plug-in is registered for stays due, untouched.
    async fn check_one(
        &self,
        item: &CheckItem,
        now_ms: i64,
        budget: &mut usize,
        summary: &mut Summary,
        phases: &mut Phases,
    ) -> bool {
        let Some(recheck) = self.rechecks.of(&item.pk) else { return false };
        let failures = &mut phases.drift;
        let pk = item.pk.as_str();
        if failures.stopped || failures.failed_before(pk) {
            return false;
        }
        // Checked now: next look after another interval (and never again in
        // this run, whose range ends at `now_ms`).
        let next = now_ms + self.settings.drift_interval_ms.max(1);
        let token = match self.ledger.claim_due(DueItem::Check(pk), item.due_at_ms, next).await {
            Ok(Some(token)) => token,
            Ok(None) => return false,
            Err(e) => {
                failures.item("drift", pk, &e, summary);
                return false;
            }
        };
        *budget -= 1;
        summary.drift_checked += 1;
        match self.recheck(item, recheck.as_ref(), now_ms).await {
            Ok(drift) => {
                failures.ok();
                if drift != Drift::None {
                    summary.drift_found += 1;
                }
                if drift == Drift::Repaired {
                    summary.drift_repaired += 1;
                }
            }
            Err(e) => {
                let retry_soon = !matches!(e, PortError::Caller { .. });
                failures.item("drift", pk, &e, summary);
                // Look again after the re-drive backoff rather than a whole
                // interval (out of this run's range); an item the plug-in
                // cannot read waits for the interval.
                if retry_soon {
                    let retry = now_ms + self.settings.redrive_backoff_ms;
                    if let Err(e) = self.ledger.reschedule(DueItem::Check(pk), &token, retry).await {
                        tracing::warn!(item = %pk, error = %e, "re-check not rescheduled; next look after the interval");
                    }
                }
            }
        }
        true
    }

    /// Runs the plug-in's comparison; on drift, submits its repair event
    /// through the normal pipeline. A provider that cannot answer is an
    /// error (counted; the check is retried after the re-drive backoff).
    async fn recheck(&self, item: &CheckItem, recheck: &dyn Recheck, now_ms: i64) -> Result<Drift, PortError> {
        let verdict = recheck.check(&item.state, now_ms).await.map_err(|e| match e {
            ProjectionError::Permanent(m) => {
                PortError::Caller { service: "provider", code: "unreadable_state".into(), message: m }
            }
            ProjectionError::Transient(m) | ProjectionError::Unavailable(m) => {
                PortError::Unavailable { service: "provider", message: format!("{}: {m}", item.pk) }
            }
        })?;
        let Verdict::Drift(repair) = verdict else { return Ok(Drift::None) };
        metrics::counter!("drift_found", "projection" => recheck.name()).increment(1);
        tracing::warn!(item = %item.pk, recheck = recheck.name(), detail = %repair.detail,
            "drift found; repairing through the pipeline");
        let arrival = Arrival {
            provider: &repair.provider,
            endpoint: &repair.endpoint,
            tenant: &repair.tenant,
            event_id: &repair.event_id,
            event_type: Some(&repair.event_type),
            body: &repair.body,
            hashes: None,
            via: crate::ledger::Via::Reconciliation,
            batch_hash: None,
            retention_days: self.settings.retention_days,
            index_shards: self.ledger.shards(),
            notification: false,
            kept: None,
        };
        let event = crate::admission::new_event(arrival, now_ms, self.ambient.token());
        let key = event.key.clone();
        // The repair's identity is fixed by the drift instance, so any
        // earlier attempt at this repair claimed the same record: our own
        // claim whose acknowledgement was lost (the claim recognises it), or
        // a run that died before sending. "Already exists" never means
        // "done": the admission makes good a missing payload and hands over a
        // record never sent (a duplicate on the queue is absorbed by the lease).
        let admission = Admission { ledger: &self.ledger, queue: &self.queue, by: "reconciler", keys: None };
        let admitted = admission.admit(&[(event, &repair.body)]).await.into_iter().next();
        match admitted {
            Some(a) if a.sent() => {
                self.ledger.mark_enqueued(&key, now_ms).await?;
                metrics::counter!("drift_repaired", "projection" => recheck.name()).increment(1);
                return Ok(Drift::Repaired);
            }
            Some(Admitted::Failed { error, .. }) => return Err(error),
            Some(Admitted::TooLarge { size, limit }) => return Err(PortError::TooLarge { size, limit }),
            Some(_) | None => {}
        }
        // An earlier run submitted this repair already.
        Ok(Drift::Found)
    }

    /// Dead letters, parked records and dead outbox items, from the
    /// attention index. All or nothing: a failed query leaves no partial
    /// counts in the summary. (The oldest unprocessed age is measured by the
    /// records phase, from the pages it read.)
    async fn evidence(&self, summary: &mut Summary) -> Result<(), PortError> {
        let attention = self.ledger.attention().await?;
        summary.dead_letters = attention.dead_letters;
        summary.parked = attention.parked;
        summary.outbox_dead = attention.outbox_dead;
        Ok(())
    }

    /// Emitted on every run. `reconciler_runs` is the heartbeat (its absence
    /// alarms), `reconciler_errors` is set even when zero (so "no errors" is a
    /// data point, not missing data). The evidence gauges are set only when
    /// measured: a failed measurement must not report zero dead letters (a
    /// warm container's collector repeats the last measured value; the
    /// failure itself is in `reconciler_errors`).
    fn emit(&self, s: &Summary, measured: bool, started: Instant) {
        metrics::counter!("reconciler_runs").increment(1);
        metrics::gauge!("reconciler_errors").set(s.error_count() as f64);
        for (reason, n) in &s.redriven {
            metrics::counter!("redriven", "reason" => reason.clone()).increment(*n);
        }
        metrics::counter!("outbox_republished").increment(s.outbox_republished);
        metrics::gauge!("stuck_leases").set(s.stuck_leases as f64);
        metrics::gauge!("drift_found_last_run").set(s.drift_found as f64);
        if s.evidence {
            metrics::gauge!("dead_letters").set(s.dead_letters as f64);
            metrics::gauge!("parked").set(s.parked as f64);
            metrics::gauge!("outbox_dead").set(s.outbox_dead as f64);
        }
        if measured {
            metrics::gauge!("oldest_unprocessed_age").set(s.oldest_unprocessed_age_ms.unwrap_or(0) as f64);
            metrics::gauge!("reconciler_incomplete").set(s.incomplete_shards as f64);
        }
        metrics::histogram!("reconcile_duration").record((self.ambient.instant() - started).as_secs_f64() * 1000.0);
        let summary = serde_json::to_string(s).unwrap_or_default();
        if s.errors.is_empty() {
            tracing::info!(summary = %summary, "reconciler run");
        } else {
            tracing::warn!(summary = %summary, errors = s.error_count(), "reconciler run with errors");
        }
    }
}

#[cfg(test)]
mod tests;
