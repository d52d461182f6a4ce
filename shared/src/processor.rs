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

use crate::admission::{Admission, Admitted, Arrival, BATCH_TYPE, Step, batch_id};
use crate::clock::Ambient;
use crate::config::ProcessorSettings;
use crate::config::ProviderKind;
use crate::identity::{EventKey, payload_hash};
use crate::ledger::{Applied, CommitResult, Exit, GAP, LeaseResult, NewEvent, PortError, Via, WorkRecord};
use crate::message::{Delivery, OutboxItem, OutboxMessage, idempotency_key};
use crate::ports::{Dispatch, Ledger, WorkLedger, WorkQueue};
use crate::projection::sequence::Position;
use crate::projection::{Decision, EventContext, Gap, OnConflict, Op, ProjectionContext, ProjectionError, Registry};
use crate::routes::{Kind, Routes, delivery_action};
use crate::telemetry::TenantMetrics;
use crate::verify::registry::decode;

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
    tenant_metrics: TenantMetrics,
    /// Where verified events are handed on (`HOOKLEDGER_ROUTES`).
    routes: std::sync::Arc<Routes>,
    /// The data keys of sealed payloads ([`crate::sealing`]).
    keys: Option<std::sync::Arc<dyn crate::ports::PayloadKeys>>,
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

/// Whether a record is a large batch's own record: its type says so and its
/// identity is its payload's hash (which no provider's event id can be).
fn is_large_batch(record: &WorkRecord) -> bool {
    record.event_type.as_deref() == Some(BATCH_TYPE) && record.event_id == batch_id(&record.payload_hash)
}

/// What a commit needs to deliver its event: its type and payload.
struct Routed<'a> {
    event_type: &'a str,
    payload: &'a [u8],
}

/// The queue of a processor built without one: sends nothing (the claimed
/// events are re-driven by the reconciler).
struct NoQueue;

impl WorkQueue for NoQueue {
    async fn send(&self, _: &EventKey, _: &str) -> Result<(), PortError> {
        Err(PortError::Unavailable { service: "sqs", message: "no queue".into() })
    }
    async fn send_with_payload(&self, _: &EventKey, _: &str, _: &[u8]) -> Result<(), PortError> {
        Err(PortError::Unavailable { service: "sqs", message: "no queue".into() })
    }
}

impl<L: WorkLedger + Ledger, Q: WorkQueue, D: Dispatch> Processor<L, Q, D> {
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
            tenant_metrics: TenantMetrics::default(),
            routes: std::sync::Arc::new(Routes::none()),
            keys: None,
            fault: ProcessorFault::None,
        }
    }

    /// Opens sealed payloads with the data keys in `keys`, and notes their
    /// subjects there for erasure.
    pub fn with_keys(mut self, keys: std::sync::Arc<dyn crate::ports::PayloadKeys>) -> Self {
        self.keys = Some(keys);
        self
    }

    /// `bytes` opened: the payload, and whether it was sealed. The event's
    /// key is read once per call of `work` (`state`).
    async fn open(
        &self,
        key: &EventKey,
        bytes: Vec<u8>,
        state: &mut Option<crate::sealing::KeyState>,
    ) -> Result<Result<(Vec<u8>, bool), crate::sealing::Unreadable>, PortError> {
        if !crate::sealing::is_sealed(&bytes) {
            return Ok(Ok((bytes, false)));
        }
        let state = match state {
            Some(s) => s,
            None => state.insert(match &self.keys {
                Some(keys) => keys.key_of(key).await?,
                None => crate::sealing::KeyState::Missing,
            }),
        };
        Ok(crate::sealing::open_with(state, key, bytes).map(|p| (p, true)))
    }

    /// Notes a sealed event's subject in the key store, before the record
    /// names it, so `erase --subject` finds every event that could hold it
    /// (a note whose record never completes is harmless).
    async fn index_subject(&self, record: &WorkRecord, subject: Option<&str>) -> Result<(), PortError> {
        let (Some(keys), Some(subject)) = (&self.keys, subject) else { return Ok(()) };
        let expires_at = crate::policy::expires_at(record.received_at_ms, self.settings.retention_days);
        keys.index_subject(subject, &record.key, expires_at).await
    }

    /// Hands the events these routes match to their destinations.
    pub fn with_routes(mut self, routes: std::sync::Arc<Routes>) -> Self {
        self.routes = routes;
        self
    }

    /// Counts these tenants' outcomes and latency in their own metrics.
    pub fn with_tenant_metrics(mut self, tenants: TenantMetrics) -> Self {
        self.tenant_metrics = tenants;
        self
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
        // Its exits may add or move due entries (a retry, a gap, re-checks, notifications).
        self.ledger.note_activity(now_ms).await;
        let leased = self.ledger.lease(key, &token, now_ms, self.settings.lease_ms).await?;
        let (report, record) = match leased {
            LeaseResult::Missing => (Report::done(Outcome::Missing), None),
            LeaseResult::Final(_) => (Report::done(Outcome::AlreadyFinal), None),
            LeaseResult::Busy { until_ms } => (Report::later(Outcome::Busy, until_ms - now_ms), None),
            LeaseResult::NotDue { at_ms } => (Report::later(Outcome::NotDue, at_ms - now_ms), None),
            LeaseResult::Leased(record) => {
                let report = match self.work(&record, carried, &token, now_ms).await {
                    // Retrying the same request cannot help: dead now, with the service's answer.
                    Err(e @ PortError::Caller { .. }) => {
                        tracing::error!(key = %key, error = %e, "a request was refused as invalid; dead");
                        self.dead(&record, &token, "caller_error", &e.to_string(), now_ms).await?
                    }
                    other => other?,
                };
                (report, Some(record))
            }
        };
        let provider = record.as_ref().map_or("unknown", |r| r.provider.as_str()).to_owned();
        metrics::counter!("processed", "outcome" => report.outcome.label(), "provider" => provider.clone())
            .increment(1);
        metrics::histogram!("processing_duration", "provider" => provider.clone())
            .record((self.ambient.instant() - started).as_secs_f64() * 1000.0);
        if let Some(r) = &record {
            let completed = report.retry_after_ms.is_none()
                && matches!(report.outcome, Outcome::Applied | Outcome::Stale | Outcome::Duplicate | Outcome::Ignored);
            let latency = completed.then(|| (now_ms - r.received_at_ms).max(0) as f64);
            if let Some(ms) = latency {
                metrics::histogram!("queue_to_complete", "provider" => provider).record(ms);
            }
            if completed || report.outcome == Outcome::Dead {
                self.tenant_metrics.finished(&r.tenant, report.outcome == Outcome::Dead, latency);
            }
            let duration_ms = (self.ambient.instant() - started).as_secs_f64() * 1000.0;
            let (event_type, outcome) = (r.event_type.as_deref().unwrap_or(""), report.outcome.label());
            if completed {
                // Done: the ledger is its evidence; a line per event only at DEBUG.
                tracing::debug!(key = %key, provider = %r.provider, endpoint = %r.endpoint, event_id = %r.event_id,
                    event_type, attempt = r.attempts, outcome, duration_ms, "processed");
            } else {
                // Retrying, parked, dead, deferred, fenced: what an operator looks for.
                tracing::info!(key = %key, provider = %r.provider, endpoint = %r.endpoint, event_id = %r.event_id,
                    event_type, attempt = r.attempts, outcome, duration_ms, "processed");
            }
        } else {
            tracing::debug!(key = %key, outcome = report.outcome.label(), "not leased");
        }
        Ok(report)
    }

    /// PROCESSING(token) → PARKED `reason` (no mutation): for an operator.
    async fn park(
        &self,
        record: &WorkRecord,
        token: &str,
        reason: &str,
        subject: Option<&str>,
        now_ms: i64,
    ) -> Result<Report, PortError> {
        let exit = Exit::Park { reason, subject };
        let parked = self.ledger.leave(&record.key, token, &exit, now_ms).await?;
        if !parked {
            return Ok(Report::done(Outcome::Fenced));
        }
        self.history(&record.key, "parked", reason, now_ms).await;
        metrics::counter!("parked", "provider" => record.provider.clone()).increment(1);
        Ok(Report::done(Outcome::Parked))
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
        // payload item, whichever is the record's payload first; a sealed
        // one opened under the event's key (its hash is of what it seals).
        let ours = |p: &(Vec<u8>, bool)| payload_hash(&p.0) == record.payload_hash;
        let (mut state, mut unreadable) = (None, None);
        let mut found = None;
        for bytes in [record.payload.clone(), carried.map(<[u8]>::to_vec)].into_iter().flatten() {
            match self.open(key, bytes, &mut state).await? {
                Ok(p) if ours(&p) => {
                    found = Some(p);
                    break;
                }
                Ok(_) => {}
                Err(e) => unreadable = Some(e),
            }
        }
        if found.is_none() {
            // The payload item is the record's by its key (`payload#<hash>`).
            if let Some(bytes) = self.ledger.payload(key, &record.payload_hash).await? {
                match self.open(key, bytes, &mut state).await? {
                    Ok(p) => found = Some(p),
                    Err(e) => unreadable = Some(e),
                }
            }
        }
        if found.is_none() {
            if let Some(e) = unreadable {
                return self.unreadable(record, token, e, now_ms).await;
            }
        }
        let (payload, sealed) = match found {
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
        if is_large_batch(record) {
            return self.split_boxed(record, token, &payload, sealed, now_ms).await;
        }
        // An element of a batch that could not be read as an event: kept for
        // an operator, never applied (its bytes are the payload).
        if crate::verify::is_malformed_element(&record.event_id) {
            return self.park(record, token, crate::verify::MALFORMED_ELEMENT, None, now_ms).await;
        }
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
            received_at_ms: record.received_at_ms,
            processing_at_ms: now_ms,
        };

        let subject = self.registry.subject(&event);
        if sealed {
            if let Err(e) = self.index_subject(record, subject.as_deref()).await {
                let f = Failure::Transient { code: "subject_index", message: e.to_string() };
                return self.fail(record, token, f, now_ms).await;
            }
        }
        for _round in 0..MAX_PLAN_ROUNDS {
            let decision = match self.plan(&event).await {
                Ok(d) => d,
                Err(e) => return self.fail(record, token, e.into(), now_ms).await,
            };
            let (ops, duplicate) = match decision {
                Decision::Park(reason) => return self.park(record, token, &reason, subject.as_deref(), now_ms).await,
                Decision::Defer(gap) => return self.defer(record, token, gap, subject.as_deref(), now_ms).await,
                Decision::Ignore(_) => (Vec::new(), false),
                Decision::Duplicate => (Vec::new(), true),
                Decision::Apply(ops) => (ops, false),
            };
            let routed = Routed { event_type: &event.event_type, payload: &payload };
            match self.commit(record, token, ops, duplicate, subject.as_deref(), Some(routed), now_ms).await? {
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

    /// The deliveries of an event to the destinations its routes name: one
    /// outbox message per destination, its envelope without the event (the
    /// dispatcher adds it), keyed by (event, destination).
    fn deliveries(
        &self,
        record: &WorkRecord,
        routed: &Routed<'_>,
        subject: Option<&str>,
        now_ms: i64,
    ) -> Vec<(OutboxMessage, Kind)> {
        let matching = self.routes.matching(&record.endpoint, &record.provider, &record.tenant, routed.event_type);
        let time = |ms: i64| crate::verify::sns::format_timestamp(ms.div_euclid(1000));
        matching
            .into_iter()
            .map(|d| {
                let action = delivery_action(&d.name);
                let fifo = matches!(d.kind, Kind::Sqs { fifo: true }) || d.target.ends_with(".fifo");
                // FIFO: order per subject; standard SQS: the tenant's fair-queue group.
                let group = if fifo { subject.unwrap_or(&record.tenant) } else { &record.tenant };
                let mut head = serde_json::json!({
                    "idempotency_key": idempotency_key(record.key.as_str(), &action),
                    "destination": d.name,
                    "provider": record.provider,
                    "endpoint": record.endpoint,
                    "tenant": record.tenant,
                    "event_id": record.event_id,
                    "event_type": routed.event_type,
                    "via": record.via.as_str(),
                    "received_at": time(record.received_at_ms),
                    "processed_at": time(now_ms),
                    "subject": subject,
                });
                if let (Some(policy), Some(h)) = (&record.payload_policy, head.as_object_mut()) {
                    // What the endpoint's payload policy kept: `event` is the redacted payload.
                    h.insert("payload_policy".into(), serde_json::Value::from(policy.as_str()));
                }
                let message = OutboxMessage {
                    topic_arn: d.target.clone(),
                    action,
                    group: group.to_owned(),
                    body: head,
                    delivery: Some(Delivery {
                        destination: d.name.clone(),
                        source: d.source.clone(),
                        detail_type: routed.event_type.to_owned(),
                        payload_hash: record.payload_hash.clone(),
                        received_at_ms: record.received_at_ms,
                    }),
                };
                (message, d.kind)
            })
            .collect()
    }

    /// Commits the plan (docs/architecture.md "The commit"). Each guarded
    /// op (the building blocks') is written on its own, guarded by its own
    /// conditions: a repeat, by a retry or by a worker fenced out
    /// meanwhile, is a no-op or the same write, so a crash before the
    /// completion converges when the record is processed again. Then the
    /// completion marker, fenced by the lease: alone, with each delivery of
    /// the event's routes written on its own before it; or, when the plan
    /// has ops that need the fence (an unguarded `ADD`), in one transaction
    /// with those ops and the deliveries. Ops whose conditions say "stale"
    /// or "already applied" are dropped. An event whose outcome is
    /// `applied` or `ignored` is delivered to its routes' destinations:
    /// the deliveries are written claimed by this lease, then sent at once.
    /// `Ok(None)`: an op asked to replan.
    #[allow(clippy::too_many_arguments)]
    async fn commit(
        &self,
        record: &WorkRecord,
        token: &str,
        ops: Vec<Op>,
        mut duplicate: bool,
        subject: Option<&str>,
        routed: Option<Routed<'_>>,
        now_ms: i64,
    ) -> Result<Option<Report>, PortError> {
        let key = &record.key;
        let planned = !ops.is_empty();
        let mut stale = false;
        let (deliveries, kinds): (Vec<OutboxMessage>, Vec<Kind>) = routed
            .as_ref()
            .map(|r| self.deliveries(record, r, subject, now_ms))
            .unwrap_or_default()
            .into_iter()
            .unzip();
        if planned && crate::planted::is(crate::planted::Bug::CompleteBeforeProjection) {
            self.ledger.commit(key, token, &[], Outcome::Applied.label(), subject, now_ms).await?;
        }
        let (guarded, mut fenced): (Vec<Op>, Vec<Op>) = ops.into_iter().partition(|op| op.guarded);
        let mut applied: Vec<Op> = Vec::new();
        let mut outbox: Vec<String> = Vec::new();
        for op in guarded {
            match self.ledger.apply(key, token, &op, now_ms).await? {
                Applied::Written { outbox: ids } => {
                    outbox.extend(ids);
                    applied.push(op);
                }
                Applied::Conflict => match op.on_conflict {
                    OnConflict::Replan => return Ok(None),
                    OnConflict::Stale => stale = true,
                    OnConflict::AlreadyApplied => duplicate = true,
                },
                Applied::Contention => {
                    let f = Failure::Transient { code: "contention", message: "transaction conflict".into() };
                    return self.fail(record, token, f, now_ms).await.map(Some);
                }
            }
        }
        let outcome_of = |fenced: &[Op], stale: bool, duplicate: bool| {
            if !applied.is_empty() || !fenced.is_empty() {
                Outcome::Applied
            } else if stale {
                Outcome::Stale
            } else if duplicate {
                Outcome::Duplicate
            } else if planned {
                Outcome::Applied
            } else {
                Outcome::Ignored
            }
        };
        let routes_it = |o: Outcome| matches!(o, Outcome::Applied | Outcome::Ignored);
        let committed = |m: &OutboxMessage| OutboxItem::committed(key, m, self.settings.index_shards, now_ms);
        // Without fenced ops: each delivery on its own (one conditional
        // put, claimed by this lease); one written by an earlier attempt is
        // not written again, and its claim's lapse hands it to the sweep.
        let mut routed_items: Vec<OutboxItem> = Vec::new();
        let mut routed_kinds: Vec<Kind> = Vec::new();
        if fenced.is_empty() && routes_it(outcome_of(&fenced, stale, duplicate)) {
            for (m, kind) in deliveries.iter().zip(&kinds) {
                let op = Op { outbox: vec![m.clone()], ..Op::new(Vec::new(), OnConflict::AlreadyApplied) };
                match self.ledger.apply(key, token, &op, now_ms).await? {
                    Applied::Written { .. } => {
                        routed_items.push(committed(m));
                        routed_kinds.push(*kind);
                    }
                    Applied::Conflict => tracing::info!(key = %key, "delivery committed before; not again"),
                    Applied::Contention => {
                        let f = Failure::Transient { code: "contention", message: "transaction conflict".into() };
                        return self.fail(record, token, f, now_ms).await.map(Some);
                    }
                }
            }
        }
        // The guarded ops' notifications, written out of the due index: sent
        // now, under the lease, before the completion (a crash before it
        // leaves the record open, and its retry finds them); one not sent
        // goes into the index for the sweep before the completion.
        let early: Vec<OutboxItem> = applied
            .iter()
            .flat_map(|op| &op.outbox)
            .filter(|m| m.delivery.is_none())
            .map(committed)
            .filter(|i| outbox.contains(&i.id))
            .collect();
        self.notify_before_completion(&early, token, now_ms).await?;
        // With fenced ops: they and the deliveries go in the completion's transaction.
        let mut deliver = !fenced.is_empty() && !deliveries.is_empty();
        loop {
            let outcome = outcome_of(&fenced, stale, duplicate);
            let routing = deliver && routes_it(outcome);
            let mut with = fenced.clone();
            if routing {
                with.push(Op { outbox: deliveries.clone(), ..Op::new(Vec::new(), OnConflict::AlreadyApplied) });
                routed_items = deliveries.iter().map(committed).collect();
                routed_kinds.clone_from(&kinds);
            } else if !fenced.is_empty() {
                routed_items.clear();
                routed_kinds.clear();
            }
            let (ours, fenced_outbox) =
                match self.ledger.commit(key, token, &with, outcome.label(), subject, now_ms).await? {
                    CommitResult::Committed { outbox } => {
                        if self.fault == ProcessorFault::AfterCommit {
                            return Err(PortError::Unavailable {
                                service: "injected",
                                message: "crash after commit".into(),
                            });
                        }
                        (true, outbox)
                    }
                    CommitResult::Conflicts(mut indices) => {
                        if routing && indices.contains(&fenced.len()) {
                            // The deliveries exist already: the rest commits without them.
                            deliver = false;
                            indices.retain(|i| *i < fenced.len());
                            tracing::info!(key = %key, "deliveries committed before; not again");
                        }
                        if indices.iter().any(|i| fenced[*i].on_conflict == OnConflict::Replan) {
                            return Ok(None);
                        }
                        for i in indices.iter().rev() {
                            match fenced.remove(*i).on_conflict {
                                OnConflict::Stale => stale = true,
                                OnConflict::AlreadyApplied => duplicate = true,
                                OnConflict::Replan => {}
                            }
                        }
                        continue;
                    }
                    // Our own earlier completion whose response was lost looks fenced too.
                    CommitResult::Fenced => {
                        let ours = self.ledger.completed_by(key).await?.is_some_and(|t| t == token);
                        // The items our commit wrote, by their ids (stable per event and action).
                        let ids = fenced
                            .iter()
                            .flat_map(|op| &op.outbox)
                            .map(|m| crate::message::outbox_id(key.as_str(), &m.action))
                            .collect();
                        (ours, ids)
                    }
                    CommitResult::Contention => {
                        let f = Failure::Transient { code: "contention", message: "transaction conflict".into() };
                        return self.fail(record, token, f, now_ms).await.map(Some);
                    }
                };
            if !ours {
                return Ok(Some(Report::done(Outcome::Fenced)));
            }
            outbox.extend(fenced_outbox);
            // The projections' notifications this commit wrote, claimed by this lease.
            let notifications: Vec<OutboxItem> = applied
                .iter()
                .chain(&fenced)
                .flat_map(|op| &op.outbox)
                .map(committed)
                .filter(|i| {
                    outbox.contains(&i.id)
                        && !routed_items.iter().any(|r| r.id == i.id)
                        && !early.iter().any(|e| e.id == i.id)
                })
                .collect();
            for at in applied.iter().chain(&fenced).filter_map(|op| op.advances.as_ref()) {
                self.wake_successor(at, now_ms).await;
            }
            self.notify(&notifications, token, now_ms).await;
            self.deliver(&routed_items, &routed_kinds, token, routed.as_ref().map_or(&[][..], |r| r.payload), now_ms)
                .await;
            return Ok(Some(Report::done(outcome)));
        }
    }

    /// [`Self::split`], boxed where it is built: the rare path's future (and
    /// its temporary) stays out of every event's future and stack frame.
    fn split_boxed<'a>(
        &'a self,
        record: &'a WorkRecord,
        token: &'a str,
        payload: &'a [u8],
        sealed: bool,
        now_ms: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Report, PortError>> + Send + 'a>> {
        Box::pin(self.split(record, token, payload, sealed, now_ms))
    }

    /// A sealed payload that does not open: an erased event's never will
    /// (DEAD, `erased`: an erasure met a replay of it); a key not found or
    /// bytes that do not open are retried within the time bound.
    async fn unreadable(
        &self,
        record: &WorkRecord,
        token: &str,
        why: crate::sealing::Unreadable,
        now_ms: i64,
    ) -> Result<Report, PortError> {
        if why == crate::sealing::Unreadable::Erased {
            return self.dead(record, token, "erased", &why.to_string(), now_ms).await;
        }
        let f = Failure::Transient { code: "payload_unreadable", message: why.to_string() };
        self.fail(record, token, f, now_ms).await
    }

    /// A large batch's record (see [`crate::admission::LARGE_BATCH`]): its
    /// events, each with its exact bytes in the batch, go through the
    /// admission path (claimed, at most 10 at once, then sent together), and
    /// the batch's record is completed once every one is recorded. A retry
    /// (lost acknowledgement, crash between two calls) meets the events
    /// claimed before as duplicates and hands over any never sent; without
    /// a queue the claimed events wait for the reconciler's re-drive.
    async fn split(
        &self,
        record: &WorkRecord,
        token: &str,
        payload: &[u8],
        sealed: bool,
        now_ms: i64,
    ) -> Result<Report, PortError> {
        // A sealed batch's events are sealed under keys of their own.
        let keys = if sealed { self.keys.as_deref() } else { None };
        let split = ProviderKind::named(&record.provider).and_then(|p| p.split(payload));
        let events = match split {
            Some(Ok(events)) => events,
            Some(Err(e)) => return self.dead(record, token, "malformed_payload", &e.to_string(), now_ms).await,
            None => {
                return self.dead(record, token, "malformed_payload", "its provider sends no batches", now_ms).await;
            }
        };
        let prepared: Vec<(NewEvent, &[u8])> = events
            .iter()
            .map(|e| {
                let bytes = &payload[e.bytes.clone()];
                let arrival = Arrival {
                    provider: &record.provider,
                    endpoint: &record.endpoint,
                    tenant: &record.tenant,
                    event_id: &e.event_id,
                    event_type: e.event_type.as_deref(),
                    body: bytes,
                    hashes: None,
                    via: Via::Webhook,
                    batch_hash: Some(record.payload_hash.clone()),
                    retention_days: self.settings.retention_days,
                    index_shards: self.settings.index_shards,
                    notification: ProviderKind::named(&record.provider).is_some_and(|p| p.notification(bytes)),
                    // A `drop_after` endpoint's batch: its events drop their payloads too.
                    kept: (record.payload_policy.as_deref() == Some("drop_after"))
                        .then_some(crate::ledger::Kept { policy: "drop_after", verified_hash: None }),
                };
                (crate::admission::new_event(arrival, now_ms, self.ambient.token()), bytes)
            })
            .collect();
        let admitted = match &self.queue {
            Some(queue) => Admission { ledger: &self.ledger, queue, by: "batch", keys }.admit(&prepared).await,
            None => {
                let admission = Admission { ledger: &self.ledger, queue: &NoQueue, by: "batch", keys };
                let mut out = Vec::with_capacity(prepared.len());
                for (event, bytes) in &prepared {
                    let bytes = match admission.sealed(event, bytes).await {
                        Ok(b) => b,
                        Err(done) => {
                            out.push(done);
                            continue;
                        }
                    };
                    out.push(match admission.claim(event, &bytes).await {
                        Step::Send(_) => Admitted::New,
                        Step::Done(a) => a,
                    });
                }
                out
            }
        };
        let (mut new, mut failed) = (0u32, None);
        for a in admitted {
            match a {
                Admitted::New | Admitted::Released { .. } => new += 1,
                Admitted::Duplicate { .. } => {}
                Admitted::TooLarge { size, limit } => {
                    let message = format!("an event of {size} bytes is over the ledger's {limit}");
                    return self.dead(record, token, "payload_too_large", &message, now_ms).await;
                }
                Admitted::Failed { stage, error } => failed = failed.or(Some((stage, error))),
            }
        }
        if let Some((code, error)) = failed {
            let f = Failure::Transient { code, message: error.to_string() };
            return self.fail(record, token, f, now_ms).await;
        }
        tracing::info!(key = %record.key, events = prepared.len(), new, "large batch split");
        metrics::counter!("batch_events_split", "provider" => record.provider.clone()).increment(prepared.len() as u64);
        Ok(self
            .commit(record, token, Vec::new(), false, None, None, now_ms)
            .await?
            .unwrap_or(Report::done(Outcome::Ignored)))
    }

    /// This commit's deliveries, under the lease's token that committed
    /// them claimed. With a delivery queue, HTTPS deliveries are handed to
    /// it (one request for up to ten): the processor never waits on a
    /// partner. The others (AWS services answer within their SDK timeouts)
    /// are sent now, all at once (at most `routes::MAX_DESTINATIONS_PER_EVENT`):
    /// the send and the mark, two requests each; a failure backs off and is
    /// retried through the queue (or the reconciler's sweep).
    async fn deliver(&self, items: &[OutboxItem], kinds: &[Kind], token: &str, payload: &[u8], now_ms: i64) {
        let Some(d) = &self.dispatcher else { return };
        let is_apart = |k: &Kind| d.queued() && matches!(k, Kind::Https);
        let apart: Vec<OutboxItem> =
            items.iter().zip(kinds).filter(|(_, k)| is_apart(k)).map(|(i, _)| i.clone()).collect();
        if !apart.is_empty() {
            d.hand_over_committed(&apart, token).await;
        }
        let inline = items.iter().zip(kinds).filter(|(_, k)| !is_apart(k)).map(|(i, _)| i);
        let sends = inline.map(|item| async move {
            if let Err(e) = d.dispatch_committed(item, token, payload, now_ms).await {
                tracing::warn!(error = %e, outbox = %item.id, "delivery failed; the sweeper will retry");
            }
        });
        futures::future::join_all(sends).await;
    }

    /// Publishes this commit's notifications now, under the claim the
    /// commit wrote them with (`token`): the send and the mark, no claim. A
    /// failure leaves them for the sweeper (once the claim lapses).
    async fn notify(&self, items: &[OutboxItem], token: &str, now_ms: i64) {
        let Some(d) = &self.dispatcher else { return };
        for item in items {
            if let Err(e) = d.dispatch_committed(item, token, &[], now_ms).await {
                tracing::warn!(error = %e, outbox = %item.id, "outbox dispatch failed; the sweeper will retry");
            }
        }
    }

    /// Publishes the guarded ops' notifications before the completion, under
    /// the claim they were written with (`token`); each not published (its
    /// send failed, no dispatcher) goes into the due index for the sweep,
    /// due when that claim lapses at the latest. An error there fails the
    /// attempt: the record stays open and its retry finds the notification.
    async fn notify_before_completion(&self, items: &[OutboxItem], token: &str, now_ms: i64) -> Result<(), PortError> {
        for item in items {
            let sent = match &self.dispatcher {
                Some(d) => d.dispatch_committed(item, token, &[], now_ms).await,
                None => Ok(crate::message::Dispatched::Skipped),
            };
            if !matches!(sent, Ok(crate::message::Dispatched::Published)) {
                if let Err(e) = &sent {
                    tracing::warn!(error = %e, outbox = %item.id, "outbox dispatch failed; the sweeper will retry");
                }
                let at = now_ms + crate::message::DISPATCH_LEASE_MS;
                self.ledger.keep_for_sweep(&item.id, item.shard, at).await?;
            }
        }
        Ok(())
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
        let expires_at = crate::policy::expires_at(now_ms, self.settings.retention_days);
        if left <= 0 {
            // Parked, it is woken by the commit of its predecessor; should
            // that processor die between its commit and the wake-up, the
            // pointer (due now in the records partition) has the reconciler
            // look at the stream. Pointer first, then park: a crash between
            // leaves a pointer whose record the reconciler finds not parked.
            if let Some(at) = &gap.waiter {
                if let Err(e) = self.ledger.register_waiter(at, key, expires_at, Some(now_ms)).await {
                    tracing::warn!(key = %key, error = %e, "could not leave a waiter pointer; parked without it");
                }
            }
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
            if let Err(e) = self.ledger.register_waiter(at, key, expires_at, None).await {
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
                Ok(true) => self.ledger.wake(key, now_ms).await.map(|t| t.is_some()).map_err(|e| e.to_string()),
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
            Ok(Some(tenant)) => {
                self.history(&waiter, "woken", &format!("predecessor seq {} committed", at.seq), now_ms).await;
                metrics::counter!("gap_woken").increment(1);
                tracing::info!(key = %waiter, seq = next.seq, "gap closed; waiter due now");
                if let Some(q) = &self.queue {
                    if let Err(e) = q.send(&waiter, &tenant).await {
                        tracing::warn!(key = %waiter, error = %e, "could not queue the woken waiter; the reconciler will");
                    }
                }
            }
            Ok(None) => {}
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
pub(crate) mod tests;
