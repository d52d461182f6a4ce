//! The reconciler's decisions on the memory world (`adapters::memory`): the
//! due index, the claims and the evidence are the DynamoDB adapter's own
//! conditions on the memory table, the queue is the memory queue, the outbox
//! is dispatched by the real dispatcher, and the re-checks are a test
//! plug-in over the memory subscriptions API. Failures are the world's injected faults; a concurrent
//! run or dispatcher is another actor acting right before a call.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::adapters::dynamodb::conditions::CLAIM_TOKEN;
use crate::adapters::dynamodb::{Item, META_SK, attr, due_partition, due_shard, payload, payload_sk};
use crate::adapters::memory::{
    self, Answer, Fault, MemLedger, MemOutbox, MemPublisher, MemQueue, MemSubscriptions, OutboxView, World, set,
};
use crate::clock::{Clock, ManualClock, SeededEntropy};
use crate::config::DispatchPolicy;
use crate::identity::{payload_hash, shard_of};
use crate::ledger::{CURSOR_REWIND_EVERY_MS, CURSOR_REWIND_MS, CURSOR_SETTLE_MS};
use crate::message::OutboxClaim;
use crate::outbox::{DISPATCH_LEASE_MS, Dispatcher};
use crate::policy::REDRIVE_GRACE_MS;
use crate::projection::STATE_SK;
use crate::projection::fetch::{SubscriptionFuture, SubscriptionSource};
use crate::projection::recheck::{CheckFuture, Recheck, Repair};

const NOW: i64 = 1_700_000_000_000;
const SEED: u64 = 17;
const SHARDS: u32 = 4;
const BACKOFF: i64 = 300_000;
const INTERVAL: i64 = 3_600_000;
const GRACE: i64 = 60_000;
const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:entitlements";

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

fn is(status: &str, seats: i64) -> Answer {
    Answer::Is(status.to_owned(), seats)
}

fn num_of(item: &Item, name: &str) -> Option<i64> {
    item.get(name).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok())
}

/// The repair record's key for a drift instance (`recon:<sub>:<hash>`).
fn repair_key(local_event: &str, sub: &str, status: &str, seats: i64) -> EventKey {
    let instance = payload_hash(format!("{local_event}|{status}|{seats}").as_bytes());
    EventKey::new("stripe", "billing", &format!("recon:{sub}:{}", &instance[..16]))
}

fn s(k: &EventKey) -> String {
    k.to_string()
}

// ------------------------------------------------------------- the provider

/// The memory subscriptions API, each fetch also noted in the world's call
/// log (`source.subscription <id>`), so a test sees it in order with the
/// ports' calls.
struct Provider {
    subs: MemSubscriptions,
    world: World,
}

impl SubscriptionSource for Provider {
    fn subscription<'a>(&'a self, id: &'a str) -> SubscriptionFuture<'a> {
        self.world.state().calls.push(format!("source.subscription {id}"));
        self.subs.subscription(id)
    }
}

/// The re-check of the `ent#<subscription>` items the tests arrange: their
/// `status` and `seats` against the provider's; a drift is repaired by
/// `recon:<subscription>:<drift instance>` (see [`repair_key`]).
struct StateDrift(Arc<Provider>);

impl Recheck for StateDrift {
    fn name(&self) -> &'static str {
        "entitlements"
    }

    fn prefix(&self) -> &'static str {
        "ent#"
    }

    fn check<'a>(&'a self, item: &'a crate::item::Item, _now_ms: i64) -> CheckFuture<'a> {
        use crate::item::{get_n, get_s};
        Box::pin(async move {
            let text = |k: &str| get_s(item, k).unwrap_or_default().to_owned();
            let sub = text("subscription");
            if sub.is_empty() || text("endpoint").is_empty() {
                return Ok(Verdict::Same);
            }
            let fetched = self
                .0
                .subscription(&sub)
                .await
                .map_err(|e| crate::projection::ProjectionError::Unavailable(e.to_string()))?;
            let (status, seats) = fetched.object.map_or(("deleted".to_owned(), 0), |s| (s.status, s.seats));
            if get_s(item, "status") == Some(status.as_str()) && get_n(item, "seats") == Some(seats) {
                return Ok(Verdict::Same);
            }
            let key = repair_key(&text("event_id"), &sub, &status, seats);
            Ok(Verdict::Drift(Repair {
                provider: "stripe".into(),
                endpoint: text("endpoint"),
                tenant: text("tenant"),
                event_id: key.event_id().to_owned(),
                event_type: "customer.subscription.reconciled".into(),
                body: json!({"id": key.event_id(), "type": "customer.subscription.reconciled",
                    "data": {"object": {"id": sub, "customer": text("customer")}}})
                .to_string()
                .into_bytes(),
                detail: format!("{sub}: provider {status} / {seats}"),
            }))
        })
    }
}

// --------------------------------------------------------------- the harness

type Outbox = Dispatcher<MemOutbox, MemPublisher>;
type Recon = Reconciler<MemQueue, MemLedger, Outbox>;

/// The reconciler's reads and writes of its activity marks and last sweep.
fn bookkeeping(call: &str) -> bool {
    [
        "activity.note ",
        "due.last_sweep ",
        "due.active_since ",
        "due.record_sweep ",
        "due.due_cursors ",
        "due.keep_due_cursors ",
    ]
    .iter()
    .any(|p| call.starts_with(p))
}

/// The memory world, the provider and the reconciler's settings; the run,
/// the world and the dispatcher share one manual clock and one entropy.
struct Harness {
    world: World,
    clock: Arc<ManualClock>,
    provider: Arc<Provider>,
    settings: ReconcilerSettings,
}

impl Harness {
    fn new() -> Self {
        Self::with(settings())
    }

    fn with(settings: ReconcilerSettings) -> Self {
        let clock = Arc::new(ManualClock::at(NOW));
        let ambient = Ambient { clock: clock.clone(), entropy: Arc::new(SeededEntropy::new(SEED)) };
        let world = World::new(ambient).with_shards(SHARDS);
        let provider = Arc::new(Provider { subs: MemSubscriptions::default(), world: world.clone() });
        Self { world, clock, provider, settings }
    }

    fn ambient(&self) -> Ambient {
        self.world.ambient().clone()
    }

    fn ledger(&self) -> MemLedger {
        self.world.ledger()
    }

    fn dispatcher(&self) -> Outbox {
        Dispatcher::with_ports(self.world.outbox(), self.world.publisher()).with_ambient(self.ambient())
    }

    fn reconciler(&self) -> Recon {
        Reconciler::new(self.ledger(), self.world.queue(), Some(self.dispatcher()), self.rechecks(), self.settings)
            .with_ambient(self.ambient())
    }

    /// The test re-check over this harness's provider.
    fn rechecks(&self) -> Rechecks {
        Rechecks::new().register(StateDrift(self.provider.clone()))
    }

    /// A deadline no test reaches.
    fn far(&self) -> Instant {
        self.clock.instant() + Duration::from_secs(3_600)
    }

    /// A run after the pipeline's writers noted activity (the items these
    /// tests plant stand for their writes); the idle runs have tests of
    /// their own.
    async fn run(&self, now_ms: i64) -> Summary {
        crate::ports::Activity::note_activity(&self.ledger(), now_ms).await;
        self.reconciler().run(now_ms, self.far()).await
    }

    // ------------------------------------------------------------ records

    /// A ledger record due at `due_at` (received a re-drive grace before;
    /// `enqueued_at`: sent then; `None`: never sent, its sender's send
    /// failed and it gave its send lease back). A PROCESSING record's lease
    /// ended 30 s after its receipt.
    fn record(&self, id: &str, status: Status, enqueued_at: Option<i64>, due_at: i64) -> EventKey {
        let k = key(id);
        let mut extra = json!({ "enqueued_at": enqueued_at, "send_lease_until": null });
        if !status.is_terminal() {
            extra["due_at"] = json!(due_at);
        }
        if status == Status::Retryable {
            extra["next_attempt_at"] = json!(due_at);
        }
        self.ledger().add(&k, status, due_at - REDRIVE_GRACE_MS, extra);
        k
    }

    /// A number on the record.
    fn num(&self, k: &EventKey, name: &str) -> Option<i64> {
        self.ledger().field(k, name).map(|v| v.parse().unwrap_or_else(|e| panic!("{k} {name}: {v}: {e}")))
    }

    fn text(&self, k: &EventKey, name: &str) -> Option<String> {
        self.ledger().field(k, name)
    }

    fn status(&self, k: &EventKey) -> Status {
        self.text(k, attr::STATUS).and_then(|s| Status::parse(&s)).unwrap_or_else(|| panic!("{k}: no record"))
    }

    /// Whether a reconciler run claimed the record (its token is on it).
    fn claimed(&self, k: &EventKey) -> bool {
        self.text(k, CLAIM_TOKEN).is_some()
    }

    /// Sets a number on the record (an arrangement, no port call).
    fn set_num(&self, k: &EventKey, name: &str, v: i64) {
        self.ledger().edit(k, |item| set(item, name, v));
    }

    fn records(&self) -> usize {
        self.ledger().keys().len()
    }

    /// The record's payload: in the record, or in its own item.
    fn payload_of(&self, k: &EventKey) -> Option<Vec<u8>> {
        let item = self.ledger().item(k)?;
        payload::body(&item).or_else(|| {
            let hash = self.text(k, attr::PAYLOAD_HASH)?;
            self.world.state().table.get(k.as_str(), &payload_sk(&hash)).and_then(payload::body)
        })
    }

    // ------------------------------------------------------- entitlements

    /// An entitlement last checked long ago, locally `status`/`seats`.
    fn entitlement(&self, sub: &str, status: &str, seats: i64) -> String {
        self.entitlement_due(sub, status, seats, NOW - self.settings.drift_interval_ms - 10)
    }

    /// An entitlement projection item in its shard's `chk#…` partition, due at `due_at`.
    fn entitlement_due(&self, sub: &str, status: &str, seats: i64, due_at: i64) -> String {
        let pk = format!("ent#{sub}");
        let mut item = Item::new();
        set(&mut item, attr::PK, pk.as_str());
        set(&mut item, attr::SK, STATE_SK);
        set(&mut item, attr::DUE_SHARD, due_partition(DuePartition::Checks, shard_of(sub, SHARDS)).as_str());
        set(&mut item, attr::DUE_AT, due_at);
        set(&mut item, "subscription", sub);
        set(&mut item, "customer", "cus_1");
        set(&mut item, "endpoint", "billing");
        set(&mut item, "tenant", "t1");
        set(&mut item, "event_id", format!("evt_local_{sub}").as_str());
        set(&mut item, "status", status);
        set(&mut item, "seats", seats);
        self.world.state().table.insert(item);
        pk
    }

    /// The entitlement's next look.
    fn ent_due(&self, pk: &str) -> i64 {
        self.world.state().table.get(pk, STATE_SK).and_then(|i| num_of(i, attr::DUE_AT)).expect("entitlement")
    }

    fn edit_ent(&self, pk: &str, f: impl FnOnce(&mut Item)) {
        let mut st = self.world.state();
        let mut item = st.table.get(pk, STATE_SK).cloned().expect("entitlement");
        f(&mut item);
        st.table.insert(item);
    }

    fn answer(&self, sub: &str, answer: Answer) {
        self.provider.subs.answer(sub, answer);
    }

    fn fetched(&self) -> Vec<String> {
        self.provider.subs.fetched()
    }

    // ------------------------------------------------------------- outbox

    fn pending(id: &str, due_at: i64) -> OutboxView {
        OutboxView::pending(id, TOPIC, shard_of(id, SHARDS), due_at)
    }

    /// A PENDING outbox item due at `due_at`.
    fn outbox_item(&self, id: &str, due_at: i64) {
        self.world.outbox().put(id, &Self::pending(id, due_at));
    }

    /// `n` outbox items DEAD already (in the attention index).
    fn dead_outbox_items(&self, n: usize) {
        for i in 0..n {
            let id = format!("out_dead_{i}");
            let dead = OutboxView {
                status: "DEAD".into(),
                due_at: None,
                due_shard: None,
                attempts: DispatchPolicy::default().max_attempts,
                last_error: Some("sns: gone".into()),
                dead_at: Some(NOW - 1_000),
                ..Self::pending(&id, NOW - 9_000_000)
            };
            self.world.outbox().put(&id, &dead);
        }
    }

    /// The publish of `id`'s next dispatch fails (the publish names no
    /// item: the fault is armed at its claim, right before it).
    fn fail_publish_of(&self, id: &str) {
        self.world.during_on("outbox.claim", id, |w| w.inject("publisher.publish", 0, Some(1), Fault::Throttle));
    }

    /// Another dispatcher claims `id` (a live claim) between this run's
    /// index read and its claim.
    fn claimed_meanwhile(&self, id: &str, now_ms: i64) {
        let owned = id.to_owned();
        self.world.during_on("outbox.claim", id, move |w| {
            let met = w.outbox().claim_now(&owned, "another-dispatcher", now_ms, now_ms + DISPATCH_LEASE_MS);
            assert!(matches!(met, Ok(OutboxClaim::Claimed(_))), "{met:?}");
        });
    }

    /// The outbox items dispatched (each dispatch starts with its claim), in order.
    fn dispatched(&self) -> Vec<String> {
        self.world.calls_named("outbox.claim")
    }

    // -------------------------------------------------------------- queue

    /// The keys on the queue, in the order sent.
    fn sent(&self) -> Vec<String> {
        self.world.queue().keys().iter().map(s).collect()
    }

    /// Every send tried, failed ones included.
    fn send_attempts(&self) -> usize {
        self.world.calls_named("queue.send").len()
    }

    /// The next sends' outcomes, in order (`None`: sent); later sends go
    /// through. (A rule's `skip` counts the calls that reach it: those
    /// before it that no earlier rule took.)
    fn script_sends(&self, outcomes: &[Option<Fault>]) {
        let (mut passed, mut i) = (0, 0);
        while i < outcomes.len() {
            match outcomes[i] {
                None => {
                    passed += 1;
                    i += 1;
                }
                Some(fault) => {
                    let run = outcomes[i..].iter().take_while(|o| **o == Some(fault)).count();
                    self.world.inject("queue.send", passed, Some(run as u32), fault);
                    i += run;
                }
            }
        }
    }

    /// The first send of `item` fails.
    fn fail_send_of(&self, item: &str, fault: Fault) {
        self.world.inject_on("queue.send", item, Some(1), fault);
    }

    // ---------------------------------------------------- calls, concurrency

    /// What was done, in order: every port call and fetch but the index and
    /// evidence reads.
    fn acts(&self) -> Vec<String> {
        self.world
            .calls()
            .into_iter()
            .filter(|c| !c.starts_with("due.due ") && c != "due.attention" && !bookkeeping(c))
            .collect()
    }

    /// Forgets the calls made and the messages sent so far.
    fn forget(&self) {
        let mut st = self.world.state();
        st.calls.clear();
        st.queue.messages.clear();
        st.queue.dead.clear();
    }

    /// Another run read the same item (`pk`: a record's key or an
    /// entitlement's pk) and its claim lands just before this run's, moving
    /// it to `theirs`. Holds the token it wrote, once it has.
    fn race(&self, pk: &str, theirs: i64) -> Arc<Mutex<Option<String>>> {
        let token = Arc::new(Mutex::new(None));
        let (owned, out) = (pk.to_owned(), token.clone());
        self.world.during_on("due.claim_due", pk, move |w| {
            let record = EventKey::from_stored(&owned);
            let sk = if record.is_some() { META_SK } else { STATE_SK };
            let seen = w.state().table.get(&owned, sk).and_then(|i| num_of(i, attr::DUE_AT)).expect("a due item");
            let item = match &record {
                Some(k) => DueItem::Record(k),
                None => DueItem::Check(&owned),
            };
            let other = w.with_ambient(Ambient::fixed(NOW, SEED + 1)).ledger();
            *out.lock().unwrap() = memory::ready(other.claim_due(item, seen, theirs)).expect("their claim");
        });
        token
    }

    /// Each of the first `n` index queries takes `ms` of the run's time.
    fn slow_queries(&self, n: usize, ms: u64) {
        for nth in 0..n {
            let clock = self.clock.clone();
            self.world.during("due.due", nth, move |_| clock.advance(Duration::from_millis(ms)));
        }
    }

    /// The redrive phase's records (and whatever else) are due; one
    /// outbox item and one drifted entitlement wait behind them.
    fn other_phases(&self) -> String {
        self.outbox_item("out_1", NOW - GRACE - 1);
        let pk = self.entitlement("sub_other", "active", 1);
        self.answer("sub_other", is("active", 2));
        pk
    }
}

// ------------------------------------------------------- re-drive selection

#[tokio::test]
async fn never_sent_record_is_sent_then_noted_enqueued() {
    let w = Harness::new();
    let k = w.record("evt_1", Status::Received, None, NOW - 1);
    let summary = w.run(NOW).await;
    assert_eq!(w.acts(), [format!("due.claim_due {k}"), format!("queue.send {k}"), format!("due.note_enqueued {k}")]);
    assert_eq!(w.sent(), [s(&k)]);
    assert_eq!(w.num(&k, "enqueued_at"), Some(NOW));
    assert_eq!(summary.redriven, counts(&[("never_sent", 1)]));
    assert!(summary.complete && summary.errors.is_empty() && summary.evidence, "{summary:?}");
}

#[tokio::test]
async fn sent_but_not_picked_up_record_is_sent_again_without_a_new_note() {
    let w = Harness::new();
    let k = w.record("evt_1", Status::Received, Some(NOW - 100_000), NOW - 1);
    let summary = w.run(NOW).await;
    assert_eq!(w.sent(), [s(&k)]);
    assert!(w.world.calls_named("due.note_enqueued").is_empty());
    assert_eq!(w.num(&k, "enqueued_at"), Some(NOW - 100_000), "the first send time is kept");
    assert_eq!(summary.redriven, counts(&[("not_picked_up", 1)]));
}

#[tokio::test]
async fn expired_lease_is_redriven_and_counted_as_stuck() {
    let w = Harness::new();
    let k = w.record("evt_1", Status::Processing, Some(NOW - 100_000), NOW - 1);
    let summary = w.run(NOW).await;
    assert_eq!(w.sent(), [s(&k)]);
    assert_eq!(w.status(&k), Status::Processing, "the reconciler never changes a status");
    assert_eq!(summary.stuck_leases, 1);
    assert_eq!(summary.redriven, counts(&[("lease_expired", 1)]));
}

#[tokio::test]
async fn a_live_lease_is_looked_at_again_when_it_ends_not_redriven() {
    // The lease does not move a record in the due index: a worker may
    // still hold it when its due time comes.
    let w = Harness::new();
    let k = w.record("evt_1", Status::Processing, Some(NOW - 100_000), NOW - 1);
    w.set_num(&k, "lease_expires_at", NOW + 20_000);
    let summary = w.run(NOW).await;
    assert!(w.sent().is_empty(), "not re-driven while leased");
    assert_eq!(w.num(&k, "due_at"), Some(NOW + 20_001), "due again just after the lease's end");
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
    let w = Harness::new();
    let k = w.record("evt_1", Status::Processing, Some(NOW - 100_000), NOW - 1);
    w.set_num(&k, "lease_expires_at", NOW + 20_000);
    let id = ids_in_shard(k.shard(SHARDS), 3).into_iter().find(|id| id != "evt_1").expect("another id");
    let other = w.record(&id, Status::Received, None, NOW - 1);
    w.world.state().table.set_index_lag(true);
    w.ledger().edit(&k, |item| {
        set(item, attr::DUE_AT, NOW + 20_001);
        set(item, CLAIM_TOKEN, "another-run");
    });
    // Each index query takes 100 ms: a run that kept reading the page
    // would pass its deadline.
    w.slow_queries(100, 100);
    let deadline = w.clock.instant() + Duration::from_secs(5);
    let summary = w.reconciler().run(NOW, deadline).await;
    assert!(w.clock.instant() < deadline, "the run ended by itself");
    assert!(summary.complete && summary.errors.is_empty(), "{summary:?}");
    assert_eq!(w.sent(), [s(&other)]);
    let records_queries = w.world.calls_named("due.due").iter().filter(|p| p.starts_with("due#")).count();
    assert_eq!(records_queries, SHARDS as usize, "one page per shard");
    let claims = w.world.calls_named("due.claim_due");
    assert_eq!(claims.iter().filter(|c| *c == k.as_str()).count(), 1, "its claim was tried, once: {claims:?}");
    let stands = (w.num(&k, attr::DUE_AT), w.text(&k, CLAIM_TOKEN));
    assert_eq!(stands, (Some(NOW + 20_001), Some("another-run".to_owned())), "the other run's move stands");
}

#[tokio::test]
async fn a_drift_backlog_never_keeps_a_record_from_being_redriven() {
    // 4 shards, budget 10, 40 overdue entitlements per shard due before a
    // never-sent record in each shard; the provider answering, then
    // failing: every record is re-driven in the first run.
    for provider_down in [false, true] {
        let w = Harness::with(ReconcilerSettings { max_items: 10, ..settings() });
        for shard in 0..SHARDS {
            let subs: Vec<String> = (0..)
                .map(|i| format!("sub_{shard}_{i}"))
                .filter(|sub| shard_of(sub, SHARDS) == shard)
                .take(40)
                .collect();
            for sub in subs {
                w.entitlement_due(&sub, "active", 1, NOW - 3_600_000);
                w.answer(&sub, if provider_down { Answer::Down } else { is("active", 1) });
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
    let w = Harness::with(ReconcilerSettings { max_items: 10, ..settings() });
    for shard in 0..SHARDS {
        for id in ids_in_shard(shard, 100) {
            w.record(&id, Status::Received, None, NOW - 1_000);
        }
    }
    for i in 0..12 {
        w.outbox_item(&format!("out_{i}"), NOW - GRACE - 1);
        let sub = format!("sub_{i}");
        w.entitlement(&sub, "active", 1);
        w.answer(&sub, is("active", 1));
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
    let w = Harness::new();
    let ids = ids_in_shard(1, 2);
    let old = key(&ids[0]);
    let young = w.record(&ids[1], Status::Retryable, Some(1), NOW - 10_000);
    w.set_num(&young, attr::RECEIVED_AT, NOW - 60_000);
    w.ledger().add(&old, Status::Retryable, NOW - 7_200_000, json!({ "enqueued_at": 1 }));
    for run in 0..6_i64 {
        let now = NOW + run * 1_000;
        let due = if run % 2 == 0 { now + 500 } else { now - 500 };
        w.ledger().edit(&old, |item| {
            set(item, attr::DUE_AT, due);
            set(item, "next_attempt_at", due);
        });
        let summary = w.run(now).await;
        let age = summary.oldest_unprocessed_age_ms.unwrap_or(0);
        assert!(age >= 7_200_000, "run {run}: {age} ms: {summary:?}");
        assert_eq!(summary.incomplete_shards, 0);
    }
}

#[tokio::test]
async fn a_shard_with_more_open_records_than_a_page_is_a_lower_bound_and_says_so() {
    let w = Harness::with(ReconcilerSettings { max_items: 10, ..settings() });
    for id in ids_in_shard(2, 100 * crate::reconciler::LOOKAHEAD_PAGES + 50) {
        w.record(&id, Status::Retryable, Some(1), NOW + 1_000);
    }
    let gauges = Gauges::default();
    let _local = metrics::set_default_local_recorder(&gauges);
    let summary = w.run(NOW).await;
    assert_eq!(summary.incomplete_shards, 1, "{summary:?}");
    let set = gauges.0.lock().unwrap().clone();
    assert_eq!(set.get("reconciler_incomplete"), Some(&1.0));
    assert!(set.contains_key("oldest_unprocessed_age"));
    let idle = Harness::new();
    let gauges = Gauges::default();
    let _local = metrics::set_default_local_recorder(&gauges);
    let summary = idle.run(NOW).await;
    assert_eq!((summary.incomplete_shards, summary.oldest_unprocessed_age_ms), (0, None));
    let set = gauges.0.lock().unwrap().clone();
    assert_eq!((set.get("reconciler_incomplete"), set.get("oldest_unprocessed_age")), (Some(&0.0), Some(&0.0)));
}

#[tokio::test]
async fn due_retry_is_redriven() {
    let w = Harness::new();
    let k = w.record("evt_1", Status::Retryable, Some(NOW - 100_000), NOW - 1);
    let summary = w.run(NOW).await;
    assert_eq!(w.sent(), [s(&k)]);
    assert_eq!(summary.redriven, counts(&[("retry_due", 1)]));
    assert_eq!(summary.stuck_leases, 0);
}

#[tokio::test]
async fn records_not_yet_due_are_left_untouched() {
    let w = Harness::new();
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
        let seen = (w.num(k, attr::DUE_AT), w.num(k, "redrives"), w.text(k, CLAIM_TOKEN));
        assert_eq!(seen, (Some(NOW + 1), None, None), "{k}: never claimed");
    }
    assert_eq!(w.num(&never_sent_later, "enqueued_at"), None);
    assert_eq!(summary.redriven, counts(&[("never_sent", 1)]));
}

#[tokio::test]
async fn every_claimed_record_is_looked_at_again_after_the_backoff() {
    let w = Harness::new();
    let keys = [
        w.record("evt_1", Status::Received, None, NOW - 5),
        w.record("evt_2", Status::Received, Some(NOW - 90_000), NOW - 4),
        w.record("evt_3", Status::Processing, Some(NOW - 90_000), NOW - 3),
        w.record("evt_4", Status::Retryable, Some(NOW - 90_000), NOW - 2),
    ];
    let summary = w.run(NOW).await;
    for k in &keys {
        assert_eq!(w.num(k, attr::DUE_AT), Some(NOW + BACKOFF), "{k}");
        assert!(w.claimed(k) && w.num(k, "redrives") == Some(1), "{k}: {:?}", w.ledger().item(k));
    }
    let mut sent = w.sent();
    sent.sort();
    assert_eq!(sent, keys.iter().map(s).collect::<Vec<_>>());
    assert_eq!(summary.redriven.values().sum::<u64>(), 4);
}

#[tokio::test]
async fn a_record_claimed_by_a_concurrent_run_is_not_sent() {
    let w = Harness::new();
    let theirs = w.record("evt_a", Status::Received, None, NOW - 2);
    let ours = w.record("evt_b", Status::Retryable, Some(NOW - 90_000), NOW - 1);
    let their_token = w.race(theirs.as_str(), NOW + 7);
    let summary = w.run(NOW).await;
    assert_eq!(w.sent(), [s(&ours)]);
    let their_token = their_token.lock().unwrap().clone();
    assert!(their_token.is_some(), "their claim landed");
    let stands = (w.num(&theirs, attr::DUE_AT), w.text(&theirs, CLAIM_TOKEN));
    assert_eq!(stands, (Some(NOW + 7), their_token), "their claim stands");
    assert_eq!(w.num(&theirs, "redrives"), Some(1), "claimed once, by them");
    assert_eq!(w.num(&theirs, "enqueued_at"), None, "not noted by a run that did not send it");
    assert_eq!(summary.redriven, counts(&[("retry_due", 1)]));
    assert!(summary.complete && summary.errors.is_empty(), "{summary:?}");
}

#[tokio::test]
async fn a_second_run_at_the_same_time_finds_nothing_to_do() {
    let w = Harness::new();
    w.record("evt_1", Status::Received, None, NOW - 3);
    w.record("evt_2", Status::Processing, Some(NOW - 90_000), NOW - 2);
    w.record("evt_3", Status::Retryable, Some(NOW - 90_000), NOW - 1);
    let first = w.run(NOW).await;
    assert_eq!(first.redriven.values().sum::<u64>(), 3);
    w.forget();
    let second = w.run(NOW).await;
    assert!(w.acts().is_empty(), "{:?}", w.acts());
    assert!(w.sent().is_empty());
    assert!(second.redriven.is_empty() && second.stuck_leases == 0, "{second:?}");
    assert!(second.complete && second.errors.is_empty(), "{second:?}");
}

#[tokio::test]
async fn a_run_after_the_backoff_sends_again_what_is_still_not_done() {
    let w = Harness::new();
    let never_sent = w.record("evt_1", Status::Received, None, NOW - 2);
    let stuck = w.record("evt_2", Status::Processing, Some(NOW - 90_000), NOW - 1);
    w.run(NOW).await;
    w.forget();
    assert!(w.run(NOW + BACKOFF - 1).await.redriven.is_empty());
    let again = w.run(NOW + BACKOFF).await;
    let mut sent = w.sent();
    sent.sort();
    assert_eq!(sent, [s(&never_sent), s(&stuck)]);
    // Noted at its first re-drive, it is now "sent, not picked up", and keeps its note.
    assert_eq!(again.redriven, counts(&[("lease_expired", 1), ("not_picked_up", 1)]));
    assert_eq!(w.num(&never_sent, "enqueued_at"), Some(NOW));
    // Its second re-drive backs off twice as long: it merely waits in the queue.
    assert_eq!(w.num(&never_sent, attr::DUE_AT), Some(NOW + BACKOFF + 2 * BACKOFF));
    assert_eq!(w.num(&stuck, attr::DUE_AT), Some(NOW + 2 * BACKOFF), "an expired lease: the plain backoff");
}

#[tokio::test]
async fn redrive_pages_through_a_shard_larger_than_one_page() {
    let w = Harness::new();
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
    let w = Harness::new();
    let failing = w.record("evt_a", Status::Received, None, NOW - 3);
    let others = [
        w.record("evt_b", Status::Retryable, Some(1), NOW - 2),
        w.record("evt_c", Status::Retryable, Some(1), NOW - 1),
    ];
    w.fail_send_of(failing.as_str(), Fault::Unavailable);
    let summary = w.run(NOW).await;
    let mut sent = w.sent();
    sent.sort();
    assert_eq!(sent, others.iter().map(s).collect::<Vec<_>>());
    assert_eq!(summary.errors, counts(&[("redrive", 1)]));
    assert_eq!(summary.redriven, counts(&[("retry_due", 2)]));
    assert!(summary.complete, "one failure does not stop the phase: {summary:?}");
    let stays = (w.num(&failing, "enqueued_at"), w.num(&failing, attr::DUE_AT));
    assert_eq!(stays, (None, Some(NOW + BACKOFF)), "not noted, due after the backoff");

    w.forget();
    let next = w.run(NOW + BACKOFF).await;
    assert!(w.sent().contains(&s(&failing)));
    assert_eq!(w.num(&failing, "enqueued_at"), Some(NOW + BACKOFF));
    assert_eq!(next.redriven.get("never_sent"), Some(&1));
    assert!(next.errors.is_empty());
}

#[tokio::test]
async fn a_throttled_send_stops_the_redrive_phase_but_outbox_and_drift_still_run() {
    let w = Harness::new();
    // More than one request's worth: the first request's first entry is
    // throttled (the memory queue fails entries one by one).
    let keys: Vec<EventKey> =
        (0..13).map(|i| w.record(&format!("evt_{i}"), Status::Received, Some(1), NOW - 1 - i)).collect();
    w.other_phases();
    w.script_sends(&[Some(Fault::Throttle)]);
    let summary = w.run(NOW).await;
    assert_eq!(summary.errors, counts(&[("redrive", 1)]));
    assert!(!summary.complete);
    assert_eq!(summary.redriven, counts(&[("not_picked_up", SEND_BATCH_MAX as u64 - 1)]), "the rest of its request");
    let claimed = keys.iter().filter(|k| w.claimed(k)).count();
    assert_eq!(claimed, SEND_BATCH_MAX, "nothing after the throttled request is claimed");
    assert_eq!(w.send_attempts(), SEND_BATCH_MAX + 1, "the throttled request, then the drift repair");
    assert_eq!(summary.outbox_republished, 1);
    assert_eq!((summary.drift_checked, summary.drift_repaired), (1, 1));
    assert!(summary.evidence);
}

#[tokio::test]
async fn max_consecutive_errors_in_a_row_stop_the_redrive_phase() {
    let w = Harness::new();
    let keys: Vec<EventKey> =
        (0..17).map(|i| w.record(&format!("evt_{i}"), Status::Received, Some(1), NOW - 1 - i)).collect();
    w.other_phases();
    w.script_sends(&[Some(Fault::Unavailable); MAX_CONSECUTIVE_ERRORS as usize]);
    let summary = w.run(NOW).await;
    assert_eq!(summary.errors, counts(&[("redrive", u64::from(MAX_CONSECUTIVE_ERRORS))]));
    assert!(!summary.complete);
    let claimed = keys.iter().filter(|k| w.claimed(k)).count();
    assert_eq!(claimed, SEND_BATCH_MAX, "one request's worth; the rest is left for the next run");
    assert_eq!(summary.outbox_republished, 1);
    assert_eq!((summary.drift_checked, summary.drift_repaired), (1, 1));
}

#[tokio::test]
async fn failures_not_in_a_row_do_not_stop_the_phase() {
    let w = Harness::new();
    for i in 0..10 {
        w.record(&format!("evt_{i}"), Status::Received, Some(1), NOW - 1 - i);
    }
    let down = Some(Fault::Unavailable);
    w.script_sends(&[down, down, down, down, None, down, down, down, down, None]);
    let summary = w.run(NOW).await;
    assert_eq!(w.send_attempts(), 10);
    assert_eq!(summary.errors, counts(&[("redrive", 8)]));
    assert_eq!(summary.redriven, counts(&[("not_picked_up", 2)]));
    assert!(summary.complete, "{summary:?}");
}

#[tokio::test]
async fn a_failed_claim_is_counted_and_the_record_is_not_sent() {
    let w = Harness::new();
    // Alone in its shard, so its page holds nothing else.
    let failing = w.record(&ids_in_shard(0, 1)[0], Status::Received, None, NOW - 1);
    let other = w.record(&ids_in_shard(1, 1)[0], Status::Received, None, NOW - 1);
    w.world.inject_on("due.claim_due", failing.as_str(), None, Fault::Unavailable);
    let summary = w.run(NOW).await;
    assert_eq!(w.sent(), [s(&other)]);
    assert_eq!(summary.errors, counts(&[("redrive", 1)]));
    let still = (w.num(&failing, attr::DUE_AT), w.num(&failing, "enqueued_at"));
    assert_eq!(still, (Some(NOW - 1), None), "still due");
    assert!(summary.complete);
}

#[tokio::test]
async fn a_failed_claim_is_tried_and_counted_once_per_run() {
    let w = Harness::new();
    let ids = ids_in_shard(0, 2);
    let failing = w.record(&ids[0], Status::Received, None, NOW - 2);
    w.record(&ids[1], Status::Received, None, NOW - 1);
    w.world.inject_on("due.claim_due", failing.as_str(), None, Fault::Unavailable);
    let summary = w.run(NOW).await;
    assert_eq!(summary.errors, counts(&[("redrive", 1)]));
    let tried = w.world.calls_named("due.claim_due").iter().filter(|c| *c == failing.as_str()).count();
    assert_eq!(tried, 1);
}

#[tokio::test]
async fn a_failed_note_is_counted_and_the_record_is_sent_again_later() {
    let w = Harness::new();
    let k = w.record("evt_1", Status::Received, None, NOW - 1);
    w.world.inject("due.note_enqueued", 0, Some(1), Fault::Unavailable);
    let summary = w.run(NOW).await;
    assert_eq!(w.sent(), [s(&k)]);
    assert_eq!(summary.errors, counts(&[("redrive", 1)]));
    assert_eq!(summary.redriven, counts(&[("never_sent", 1)]), "it was sent");
    assert_eq!(w.num(&k, "enqueued_at"), None);
    let next = w.run(NOW + BACKOFF).await;
    assert_eq!(w.sent(), [s(&k), s(&k)]);
    assert_eq!(next.redriven, counts(&[("never_sent", 1)]));
    assert_eq!(w.num(&k, "enqueued_at"), Some(NOW + BACKOFF));
}

#[tokio::test]
async fn a_failing_due_query_is_counted_per_shard_and_phase_and_the_run_goes_on() {
    let w = Harness::new();
    w.record("evt_1", Status::Retryable, Some(1), NOW - 1);
    w.other_phases();
    // Every shard's query of every phase fails once: nothing is acted
    // on, each failure is counted, the evidence is still gathered.
    w.world.inject("due.due", 0, Some(3 * SHARDS), Fault::Unavailable);
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
    let w = Harness::new();
    let k = w.record("evt_1", Status::Retryable, Some(1), NOW - 1);
    // The first shard the run visits fails; the record's shard is another.
    let first = ((NOW / 60_000) as u64 % u64::from(SHARDS)) as u32;
    assert_ne!(k.shard(SHARDS), first, "pick another id for this test");
    w.world.inject("due.due", 0, Some(1), Fault::Unavailable);
    let summary = w.run(NOW).await;
    assert_eq!(summary.errors, counts(&[("due", 1)]));
    assert_eq!(w.sent(), [s(&k)]);
}

// ------------------------------------------------------------------ budget

#[tokio::test]
async fn max_items_bounds_the_actions_and_the_following_runs_continue() {
    let w = Harness::with(ReconcilerSettings { max_items: 2, ..settings() });
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
    let w = Harness::with(ReconcilerSettings { max_items: 3, ..settings() });
    w.record("evt_1", Status::Received, None, NOW - 2);
    w.record("evt_2", Status::Received, None, NOW - 1);
    w.outbox_item("out_1", NOW - GRACE - 2);
    w.outbox_item("out_2", NOW - GRACE - 1);
    w.entitlement("sub_1", "active", 1);
    w.answer("sub_1", is("active", 1));
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
    let w = Harness::with(ReconcilerSettings { max_items: 10, ..settings() });
    for i in 0..12 {
        w.outbox_item(&format!("out_{i}"), NOW - GRACE - 1 - i);
    }
    let first = w.run(NOW).await;
    assert_eq!((first.outbox_republished, first.complete), (10, false), "{first:?}");
    // Records with no other work: they get what the others leave.
    let w = Harness::with(ReconcilerSettings { max_items: 10, ..settings() });
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
    let w = Harness::new();
    w.record("evt_1", Status::Received, None, NOW - 1);
    w.record("evt_dead", Status::Dead, None, NOW - 1);
    w.other_phases();
    let summary = w.reconciler().run(NOW, w.clock.instant()).await;
    assert!(w.acts().is_empty(), "{:?}", w.acts());
    let calls: Vec<String> = w.world.calls().into_iter().filter(|c| !bookkeeping(c)).collect();
    assert_eq!(calls, ["due.attention"], "not even the index is read");
    assert!(!summary.complete && summary.errors.is_empty(), "{summary:?}");
    assert!(summary.evidence && summary.dead_letters == 1, "{summary:?}");
}

// ------------------------------------------------------------------ outbox

#[tokio::test]
async fn due_outbox_items_are_dispatched_and_their_outcomes_counted() {
    let w = Harness::new();
    let old = NOW - GRACE - 10;
    for id in ["out_published", "out_retrying", "out_skipped"] {
        w.outbox_item(id, old);
    }
    // Its publish fails: it backs off.
    w.fail_publish_of("out_retrying");
    // Its last allowed attempt's publish fails: it goes dead.
    let last_try =
        OutboxView { attempts: DispatchPolicy::default().max_attempts - 1, ..Harness::pending("out_dead", old) };
    w.world.outbox().put("out_dead", &last_try);
    w.fail_publish_of("out_dead");
    // A live dispatcher claims it between the index read and ours.
    w.claimed_meanwhile("out_skipped", NOW);
    w.outbox_item("out_young", NOW - GRACE + 1);
    let summary = w.run(NOW).await;
    let dispatched: HashSet<String> = w.dispatched().into_iter().collect();
    let expected = ["out_published", "out_retrying", "out_dead", "out_skipped"].map(str::to_owned);
    assert_eq!(dispatched, HashSet::from(expected), "younger than the grace: left to its processor");
    assert_eq!(summary.outbox_republished, 1);
    assert_eq!((summary.outbox_failed, summary.outbox_dead_lettered), (2, 1));
    assert_eq!(summary.errors, counts(&[("outbox", 2)]), "each failed publish is an item failure");
    assert_eq!(summary.outbox_dead, 1, "evidence: the dead item");
    assert!(summary.complete, "{summary:?}");
    let outbox = w.world.outbox();
    let statuses =
        ["out_published", "out_retrying", "out_dead", "out_skipped", "out_young"].map(|id| outbox.status(id));
    assert_eq!(statuses, ["SENT", "PENDING", "DEAD", "SENDING", "PENDING"]);
    assert!(outbox.get("out_retrying").due_at.is_some_and(|at| at > NOW), "due again after its backoff");
    assert_eq!(outbox.get("out_skipped").token.as_deref(), Some("another-dispatcher"), "left to its claim");
    let published: Vec<bool> = w.world.publisher().attempts().iter().map(|p| p.ok).collect();
    assert_eq!(published.iter().filter(|ok| **ok).count(), 1, "{published:?}");
    assert_eq!(published.len(), 3, "the skipped one is not published: {published:?}");
}

#[tokio::test]
async fn skipped_outbox_items_spend_no_budget() {
    let w = Harness::with(ReconcilerSettings { max_items: 1, ..settings() });
    let in_shard = |shard| (0..).map(|i| format!("out_{i}")).find(|id| shard_of(id, SHARDS) == shard);
    // The run starts at a shard that moves with time.
    let first = ((NOW / 60_000) as u64 % u64::from(SHARDS)) as u32;
    let (skipped, published) = (in_shard(first).expect("id"), in_shard((first + 1) % SHARDS).expect("id"));
    w.outbox_item(&skipped, NOW - GRACE - 2);
    w.outbox_item(&published, NOW - GRACE - 1);
    w.claimed_meanwhile(&skipped, NOW);
    let summary = w.run(NOW).await;
    // The other dispatcher's claim, ours (refused: skipped), then the next shard's item.
    assert_eq!(w.dispatched(), [skipped.clone(), skipped, published.clone()]);
    assert_eq!(w.world.outbox().status(&published), "SENT");
    assert_eq!((summary.outbox_republished, summary.outbox_failed), (1, 0));
    assert!(summary.errors.is_empty());
}

/// A record parked at the gap bound whose predecessor committed, but whose
/// predecessor's processor died before waking it: the waiter pointer it
/// left due has the next run look at the stream, wake it and queue it; a
/// run before the predecessor committed leaves it parked, to look again.
#[tokio::test]
async fn a_parked_gap_waiter_whose_predecessor_committed_is_woken_by_the_next_run() {
    use crate::ports::WorkLedger as _;
    use crate::projection::sequence::Position;
    let w = Harness::new();
    let k = key("evt_waiting");
    w.ledger().add(&k, Status::Parked, NOW - 1_000_000, json!({"park_reason": "gap"}));
    let at = Position { stream: "seq#acct_r".into(), seq: 3 };
    memory::ready(w.ledger().register_waiter(&at, &k, NOW / 1000 + 86_400, Some(NOW - 1_000))).unwrap();

    let before = w.run(NOW).await;
    assert_eq!(before.gaps_woken, 0, "its predecessor has not committed");
    assert_eq!(w.status(&k), Status::Parked);
    // Seq 2 commits; its processor dies before the wake-up.
    w.world.seed(&stream_state("seq#acct_r", 2));
    let soon = w.run(NOW + 1_000).await;
    assert_eq!(soon.gaps_woken, 0, "looked at again after the backoff, not at every run");
    let after = w.run(NOW + settings().redrive_backoff_ms + 60_000).await;
    assert_eq!(after.gaps_woken, 1, "{after:?}");
    assert_eq!(w.status(&k), Status::Retryable);
    assert_eq!(w.world.queue().keys(), std::slice::from_ref(&k), "queued at once");
    let again = w.run(NOW + 10 * settings().redrive_backoff_ms).await;
    assert_eq!(again.gaps_woken, 0, "once");
}

/// A re-drive the queue refuses as invalid (a caller error) would be refused
/// at every look: the record is DEAD `caller_error` with the answer, not
/// re-driven forever; a transient failure leaves it due, as before.
#[tokio::test]
async fn a_redrive_refused_as_invalid_ends_the_record_dead_caller_error() {
    let w = Harness::new();
    let k = w.record("evt_refused", Status::Received, None, NOW - 1);
    w.world.inject("queue.send", 0, Some(1), Fault::Invalid);
    let summary = w.run(NOW).await;
    assert_eq!(summary.caller_dead, 1, "{summary:?}");
    assert_eq!(w.status(&k), Status::Dead);
    assert_eq!(w.text(&k, "dead_reason").as_deref(), Some("caller_error"));
    assert!(w.text(&k, "error_message").is_some_and(|m| m.contains("ValidationException")));
    assert!(w.sent().is_empty());
}

/// The new writes recognise their own retry: a `dead_refused` or a waiter
/// look whose acknowledgement was lost (the write landed, the adapter's
/// retry meets it) still counts as done, once; a run that dies right after
/// leaves a state the next run finishes (the waiter's pointer still due
/// with its record already woken: settled, not woken twice).
#[tokio::test]
async fn the_caller_dead_and_the_waiter_look_recognise_their_own_retry() {
    use crate::ports::WorkLedger as _;
    use crate::projection::sequence::Position;
    let w = Harness::new();
    let k = w.record("evt_refused", Status::Received, None, NOW - 1);
    w.world.inject("queue.send", 0, Some(1), Fault::Invalid);
    w.world.inject("due.dead_refused", 0, Some(1), Fault::LoseAckOnce);
    assert_eq!(w.run(NOW).await.caller_dead, 1);
    assert_eq!(w.status(&k), Status::Dead);

    let waiting = key("evt_waiting");
    w.ledger().add(&waiting, Status::Parked, NOW - 1_000_000, json!({"park_reason": "gap"}));
    let at = Position { stream: "seq#acct_l".into(), seq: 2 };
    memory::ready(w.ledger().register_waiter(&at, &waiting, NOW / 1000 + 86_400, Some(NOW - 1_000))).unwrap();
    w.world.seed(&stream_state("seq#acct_l", 1));
    w.world.inject("due.look_at_waiter", 0, Some(1), Fault::LoseAckOnce);
    let first = w.run(NOW + 1).await;
    assert_eq!(first.gaps_woken, 1, "{first:?}");
    assert_eq!(w.status(&waiting), Status::Retryable);
    assert_eq!(w.world.queue().keys(), std::slice::from_ref(&waiting));
    let later = w.run(NOW + 10 * settings().redrive_backoff_ms).await;
    assert_eq!(later.gaps_woken, 0, "settled: not looked at again");
}

/// A long run claims each item at the clock's current time, not at the
/// run's start: a claim taken 100 s into the run lasts its whole lease from
/// then, so a concurrent run cannot take the same item while it is held.
#[tokio::test]
async fn a_long_run_claims_each_item_at_the_clocks_current_time() {
    let w = Harness::new();
    let first = ((NOW / 60_000) as u64 % u64::from(SHARDS)) as u32;
    let mut ids = (0..).map(|i| format!("out_{i}")).filter(|id| shard_of(id, SHARDS) == first);
    let (early, late) = (ids.next().expect("id"), ids.next().expect("id"));
    w.outbox_item(&early, NOW - GRACE - 2);
    w.outbox_item(&late, NOW - GRACE - 1);
    // The first dispatch takes 100 s (a slow publish, say).
    let clock = w.clock.clone();
    w.world.during_on("outbox.claim", &early, move |_| clock.advance(Duration::from_secs(100)));
    let summary = w.run(NOW).await;
    assert_eq!(summary.outbox_republished, 2);
    let outbox = w.world.outbox();
    assert_eq!(outbox.get(&early).sent_at, Some(NOW), "reached at the run's start");
    assert_eq!(outbox.get(&late).sent_at, Some(NOW + 100_000), "claimed and marked at the time it was reached");
}

#[tokio::test]
async fn a_failed_dispatch_is_counted_and_the_item_stays_due() {
    let w = Harness::new();
    w.outbox_item("out_1", NOW - GRACE - 1);
    w.world.inject_on("outbox.claim", "out_1", Some(1), Fault::Unavailable);
    let summary = w.run(NOW).await;
    assert_eq!(summary.errors, counts(&[("outbox", 1)]));
    assert_eq!((summary.outbox_republished, summary.outbox_failed), (0, 0), "nothing was published");
    assert!(summary.complete, "{summary:?}");
    assert!(w.world.publisher().attempts().is_empty());
    let next = w.run(NOW).await;
    assert_eq!(next.outbox_republished, 1, "still due: the next run publishes it");
    assert_eq!(w.dispatched(), ["out_1", "out_1"]);
}

/// A destination that refuses every publish is not the phase's failure: a
/// failing SNS topic's items back off and the same run goes on to publish
/// an SQS queue's items due after them (before: five refusals in a row
/// ended the outbox phase for every destination).
#[tokio::test]
async fn a_failing_destination_does_not_stop_another_destinations_retries_in_the_same_run() {
    let w = Harness::new();
    const QUEUE: &str = "arn:aws:sqs:us-east-1:123456789012:orders";
    // All in one shard, the topic's seven due first: one page, in due order.
    let in_shard_0 = |prefix: &str, n: usize| -> Vec<String> {
        (0..).map(|i| format!("{prefix}{i}")).filter(|id| shard_of(id, SHARDS) == 0).take(n).collect()
    };
    let (topic, queue) = (in_shard_0("out_t", 7), in_shard_0("out_q", 3));
    for (i, id) in topic.iter().enumerate() {
        w.outbox_item(id, NOW - GRACE - 100 + i as i64);
    }
    for (i, id) in queue.iter().enumerate() {
        w.world.outbox().put(id, &OutboxView::pending(id, QUEUE, 0, NOW - GRACE - 50 + i as i64));
    }
    w.world.publisher().refuse(TOPIC);
    w.entitlement("sub_1", "active", 1);
    w.answer("sub_1", is("active", 1));
    let summary = w.run(NOW).await;
    assert_eq!(w.dispatched().len(), 10, "every due item tried: {:?}", w.dispatched());
    assert_eq!((summary.outbox_failed, summary.outbox_republished), (7, 3));
    for id in &queue {
        assert_eq!(w.world.outbox().status(id), "SENT", "{id}");
    }
    assert_eq!(w.world.outbox().status(&topic[0]), "PENDING", "backed off");
    assert_eq!(summary.errors, counts(&[("outbox", 7)]));
    assert!(summary.complete, "no phase stopped: {summary:?}");
    assert_eq!(summary.drift_checked, 1, "the drift phase runs");
}

/// The phase's own ports failing in a row still stop it (its dependency is
/// down): the outbox store throttled at its claims.
#[tokio::test]
async fn the_outbox_store_failing_in_a_row_stops_the_outbox_phase() {
    let w = Harness::new();
    for i in 0..7 {
        w.outbox_item(&format!("out_{i}"), NOW - GRACE - 1 - i);
    }
    w.world.inject("outbox.claim", 0, None, Fault::Unavailable);
    w.entitlement("sub_1", "active", 1);
    w.answer("sub_1", is("active", 1));
    let summary = w.run(NOW).await;
    assert_eq!(w.dispatched().len(), MAX_CONSECUTIVE_ERRORS as usize);
    assert_eq!(summary.errors, counts(&[("outbox", u64::from(MAX_CONSECUTIVE_ERRORS))]));
    assert!(!summary.complete);
    assert_eq!(summary.drift_checked, 1, "the drift phase still runs");
}

#[tokio::test]
async fn without_a_dispatcher_the_outbox_phase_is_skipped() {
    let w = Harness::new();
    w.outbox_item("out_1", NOW - GRACE - 1);
    w.dead_outbox_items(4);
    let recon: Recon =
        Reconciler::new(w.ledger(), w.world.queue(), None, Rechecks::new(), w.settings).with_ambient(w.ambient());
    let summary = recon.run(NOW, w.far()).await;
    assert!(w.dispatched().is_empty());
    assert_eq!(w.world.outbox().status("out_1"), "PENDING");
    assert_eq!((summary.outbox_republished, summary.outbox_dead), (0, 4), "the evidence reads the table");
    assert!(summary.complete && summary.evidence, "{summary:?}");
}

// ------------------------------------------------------------------- drift

/// Issue 39.15: the drift a reconciler run finds and repairs is what
/// `hookledger stats` (and the console's overview) reads back: the run's
/// metrics, as the reconciler function's collector records them
/// (`function = reconciler`, the `projection` label a dimension), through
/// the metrics port, to `insight`'s figures, beside the run's own summary.
#[tokio::test]
async fn the_drift_a_run_repairs_reaches_stats_through_the_metrics_port() {
    let w = Harness::new();
    w.entitlement("sub_1", "active", 5);
    w.entitlement("sub_2", "active", 3);
    w.entitlement("sub_3", "active", 2);
    w.answer("sub_1", is("active", 7));
    w.answer("sub_2", is("canceled", 3));
    w.answer("sub_3", is("active", 2));
    let emitted = memory::MemMetrics::new(w.clock.clone(), "reconciler");
    let summary = {
        let _recording = metrics::set_default_local_recorder(&emitted);
        w.run(NOW).await
    };
    assert_eq!((summary.drift_checked, summary.drift_found, summary.drift_repaired), (3, 2, 2));
    let insight = crate::insight::Insight::new(w.ledger(), emitted);
    let window = crate::ports::MetricWindow { since_ms: NOW - 3_600_000, until_ms: NOW + 60_000, period_s: 300 };
    let stats = insight.stats(&window, NOW).await.unwrap();
    assert_eq!((stats.drift_found, stats.drift_repaired), (2, 2), "stats shows the run's drift");
    let failures = insight.failures(&window, NOW).await.unwrap();
    let drift: Vec<(u64, u64)> = failures.drift.iter().map(|p| (p.found, p.repaired)).collect();
    assert_eq!(drift, [(2, 2)], "the overview's drift plot too");
}

#[tokio::test]
async fn drift_creates_one_reconciliation_record_and_sends_it() {
    let w = Harness::new();
    let pk = w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", is("active", 7));
    let summary = w.run(NOW).await;
    let k = repair_key("evt_local_sub_1", "sub_1", "active", 7);
    assert_eq!(
        w.acts(),
        [
            format!("due.claim_due {pk}"),
            "source.subscription sub_1".into(),
            format!("ledger.claim {k}"),
            format!("queue.send {k}"),
            format!("ledger.mark_enqueued {k}"),
        ]
    );
    assert_eq!(w.sent(), [s(&k)]);
    assert_eq!(w.records(), 1);
    let r = (w.status(&k), w.text(&k, attr::PAYLOAD_STORED), w.num(&k, "enqueued_at"));
    assert_eq!(r, (Status::Received, Some("true".to_owned()), Some(NOW)));
    let index = (w.text(&k, attr::DUE_SHARD), w.num(&k, attr::DUE_AT));
    assert_eq!(index, (Some(due_shard(k.shard(SHARDS))), Some(NOW + REDRIVE_GRACE_MS)));
    assert_eq!(w.text(&k, attr::VIA).as_deref(), Some("reconciliation"));
    let body = w.payload_of(&k).expect("payload");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let event_id = k.as_str().rsplit('#').next().unwrap();
    assert_eq!(body["id"], event_id);
    assert_eq!(body["type"], "customer.subscription.reconciled");
    assert_eq!(body["data"]["object"]["id"], "sub_1");
    assert_eq!(body["data"]["object"]["customer"], "cus_1");
    assert_eq!(w.text(&k, attr::PAYLOAD_HASH), Some(payload_hash(&serde_json::to_vec(&body).unwrap())));
    assert_eq!(w.ent_due(&pk), NOW + INTERVAL, "checked now: next look after another interval");
    assert_eq!((summary.drift_checked, summary.drift_found, summary.drift_repaired), (1, 1, 1));
    assert!(summary.complete && summary.errors.is_empty(), "{summary:?}");
}

#[tokio::test]
async fn checking_the_same_drift_again_meets_its_own_record_and_does_not_send_twice() {
    // A short interval, so the second check comes before the repair is due for a re-drive.
    let w = Harness::with(ReconcilerSettings { drift_interval_ms: 10_000, ..settings() });
    w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", is("active", 7));
    w.run(NOW).await;
    assert_eq!(w.run(NOW + 9_999).await.drift_checked, 0, "checked at `now`: not again within the interval");
    let again = w.run(NOW + 10_000).await;
    assert_eq!(again.drift_checked, 1);
    let k = repair_key("evt_local_sub_1", "sub_1", "active", 7);
    assert_eq!(w.sent(), [s(&k)], "one repair, sent once");
    assert_eq!(w.records(), 1);
    assert_eq!(w.world.calls_named("ledger.claim").iter().filter(|c| *c == k.as_str()).count(), 2);
    assert_eq!(w.world.calls_named("ledger.mark_enqueued").iter().filter(|c| *c == k.as_str()).count(), 1);
    assert!(again.errors.is_empty(), "{again:?}");
}

#[tokio::test]
async fn drift_repaired_counts_only_repairs_submitted_by_this_run() {
    let w = Harness::with(ReconcilerSettings { drift_interval_ms: 10_000, ..settings() });
    w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", is("active", 7));
    w.run(NOW).await;
    let again = w.run(NOW + 10_001).await;
    assert_eq!(w.sent().len(), 1);
    assert_eq!((again.drift_found, again.drift_repaired), (1, 0));
}

#[tokio::test]
async fn a_check_whose_send_failed_sends_the_repair_on_its_retry() {
    // A backoff shorter than the re-drive grace, so the drift check (not the re-drive) sends it.
    let w = Harness::with(ReconcilerSettings { redrive_backoff_ms: 30_000, ..settings() });
    let pk = w.entitlement("sub_1", "past_due", 3);
    w.answer("sub_1", is("active", 3));
    let k = repair_key("evt_local_sub_1", "sub_1", "active", 3);
    w.fail_send_of(k.as_str(), Fault::Unavailable);
    let first = w.run(NOW).await;
    assert_eq!(first.errors, counts(&[("drift", 1)]));
    assert_eq!(w.send_attempts(), 1);
    let r = (w.text(&k, attr::PAYLOAD_STORED), w.num(&k, "enqueued_at"));
    assert_eq!(r, (Some("true".to_owned()), None));
    assert_eq!(w.ent_due(&pk), NOW + 30_000, "looked at again after the re-drive backoff");
    let retry = w.run(NOW + 30_001).await;
    assert_eq!(retry.drift_checked, 1);
    assert!(retry.redriven.is_empty(), "the repair itself is not due yet");
    assert_eq!(w.sent(), [s(&k)]);
    assert_eq!((w.records(), w.num(&k, "enqueued_at")), (1, Some(NOW + 30_001)));
    assert!(retry.errors.is_empty(), "{retry:?}");
}

#[tokio::test]
async fn a_check_whose_claim_failed_claims_and_sends_on_its_retry() {
    // The claim writes the record and its payload together: a failed
    // claim leaves neither, and the retry makes both.
    let w = Harness::with(ReconcilerSettings { redrive_backoff_ms: 30_000, ..settings() });
    w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", Answer::Gone);
    let k = repair_key("evt_local_sub_1", "sub_1", "deleted", 0);
    w.world.inject_on("ledger.claim", k.as_str(), Some(1), Fault::Unavailable);
    let first = w.run(NOW).await;
    assert_eq!(first.errors, counts(&[("drift", 1)]));
    assert!(w.sent().is_empty());
    assert_eq!(w.records(), 0);
    assert!(w.world.state().table.partition(k.as_str()).is_empty(), "no payload item either");
    w.run(NOW + 30_001).await;
    assert_eq!(w.text(&k, attr::PAYLOAD_STORED).as_deref(), Some("true"));
    assert!(w.payload_of(&k).is_some());
    assert_eq!(w.sent(), [s(&k)]);
    assert_eq!(w.records(), 1);
}

#[tokio::test]
async fn a_new_drift_instance_gets_its_own_repair() {
    let w = Harness::with(ReconcilerSettings { drift_interval_ms: 10_000, ..settings() });
    w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", is("active", 7));
    w.run(NOW).await;
    w.answer("sub_1", is("canceled", 0));
    w.run(NOW + 10_001).await;
    let first = repair_key("evt_local_sub_1", "sub_1", "active", 7);
    let second = repair_key("evt_local_sub_1", "sub_1", "canceled", 0);
    assert_ne!(first, second);
    assert_eq!(w.sent(), [s(&first), s(&second)]);
}

#[tokio::test]
async fn an_entitlement_is_checked_once_per_run_even_with_a_zero_interval() {
    let w = Harness::with(ReconcilerSettings { drift_interval_ms: 0, ..settings() });
    w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", is("active", 5));
    assert_eq!(w.run(NOW).await.drift_checked, 1);
    assert_eq!(w.run(NOW + 1).await.drift_checked, 1, "due again at the next run");
}

#[tokio::test]
async fn equal_state_needs_no_repair() {
    let w = Harness::new();
    let pk = w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", is("active", 5));
    let summary = w.run(NOW).await;
    assert_eq!(w.acts(), [format!("due.claim_due {pk}"), "source.subscription sub_1".to_owned()]);
    assert_eq!(w.records(), 0);
    assert_eq!((summary.drift_checked, summary.drift_found, summary.drift_repaired), (1, 0, 0));
    assert_eq!(w.ent_due(&pk), NOW + INTERVAL);
}

#[tokio::test]
async fn an_entitlement_without_subscription_or_endpoint_is_not_fetched() {
    let w = Harness::new();
    let pk = w.entitlement("sub_1", "active", 5);
    w.edit_ent(&pk, |item| set(item, "endpoint", None));
    let summary = w.run(NOW).await;
    assert!(w.fetched().is_empty());
    assert_eq!((summary.drift_checked, summary.drift_found, w.records()), (1, 0, 0));
}

#[tokio::test]
async fn a_provider_error_is_counted_and_the_check_retried_after_the_backoff() {
    let w = Harness::new();
    let pk = w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", Answer::Down);
    let summary = w.run(NOW).await;
    assert_eq!(summary.errors, counts(&[("drift", 1)]));
    assert_eq!((summary.drift_checked, summary.drift_found), (1, 0));
    assert!(summary.complete, "one failure does not stop the phase");
    assert_eq!(w.ent_due(&pk), NOW + BACKOFF);
    assert_eq!(w.world.calls_named("due.reschedule"), [pk.as_str()]);
    assert_eq!(w.records(), 0);

    w.answer("sub_1", is("active", 5));
    assert_eq!(w.run(NOW + BACKOFF - 1).await.drift_checked, 0, "not before the backoff");
    let retried = w.run(NOW + BACKOFF).await;
    assert_eq!(retried.drift_checked, 1);
    assert!(retried.errors.is_empty());
    assert_eq!(w.fetched().len(), 2);
}

#[tokio::test]
async fn a_drift_check_claimed_by_a_concurrent_run_is_not_made() {
    let w = Harness::new();
    let pk = w.entitlement("sub_1", "active", 5);
    w.answer("sub_1", is("active", 7));
    let their_token = w.race(&pk, NOW);
    let summary = w.run(NOW).await;
    assert!(their_token.lock().unwrap().is_some(), "their claim landed");
    assert!(w.fetched().is_empty());
    assert_eq!((summary.drift_checked, w.records()), (0, 0));
    assert_eq!(w.ent_due(&pk), NOW, "their next look stands");
    assert!(summary.errors.is_empty());
}

// ---------------------------------------------------------------- evidence

#[tokio::test]
async fn evidence_comes_from_the_port_counts() {
    let w = Harness::new();
    assert_eq!(w.run(NOW).await.oldest_unprocessed_age_ms, None, "nothing open");
    for i in 0..2 {
        w.record(&format!("evt_dead_{i}"), Status::Dead, None, NOW);
    }
    w.record("evt_parked", Status::Parked, None, NOW);
    w.record("evt_done", Status::Processed, None, NOW - 999_000);
    // The oldest record found overdue (not-yet-due ones are younger than
    // the grace, or waiting for their retry or lease).
    let open = w.record("evt_open", Status::Received, Some(1), NOW - 1);
    w.set_num(&open, attr::RECEIVED_AT, NOW - 5_000);
    w.record("evt_later", Status::Retryable, Some(1), NOW + BACKOFF);
    w.dead_outbox_items(3);
    let summary = w.run(NOW).await;
    assert!(summary.evidence);
    assert_eq!((summary.dead_letters, summary.parked, summary.outbox_dead), (2, 1, 3));
    assert_eq!(summary.oldest_unprocessed_age_ms, Some(5_000));
    let skewed = Harness::new();
    let ahead = skewed.record("evt_ahead", Status::Received, Some(1), NOW - 1);
    skewed.set_num(&ahead, attr::RECEIVED_AT, NOW + 1_000);
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
    let w = Harness::new();
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
    for call in ["due.attention"] {
        let w = Harness::new();
        w.record("evt_dead", Status::Dead, None, NOW);
        w.record("evt_1", Status::Received, None, NOW - 1);
        w.world.inject(call, 0, None, Fault::Unavailable);
        let gauges = Gauges::default();
        let _local = metrics::set_default_local_recorder(&gauges);
        let summary = w.run(NOW).await;
        assert!(!summary.evidence, "{call}");
        assert_eq!(summary.errors, counts(&[("evidence", 1)]), "{call}");
        assert!(summary.complete, "{call}: the actions were all done");
        assert_eq!(summary.redriven, counts(&[("never_sent", 1)]), "{call}");
        let set = gauges.0.lock().unwrap().clone();
        for g in EVIDENCE_GAUGES {
            assert!(!set.contains_key(g), "{call}: {g} emitted: {set:?}");
        }
        assert_eq!(set.get("reconciler_errors"), Some(&1.0), "{call}");
    }
}

#[tokio::test]
async fn a_failed_evidence_query_reports_no_partial_counts() {
    let w = Harness::new();
    w.record("evt_dead", Status::Dead, None, NOW);
    w.world.inject("due.attention", 0, None, Fault::Unavailable);
    let summary = w.run(NOW).await;
    assert!(!summary.evidence);
    assert_eq!((summary.dead_letters, summary.parked, summary.outbox_dead), (0, 0, 0));
}

// ------------------------------------------- re-drive labels and batches

/// The intake's hand-over is known from its send lease: a sender whose send
/// succeeded keeps its lease to its end, one whose send failed gives it
/// back. Past the grace, a record still RECEIVED because the processor is
/// behind is re-driven as `not_picked_up`, one never sent as `never_sent`.
#[tokio::test]
async fn a_record_the_intake_handed_over_is_redriven_as_not_picked_up_and_one_whose_send_failed_as_never_sent() {
    use crate::admission::{Admission, Arrival, new_event};
    let w = Harness::new();
    let arrival = |id: &'static str| Arrival {
        provider: "stripe",
        endpoint: "billing",
        tenant: "t1",
        event_id: id,
        event_type: Some("invoice.paid"),
        body: b"{}",
        hashes: None,
        via: crate::ledger::Via::Webhook,
        batch_hash: None,
        retention_days: 30,
        index_shards: SHARDS,
        notification: false,
        kept: None,
    };
    let (sent, refused) =
        (new_event(arrival("evt_sent"), NOW, "send-a".into()), new_event(arrival("evt_refused"), NOW, "send-b".into()));
    w.world.inject_on("queue.send", refused.key.as_str(), Some(1), Fault::Unavailable);
    let (ledger, queue) = (w.ledger(), w.world.queue());
    let admission = Admission { ledger: &ledger, queue: &queue, by: "webhook", keys: None };
    let admitted = admission.admit(&[(sent.clone(), b"{}".as_slice()), (refused.clone(), b"{}".as_slice())]).await;
    assert!(admitted[0].sent() && !admitted[1].sent(), "{admitted:?}");
    // The processor is behind: the first message is still on the queue.
    let summary = w.run(NOW + REDRIVE_GRACE_MS + 1).await;
    assert_eq!(summary.redriven, counts(&[("never_sent", 1), ("not_picked_up", 1)]), "{summary:?}");
    assert_eq!(w.num(&refused.key, "enqueued_at"), Some(NOW + REDRIVE_GRACE_MS + 1), "noted once sent");
    assert_eq!(w.num(&sent.key, "enqueued_at"), None, "no note needed");
}

/// A queue that notes each request the reconciler makes.
struct Requests {
    inner: MemQueue,
    log: Arc<Mutex<Vec<usize>>>,
}

impl WorkQueue for Requests {
    async fn send(&self, key: &EventKey, tenant: &str) -> Result<(), PortError> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(1);
        self.inner.send(key, tenant).await
    }

    async fn send_all(&self, messages: &[Outgoing<'_>]) -> Vec<Result<(), PortError>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(messages.len());
        self.inner.send_all(messages).await
    }
}

/// Re-drives found in several shards go out together: one request for 8
/// records in 8 shards... here 4 shards of 3 records each, so 12 records:
/// two requests, of 10 and 2, never one per shard.
#[tokio::test]
async fn redrives_in_several_shards_are_sent_together_at_most_ten_a_request() {
    let w = Harness::new();
    let mut keys = Vec::new();
    for shard in 0..SHARDS {
        for id in ids_in_shard(shard, 3) {
            keys.push(w.record(&id, Status::Retryable, Some(1), NOW - 1));
        }
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let queue = Requests { inner: w.world.queue(), log: log.clone() };
    let r =
        Reconciler::new(w.ledger(), queue, Some(w.dispatcher()), w.rechecks(), w.settings).with_ambient(w.ambient());
    let summary = r.run(NOW, w.far()).await;
    assert_eq!(summary.redriven, counts(&[("retry_due", 12)]), "{summary:?}");
    let requests = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(requests, [10, 2], "sent together across shards");
    assert_eq!(w.sent().len(), 12);
}

// ------------------------------------------------------ the oldest age

/// An old record replayed by an operator is open since its replay: the
/// oldest unprocessed age counts from then, not from its first receipt
/// days ago (which would page at once). So does one woken from a gap.
#[tokio::test]
async fn a_replayed_old_record_is_aged_from_its_replay() {
    let w = Harness::new();
    let k = key("evt_replayed");
    let days_ago = NOW - 3 * 86_400_000;
    let replayed = json!({"enqueued_at": days_ago, "due_at": NOW - 5_000, "next_attempt_at": NOW - 5_000, "last_replay_at": NOW - 5_000});
    w.ledger().add(&k, Status::Retryable, days_ago, replayed);
    assert_eq!(w.run(NOW).await.oldest_unprocessed_age_ms, Some(5_000));

    let w = Harness::new();
    let k = key("evt_woken");
    let woken = json!({"enqueued_at": days_ago, "due_at": NOW - 7_000, "next_attempt_at": NOW - 7_000, "woken_at": NOW - 7_000});
    w.ledger().add(&k, Status::Retryable, days_ago, woken);
    assert_eq!(w.run(NOW).await.oldest_unprocessed_age_ms, Some(7_000), "a wake-up opens it again too");
}

// ------------------------------------------------- parked gap waiters

impl Harness {
    /// A record parked at the gap bound at `parked_at`, with the waiter
    /// pointer its processor leaves (due at once), in `stream` at `seq`.
    fn parked_waiter(&self, id: &str, stream: &str, seq: i64, parked_at: i64) -> EventKey {
        use crate::ports::WorkLedger as _;
        let k = key(id);
        self.ledger().add(&k, Status::Parked, parked_at - 1_000_000, json!({"park_reason": "gap"}));
        let at = crate::projection::sequence::Position { stream: stream.into(), seq };
        memory::ready(self.ledger().register_waiter(&at, &k, NOW / 1000 + 86_400, Some(parked_at))).unwrap();
        k
    }

    /// The waiter pointer's next look (`None`: out of the index).
    fn pointer_due(&self, stream: &str, seq: i64) -> Option<i64> {
        let sk = crate::projection::sequence::waiter_sk(seq);
        self.world.state().table.get(stream, &sk).and_then(|i| num_of(i, attr::DUE_AT))
    }
}

/// Parked gap waiters whose predecessor never comes are looked at with
/// their own bound, never out of the records' share: 30 of them due before
/// 6 records due for a retry hold back none of the re-drives.
#[tokio::test]
async fn parked_gap_waiters_have_their_own_bounded_look_and_never_hold_back_redrives() {
    let w = Harness::with(ReconcilerSettings { max_items: 10, ..settings() });
    for i in 0..30 {
        w.parked_waiter(&format!("evt_parked_{i}"), &format!("seq#acct_{i}"), 2, NOW - 10_000);
    }
    let due: Vec<EventKey> =
        (0..6).map(|i| w.record(&format!("evt_retry_{i}"), Status::Retryable, Some(1), NOW - 1)).collect();
    let summary = w.run(NOW).await;
    assert_eq!(summary.redriven, counts(&[("retry_due", 6)]), "{summary:?}");
    assert!(due.iter().all(|k| w.claimed(k)));
    let looked = (0..30).filter(|i| w.pointer_due(&format!("seq#acct_{i}"), 2) != Some(NOW - 10_000)).count();
    assert_eq!(looked, waiter_share(10), "their own bound");
}

/// A waiter whose predecessor does not come is looked at less and less
/// often: the next look is half its time parked ahead (at least the
/// re-drive backoff, at most WAITER_LOOK_MAX_MS), not every backoff forever.
#[tokio::test]
async fn a_parked_gap_waiter_is_looked_at_less_often_as_it_ages() {
    let w = Harness::new();
    w.parked_waiter("evt_young", "seq#young", 2, NOW - 1_000);
    w.parked_waiter("evt_old", "seq#old", 2, NOW - 2 * 3_600_000);
    w.parked_waiter("evt_ancient", "seq#ancient", 2, NOW - 20 * 86_400_000);
    w.run(NOW).await;
    assert_eq!(w.pointer_due("seq#young", 2), Some(NOW + BACKOFF));
    assert_eq!(w.pointer_due("seq#old", 2), Some(NOW + 3_600_000));
    assert_eq!(w.pointer_due("seq#ancient", 2), Some(NOW + WAITER_LOOK_MAX_MS));
}

/// A pointer the release before left in the records partition is still
/// looked at (and woken), under the waiters' bound.
#[tokio::test]
async fn a_waiter_pointer_left_in_the_records_partition_is_still_looked_at() {
    let w = Harness::new();
    let (k, _) = legacy_pointer(&w, NOW - 1_000, true);
    assert_eq!(w.run(NOW).await.gaps_woken, 1);
    assert_eq!(w.status(&k), Status::Retryable);
}

/// A record parked at the gap bound whose waiter pointer an earlier release
/// left in the records partition (`without_parked_at`: as that release
/// wrote it), due at `due_at`, its predecessor committed: (the record, the
/// pointer's `sk`).
fn legacy_pointer(w: &Harness, due_at: i64, without_parked_at: bool) -> (EventKey, String) {
    let k = w.parked_waiter("evt_legacy", "seq#legacy", 2, due_at);
    let sk = crate::projection::sequence::waiter_sk(2);
    let mut pointer = w.world.state().table.get("seq#legacy", &sk).cloned().expect("pointer");
    set(&mut pointer, attr::DUE_SHARD, due_shard(k.shard(SHARDS)).as_str());
    if without_parked_at {
        pointer.remove(crate::projection::sequence::PARKED_AT);
    }
    w.world.state().table.insert(pointer);
    w.world.seed(&stream_state("seq#legacy", 1));
    (k, sk)
}

/// A legacy item in a records partition (a table not yet migrated) is
/// passed by the place once its look moved it on: it never holds the
/// records phase back.
#[tokio::test]
async fn a_legacy_item_in_the_records_partition_is_passed_once_acted_on() {
    let w = Harness::new();
    let (k, sk) = legacy_pointer(&w, NOW - 600_000, false);
    assert_eq!(w.run(NOW).await.gaps_woken, 1);
    let at = place(&w, k.shard(SHARDS)).await.expect("kept");
    assert_eq!((at.pk.as_str(), at.sk.as_str()), ("seq#legacy", sk.as_str()), "{at:?}");
}

/// A stream's state item at `last_seq`.
fn stream_state(pk: &str, last_seq: i64) -> crate::item::Item {
    use crate::item::{n, s};
    crate::item::Item::from([
        ("pk".to_owned(), s(pk)),
        ("sk".to_owned(), s(STATE_SK)),
        ("last_seq".to_owned(), n(last_seq)),
    ])
}

// ------------------------------------------------------- a processor backlog

/// 300 events wait behind a processor taking one every 10 s (50 minutes of
/// backlog) while the reconciler runs every 5 minutes. Each waiting record
/// backs off per record (5, 10, 20, 40 minutes...): an event is re-sent at
/// most 1 + log2(T / 5 min) times for a backlog of T, never once a run;
/// every event ends PROCESSED and delivered once. (With the fixed 5-minute look, events late
/// in line were re-sent once a run: 6 times and more, over the bound.)
#[tokio::test]
async fn a_processor_backlog_is_absorbed_each_event_re_sent_a_bounded_number_of_times() {
    use crate::ports::WorkQueue;
    let w = Harness::new();
    let queue = w.world.queue();
    let mut keys = Vec::new();
    for i in 0..300 {
        let k = w.record(&format!("evt_{i:03}"), Status::Received, Some(NOW), NOW + REDRIVE_GRACE_MS);
        w.ledger().put_payload(&k, b"{}");
        // As the intake hands it over (its send lease kept: handed over).
        queue.send(&k, "t").await.unwrap();
        keys.push(k);
    }
    // Every event is routed to a queue, delivered by the processor.
    let routes = r#"{"destinations": {"orders": {"arn": "arn:aws:sqs:eu-west-1:123456789012:orders"}},
        "routes": [{"to": ["orders"]}]}"#;
    let processor: crate::processor::Processor<MemLedger, MemQueue, Outbox> = crate::processor::Processor::with_ports(
        w.ledger(),
        w.world.projection_context(),
        crate::projection::Registry::new(),
        Some(w.dispatcher().with_payloads(Arc::new(w.ledger()))),
        crate::config::ProcessorSettings { index_shards: SHARDS, ..Default::default() },
    )
    .with_routes(Arc::new(crate::routes::Routes::parse(routes).unwrap()))
    .with_ambient(w.ambient());
    let (mut now, mut next_run) = (NOW, NOW + BACKOFF);
    let mut processed = 0;
    while processed < 300 && now < NOW + 6 * 3_600_000 {
        if let Some(m) = queue.receive(1).pop() {
            let key = m.work.as_ref().map(|(k, _)| k.clone()).expect("a work message");
            if w.status(&key) != Status::Processed {
                processor.process(&key, now).await.unwrap();
                processed += 1;
            }
            queue.delete(m.receipt.as_deref().expect("a receipt"));
        }
        w.clock.advance(Duration::from_secs(10));
        now += 10_000;
        if now >= next_run {
            w.run(now).await;
            next_run += BACKOFF;
        }
    }
    let backlog_ms = now - NOW;
    let sends = w.world.calls_named("queue.send");
    let bound = 1 + (backlog_ms as f64 / BACKOFF as f64).log2().ceil() as usize;
    let mut worst = 0;
    for k in &keys {
        assert_eq!(w.status(k), Status::Processed, "{k}");
        let resent = sends.iter().filter(|s| *s == k.as_str()).count() - 1;
        worst = worst.max(resent);
        assert!(resent <= bound, "{k}: re-sent {resent} times in a backlog of {} s (bound {bound})", backlog_ms / 1000);
    }
    assert!(worst >= 2, "the backlog made re-drives ({worst}): the test has teeth");
    let published = w.world.publisher().published();
    for k in &keys {
        let key = crate::message::idempotency_key(k.as_str(), &crate::routes::delivery_action("orders"));
        assert_eq!(published.iter().filter(|p| p.idempotency_key == key).count(), 1, "{k}: delivered once");
    }
    eprintln!("backlog {} s: at most {worst} re-sends per event (bound {bound})", backlog_ms / 1000);
}

// ------------------------------------------------------------ idle runs

/// docs/architecture.md "An idle reconciler": after a quiet run that read
/// every shard, and with no activity noted, a run reads its last sweep and
/// one activity query and nothing else, and reports that sweep's evidence.
#[tokio::test]
async fn an_idle_run_reads_no_shard_and_reports_the_last_sweeps_evidence() {
    let w = Harness::new();
    w.record("evt_dead", Status::Dead, None, NOW - 1);
    let full = w.reconciler().run(NOW, w.far()).await;
    assert!(!full.idle && full.complete && full.dead_letters == 1, "no sweep kept yet: {full:?}");
    w.forget();
    let idle = w.reconciler().run(NOW + 300_000, w.far()).await;
    assert!(idle.idle && idle.complete && idle.evidence, "{idle:?}");
    assert_eq!(w.world.calls(), ["due.last_sweep activity", "due.active_since activity"]);
    assert_eq!((idle.dead_letters, idle.parked, idle.outbox_dead), (1, 0, 0), "the sweep's evidence");
}

/// Activity noted in the last two hours makes a run read every shard; a
/// run that found anything due is not quiet, so the one after it reads
/// every shard too, whatever was noted.
#[tokio::test]
async fn noted_activity_or_work_found_makes_the_next_run_full() {
    use crate::ledger::ACTIVE_FOR_MS;
    let w = Harness::new();
    assert!(!w.reconciler().run(NOW, w.far()).await.idle);
    crate::ports::Activity::note_activity(&w.ledger(), NOW + 1).await;
    w.record("evt_1", Status::Received, None, NOW + 1);
    let next = w.reconciler().run(NOW + 300_000, w.far()).await;
    assert!(!next.idle, "{next:?}");
    assert_eq!(next.redriven.values().sum::<u64>(), 1, "{next:?}");
    let after = w.reconciler().run(NOW + ACTIVE_FOR_MS + 600_000, w.far()).await;
    assert!(!after.idle, "the last run re-drove a record: not quiet: {after:?}");
}

/// An entry whose writer's mark was lost is not seen by the idle runs, and
/// is found by the next full sweep, at most an hour after the last.
#[tokio::test]
async fn an_entry_without_its_mark_is_found_by_the_next_full_sweep() {
    use crate::ledger::FULL_SWEEP_EVERY_MS;
    let w = Harness::new();
    assert!(!w.reconciler().run(NOW, w.far()).await.idle);
    w.record("evt_unmarked", Status::Received, None, NOW + 1);
    let idle = w.reconciler().run(NOW + 600_000, w.far()).await;
    assert!(idle.idle && idle.redriven.is_empty(), "{idle:?}");
    let full = w.reconciler().run(NOW + FULL_SWEEP_EVERY_MS, w.far()).await;
    assert!(!full.idle, "{full:?}");
    assert_eq!(full.redriven.get("never_sent"), Some(&1), "{full:?}");
}

// ------------------------------------------------------- the records' places

/// The records phase's place in `shard`, as kept.
async fn place(w: &Harness, shard: u32) -> Option<crate::ledger::DueCursor> {
    w.ledger().due_cursors().await.unwrap().shards.remove(&shard)
}

/// Ids of shard 1, sorted by their key: entries due at the same time sort
/// by key in the index.
fn sorted_ids(n: usize) -> Vec<String> {
    let mut ids = ids_in_shard(1, n);
    ids.sort_by_key(|id| key(id).as_str().to_owned());
    ids
}

#[tokio::test]
async fn finished_records_entries_are_passed_and_the_next_run_starts_after_them() {
    let w = Harness::new();
    let ids = sorted_ids(6);
    for (i, id) in ids[..5].iter().enumerate() {
        w.record(id, Status::Processed, Some(1), NOW - 600_000 + i as i64);
    }
    let open = w.record(&ids[5], Status::Received, None, NOW - 300_000);
    let first = w.run(NOW).await;
    assert_eq!((first.redriven.clone(), first.due_seen), (counts(&[("never_sent", 1)]), 1), "{first:?}");
    let at = place(&w, 1).await.expect("kept");
    assert_eq!((at.due_at_ms, at.pk.as_str()), (NOW - 300_000, open.as_str()), "past the finished and the moved one");
    // A finished record behind the place is not read again: were it read,
    // this one (open, planted there) would be re-driven.
    w.record(&ids[0], Status::Received, None, NOW - 600_000);
    w.forget();
    let second = w.run(NOW + 1_000).await;
    assert!(second.redriven.is_empty() && second.due_seen == 0, "{second:?}");
    assert!(second.complete && second.errors.is_empty(), "{second:?}");
}

#[tokio::test]
async fn an_open_record_not_reached_stops_the_place_until_a_run_moves_it_on() {
    let w = Harness::with(ReconcilerSettings { max_items: 10, ..settings() });
    let ids = sorted_ids(14);
    for (i, id) in ids[..2].iter().enumerate() {
        w.record(id, Status::Processed, Some(1), NOW - 900_000 + i as i64);
    }
    let open: Vec<EventKey> = ids[2..]
        .iter()
        .enumerate()
        .map(|(i, id)| w.record(id, Status::Received, None, NOW - 600_000 + i as i64))
        .collect();
    let first = w.run(NOW).await;
    assert_eq!(first.redriven.values().sum::<u64>(), 10, "{first:?}");
    let at = place(&w, 1).await.expect("kept");
    assert_eq!(at.pk, open[9].as_str(), "up to the last one moved on, not past the first left");
    let second = w.run(NOW + 1_000).await;
    assert_eq!(second.redriven.values().sum::<u64>(), 2, "{second:?}");
    assert_eq!(place(&w, 1).await.expect("kept").pk, open[11].as_str());
}

#[tokio::test]
async fn the_place_never_passes_an_entry_due_within_the_settle() {
    let w = Harness::new();
    let ids = sorted_ids(2);
    let old = w.record(&ids[0], Status::Processed, Some(1), NOW - CURSOR_SETTLE_MS - 1);
    w.record(&ids[1], Status::Processed, Some(1), NOW - CURSOR_SETTLE_MS + 1);
    let summary = w.run(NOW).await;
    assert!(summary.complete && summary.due_seen == 0, "{summary:?}");
    assert_eq!(place(&w, 1).await.expect("kept").pk, old.as_str(), "not the one due within the settle");
}

#[tokio::test]
async fn a_rewound_run_finds_an_entry_that_appeared_behind_the_place() {
    let w = Harness::new();
    let ids = sorted_ids(3);
    w.record(&ids[0], Status::Processed, Some(1), NOW - 600_000);
    w.record(&ids[1], Status::Processed, Some(1), NOW - 300_000);
    w.run(NOW).await;
    let kept = w.ledger().due_cursors().await.unwrap();
    assert_eq!(kept.rewound_at_ms, Some(NOW), "the first run is a rewound one");
    // An entry that appeared in the index behind the place after the run
    // read there (later than the settle: never seen so far).
    let late = w.record(&ids[2], Status::Received, None, NOW - 400_000);
    let next = w.run(NOW + 60_000).await;
    assert!(next.redriven.is_empty(), "behind the place: {next:?}");
    let rewound = w.run(NOW + CURSOR_REWIND_EVERY_MS).await;
    assert_eq!(rewound.redriven, counts(&[("never_sent", 1)]), "{rewound:?}");
    assert!(w.claimed(&late));
    assert_eq!(w.ledger().due_cursors().await.unwrap().rewound_at_ms, Some(NOW + CURSOR_REWIND_EVERY_MS));
}

#[tokio::test]
async fn a_failed_read_of_the_places_reads_the_last_minutes_and_keeps_nothing() {
    let w = Harness::new();
    let ids = sorted_ids(2);
    let recent = w.record(&ids[0], Status::Received, None, NOW - 60_000);
    let older = w.record(&ids[1], Status::Received, None, NOW - CURSOR_REWIND_MS - 1);
    w.world.inject("due.due_cursors", 0, Some(1), Fault::Unavailable);
    let summary = w.run(NOW).await;
    assert_eq!(summary.redriven, counts(&[("never_sent", 1)]), "{summary:?}");
    assert!(w.claimed(&recent) && !w.claimed(&older));
    assert_eq!((summary.errors.get("cursors"), summary.complete), (Some(&1), false));
    assert_eq!(w.ledger().due_cursors().await.unwrap(), crate::ledger::DueCursors::default(), "nothing kept");
    let next = w.run(NOW + 1_000).await;
    assert_eq!(next.redriven, counts(&[("never_sent", 1)]), "read from its place (none: the oldest): {next:?}");
    assert!(w.claimed(&older));
}

/// `drop_after`: a finished record's payload is kept through the grace
/// after its completion and while a delivery of its is not SENT, its entry
/// moved to its next look each time; then dropped once. A finished record
/// of another policy keeps its payload.
#[tokio::test]
async fn a_drop_after_payload_waits_for_its_grace_and_its_deliveries_then_is_dropped_once() {
    let h = Harness::new();
    let dropping = key("evt_drop");
    h.ledger().add(
        &dropping,
        Status::Processed,
        NOW - 1_000,
        json!({"payload_policy": "drop_after", "processed_at": NOW}),
    );
    let kept = key("evt_kept");
    h.ledger().add(&kept, Status::Processed, NOW - 1_000, json!({"processed_at": NOW}));
    for k in [&dropping, &kept] {
        h.ledger().edit(k, |item| payload::put(item, payload::encode(br#"{"card":"4242"}"#)));
    }
    let dispatcher = h.dispatcher().with_destinations(vec!["queue".to_owned()]);
    let recon = Reconciler::new(h.ledger(), h.world.queue(), Some(dispatcher), h.rechecks(), h.settings)
        .with_ambient(h.ambient());
    let run = |at: i64| {
        let (recon, ledger, far) = (&recon, h.ledger(), h.far());
        async move {
            crate::ports::Activity::note_activity(&ledger, at).await;
            recon.run(at, far).await
        }
    };

    // Within the grace: kept, its entry moved to the grace's end.
    let first = run(NOW + 120_000).await;
    assert_eq!((first.payloads_dropped, first.payloads_waiting), (0, 0), "{first:?}");
    assert!(h.payload_of(&dropping).is_some());
    assert_eq!(h.num(&dropping, attr::DUE_AT), Some(NOW + DROP_AFTER_GRACE_MS));

    // The grace over, its delivery still PENDING: kept, looked at again later.
    let id = crate::message::outbox_id(dropping.as_str(), &crate::routes::delivery_action("queue"));
    h.outbox_item(&id, NOW + 10 * 86_400_000);
    let at = NOW + DROP_AFTER_GRACE_MS;
    let waiting = run(at).await;
    assert_eq!((waiting.payloads_dropped, waiting.payloads_waiting), (0, 1), "{waiting:?}");
    assert!(h.payload_of(&dropping).is_some(), "a delivery still needs it");
    assert_eq!(h.num(&dropping, attr::DUE_AT), Some(at + DROP_RECHECK_MS));

    // SENT: dropped at the next look, once.
    let sent = OutboxView { status: "SENT".into(), due_at: None, due_shard: None, ..Harness::pending(&id, NOW) };
    h.world.outbox().put(&id, &sent);
    let dropped = run(at + DROP_RECHECK_MS).await;
    assert_eq!((dropped.payloads_dropped, dropped.payloads_waiting), (1, 0), "{dropped:?}");
    assert!(h.payload_of(&dropping).is_none(), "dropped");
    assert_eq!(h.num(&dropping, "payload_dropped_at"), Some(at + DROP_RECHECK_MS));
    assert_eq!(h.status(&dropping), Status::Processed);
    assert!(h.text(&dropping, attr::PAYLOAD_HASH).is_some(), "its hash stays");
    let after = run(at + 2 * DROP_RECHECK_MS).await;
    assert_eq!((after.payloads_dropped, after.payloads_waiting), (0, 0), "{after:?}");
    assert!(h.payload_of(&kept).is_some(), "keep keeps");
}
