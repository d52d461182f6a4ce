//! The reconciler: finds what the webhooks alone cannot finish, through the
//! sparse, sharded `due` index (never a scan), and hands it back to the same
//! pipeline.
//!
//! - `due#…`: RECEIVED records never sent or not picked up (due 60 s after
//!   receipt), PROCESSING records whose lease expired (due at expiry),
//!   RETRYABLE records whose retry is due → re-driven to SQS.
//! - `out#…`: outbox items still pending, or claimed by a dispatcher that
//!   died → published (same idempotency key); a failed publish backs off and,
//!   its attempts exhausted, goes DEAD (see [`crate::outbox`]).
//! - `ent#…`: entitlements whose last provider check is older than the drift
//!   interval → compared with Stripe; drift is repaired by a reconciliation
//!   event (`recon:<subscription>:<drift instance>`) through the processor.
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

use crate::adapters::dynamodb::DynamoLedger;
use crate::config::ReconcilerSettings;
use crate::identity::{EventKey, payload_hash};
use crate::ledger::{Claim, DriftItem, DueItem, NewEvent, PortError, SendLease, Status};
use crate::message::Dispatched;
use crate::outbox::Dispatcher;
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
    pub oldest_unprocessed_age_ms: Option<i64>,
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

/// A phase's record of failures in a row.
#[derive(Default)]
struct Failures {
    in_a_row: u32,
}

impl Failures {
    /// Counts and logs one item's failure; `true` when the phase should stop.
    fn item(&mut self, phase: &'static str, item: &str, e: &PortError, summary: &mut Summary) -> bool {
        *summary.errors.entry(phase.to_owned()).or_default() += 1;
        tracing::warn!(phase, item, error = %e, "reconciler item failed; it stays due for a later run");
        self.in_a_row += 1;
        let stop = matches!(e, PortError::Throttled { .. }) || self.in_a_row >= MAX_CONSECUTIVE_ERRORS;
        if stop {
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
pub struct Reconciler<Q, L = DynamoLedger, D = Dispatcher> {
    ledger: L,
    queue: Q,
    dispatcher: Option<D>,
    subscriptions: Option<Arc<dyn SubscriptionSource>>,
    settings: ReconcilerSettings,
}

impl<Q: WorkQueue, L: DueLedger, D: Dispatch> Reconciler<Q, L, D> {
    pub fn new(
        ledger: L,
        queue: Q,
        dispatcher: Option<D>,
        subscriptions: Option<Arc<dyn SubscriptionSource>>,
        settings: ReconcilerSettings,
    ) -> Self {
        Self { ledger, queue, dispatcher, subscriptions, settings }
    }

    /// One bounded run. `deadline`: stop acting after this instant (the
    /// Lambda's remaining time minus a margin). Never fails: every failure is
    /// counted in the summary's `errors`, and the metrics are emitted.
    pub async fn run(&self, now_ms: i64, deadline: Instant) -> Summary {
        let mut summary = Summary { complete: true, ..Default::default() };
        let mut budget = self.settings.max_items;
        let started = Instant::now();
        let redrive = self.redrive(now_ms, deadline, &mut budget, &mut summary).await;
        self.phase_result("redrive", redrive, &mut summary);
        let outbox = self.outbox(now_ms, deadline, &mut budget, &mut summary).await;
        self.phase_result("outbox", outbox, &mut summary);
        let drift = self.drift(now_ms, deadline, &mut budget, &mut summary).await;
        self.phase_result("drift", drift, &mut summary);
        match self.evidence(now_ms, &mut summary).await {
            Ok(()) => summary.evidence = true,
            Err(e) => {
                *summary.errors.entry("evidence".into()).or_default() += 1;
                tracing::error!(error = %e, "reconciler evidence not gathered");
            }
        }
        self.emit(&summary, started);
        summary
    }

    /// A phase that could not go on (its index query failed): counted, and
    /// the run continues with the next phase.
    fn phase_result(&self, phase: &'static str, result: Result<(), PortError>, summary: &mut Summary) {
        if let Err(e) = result {
            summary.complete = false;
            *summary.errors.entry(phase.to_owned()).or_default() += 1;
            tracing::warn!(phase, error = %e, "reconciler phase stopped; the next run continues");
        }
    }

    fn out_of_time(&self, deadline: Instant, budget: usize, summary: &mut Summary) -> bool {
        if budget == 0 || Instant::now() >= deadline {
            summary.complete = false;
            return true;
        }
        false
    }

    async fn redrive(
        &self,
        now_ms: i64,
        deadline: Instant,
        budget: &mut usize,
        summary: &mut Summary,
    ) -> Result<(), PortError> {
        let mut failures = Failures::default();
        // Start at a shard that moves with time, so a run cut short by its
        // budget does not always favour the first shards.
        let shards = self.ledger.shards();
        let first = ((now_ms / 60_000) as u64 % u64::from(shards)) as u32;
        for i in 0..shards {
            let shard = (first + i) % shards;
            loop {
                if self.out_of_time(deadline, *budget, summary) {
                    return Ok(());
                }
                let page = self.ledger.due_records(shard, now_ms, *budget).await?;
                if page.is_empty() {
                    break;
                }
                let mut acted = 0;
                for record in page {
                    if self.out_of_time(deadline, *budget, summary) {
                        return Ok(());
                    }
                    let Some(reason) = record.redrive_reason() else { continue };
                    let key = &record.key;
                    // Claimed, the record stays due at its next look: if the
                    // send below fails or this invocation dies, a later run
                    // sends it again.
                    let next = now_ms + self.settings.redrive_backoff_ms;
                    match self.ledger.claim_due(DueItem::Record(key), record.due_at_ms, next).await {
                        Ok(Some(_)) => {}
                        Ok(None) => continue,
                        Err(e) => {
                            if failures.item("redrive", key.as_str(), &e, summary) {
                                return Ok(());
                            }
                            continue;
                        }
                    }
                    *budget -= 1;
                    acted += 1;
                    if let Err(e) = self.queue.send(key).await {
                        if failures.item("redrive", key.as_str(), &e, summary) {
                            return Ok(());
                        }
                        continue;
                    }
                    failures.ok();
                    if reason == "never_sent" {
                        // Only now is it sent. Best effort: without the note
                        // the record is sent again after the backoff.
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
                if acted == 0 {
                    // Everything on this page was taken by a concurrent run; move on.
                    break;
                }
            }
        }
        Ok(())
    }

    async fn outbox(
        &self,
        now_ms: i64,
        deadline: Instant,
        budget: &mut usize,
        summary: &mut Summary,
    ) -> Result<(), PortError> {
        let Some(d) = &self.dispatcher else { return Ok(()) };
        let mut failures = Failures::default();
        for shard in 0..self.ledger.shards() {
            loop {
                if self.out_of_time(deadline, *budget, summary) {
                    return Ok(());
                }
                let page = d.due(shard, now_ms - self.settings.outbox_grace_ms, *budget).await?;
                if page.is_empty() {
                    break;
                }
                let mut acted = 0;
                for id in page {
                    if self.out_of_time(deadline, *budget, summary) {
                        return Ok(());
                    }
                    // Each outcome but `Skipped` moves the item out of this
                    // page's range (sent, due later, or dead).
                    let outcome = match d.dispatch(&id, now_ms).await {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            if failures.item("outbox", &id, &e, summary) {
                                return Ok(());
                            }
                            continue;
                        }
                    };
                    match outcome {
                        Dispatched::Skipped => continue,
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
                            if failures.item("outbox", &id, &e, summary) {
                                return Ok(());
                            }
                        }
                    }
                    *budget -= 1;
                    acted += 1;
                }
                if acted == 0 {
                    break;
                }
            }
        }
        Ok(())
    }

    async fn drift(
        &self,
        now_ms: i64,
        deadline: Instant,
        budget: &mut usize,
        summary: &mut Summary,
    ) -> Result<(), PortError> {
        let Some(source) = &self.subscriptions else { return Ok(()) };
        let mut failures = Failures::default();
        for shard in 0..self.ledger.shards() {
            loop {
                if self.out_of_time(deadline, *budget, summary) {
                    return Ok(());
                }
                // Strictly older than the interval: an item checked in this run
                // (due_at = now) is not checked again by it.
                let page = self.ledger.due_drift(shard, now_ms - self.settings.drift_interval_ms - 1, *budget).await?;
                if page.is_empty() {
                    break;
                }
                let mut acted = 0;
                for item in page {
                    if self.out_of_time(deadline, *budget, summary) {
                        return Ok(());
                    }
                    let pk = item.pk.as_str();
                    // Checked now: next look after another interval.
                    let token = match self.ledger.claim_due(DueItem::Drift(pk), item.due_at_ms, now_ms).await {
                        Ok(Some(token)) => token,
                        Ok(None) => continue,
                        Err(e) => {
                            if failures.item("drift", pk, &e, summary) {
                                return Ok(());
                            }
                            continue;
                        }
                    };
                    *budget -= 1;
                    acted += 1;
                    summary.drift_checked += 1;
                    match self.check_entitlement(&item, source.as_ref(), now_ms).await {
                        Ok(drift) => {
                            failures.ok();
                            if drift {
                                summary.drift_found += 1;
                                summary.drift_repaired += 1;
                            }
                        }
                        Err(e) => {
                            let stop = failures.item("drift", pk, &e, summary);
                            // Look again after the re-drive backoff rather than a
                            // whole interval (still out of this run's range).
                            let retry = now_ms - self.settings.drift_interval_ms + self.settings.redrive_backoff_ms;
                            if let Err(e) = self.ledger.reschedule(DueItem::Drift(pk), &token, retry.min(now_ms)).await
                            {
                                tracing::warn!(item = %pk, error = %e, "drift check not rescheduled; next look after the interval");
                            }
                            if stop {
                                return Ok(());
                            }
                        }
                    }
                }
                if acted == 0 {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Compares one entitlement with Stripe; on drift, submits a
    /// reconciliation event through the normal pipeline. `Ok(true)`: drift.
    /// A provider that cannot answer is an error (counted; the check is
    /// retried after the re-drive backoff).
    async fn check_entitlement(
        &self,
        item: &DriftItem,
        source: &dyn SubscriptionSource,
        now_ms: i64,
    ) -> Result<bool, PortError> {
        let (sub, customer, endpoint, tenant) =
            (item.subscription.clone(), item.customer.clone(), item.endpoint.clone(), item.tenant.clone());
        if sub.is_empty() || endpoint.is_empty() {
            return Ok(false);
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
            return Ok(false);
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
        let expires_at = now_ms / 1000 + i64::from(self.settings.retention_days) * 86_400;
        let event = NewEvent {
            key: key.clone(),
            provider: "stripe".into(),
            endpoint,
            tenant,
            event_id,
            event_type: Some("customer.subscription.reconciled".into()),
            payload_hash: hash.clone(),
            content_hash: crate::identity::content_hash("stripe", &body),
            received_at_ms: now_ms,
            expires_at,
            shard: key.shard(self.ledger.shards()),
            send: SendLease { token: uuid::Uuid::new_v4().to_string(), until_ms: now_ms + SEND_LEASE_MS },
        };
        // The repair's identity is fixed by the drift instance, so any
        // earlier attempt at this repair claimed the same record: our own
        // claim whose acknowledgement was lost (the SDK retry then meets it),
        // or a run that died before storing or sending. "Already exists"
        // never means "done": a missing payload is stored and a record never
        // sent is sent (a duplicate on the queue is absorbed by the lease).
        let (store, send) = match self.ledger.claim(&event).await? {
            Claim::New => (true, true),
            Claim::Existing(old) => (
                !old.payload_stored && old.payload_hash == hash && !old.status.is_terminal(),
                old.status == Status::Received && old.enqueued_at_ms.is_none(),
            ),
        };
        if store {
            self.ledger.store_payload(&key, &hash, &body, expires_at).await?;
        }
        if send {
            self.queue.send(&key).await?;
            self.ledger.mark_enqueued(&key, now_ms).await?;
            metrics::counter!("drift_repaired", "projection" => "entitlements").increment(1);
        }
        Ok(true)
    }

    /// Dead letters, parked records, dead outbox items and the oldest
    /// unprocessed age, from the status index.
    async fn evidence(&self, now_ms: i64, summary: &mut Summary) -> Result<(), PortError> {
        summary.dead_letters = self.ledger.count(Status::Dead).await?;
        summary.parked = self.ledger.count(Status::Parked).await?;
        if let Some(d) = &self.dispatcher {
            summary.outbox_dead = d.count_dead(self.ledger.shards()).await?;
        }
        let oldest = self.ledger.oldest_open().await?;
        summary.oldest_unprocessed_age_ms = oldest.map(|o| (now_ms - o).max(0));
        Ok(())
    }

    /// Emitted on every run. `reconciler_runs` is the heartbeat (its absence
    /// alarms), `reconciler_errors` is set even when zero (so "no errors" is a
    /// data point, not missing data). The evidence gauges are set only when
    /// measured: a failed measurement must not report zero dead letters (a
    /// warm container's collector repeats the last measured value; the
    /// failure itself is in `reconciler_errors`).
    fn emit(&self, s: &Summary, started: Instant) {
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
            metrics::gauge!("oldest_unprocessed_age").set(s.oldest_unprocessed_age_ms.unwrap_or(0) as f64);
        }
        metrics::histogram!("reconcile_duration").record(started.elapsed().as_secs_f64() * 1000.0);
        let summary = serde_json::to_string(s).unwrap_or_default();
        if s.errors.is_empty() {
            tracing::info!(summary = %summary, "reconciler run");
        } else {
            tracing::warn!(summary = %summary, errors = s.error_count(), "reconciler run with errors");
        }
    }
}
