//! The processor's decisions on the memory world (`adapters::memory`): its
//! ledger evaluates the adapter's own conditions, projection writes
//! included; the outbox is dispatched by the real dispatcher.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::adapters::memory::{self, CommitCall, Fault, MemLedger, MemOutbox, MemPublisher, MemQueue, World, set};
use crate::backoff::Backoff;
use crate::clock::Ambient;
use crate::item::{Item, get_n, n, s};
use crate::ledger::Status;
use crate::message::{OutboxMessage, idempotency_key};
use crate::outbox::{Dispatched, Dispatcher};
use crate::projection::{PlanFuture, Projection, STATE_SK, Write, sequence};

pub(crate) const NOW: i64 = 50_000_000;
const TYPE: &str = "thing.changed";
const STREAM: &str = "seq#acct_1";

// ---------------------------------------------------------- the ledger, typed

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

/// The memory ledger seen as the processor's tests read and arrange it.
#[derive(Clone)]
pub(crate) struct Ledger {
    pub(crate) m: MemLedger,
    w: World,
}

impl Ledger {
    pub(crate) fn get(&self, key: &EventKey) -> Stored {
        let f = |name: &str| self.m.field(key, name);
        Stored {
            rec: self.m.record(key).unwrap_or_else(|| panic!("{key}: no record")),
            error_code: f("error_code"),
            error_message: f("error_message"),
            dead_reason: f("dead_reason"),
            park_reason: f("park_reason"),
            subject: f("subject"),
            outcome: f("outcome"),
            woken_at: f("woken_at").and_then(|v| v.parse().ok()),
        }
    }

    /// A record whose payload was never stored.
    fn insert(&self, rec: WorkRecord) {
        self.m.insert_record_only(&rec);
    }

    fn insert_with_payload(&self, rec: WorkRecord, body: &[u8]) {
        self.m.insert_record(&rec, body);
    }

    /// Changes the stored record (an arrangement, not a port call).
    fn edit(&self, key: &EventKey, f: impl FnOnce(&mut Stored)) {
        let mut s = self.get(key);
        f(&mut s);
        self.m.insert_record_only(&s.rec);
        self.m.edit(key, |item| {
            for (name, v) in [
                ("error_code", &s.error_code),
                ("error_message", &s.error_message),
                ("dead_reason", &s.dead_reason),
                ("park_reason", &s.park_reason),
                ("subject", &s.subject),
                ("outcome", &s.outcome),
            ] {
                match v {
                    Some(v) => set(item, name, v.as_str()),
                    None => set(item, name, None),
                }
            }
        });
    }

    fn commits(&self) -> Vec<CommitCall> {
        self.w.state().commits.clone()
    }

    /// Every op written before a commit, by label, and whether it was.
    fn applied(&self) -> Vec<(String, bool)> {
        self.w.state().applied.iter().map(|a| (a.op.clone(), a.written)).collect()
    }

    /// The ops written under a lease whose commit completed the record, by label.
    fn committed(&self) -> Vec<String> {
        let st = self.w.state();
        let done: Vec<(String, String)> =
            st.commits.iter().filter(|c| c.committed).map(|c| (c.key.clone(), c.token.clone())).collect();
        st.applied
            .iter()
            .filter(|a| a.written && done.contains(&(a.key.clone(), a.token.clone())))
            .map(|a| a.op.clone())
            .chain(st.commits.iter().filter(|c| c.committed).flat_map(|c| c.ops.clone()))
            .collect()
    }

    fn history_of(&self, key: &EventKey) -> Vec<(String, String)> {
        self.m.history(key)
    }

    /// The token of the last commit (the lease it was fenced by).
    fn last_lease_token(&self) -> String {
        self.commits().last().map(|c| c.token.clone()).unwrap_or_default()
    }

    /// A projection item already there: an op writing `label` conflicts.
    fn taken(&self, label: &str) {
        self.w.seed(&Item::from([("pk".to_owned(), s(label)), ("sk".to_owned(), s(STATE_SK))]));
    }

    /// The stream has applied up to `seq`.
    fn stream_at(&self, seq: i64) {
        self.w.seed(&Item::from([
            ("pk".to_owned(), s(STREAM)),
            ("sk".to_owned(), s(STATE_SK)),
            ("last_seq".to_owned(), n(seq)),
        ]));
    }

    fn stream(&self) -> Option<i64> {
        get_n(&self.w.state_item(STREAM)?, "last_seq")
    }

    fn add_waiter(&self, seq: i64, key: &EventKey) {
        memory::ready(self.m.register_waiter(&Position { stream: STREAM.into(), seq }, key, 0, None)).unwrap();
    }

    fn waiter_at(&self, seq: i64) -> Option<EventKey> {
        memory::ready(self.m.waiter(&Position { stream: STREAM.into(), seq })).unwrap()
    }
}

/// Another worker takes the lease of `key` over (ours expired) just before
/// the commit.
fn take_over_at_commit(h: &Harness, key: &EventKey, other: &'static str) {
    let key = key.clone();
    h.world.during("work.commit", 0, move |w| {
        w.ledger().edit(&key, |item| {
            let attempts: i64 =
                item.get("attempts").and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
            set(item, "lease_owner", other);
            set(item, "lease_expires_at", NOW + 30_000);
            set(item, "attempts", attempts + 1);
        });
    });
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

pub(crate) type TestProcessor = Processor<MemLedger, MemQueue, Dispatcher<MemOutbox, MemPublisher>>;

pub(crate) struct Harness {
    pub(crate) p: TestProcessor,
    pub(crate) ledger: Ledger,
    pub(crate) world: World,
    pub(crate) queue: MemQueue,
}

impl Harness {
    /// The outbox items dispatched (claimed by the dispatcher), in order.
    /// The outbox items sent and marked (a commit's own, without a claim).
    fn dispatched(&self) -> Vec<String> {
        self.world.calls_named("outbox.mark_sent")
    }
}

fn processor(w: &World, registry: Registry, settings: ProcessorSettings) -> TestProcessor {
    let dispatch = Dispatcher::with_ports(w.outbox(), w.publisher()).with_ambient(w.ambient().clone());
    Processor::with_ports(w.ledger(), w.projection_context(), registry, Some(dispatch), settings)
        .with_queue(w.queue())
        .with_ambient(w.ambient().clone())
}

fn harness_with(registry: Registry, settings: ProcessorSettings) -> Harness {
    let world = World::new(Ambient::fixed(NOW, 11)).with_shards(settings.index_shards);
    let p = processor(&world, registry, settings);
    Harness { p, ledger: Ledger { m: world.ledger(), w: world.clone() }, queue: world.queue(), world }
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
        via: crate::ledger::Via::Webhook,
        payload_policy: None,
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
    // Conflicts when the item is there already (`Ledger::taken`); a repeat
    // is harmless: written on its own before the completion.
    Op::guarded(vec![Write::put(label, Item::new()).when("attribute_not_exists(pk)")], on_conflict)
}

/// An op that needs the lease's fence (an `ADD` with no guard): committed
/// with the completion, in one transaction.
fn fenced_op(label: &str) -> Op {
    Op::new(vec![Write::update(label, "ADD n :one").value(":one", crate::item::n(1))], OnConflict::Stale)
}

fn notify(action: &str) -> OutboxMessage {
    OutboxMessage {
        topic_arn: "arn:aws:sns:us-east-1:000000000000:out".into(),
        delivery: None,
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
    assert_eq!(h.dispatched(), ids);
    assert!(h.world.calls_named("outbox.claim").is_empty(), "sent under the commit's claim: no claim of their own");
    assert!(h.queue.keys().is_empty());
}

#[tokio::test]
async fn ops_of_every_matching_projection_commit_together() {
    let (a, _) = scripted(|_| apply(&["a#1"]));
    let (b, _) = scripted(|_| Ok(Decision::Ignore("not mine")));
    let (c, _) = scripted(|_| apply(&["c#1"]));
    let h = harness_with(Registry::new().register(a).register(b).register(c), settings());
    let k = put(&h, record("a", Status::Received));
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    assert_eq!(h.ledger.commits().len(), 1);
    assert_eq!(h.ledger.applied(), [("a#1".to_owned(), true), ("c#1".to_owned(), true)]);
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
async fn a_crash_after_the_commit_finds_the_notification_sent_and_the_redelivery_is_final() {
    let (proj, calls) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale).notify(notify("n"))])));
    let mut h = harness(proj);
    h.p.fault = ProcessorFault::AfterCommit;
    let k = put(&h, record("a", Status::Received));
    assert!(h.p.process(&k, NOW).await.is_err());
    assert_eq!(h.ledger.get(&k).rec.status, Status::Processed);
    // A guarded op's notification goes before the completion: sent already.
    assert_eq!(h.dispatched().len(), 1);
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
    take_over_at_commit(&h, &k, "other");
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Fenced));
    let s = h.ledger.get(&k);
    assert_eq!((s.rec.status, s.rec.lease_owner.as_deref()), (Status::Processing, Some("other")));
    assert_eq!(s.rec.completed_token, None);
    assert!(h.ledger.committed().is_empty());
    // Its guarded write stands (the taker-over meets it as this event's
    // own), and so does the notification sent for it before the completion.
    assert_eq!(h.dispatched().len(), 1);
    assert!(h.ledger.history_of(&k).is_empty());
}

/// A guarded op's notification is written out of the due index and sent
/// before the completion: one not sent goes into the index first (due when
/// its claim lapses, or at its back-off), and the sweep sends it once.
#[tokio::test]
async fn a_notification_not_sent_before_the_completion_is_left_in_the_index_for_the_sweep() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale).notify(notify("n"))])));
    let h = harness(proj);
    h.world.publisher().fail_all();
    let k = put(&h, record("a", Status::Received));
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    let id = crate::message::outbox_id(k.as_str(), "n");
    let item = h.world.outbox().get(&id);
    assert!(item.due_shard.as_deref().is_some_and(|p| p.starts_with("out#")) && item.status == "PENDING", "{item:?}");
    h.world.clear_faults();
    let d = Dispatcher::with_ports(h.world.outbox(), h.world.publisher()).with_ambient(h.world.ambient().clone());
    let later = NOW + 3_600_000;
    assert_eq!(d.sweep(settings().index_shards, later, 0, 100).await.unwrap(), 1);
    assert_eq!(d.sweep(settings().index_shards, later + 1, 0, 100).await.unwrap(), 0, "once");
    assert_eq!(h.world.publisher().published().len(), 1);
}

/// The write that puts an unsent notification in the index commits and its
/// acknowledgement is lost: the SDK's retry meets it there (refused,
/// changing nothing) and the record completes.
#[tokio::test]
async fn a_notification_kept_for_the_sweep_whose_acknowledgement_was_lost_is_kept_once() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale).notify(notify("n"))])));
    let h = harness(proj);
    h.world.publisher().fail_all();
    h.world.inject("work.keep_for_sweep", 0, Some(1), Fault::LoseAckOnce);
    let k = put(&h, record("a", Status::Received));
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    let item = h.world.outbox().get(&crate::message::outbox_id(k.as_str(), "n"));
    assert!(item.due_shard.as_deref().is_some_and(|p| p.starts_with("out#")), "{item:?}");
    assert_eq!(item.status, "PENDING", "its back-off kept: {item:?}");
}

/// The attempt dies between its notification's write and its send: the
/// record stays open; its retry (the lease lapsed) meets the notification
/// its own and puts it in the index for the sweep, then completes.
#[tokio::test]
async fn a_notification_of_an_attempt_that_died_before_its_send_is_found_by_the_retry() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale).notify(notify("n"))])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    h.world.inject("outbox.mark_sent", 0, None, Fault::Unavailable);
    h.world.inject("work.keep_for_sweep", 0, Some(1), Fault::Unavailable);
    h.world.publisher().fail_all();
    assert!(h.p.process(&k, NOW).await.is_err(), "not kept for the sweep: the attempt fails");
    assert_eq!(h.ledger.get(&k).rec.status, Status::Processing, "not completed");
    let id = crate::message::outbox_id(k.as_str(), "n");
    assert_eq!(h.world.outbox().get(&id).due_shard, None, "out of the index");
    h.world.clear_faults();
    let retry = NOW + settings().lease_ms + 1;
    assert_eq!(h.p.process(&k, retry).await.unwrap(), done(Outcome::Applied));
    assert_eq!(h.ledger.get(&k).rec.status, Status::Processed);
    let kept = h.world.outbox().get(&id).due_shard;
    assert!(kept.as_deref().is_some_and(|p| p.starts_with("out#")), "kept for the sweep by the retry: {kept:?}");
}

#[tokio::test]
async fn a_commit_whose_acknowledgement_was_lost_is_recognised_as_ours() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![sequence::apply_next(STREAM, 2, "v", 1, Item::new())])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    let waiter = put(&h, WorkRecord { next_attempt_at_ms: Some(NOW + 50_000), ..due("b", 10_000) });
    h.ledger.edit(&waiter, |s| s.error_code = Some(GAP.into()));
    h.ledger.stream_at(1);
    h.ledger.add_waiter(3, &waiter);
    // The commit lands, its acknowledgement is lost, and the retry (on an
    // endpoint that does not honour the request token) meets our completion.
    h.world.ignore_request_tokens();
    h.world.inject("work.commit", 0, Some(1), Fault::LoseAckOnce);

    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    let s = h.ledger.get(&k);
    assert_eq!(s.rec.status, Status::Processed);
    assert_eq!(s.rec.completed_token.as_deref(), Some(h.ledger.commits()[0].token.as_str()));
    assert_eq!(h.ledger.get(&waiter).rec.next_attempt_at_ms, Some(NOW), "the successor is still woken");
    assert_eq!(h.queue.keys(), [waiter]);
}

/// A commit the ledger refuses as invalid (`ValidationException`, a
/// transaction cancelled for a validation reason) would be refused on every
/// retry: the record is DEAD `caller_error` at once, with the service's
/// answer, instead of retrying for the whole transient bound.
#[tokio::test]
async fn a_commit_refused_as_invalid_ends_the_record_dead_caller_error() {
    let (proj, _) = scripted(|_| apply(&["x"]));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    h.world.inject("work.commit", 0, None, Fault::Invalid);
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Dead));
    assert_eq!(h.ledger.get(&k).rec.status, Status::Dead);
    assert_eq!(h.ledger.m.field(&k, "dead_reason").as_deref(), Some("caller_error"));
    assert!(h.ledger.m.field(&k, "error_message").is_some_and(|m| m.contains("ValidationException")));
}

/// A commit whose acknowledgement was lost, recognised as ours on its
/// retry, dispatches its outbox at once, as an acknowledged one does: the
/// notification does not wait for the sweeper's grace.
#[tokio::test]
async fn a_commit_recognised_as_ours_dispatches_its_outbox_at_once() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale).notify(notify("n"))])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    h.world.ignore_request_tokens();
    h.world.inject("work.commit", 0, Some(1), Fault::LoseAckOnce);
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    assert_eq!(h.ledger.get(&k).rec.status, Status::Processed);
    assert_eq!(h.dispatched(), [format!("outbox#{}", idempotency_key(k.as_str(), "n"))]);
}

#[tokio::test]
async fn a_worker_taken_over_while_planning_is_fenced_from_its_exit() {
    let world = World::new(Ambient::fixed(NOW, 11)).with_shards(settings().index_shards);
    let ledger = Ledger { m: world.ledger(), w: world.clone() };
    let steal = world.ledger();
    let (proj, _) = scripted(move |_| {
        steal.edit(&key("a"), |item| set(item, "lease_owner", "other"));
        Err(ProjectionError::Transient("boom".into()))
    });
    let p = processor(&world, Registry::new().register(proj), settings());
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
    h.ledger.taken("x");
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Stale));
    assert_eq!(h.ledger.applied(), [("x".to_owned(), false)]);
    let commits = h.ledger.commits();
    assert_eq!(commits.len(), 1);
    assert_eq!((commits[0].ops.len(), commits[0].outcome.as_str()), (0, "stale"));
    assert_eq!(h.ledger.get(&k).outcome.as_deref(), Some("stale"));
    assert!(h.dispatched().is_empty(), "a dropped op sends nothing");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no replanning");
}

#[tokio::test]
async fn an_already_applied_conflict_completes_as_duplicate() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::AlreadyApplied)])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    h.ledger.taken("x");
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Duplicate));
    assert_eq!(h.ledger.commits()[0].outcome, "duplicate");
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
    h.ledger.taken("old");
    h.ledger.taken("done");
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    assert_eq!(h.ledger.committed(), ["new"]);
    assert_eq!(h.dispatched().len(), 1);
}

#[tokio::test]
async fn a_replan_conflict_plans_again_from_fresh_reads() {
    let (proj, calls) = scripted(|round| apply(&[if round == 0 { "v1" } else { "v2" }]));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    h.ledger.taken("v1");
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(h.ledger.applied(), [("v1".to_owned(), false), ("v2".to_owned(), true)]);
    assert_eq!(h.ledger.commits().len(), 1, "completed once, after the replan");
    assert_eq!(h.ledger.committed(), ["v2"]);
}

#[tokio::test]
async fn replanning_that_never_settles_retries_as_contention() {
    let (proj, calls) = scripted(|_| apply(&["v"]));
    let h = harness(proj);
    let k = put(&h, due("a", 10_000));
    h.ledger.edit(&k, |s| s.rec.failures = 1);
    h.ledger.taken("v");
    let report = h.p.process(&k, NOW).await.unwrap();
    assert_eq!(report.outcome, Outcome::Retrying);
    assert_eq!(calls.load(Ordering::SeqCst), MAX_PLAN_ROUNDS);
    let s = h.ledger.get(&k);
    assert_eq!((s.rec.status, s.error_code.as_deref()), (Status::Retryable, Some("contention")));
    assert_eq!(s.rec.failures, 1, "contention spends no failure");
}

#[tokio::test]
async fn transaction_contention_retries_as_transient() {
    // An op of two writes is one transaction of its own.
    let pair = || {
        let put = |pk: &str| Write::put(pk, Item::new()).when("attribute_not_exists(pk)");
        Ok(Decision::Apply(vec![Op::new(vec![put("v"), put("w")], OnConflict::Replan)]))
    };
    let (proj, calls) = scripted(move |_| pair());
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    h.world.contend(1);
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

/// A batch's element the intake could not read as an event (its record's
/// id `malformed:<hash of its bytes>`): parked `malformed_element` for an
/// operator, no projection asked, nothing mutated.
#[tokio::test]
async fn a_malformed_batch_element_is_parked_and_never_applied() {
    let (proj, calls) = scripted(|_| apply(&["a#1"]));
    let h = harness(proj);
    let id = format!("{}{}", crate::verify::MALFORMED_ID_PREFIX, "0f".repeat(32));
    let k = put(&h, record(&id, Status::Received));
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Parked));
    let s = h.ledger.get(&k);
    assert_eq!((s.rec.status, s.park_reason.as_deref()), (Status::Parked, Some("malformed_element")));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no projection is asked");
    assert!(h.ledger.commits().is_empty(), "no mutation");
    assert_eq!(h.ledger.history_of(&k), [("parked".to_owned(), "malformed_element".to_owned())]);
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
    h.ledger.stream_at(2);
    let report = h.p.process(&k, NOW).await.unwrap();
    let s = h.ledger.get(&k);
    assert_eq!((s.rec.status, s.error_code.as_deref()), (Status::Retryable, Some(GAP)));
    assert_eq!(s.rec.failures, 2);
    let delay = s.rec.next_attempt_at_ms.unwrap() - NOW;
    assert!(delay > 0 && delay <= settings().gap_bound_ms - 10_000, "{delay}");
    assert_eq!(report, Report { outcome: Outcome::Retrying, retry_after_ms: Some(delay.max(1_000)) });
    assert_eq!(h.ledger.waiter_at(4), Some(k.clone()));
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
    // Its pointer is due now in the waiters partition: should its
    // predecessor's processor die between commit and wake-up, the
    // reconciler looks at the stream.
    assert_eq!(h.ledger.waiter_at(4), Some(k.clone()));
    let pointer = h.world.state().table.get(STREAM, &crate::projection::sequence::waiter_sk(4)).cloned().unwrap();
    let field = |n: &str| pointer.get(n).and_then(|v| v.as_s().or_else(|_| v.as_n()).ok()).cloned();
    assert_eq!(field("due_at"), Some(NOW.to_string()));
    let partition = crate::adapters::dynamodb::due_partition(
        crate::ledger::DuePartition::Waiters,
        k.shard(settings().index_shards),
    );
    assert_eq!((field("due_shard"), field("parked_at")), (Some(partition), Some(NOW.to_string())));
    let (kind, detail) = &h.ledger.history_of(&k)[0];
    assert!(kind == "parked" && detail.starts_with("gap: "), "{kind} {detail}");
}

#[tokio::test]
async fn a_gap_whose_predecessor_landed_meanwhile_is_woken_and_retried_at_once() {
    let (proj, _) = scripted(|_| defer_at(4));
    let h = harness(proj);
    let k = put(&h, due("a", 10_000));
    // Seq 3 committed while this event was planning.
    h.ledger.stream_at(3);
    let report = h.p.process(&k, NOW).await.unwrap();
    assert_eq!(report, Report { outcome: Outcome::Retrying, retry_after_ms: Some(1_000) });
    let s = h.ledger.get(&k);
    assert_eq!((s.rec.status, s.rec.next_attempt_at_ms), (Status::Retryable, Some(NOW)));
    assert_eq!(s.woken_at, Some(NOW));
    assert_eq!(s.rec.window_start_ms, None, "a wake starts a new window");
}

#[tokio::test]
async fn a_commit_advancing_a_stream_wakes_the_waiter_at_the_next_position_and_queues_it() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![sequence::apply_next(STREAM, 2, "v", 1, Item::new())])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    let waiter = put(&h, WorkRecord { next_attempt_at_ms: Some(NOW + 50_000), ..due("b", 20_000) });
    h.ledger.edit(&waiter, |s| s.error_code = Some(GAP.into()));
    let parked = put(&h, record("c", Status::Parked));
    h.ledger.edit(&parked, |s| s.park_reason = Some(GAP.into()));
    h.ledger.stream_at(1);
    h.ledger.add_waiter(3, &waiter);
    h.ledger.add_waiter(4, &parked);

    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    assert_eq!(h.ledger.committed(), [STREAM]);
    assert_eq!(h.ledger.stream(), Some(2));
    let w = h.ledger.get(&waiter);
    assert_eq!((w.rec.status, w.rec.next_attempt_at_ms), (Status::Retryable, Some(NOW)));
    assert_eq!(w.rec.window_start_ms, None);
    assert_eq!(h.ledger.history_of(&waiter)[0].0, "woken");
    assert_eq!(h.queue.keys(), [waiter], "only the next position is woken");
    assert_eq!(h.ledger.get(&parked).rec.status, Status::Parked);
}

#[tokio::test]
async fn a_waiter_parked_on_the_gap_is_revived_by_its_predecessor() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![sequence::apply_next(STREAM, 2, "v", 1, Item::new())])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    let parked = put(&h, WorkRecord { window_start_ms: Some(NOW - 90_000), ..record("b", Status::Parked) });
    h.ledger.edit(&parked, |s| s.park_reason = Some(GAP.into()));
    h.ledger.stream_at(1);
    h.ledger.add_waiter(3, &parked);
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    let w = h.ledger.get(&parked).rec;
    assert_eq!((w.status, w.next_attempt_at_ms, w.window_start_ms), (Status::Retryable, Some(NOW), None));
    assert_eq!(h.queue.keys(), [parked]);
}

#[tokio::test]
async fn a_waiter_that_no_longer_waits_on_the_gap_is_not_woken() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![sequence::apply_next(STREAM, 2, "v", 1, Item::new())])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    // Parked by an operator, not on the gap.
    let parked = put(&h, record("b", Status::Parked));
    h.ledger.edit(&parked, |s| s.park_reason = Some("operator: hold".into()));
    h.ledger.stream_at(1);
    h.ledger.add_waiter(3, &parked);
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    assert_eq!(h.ledger.get(&parked).rec.status, Status::Parked);
    assert!(h.queue.keys().is_empty());
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

// ------------------------------------------------------------------ routes

const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders";
const FIFO_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders.fifo";
const BUS_ARN: &str = "arn:aws:events:us-east-1:123456789012:event-bus/billing";

fn routes() -> Arc<crate::routes::Routes> {
    let json = format!(
        r#"{{"destinations": {{"queue": {{"arn": "{QUEUE_ARN}"}}, "fifo": {{"arn": "{FIFO_ARN}"}},
              "bus": {{"arn": "{BUS_ARN}", "source": "acme.things"}}}},
            "routes": [{{"provider": "acme", "type": "thing.*", "to": ["queue", "bus"]}},
                       {{"tenant": "t1", "to": ["fifo", "queue"]}},
                       {{"provider": "other", "to": ["bus"]}}]}}"#
    );
    Arc::new(crate::routes::Routes::parse(&json).unwrap())
}

/// A harness whose processor routes, with a dispatcher that reads payloads from the ledger.
fn routed(registry: Registry) -> Harness {
    let world = World::new(Ambient::fixed(NOW, 11)).with_shards(settings().index_shards);
    let payloads: Arc<dyn crate::ports::EventPayloads> = Arc::new(world.ledger());
    let dispatch = Dispatcher::with_ports(world.outbox(), world.publisher())
        .with_ambient(world.ambient().clone())
        .with_payloads(payloads);
    let p = Processor::with_ports(world.ledger(), world.projection_context(), registry, Some(dispatch), settings())
        .with_queue(world.queue())
        .with_ambient(world.ambient().clone())
        .with_routes(routes());
    Harness { p, ledger: Ledger { m: world.ledger(), w: world.clone() }, queue: world.queue(), world }
}

fn delivery_id(k: &EventKey, destination: &str) -> String {
    crate::message::outbox_id(k.as_str(), &crate::routes::delivery_action(destination))
}

/// An applied event is delivered to each destination its routes name, once
/// (a destination two rules name too): the deliveries are committed with
/// the completion (claimed by the lease) and sent at once, two requests each
/// (no claim), each with its stable key, the event as received, and the
/// group its destination keeps (the tenant; a FIFO queue: the subject).
#[tokio::test]
async fn an_applied_event_is_delivered_once_to_each_destination_its_routes_name() {
    let (mut proj, _) = scripted(|_| apply(&["x"]));
    proj.subject = Some("cus_7".into());
    let h = routed(Registry::new().register(proj));
    let k = put(&h, record("a", Status::Received));
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));

    let published = h.world.publisher().published();
    let mut targets: Vec<&str> = published.iter().map(|p| p.topic_arn.as_str()).collect();
    targets.sort_unstable();
    assert_eq!(targets, [BUS_ARN, QUEUE_ARN, FIFO_ARN]);
    for p in &published {
        let name = match p.topic_arn.as_str() {
            QUEUE_ARN => "queue",
            FIFO_ARN => "fifo",
            _ => "bus",
        };
        assert_eq!(p.idempotency_key, idempotency_key(k.as_str(), &crate::routes::delivery_action(name)));
        let envelope: serde_json::Value = serde_json::from_str(&p.body).unwrap();
        assert_eq!(envelope["event"], serde_json::from_slice::<serde_json::Value>(&body("a")).unwrap());
        assert_eq!(envelope["idempotency_key"], p.idempotency_key.as_str());
        assert_eq!((envelope["provider"].as_str(), envelope["event_type"].as_str()), (Some("acme"), Some(TYPE)));
        assert_eq!((envelope["tenant"].as_str(), envelope["subject"].as_str()), (Some("t1"), Some("cus_7")));
        assert_eq!(envelope["via"], "webhook");
        assert_eq!(p.group, if name == "fifo" { "cus_7" } else { "t1" });
        assert_eq!(h.world.outbox().get(&delivery_id(&k, name)).status, "SENT");
    }
    assert!(h.world.calls_named("outbox.claim").is_empty(), "no claim: the commit claimed them");
    assert_eq!(h.world.calls_named("outbox.mark_sent").len(), 3);
}

/// An event no projection handles is delivered as well (`ignored`); a
/// duplicate, a stale event and a parked one are not.
#[tokio::test]
async fn ignored_events_are_delivered_and_duplicates_stale_and_parked_ones_are_not() {
    let h = routed(Registry::new());
    let k = put(&h, record("a", Status::Received));
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
    assert_eq!(h.world.publisher().published().len(), 3);

    for (decision, outcome) in [
        (Decision::Duplicate, Outcome::Duplicate),
        (Decision::Park("no such customer".into()), Outcome::Parked),
        (Decision::Apply(vec![op("x", OnConflict::Stale)]), Outcome::Stale),
    ] {
        let decision = std::sync::Mutex::new(Some(decision));
        let (proj, _) = scripted(move |_| Ok(decision.lock().unwrap().take().unwrap_or(Decision::Duplicate)));
        let h = routed(Registry::new().register(proj));
        if outcome == Outcome::Stale {
            h.ledger.taken("x");
        }
        let k = put(&h, record("b", Status::Received));
        assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(outcome));
        assert!(h.world.publisher().published().is_empty(), "{outcome:?}");
        assert!(h.world.calls_named("outbox.mark_sent").is_empty(), "{outcome:?}");
    }
}

/// A destination that fails leaves its delivery backed off; the sweep sends
/// it later with the same key, reading the event from the ledger; the
/// healthy destinations were sent by the first dispatch.
#[tokio::test]
async fn a_failed_delivery_is_retried_by_the_sweep_with_the_same_key() {
    let h = routed(Registry::new());
    let k = put(&h, record("a", Status::Received));
    let failing = idempotency_key(k.as_str(), &crate::routes::delivery_action("bus"));
    h.world.inject_on("publisher.publish", &failing, Some(1), Fault::Throttle);
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
    assert_eq!(h.world.publisher().published().len(), 2, "the healthy ones are sent");
    let item = h.world.outbox().get(&delivery_id(&k, "bus"));
    assert_eq!((item.status.as_str(), item.attempts), ("PENDING", 1));

    h.world.advance(std::time::Duration::from_secs(3_600));
    let d = Dispatcher::with_ports(h.world.outbox(), h.world.publisher())
        .with_ambient(h.world.ambient().clone())
        .with_payloads(Arc::new(h.world.ledger()));
    let now = h.world.ambient().now_ms();
    assert_eq!(d.sweep(settings().index_shards, now, 60_000, 100).await.unwrap(), 1);
    let sent: Vec<_> = h.world.publisher().published().into_iter().filter(|p| p.idempotency_key == failing).collect();
    assert_eq!(sent.len(), 1);
    let envelope: serde_json::Value = serde_json::from_str(&sent[0].body).unwrap();
    assert_eq!(envelope["event"]["id"], "a", "the event read back from the ledger");
    assert_eq!(h.world.outbox().get(&delivery_id(&k, "bus")).status, "SENT");
}

/// A processor that dies between its commit and its sends leaves its
/// deliveries claimed; once the claim lapses the sweep sends each once.
#[tokio::test]
async fn deliveries_of_a_processor_that_died_after_its_commit_are_sent_by_the_sweep() {
    let mut h = routed(Registry::new());
    h.p.fault = ProcessorFault::AfterCommit;
    let k = put(&h, record("a", Status::Received));
    assert!(h.p.process(&k, NOW).await.is_err());
    assert!(h.world.publisher().published().is_empty());
    let d = Dispatcher::with_ports(h.world.outbox(), h.world.publisher())
        .with_ambient(h.world.ambient().clone())
        .with_payloads(Arc::new(h.world.ledger()));
    // Within the claim: the sweep leaves them.
    assert_eq!(d.sweep(settings().index_shards, NOW + 10_000, 0, 100).await.unwrap(), 0);
    let later = NOW + crate::outbox::DISPATCH_LEASE_MS + 1;
    assert_eq!(d.sweep(settings().index_shards, later, 0, 100).await.unwrap(), 3);
    assert_eq!(d.sweep(settings().index_shards, later + 1, 0, 100).await.unwrap(), 0, "once");
    let keys: std::collections::BTreeSet<String> =
        h.world.publisher().published().into_iter().map(|p| p.idempotency_key).collect();
    assert_eq!(keys.len(), 3);
}

/// A delivery is retried for a day (an outage of hours ends nothing DEAD),
/// then DEAD; one that can never be sent (its envelope over the
/// destination's limit: never truncated) is DEAD at once.
#[tokio::test]
async fn a_delivery_is_dead_after_a_day_of_failures_or_at_once_when_it_cannot_be_sent() {
    let h = routed(Registry::new());
    let k = put(&h, record("a", Status::Received));
    h.world.publisher().fail_all();
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
    let d = Dispatcher::with_ports(h.world.outbox(), h.world.publisher())
        .with_ambient(h.world.ambient().clone())
        .with_payloads(Arc::new(h.world.ledger()));
    let id = delivery_id(&k, "queue");
    for hours in [1, 6, 23] {
        let now = NOW + hours * 3_600_000;
        assert!(matches!(d.dispatch(&id, now).await.unwrap(), Dispatched::Retrying { .. }), "{hours} h");
    }
    let a_day = NOW + 24 * 3_600_000 + 1;
    assert!(matches!(d.dispatch(&id, a_day).await.unwrap(), Dispatched::Dead { .. }));
    assert_eq!(h.world.outbox().get(&id).status, "DEAD");

    let big = routed(Registry::new());
    let rec = record("big", Status::Received);
    let large = format!(r#"{{"id":"big","type":"{TYPE}","pad":"{}"}}"#, "x".repeat(crate::message::MAX_MESSAGE_BYTES));
    let k = rec.key.clone();
    big.ledger
        .insert_with_payload(WorkRecord { payload_hash: payload_hash(large.as_bytes()), ..rec }, large.as_bytes());
    assert_eq!(big.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
    assert!(big.world.publisher().attempts().is_empty(), "never sent truncated");
    let item = big.world.outbox().get(&delivery_id(&k, "queue"));
    assert_eq!(item.status, "DEAD", "no payload bucket to refer to");
    assert!(item.last_error.unwrap_or_default().contains("over what the destination takes"));
}

/// An envelope over the destination's limit refers to the payload in the
/// payload bucket (`payload_ref`: bucket, object key, SHA-256), put there by
/// the dispatcher, instead of carrying it.
#[tokio::test]
async fn an_event_too_large_for_its_destination_is_delivered_as_a_reference() {
    let h = routed(Registry::new());
    let world = h.world.clone().with_payload_bucket();
    let rec = record("big", Status::Received);
    let large = format!(r#"{{"id":"big","type":"{TYPE}","pad":"{}"}}"#, "x".repeat(crate::message::MAX_MESSAGE_BYTES));
    let (k, hash) = (rec.key.clone(), payload_hash(large.as_bytes()));
    h.ledger.insert_with_payload(WorkRecord { payload_hash: hash.clone(), ..rec }, large.as_bytes());
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
    let sent = world.publisher().published();
    assert_eq!(sent.len(), 3, "every destination, by reference");
    for p in &sent {
        assert!(p.body.len() < 2_000, "a reference, not the payload");
        let envelope: serde_json::Value = serde_json::from_str(&p.body).unwrap();
        assert!(envelope.get("event").is_none());
        assert_eq!(envelope["payload_ref"]["sha256"], hash.as_str());
        assert_eq!(envelope["payload_ref"]["key"], crate::adapters::s3::S3Payloads::object_key(&k, &hash).as_str());
    }
    let stored = world.state().bucket.as_ref().and_then(|b| b.get(&format!("{}/{hash}", k.as_str())).cloned());
    assert_eq!(stored.as_deref(), Some(large.as_bytes()), "the payload is in the bucket as it is");
}

// ------------------------------------------------------------ HTTPS circuits

const UP: &str = "https://up.example.com/hooks";
const DOWN: &str = "https://down.example.com/hooks";

/// A harness whose every event goes to two HTTPS destinations, `up` and `down`.
fn https_routed() -> Harness {
    https_routed_queued(false)
}

/// [`https_routed`], its deliveries handed to the world's delivery queue when `queued`.
fn https_routed_queued(queued: bool) -> Harness {
    let json = format!(
        r#"{{"destinations": {{"up": {{"url": "{UP}", "secrets": ["env:UP"]}},
                               "down": {{"url": "{DOWN}", "secrets": ["env:DOWN"]}}}},
            "routes": [{{"to": ["up", "down"]}}]}}"#
    );
    let routes = Arc::new(crate::routes::Routes::parse(&json).unwrap());
    let world = World::new(Ambient::fixed(NOW, 11)).with_shards(settings().index_shards);
    let payloads: Arc<dyn crate::ports::EventPayloads> = Arc::new(world.ledger());
    let mut dispatch = Dispatcher::with_ports(world.outbox(), world.publisher())
        .with_ambient(world.ambient().clone())
        .with_payloads(payloads);
    if queued {
        dispatch = dispatch.with_queue(Arc::new(world.deliveries()));
    }
    let p =
        Processor::with_ports(world.ledger(), world.projection_context(), Registry::new(), Some(dispatch), settings())
            .with_queue(world.queue())
            .with_ambient(world.ambient().clone())
            .with_routes(routes);
    Harness { p, ledger: Ledger { m: world.ledger(), w: world.clone() }, queue: world.queue(), world }
}

/// The dispatcher the delivery queue's consumer runs (another container).
fn consumer(world: &World) -> Dispatcher<MemOutbox, MemPublisher> {
    Dispatcher::with_ports(world.outbox(), world.publisher())
        .with_ambient(world.ambient().clone())
        .with_payloads(Arc::new(world.ledger()))
        .with_queue(Arc::new(world.deliveries()))
        .with_destinations(vec!["up".into(), "down".into()])
}

/// Takes the delivery queue's visible messages, ten at a time, until none
/// is visible (at most `rounds` batches); how many were taken.
async fn consume(d: &Dispatcher<MemOutbox, MemPublisher>, world: &World, rounds: usize) -> usize {
    let mut taken = 0;
    for _ in 0..rounds {
        let batch = world.deliveries().receive(10);
        if batch.is_empty() {
            break;
        }
        for m in batch {
            d.take(&m, world.ambient().now_ms()).await.unwrap();
            taken += 1;
        }
    }
    taken
}

/// A partner answering 2xx in 9 s: sent inline (no delivery queue), each
/// event keeps the processor 9 s on the clock; handed to the delivery
/// queue, the processor spends no time on it at all, and the queue's
/// consumer sends every delivery once, under the key of its event.
#[tokio::test]
async fn a_slow_https_partner_never_keeps_the_processor_waiting_once_deliveries_go_through_the_queue() {
    let mut spent = Vec::new();
    for queued in [false, true] {
        let h = https_routed_queued(queued);
        let up = crate::routes::https_reference("up");
        h.world.publisher().slow(&up, 9_000);
        let clock = h.world.ambient().clone();
        let start = clock.now_ms();
        let mut keys = Vec::new();
        for i in 0..10 {
            let k = put(&h, record(&format!("e{i}"), Status::Received));
            assert_eq!(h.p.process(&k, clock.now_ms()).await.unwrap(), done(Outcome::Ignored));
            keys.push(k);
        }
        spent.push(clock.now_ms() - start);
        if queued {
            assert!(h.world.publisher().attempts().is_empty(), "the processor sent nothing itself");
            assert_eq!(h.world.deliveries().len(), 20, "one message per delivery");
            assert_eq!(consume(&consumer(&h.world), &h.world, 10).await, 20);
        }
        let sent = h.world.publisher().published();
        for k in &keys {
            for d in ["up", "down"] {
                let key = idempotency_key(k.as_str(), &crate::routes::delivery_action(d));
                assert_eq!(sent.iter().filter(|p| p.idempotency_key == key).count(), 1, "{k} to {d}: once");
                assert_eq!(h.world.outbox().get(&delivery_id(k, d)).status, "SENT", "{k} to {d}");
            }
        }
    }
    assert!(spent[0] >= 90_000, "inline: the processor waited {} ms on the partner", spent[0]);
    assert_eq!(spent[1], 0, "through the queue: the processor waited on no partner");
}

/// A destination down while 250 events are routed to it: five tries open
/// its circuit; every later delivery waits in the ledger (its waiting
/// partition) after one message, and costs no message per retry however
/// long the outage lasts. Once it is back, a drain started by the reconciler
/// sends the probe, the probe closes the circuit and starts the drain, and
/// pages of 100 go through the queue: every delivery sent once, none DEAD,
/// the healthy destination's all sent before it came back.
#[tokio::test]
async fn an_open_circuits_deliveries_wait_in_the_ledger_and_drain_in_pages_once_the_probe_gets_through() {
    let h = https_routed_queued(true);
    let down = crate::routes::https_reference("down");
    h.world.publisher().refuse(&down);
    let d = consumer(&h.world);
    let clock = h.world.ambient().clone();
    let mut keys = Vec::new();
    for i in 0..250 {
        let k = put(&h, record(&format!("e{i}"), Status::Received));
        assert_eq!(h.p.process(&k, clock.now_ms()).await.unwrap(), done(Outcome::Ignored));
        keys.push(k);
        if i % 10 == 9 {
            consume(&d, &h.world, 100).await;
            h.world.advance(std::time::Duration::from_secs(1));
        }
    }
    // Hours of outage: the failed tries' delayed retries come and wait too.
    for _ in 0..60 {
        h.world.advance(std::time::Duration::from_secs(60));
        consume(&d, &h.world, 100).await;
        // The reconciler's run: the circuit is open (or its probe fails), nothing drains for long.
        d.drains(clock.now_ms(), 1_000).await;
        consume(&d, &h.world, 100).await;
    }
    let up_sent = h.world.publisher().published().len();
    assert_eq!(up_sent, 250, "the healthy destination: every delivery sent during the outage");
    let waiting = crate::ports::OutboxStore::waiting(&h.world.outbox(), "down", clock.now_ms(), 100).await.unwrap();
    assert_eq!(waiting.len(), 100, "the down destination's deliveries wait in its partition");
    let sends_in_outage = h.world.calls_named("deliveries.send").len();
    let tries = h.world.publisher().attempts().iter().filter(|p| p.topic_arn == down).count();
    // One message per delivery (500), one per failed try's retry, one drain per probe.
    assert!(sends_in_outage <= 500 + 2 * tries, "{sends_in_outage} messages for {tries} tries in the outage");
    assert!(tries <= 5 + 61, "{tries} tries: five, then at most one probe a run");

    h.world.publisher().restore(&down);
    h.world.advance(std::time::Duration::from_secs(120));
    let drains = d.drains(clock.now_ms(), 1_000).await;
    assert_eq!(drains.started, 1, "one destination back with deliveries waiting");
    consume(&d, &h.world, 1_000).await;
    let sent = h.world.publisher().published();
    for k in &keys {
        let key = idempotency_key(k.as_str(), &crate::routes::delivery_action("down"));
        assert_eq!(sent.iter().filter(|p| p.idempotency_key == key).count(), 1, "{k}: sent once");
        assert_eq!(h.world.outbox().get(&delivery_id(k, "down")).status, "SENT", "{k}");
    }
    assert!(h.world.deliveries().is_empty(), "drained: nothing left on the queue");
}

/// One HTTPS destination refuses every connection for an hour of virtual
/// time while an event a minute arrives and the sweep runs every minute:
/// every delivery to the healthy destination is sent by its first
/// dispatch; the dead one is tried `threshold` times, then at most once per
/// open interval (a probe), and its waiting deliveries (a failed probe's
/// too) spend no attempt.
/// Once it is back, the sweep alone sends each of its deliveries, once.
#[tokio::test]
async fn a_dead_https_destination_gets_only_probes_and_its_deliveries_go_out_when_it_is_back() {
    let h = https_routed();
    // What the deliveries store and the publisher is given: the names, never the URLs.
    let (up, down) = (crate::routes::https_reference("up"), crate::routes::https_reference("down"));
    h.world.publisher().refuse(&down);
    let policy = crate::outbox::CircuitPolicy::default();
    // The reconciler's dispatcher: another container, its own copy of the circuits.
    let sweeper = Dispatcher::with_ports(h.world.outbox(), h.world.publisher())
        .with_ambient(h.world.ambient().clone())
        .with_payloads(Arc::new(h.world.ledger()))
        .with_destinations(vec!["up".into(), "down".into()]);
    let tries = |target: &str| h.world.publisher().attempts().iter().filter(|p| p.topic_arn == target).count();
    let mut keys = Vec::new();
    let mut opened_at_minute = None;
    for minute in 0..60_i64 {
        let now = NOW + minute * 60_000;
        let k = put(&h, record(&format!("e{minute}"), Status::Received));
        assert_eq!(h.p.process(&k, now).await.unwrap(), done(Outcome::Ignored));
        let up = h.world.outbox().get(&delivery_id(&k, "up"));
        assert_eq!((up.status.as_str(), up.attempts), ("SENT", 1), "minute {minute}: sent by its first dispatch");
        keys.push(k);
        let before = tries(&down);
        sweeper.sweep(settings().index_shards, now + 30_000, 0, 1_000).await.unwrap();
        let circuit = crate::ports::CircuitStore::circuit(&h.world.outbox(), "down").await.unwrap();
        if opened_at_minute.is_none() && circuit.as_ref().is_some_and(|c| c.open_until.is_some()) {
            opened_at_minute = Some(minute);
        }
        if opened_at_minute.is_some_and(|m| m < minute) {
            assert!(tries(&down) - before <= 1, "minute {minute}: at most one probe while open");
        }
    }
    let opened = opened_at_minute.expect("the circuit opened");
    assert!(opened <= 5, "opened after {} failures in a row (minute {opened})", policy.threshold);
    let probes = tries(&down) - usize::try_from(policy.threshold).unwrap();
    let intervals = usize::try_from(3_600_000 / policy.open_ms).unwrap();
    assert!(probes <= intervals, "{probes} tries after opening, at most one per {} ms", policy.open_ms);
    assert_eq!(tries(&up), 60, "the healthy destination: one send per event, nothing more");
    eprintln!("down: opened at minute {opened}, {} tries in the hour", tries(&down));
    let mut spent = 0;
    for k in &keys {
        let down = h.world.outbox().get(&delivery_id(k, "down"));
        assert_eq!(down.status, "PENDING", "waiting, not DEAD");
        spent += usize::try_from(down.attempts).unwrap();
    }
    // A failed probe is the circuit's try: its delivery waits with the
    // others, its attempt given back like theirs.
    assert_eq!(spent, usize::try_from(policy.threshold).unwrap(), "attempts: the tries before it opened, no more");

    // Back: the sweep alone sends every waiting delivery, each once.
    h.world.publisher().restore(&down);
    let mut now = NOW + 3_600_000;
    for _ in 0..20 {
        now += 60_000;
        sweeper.sweep(settings().index_shards, now, 0, 1_000).await.unwrap();
    }
    let sent = h.world.publisher().published();
    for k in &keys {
        let key = idempotency_key(k.as_str(), &crate::routes::delivery_action("down"));
        assert_eq!(sent.iter().filter(|p| p.idempotency_key == key).count(), 1, "{k}: sent once");
        assert_eq!(h.world.outbox().get(&delivery_id(k, "down")).status, "SENT");
    }
    let circuit = crate::ports::CircuitStore::circuit(&h.world.outbox(), "down").await.unwrap().unwrap();
    assert_eq!((circuit.open_until, circuit.failures), (None, 0), "closed");
}

// ------------------------------------------------- what a destination counts

/// An envelope just under 256 KiB alone is over what SQS (the body and the
/// `idempotency-key` attribute's name, type and value) and EventBridge (the
/// entry's `Detail`, `Source` and `DetailType`) count: it goes as a
/// `payload_ref`, never refused for a day and DEAD.
#[tokio::test]
async fn an_envelope_under_the_limit_alone_but_over_what_the_service_counts_goes_as_a_reference() {
    // The envelopes' heads, from a small event of the same key.
    let probe = routed(Registry::new());
    let k = put(&probe, record("big", Status::Received));
    assert_eq!(probe.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
    let small = body("big");
    let head = |p: &crate::adapters::memory::Published| p.body.len() - small.len();
    // The bus's head is the shortest ("bus"): its envelope 20 bytes under
    // the limit, the queues' 18 and 19 (their names are longer).
    let bus = probe.world.publisher().published().into_iter().find(|p| p.topic_arn == BUS_ARN).unwrap();
    let fill = crate::message::MAX_MESSAGE_BYTES - 20 - head(&bus);
    let prefix = format!(r#"{{"id":"big","type":"{TYPE}","pad":""#);
    let large = format!(r#"{prefix}{}"}}"#, "x".repeat(fill - prefix.len() - 2));
    assert_eq!(large.len(), fill);

    let h = routed(Registry::new());
    let world = h.world.clone().with_payload_bucket();
    let rec = record("big", Status::Received);
    let hash = payload_hash(large.as_bytes());
    h.ledger.insert_with_payload(WorkRecord { payload_hash: hash.clone(), ..rec }, large.as_bytes());
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
    let sent = world.publisher().published();
    assert_eq!(sent.len(), 3);
    for p in &sent {
        let envelope: serde_json::Value = serde_json::from_str(&p.body).unwrap();
        assert!(
            envelope.get("event").is_none() && envelope["payload_ref"]["sha256"] == hash.as_str(),
            "{}: {} bytes with the event, over what it counts: a reference instead",
            p.topic_arn,
            p.body.len()
        );
    }
}

/// The `MessageGroupId` of a FIFO destination follows SQS's rules (1-128
/// characters, alphanumerics and punctuation): a subject that does not (a
/// name with spaces, a non-ASCII address, one over 128 characters) is
/// hashed, the same subject always to the same group; a valid one is kept.
#[tokio::test]
async fn a_fifo_group_id_follows_sqs_rules_and_keeps_a_subject_in_one_group() {
    let valid = |g: &str| {
        (1..=128).contains(&g.len()) && g.bytes().all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation())
    };
    let long = "c".repeat(200);
    let subjects = ["Jane Doe <jane@example.com>", "jöhn@example.com", long.as_str(), "cus_7", "a@b.example"];
    let mut groups = Vec::new();
    for subject in subjects {
        let mut seen = Vec::new();
        for id in ["one", "two"] {
            let (mut proj, _) = scripted(|_| apply(&["x"]));
            proj.subject = Some(subject.into());
            let h = routed(Registry::new().register(proj));
            let k = put(&h, record(&format!("{id}-{}", subject.len()), Status::Received));
            assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
            let fifo = h.world.publisher().published().into_iter().find(|p| p.topic_arn == FIFO_ARN).unwrap();
            assert!(valid(&fifo.group), "{subject:?}: group {:?} is not a valid MessageGroupId", fifo.group);
            seen.push(fifo.group);
        }
        assert_eq!(seen[0], seen[1], "{subject:?}: the same subject, the same group");
        if valid(subject) {
            assert_eq!(seen[0], subject, "a valid subject is its own group");
        }
        groups.push(seen[0].clone());
    }
    let distinct: std::collections::BTreeSet<&String> = groups.iter().collect();
    assert_eq!(distinct.len(), subjects.len(), "different subjects, different groups: {groups:?}");
}

/// An HTTPS destination's URL (a token in its query, say) is never stored
/// on its deliveries nor listed: the item names the destination; the
/// sender finds the URL in the routes.
#[tokio::test]
async fn an_https_destination_is_stored_and_listed_by_its_name_never_its_url_or_query() {
    let json = r#"{"destinations": {"partner": {"url": "https://hooks.example.com/in?token=s3cret",
                                                 "secrets": ["env:P"]}},
                   "routes": [{"to": ["partner"]}]}"#;
    let routes = Arc::new(crate::routes::Routes::parse(json).unwrap());
    let world = World::new(Ambient::fixed(NOW, 11)).with_shards(settings().index_shards);
    let dispatch = Dispatcher::with_ports(world.outbox(), world.publisher())
        .with_ambient(world.ambient().clone())
        .with_payloads(Arc::new(world.ledger()));
    let p =
        Processor::with_ports(world.ledger(), world.projection_context(), Registry::new(), Some(dispatch), settings())
            .with_queue(world.queue())
            .with_ambient(world.ambient().clone())
            .with_routes(routes.clone());
    let h = Harness { p, ledger: Ledger { m: world.ledger(), w: world.clone() }, queue: world.queue(), world };
    let k = put(&h, record("a", Status::Received));
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Ignored));
    let tried = h.world.publisher().attempts();
    assert_eq!(tried.len(), 1);
    assert!(!tried[0].topic_arn.contains("s3cret"), "{:?}", tried[0].topic_arn);
    for item in h.world.state().table.items() {
        let shown = format!("{item:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("hooks.example.com"), "stored: {shown}");
    }
    assert!(!format!("{routes:?}").contains("s3cret"), "not in the routes' debug form either");
    let listed = crate::outbox::Deliveries::new(h.world.outbox(), settings().index_shards)
        .of_event(&k, &["partner"])
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!serde_json::to_string(&listed).unwrap().contains("s3cret"));
}

// ------------------------------------------------------- fenced ops

/// An op without a guard of its own is committed with the completion, in
/// one transaction fenced by the lease; the guarded ops of the same plan
/// are written before it, on their own.
#[tokio::test]
async fn an_unguarded_op_is_committed_with_the_completion_and_a_guarded_one_before_it() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![fenced_op("tally"), op("state", OnConflict::Stale)])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Applied));
    assert_eq!(h.ledger.applied(), [("state".to_owned(), true)]);
    let commits = h.ledger.commits();
    assert_eq!(commits.len(), 1);
    assert_eq!((commits[0].ops.clone(), commits[0].committed), (vec!["tally".to_owned()], true));
}

/// A worker whose lease was taken over meanwhile applies no unguarded op:
/// its transaction is refused on the token, the tally is untouched.
#[tokio::test]
async fn a_fenced_out_worker_applies_no_unguarded_op() {
    let (proj, _) = scripted(|_| Ok(Decision::Apply(vec![fenced_op("tally")])));
    let h = harness(proj);
    let k = put(&h, record("a", Status::Received));
    take_over_at_commit(&h, &k, "other");
    assert_eq!(h.p.process(&k, NOW).await.unwrap(), done(Outcome::Fenced));
    assert!(h.world.state_item("tally").is_none(), "not applied");
}

// ---------------------------------------------------------------- sealed payloads

/// A record whose payload is sealed under its event's key (an erasable
/// endpoint's), carried by its message or only stored: opened, applied, and
/// its subject noted in the key store before the completion. Once its key
/// is destroyed, a replayed record meets a payload that will never open: DEAD
/// `erased`, never applied.
#[tokio::test]
async fn a_sealed_payload_is_opened_its_subject_noted_and_an_erased_one_is_never_applied() {
    use crate::ports::PayloadKeys;
    use crate::sealing::{DataKey, KeyState, seal};
    let (unused, _) = scripted(|_| Ok(Decision::Ignore("unused")));
    let mut h = harness(unused);
    let keys = Arc::new(h.world.keys());
    let (mut proj, calls) = scripted(|_| Ok(Decision::Apply(vec![op("x", OnConflict::Stale)])));
    proj.subject = Some("cus_9".into());
    h.p = processor(&h.world, Registry::new().register(proj), settings()).with_keys(keys.clone());
    let mut sealed_of = Vec::new();
    for id in ["sealed-carried", "sealed-stored"] {
        let plain = body(id);
        let rec = WorkRecord { payload_hash: crate::identity::payload_hash(&plain), ..record(id, Status::Received) };
        let KeyState::Live(k) = keys.key_for(&rec.key, &DataKey::generate().unwrap(), 0).await.unwrap() else {
            panic!("a key")
        };
        let sealed = seal(&k, &rec.key, &plain);
        h.ledger.insert_with_payload(rec.clone(), &sealed);
        sealed_of.push((rec.key.clone(), sealed));
    }
    let (carried_key, carried) = &sealed_of[0];
    let report = h.p.process_message(carried_key, Some(carried), NOW).await.unwrap();
    assert_eq!(report, done(Outcome::Applied), "opened from the message");
    let (stored_key, _) = &sealed_of[1];
    // (The same op as the first event's: stale the second time, planned all the same.)
    assert_eq!(h.p.process(stored_key, NOW).await.unwrap(), done(Outcome::Stale), "opened from the payload item");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each planned once");
    let mut noted: Vec<String> =
        keys.subject_events("cus_9").await.unwrap().iter().map(|k| k.as_str().to_owned()).collect();
    noted.sort();
    assert_eq!(noted, vec![carried_key.as_str().to_owned(), stored_key.as_str().to_owned()]);

    // Erased while it waited for a replay.
    let plain = body("sealed-erased");
    let rec =
        WorkRecord { payload_hash: crate::identity::payload_hash(&plain), ..record("sealed-erased", Status::Received) };
    let KeyState::Live(k) = keys.key_for(&rec.key, &DataKey::generate().unwrap(), 0).await.unwrap() else {
        panic!("a key")
    };
    h.ledger.insert_with_payload(rec.clone(), &seal(&k, &rec.key, &plain));
    keys.destroy(&rec.key, "ops", NOW, 0).await.unwrap();
    let report = h.p.process(&rec.key, NOW).await.unwrap();
    assert_eq!(report, done(Outcome::Dead), "never applied");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "not planned");
    assert_eq!(h.world.ledger().field(&rec.key, "dead_reason").as_deref(), Some("erased"));
    // Without the key store, a sealed payload is not opened: retried, not applied.
    let plain = body("sealed-no-store");
    let rec = WorkRecord {
        payload_hash: crate::identity::payload_hash(&plain),
        ..record("sealed-no-store", Status::Received)
    };
    let KeyState::Live(k) = keys.key_for(&rec.key, &DataKey::generate().unwrap(), 0).await.unwrap() else {
        panic!("a key")
    };
    h.ledger.insert_with_payload(rec.clone(), &seal(&k, &rec.key, &plain));
    let plain_processor = processor(&h.world, Registry::new(), settings());
    assert_eq!(plain_processor.process(&rec.key, NOW).await.unwrap().outcome, Outcome::Retrying);
}
