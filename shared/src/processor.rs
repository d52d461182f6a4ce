//! The processor use case: lease the record, decode the stored payload, plan
//! with the registered projections, commit the plan with the completion
//! marker (fenced), then dispatch the outbox. Failures are classified:
//!
//! | failure | budget | at the bound |
//! |---|---|---|
//! | permanent (malformed, unsupported) | none | DEAD at once |
//! | business logic (a projection's retryable error) | `max_attempts` failures | DEAD `attempts_exhausted` |
//! | infrastructure (throttling, 5xx, unavailable provider, contention, payload not stored yet, crashed workers) | `transient_bound_ms` of time | DEAD `transient_exhausted` |
//! | missing predecessor (sequence gap) | `gap_bound_ms` of time | PARKED `gap` |
//! | unknown subject | none | PARKED |
//!
//! Every lease counts in `attempts` (evidence); only business failures count
//! in `failures`. The time bounds run from the record's window start (its
//! first lease after receipt, replay or wake). A gap waiter is woken when
//! its predecessor commits (see `projection::sequence`).

use crate::clock::Ambient;
use crate::config::ProcessorSettings;
use crate::event::decode;
use crate::identity::{EventKey, payload_hash};
use crate::ledger::{CommitResult, Exit, GAP, LeaseResult, PortError, WorkRecord};
use crate::ports::{Dispatch, WorkLedger, WorkQueue};
use crate::projection::sequence::Position;
use crate::projection::{Decision, EventContext, Gap, OnConflict, Op, ProjectionContext, ProjectionError, Registry};

/// Where a crash is injected in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProcessorFault {
    #[default]
    None,
    /// Die after the transaction committed, before the outbox dispatch and
    /// before the queue message is acknowledged.
    AfterCommit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Stale,
    Duplicate,
    Ignored,
    Parked,
    Dead,
    Retrying,
    /// Another worker holds a live lease.
    Busy,
    NotDue,
    /// Already PROCESSED, DEAD or PARKED.
    AlreadyFinal,
    Missing,
    /// Our lease was taken over before we could commit.
    Fenced,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Stale => "stale",
            Self::Duplicate => "duplicate",
            Self::Ignored => "ignored",
            Self::Parked => "parked",
            Self::Dead => "dead",
            Self::Retrying => "retrying",
            Self::Busy => "busy",
            Self::NotDue => "not_due",
            Self::AlreadyFinal => "already_final",
            Self::Missing => "missing",
            Self::Fenced => "fenced",
        }
    }
}

/// The result for one queue message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub outcome: Outcome,
    /// `Some`: leave the message on the queue and show it again after this
    /// delay. `None`: the message is done (delete it).
    pub retry_after_ms: Option<i64>,
}

impl Report {
    fn done(outcome: Outcome) -> Self {
        Self { outcome, retry_after_ms: None }
    }

    fn later(outcome: Outcome, delay_ms: i64) -> Self {
        Self { outcome, retry_after_ms: Some(delay_ms.max(1_000)) }
    }
}

const MAX_PLAN_ROUNDS: usize = 4;

/// The processor over its ports: the ledger's work transitions, the work
/// queue (woken gap waiters) and the outbox dispatcher.
pub struct Processor<L, Q, D> {
    ledger: L,
    registry: Registry,
    cx: ProjectionContext,
    dispatcher: Option<D>,
    /// Where woken gap waiters are sent at once; without it they wait for
    /// the reconciler's next run (they are due now in the `due` index).
    queue: Option<Q>,
    settings: ProcessorSettings,
    ambient: Ambient,
    pub fault: ProcessorFault,
}

#[derive(Debug)]
enum Failure {
    /// Business logic failed; spends the attempt budget.
    Business {
        code: &'static str,
        message: String,
    },
    /// Infrastructure fault; bounded by time.
    Transient {
        code: &'static str,
        message: String,
    },
    Permanent {
        reason: &'static str,
        message: String,
    },
}

impl From<ProjectionError> for Failure {
    fn from(e: ProjectionError) -> Self {
        match e {
            ProjectionError::Permanent(message) => Self::Permanent { reason: "unsupported_event", message },
            ProjectionError::Transient(message) => Self::Business { code: "projection", message },
            ProjectionError::Unavailable(message) => Self::Transient { code: "unavailable", message },
        }
    }
}

impl<L: WorkLedger, Q: WorkQueue, D: Dispatch> Processor<L, Q, D> {
    /// The processor over any implementation of its ports; `cx` is where the
    /// projections read.
    pub fn with_ports(
        ledger: L,
        cx: ProjectionContext,
        registry: Registry,
        dispatcher: Option<D>,
        settings: ProcessorSettings,
    ) -> Self {
        Self {
            ledger,
            registry,
            cx,
            dispatcher,
            queue: None,
            settings,
            ambient: Ambient::system(),
            fault: ProcessorFault::None,
        }
    }

    /// Reads time and draws tokens and jitter from `ambient`.
    pub fn with_ambient(mut self, ambient: Ambient) -> Self {
        self.ambient = ambient;
        self
    }

    /// Sends woken gap waiters to this queue at once.
    pub fn with_queue(mut self, queue: Q) -> Self {
        self.queue = Some(queue);
        self
    }

    /// The clock and entropy it runs with.
    pub fn ambient(&self) -> &Ambient {
        &self.ambient
    }

    pub fn settings(&self) -> &ProcessorSettings {
        &self.settings
    }

    /// Processes one event key (one queue message without a payload).
    pub async fn process(&self, key: &EventKey, now_ms: i64) -> Result<Report, PortError> {
        self.process_message(key, None, now_ms).await
    }

    /// Processes one queue message. A payload the message carries is used
    /// when it is the record's (its hash matches); otherwise the payload item
    /// is read.
    pub async fn process_message(
        &self,
        key: &EventKey,
        carried: Option<&[u8]>,
        now_ms: i64,
    ) -> Result<Report, PortError> {
        let started = self.ambient.instant();
        let token = self.ambient.token();
        let leased = self.ledger.lease(key, &token, now_ms, self.settings.lease_ms).await?;
        let (report, record) = match leased {
            LeaseResult::Missing => (Report::done(Outcome::Missing), None),
            LeaseResult::Final(_) => (Report::done(Outcome::AlreadyFinal), None),
            LeaseResult::Busy { until_ms } => (Report::later(Outcome::Busy, until_ms - now_ms), None),
            LeaseResult::NotDue { at_ms } => (Report::later(Outcome::NotDue, at_ms - now_ms), None),
            LeaseResult::Leased(record) => {
                let report = self.work(&record, carried, &token, now_ms).await?;
                (report, Some(record))
            }
        };
        let provider = record.as_ref().map_or("unknown", |r| r.provider.as_str()).to_owned();
        metrics::counter!("processed", "outcome" => report.outcome.label(), "provider" => provider.clone())
            .increment(1);
        metrics::histogram!("processing_duration", "provider" => provider.clone())
            .record((self.ambient.instant() - started).as_secs_f64() * 1000.0);
        if let Some(r) = &record {
            if report.retry_after_ms.is_none()
                && matches!(report.outcome, Outcome::Applied | Outcome::Stale | Outcome::Duplicate | Outcome::Ignored)
            {
                metrics::histogram!("queue_to_complete", "provider" => provider)
                    .record((now_ms - r.received_at_ms).max(0) as f64);
            }
            tracing::info!(key = %key, provider = %r.provider, endpoint = %r.endpoint, event_id = %r.event_id,
                event_type = r.event_type.as_deref().unwrap_or(""), attempt = r.attempts, outcome = report.outcome.label(),
                duration_ms = (self.ambient.instant() - started).as_secs_f64() * 1000.0, "processed");
        } else {
            tracing::info!(key = %key, outcome = report.outcome.label(), "not leased");
        }
        Ok(report)
    }

    async fn work(
        &self,
        record: &WorkRecord,
        carried: Option<&[u8]>,
        token: &str,
        now_ms: i64,
    ) -> Result<Report, PortError> {
        let key = &record.key;
        // Leases lost to crashes and faults that escaped as errors left no
        // failure behind; the time bound still ends them.
        let elapsed = now_ms - record.window_start();
        if elapsed >= self.settings.transient_bound_ms {
            let message = format!("no outcome {} s into its window (lease {})", elapsed / 1000, record.attempts);
            return self.dead(record, token, "transient_exhausted", &message, now_ms).await;
        }
        // The record's own copy (small payloads), the message's, or the
        // payload item, whichever is the record's payload first.
        let ours = |p: &[u8]| payload_hash(p) == record.payload_hash;
        let known = match record.payload.as_deref().filter(|p| ours(p)) {
            Some(p) => Some(p.to_vec()),
            None => carried.filter(|p| ours(p)).map(<[u8]>::to_vec),
        };
        let stored = match known {
            Some(p) => Some(p),
            None => self.ledger.payload(key, &record.payload_hash).await?,
        };
        let payload = match stored {
            Some(p) => p,
            None => {
                return self
                    .fail(
                        record,
                        token,
                        Failure::Transient { code: "payload_missing", message: "payload item not stored yet".into() },
                        now_ms,
                    )
                    .await;
            }
        };
        let (event_type, body) = match decode(&record.provider, record.event_type.as_deref(), &payload) {
            Ok(x) => x,
            Err(e) => return self.dead(record, token, "malformed_payload", &e.0, now_ms).await,
        };
        let event = EventContext {
            key: key.clone(),
            provider: record.provider.clone(),
            endpoint: record.endpoint.clone(),
            tenant: record.tenant.clone(),
            event_id: record.event_id.clone(),
            event_type,
            body,
        };

        let subject = self.registry.subject(&event);
        for _round in 0..MAX_PLAN_ROUNDS {
            let decision = match self.plan(&event).await {
                Ok(d) => d,
                Err(e) => return self.fail(record, token, e.into(), now_ms).await,
            };
            let (ops, duplicate) = match decision {
                Decision::Park(reason) => {
                    let exit = Exit::Park { reason: &reason, subject: subject.as_deref() };
                    let parked = self.ledger.leave(key, token, &exit, now_ms).await?;
                    if parked {
                        self.history(key, "parked", &reason, now_ms).await;
                    }
                    return Ok(if parked {
                        metrics::counter!("parked", "provider" => record.provider.clone()).increment(1);
                        Report::done(Outcome::Parked)
                    } else {
                        Report::done(Outcome::Fenced)
                    });
                }
                Decision::Defer(gap) => return self.defer(record, token, gap, subject.as_deref(), now_ms).await,
                Decision::Ignore(_) => (Vec::new(), false),
                Decision::Duplicate => (Vec::new(), true),
                Decision::Apply(ops) => (ops, false),
            };
            match self.commit(record, token, ops, duplicate, subject.as_deref(), now_ms).await? {
                Some(report) => return Ok(report),
                None => continue, // replan from fresh reads
            }
        }
        self.fail(
            record,
            token,
            Failure::Transient { code: "contention", message: "state kept moving while planning".into() },
            now_ms,
        )
        .await
    }

    /// Every matching projection plans; park and defer win over apply.
    async fn plan(&self, event: &EventContext) -> Result<Decision, ProjectionError> {
        let projections = self.registry.matching(&event.provider, &event.event_type);
        if projections.is_empty() {
            return Ok(Decision::Ignore("no projection for this event type"));
        }
        let mut ops = Vec::new();
        let (mut applied_any, mut duplicate) = (false, false);
        for p in projections {
            match p.plan(event, &self.cx).await? {
                Decision::Apply(more) => {
                    applied_any = true;
                    ops.extend(more);
                }
                Decision::Ignore(_) => {}
                Decision::Duplicate => duplicate = true,
                other @ (Decision::Park(_) | Decision::Defer(_)) => return Ok(other),
            }
        }
        Ok(match (applied_any, duplicate) {
            (true, _) => Decision::Apply(ops),
            (false, true) => Decision::Duplicate,
            (false, false) => Decision::Ignore("every projection ignored it"),
        })
    }

    /// Commits, dropping ops whose conditions say "stale" or "already applied".
    /// `Ok(None)`: an op asked to replan.
    async fn commit(
        &self,
        record: &WorkRecord,
        token: &str,
        mut ops: Vec<Op>,
        mut duplicate: bool,
        subject: Option<&str>,
        now_ms: i64,
    ) -> Result<Option<Report>, PortError> {
        let key = &record.key;
        let planned = !ops.is_empty();
        let mut stale = false;
        loop {
            let outcome = if !ops.is_empty() {
                Outcome::Applied
            } else if stale {
                Outcome::Stale
            } else if duplicate {
                Outcome::Duplicate
            } else if planned {
                Outcome::Applied
            } else {
                Outcome::Ignored
            };
            match self.ledger.commit(key, token, &ops, outcome.label(), subject, now_ms).await? {
                CommitResult::Committed { outbox } => {
                    if self.fault == ProcessorFault::AfterCommit {
                        return Err(PortError::Unavailable {
                            service: "injected",
                            message: "crash after commit".into(),
                        });
                    }
                    for at in ops.iter().filter_map(|op| op.advances.as_ref()) {
                        self.wake_successor(at, now_ms).await;
                    }
                    self.dispatch(&outbox, now_ms).await;
                    return Ok(Some(Report::done(outcome)));
                }
                CommitResult::Conflicts(indices) => {
                    if indices.iter().any(|i| ops[*i].on_conflict == OnConflict::Replan) {
                        return Ok(None);
                    }
                    for i in indices.iter().rev() {
                        match ops.remove(*i).on_conflict {
                            OnConflict::Stale => stale = true,
                            OnConflict::AlreadyApplied => duplicate = true,
                            OnConflict::Replan => {}
                        }
                    }
                }
                CommitResult::Fenced => {
                    // Our own earlier commit whose response was lost looks fenced too.
                    let ours = self.ledger.completed_by(key).await?.is_some_and(|t| t == token);
                    if !ours {
                        return Ok(Some(Report::done(Outcome::Fenced)));
                    }
                    for at in ops.iter().filter_map(|op| op.advances.as_ref()) {
                        self.wake_successor(at, now_ms).await;
                    }
                    return Ok(Some(Report::done(outcome)));
                }
                CommitResult::Contention => {
                    let f = Failure::Transient { code: "contention", message: "transaction conflict".into() };
                    return self.fail(record, token, f, now_ms).await.map(Some);
                }
            }
        }
    }

    /// Publishes this commit's outbox items now; a failure leaves them for the sweeper.
    async fn dispatch(&self, outbox: &[String], now_ms: i64) {
        let Some(d) = &self.dispatcher else { return };
        for pk in outbox {
            if let Err(e) = d.dispatch(pk, now_ms).await {
                tracing::warn!(error = %e, outbox = %pk, "outbox dispatch failed; the sweeper will retry");
            }
        }
    }

    /// History is evidence, not state: a failure to write it is only logged.
    async fn history(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) {
        if let Err(e) = self.ledger.append_history(key, kind, detail, now_ms).await {
            tracing::warn!(error = %e, key = %key, "could not append history");
        }
    }

    async fn fail(&self, record: &WorkRecord, token: &str, failure: Failure, now_ms: i64) -> Result<Report, PortError> {
        let (code, message, counted) = match failure {
            Failure::Permanent { reason, message } => return self.dead(record, token, reason, &message, now_ms).await,
            Failure::Business { code, message } => {
                let failures = record.failures.saturating_add(1);
                if failures >= self.settings.max_attempts {
                    return self.dead(record, token, "attempts_exhausted", &format!("{code}: {message}"), now_ms).await;
                }
                (code, message, Some(failures))
            }
            Failure::Transient { code, message } => {
                if now_ms - record.window_start() >= self.settings.transient_bound_ms {
                    return self
                        .dead(record, token, "transient_exhausted", &format!("{code}: {message}"), now_ms)
                        .await;
                }
                (code, message, None)
            }
        };
        let key = &record.key;
        let (stored, delay, detail) = match counted {
            Some(failures) => {
                let delay = self.settings.backoff.delay_ms(failures, self.ambient.jitter());
                let exit = Exit::Retry { next_at_ms: now_ms + delay, code, message: &message, failure: true };
                let stored = self.ledger.leave(key, token, &exit, now_ms).await?;
                let of = self.settings.max_attempts;
                (
                    stored,
                    delay,
                    format!("attempt {} failed ({code}): {message} [failure {failures} of {of}]", record.attempts),
                )
            }
            None => {
                let left = self.settings.transient_bound_ms - (now_ms - record.window_start());
                let delay = self.settings.backoff.delay_ms(record.attempts, self.ambient.jitter()).min(left);
                let exit = Exit::Retry { next_at_ms: now_ms + delay, code, message: &message, failure: false };
                let stored = self.ledger.leave(key, token, &exit, now_ms).await?;
                (stored, delay, format!("attempt {} met a transient fault ({code}): {message}", record.attempts))
            }
        };
        if !stored {
            return Ok(Report::done(Outcome::Fenced));
        }
        self.history(key, "retry", &detail, now_ms).await;
        metrics::counter!("retried", "provider" => record.provider.clone(), "code" => code).increment(1);
        tracing::warn!(key = %key, code, attempt = record.attempts, failures = ?counted, delay_ms = delay, "will retry");
        Ok(Report::later(Outcome::Retrying, delay))
    }

    /// A predecessor is missing: wait for it (woken by its commit, or at the
    /// next look) without spending the attempt budget; PARKED (`gap`) once
    /// the gap bound has passed.
    async fn defer(
        &self,
        record: &WorkRecord,
        token: &str,
        gap: Gap,
        subject: Option<&str>,
        now_ms: i64,
    ) -> Result<Report, PortError> {
        let key = &record.key;
        let left = self.settings.gap_bound_ms - (now_ms - record.window_start());
        if left <= 0 {
            if !self.ledger.leave(key, token, &Exit::Park { reason: GAP, subject }, now_ms).await? {
                return Ok(Report::done(Outcome::Fenced));
            }
            self.history(key, "parked", &format!("{GAP}: {}", gap.reason), now_ms).await;
            metrics::counter!("parked", "provider" => record.provider.clone()).increment(1);
            tracing::warn!(key = %key, reason = %gap.reason, "parked at the gap bound");
            return Ok(Report::done(Outcome::Parked));
        }
        // Pointer first, then leave PROCESSING, then look at the stream once
        // more: a predecessor committed in between is seen by one side.
        if let Some(at) = &gap.waiter {
            let expires_at = crate::policy::expires_at(now_ms, self.settings.retention_days);
            if let Err(e) = self.ledger.register_waiter(at, key, expires_at).await {
                tracing::warn!(key = %key, error = %e, "could not leave a waiter pointer; the retry timer remains");
            }
        }
        let delay = self.settings.backoff.delay_ms(record.attempts, self.ambient.jitter()).min(left);
        let exit = Exit::Retry { next_at_ms: now_ms + delay, code: GAP, message: &gap.reason, failure: false };
        if !self.ledger.leave(key, token, &exit, now_ms).await? {
            return Ok(Report::done(Outcome::Fenced));
        }
        self.history(key, "deferred", &gap.reason, now_ms).await;
        metrics::counter!("retried", "provider" => record.provider.clone(), "code" => GAP).increment(1);
        if let Some(at) = &gap.waiter {
            let woken = match self.ledger.predecessor_applied(at).await {
                Ok(true) => self.ledger.wake(key, now_ms).await.map_err(|e| e.to_string()),
                Ok(false) => Ok(false),
                Err(e) => Err(e.to_string()),
            };
            match woken {
                Ok(true) => return Ok(Report::later(Outcome::Retrying, 0)),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, "could not look at the stream again; the timer remains")
                }
            }
        }
        tracing::info!(key = %key, reason = %gap.reason, delay_ms = delay, "deferred on a gap");
        Ok(Report::later(Outcome::Retrying, delay))
    }

    /// `at` was just committed: the event waiting for the next position, if
    /// any, becomes due now (and is queued when a queue is configured). Best
    /// effort: a failure leaves the waiter to its own timer.
    async fn wake_successor(&self, at: &Position, now_ms: i64) {
        let next = Position { stream: at.stream.clone(), seq: at.seq + 1 };
        let waiter = match self.ledger.waiter(&next).await {
            Ok(Some(k)) => k,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(stream = %at.stream, error = %e, "could not read the waiter pointer");
                return;
            }
        };
        match self.ledger.wake(&waiter, now_ms).await {
            Ok(true) => {
                self.history(&waiter, "woken", &format!("predecessor seq {} committed", at.seq), now_ms).await;
                metrics::counter!("gap_woken").increment(1);
                tracing::info!(key = %waiter, seq = next.seq, "gap closed; waiter due now");
                if let Some(q) = &self.queue {
                    if let Err(e) = q.send(&waiter).await {
                        tracing::warn!(key = %waiter, error = %e, "could not queue the woken waiter; the reconciler will");
                    }
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(key = %waiter, error = %e, "could not wake the waiter; its timer remains"),
        }
    }

    async fn dead(
        &self,
        record: &WorkRecord,
        token: &str,
        reason: &'static str,
        message: &str,
        now_ms: i64,
    ) -> Result<Report, PortError> {
        if !self.ledger.leave(&record.key, token, &Exit::Dead { reason, message }, now_ms).await? {
            return Ok(Report::done(Outcome::Fenced));
        }
        self.history(&record.key, "dead", &format!("{reason}: {message}"), now_ms).await;
        metrics::counter!("dead_lettered", "provider" => record.provider.clone(), "reason" => reason).increment(1);
        tracing::warn!(key = %record.key, reason, "dead-lettered");
        Ok(Report::done(Outcome::Dead))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The processor's decisions over in-memory ports. The memory ledger
    //! follows the DynamoDB adapter's conditions (`adapters::dynamodb::work`
    //! and `conditions`); only the commit's projection writes cannot be
    //! evaluated, so the commit answers from a script.

    use std::collections::{HashMap, VecDeque};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard};

    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

    use super::*;
    use crate::backoff::Backoff;
    use crate::ledger::Status;
    use crate::message::{Dispatched, OutboxMessage, idempotency_key};
    use crate::projection::{PlanFuture, Projection, sequence};

    pub(crate) const NOW: i64 = 50_000_000;
    const TYPE: &str = "thing.changed";
    const STREAM: &str = "seq#acct_1";

    // ------------------------------------------------------------ memory ledger

    /// The record and the attributes the processor's decisions leave on it.
    #[derive(Debug, Clone)]
    pub(crate) struct Stored {
        pub(crate) rec: WorkRecord,
        error_code: Option<String>,
        error_message: Option<String>,
        dead_reason: Option<String>,
        park_reason: Option<String>,
        subject: Option<String>,
        outcome: Option<String>,
        woken_at: Option<i64>,
    }

    /// What the next commit does.
    #[derive(Debug, Clone)]
    enum Step {
        /// Answer this; `Committed` also completes the record.
        Answer(CommitResult),
        /// The transaction commits but its acknowledgement is lost: the SDK's
        /// retry meets our own completion and reports the fence.
        LoseAck,
        /// Another worker took the lease over (ours expired) just before.
        TakeOver(&'static str),
    }

    #[derive(Debug, Clone)]
    struct CommitCall {
        token: String,
        ops: Vec<String>,
        outcome: String,
        subject: Option<String>,
    }

    #[derive(Default)]
    struct State {
        records: HashMap<EventKey, Stored>,
        payloads: HashMap<(EventKey, String), Vec<u8>>,
        waiters: HashMap<(String, i64), EventKey>,
        /// Last applied sequence of each stream.
        streams: HashMap<String, i64>,
        history: Vec<(EventKey, String, String)>,
        script: VecDeque<Step>,
        /// Tokens of lease attempts, in order.
        leases: Vec<String>,
        commits: Vec<CommitCall>,
        /// Labels of the ops of every commit that completed a record.
        committed: Vec<String>,
    }

    #[derive(Clone, Default)]
    pub(crate) struct MemLedger(Arc<Mutex<State>>);

    impl MemLedger {
        fn state(&self) -> MutexGuard<'_, State> {
            self.0.lock().unwrap()
        }

        fn insert(&self, rec: WorkRecord) {
            let stored = Stored {
                rec,
                error_code: None,
                error_message: None,
                dead_reason: None,
                park_reason: None,
                subject: None,
                outcome: None,
                woken_at: None,
            };
            self.state().records.insert(stored.rec.key.clone(), stored);
        }

        fn insert_with_payload(&self, rec: WorkRecord, body: &[u8]) {
            self.state().payloads.insert((rec.key.clone(), rec.payload_hash.clone()), body.to_vec());
            self.insert(rec);
        }

        fn edit(&self, key: &EventKey, f: impl FnOnce(&mut Stored)) {
            f(self.state().records.get_mut(key).unwrap());
        }

        pub(crate) fn get(&self, key: &EventKey) -> Stored {
            self.state().records[key].clone()
        }

        fn script(&self, steps: impl IntoIterator<Item = Step>) {
            self.state().script.extend(steps);
        }

        fn commits(&self) -> Vec<CommitCall> {
            self.state().commits.clone()
        }

        fn committed(&self) -> Vec<String> {
            self.state().committed.clone()
        }

        fn history_of(&self, key: &EventKey) -> Vec<(String, String)> {
            self.state()
                .history
                .iter()
                .filter(|(k, _, _)| k == key)
                .map(|(_, kind, d)| (kind.clone(), d.clone()))
                .collect()
        }

        fn last_lease_token(&self) -> String {
            self.state().leases.last().unwrap().clone()
        }
    }

    impl WorkLedger for MemLedger {
        fn shards(&self) -> u32 {
            4
        }

        async fn lease(
            &self,
            key: &EventKey,
            token: &str,
            now_ms: i64,
            lease_ms: i64,
        ) -> Result<LeaseResult, PortError> {
            let mut st = self.state();
            st.leases.push(token.to_owned());
            let Some(s) = st.records.get_mut(key) else { return Ok(LeaseResult::Missing) };
            let r = &mut s.rec;
            // RECEIVED | RETRYABLE due | PROCESSING with an expired lease.
            let leasable = match r.status {
                Status::Received => true,
                Status::Retryable => r.next_attempt_at_ms.is_some_and(|t| t <= now_ms),
                Status::Processing => r.lease_expires_at_ms.is_some_and(|t| t < now_ms),
                _ => false,
            };
            if !leasable {
                return Ok(WorkRecord::lease_refused(Some(r.clone()), token, now_ms));
            }
            r.status = Status::Processing;
            r.lease_owner = Some(token.to_owned());
            r.lease_expires_at_ms = Some(now_ms + lease_ms);
            r.attempts += 1;
            r.window_start_ms.get_or_insert(now_ms);
            Ok(LeaseResult::Leased(Box::new(r.clone())))
        }

        async fn payload(&self, key: &EventKey, hash: &str) -> Result<Option<Vec<u8>>, PortError> {
            Ok(self.state().payloads.get(&(key.clone(), hash.to_owned())).cloned())
        }

        async fn commit(
            &self,
            key: &EventKey,
            token: &str,
            ops: &[Op],
            outcome: &str,
            subject: Option<&str>,
            now_ms: i64,
        ) -> Result<CommitResult, PortError> {
            let mut st = self.state();
            st.commits.push(CommitCall {
                token: token.to_owned(),
                ops: ops.iter().map(label).collect(),
                outcome: outcome.to_owned(),
                subject: subject.map(str::to_owned),
            });
            if let Some(Step::TakeOver(other)) = st.script.front().cloned() {
                st.script.pop_front();
                if let Some(s) = st.records.get_mut(key) {
                    s.rec.lease_owner = Some(other.to_owned());
                    s.rec.lease_expires_at_ms = Some(now_ms + 30_000);
                    s.rec.attempts += 1;
                }
            }
            // The completion marker's fence: PROCESSING(token).
            let ours = st
                .records
                .get(key)
                .is_some_and(|s| s.rec.status == Status::Processing && s.rec.lease_owner.as_deref() == Some(token));
            if !ours {
                return Ok(CommitResult::Fenced);
            }
            let derived = || {
                let ids = ops
                    .iter()
                    .flat_map(|op| &op.outbox)
                    .map(|m| format!("outbox#{}", idempotency_key(key.as_str(), &m.action)))
                    .collect();
                CommitResult::Committed { outbox: ids }
            };
            let (answer, completes) = match st.script.pop_front() {
                None => (derived(), true),
                Some(Step::Answer(c @ CommitResult::Committed { .. })) => (c, true),
                Some(Step::Answer(other)) => (other, false),
                Some(Step::LoseAck) => (CommitResult::Fenced, true),
                Some(Step::TakeOver(_)) => unreachable!("a takeover comes first in the script"),
            };
            if completes {
                let s = st.records.get_mut(key).unwrap();
                s.rec.status = Status::Processed;
                s.rec.lease_owner = None;
                s.rec.lease_expires_at_ms = None;
                s.rec.next_attempt_at_ms = None;
                s.rec.completed_token = Some(token.to_owned());
                s.outcome = Some(outcome.to_owned());
                if let Some(subj) = subject {
                    s.subject = Some(subj.to_owned());
                }
                for at in ops.iter().filter_map(|op| op.advances.as_ref()) {
                    st.streams.insert(at.stream.clone(), at.seq);
                }
                st.committed.extend(ops.iter().map(label));
            }
            Ok(answer)
        }

        async fn completed_by(&self, key: &EventKey) -> Result<Option<String>, PortError> {
            Ok(self.state().records.get(key).and_then(|s| s.rec.completed_token.clone()))
        }

        async fn leave(&self, key: &EventKey, token: &str, exit: &Exit<'_>, _now_ms: i64) -> Result<bool, PortError> {
            let mut st = self.state();
            let Some(s) = st.records.get_mut(key) else { return Ok(false) };
            let r = &mut s.rec;
            if !(r.status == Status::Processing && r.lease_owner.as_deref() == Some(token)) {
                // Our own earlier exit whose acknowledgement was lost.
                return Ok(r.transition_token.as_deref() == Some(token));
            }
            r.lease_owner = None;
            r.lease_expires_at_ms = None;
            r.transition_token = Some(token.to_owned());
            r.status = exit.to();
            match *exit {
                Exit::Retry { next_at_ms, code, message, failure } => {
                    r.next_attempt_at_ms = Some(next_at_ms);
                    if failure {
                        r.failures += 1;
                    }
                    s.error_code = Some(code.to_owned());
                    s.error_message = Some(message.to_owned());
                }
                Exit::Dead { reason, message } => {
                    r.next_attempt_at_ms = None;
                    s.dead_reason = Some(reason.to_owned());
                    s.error_message = Some(message.to_owned());
                }
                Exit::Park { reason, subject } => {
                    r.next_attempt_at_ms = None;
                    s.park_reason = Some(reason.to_owned());
                    if let Some(subj) = subject {
                        s.subject = Some(subj.to_owned());
                    }
                }
            }
            Ok(true)
        }

        async fn wake(&self, key: &EventKey, now_ms: i64) -> Result<bool, PortError> {
            let mut st = self.state();
            let Some(s) = st.records.get_mut(key) else { return Ok(false) };
            let waiting = (s.rec.status == Status::Retryable && s.error_code.as_deref() == Some(GAP))
                || (s.rec.status == Status::Parked && s.park_reason.as_deref() == Some(GAP));
            if waiting {
                s.rec.status = Status::Retryable;
                s.rec.next_attempt_at_ms = Some(now_ms);
                s.rec.window_start_ms = None;
                s.woken_at = Some(now_ms);
            }
            Ok(waiting)
        }

        async fn append_history(
            &self,
            key: &EventKey,
            kind: &str,
            detail: &str,
            _now_ms: i64,
        ) -> Result<(), PortError> {
            self.state().history.push((key.clone(), kind.to_owned(), detail.to_owned()));
            Ok(())
        }

        async fn register_waiter(&self, at: &Position, key: &EventKey, _expires_at: i64) -> Result<(), PortError> {
            self.state().waiters.insert((at.stream.clone(), at.seq), key.clone());
            Ok(())
        }

        async fn waiter(&self, at: &Position) -> Result<Option<EventKey>, PortError> {
            Ok(self.state().waiters.get(&(at.stream.clone(), at.seq)).cloned())
        }

        async fn predecessor_applied(&self, at: &Position) -> Result<bool, PortError> {
            Ok(self.state().streams.get(&at.stream).copied().unwrap_or(0) >= at.seq - 1)
        }
    }

    // ------------------------------------------------------ queue and dispatch

    #[derive(Clone, Default)]
    pub(crate) struct RecQueue(Arc<Mutex<Vec<EventKey>>>);

    impl RecQueue {
        fn sent(&self) -> Vec<EventKey> {
            self.0.lock().unwrap().clone()
        }
    }

    impl WorkQueue for RecQueue {
        async fn send(&self, key: &EventKey) -> Result<(), PortError> {
            self.0.lock().unwrap().push(key.clone());
            Ok(())
        }
    }

    #[derive(Clone, Default)]
    pub(crate) struct RecDispatch(Arc<Mutex<Vec<String>>>);

    impl RecDispatch {
        fn dispatched(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    impl Dispatch for RecDispatch {
        async fn dispatch(&self, id: &str, _now_ms: i64) -> Result<Dispatched, PortError> {
            self.0.lock().unwrap().push(id.to_owned());
            Ok(Dispatched::Published)
        }

        async fn due(&self, _shard: u32, _up_to: i64, _limit: usize) -> Result<Vec<String>, PortError> {
            Ok(Vec::new())
        }
    }

    // ------------------------------------------------------ scripted projections

    type PlanFn = dyn Fn(usize) -> Result<Decision, ProjectionError> + Send + Sync;

    /// Plans what the test says, by round (0 for its first call).
    pub(crate) struct Scripted {
        subject: Option<String>,
        plan: Box<PlanFn>,
        calls: Arc<AtomicUsize>,
    }

    impl Projection for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }

        fn handles(&self, _provider: &str, event_type: &str) -> bool {
            event_type == TYPE
        }

        fn plan<'a>(&'a self, _event: &'a EventContext, _cx: &'a ProjectionContext) -> PlanFuture<'a> {
            let round = self.calls.fetch_add(1, Ordering::SeqCst);
            let decision = (self.plan)(round);
            Box::pin(async move { decision })
        }

        fn subject(&self, _event: &EventContext) -> Option<String> {
            self.subject.clone()
        }
    }

    /// A projection and the count of its plans.
    pub(crate) fn scripted(
        plan: impl Fn(usize) -> Result<Decision, ProjectionError> + Send + Sync + 'static,
    ) -> (Scripted, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        (Scripted { subject: None, plan: Box::new(plan), calls: calls.clone() }, calls)
    }

    // ---------------------------------------------------------------- fixtures

    fn settings() -> ProcessorSettings {
        ProcessorSettings {
            lease_ms: 30_000,
            max_attempts: 3,
            backoff: Backoff { base_ms: 4_000, max_ms: 60_000 },
            index_shards: 4,
            gap_bound_ms: 60_000,
            transient_bound_ms: 600_000,
            retention_days: 30,
        }
    }

    /// A DynamoDB client that is never called.
    fn cx() -> ProjectionContext {
        let conf = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .build();
        ProjectionContext { ddb: aws_sdk_dynamodb::Client::from_conf(conf), table: "t".into(), shards: 4 }
    }

    pub(crate) struct Harness {
        pub(crate) p: Processor<MemLedger, RecQueue, RecDispatch>,
        pub(crate) ledger: MemLedger,
        queue: RecQueue,
        dispatch: RecDispatch,
    }

    fn harness_with(registry: Registry, settings: ProcessorSettings) -> Harness {
        let (ledger, queue, dispatch) = (MemLedger::default(), RecQueue::default(), RecDispatch::default());
        let p = Processor::with_ports(ledger.clone(), cx(), registry, Some(dispatch.clone()), settings)
            .with_queue(queue.clone());
        Harness { p, ledger, queue, dispatch }
    }

    pub(crate) fn harness(projection: Scripted) -> Harness {
        harness_with(Registry::new().register(projection), settings())
    }

    pub(crate) fn key(id: &str) -> EventKey {
        EventKey::new("acme", "main", id)
    }

    pub(crate) fn record(id: &str, status: Status) -> WorkRecord {
        WorkRecord {
            key: key(id),
            status,
            provider: "acme".into(),
            endpoint: "main".into(),
            tenant: "t1".into(),
            event_id: id.into(),
            event_type: Some(TYPE.into()),
            payload_hash: format!("h-{id}"),
            attempts: 0,
            failures: 0,
            received_at_ms: NOW - 5_000,
            window_start_ms: None,
            lease_owner: None,
            lease_expires_at_ms: None,
            next_attempt_at_ms: None,
            completed_token: None,
            transition_token: None,
            payload: None,
        }
    }

    /// A record due now (RETRYABLE, its window started `elapsed` ago).
    fn due(id: &str, elapsed: i64) -> WorkRecord {
        WorkRecord {
            attempts: 1,
            window_start_ms: Some(NOW - elapsed),
            next_attempt_at_ms: Some(NOW),
            ..record(id, Status::Retryable)
        }
    }

    fn body(id: &str) -> Vec<u8> {
        format!(r#"{{"id":"{id}","type":"{TYPE}"}}"#).into_bytes()
    }

    /// Stores the record with a valid payload.
    pub(crate) fn put(h: &Harness, rec: WorkRecord) -> EventKey {
        let k = rec.key.clone();
        let b = body(&rec.event_id);
        h.ledger.insert_with_payload(rec, &b);
        k
    }

    /// An op labelled by the `pk` of its one write.
    fn op(label: &str, on_conflict: OnConflict) -> Op {
        let put = Put::builder()
            .table_name("t")
            .item("pk", AttributeValue::S(label.into()))
            .item("sk", AttributeValue::S("state".into()))
            .build()
            .unwrap();
        Op::new(vec![TransactWriteItem::builder().put(put).build()], on_conflict)
    }

    fn label(op: &Op) -> String {
        let w = op.writes.first();
        w.and_then(|w| w.put().map(|p| p.item()).or_else(|| w.update().map(|u| u.key())))
            .and_then(|item| item.get("pk"))
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_default()
    }

    fn notify(action: &str) -> OutboxMessage {
        OutboxMessage {
            topic_arn: "arn:aws:sns:us-east-1:000000000000:out".into(),
            action: action.into(),
            group: "g".into(),
            body: serde_json::json!({ "action": action }),
        }
    }

    pub(crate) fn apply(labels: &[&str]) -> Result<Decision, ProjectionError> {
        Ok(Decision::Apply(labels.iter().map(|l| op(l, OnConflict::Replan)).collect()))
    }

    fn defer_at(seq: i64) -> Result<Decision, ProjectionError> {
        Ok(Decision::Defer(Gap {
            reason: format!("waiting for seq {}", seq - 1),
            waiter: Some(Position { stream: STREAM.into(), seq }),
        }))
    }

    fn done(outcome: Outcome) -> Report {
        Report { outcome, retry_after_ms: None }
    }

    // ------------------------------------------------------------------ leases

    /// Every outcome is counted in one of the operator's figures: final
    /// (processed), a redelivery, a retry, DEAD or PARKED.
    #[test]
    fn every_outcome_is_final_a_redelivery_a_retry_dead_or_parked() {
        use crate::insight::{FINAL_OUTCOMES, REDELIVERY_OUTCOMES};
        let all = [
            Outcome::Applied,
            Outcome::Stale,
            Outcome::Duplicate,
            Outcome::Ignored,
            Outcome::Parked,
            Outcome::Dead,
            Outcome::Retrying,
            Outcome::Busy,
            Outcome::NotDue,
            Outcome::AlreadyFinal,
            Outcome::Missing,
            Outcome::Fenced,
        ];
        for o in all {
            let l = o.label();
            let homes = [
                FINAL_OUTCOMES.contains(&l),
                REDELIVERY_OUTCOMES.contains(&l),
                ["retrying", "dead", "parked"].contains(&l),
            ];
            assert_eq!(homes.iter().filter(|h| **h).count(), 1, "{l}");
        }
    }

    #[tokio::test]
    async fn a_missing_record_is_done_as_missing() {
        let (proj, calls) = scripted(|_| apply(&["x"]));
        let h = harness(proj);
        let report = h.p.process(&key("nope"), NOW).await.unwrap();
        assert_eq!(report, done(Outcome::Missing));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(h.ledger.commits().is_empty());
    }

    #[tokio::test]
    async fn a_final_record_is_done_as_already_final() {
        let (proj, calls) = scripted(|_| apply(&["x"]));
        let h = harness(proj);
        for (id, status) in [("p", Status::Processed), ("d", Status::Dead), ("k", Status::Parked)] {
            let k = put(&h, record(id, status));
            assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::AlreadyFinal), "{status:?}");
            assert_eq!(h.ledger.get(&k).rec.status, status);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_live_lease_of_another_worker_is_busy_until_its_end() {
        let (proj, calls) = scripted(|_| apply(&["x"]));
        let h = harness(proj);
        let held = WorkRecord {
            lease_owner: Some("other".into()),
            lease_expires_at_ms: Some(NOW + 20_000),
            attempts: 1,
            ..record("a", Status::Processing)
        };
        let k = put(&h, held);
        let report = h.p.process(&k, NOW).await.unwrap();
        assert_eq!(report, Report { outcome: Outcome::Busy, retry_after_ms: Some(20_000) });
        let rec = h.ledger.get(&k).rec;
        assert_eq!((rec.lease_owner.as_deref(), rec.attempts), (Some("other"), 1), "the lease is not taken");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_lease_ending_now_is_looked_at_again_after_the_minimum_delay() {
        let (proj, _) = scripted(|_| apply(&["x"]));
        let h = harness(proj);
        let held = WorkRecord {
            lease_owner: Some("other".into()),
            lease_expires_at_ms: Some(NOW),
            ..record("a", Status::Processing)
        };
        let k = put(&h, held);
        let report = h.p.process(&k, NOW).await.unwrap();
        assert_eq!(report, Report { outcome: Outcome::Busy, retry_after_ms: Some(1_000) });
    }

    #[tokio::test]
    async fn a_retryable_record_not_yet_due_is_not_due_until_its_time() {
        let (proj, calls) = scripted(|_| apply(&["x"]));
        let h = harness(proj);
        let k = put(&h, WorkRecord { next_attempt_at_ms: Some(NOW + 7_000), ..due("a", 1_000) });
        let report = h.p.process(&k, NOW).await.unwrap();
        assert_eq!(report, Report { outcome: Outcome::NotDue, retry_after_ms: Some(7_000) });
        assert_eq!(h.ledger.get(&k).rec.status, Status::Retryable);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_expired_lease_of_a_crashed_worker_is_taken_over() {
        let (proj, _) = scripted(|_| apply(&["x"]));
        let h = harness(proj);
        let crashed = WorkRecord {
            lease_owner: Some("crashed".into()),
            lease_expires_at_ms: Some(NOW - 1),
            attempts: 1,
            window_start_ms: Some(NOW - 40_000),
            ..record("a", Status::Processing)
        };
        let k = put(&h, crashed);
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        let rec = h.ledger.get(&k).rec;
        assert_eq!(rec.status, Status::Processed);
        assert_eq!(rec.attempts, 2, "the crashed lease counts as an attempt");
        assert_eq!(rec.window_start_ms, Some(NOW - 40_000), "the window is kept");
        assert_eq!(rec.completed_token, Some(h.ledger.last_lease_token()));
    }

    // ----------------------------------------------------------------- commits

    #[tokio::test]
    async fn an_applied_commit_completes_the_record_and_dispatches_its_outbox() {
        let (proj, _) = scripted(|_| {
            Ok(Decision::Apply(vec![
                op("sub#1", OnConflict::Stale).notify(notify("subscription.changed")),
                op("seats#1", OnConflict::AlreadyApplied).notify(notify("seats.changed")),
            ]))
        });
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));

        let s = h.ledger.get(&k);
        assert_eq!(s.rec.status, Status::Processed);
        assert_eq!(s.outcome.as_deref(), Some("applied"));
        assert_eq!(s.rec.completed_token, Some(h.ledger.last_lease_token()));
        assert_eq!((s.rec.attempts, s.rec.failures), (1, 0));
        assert_eq!(s.rec.window_start_ms, Some(NOW));
        assert_eq!(h.ledger.committed(), ["sub#1", "seats#1"]);
        let ids: Vec<String> = ["subscription.changed", "seats.changed"]
            .iter()
            .map(|a| format!("outbox#{}", idempotency_key(k.as_str(), a)))
            .collect();
        assert_eq!(h.dispatch.dispatched(), ids);
        assert!(h.queue.sent().is_empty());
    }

    #[tokio::test]
    async fn ops_of_every_matching_projection_commit_together() {
        let (a, _) = scripted(|_| apply(&["a#1"]));
        let (b, _) = scripted(|_| Ok(Decision::Ignore("not mine")));
        let (c, _) = scripted(|_| apply(&["c#1"]));
        let h = harness_with(Registry::new().register(a).register(b).register(c), settings());
        let k = put(&h, record("a", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        let commits = h.ledger.commits();
        assert_eq!(commits.len(), 1);
        assert_eq!(commits[0].ops, ["a#1", "c#1"]);
    }

    #[tokio::test]
    async fn no_projection_for_the_event_type_completes_as_ignored() {
        let h = harness_with(Registry::new(), settings());
        let k = put(&h, record("a", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.outcome.as_deref()), (Status::Processed, Some("ignored")));
    }

    #[tokio::test]
    async fn a_duplicate_decision_completes_as_duplicate() {
        let (proj, _) = scripted(|_| Ok(Decision::Duplicate));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Duplicate));
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.outcome.as_deref()), (Status::Processed, Some("duplicate")));
    }

    #[tokio::test]
    async fn the_subject_is_committed_with_the_completion() {
        let (mut proj, _) = scripted(|_| apply(&["x"]));
        proj.subject = Some("cus_7".into());
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        assert_eq!(h.ledger.commits()[0].subject.as_deref(), Some("cus_7"));
        assert_eq!(h.ledger.get(&k).subject.as_deref(), Some("cus_7"));
    }

    #[tokio::test]
    async fn a_crash_after_the_commit_leaves_the_outbox_to_the_sweeper_and_the_redelivery_is_final() {
        let (proj, calls) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale).notify(notify("n"))])));
        let mut h = harness(proj);
        h.p.fault = ProcessorFault::AfterCommit;
        let k = put(&h, record("a", Status::Received));
        assert!(h.p.process(&k, NOW).await.is_err());
        assert_eq!(h.ledger.get(&k).rec.status, Status::Processed);
        assert!(h.dispatch.dispatched().is_empty());
        h.p.fault = ProcessorFault::None;
        assert_eq!(h.p.process(&k, NOW + 40_000).await.unwrap(), done(Outcome::AlreadyFinal));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    // ----------------------------------------------------------------- fencing

    #[tokio::test]
    async fn a_commit_fenced_by_a_worker_that_took_over_is_fenced() {
        let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale).notify(notify("n"))])));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        h.ledger.script([Step::TakeOver("other")]);
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Fenced));
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.rec.lease_owner.as_deref()), (Status::Processing, Some("other")));
        assert_eq!(s.rec.completed_token, None);
        assert!(h.ledger.committed().is_empty());
        assert!(h.dispatch.dispatched().is_empty());
        assert!(h.ledger.history_of(&k).is_empty());
    }

    #[tokio::test]
    async fn a_commit_whose_acknowledgement_was_lost_is_recognised_as_ours() {
        let (proj, _) =
            scripted(|_| Ok(Decision::Apply(vec![sequence::apply_next("t", STREAM, 2, "v", 1, HashMap::new())])));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        let waiter = put(&h, WorkRecord { next_attempt_at_ms: Some(NOW + 50_000), ..due("b", 10_000) });
        h.ledger.edit(&waiter, |s| s.error_code = Some(GAP.into()));
        h.ledger.state().waiters.insert((STREAM.into(), 3), waiter.clone());
        h.ledger.script([Step::LoseAck]);

        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        let s = h.ledger.get(&k);
        assert_eq!(s.rec.status, Status::Processed);
        assert_eq!(s.rec.completed_token.as_deref(), Some(h.ledger.commits()[0].token.as_str()));
        assert_eq!(h.ledger.get(&waiter).rec.next_attempt_at_ms, Some(NOW), "the successor is still woken");
        assert_eq!(h.queue.sent(), [waiter]);
    }

    #[tokio::test]
    async fn a_worker_taken_over_while_planning_is_fenced_from_its_exit() {
        let ledger = MemLedger::default();
        let (queue, dispatch) = (RecQueue::default(), RecDispatch::default());
        let steal = ledger.clone();
        let (proj, _) = scripted(move |_| {
            steal.edit(&key("a"), |s| s.rec.lease_owner = Some("other".into()));
            Err(ProjectionError::Transient("boom".into()))
        });
        let p = Processor::with_ports(ledger.clone(), cx(), Registry::new().register(proj), Some(dispatch), settings())
            .with_queue(queue);
        ledger.insert_with_payload(record("a", Status::Received), &body("a"));
        let k = key("a");
        assert_eq!(p.process(&k, NOW).await.unwrap(), done(Outcome::Fenced));
        let rec = ledger.get(&k).rec;
        assert_eq!((rec.status, rec.lease_owner.as_deref(), rec.failures), (Status::Processing, Some("other"), 0));
        assert!(ledger.history_of(&k).is_empty());
    }

    // --------------------------------------------------------------- conflicts

    #[tokio::test]
    async fn a_stale_conflict_drops_the_op_and_completes_as_stale() {
        let (proj, calls) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale).notify(notify("n"))])));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        h.ledger.script([Step::Answer(CommitResult::Conflicts(vec![0]))]);
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Stale));
        let commits = h.ledger.commits();
        assert_eq!(commits.len(), 2);
        assert_eq!((commits[1].ops.len(), commits[1].outcome.as_str()), (0, "stale"));
        assert_eq!(h.ledger.get(&k).outcome.as_deref(), Some("stale"));
        assert!(h.dispatch.dispatched().is_empty(), "a dropped op sends nothing");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "no replanning");
    }

    #[tokio::test]
    async fn an_already_applied_conflict_completes_as_duplicate() {
        let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::AlreadyApplied)])));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        h.ledger.script([Step::Answer(CommitResult::Conflicts(vec![0]))]);
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Duplicate));
        assert_eq!(h.ledger.commits()[1].outcome, "duplicate");
    }

    #[tokio::test]
    async fn the_ops_without_conflict_still_apply() {
        let (proj, _) = scripted(|_| {
            Ok(Decision::Apply(vec![
                op("old", OnConflict::Stale),
                op("new", OnConflict::Stale).notify(notify("n")),
                op("done", OnConflict::AlreadyApplied),
            ]))
        });
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        h.ledger.script([Step::Answer(CommitResult::Conflicts(vec![0, 2]))]);
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        assert_eq!(h.ledger.committed(), ["new"]);
        assert_eq!(h.dispatch.dispatched().len(), 1);
    }

    #[tokio::test]
    async fn a_replan_conflict_plans_again_from_fresh_reads() {
        let (proj, calls) = scripted(|round| apply(&[if round == 0 { "v1" } else { "v2" }]));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        h.ledger.script([Step::Answer(CommitResult::Conflicts(vec![0]))]);
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let ops: Vec<Vec<String>> = h.ledger.commits().into_iter().map(|c| c.ops).collect();
        assert_eq!(ops, [["v1"], ["v2"]]);
        assert_eq!(h.ledger.committed(), ["v2"]);
    }

    #[tokio::test]
    async fn replanning_that_never_settles_retries_as_contention() {
        let (proj, calls) = scripted(|_| apply(&["v"]));
        let h = harness(proj);
        let k = put(&h, due("a", 10_000));
        h.ledger.edit(&k, |s| s.rec.failures = 1);
        h.ledger.script((0..MAX_PLAN_ROUNDS).map(|_| Step::Answer(CommitResult::Conflicts(vec![0]))));
        let report = h.p.process(&k, NOW).await.unwrap();
        assert_eq!(report.outcome, Outcome::Retrying);
        assert_eq!(calls.load(Ordering::SeqCst), MAX_PLAN_ROUNDS);
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.error_code.as_deref()), (Status::Retryable, Some("contention")));
        assert_eq!(s.rec.failures, 1, "contention spends no failure");
    }

    #[tokio::test]
    async fn transaction_contention_retries_as_transient() {
        let (proj, calls) = scripted(|_| apply(&["v"]));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        h.ledger.script([Step::Answer(CommitResult::Contention)]);
        let report = h.p.process(&k, NOW).await.unwrap();
        let s = h.ledger.get(&k);
        assert_eq!(
            report,
            Report { outcome: Outcome::Retrying, retry_after_ms: Some(s.rec.next_attempt_at_ms.unwrap() - NOW) }
        );
        assert_eq!((s.rec.status, s.error_code.as_deref(), s.rec.failures), (Status::Retryable, Some("contention"), 0));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(h.ledger.committed().is_empty());
    }

    // ---------------------------------------------------------- classification

    #[tokio::test]
    async fn a_permanent_projection_error_is_dead_unsupported_event() {
        let (proj, _) = scripted(|_| Err(ProjectionError::Permanent("no such plan".into())));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Dead));
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.dead_reason.as_deref()), (Status::Dead, Some("unsupported_event")));
        assert_eq!(s.rec.failures, 0);
        assert_eq!(h.ledger.history_of(&k)[0].0, "dead");
    }

    #[tokio::test]
    async fn a_business_failure_retries_and_spends_one_failure() {
        let (proj, _) = scripted(|_| Err(ProjectionError::Transient("rule failed".into())));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        let report = h.p.process(&k, NOW).await.unwrap();
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.error_code.as_deref(), s.rec.failures), (Status::Retryable, Some("projection"), 1));
        let delay = s.rec.next_attempt_at_ms.unwrap() - NOW;
        assert!((2_000..=4_000).contains(&delay), "first backoff step of 4 s with jitter: {delay}");
        assert_eq!(report, Report { outcome: Outcome::Retrying, retry_after_ms: Some(delay) });
        assert_eq!(h.ledger.history_of(&k)[0].0, "retry");
    }

    #[tokio::test]
    async fn business_failures_at_max_attempts_are_dead_attempts_exhausted() {
        let (proj, _) = scripted(|_| Err(ProjectionError::Transient("rule failed".into())));
        let h = harness(proj);
        // max_attempts = 3: the second failure still retries, the third is dead.
        let second = put(&h, WorkRecord { failures: 1, ..due("a", 10_000) });
        assert_eq!(h.p.process(&second, NOW).await.unwrap().outcome, Outcome::Retrying);
        assert_eq!(h.ledger.get(&second).rec.failures, 2);
        let third = put(&h, WorkRecord { failures: 2, ..due("b", 10_000) });
        assert_eq!(h.p.process(&third, NOW).await.unwrap(), done(Outcome::Dead));
        let s = h.ledger.get(&third);
        assert_eq!((s.rec.status, s.dead_reason.as_deref()), (Status::Dead, Some("attempts_exhausted")));
    }

    #[tokio::test]
    async fn an_unavailable_dependency_retries_without_spending_failures() {
        let (proj, _) = scripted(|_| Err(ProjectionError::Unavailable("provider 503".into())));
        let h = harness(proj);
        let k = put(&h, WorkRecord { failures: 2, ..due("a", 10_000) });
        let report = h.p.process(&k, NOW).await.unwrap();
        assert_eq!(report.outcome, Outcome::Retrying);
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.error_code.as_deref()), (Status::Retryable, Some("unavailable")));
        assert_eq!(s.rec.failures, 2, "one short of the budget, still not dead");
    }

    #[tokio::test]
    async fn a_record_past_the_transient_bound_is_dead_transient_exhausted() {
        let (proj, calls) = scripted(|_| Err(ProjectionError::Unavailable("provider 503".into())));
        let h = harness(proj);
        let k = put(&h, due("a", settings().transient_bound_ms));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Dead));
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.dead_reason.as_deref()), (Status::Dead, Some("transient_exhausted")));
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no plan once the bound has passed");
    }

    #[tokio::test]
    async fn a_transient_retry_is_not_scheduled_past_the_transient_bound() {
        let (proj, calls) = scripted(|_| Err(ProjectionError::Unavailable("provider 503".into())));
        let h = harness(proj);
        let k = put(&h, WorkRecord { attempts: 9, ..due("a", settings().transient_bound_ms - 1_500) });
        let report = h.p.process(&k, NOW).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(report, Report { outcome: Outcome::Retrying, retry_after_ms: Some(1_500) });
        assert_eq!(h.ledger.get(&k).rec.next_attempt_at_ms, Some(NOW + 1_500));
    }

    #[tokio::test]
    async fn a_payload_not_stored_yet_is_a_transient_retry() {
        let (proj, calls) = scripted(|_| apply(&["x"]));
        let h = harness(proj);
        let k = key("a");
        h.ledger.insert(WorkRecord { failures: 1, ..record("a", Status::Received) });
        assert_eq!(h.p.process(&k, NOW).await.unwrap().outcome, Outcome::Retrying);
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.error_code.as_deref()), (Status::Retryable, Some("payload_missing")));
        assert_eq!(s.rec.failures, 1);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_malformed_payload_is_dead_malformed_payload() {
        let (proj, calls) = scripted(|_| apply(&["x"]));
        let h = harness(proj);
        let k = key("a");
        h.ledger.insert_with_payload(record("a", Status::Received), b"{not json");
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Dead));
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.dead_reason.as_deref()), (Status::Dead, Some("malformed_payload")));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    // ----------------------------------------------------------------- parking

    #[tokio::test]
    async fn an_unknown_subject_parks_the_record_with_its_subject() {
        let (mut proj, _) = scripted(|_| Ok(Decision::Park("no mapping for cus_42".into())));
        proj.subject = Some("cus_42".into());
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Parked));
        let s = h.ledger.get(&k);
        assert_eq!(s.rec.status, Status::Parked);
        assert_eq!((s.park_reason.as_deref(), s.subject.as_deref()), (Some("no mapping for cus_42"), Some("cus_42")));
        assert!(h.ledger.commits().is_empty(), "no mutation");
        assert_eq!(h.ledger.history_of(&k), [("parked".to_owned(), "no mapping for cus_42".to_owned())]);
    }

    #[tokio::test]
    async fn a_park_from_any_projection_wins_over_apply() {
        let (a, _) = scripted(|_| apply(&["a#1"]));
        let (b, _) = scripted(|_| Ok(Decision::Park("unknown".into())));
        let h = harness_with(Registry::new().register(a).register(b), settings());
        let k = put(&h, record("a", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Parked));
        assert!(h.ledger.commits().is_empty());
    }

    // ------------------------------------------------------------------- gaps

    #[tokio::test]
    async fn a_gap_defers_with_a_waiter_pointer_without_spending_failures() {
        let (proj, _) = scripted(|_| defer_at(4));
        let h = harness(proj);
        let k = put(&h, WorkRecord { failures: 2, ..due("a", 10_000) });
        h.ledger.state().streams.insert(STREAM.into(), 2);
        let report = h.p.process(&k, NOW).await.unwrap();
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.error_code.as_deref()), (Status::Retryable, Some(GAP)));
        assert_eq!(s.rec.failures, 2);
        let delay = s.rec.next_attempt_at_ms.unwrap() - NOW;
        assert!(delay > 0 && delay <= settings().gap_bound_ms - 10_000, "{delay}");
        assert_eq!(report, Report { outcome: Outcome::Retrying, retry_after_ms: Some(delay.max(1_000)) });
        assert_eq!(h.ledger.state().waiters.get(&(STREAM.to_owned(), 4)), Some(&k));
        assert_eq!(h.ledger.history_of(&k)[0].0, "deferred");
        assert!(h.ledger.commits().is_empty());
    }

    #[tokio::test]
    async fn a_gap_past_its_bound_parks_as_gap() {
        let (proj, _) = scripted(|_| defer_at(4));
        let h = harness(proj);
        let k = put(&h, due("a", settings().gap_bound_ms));
        h.ledger.edit(&k, |s| s.error_code = Some(GAP.into()));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Parked));
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.park_reason.as_deref()), (Status::Parked, Some(GAP)));
        assert!(h.ledger.state().waiters.is_empty(), "a parked record leaves no pointer");
        let (kind, detail) = &h.ledger.history_of(&k)[0];
        assert!(kind == "parked" && detail.starts_with("gap: "), "{kind} {detail}");
    }

    #[tokio::test]
    async fn a_gap_whose_predecessor_landed_meanwhile_is_woken_and_retried_at_once() {
        let (proj, _) = scripted(|_| defer_at(4));
        let h = harness(proj);
        let k = put(&h, due("a", 10_000));
        // Seq 3 committed while this event was planning.
        h.ledger.state().streams.insert(STREAM.into(), 3);
        let report = h.p.process(&k, NOW).await.unwrap();
        assert_eq!(report, Report { outcome: Outcome::Retrying, retry_after_ms: Some(1_000) });
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.rec.next_attempt_at_ms), (Status::Retryable, Some(NOW)));
        assert_eq!(s.woken_at, Some(NOW));
        assert_eq!(s.rec.window_start_ms, None, "a wake starts a new window");
    }

    #[tokio::test]
    async fn a_commit_advancing_a_stream_wakes_the_waiter_at_the_next_position_and_queues_it() {
        let (proj, _) =
            scripted(|_| Ok(Decision::Apply(vec![sequence::apply_next("t", STREAM, 2, "v", 1, HashMap::new())])));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        let waiter = put(&h, WorkRecord { next_attempt_at_ms: Some(NOW + 50_000), ..due("b", 20_000) });
        h.ledger.edit(&waiter, |s| s.error_code = Some(GAP.into()));
        let parked = put(&h, record("c", Status::Parked));
        h.ledger.edit(&parked, |s| s.park_reason = Some(GAP.into()));
        {
            let mut st = h.ledger.state();
            st.waiters.insert((STREAM.into(), 3), waiter.clone());
            st.waiters.insert((STREAM.into(), 4), parked.clone());
        }

        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        assert_eq!(h.ledger.committed(), [STREAM]);
        assert_eq!(h.ledger.state().streams.get(STREAM), Some(&2));
        let w = h.ledger.get(&waiter);
        assert_eq!((w.rec.status, w.rec.next_attempt_at_ms), (Status::Retryable, Some(NOW)));
        assert_eq!(w.rec.window_start_ms, None);
        assert_eq!(h.ledger.history_of(&waiter)[0].0, "woken");
        assert_eq!(h.queue.sent(), [waiter], "only the next position is woken");
        assert_eq!(h.ledger.get(&parked).rec.status, Status::Parked);
    }

    #[tokio::test]
    async fn a_waiter_parked_on_the_gap_is_revived_by_its_predecessor() {
        let (proj, _) =
            scripted(|_| Ok(Decision::Apply(vec![sequence::apply_next("t", STREAM, 2, "v", 1, HashMap::new())])));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        let parked = put(&h, WorkRecord { window_start_ms: Some(NOW - 90_000), ..record("b", Status::Parked) });
        h.ledger.edit(&parked, |s| s.park_reason = Some(GAP.into()));
        h.ledger.state().waiters.insert((STREAM.into(), 3), parked.clone());
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        let w = h.ledger.get(&parked).rec;
        assert_eq!((w.status, w.next_attempt_at_ms, w.window_start_ms), (Status::Retryable, Some(NOW), None));
        assert_eq!(h.queue.sent(), [parked]);
    }

    #[tokio::test]
    async fn a_waiter_that_no_longer_waits_on_the_gap_is_not_woken() {
        let (proj, _) =
            scripted(|_| Ok(Decision::Apply(vec![sequence::apply_next("t", STREAM, 2, "v", 1, HashMap::new())])));
        let h = harness(proj);
        let k = put(&h, record("a", Status::Received));
        // Parked by an operator, not on the gap.
        let parked = put(&h, record("b", Status::Parked));
        h.ledger.edit(&parked, |s| s.park_reason = Some("operator: hold".into()));
        h.ledger.state().waiters.insert((STREAM.into(), 3), parked.clone());
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
        assert_eq!(h.ledger.get(&parked).rec.status, Status::Parked);
        assert!(h.queue.sent().is_empty());
        assert!(h.ledger.history_of(&parked).is_empty());
    }

    /// The config allows `gap_bound == transient_bound` ("must be <=", so a
    /// gap waiter is not dead-lettered as transient first), and the defer
    /// schedules the last look exactly at the gap bound; that look meets the
    /// transient bound first.
    #[tokio::test]
    async fn a_gap_waiter_reaching_a_gap_bound_just_below_the_transient_bound_parks_as_gap() {
        // Equal bounds are refused by the configuration: the waiter's last
        // look lands on the gap bound, where the transient bound is checked
        // first and would dead-letter it.
        let (proj, _) = scripted(|_| defer_at(4));
        let bounds = ProcessorSettings { gap_bound_ms: 599_000, transient_bound_ms: 600_000, ..settings() };
        let h = harness_with(Registry::new().register(proj), bounds);
        let k = put(&h, WorkRecord { attempts: 9, ..due("a", 599_000 - 1_500) });
        // The last defer inside the bound schedules the next look at the bound itself.
        assert_eq!(h.p.process(&k, NOW).await.unwrap().outcome, Outcome::Retrying);
        let next = h.ledger.get(&k).rec.next_attempt_at_ms.unwrap();
        assert_eq!(next, NOW + 1_500);
        assert_eq!(h.p.process(&k, next).await.unwrap(), done(Outcome::Parked));
        let s = h.ledger.get(&k);
        assert_eq!((s.rec.status, s.park_reason.as_deref()), (Status::Parked, Some(GAP)));
    }

    // ------------------------------------------------- the memory ledger itself

    #[tokio::test]
    async fn the_memory_ledger_follows_the_adapter_conditions() {
        let l = MemLedger::default();
        let k = key("a");
        l.insert(record("a", Status::Received));
        let LeaseResult::Leased(r) = l.lease(&k, "t1", NOW, 30_000).await.unwrap() else { panic!() };
        assert_eq!((r.attempts, r.window_start_ms), (1, Some(NOW)));
        // Our own lease whose acknowledgement was lost; another worker is busy.
        assert!(matches!(l.lease(&k, "t1", NOW, 30_000).await.unwrap(), LeaseResult::Leased(_)));
        assert_eq!(l.lease(&k, "t2", NOW, 30_000).await.unwrap(), LeaseResult::Busy { until_ms: NOW + 30_000 });
        // Exits are fenced by the lease; a retried exit recognises itself.
        let exit = Exit::Retry { next_at_ms: NOW + 5, code: "x", message: "m", failure: true };
        assert!(!l.leave(&k, "t2", &exit, NOW).await.unwrap());
        assert!(l.leave(&k, "t1", &exit, NOW).await.unwrap());
        assert!(l.leave(&k, "t1", &exit, NOW).await.unwrap());
        assert_eq!(l.get(&k).rec.failures, 1);
        assert_eq!(l.lease(&k, "t3", NOW, 30_000).await.unwrap(), LeaseResult::NotDue { at_ms: NOW + 5 });
        // Only a gap waiter wakes.
        assert!(!l.wake(&k, NOW).await.unwrap());
        let LeaseResult::Leased(_) = l.lease(&k, "t3", NOW + 5, 30_000).await.unwrap() else { panic!() };
        assert!(l.commit(&k, "t2", &[], "applied", None, NOW).await.unwrap() == CommitResult::Fenced);
        assert!(matches!(l.commit(&k, "t3", &[], "applied", None, NOW).await.unwrap(), CommitResult::Committed { .. }));
        assert_eq!(l.lease(&k, "t4", NOW, 30_000).await.unwrap(), LeaseResult::Final(Status::Processed));
        assert_eq!(l.completed_by(&k).await.unwrap().as_deref(), Some("t3"));
    }
}
