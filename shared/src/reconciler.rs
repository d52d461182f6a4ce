//! The reconciler: finds what the webhooks alone cannot finish, through the
//! sparse, sharded `due` index (never a scan), and hands it back to the same
//! pipeline. Each phase sweeps its own partition of every shard:
//!
//! 1. records, `due#…`: RECEIVED records never sent or not picked up (due
//!    60 s after receipt), PROCESSING records whose lease expired (due at
//!    expiry), RETRYABLE records whose retry is due → re-driven to SQS. Its
//!    pages reach [`ReconcilerSettings::lookahead_ms`] past now, so the
//!    oldest open record's age is measured from the same reads;
//! 2. outbox, `out#…`: outbox items still pending, or claimed by a
//!    dispatcher that died → published (same idempotency key); a failed
//!    publish backs off and, its attempts exhausted, goes DEAD (see
//!    [`crate::outbox`]);
//! 3. re-checks, `chk#…`: entitlements whose last provider check is older
//!    than the drift interval → compared with Stripe; drift is repaired by a
//!    reconciliation event (`recon:<subscription>:<drift instance>`) through
//!    the processor.
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
//! [`MAX_CONSECUTIVE_ERRORS`] failures in a row); evidence is gathered and the
//! metrics are emitted on every run. A run stops at its item budget or
//! deadline; what it did not reach stays due, so the next run continues.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::clock::Ambient;
use crate::config::ReconcilerSettings;
use crate::identity::{EventKey, payload_hash};
use crate::ledger::{
    Claim, DriftItem, Due, DueCursor, DueItem, DuePartition, DueRecord, NewEvent, PortError, SendLease, Status,
};
use crate::message::Dispatched;
use crate::policy::SEND_LEASE_MS;
use crate::ports::{Dispatch, DueLedger, WorkQueue};
use crate::projection::fetch::SubscriptionSource;

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
    pub drift_checked: u64,
    pub drift_found: u64,
    pub drift_repaired: u64,
    pub dead_letters: u64,
    pub parked: u64,
    /// Outbox items in DEAD (all, not only this run's).
    pub outbox_dead: u64,
    /// Expired leases seen (each also counted in `redriven.lease_expired`).
    pub stuck_leases: u64,
    /// The oldest open record's age: max(now − received) over the open
    /// records due up to the look-ahead; a lower bound when
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
}

impl Run {
    fn new(_shards: u32) -> Self {
        Self { phases: Phases::default(), gauge: Gauge::default() }
    }

    fn failures(&self, partition: DuePartition) -> &Failures {
        match partition {
            DuePartition::Records => &self.phases.redrive,
            DuePartition::Outbox => &self.phases.outbox,
            DuePartition::Checks => &self.phases.drift,
        }
    }
}

/// The oldest open record: max(now − `received_at`) over the open records
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
            let age = (now_ms - record.received_at_ms).max(0);
            self.oldest_ms = Some(self.oldest_ms.map_or(age, |a| a.max(age)));
        }
    }

    fn incomplete(&self, shards: u32) -> u64 {
        u64::from(shards).saturating_sub(self.complete.len() as u64)
    }
}

/// The three phases' failure records in one run.
#[derive(Default)]
struct Phases {
    redrive: Failures,
    outbox: Failures,
    drift: Failures,
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
    subscriptions: Option<Arc<dyn SubscriptionSource>>,
    settings: ReconcilerSettings,
    ambient: Ambient,
}

impl<Q: WorkQueue, L: DueLedger, D: Dispatch> Reconciler<Q, L, D> {
    pub fn new(
        ledger: L,
        queue: Q,
        dispatcher: Option<D>,
        subscriptions: Option<Arc<dyn SubscriptionSource>>,
        settings: ReconcilerSettings,
    ) -> Self {
        Self { ledger, queue, dispatcher, subscriptions, settings, ambient: Ambient::system() }
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
        let mut summary = Summary { complete: true, ..Default::default() };
        let started = self.ambient.instant();
        let mut run = Run::new(self.ledger.shards());
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
        if timed_out || cut.iter().any(|c| *c) {
            summary.complete = false;
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
        self.emit(&summary, run.gauge.measured, started);
        summary
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
        let shards = self.ledger.shards();
        let first = ((now_ms / 60_000) as u64 % u64::from(shards)) as u32;
        let mut end = PhaseEnd::Done;
        for i in 0..shards {
            let shard = (first + i) % shards;
            match self.shard(partition, shard, now_ms, deadline, allowance, summary, run).await {
                PhaseEnd::Done => {}
                PhaseEnd::Budget => end = PhaseEnd::Budget,
                // The records phase reads every shard for the oldest age
                // even when its share is spent; the others stop.
                stop @ (PhaseEnd::Stopped | PhaseEnd::OutOfTime) => return stop,
            }
            if end == PhaseEnd::Budget && partition != DuePartition::Records {
                return end;
            }
        }
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
            DuePartition::Checks => (now_ms, (*allowance).clamp(1, 100)),
        };
        let mut after: Option<DueCursor> = None;
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
            for due in &page.items {
                if self.ambient.past(deadline) {
                    return PhaseEnd::OutOfTime;
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
                if *allowance == 0 {
                    end = PhaseEnd::Budget;
                    continue;
                }
                match due {
                    Due::Record(record) => {
                        self.redrive_one(record, now_ms, allowance, summary, &mut run.phases).await;
                    }
                    // Outbox items and entitlements in the records partition
                    // (a table not yet migrated) are acted on by their phase.
                    Due::Outbox { id, due_at_ms } => {
                        if *due_at_ms <= now_ms - self.settings.outbox_grace_ms {
                            self.outbox_one(id, now_ms, allowance, summary, &mut run.phases).await;
                        }
                    }
                    Due::Drift(item) => {
                        self.drift_one(item, now_ms, allowance, summary, &mut run.phases).await;
                    }
                }
                if partition != DuePartition::Records && run.failures(partition).stopped {
                    return PhaseEnd::Stopped;
                }
            }
            match page.next {
                None => {
                    if partition == DuePartition::Records {
                        run.gauge.complete.insert(shard);
                    }
                    return end;
                }
                // What follows is due later, or this phase's share is spent.
                Some(_) if due_beyond || end == PhaseEnd::Budget => return end,
                Some(_) if partition == DuePartition::Records && run.phases.redrive.stopped => return end,
                Some(next) => after = Some(next),
            }
        }
    }

    /// Re-drives one due record; `true` when it moved out of this run's range.
    async fn redrive_one(
        &self,
        record: &DueRecord,
        now_ms: i64,
        budget: &mut usize,
        summary: &mut Summary,
        phases: &mut Phases,
    ) -> bool {
        let failures = &mut phases.redrive;
        let key = &record.key;
        if failures.stopped || failures.failed_before(key.as_str()) {
            return false;
        }
        let Some(reason) = record.redrive_reason(now_ms) else {
            // A live lease: look again when it ends (the lease does not move
            // the record in the index). Refused: another run moved it first.
            if let (Status::Processing, Some(end)) = (record.status, record.lease_expires_at_ms) {
                return match self.ledger.claim_due(DueItem::Record(key), record.due_at_ms, end + 1).await {
                    Ok(moved) => moved.is_some(),
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
        let next = now_ms + self.settings.redrive_backoff_ms;
        match self.ledger.claim_due(DueItem::Record(key), record.due_at_ms, next).await {
            Ok(Some(_)) => {}
            Ok(None) => return false,
            Err(e) => {
                failures.item("redrive", key.as_str(), &e, summary);
                return false;
            }
        }
        *budget -= 1;
        if let Err(e) = self.queue.send(key).await {
            failures.item("redrive", key.as_str(), &e, summary);
            return true;
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
        true
    }

    /// Dispatches one outbox item left pending (or claimed by a dispatcher
    /// that died); `true` when it moved out of this run's range.
    async fn outbox_one(
        &self,
        id: &str,
        now_ms: i64,
        budget: &mut usize,
        summary: &mut Summary,
        phases: &mut Phases,
    ) -> bool {
        let Some(d) = &self.dispatcher else { return false };
        let failures = &mut phases.outbox;
        if failures.stopped || failures.failed_before(id) {
            return false;
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
            Dispatched::Published => {
                failures.ok();
                summary.outbox_republished += 1;
            }
            Dispatched::Retrying { ref error, .. } | Dispatched::Dead { ref error, .. } => {
                summary.outbox_failed += 1;
                if matches!(outcome, Dispatched::Dead { .. }) {
                    summary.outbox_dead_lettered += 1;
                }
                let e = PortError::Unavailable { service: "sns", message: error.clone() };
                failures.item("outbox", id, &e, summary);
            }
        }
        *budget -= 1;
        true
    }

    /// Checks one entitlement against the provider; `true` when it moved out
    /// of this run's range.
    async fn drift_one(
        &self,
        item: &DriftItem,
        now_ms: i64,
        budget: &mut usize,
        summary: &mut Summary,
        phases: &mut Phases,
    ) -> bool {
        let Some(source) = &self.subscriptions else { return false };
        let failures = &mut phases.drift;
        let pk = item.pk.as_str();
        if failures.stopped || failures.failed_before(pk) {
            return false;
        }
        // Checked now: next look after another interval (and never again in
        // this run, whose range ends at `now_ms`).
        let next = now_ms + self.settings.drift_interval_ms.max(1);
        let token = match self.ledger.claim_due(DueItem::Drift(pk), item.due_at_ms, next).await {
            Ok(Some(token)) => token,
            Ok(None) => return false,
            Err(e) => {
                failures.item("drift", pk, &e, summary);
                return false;
            }
        };
        *budget -= 1;
        summary.drift_checked += 1;
        match self.check_entitlement(item, source.as_ref(), now_ms).await {
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
                failures.item("drift", pk, &e, summary);
                // Look again after the re-drive backoff rather than a whole
                // interval (out of this run's range).
                let retry = now_ms + self.settings.redrive_backoff_ms;
                if let Err(e) = self.ledger.reschedule(DueItem::Drift(pk), &token, retry).await {
                    tracing::warn!(item = %pk, error = %e, "drift check not rescheduled; next look after the interval");
                }
            }
        }
        true
    }

    /// Compares one entitlement with Stripe; on drift, submits a
    /// reconciliation event through the normal pipeline.
    /// A provider that cannot answer is an error (counted; the check is
    /// retried after the re-drive backoff).
    async fn check_entitlement(
        &self,
        item: &DriftItem,
        source: &dyn SubscriptionSource,
        now_ms: i64,
    ) -> Result<Drift, PortError> {
        let (sub, customer, endpoint, tenant) =
            (item.subscription.clone(), item.customer.clone(), item.endpoint.clone(), item.tenant.clone());
        if sub.is_empty() || endpoint.is_empty() {
            return Ok(Drift::None);
        }
        let fetched = match source.subscription(&sub).await {
            Ok(f) => f,
            Err(e) => return Err(PortError::Unavailable { service: "provider", message: format!("{sub}: {e}") }),
        };
        let (status, seats) = match &fetched.object {
            Some(s) => (s.status.clone(), s.seats),
            None => ("deleted".to_owned(), 0),
        };
        if item.status.as_deref() == Some(status.as_str()) && item.seats == Some(seats) {
            return Ok(Drift::None);
        }
        metrics::counter!("drift_found", "projection" => "entitlements").increment(1);
        tracing::warn!(subscription = %sub, local_status = item.status.as_deref().unwrap_or(""), provider_status = %status,
            local_seats = item.seats.unwrap_or(-1), provider_seats = seats, "drift found; repairing through the pipeline");
        // One identity per drift instance (the local state's source event and
        // the provider's answer): a check retried after a lost acknowledgement
        // or a crash meets its own repair record instead of making another.
        let instance = payload_hash(format!("{}|{status}|{seats}", item.event_id).as_bytes());
        let event_id = format!("recon:{sub}:{}", &instance[..16]);
        let body = serde_json::json!({
            "id": event_id, "object": "event", "type": "customer.subscription.reconciled",
            "data": {"object": {"id": sub, "object": "subscription", "customer": customer}},
        })
        .to_string()
        .into_bytes();
        let key = EventKey::new("stripe", &endpoint, &event_id);
        let hash = payload_hash(&body);
        let expires_at = crate::policy::expires_at(now_ms, self.settings.retention_days);
        let event = NewEvent {
            key: key.clone(),
            provider: "stripe".into(),
            endpoint,
            tenant,
            event_id,
            event_type: Some("customer.subscription.reconciled".into()),
            payload_hash: hash.clone(),
            content_hash: crate::verify::hashes::content_hash("stripe", &body),
            received_at_ms: now_ms,
            expires_at,
            shard: key.shard(self.ledger.shards()),
            send: SendLease { token: self.ambient.token(), until_ms: now_ms + SEND_LEASE_MS },
            via: crate::ledger::Via::Reconciliation,
        };
        // The repair's identity is fixed by the drift instance, so any
        // earlier attempt at this repair claimed the same record: our own
        // claim whose acknowledgement was lost (the SDK retry then meets it),
        // or a run that died before storing or sending. "Already exists"
        // never means "done": a missing payload is stored and a record never
        // sent is sent (a duplicate on the queue is absorbed by the lease).
        let (store, send) = match self.ledger.claim(&event, &body).await? {
            // The claim wrote the payload with the record.
            Claim::New => (false, true),
            Claim::Existing(old) => (
                !old.payload_stored && old.payload_hash == hash && !old.status.is_terminal(),
                old.status == Status::Received && old.enqueued_at_ms.is_none(),
            ),
        };
        if store {
            self.ledger.store_payload(&key, &hash, &body, expires_at).await?;
        }
        if send {
            self.queue.send_with_payload(&key, &body).await?;
            self.ledger.mark_enqueued(&key, now_ms).await?;
            metrics::counter!("drift_repaired", "projection" => "entitlements").increment(1);
            return Ok(Drift::Repaired);
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
mod tests {
    //! The reconciler's decisions against in-memory ports: a ledger with the
    //! DynamoDB adapter's conditions (`adapters::dynamodb::{claim, due}` and
    //! `conditions`), a recording work queue, a scripted dispatcher and a
    //! scripted provider. Every port can be made to fail on chosen calls.

    use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::identity::shard_of;
    use crate::ledger::{Attention, DuePage, DueRecord, ExistingRecord};
    use crate::policy::REDRIVE_GRACE_MS;
    use crate::ports::Ledger;
    use crate::projection::fetch::{Fetched, ProviderError, Subscription, SubscriptionFuture};

    const NOW: i64 = 1_700_000_000_000;
    const SHARDS: u32 = 4;
    const BACKOFF: i64 = 300_000;
    const INTERVAL: i64 = 3_600_000;
    const GRACE: i64 = 60_000;
    const ALWAYS: u32 = u32::MAX;

    fn settings() -> ReconcilerSettings {
        ReconcilerSettings {
            max_items: 500,
            redrive_backoff_ms: BACKOFF,
            drift_interval_ms: INTERVAL,
            outbox_grace_ms: GRACE,
            retention_days: 30,
            lookahead_ms: BACKOFF,
        }
    }

    /// A deadline no test reaches.
    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3_600)
    }

    fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn key(id: &str) -> EventKey {
        EventKey::new("stripe", "billing", id)
    }

    /// Event ids whose keys fall in `shard`.
    fn ids_in_shard(shard: u32, n: usize) -> Vec<String> {
        (0..).map(|i| format!("evt_{i}")).filter(|id| key(id).shard(SHARDS) == shard).take(n).collect()
    }

    // ------------------------------------------------------------ faults, log

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Fail {
        Down,
        Throttled,
    }

    impl Fail {
        fn error(self, service: &'static str) -> PortError {
            match self {
                Fail::Down => PortError::Unavailable { service, message: "injected".into() },
                Fail::Throttled => PortError::Throttled { service },
            }
        }
    }

    /// Fails the next `times` calls of `op` (on `key`, or on any key).
    struct Fault {
        op: &'static str,
        key: Option<String>,
        times: u32,
        kind: Fail,
    }

    #[derive(Default)]
    struct Faults(Vec<Fault>);

    impl Faults {
        fn add(&mut self, op: &'static str, key: Option<&str>, times: u32, kind: Fail) {
            self.0.push(Fault { op, key: key.map(str::to_owned), times, kind });
        }

        fn trip(&mut self, op: &str, key: &str, service: &'static str) -> Result<(), PortError> {
            let hit =
                self.0.iter_mut().find(|f| f.op == op && f.times > 0 && f.key.as_deref().is_none_or(|k| k == key));
            match hit {
                Some(f) => {
                    f.times -= 1;
                    Err(f.kind.error(service))
                }
                None => Ok(()),
            }
        }
    }

    /// What the ports did, in order, across all of them (`"<op> <item>"`).
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<String>>>);

    impl Log {
        fn push(&self, entry: String) {
            self.0.lock().unwrap().push(entry);
        }

        fn entries(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }

        fn count(&self, entry: &str) -> usize {
            self.0.lock().unwrap().iter().filter(|e| *e == entry).count()
        }

        fn ops(&self, op: &str) -> Vec<String> {
            let prefix = format!("{op} ");
            self.0.lock().unwrap().iter().filter_map(|e| e.strip_prefix(&prefix).map(str::to_owned)).collect()
        }

        fn clear(&self) {
            self.0.lock().unwrap().clear();
        }
    }

    /// An index page as the `due` index returns it: up to `limit` (clamped
    /// to 1..=100, as the adapter does), oldest first.
    fn page<T>(mut due: Vec<(i64, String, T)>, limit: usize) -> Vec<T> {
        due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        due.into_iter().take(limit.clamp(1, 100)).map(|(_, _, t)| t).collect()
    }

    // ------------------------------------------------------------- the ledger

    /// A ledger record (`sk = "meta"`) with the attributes the conditions read.
    #[derive(Debug, Clone)]
    struct Rec {
        status: Status,
        shard: u32,
        /// In the `due` index while set.
        due_at: Option<i64>,
        received_at: i64,
        enqueued_at: Option<i64>,
        payload_hash: String,
        payload_stored: bool,
        content_hash: Option<String>,
        send_token: Option<String>,
        send_lease_until: Option<i64>,
        claim_token: Option<String>,
        redrives: u32,
        duplicates: u32,
        conflicts: u32,
        /// A PROCESSING record's lease end (`None`: lapsed long ago).
        lease_expires_at: Option<i64>,
    }

    impl Rec {
        fn new(status: Status, shard: u32, received_at: i64) -> Self {
            Self {
                status,
                shard,
                due_at: (!status.is_terminal()).then_some(received_at + REDRIVE_GRACE_MS),
                received_at,
                enqueued_at: None,
                payload_hash: "h".into(),
                payload_stored: true,
                content_hash: None,
                send_token: None,
                send_lease_until: None,
                claim_token: None,
                redrives: 0,
                duplicates: 0,
                conflicts: 0,
                lease_expires_at: None,
            }
        }
    }

    /// An entitlement projection item in the `ent#…` shards of the index.
    #[derive(Debug, Clone)]
    struct Ent {
        item: DriftItem,
        shard: u32,
        claim_token: Option<String>,
    }

    #[derive(Default)]
    struct Store {
        records: BTreeMap<String, Rec>,
        payloads: BTreeMap<(String, String), Vec<u8>>,
        ents: BTreeMap<String, Ent>,
        faults: Faults,
        /// Items another run claims just before ours (its next look).
        races: HashMap<String, i64>,
        tokens: u64,
        /// Every `due` query: (partition, shard).
        queries: Vec<(DuePartition, u32)>,
        /// Index lag: the `due_at` the index still shows for a record.
        stale: HashMap<String, i64>,
    }

    impl Store {
        /// `conditions::claim_due`: only if `due_at` still equals `seen`.
        fn claim_due(&mut self, pk: &str, seen: i64, next: i64, token: &str) -> bool {
            if let Some(r) = self.records.get_mut(pk) {
                if r.due_at == Some(seen) {
                    r.due_at = Some(next);
                    r.claim_token = Some(token.to_owned());
                    r.redrives += 1;
                    return true;
                }
            } else if let Some(e) = self.ents.get_mut(pk) {
                if e.item.due_at_ms == seen {
                    e.item.due_at_ms = next;
                    e.claim_token = Some(token.to_owned());
                    return true;
                }
            }
            false
        }
    }

    /// A conditional update refused by `update_meta`: an error, as in DynamoDB.
    fn refused() -> PortError {
        PortError::Unavailable { service: "dynamodb", message: "ConditionalCheckFailedException".into() }
    }

    fn pk_of<'a>(item: &DueItem<'a>) -> &'a str {
        match item {
            DueItem::Record(k) => k.as_str(),
            DueItem::Drift(pk) => pk,
        }
    }

    #[derive(Clone)]
    struct MemLedger {
        store: Arc<Mutex<Store>>,
        /// The outbox items live in the same table: the attention count sees them.
        outbox: Arc<Mutex<Outbox>>,
        log: Log,
    }

    impl MemLedger {
        fn lock(&self) -> MutexGuard<'_, Store> {
            self.store.lock().unwrap()
        }
    }

    impl Ledger for MemLedger {
        async fn claim(&self, event: &NewEvent, body: &[u8]) -> Result<Claim, PortError> {
            let mut s = self.lock();
            s.faults.trip("claim", event.key.as_str(), "dynamodb")?;
            if let Some(r) = s.records.get(event.key.as_str()) {
                // Our own put retried after a lost acknowledgement meets its send token.
                if r.send_token.as_deref() == Some(event.send.token.as_str()) {
                    return Ok(Claim::New);
                }
                return Ok(Claim::Existing(ExistingRecord {
                    status: r.status,
                    payload_hash: r.payload_hash.clone(),
                    content_hash: r.content_hash.clone(),
                    enqueued_at_ms: r.enqueued_at,
                    received_at_ms: r.received_at,
                    send_lease_until_ms: r.send_lease_until,
                    payload_stored: r.payload_stored,
                    via: crate::ledger::Via::Webhook,
                }));
            }
            let mut rec = Rec::new(Status::Received, event.shard, event.received_at_ms);
            rec.payload_hash = event.payload_hash.clone();
            // The record and its payload item commit together.
            rec.payload_stored = true;
            s.payloads.insert((event.key.as_str().to_owned(), event.payload_hash.clone()), body.to_vec());
            rec.content_hash = Some(event.content_hash.clone());
            rec.send_token = Some(event.send.token.clone());
            rec.send_lease_until = Some(event.send.until_ms);
            s.records.insert(event.key.as_str().to_owned(), rec);
            self.log.push(format!("claim {}", event.key));
            Ok(Claim::New)
        }

        async fn store_payload(
            &self,
            key: &EventKey,
            payload_hash: &str,
            body: &[u8],
            _expires_at: i64,
        ) -> Result<(), PortError> {
            let mut s = self.lock();
            s.faults.trip("store_payload", key.as_str(), "dynamodb")?;
            s.payloads.insert((key.as_str().to_owned(), payload_hash.to_owned()), body.to_vec());
            match s.records.get_mut(key.as_str()) {
                Some(r) if r.payload_hash == payload_hash => r.payload_stored = true,
                _ => return Err(refused()),
            }
            self.log.push(format!("store_payload {key}"));
            Ok(())
        }

        async fn adopt_payload(
            &self,
            key: &EventKey,
            old_hash: &str,
            new_hash: &str,
            body: &[u8],
            _expires_at: i64,
            conflict: bool,
        ) -> Result<bool, PortError> {
            let mut s = self.lock();
            s.faults.trip("adopt_payload", key.as_str(), "dynamodb")?;
            s.payloads.insert((key.as_str().to_owned(), new_hash.to_owned()), body.to_vec());
            let Some(r) = s.records.get_mut(key.as_str()) else { return Ok(false) };
            if r.payload_hash == old_hash && !r.payload_stored {
                r.conflicts += u32::from(conflict);
                r.payload_hash = new_hash.to_owned();
                r.payload_stored = true;
                return Ok(true);
            }
            Ok(r.payload_hash == new_hash && r.payload_stored)
        }

        async fn take_send_lease(&self, key: &EventKey, lease: &SendLease, now_ms: i64) -> Result<bool, PortError> {
            let mut s = self.lock();
            s.faults.trip("take_send_lease", key.as_str(), "dynamodb")?;
            let Some(r) = s.records.get_mut(key.as_str()) else { return Ok(false) };
            if r.enqueued_at.is_none() && r.send_lease_until.is_none_or(|until| until < now_ms) {
                r.send_token = Some(lease.token.clone());
                r.send_lease_until = Some(lease.until_ms);
                return Ok(true);
            }
            Ok(r.send_token.as_deref() == Some(lease.token.as_str()) && r.enqueued_at.is_none())
        }

        async fn release_send_lease(&self, key: &EventKey, lease: &SendLease) -> Result<(), PortError> {
            let mut s = self.lock();
            s.faults.trip("release_send_lease", key.as_str(), "dynamodb")?;
            if let Some(r) = s.records.get_mut(key.as_str()) {
                if r.send_token.as_deref() == Some(lease.token.as_str()) {
                    r.send_lease_until = None;
                }
            }
            Ok(())
        }

        async fn mark_enqueued(&self, key: &EventKey, at_ms: i64) -> Result<(), PortError> {
            let mut s = self.lock();
            s.faults.trip("mark_enqueued", key.as_str(), "dynamodb")?;
            let r = s.records.get_mut(key.as_str()).ok_or_else(refused)?;
            r.enqueued_at = Some(at_ms);
            r.send_lease_until = None;
            self.log.push(format!("mark_enqueued {key}"));
            Ok(())
        }

        async fn note_duplicate(&self, key: &EventKey) -> Result<(), PortError> {
            let mut s = self.lock();
            s.faults.trip("note_duplicate", key.as_str(), "dynamodb")?;
            s.records.get_mut(key.as_str()).ok_or_else(refused)?.duplicates += 1;
            Ok(())
        }

        async fn flag_conflict(&self, key: &EventKey, _other_hash: &str, _at_ms: i64) -> Result<(), PortError> {
            let mut s = self.lock();
            s.faults.trip("flag_conflict", key.as_str(), "dynamodb")?;
            let r = s.records.get_mut(key.as_str()).ok_or_else(refused)?;
            r.conflicts += 1;
            r.duplicates += 1;
            Ok(())
        }
    }

    impl DueLedger for MemLedger {
        fn shards(&self) -> u32 {
            SHARDS
        }

        /// One partition per shard and kind: records, outbox items,
        /// entitlements; paged by `(due_at, pk)` as the index pages.
        async fn due(
            &self,
            partition: DuePartition,
            shard: u32,
            up_to: i64,
            limit: usize,
            after: Option<&DueCursor>,
        ) -> Result<DuePage, PortError> {
            let mut s = self.lock();
            s.faults.trip("due", partition.name(), "dynamodb")?;
            s.queries.push((partition, shard));
            let mut due: Vec<(i64, String, Due)> = Vec::new();
            match partition {
                DuePartition::Records => {
                    due.extend(s.records.iter().filter_map(|(pk, r)| match s.stale.get(pk).copied().or(r.due_at) {
                        Some(at) if r.shard == shard && at <= up_to => Some((
                            at,
                            pk.clone(),
                            Due::Record(DueRecord {
                                key: EventKey::from_stored(pk)?,
                                status: r.status,
                                enqueued: r.enqueued_at.is_some(),
                                due_at_ms: at,
                                received_at_ms: r.received_at,
                                lease_expires_at_ms: r.lease_expires_at,
                            }),
                        )),
                        _ => None,
                    }))
                }
                DuePartition::Checks => due.extend(
                    s.ents
                        .iter()
                        .filter(|(_, e)| e.shard == shard && e.item.due_at_ms <= up_to)
                        .map(|(pk, e)| (e.item.due_at_ms, pk.clone(), Due::Drift(e.item.clone()))),
                ),
                DuePartition::Outbox => {
                    let o = self.outbox.lock().unwrap();
                    due.extend(o.items.iter().filter_map(|(id, i)| match i.due_at {
                        Some(at) if i.shard == shard && at <= up_to => {
                            Some((at, id.clone(), Due::Outbox { id: id.clone(), due_at_ms: at }))
                        }
                        _ => None,
                    }));
                }
            }
            due.retain(|(at, pk, _)| after.is_none_or(|c| (*at, pk.as_str()) > (c.due_at_ms, c.pk.as_str())));
            due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            let limit = limit.clamp(1, 100);
            let next = (due.len() > limit).then(|| {
                let (at, pk, _) = &due[limit - 1];
                DueCursor { due_at_ms: *at, pk: pk.clone(), sk: String::new() }
            });
            Ok(DuePage { items: due.into_iter().take(limit).map(|(_, _, d)| d).collect(), next })
        }

        async fn claim_due(&self, item: DueItem<'_>, seen: i64, next: i64) -> Result<Option<String>, PortError> {
            let pk = pk_of(&item);
            let mut s = self.lock();
            s.faults.trip("claim_due", pk, "dynamodb")?;
            if let Some(theirs) = s.races.remove(pk) {
                // Another run read the same item and its claim landed first.
                s.claim_due(pk, seen, theirs, "another-run");
            }
            s.tokens += 1;
            let token = format!("claim-{}", s.tokens);
            if !s.claim_due(pk, seen, next, &token) {
                return Ok(None);
            }
            self.log.push(format!("claim_due {pk}"));
            Ok(Some(token))
        }

        async fn reschedule(&self, item: DueItem<'_>, token: &str, at: i64) -> Result<(), PortError> {
            let pk = pk_of(&item);
            let mut s = self.lock();
            s.faults.trip("reschedule", pk, "dynamodb")?;
            // `conditions::reschedule`: only while the claim token is still ours.
            let mut applied = false;
            if let Some(r) = s.records.get_mut(pk) {
                if r.claim_token.as_deref() == Some(token) {
                    r.due_at = Some(at);
                    applied = true;
                }
            } else if let Some(e) = s.ents.get_mut(pk) {
                if e.claim_token.as_deref() == Some(token) {
                    e.item.due_at_ms = at;
                    applied = true;
                }
            }
            if applied {
                self.log.push(format!("reschedule {pk}"));
            }
            Ok(())
        }

        async fn note_enqueued(&self, key: &EventKey, now_ms: i64) -> Result<(), PortError> {
            let mut s = self.lock();
            s.faults.trip("note_enqueued", key.as_str(), "dynamodb")?;
            // `conditions::note_redriven`: keeps an earlier note; a record gone is no error.
            if let Some(r) = s.records.get_mut(key.as_str()) {
                if r.enqueued_at.is_none() {
                    r.enqueued_at = Some(now_ms);
                    self.log.push(format!("note_enqueued {key}"));
                }
            }
            Ok(())
        }

        async fn attention(&self) -> Result<Attention, PortError> {
            let mut s = self.lock();
            s.faults.trip("attention", "", "dynamodb")?;
            let count = |st: Status| s.records.values().filter(|r| r.status == st).count() as u64;
            let (dead_letters, parked) = (count(Status::Dead), count(Status::Parked));
            Ok(Attention { dead_letters, parked, outbox_dead: self.outbox.lock().unwrap().dead })
        }
    }

    // -------------------------------------------------------------- the queue

    #[derive(Default)]
    struct Sends {
        attempts: Vec<String>,
        /// Outcomes of the next sends, in order (`None`: sent); then `faults`.
        script: VecDeque<Option<Fail>>,
        faults: Faults,
    }

    #[derive(Clone)]
    struct MemQueue {
        state: Arc<Mutex<Sends>>,
        log: Log,
    }

    impl WorkQueue for MemQueue {
        async fn send(&self, key: &EventKey) -> Result<(), PortError> {
            let mut q = self.state.lock().unwrap();
            q.attempts.push(key.to_string());
            if let Some(Some(kind)) = q.script.pop_front() {
                return Err(kind.error("sqs"));
            }
            q.faults.trip("send", key.as_str(), "sqs")?;
            self.log.push(format!("send {key}"));
            Ok(())
        }
    }

    // --------------------------------------------------------- the dispatcher

    enum Step {
        Out(Dispatched),
        Fail(Fail),
    }

    fn retrying() -> Step {
        Step::Out(Dispatched::Retrying { attempts: 2, error: "sns down".into() })
    }

    struct OutItem {
        shard: u32,
        /// In the `out#…` index while set.
        due_at: Option<i64>,
        /// Outcomes of the next dispatches (then `Published`).
        script: VecDeque<Step>,
    }

    #[derive(Default)]
    struct Outbox {
        items: BTreeMap<String, OutItem>,
        dead: u64,
        faults: Faults,
    }

    #[derive(Clone)]
    struct MemDispatch {
        state: Arc<Mutex<Outbox>>,
        log: Log,
    }

    impl Dispatch for MemDispatch {
        async fn dispatch(&self, id: &str, now_ms: i64) -> Result<Dispatched, PortError> {
            let mut o = self.state.lock().unwrap();
            let Outbox { items, dead, .. } = &mut *o;
            let Some(item) = items.get_mut(id) else { return Ok(Dispatched::Skipped) };
            self.log.push(format!("dispatch {id}"));
            let outcome = match item.script.pop_front().unwrap_or(Step::Out(Dispatched::Published)) {
                Step::Fail(kind) => return Err(kind.error("dynamodb")),
                Step::Out(outcome) => outcome,
            };
            match outcome {
                Dispatched::Published => item.due_at = None,
                Dispatched::Retrying { .. } => item.due_at = Some(now_ms + 60_000),
                Dispatched::Dead { .. } => {
                    item.due_at = None;
                    *dead += 1;
                }
                // Claimed by a live dispatcher meanwhile: due at its claim's lapse.
                Dispatched::Skipped => item.due_at = Some(now_ms + 30_000),
            }
            Ok(outcome)
        }

        async fn due(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
            let mut o = self.state.lock().unwrap();
            o.faults.trip("out_due", "", "dynamodb")?;
            let due = o
                .items
                .iter()
                .filter_map(|(id, i)| match i.due_at {
                    Some(at) if i.shard == shard && at <= up_to => Some((at, id.clone(), id.clone())),
                    _ => None,
                })
                .collect();
            Ok(page(due, limit))
        }
    }

    // ----------------------------------------------------------- the provider

    #[derive(Debug, Clone)]
    enum Answer {
        Is(&'static str, i64),
        Gone,
        Down,
    }

    struct MemSource {
        answers: Mutex<HashMap<String, Answer>>,
        log: Log,
    }

    impl SubscriptionSource for MemSource {
        fn subscription<'a>(&'a self, id: &'a str) -> SubscriptionFuture<'a> {
            Box::pin(async move {
                self.log.push(format!("fetch {id}"));
                let answer = self.answers.lock().unwrap().get(id).cloned().unwrap_or(Answer::Gone);
                match answer {
                    Answer::Is(status, seats) => Ok(Fetched {
                        object: Some(Subscription {
                            id: id.to_owned(),
                            customer: "cus_1".into(),
                            status: status.into(),
                            seats,
                        }),
                        version: 1,
                    }),
                    Answer::Gone => Ok(Fetched { object: None, version: 1 }),
                    Answer::Down => Err(ProviderError::Unavailable("injected".into())),
                }
            })
        }
    }

    // -------------------------------------------------------------- the world

    struct World {
        ledger: MemLedger,
        queue: MemQueue,
        outbox: MemDispatch,
        source: Arc<MemSource>,
        log: Log,
        settings: ReconcilerSettings,
    }

    impl World {
        fn new() -> Self {
            let log = Log::default();
            let outbox: Arc<Mutex<Outbox>> = Arc::default();
            Self {
                ledger: MemLedger { store: Arc::default(), outbox: outbox.clone(), log: log.clone() },
                queue: MemQueue { state: Arc::default(), log: log.clone() },
                outbox: MemDispatch { state: outbox, log: log.clone() },
                source: Arc::new(MemSource { answers: Mutex::default(), log: log.clone() }),
                log,
                settings: settings(),
            }
        }

        fn with(settings: ReconcilerSettings) -> Self {
            Self { settings, ..Self::new() }
        }

        fn reconciler(&self) -> Reconciler<MemQueue, MemLedger, MemDispatch> {
            let source: Arc<dyn SubscriptionSource> = self.source.clone();
            Reconciler::new(
                self.ledger.clone(),
                self.queue.clone(),
                Some(self.outbox.clone()),
                Some(source),
                self.settings,
            )
        }

        async fn run(&self, now_ms: i64) -> Summary {
            self.reconciler().run(now_ms, far()).await
        }

        /// A ledger record in the `due` index (`enqueued_at`: sent then).
        fn record(&self, id: &str, status: Status, enqueued_at: Option<i64>, due_at: i64) -> EventKey {
            let k = key(id);
            let mut rec = Rec::new(status, k.shard(SHARDS), due_at - REDRIVE_GRACE_MS);
            rec.due_at = (!status.is_terminal()).then_some(due_at);
            rec.enqueued_at = enqueued_at;
            self.ledger.lock().records.insert(k.as_str().to_owned(), rec);
            k
        }

        fn rec(&self, k: &EventKey) -> Rec {
            self.ledger.lock().records.get(k.as_str()).cloned().expect("record")
        }

        fn records(&self) -> usize {
            self.ledger.lock().records.len()
        }

        /// An entitlement last checked long ago, locally `status`/`seats`.
        fn entitlement(&self, sub: &str, status: &str, seats: i64) -> String {
            let pk = format!("ent#{sub}");
            let item = DriftItem {
                pk: pk.clone(),
                due_at_ms: NOW - self.settings.drift_interval_ms - 10,
                subscription: sub.into(),
                customer: "cus_1".into(),
                endpoint: "billing".into(),
                tenant: "t1".into(),
                event_id: format!("evt_local_{sub}"),
                status: Some(status.into()),
                seats: Some(seats),
            };
            self.ledger.lock().ents.insert(pk.clone(), Ent { item, shard: shard_of(sub, SHARDS), claim_token: None });
            pk
        }

        fn ent(&self, pk: &str) -> DriftItem {
            self.ledger.lock().ents.get(pk).map(|e| e.item.clone()).expect("entitlement")
        }

        fn answer(&self, sub: &str, answer: Answer) {
            self.source.answers.lock().unwrap().insert(sub.into(), answer);
        }

        fn outbox_item(&self, id: &str, due_at: i64, script: Vec<Step>) {
            let item = OutItem { shard: shard_of(id, SHARDS), due_at: Some(due_at), script: script.into() };
            self.outbox.state.lock().unwrap().items.insert(id.into(), item);
        }

        /// Makes the next `times` ledger calls of `op` fail.
        fn fail(&self, op: &'static str, on: Option<&str>, times: u32, kind: Fail) {
            self.ledger.lock().faults.add(op, on, times, kind);
        }

        /// Another run claims `pk` just before this one, moving it to `theirs`.
        fn race(&self, pk: &str, theirs: i64) {
            self.ledger.lock().races.insert(pk.into(), theirs);
        }

        fn script_sends(&self, outcomes: impl IntoIterator<Item = Option<Fail>>) {
            self.queue.state.lock().unwrap().script.extend(outcomes);
        }

        fn fail_send(&self, on: &str, times: u32, kind: Fail) {
            self.queue.state.lock().unwrap().faults.add("send", Some(on), times, kind);
        }

        fn sent(&self) -> Vec<String> {
            self.log.ops("send")
        }

        fn attempts(&self) -> Vec<String> {
            self.queue.state.lock().unwrap().attempts.clone()
        }

        fn dispatched(&self) -> Vec<String> {
            self.log.ops("dispatch")
        }

        /// The redrive phase's records (and whatever else) are due; one
        /// outbox item and one drifted entitlement wait behind them.
        fn other_phases(&self) -> String {
            self.outbox_item("out_1", NOW - GRACE - 1, vec![]);
            let pk = self.entitlement("sub_other", "active", 1);
            self.answer("sub_other", Answer::Is("active", 2));
            pk
        }
    }

    /// The repair record's key for a drift instance (`recon:<sub>:<hash>`).
    fn repair_key(local_event: &str, sub: &str, status: &str, seats: i64) -> EventKey {
        let instance = payload_hash(format!("{local_event}|{status}|{seats}").as_bytes());
        EventKey::new("stripe", "billing", &format!("recon:{sub}:{}", &instance[..16]))
    }

    fn s(k: &EventKey) -> String {
        k.to_string()
    }

    // ------------------------------------------------------- re-drive selection

    #[tokio::test]
    async fn never_sent_record_is_sent_then_noted_enqueued() {
        let w = World::new();
        let k = w.record("evt_1", Status::Received, None, NOW - 1);
        let summary = w.run(NOW).await;
        assert_eq!(w.log.entries(), [format!("claim_due {k}"), format!("send {k}"), format!("note_enqueued {k}")]);
        assert_eq!(w.rec(&k).enqueued_at, Some(NOW));
        assert_eq!(summary.redriven, counts(&[("never_sent", 1)]));
        assert!(summary.complete && summary.errors.is_empty() && summary.evidence, "{summary:?}");
    }

    #[tokio::test]
    async fn sent_but_not_picked_up_record_is_sent_again_without_a_new_note() {
        let w = World::new();
        let k = w.record("evt_1", Status::Received, Some(NOW - 100_000), NOW - 1);
        let summary = w.run(NOW).await;
        assert_eq!(w.sent(), [s(&k)]);
        assert!(w.log.ops("note_enqueued").is_empty());
        assert_eq!(w.rec(&k).enqueued_at, Some(NOW - 100_000), "the first send time is kept");
        assert_eq!(summary.redriven, counts(&[("not_picked_up", 1)]));
    }

    #[tokio::test]
    async fn expired_lease_is_redriven_and_counted_as_stuck() {
        let w = World::new();
        let k = w.record("evt_1", Status::Processing, Some(NOW - 100_000), NOW - 1);
        let summary = w.run(NOW).await;
        assert_eq!(w.sent(), [s(&k)]);
        assert_eq!(w.rec(&k).status, Status::Processing, "the reconciler never changes a status");
        assert_eq!(summary.stuck_leases, 1);
        assert_eq!(summary.redriven, counts(&[("lease_expired", 1)]));
    }

    #[tokio::test]
    async fn a_live_lease_is_looked_at_again_when_it_ends_not_redriven() {
        // The lease does not move a record in the due index: a worker may
        // still hold it when its due time comes.
        let w = World::new();
        let k = w.record("evt_1", Status::Processing, Some(NOW - 100_000), NOW - 1);
        w.ledger.lock().records.get_mut(k.as_str()).expect("record").lease_expires_at = Some(NOW + 20_000);
        let summary = w.run(NOW).await;
        assert!(w.sent().is_empty(), "not re-driven while leased");
        assert_eq!(w.rec(&k).due_at, Some(NOW + 20_001), "due again just after the lease's end");
        assert_eq!((summary.stuck_leases, summary.redriven.len()), (0, 0));
        // The worker died: once the lease has ended, it is re-driven.
        w.run(NOW + 20_001).await;
        assert_eq!(w.sent(), [s(&k)]);
    }

    #[tokio::test]
    async fn a_refused_claim_on_a_live_lease_is_not_acted_on_and_the_shard_is_read_once() {
        // The index lags: it still shows the leased record due at its old
        // time after another run moved it to the lease's end. Our claim is
        // refused; the run neither counts it nor reads the page again.
        let w = World::new();
        let k = w.record("evt_1", Status::Processing, Some(NOW - 100_000), NOW - 1);
        {
            let mut st = w.ledger.lock();
            let r = st.records.get_mut(k.as_str()).expect("record");
            r.lease_expires_at = Some(NOW + 20_000);
            r.due_at = Some(NOW + 20_001);
            st.stale.insert(k.as_str().to_owned(), NOW - 1);
        }
        let other = w.record(&ids_in_shard(k.shard(SHARDS), 2)[1], Status::Received, None, NOW - 1);
        let deadline = Instant::now() + Duration::from_secs(5);
        let summary = w.reconciler().run(NOW, deadline).await;
        assert!(Instant::now() < deadline, "the run ended by itself");
        assert!(summary.complete && summary.errors.is_empty(), "{summary:?}");
        assert_eq!(w.sent(), [s(&other)]);
        let records_queries = w.ledger.lock().queries.iter().filter(|(p, _)| *p == DuePartition::Records).count();
        assert_eq!(records_queries, SHARDS as usize, "one page per shard");
    }

    #[tokio::test]
    async fn a_drift_backlog_never_keeps_a_record_from_being_redriven() {
        // 4 shards, budget 10, 40 overdue entitlements per shard due before a
        // never-sent record in each shard; the provider answering, then
        // failing: every record is re-driven in the first run.
        for provider_down in [false, true] {
            let w = World::with(ReconcilerSettings { max_items: 10, ..settings() });
            for shard in 0..SHARDS {
                let subs: Vec<String> = (0..)
                    .map(|i| format!("sub_{shard}_{i}"))
                    .filter(|sub| shard_of(sub, SHARDS) == shard)
                    .take(40)
                    .collect();
                for sub in subs {
                    let pk = w.entitlement(&sub, "active", 1);
                    w.answer(&sub, if provider_down { Answer::Down } else { Answer::Is("active", 1) });
                    w.ledger.lock().ents.get_mut(&pk).expect("entitlement").item.due_at_ms = NOW - 3_600_000;
                }
            }
            let keys: Vec<EventKey> = (0..SHARDS)
                .map(|shard| w.record(&ids_in_shard(shard, 1)[0], Status::Received, None, NOW - 1_000))
                .collect();
            let first = w.run(NOW).await;
            let mut sent = w.sent();
            sent.sort();
            let mut want: Vec<String> = keys.iter().map(s).collect();
            want.sort();
            assert_eq!(sent, want, "provider down: {provider_down}: {first:?}");
            assert_eq!(first.redriven, counts(&[("never_sent", 4)]));
            assert!(first.drift_checked >= 1, "the re-checks act too: {first:?}");
        }
    }

    #[tokio::test]
    async fn a_record_backlog_leaves_the_outbox_and_the_rechecks_their_shares() {
        let w = World::with(ReconcilerSettings { max_items: 10, ..settings() });
        for shard in 0..SHARDS {
            for id in ids_in_shard(shard, 100) {
                w.record(&id, Status::Received, None, NOW - 1_000);
            }
        }
        for i in 0..12 {
            w.outbox_item(&format!("out_{i}"), NOW - GRACE - 1, vec![]);
            let sub = format!("sub_{i}");
            w.entitlement(&sub, "active", 1);
            w.answer(&sub, Answer::Is("active", 1));
        }
        for run in 0..3 {
            let summary = w.run(NOW + run).await;
            assert_eq!(summary.redriven.values().sum::<u64>(), 6, "run {run}: {summary:?}");
            assert_eq!((summary.outbox_republished, summary.drift_checked), (3, 1), "run {run}: {summary:?}");
            assert!(!summary.complete);
        }
    }

    // ---------------------------------------------------- the oldest open record

    #[tokio::test]
    async fn the_oldest_open_record_is_measured_when_its_retry_is_not_yet_due() {
        // A RETRYABLE record received 2 h ago whose retry is due just after
        // now, then just before, and so on; a younger record due before it
        // in the same shard: every run reports at least 2 h.
        let w = World::new();
        let old = key(&ids_in_shard(1, 2)[0]);
        let young = w.record(&ids_in_shard(1, 2)[1], Status::Retryable, Some(1), NOW - 10_000);
        w.ledger.lock().records.get_mut(young.as_str()).expect("young").received_at = NOW - 60_000;
        let mut rec = Rec::new(Status::Retryable, 1, NOW - 7_200_000);
        rec.enqueued_at = Some(1);
        w.ledger.lock().records.insert(old.as_str().to_owned(), rec);
        for run in 0..6_i64 {
            let now = NOW + run * 1_000;
            let due = if run % 2 == 0 { now + 500 } else { now - 500 };
            w.ledger.lock().records.get_mut(old.as_str()).expect("old").due_at = Some(due);
            let summary = w.run(now).await;
            let age = summary.oldest_unprocessed_age_ms.unwrap_or(0);
            assert!(age >= 7_200_000, "run {run}: {age} ms: {summary:?}");
            assert_eq!(summary.incomplete_shards, 0);
        }
    }

    #[tokio::test]
    async fn a_shard_with_more_open_records_than_a_page_is_a_lower_bound_and_says_so() {
        let w = World::with(ReconcilerSettings { max_items: 10, ..settings() });
        for id in ids_in_shard(2, 150) {
            w.record(&id, Status::Retryable, Some(1), NOW + 1_000);
        }
        let gauges = Gauges::default();
        let _local = metrics::set_default_local_recorder(&gauges);
        let summary = w.run(NOW).await;
        assert_eq!(summary.incomplete_shards, 1, "{summary:?}");
        let set = gauges.0.lock().unwrap().clone();
        assert_eq!(set.get("reconciler_incomplete"), Some(&1.0));
        assert!(set.contains_key("oldest_unprocessed_age"));
        let idle = World::new();
        let gauges = Gauges::default();
        let _local = metrics::set_default_local_recorder(&gauges);
        let summary = idle.run(NOW).await;
        assert_eq!((summary.incomplete_shards, summary.oldest_unprocessed_age_ms), (0, None));
        let set = gauges.0.lock().unwrap().clone();
        assert_eq!((set.get("reconciler_incomplete"), set.get("oldest_unprocessed_age")), (Some(&0.0), Some(&0.0)));
    }

    #[tokio::test]
    async fn due_retry_is_redriven() {
        let w = World::new();
        let k = w.record("evt_1", Status::Retryable, Some(NOW - 100_000), NOW - 1);
        let summary = w.run(NOW).await;
        assert_eq!(w.sent(), [s(&k)]);
        assert_eq!(summary.redriven, counts(&[("retry_due", 1)]));
        assert_eq!(summary.stuck_leases, 0);
    }

    #[tokio::test]
    async fn records_not_yet_due_are_left_untouched() {
        let w = World::new();
        let later: Vec<EventKey> = [Status::Received, Status::Processing, Status::Retryable]
            .into_iter()
            .enumerate()
            .map(|(i, st)| w.record(&format!("evt_later_{i}"), st, Some(NOW - 1), NOW + 1))
            .collect();
        let never_sent_later = w.record("evt_later_new", Status::Received, None, NOW + 1);
        let due_now = w.record("evt_now", Status::Received, None, NOW);
        let summary = w.run(NOW).await;
        assert_eq!(w.sent(), [s(&due_now)], "due at `now` is due, one ms later is not");
        for k in later.iter().chain([&never_sent_later]) {
            let r = w.rec(k);
            assert_eq!((r.due_at, r.redrives, r.claim_token.as_deref()), (Some(NOW + 1), 0, None), "{k}");
        }
        assert_eq!(w.rec(&never_sent_later).enqueued_at, None);
        assert_eq!(summary.redriven, counts(&[("never_sent", 1)]));
    }

    #[tokio::test]
    async fn every_claimed_record_is_looked_at_again_after_the_backoff() {
        let w = World::new();
        let keys = [
            w.record("evt_1", Status::Received, None, NOW - 5),
            w.record("evt_2", Status::Received, Some(NOW - 90_000), NOW - 4),
            w.record("evt_3", Status::Processing, Some(NOW - 90_000), NOW - 3),
            w.record("evt_4", Status::Retryable, Some(NOW - 90_000), NOW - 2),
        ];
        let summary = w.run(NOW).await;
        for k in &keys {
            let r = w.rec(k);
            assert_eq!(r.due_at, Some(NOW + BACKOFF), "{k}");
            assert!(r.claim_token.is_some() && r.redrives == 1, "{k}: {r:?}");
        }
        let mut sent = w.sent();
        sent.sort();
        assert_eq!(sent, keys.iter().map(s).collect::<Vec<_>>());
        assert_eq!(summary.redriven.values().sum::<u64>(), 4);
    }

    #[tokio::test]
    async fn a_record_claimed_by_a_concurrent_run_is_not_sent() {
        let w = World::new();
        let theirs = w.record("evt_a", Status::Received, None, NOW - 2);
        let ours = w.record("evt_b", Status::Retryable, Some(NOW - 90_000), NOW - 1);
        w.race(theirs.as_str(), NOW + 7);
        let summary = w.run(NOW).await;
        assert_eq!(w.sent(), [s(&ours)]);
        let r = w.rec(&theirs);
        assert_eq!((r.due_at, r.claim_token.as_deref()), (Some(NOW + 7), Some("another-run")), "their claim stands");
        assert_eq!(r.enqueued_at, None, "not noted by a run that did not send it");
        assert_eq!(summary.redriven, counts(&[("retry_due", 1)]));
        assert!(summary.complete && summary.errors.is_empty(), "{summary:?}");
    }

    #[tokio::test]
    async fn a_second_run_at_the_same_time_finds_nothing_to_do() {
        let w = World::new();
        w.record("evt_1", Status::Received, None, NOW - 3);
        w.record("evt_2", Status::Processing, Some(NOW - 90_000), NOW - 2);
        w.record("evt_3", Status::Retryable, Some(NOW - 90_000), NOW - 1);
        let first = w.run(NOW).await;
        assert_eq!(first.redriven.values().sum::<u64>(), 3);
        w.log.clear();
        let second = w.run(NOW).await;
        assert!(w.log.entries().is_empty(), "{:?}", w.log.entries());
        assert!(second.redriven.is_empty() && second.stuck_leases == 0, "{second:?}");
        assert!(second.complete && second.errors.is_empty(), "{second:?}");
    }

    #[tokio::test]
    async fn a_run_after_the_backoff_sends_again_what_is_still_not_done() {
        let w = World::new();
        let never_sent = w.record("evt_1", Status::Received, None, NOW - 2);
        let stuck = w.record("evt_2", Status::Processing, Some(NOW - 90_000), NOW - 1);
        w.run(NOW).await;
        w.log.clear();
        assert!(w.run(NOW + BACKOFF - 1).await.redriven.is_empty());
        let again = w.run(NOW + BACKOFF).await;
        let mut sent = w.sent();
        sent.sort();
        assert_eq!(sent, [s(&never_sent), s(&stuck)]);
        // Noted at its first re-drive, it is now "sent, not picked up", and keeps its note.
        assert_eq!(again.redriven, counts(&[("lease_expired", 1), ("not_picked_up", 1)]));
        assert_eq!(w.rec(&never_sent).enqueued_at, Some(NOW));
        assert_eq!(w.rec(&never_sent).due_at, Some(NOW + 2 * BACKOFF));
    }

    #[tokio::test]
    async fn redrive_pages_through_a_shard_larger_than_one_page() {
        let w = World::new();
        let ids = ids_in_shard(2, 150);
        for (i, id) in ids.iter().enumerate() {
            w.record(id, Status::Received, Some(NOW - 90_000), NOW - 1 - i as i64);
        }
        let summary = w.run(NOW).await;
        let sent: HashSet<String> = w.sent().into_iter().collect();
        assert_eq!((w.sent().len(), sent.len()), (150, 150), "each sent once");
        assert_eq!(summary.redriven, counts(&[("not_picked_up", 150)]));
        assert!(summary.complete);
    }

    // ------------------------------------------------------- failure isolation

    #[tokio::test]
    async fn a_failed_send_is_counted_and_the_record_stays_due() {
        let w = World::new();
        let failing = w.record("evt_a", Status::Received, None, NOW - 3);
        let others = [
            w.record("evt_b", Status::Retryable, Some(1), NOW - 2),
            w.record("evt_c", Status::Retryable, Some(1), NOW - 1),
        ];
        w.fail_send(failing.as_str(), 1, Fail::Down);
        let summary = w.run(NOW).await;
        let mut sent = w.sent();
        sent.sort();
        assert_eq!(sent, others.iter().map(s).collect::<Vec<_>>());
        assert_eq!(summary.errors, counts(&[("redrive", 1)]));
        assert_eq!(summary.redriven, counts(&[("retry_due", 2)]));
        assert!(summary.complete, "one failure does not stop the phase: {summary:?}");
        let r = w.rec(&failing);
        assert_eq!((r.enqueued_at, r.due_at), (None, Some(NOW + BACKOFF)), "not noted, due after the backoff");

        w.log.clear();
        let next = w.run(NOW + BACKOFF).await;
        assert!(w.sent().contains(&s(&failing)));
        assert_eq!(w.rec(&failing).enqueued_at, Some(NOW + BACKOFF));
        assert_eq!(next.redriven.get("never_sent"), Some(&1));
        assert!(next.errors.is_empty());
    }

    #[tokio::test]
    async fn a_throttled_send_stops_the_redrive_phase_but_outbox_and_drift_still_run() {
        let w = World::new();
        let keys: Vec<EventKey> =
            (0..3).map(|i| w.record(&format!("evt_{i}"), Status::Received, Some(1), NOW - 1 - i)).collect();
        w.other_phases();
        w.script_sends([Some(Fail::Throttled)]);
        let summary = w.run(NOW).await;
        assert_eq!(summary.errors, counts(&[("redrive", 1)]));
        assert!(!summary.complete);
        assert!(summary.redriven.is_empty());
        let claimed = keys.iter().filter(|k| w.rec(k).claim_token.is_some()).count();
        assert_eq!(claimed, 1, "nothing after the throttled send is claimed");
        assert_eq!(w.attempts().len(), 2, "the throttled re-drive, then the drift repair");
        assert_eq!(summary.outbox_republished, 1);
        assert_eq!((summary.drift_checked, summary.drift_repaired), (1, 1));
        assert!(summary.evidence);
    }

    #[tokio::test]
    async fn max_consecutive_errors_in_a_row_stop_the_redrive_phase() {
        let w = World::new();
        let keys: Vec<EventKey> =
            (0..7).map(|i| w.record(&format!("evt_{i}"), Status::Received, Some(1), NOW - 1 - i)).collect();
        w.other_phases();
        w.script_sends((0..MAX_CONSECUTIVE_ERRORS).map(|_| Some(Fail::Down)));
        let summary = w.run(NOW).await;
        assert_eq!(summary.errors, counts(&[("redrive", u64::from(MAX_CONSECUTIVE_ERRORS))]));
        assert!(!summary.complete);
        let claimed = keys.iter().filter(|k| w.rec(k).claim_token.is_some()).count();
        assert_eq!(claimed, MAX_CONSECUTIVE_ERRORS as usize, "the rest is left for the next run");
        assert_eq!(summary.outbox_republished, 1);
        assert_eq!((summary.drift_checked, summary.drift_repaired), (1, 1));
    }

    #[tokio::test]
    async fn failures_not_in_a_row_do_not_stop_the_phase() {
        let w = World::new();
        for i in 0..10 {
            w.record(&format!("evt_{i}"), Status::Received, Some(1), NOW - 1 - i);
        }
        let down = Some(Fail::Down);
        w.script_sends([down, down, down, down, None, down, down, down, down, None]);
        let summary = w.run(NOW).await;
        assert_eq!(w.attempts().len(), 10);
        assert_eq!(summary.errors, counts(&[("redrive", 8)]));
        assert_eq!(summary.redriven, counts(&[("not_picked_up", 2)]));
        assert!(summary.complete, "{summary:?}");
    }

    #[tokio::test]
    async fn a_failed_claim_is_counted_and_the_record_is_not_sent() {
        let w = World::new();
        // Alone in its shard, so its page holds nothing else.
        let failing = w.record(&ids_in_shard(0, 1)[0], Status::Received, None, NOW - 1);
        let other = w.record(&ids_in_shard(1, 1)[0], Status::Received, None, NOW - 1);
        w.fail("claim_due", Some(failing.as_str()), ALWAYS, Fail::Down);
        let summary = w.run(NOW).await;
        assert_eq!(w.sent(), [s(&other)]);
        assert_eq!(summary.errors, counts(&[("redrive", 1)]));
        let r = w.rec(&failing);
        assert_eq!((r.due_at, r.enqueued_at), (Some(NOW - 1), None), "still due");
        assert!(summary.complete);
    }

    #[tokio::test]
    async fn a_failed_claim_is_tried_and_counted_once_per_run() {
        let w = World::new();
        let ids = ids_in_shard(0, 2);
        let failing = w.record(&ids[0], Status::Received, None, NOW - 2);
        w.record(&ids[1], Status::Received, None, NOW - 1);
        w.fail("claim_due", Some(failing.as_str()), ALWAYS, Fail::Down);
        let summary = w.run(NOW).await;
        assert_eq!(summary.errors, counts(&[("redrive", 1)]));
    }

    #[tokio::test]
    async fn a_failed_note_is_counted_and_the_record_is_sent_again_later() {
        let w = World::new();
        let k = w.record("evt_1", Status::Received, None, NOW - 1);
        w.fail("note_enqueued", None, 1, Fail::Down);
        let summary = w.run(NOW).await;
        assert_eq!(w.sent(), [s(&k)]);
        assert_eq!(summary.errors, counts(&[("redrive", 1)]));
        assert_eq!(summary.redriven, counts(&[("never_sent", 1)]), "it was sent");
        assert_eq!(w.rec(&k).enqueued_at, None);
        let next = w.run(NOW + BACKOFF).await;
        assert_eq!(w.sent(), [s(&k), s(&k)]);
        assert_eq!(next.redriven, counts(&[("never_sent", 1)]));
        assert_eq!(w.rec(&k).enqueued_at, Some(NOW + BACKOFF));
    }

    #[tokio::test]
    async fn a_failing_due_query_is_counted_per_shard_and_phase_and_the_run_goes_on() {
        let w = World::new();
        w.record("evt_1", Status::Retryable, Some(1), NOW - 1);
        w.other_phases();
        // Every shard's query of every phase fails once: nothing is acted
        // on, each failure is counted, the evidence is still gathered.
        w.fail("due", None, 3 * SHARDS, Fail::Down);
        let summary = w.run(NOW).await;
        assert_eq!(summary.errors, counts(&[("due", u64::from(3 * SHARDS))]));
        assert!(!summary.complete);
        assert_eq!((summary.redriven.len(), summary.outbox_republished, summary.drift_checked), (0, 0, 0));
        assert!(summary.evidence);
        // The next run, the index answering again, does it all.
        let next = w.run(NOW).await;
        assert_eq!(next.redriven.values().sum::<u64>(), 1);
        assert_eq!((next.outbox_republished, next.drift_checked), (1, 1));
        assert!(next.complete && next.errors.is_empty(), "{next:?}");
    }

    #[tokio::test]
    async fn one_shards_failing_query_does_not_stop_the_others() {
        let w = World::new();
        let k = w.record("evt_1", Status::Retryable, Some(1), NOW - 1);
        // The first shard the run visits fails; the record's shard is another.
        let first = ((NOW / 60_000) as u64 % u64::from(SHARDS)) as u32;
        assert_ne!(k.shard(SHARDS), first, "pick another id for this test");
        w.fail("due", None, 1, Fail::Down);
        let summary = w.run(NOW).await;
        assert_eq!(summary.errors, counts(&[("due", 1)]));
        assert_eq!(w.sent(), [s(&k)]);
    }

    // ------------------------------------------------------------------ budget

    #[tokio::test]
    async fn max_items_bounds_the_actions_and_the_following_runs_continue() {
        let w = World::with(ReconcilerSettings { max_items: 2, ..settings() });
        let keys: Vec<EventKey> =
            (0..5).map(|i| w.record(&format!("evt_{i}"), Status::Received, None, NOW - 1 - i)).collect();
        let first = w.run(NOW).await;
        assert_eq!((w.sent().len(), first.complete), (2, false));
        let second = w.run(NOW).await;
        assert_eq!((w.sent().len(), second.complete), (4, false));
        let third = w.run(NOW).await;
        assert_eq!((w.sent().len(), third.complete), (5, true));
        let mut sent = w.sent();
        sent.sort();
        assert_eq!(sent, keys.iter().map(s).collect::<Vec<_>>(), "each once, none lost");
        assert!(first.errors.is_empty() && second.errors.is_empty() && third.errors.is_empty());
    }

    #[tokio::test]
    async fn every_phase_gets_its_share_of_the_budget() {
        let w = World::with(ReconcilerSettings { max_items: 3, ..settings() });
        w.record("evt_1", Status::Received, None, NOW - 2);
        w.record("evt_2", Status::Received, None, NOW - 1);
        w.outbox_item("out_1", NOW - GRACE - 2, vec![]);
        w.outbox_item("out_2", NOW - GRACE - 1, vec![]);
        w.entitlement("sub_1", "active", 1);
        w.answer("sub_1", Answer::Is("active", 1));
        // One item each: the records' backlog does not take the others' share.
        let first = w.run(NOW).await;
        assert_eq!(first.redriven.values().sum::<u64>(), 1);
        assert_eq!((first.outbox_republished, first.drift_checked, first.complete), (1, 1, false));
        let second = w.run(NOW).await;
        assert_eq!(second.redriven.values().sum::<u64>(), 1);
        assert_eq!((second.outbox_republished, second.drift_checked, second.complete), (1, 0, true));
    }

    #[test]
    fn the_shares_are_60_30_10_percent_and_add_up() {
        assert_eq!(shares(10), [6, 3, 1]);
        assert_eq!(shares(500), [300, 150, 50]);
        assert_eq!(shares(3), [1, 1, 1]);
        assert_eq!(shares(2), [1, 1, 0]);
        assert_eq!(shares(1), [1, 0, 0]);
        for n in 1..200 {
            assert_eq!(shares(n).iter().sum::<usize>(), n, "{n}");
        }
    }

    #[tokio::test]
    async fn a_share_left_unused_passes_on_and_what_is_left_goes_back() {
        // No records: the records' share goes to the outbox and re-checks.
        let w = World::with(ReconcilerSettings { max_items: 10, ..settings() });
        for i in 0..12 {
            w.outbox_item(&format!("out_{i}"), NOW - GRACE - 1 - i, vec![]);
        }
        let first = w.run(NOW).await;
        assert_eq!((first.outbox_republished, first.complete), (10, false), "{first:?}");
        // Records with no other work: they get what the others leave.
        let w = World::with(ReconcilerSettings { max_items: 10, ..settings() });
        for i in 0..12 {
            w.record(&format!("evt_{i}"), Status::Received, None, NOW - 1 - i);
        }
        let first = w.run(NOW).await;
        assert_eq!((first.redriven.values().sum::<u64>(), first.complete), (10, false), "{first:?}");
        let second = w.run(NOW).await;
        assert_eq!((second.redriven.values().sum::<u64>(), second.complete), (2, true), "{second:?}");
    }

    #[tokio::test]
    async fn a_passed_deadline_acts_on_nothing_but_evidence_is_gathered() {
        let w = World::new();
        w.record("evt_1", Status::Received, None, NOW - 1);
        w.record("evt_dead", Status::Dead, None, NOW - 1);
        w.other_phases();
        let summary = w.reconciler().run(NOW, Instant::now()).await;
        assert!(w.log.entries().is_empty(), "{:?}", w.log.entries());
        assert!(!summary.complete && summary.errors.is_empty(), "{summary:?}");
        assert!(summary.evidence && summary.dead_letters == 1, "{summary:?}");
    }

    // ------------------------------------------------------------------ outbox

    #[tokio::test]
    async fn due_outbox_items_are_dispatched_and_their_outcomes_counted() {
        let w = World::new();
        let old = NOW - GRACE - 10;
        w.outbox_item("out_published", old, vec![]);
        w.outbox_item("out_retrying", old, vec![retrying()]);
        w.outbox_item("out_dead", old, vec![Step::Out(Dispatched::Dead { attempts: 9, error: "gone".into() })]);
        w.outbox_item("out_skipped", old, vec![Step::Out(Dispatched::Skipped), Step::Out(Dispatched::Skipped)]);
        w.outbox_item("out_young", NOW - GRACE + 1, vec![]);
        let summary = w.run(NOW).await;
        let dispatched: HashSet<String> = w.dispatched().into_iter().collect();
        let expected = ["out_published", "out_retrying", "out_dead", "out_skipped"].map(str::to_owned);
        assert_eq!(dispatched, HashSet::from(expected), "younger than the grace: left to its processor");
        assert_eq!(summary.outbox_republished, 1);
        assert_eq!((summary.outbox_failed, summary.outbox_dead_lettered), (2, 1));
        assert_eq!(summary.errors, counts(&[("outbox", 2)]), "each failed publish is an item failure");
        assert_eq!(summary.outbox_dead, 1, "evidence: the dead item");
        assert!(summary.complete, "{summary:?}");
    }

    #[tokio::test]
    async fn skipped_outbox_items_spend_no_budget() {
        let w = World::with(ReconcilerSettings { max_items: 1, ..settings() });
        let in_shard = |shard| (0..).map(|i| format!("out_{i}")).find(|id| shard_of(id, SHARDS) == shard);
        // The run starts at a shard that moves with time.
        let first = ((NOW / 60_000) as u64 % u64::from(SHARDS)) as u32;
        let (skipped, published) = (in_shard(first).expect("id"), in_shard((first + 1) % SHARDS).expect("id"));
        w.outbox_item(&skipped, NOW - GRACE - 2, vec![Step::Out(Dispatched::Skipped)]);
        w.outbox_item(&published, NOW - GRACE - 1, vec![]);
        let summary = w.run(NOW).await;
        assert_eq!(w.dispatched(), [skipped, published]);
        assert_eq!((summary.outbox_republished, summary.outbox_failed), (1, 0));
        assert!(summary.errors.is_empty());
    }

    #[tokio::test]
    async fn a_failed_dispatch_is_counted_and_the_item_stays_due() {
        let w = World::new();
        w.outbox_item("out_1", NOW - GRACE - 1, vec![Step::Fail(Fail::Down)]);
        let summary = w.run(NOW).await;
        assert_eq!(summary.errors, counts(&[("outbox", 1)]));
        assert_eq!((summary.outbox_republished, summary.outbox_failed), (0, 0), "nothing was published");
        assert!(summary.complete, "{summary:?}");
        let next = w.run(NOW).await;
        assert_eq!(next.outbox_republished, 1, "still due: the next run publishes it");
        assert_eq!(w.dispatched(), ["out_1", "out_1"]);
    }

    #[tokio::test]
    async fn failed_publishes_in_a_row_stop_the_outbox_phase() {
        let w = World::new();
        for i in 0..7 {
            w.outbox_item(&format!("out_{i}"), NOW - GRACE - 1 - i, vec![retrying()]);
        }
        w.entitlement("sub_1", "active", 1);
        w.answer("sub_1", Answer::Is("active", 1));
        let summary = w.run(NOW).await;
        assert_eq!(w.dispatched().len(), MAX_CONSECUTIVE_ERRORS as usize);
        assert_eq!(summary.outbox_failed, u64::from(MAX_CONSECUTIVE_ERRORS));
        assert_eq!(summary.errors, counts(&[("outbox", u64::from(MAX_CONSECUTIVE_ERRORS))]));
        assert!(!summary.complete);
        assert_eq!(summary.drift_checked, 1, "the drift phase still runs");
    }

    #[tokio::test]
    async fn without_a_dispatcher_the_outbox_phase_is_skipped() {
        let w = World::new();
        w.outbox_item("out_1", NOW - GRACE - 1, vec![]);
        w.outbox.state.lock().unwrap().dead = 4;
        let recon: Reconciler<MemQueue, MemLedger, MemDispatch> =
            Reconciler::new(w.ledger.clone(), w.queue.clone(), None, None, w.settings);
        let summary = recon.run(NOW, far()).await;
        assert!(w.dispatched().is_empty());
        assert_eq!((summary.outbox_republished, summary.outbox_dead), (0, 4), "the evidence reads the table");
        assert!(summary.complete && summary.evidence, "{summary:?}");
    }

    // ------------------------------------------------------------------- drift

    #[tokio::test]
    async fn drift_creates_one_reconciliation_record_and_sends_it() {
        let w = World::new();
        let pk = w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Is("active", 7));
        let summary = w.run(NOW).await;
        let k = repair_key("evt_local_sub_1", "sub_1", "active", 7);
        assert_eq!(
            w.log.entries(),
            [
                format!("claim_due {pk}"),
                "fetch sub_1".into(),
                format!("claim {k}"),
                format!("send {k}"),
                format!("mark_enqueued {k}"),
            ]
        );
        assert_eq!(w.records(), 1);
        let r = w.rec(&k);
        assert_eq!((r.status, r.payload_stored, r.enqueued_at), (Status::Received, true, Some(NOW)));
        assert_eq!((r.shard, r.due_at), (k.shard(SHARDS), Some(NOW + REDRIVE_GRACE_MS)));
        let body = w.ledger.lock().payloads.get(&(s(&k), r.payload_hash.clone())).cloned().expect("payload");
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let event_id = k.as_str().rsplit('#').next().unwrap();
        assert_eq!(body["id"], event_id);
        assert_eq!(body["type"], "customer.subscription.reconciled");
        assert_eq!(body["data"]["object"]["id"], "sub_1");
        assert_eq!(body["data"]["object"]["customer"], "cus_1");
        assert_eq!(r.payload_hash, payload_hash(&serde_json::to_vec(&body).unwrap()));
        assert_eq!(w.ent(&pk).due_at_ms, NOW + INTERVAL, "checked now: next look after another interval");
        assert_eq!((summary.drift_checked, summary.drift_found, summary.drift_repaired), (1, 1, 1));
        assert!(summary.complete && summary.errors.is_empty(), "{summary:?}");
    }

    #[tokio::test]
    async fn checking_the_same_drift_again_meets_its_own_record_and_does_not_send_twice() {
        // A short interval, so the second check comes before the repair is due for a re-drive.
        let w = World::with(ReconcilerSettings { drift_interval_ms: 10_000, ..settings() });
        w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Is("active", 7));
        w.run(NOW).await;
        assert_eq!(w.run(NOW + 9_999).await.drift_checked, 0, "checked at `now`: not again within the interval");
        let again = w.run(NOW + 10_000).await;
        assert_eq!(again.drift_checked, 1);
        let k = repair_key("evt_local_sub_1", "sub_1", "active", 7);
        assert_eq!(w.sent(), [s(&k)], "one repair, sent once");
        assert_eq!(w.records(), 1);
        assert_eq!(w.log.count(&format!("mark_enqueued {k}")), 1);
        assert!(again.errors.is_empty(), "{again:?}");
    }

    #[tokio::test]
    async fn drift_repaired_counts_only_repairs_submitted_by_this_run() {
        let w = World::with(ReconcilerSettings { drift_interval_ms: 10_000, ..settings() });
        w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Is("active", 7));
        w.run(NOW).await;
        let again = w.run(NOW + 10_001).await;
        assert_eq!(w.sent().len(), 1);
        assert_eq!((again.drift_found, again.drift_repaired), (1, 0));
    }

    #[tokio::test]
    async fn a_check_whose_send_failed_sends_the_repair_on_its_retry() {
        // A backoff shorter than the re-drive grace, so the drift check (not the re-drive) sends it.
        let w = World::with(ReconcilerSettings { redrive_backoff_ms: 30_000, ..settings() });
        let pk = w.entitlement("sub_1", "past_due", 3);
        w.answer("sub_1", Answer::Is("active", 3));
        let k = repair_key("evt_local_sub_1", "sub_1", "active", 3);
        w.fail_send(k.as_str(), 1, Fail::Down);
        let first = w.run(NOW).await;
        assert_eq!(first.errors, counts(&[("drift", 1)]));
        let r = w.rec(&k);
        assert_eq!((r.payload_stored, r.enqueued_at), (true, None));
        assert_eq!(w.ent(&pk).due_at_ms, NOW + 30_000, "looked at again after the re-drive backoff");
        let retry = w.run(NOW + 30_001).await;
        assert_eq!(retry.drift_checked, 1);
        assert!(retry.redriven.is_empty(), "the repair itself is not due yet");
        assert_eq!(w.sent(), [s(&k)]);
        assert_eq!((w.records(), w.rec(&k).enqueued_at), (1, Some(NOW + 30_001)));
        assert!(retry.errors.is_empty(), "{retry:?}");
    }

    #[tokio::test]
    async fn a_check_whose_claim_failed_claims_and_sends_on_its_retry() {
        // The claim writes the record and its payload together: a failed
        // claim leaves neither, and the retry makes both.
        let w = World::with(ReconcilerSettings { redrive_backoff_ms: 30_000, ..settings() });
        w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Gone);
        let k = repair_key("evt_local_sub_1", "sub_1", "deleted", 0);
        w.fail("claim", Some(k.as_str()), 1, Fail::Down);
        let first = w.run(NOW).await;
        assert_eq!(first.errors, counts(&[("drift", 1)]));
        assert!(w.sent().is_empty());
        assert_eq!(w.records(), 0);
        w.run(NOW + 30_001).await;
        assert!(w.rec(&k).payload_stored);
        assert_eq!(w.sent(), [s(&k)]);
        assert_eq!(w.records(), 1);
    }

    #[tokio::test]
    async fn a_new_drift_instance_gets_its_own_repair() {
        let w = World::with(ReconcilerSettings { drift_interval_ms: 10_000, ..settings() });
        w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Is("active", 7));
        w.run(NOW).await;
        w.answer("sub_1", Answer::Is("canceled", 0));
        w.run(NOW + 10_001).await;
        let first = repair_key("evt_local_sub_1", "sub_1", "active", 7);
        let second = repair_key("evt_local_sub_1", "sub_1", "canceled", 0);
        assert_ne!(first, second);
        assert_eq!(w.sent(), [s(&first), s(&second)]);
    }

    #[tokio::test]
    async fn an_entitlement_is_checked_once_per_run_even_with_a_zero_interval() {
        let w = World::with(ReconcilerSettings { drift_interval_ms: 0, ..settings() });
        w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Is("active", 5));
        assert_eq!(w.run(NOW).await.drift_checked, 1);
        assert_eq!(w.run(NOW + 1).await.drift_checked, 1, "due again at the next run");
    }

    #[tokio::test]
    async fn equal_state_needs_no_repair() {
        let w = World::new();
        let pk = w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Is("active", 5));
        let summary = w.run(NOW).await;
        assert_eq!(w.log.entries(), [format!("claim_due {pk}"), "fetch sub_1".to_owned()]);
        assert_eq!(w.records(), 0);
        assert_eq!((summary.drift_checked, summary.drift_found, summary.drift_repaired), (1, 0, 0));
        assert_eq!(w.ent(&pk).due_at_ms, NOW + INTERVAL);
    }

    #[tokio::test]
    async fn an_entitlement_without_subscription_or_endpoint_is_not_fetched() {
        let w = World::new();
        let pk = w.entitlement("sub_1", "active", 5);
        w.ledger.lock().ents.get_mut(&pk).expect("ent").item.endpoint.clear();
        let summary = w.run(NOW).await;
        assert!(w.log.ops("fetch").is_empty());
        assert_eq!((summary.drift_checked, summary.drift_found, w.records()), (1, 0, 0));
    }

    #[tokio::test]
    async fn a_provider_error_is_counted_and_the_check_retried_after_the_backoff() {
        let w = World::new();
        let pk = w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Down);
        let summary = w.run(NOW).await;
        assert_eq!(summary.errors, counts(&[("drift", 1)]));
        assert_eq!((summary.drift_checked, summary.drift_found), (1, 0));
        assert!(summary.complete, "one failure does not stop the phase");
        assert_eq!(w.ent(&pk).due_at_ms, NOW + BACKOFF);
        assert_eq!(w.log.ops("reschedule"), [pk.as_str()]);
        assert_eq!(w.records(), 0);

        w.answer("sub_1", Answer::Is("active", 5));
        assert_eq!(w.run(NOW + BACKOFF - 1).await.drift_checked, 0, "not before the backoff");
        let retried = w.run(NOW + BACKOFF).await;
        assert_eq!(retried.drift_checked, 1);
        assert!(retried.errors.is_empty());
        assert_eq!(w.log.ops("fetch").len(), 2);
    }

    #[tokio::test]
    async fn a_drift_check_claimed_by_a_concurrent_run_is_not_made() {
        let w = World::new();
        let pk = w.entitlement("sub_1", "active", 5);
        w.answer("sub_1", Answer::Is("active", 7));
        w.race(&pk, NOW);
        let summary = w.run(NOW).await;
        assert!(w.log.ops("fetch").is_empty());
        assert_eq!((summary.drift_checked, w.records()), (0, 0));
        assert!(summary.errors.is_empty());
    }

    // ---------------------------------------------------------------- evidence

    #[tokio::test]
    async fn evidence_comes_from_the_port_counts() {
        let w = World::new();
        assert_eq!(w.run(NOW).await.oldest_unprocessed_age_ms, None, "nothing open");
        for i in 0..2 {
            w.record(&format!("evt_dead_{i}"), Status::Dead, None, NOW);
        }
        w.record("evt_parked", Status::Parked, None, NOW);
        w.record("evt_done", Status::Processed, None, NOW - 999_000);
        // The oldest record found overdue (not-yet-due ones are younger than
        // the grace, or waiting for their retry or lease).
        let open = w.record("evt_open", Status::Received, Some(1), NOW - 1);
        w.ledger.lock().records.get_mut(open.as_str()).expect("open").received_at = NOW - 5_000;
        w.record("evt_later", Status::Retryable, Some(1), NOW + BACKOFF);
        w.outbox.state.lock().unwrap().dead = 3;
        let summary = w.run(NOW).await;
        assert!(summary.evidence);
        assert_eq!((summary.dead_letters, summary.parked, summary.outbox_dead), (2, 1, 3));
        assert_eq!(summary.oldest_unprocessed_age_ms, Some(5_000));
        let skewed = World::new();
        let ahead = skewed.record("evt_ahead", Status::Received, Some(1), NOW - 1);
        skewed.ledger.lock().records.get_mut(ahead.as_str()).expect("ahead").received_at = NOW + 1_000;
        assert_eq!(skewed.run(NOW).await.oldest_unprocessed_age_ms, Some(0), "never negative");
    }

    /// Records the gauges set while it is the local recorder.
    #[derive(Clone, Default)]
    struct Gauges(Arc<Mutex<BTreeMap<String, f64>>>);

    struct GaugeHandle(String, Gauges);

    impl metrics::GaugeFn for GaugeHandle {
        fn increment(&self, _: f64) {}
        fn decrement(&self, _: f64) {}
        fn set(&self, value: f64) {
            (self.1).0.lock().unwrap().insert(self.0.clone(), value);
        }
    }

    impl metrics::Recorder for Gauges {
        fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
            metrics::Counter::noop()
        }
        fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::from_arc(Arc::new(GaugeHandle(key.name().to_owned(), self.clone())))
        }
        fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    const EVIDENCE_GAUGES: [&str; 3] = ["dead_letters", "parked", "outbox_dead"];

    #[tokio::test]
    async fn evidence_gauges_are_emitted_when_measured() {
        let w = World::new();
        w.record("evt_dead", Status::Dead, None, NOW);
        let gauges = Gauges::default();
        let _local = metrics::set_default_local_recorder(&gauges);
        let summary = w.run(NOW).await;
        assert!(summary.evidence);
        let set = gauges.0.lock().unwrap().clone();
        for g in EVIDENCE_GAUGES {
            assert!(set.contains_key(g), "{g}: {set:?}");
        }
        assert_eq!(set.get("dead_letters"), Some(&1.0));
        assert_eq!(set.get("reconciler_errors"), Some(&0.0));
    }

    #[tokio::test]
    async fn a_failed_evidence_query_clears_evidence_and_its_gauges_are_not_emitted() {
        for op in ["attention"] {
            let w = World::new();
            w.record("evt_dead", Status::Dead, None, NOW);
            w.record("evt_1", Status::Received, None, NOW - 1);
            w.fail(op, None, ALWAYS, Fail::Down);
            let gauges = Gauges::default();
            let _local = metrics::set_default_local_recorder(&gauges);
            let summary = w.run(NOW).await;
            assert!(!summary.evidence, "{op}");
            assert_eq!(summary.errors, counts(&[("evidence", 1)]), "{op}");
            assert!(summary.complete, "{op}: the actions were all done");
            assert_eq!(summary.redriven, counts(&[("never_sent", 1)]), "{op}");
            let set = gauges.0.lock().unwrap().clone();
            for g in EVIDENCE_GAUGES {
                assert!(!set.contains_key(g), "{op}: {g} emitted: {set:?}");
            }
            assert_eq!(set.get("reconciler_errors"), Some(&1.0), "{op}");
        }
    }

    #[tokio::test]
    async fn a_failed_evidence_query_reports_no_partial_counts() {
        let w = World::new();
        w.record("evt_dead", Status::Dead, None, NOW);
        w.fail("attention", None, ALWAYS, Fail::Down);
        let summary = w.run(NOW).await;
        assert!(!summary.evidence);
        assert_eq!((summary.dead_letters, summary.parked, summary.outbox_dead), (0, 0, 0));
    }
}
