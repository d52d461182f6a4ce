//! One contract suite, two backends: scenarios over the ports, run on the
//! memory world (`adapters::memory`, the library's unit tests) and on the
//! DynamoDB adapter against the emulator (the integration tests, through
//! [`contract_suite!`](crate::contract_suite)). Each scenario states what
//! every backend must answer; a backend that answers otherwise fails it.
//!
//! Every write is made twice where a retry could make it twice: a second
//! ledger drawn from the same seed draws the same tokens, so its write is
//! the first one's retry after a lost acknowledgement, and must recognise
//! itself. Scenarios in [`MEMORY_ONLY`] need what the emulator lacks.

// A test suite: its scenarios assert by unwrapping and panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;

use crate::identity::{EventKey, payload_hash};
use crate::item::{Value, n as num_value, s as str_value};
use crate::ledger::{
    Claim, CommitResult, Due, DueItem, DuePartition, Exit, LeaseResult, NewEvent, OperatorAction, Release, Row,
    SendLease, Status, Transitioned, Via,
};
use crate::message::{Held, OutboxClaim, OutboxMessage};
use crate::policy::REDRIVE_GRACE_MS;
use crate::ports::{
    BackfillLedger, BackfillProgress, Circuit, CircuitChange, CircuitStore, DueLedger, Ledger, OperatorLedger,
    OutboxStore, Received, Redelivery, RowFilter, ScheduleState, UnfetchedEvent, WorkLedger, WorkQueue,
};
use crate::projection::sequence::{self, Position};
use crate::projection::{OnConflict, Op, ProjectionContext, ProjectionError, StateStore, Write};
use crate::secret::Secret;
use crate::verify::provider::{SecretStore, Stored};

/// The time every scenario starts at (ports take their times as arguments).
pub const T0: i64 = 1_800_000_000_000;

/// A table item, as the domain reads it (the backends convert).
pub type Item = crate::item::Item;

/// A record item as the DynamoDB adapter writes it.
fn record_item(e: &NewEvent) -> Item {
    crate::adapters::dynamodb::item::item_from_sdk(&crate::adapters::dynamodb::new_record_item(e))
}

/// What a backend gives a scenario: a fresh, empty store (one index shard).
pub trait Backend: Send + Sync {
    type Ledger: Ledger
        + WorkLedger
        + DueLedger
        + OperatorLedger
        + BackfillLedger
        + crate::ports::AuditLog
        + StateStore
        + Clone
        + 'static;
    type Outbox: OutboxStore + CircuitStore;
    type Queue: WorkQueue + Redelivery;
    /// The ledger, drawing its tokens from `seed`: two ledgers of one seed
    /// draw the same tokens.
    fn ledger(&self, seed: u64) -> Self::Ledger;
    fn outbox(&self) -> Self::Outbox;
    /// The table's name, for projection writes.
    fn table(&self) -> String;
    /// Writes an item as it is, unconditionally (a record left by an
    /// earlier release, a projection's state).
    fn put(&self, item: Item) -> impl Future<Output = ()> + Send;
    /// The item at `(pk, sk)` as stored (a strongly consistent read).
    fn get(&self, pk: &str, sk: &str) -> impl Future<Output = Option<Item>> + Send;
    /// The work queue (a fresh one).
    fn queue(&self) -> Self::Queue;
    /// Receives up to `max` visible messages, as the processor's trigger does.
    fn receive(&self, max: usize) -> impl Future<Output = Vec<Received>> + Send;
    /// Lets `ms` pass (the memory world's clock; real time on the emulator).
    fn wait(&self, ms: u64) -> impl Future<Output = ()> + Send;
    /// The keys on the work queue's dead-letter queue, which a message
    /// reaches on its receive after [`MAX_RECEIVES`].
    fn dead_letters(&self) -> impl Future<Output = Vec<EventKey>> + Send;
    /// Where secrets handed over at a handshake are kept (a fresh store).
    type Secrets: SecretStore + 'static;
    fn secrets(&self) -> Self::Secrets;
    /// The key store of sealed payloads (its own table).
    type Keys: crate::ports::PayloadKeys + 'static;
    fn keys(&self) -> Self::Keys;
    /// The delivery queue.
    type Deliveries: crate::ports::DeliveryQueue;
    fn deliveries(&self) -> Self::Deliveries;
    /// Receives (and deletes) up to `max` visible delivery messages, each
    /// with its message group.
    fn receive_deliveries(
        &self,
        max: usize,
    ) -> impl Future<Output = Vec<(crate::ports::DeliveryMessage, Option<String>)>> + Send;
}

/// The contract's work queue moves a message to its dead-letter queue after
/// this many receives (the deployed queue: `adapters::sqs::MAX_RECEIVE_COUNT`).
pub const MAX_RECEIVES: u32 = 3;

/// A route's delivery (`outbox_new` with a delivery): committed with the
/// completion marker, claimed by the committing lease until the dispatch
/// lease ends (its sender marks it without a claim), referring to the
/// event (its payload hash, no payload); another dispatcher takes it only
/// once that claim lapses, and then the first one's mark is refused.
pub async fn a_routes_delivery_is_committed_claimed_by_the_lease_and_refers_to_its_event<B: Backend>(b: &B) {
    let (l, e) = leased(b, "route", "tok-1").await;
    let delivery = OutboxMessage {
        topic_arn: "arn:aws:sqs:us-east-1:123456789012:orders".into(),
        action: crate::routes::delivery_action("orders"),
        group: "t1".into(),
        body: serde_json::json!({"idempotency_key": "k", "event_id": "route"}),
        delivery: Some(crate::message::Delivery {
            destination: "orders".into(),
            source: crate::routes::DEFAULT_SOURCE.into(),
            detail_type: "thing.changed".into(),
            payload_hash: payload_hash(&body("route")),
            received_at_ms: T0 - 5_000,
        }),
    };
    let op = Op { outbox: vec![delivery.clone()], ..Op::new(Vec::new(), OnConflict::AlreadyApplied) };
    let CommitResult::Committed { outbox: ids } =
        l.commit(&e.key, "tok-1", std::slice::from_ref(&op), "ignored", None, T0).await.unwrap()
    else {
        panic!("commits")
    };
    let id = &ids[0];
    assert_eq!(id, &crate::message::outbox_id(e.key.as_str(), &delivery.action));
    let stored = b.get(id, crate::adapters::dynamodb::outbox::OUTBOX_SK).await.expect("the delivery");
    let s = |k: &str| stored.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    assert_eq!(
        (s("status"), s("dispatch_token"), s("destination")),
        ("SENDING".into(), "tok-1".into(), "orders".into())
    );
    assert_eq!(s("payload_hash"), payload_hash(&body("route")));
    assert!(!stored.contains_key("payload") && s("body").len() < 200, "it refers to the event, it does not copy it");
    let o = b.outbox();
    let until = T0 + crate::message::DISPATCH_LEASE_MS;
    assert_eq!(o.claim(id, "d-2", T0 + 1, T0 + 60_000).await.unwrap(), OutboxClaim::Skipped, "the lease's claim");
    assert!(!o.due(0, until - 1, 10).await.unwrap().contains(id), "not due while claimed");
    // The sweep takes it over once the claim lapses, with the delivery's fields.
    let OutboxClaim::Claimed(item) = o.claim(id, "d-2", until + 1, until + 30_000).await.unwrap() else {
        panic!("a lapsed claim is taken over")
    };
    assert_eq!((item.attempts, item.event_key.as_str(), item.created_at_ms), (2, e.key.as_str(), T0));
    assert_eq!(item.delivery, delivery.delivery);
    assert_eq!(o.mark_sent(id, "tok-1", None, until + 2).await.unwrap(), Held::Lapsed, "the lease's claim lapsed");
    assert_eq!(o.mark_sent(id, "d-2", None, until + 2).await.unwrap(), Held::Yes);
    assert_eq!(o.claim(id, "d-3", until + 90_000, until + 120_000).await.unwrap(), OutboxClaim::Skipped, "sent");
}

/// A window per endpoint, opened and moved by the operator; a secret stored
/// once: its own retry (the same value, after a lost acknowledgement) meets
/// it as the same, another value leaves it as it is; endpoints apart.
pub async fn a_handshake_secret_is_stored_once_and_never_overwritten<B: Backend>(b: &B) {
    let store = b.secrets();
    assert_eq!(store.window("ep").await.unwrap(), None);
    store.open_window("ep", 1_800_000_600).await.unwrap();
    assert_eq!(store.window("ep").await.unwrap(), Some(1_800_000_600));
    store.open_window("ep", 1_800_000_900).await.unwrap();
    assert_eq!(store.window("ep").await.unwrap(), Some(1_800_000_900), "a window is moved, not added");
    assert_eq!(store.window("ep-2").await.unwrap(), None);

    assert!(store.load("ep").await.unwrap().is_none());
    let first = Secret::new("a1b2c3d4e5f60718293a4b5c6d7e8f90");
    assert_eq!(store.store_once("ep", &first).await.unwrap(), Stored::New);
    assert_eq!(store.store_once("ep", &first).await.unwrap(), Stored::Same, "its own retry");
    let other = Secret::new("ffffffffffffffffffffffffffffffff");
    assert_eq!(store.store_once("ep", &other).await.unwrap(), Stored::Other);
    assert_eq!(store.load("ep").await.unwrap().map(|s| s.expose().to_vec()), Some(first.expose().to_vec()));
    assert!(store.load("ep-2").await.unwrap().is_none(), "endpoints apart");
    assert_eq!(store.store_once("ep-2", &other).await.unwrap(), Stored::New);
}

/// Scenarios that run on the memory world only, and why.
pub const MEMORY_ONLY: &[(&str, &str)] = &[
    (
        "a_transaction_token_is_honoured_for_ten_minutes",
        "the emulator does not implement TransactWriteItems' ClientRequestToken",
    ),
    ("the_indexes_may_lag_the_table", "the emulator's indexes are always current"),
];

fn event(name: &str, body: &[u8], token: &str) -> NewEvent {
    let key = EventKey::new("stripe", "contract", name);
    NewEvent {
        shard: 0,
        provider: "stripe".into(),
        endpoint: "contract".into(),
        tenant: "t1".into(),
        event_id: name.into(),
        event_type: Some("invoice.paid".into()),
        payload_hash: payload_hash(body),
        content_hash: payload_hash(body),
        received_at_ms: T0,
        expires_at: T0 / 1000 + 86_400,
        send: SendLease { token: token.into(), until_ms: T0 + 10_000 },
        via: Via::Webhook,
        key,
        batch_hash: None,
        kept: None,
        notification: None,
    }
}

fn body(name: &str) -> Vec<u8> {
    format!(r#"{{"id":"{name}","object":"event"}}"#).into_bytes()
}

/// Bytes that do not compress: too large for the record, so the claim reads
/// the record first and writes the payload item before it.
fn large_body(name: &str) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut out = format!(r#"{{"id":"{name}","noise":""#).into_bytes();
    for _ in 0..6_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(b'a' + (x % 26) as u8);
    }
    out.extend_from_slice(b"\"}");
    out
}

async fn row<L: OperatorLedger>(l: &L, key: &EventKey) -> Row {
    l.show(key, false).await.unwrap().unwrap_or_else(|| panic!("{key}: no record")).0
}

fn num(r: &Row, name: &str) -> Option<i64> {
    r.get(name).and_then(serde_json::Value::as_i64)
}

fn text<'a>(r: &'a Row, name: &str) -> Option<&'a str> {
    r.get(name).and_then(serde_json::Value::as_str)
}

/// A seed of its own for each scenario's invocation (one seed for two
/// ledgers only where the second is the first's retry).
fn seed(name: &str) -> u64 {
    u64::from(crate::identity::shard_of(name, u32::MAX)) + 1_000
}

async fn claimed<B: Backend>(b: &B, name: &str) -> (B::Ledger, NewEvent) {
    let l = b.ledger(seed(name));
    let e = event(name, &body(name), "send-1");
    assert_eq!(Ledger::claim(&l, &e, &body(name)).await.unwrap(), Claim::New);
    (l, e)
}

async fn leased<B: Backend>(b: &B, name: &str, token: &str) -> (B::Ledger, NewEvent) {
    let (l, e) = claimed(b, name).await;
    assert!(matches!(l.lease(&e.key, token, T0, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    (l, e)
}

// ------------------------------------------------------------------ intake

/// `CLAIM`: the key is new once; our own retried put is still ours; another
/// delivery meets the record.
pub async fn the_claim_is_new_once_and_its_retry_is_ours<B: Backend>(b: &B) {
    for (name, bytes) in [("small", body("small")), ("large", large_body("large"))] {
        let l = b.ledger(1);
        let e = event(name, &bytes, "send-1");
        assert_eq!(Ledger::claim(&l, &e, &bytes).await.unwrap(), Claim::New, "{name}");
        assert_eq!(Ledger::claim(&l, &e, &bytes).await.unwrap(), Claim::New, "{name}: our own retry");
        // Configured for another tenant since: the record's tenant holds.
        let other = NewEvent { tenant: "t2".into(), ..event(name, &bytes, "send-2") };
        match Ledger::claim(&l, &other, &bytes).await.unwrap() {
            Claim::Existing(r) => {
                assert_eq!(r.tenant, "t1", "{name}: the tenant the record was claimed for");
                assert_eq!(r.status, Status::Received, "{name}");
                assert_eq!(r.payload_hash, e.payload_hash, "{name}");
                assert!(r.payload_stored && r.enqueued_at_ms.is_none(), "{name}: {r:?}");
                assert_eq!(r.send_lease_until_ms, Some(T0 + 10_000), "{name}");
                assert_eq!(r.via, Via::Webhook);
            }
            Claim::New => panic!("{name}: a second delivery claimed the key again"),
        }
        let (record, _, payload) = l.show(&e.key, true).await.unwrap().unwrap();
        assert_eq!(payload.as_deref(), Some(&bytes[..]), "{name}: the payload is durable with the claim");
        assert_eq!(text(&record, "due_shard"), Some("due#000"));
        assert_eq!(num(&record, "due_at"), Some(T0 + REDRIVE_GRACE_MS), "{name}: due for the re-drive");
    }
}

/// `take_send_lease`, `release_send_lease`, `mark_enqueued`.
pub async fn the_send_lease_is_taken_once_released_and_ends_with_the_send<B: Backend>(b: &B) {
    let (l, e) = claimed(b, "lease").await;
    let mine = SendLease { token: "send-1".into(), until_ms: T0 + 10_000 };
    let other = SendLease { token: "send-2".into(), until_ms: T0 + 20_000 };
    assert!(l.take_send_lease(&e.key, &mine, T0 + 1).await.unwrap(), "our own lease, retried");
    assert!(!l.take_send_lease(&e.key, &other, T0 + 1).await.unwrap(), "a live lease is someone else's");
    Ledger::release_send_lease(&l, &e.key, &other).await.unwrap();
    assert!(!l.take_send_lease(&e.key, &other, T0 + 2).await.unwrap(), "releasing another's lease does nothing");
    Ledger::release_send_lease(&l, &e.key, &mine).await.unwrap();
    assert!(l.take_send_lease(&e.key, &other, T0 + 3).await.unwrap(), "released: free to take");
    assert!(l.take_send_lease(&e.key, &other, T0 + 3).await.unwrap(), "its own retry");
    let third = SendLease { token: "send-3".into(), until_ms: T0 + 40_000 };
    assert!(l.take_send_lease(&e.key, &third, T0 + 20_001).await.unwrap(), "an expired lease is free");
    l.mark_enqueued(&e.key, T0 + 20_002).await.unwrap();
    assert!(!l.take_send_lease(&e.key, &third, T0 + 20_003).await.unwrap(), "sent: no lease, not even ours");
    let r = row(&l, &e.key).await;
    assert_eq!(num(&r, "enqueued_at"), Some(T0 + 20_002));
    assert!(r.get("send_lease_until").is_none(), "the send drops the lease");
    let missing = EventKey::new("stripe", "contract", "nobody");
    assert!(!l.take_send_lease(&missing, &mine, T0).await.unwrap(), "no record, no lease");
    assert!(l.mark_enqueued(&missing, T0).await.is_err(), "marking a missing record is an error");
}

/// `payload_stored`, `adopt_payload`.
pub async fn a_record_without_its_payload_adopts_one_once<B: Backend>(b: &B) {
    let l = b.ledger(1);
    let bytes = body("adopt");
    let e = event("adopt", &bytes, "send-1");
    let mut item = record_item(&e);
    item.insert("payload_stored".into(), Value::Bool(false));
    b.put(item).await;
    let newer = br#"{"id":"adopt","object":"event","v":2}"#;
    let new_hash = payload_hash(newer);
    assert!(
        !l.adopt_payload(&e.key, "not-what-it-holds", &new_hash, newer, e.expires_at, true).await.unwrap(),
        "adopted only from the payload hash the caller read"
    );
    assert_eq!(text(&row(&l, &e.key).await, "payload_hash"), Some(e.payload_hash.as_str()));
    assert!(l.adopt_payload(&e.key, &e.payload_hash, &new_hash, newer, e.expires_at, true).await.unwrap());
    assert!(
        l.adopt_payload(&e.key, &e.payload_hash, &new_hash, newer, e.expires_at, true).await.unwrap(),
        "our own retry meets its adoption"
    );
    let third = payload_hash(b"third");
    assert!(!l.adopt_payload(&e.key, &e.payload_hash, &third, b"third", e.expires_at, false).await.unwrap());
    let r = row(&l, &e.key).await;
    assert_eq!(text(&r, "payload_hash"), Some(new_hash.as_str()));
    assert_eq!(text(&r, "last_conflict_hash"), Some(e.payload_hash.as_str()));
    assert!(num(&r, "conflicts").is_some_and(|c| c >= 1));
    assert_eq!(l.payload(&e.key, &new_hash).await.unwrap().as_deref(), Some(&newer[..]));

    // The old path: the payload item first, then the record notes it.
    let e2 = event("store", &bytes, "send-1");
    let mut item = record_item(&e2);
    item.insert("payload_stored".into(), Value::Bool(false));
    b.put(item).await;
    l.store_payload(&e2.key, &e2.payload_hash, &bytes, e2.expires_at).await.unwrap();
    assert_eq!(row(&l, &e2.key).await.get("payload_stored"), Some(&serde_json::Value::Bool(true)));
    assert!(l.store_payload(&e2.key, "another", &bytes, e2.expires_at).await.is_err(), "not the record's payload");
}

/// `note_duplicate`, `flag_conflict`.
pub async fn duplicates_and_conflicts_are_counted_on_the_record<B: Backend>(b: &B) {
    let (l, e) = claimed(b, "dups").await;
    l.note_duplicate(&e.key).await.unwrap();
    l.note_duplicate(&e.key).await.unwrap();
    l.flag_conflict(&e.key, "other-hash", T0 + 5).await.unwrap();
    let r = row(&l, &e.key).await;
    assert_eq!((num(&r, "duplicates"), num(&r, "conflicts")), (Some(3), Some(1)));
    assert_eq!((text(&r, "last_conflict_hash"), num(&r, "last_conflict_at")), (Some("other-hash"), Some(T0 + 5)));
    let missing = EventKey::new("stripe", "contract", "nobody");
    assert!(l.note_duplicate(&missing).await.is_err());
    assert!(l.flag_conflict(&missing, "h", T0).await.is_err());
}

// --------------------------------------------------------------- processor

/// `lease`: RECEIVED, RETRYABLE when due, PROCESSING when expired; our own
/// retry is ours; the rest say why not.
pub async fn the_lease_is_taken_when_leasable_and_recognises_its_retry<B: Backend>(b: &B) {
    let (l, e) = claimed(b, "work").await;
    let LeaseResult::Leased(r) = l.lease(&e.key, "tok-1", T0, 30_000).await.unwrap() else { panic!("leasable") };
    assert_eq!((r.status, r.attempts, r.lease_expires_at_ms), (Status::Processing, 1, Some(T0 + 30_000)));
    assert_eq!(r.window_start_ms, Some(T0));
    assert!(matches!(l.lease(&e.key, "tok-1", T0 + 1, 30_000).await.unwrap(), LeaseResult::Leased(_)), "retry");
    assert_eq!(
        l.lease(&e.key, "tok-2", T0 + 2, 30_000).await.unwrap(),
        LeaseResult::Busy { until_ms: T0 + 30_000 },
        "a live lease"
    );
    let LeaseResult::Leased(r) = l.lease(&e.key, "tok-2", T0 + 30_001, 30_000).await.unwrap() else {
        panic!("an expired lease is taken over")
    };
    assert_eq!((r.lease_owner.as_deref(), r.window_start_ms), (Some("tok-2"), Some(T0)), "the window stays");
    let missing = EventKey::new("stripe", "contract", "nobody");
    assert_eq!(l.lease(&missing, "t", T0, 1).await.unwrap(), LeaseResult::Missing);
    let rec = row(&l, &e.key).await;
    assert_eq!(num(&rec, "due_at"), Some(T0 + REDRIVE_GRACE_MS), "the lease does not move the record in the index");
}

/// `complete` and `outbox_new`: the commit is fenced by the lease; ops whose
/// conditions fail are named; outbox items are written with it.
pub async fn the_commit_is_fenced_names_its_conflicts_and_writes_its_outbox<B: Backend>(b: &B) {
    let (l, e) = leased(b, "commit", "tok-1").await;
    assert_eq!(l.commit(&e.key, "tok-2", &[], "applied", None, T0 + 1).await.unwrap(), CommitResult::Fenced);
    b.put(Item::from([("pk".into(), str_value("proj#taken")), ("sk".into(), str_value(crate::projection::STATE_SK))]))
        .await;
    let taken = Op::new(vec![Write::check("proj#taken", "attribute_not_exists(pk)")], OnConflict::Stale);
    let free = Op::new(vec![Write::check("proj#free", "attribute_not_exists(pk)")], OnConflict::Stale);
    assert_eq!(
        l.commit(&e.key, "tok-1", &[free, taken], "applied", None, T0 + 1).await.unwrap(),
        CommitResult::Conflicts(vec![1]),
        "the op whose condition failed, by index"
    );
    let msg = OutboxMessage {
        topic_arn: "arn:aws:sns:us-east-1:000000000000:t.fifo".into(),
        delivery: None,
        action: "thing.changed".into(),
        group: "acct_1".into(),
        body: serde_json::json!({"n": 1}),
    };
    let op = Op::new(Vec::new(), OnConflict::Stale).notify(msg);
    let CommitResult::Committed { outbox } =
        l.commit(&e.key, "tok-1", &[op], "applied", Some("acct_1"), T0 + 2).await.unwrap()
    else {
        panic!("our lease commits")
    };
    assert_eq!(outbox.len(), 1);
    assert_eq!(l.completed_by(&e.key).await.unwrap().as_deref(), Some("tok-1"));
    assert_eq!(l.commit(&e.key, "tok-1", &[], "applied", None, T0 + 3).await.unwrap(), CommitResult::Fenced);
    assert_eq!(l.lease(&e.key, "tok-3", T0 + 60_000, 1).await.unwrap(), LeaseResult::Final(Status::Processed));
    let r = row(&l, &e.key).await;
    assert_eq!((text(&r, "outcome"), text(&r, "subject")), (Some("applied"), Some("acct_1")));
    // PROCESSED leaves its due entry where it was (the reconciler's cursor
    // passes it) and is not in the attention index.
    assert!(r.get("due_shard").is_some() && r.get("attn_shard").is_none(), "{r:?}");
    let o = b.outbox();
    // Written claimed by the committing lease: its processor sends it, no other dispatcher.
    assert_eq!(o.claim(&outbox[0], "d-1", T0 + 2, T0 + 30_000).await.unwrap(), OutboxClaim::Skipped);
    let OutboxClaim::Claimed(item) = o.claim(&outbox[0], "tok-1", T0 + 2, T0 + 30_000).await.unwrap() else {
        panic!("the committing lease's claim")
    };
    assert_eq!((item.group.as_str(), item.attempts), ("acct_1", 1));
}

/// `leave_retry`, `leave_dead`, `leave_park`: fenced by the lease, each
/// recognising its own retry by the transition token.
pub async fn the_exits_are_fenced_and_recognise_their_retries<B: Backend>(b: &B) {
    let (l, e) = leased(b, "exit", "tok-1").await;
    let retry = Exit::Retry { next_at_ms: T0 + 5_000, code: "transient", message: "busy", failure: true };
    assert!(!l.leave(&e.key, "tok-2", &retry, T0 + 1).await.unwrap(), "not our lease");
    assert!(l.leave(&e.key, "tok-1", &retry, T0 + 1).await.unwrap());
    assert!(l.leave(&e.key, "tok-1", &retry, T0 + 1).await.unwrap(), "our own retry");
    let r = row(&l, &e.key).await;
    assert_eq!((text(&r, "status"), num(&r, "failures")), (Some("RETRYABLE"), Some(1)));
    assert_eq!((num(&r, "next_attempt_at"), num(&r, "due_at")), (Some(T0 + 5_000), Some(T0 + 5_000)));
    assert_eq!(l.lease(&e.key, "tok-2", T0 + 4_999, 1_000).await.unwrap(), LeaseResult::NotDue { at_ms: T0 + 5_000 });
    assert!(matches!(l.lease(&e.key, "tok-2", T0 + 5_000, 1_000).await.unwrap(), LeaseResult::Leased(_)));
    let dead = Exit::Dead { reason: "attempts_exhausted", message: "gave up" };
    assert!(l.leave(&e.key, "tok-2", &dead, T0 + 5_001).await.unwrap());
    assert!(l.leave(&e.key, "tok-2", &dead, T0 + 5_001).await.unwrap(), "our own retry");
    let r = row(&l, &e.key).await;
    assert_eq!((text(&r, "status"), text(&r, "dead_reason")), (Some("DEAD"), Some("attempts_exhausted")));
    assert!(r.get("due_shard").is_none() && r.get("due_at").is_none(), "DEAD leaves the due index");
    assert_eq!(text(&r, "attn_shard"), Some("attn#000"), "and enters the attention index");

    let (l, e) = leased(b, "park", "tok-1").await;
    let park = Exit::Park { reason: "unknown_customer", subject: Some("cus_1") };
    assert!(l.leave(&e.key, "tok-1", &park, T0 + 1).await.unwrap());
    assert!(l.leave(&e.key, "tok-1", &park, T0 + 1).await.unwrap(), "our own retry");
    assert!(!l.leave(&e.key, "tok-9", &park, T0 + 1).await.unwrap());
    let r = row(&l, &e.key).await;
    assert_eq!((text(&r, "park_reason"), text(&r, "subject")), (Some("unknown_customer"), Some("cus_1")));
}

/// `wake`, and the waiters and stream positions of ordered deltas.
pub async fn a_gap_wakes_its_waiter_and_nothing_else<B: Backend>(b: &B) {
    let (l, e) = leased(b, "gap", "tok-1").await;
    let gap = Exit::Retry { next_at_ms: T0 + 600_000, code: crate::ledger::GAP, message: "waiting", failure: false };
    assert!(l.leave(&e.key, "tok-1", &gap, T0 + 1).await.unwrap());
    assert_eq!(l.wake(&e.key, T0 + 10).await.unwrap().as_deref(), Some("t1"), "woken, with its tenant");
    let r = row(&l, &e.key).await;
    assert_eq!(
        (text(&r, "status"), num(&r, "due_at"), num(&r, "next_attempt_at")),
        (Some("RETRYABLE"), Some(T0 + 10), Some(T0 + 10))
    );
    assert!(r.get("window_start").is_none(), "a new time window");
    assert!(matches!(l.lease(&e.key, "tok-2", T0 + 10, 1_000).await.unwrap(), LeaseResult::Leased(_)));
    let park = Exit::Park { reason: crate::ledger::GAP, subject: None };
    assert!(l.leave(&e.key, "tok-2", &park, T0 + 11).await.unwrap());
    assert!(l.wake(&e.key, T0 + 12).await.unwrap().is_some(), "parked at the gap bound, still woken");
    assert_eq!(text(&row(&l, &e.key).await, "attn_shard"), None, "out of the attention index");

    let (l, other) = leased(b, "not-gap", "tok-1").await;
    let retry = Exit::Retry { next_at_ms: T0 + 600_000, code: "transient", message: "m", failure: false };
    assert!(l.leave(&other.key, "tok-1", &retry, T0 + 1).await.unwrap());
    assert_eq!(l.wake(&other.key, T0 + 2).await.unwrap(), None, "not waiting on a gap");
    assert_eq!(l.wake(&EventKey::new("stripe", "contract", "nobody"), T0).await.unwrap(), None);

    // The waiter's pointer and the stream's position.
    let at = Position { stream: "seq#acct_1".into(), seq: 2 };
    assert_eq!(l.waiter(&at).await.unwrap(), None);
    l.register_waiter(&at, &e.key, T0 / 1000 + 60, None).await.unwrap();
    assert_eq!(l.waiter(&at).await.unwrap(), Some(e.key.clone()));
    assert!(!l.predecessor_applied(&at).await.unwrap());
    let (l2, first) = leased(b, "seq-1", "tok-1").await;
    let apply = || sequence::apply_next("seq#acct_1", 1, "balance", 5, Default::default());
    assert!(matches!(
        l2.commit(&first.key, "tok-1", &[apply()], "applied", None, T0).await.unwrap(),
        CommitResult::Committed { .. }
    ));
    assert!(l2.predecessor_applied(&at).await.unwrap());
    let (l3, again) = leased(b, "seq-1-again", "tok-1").await;
    assert_eq!(
        l3.commit(&again.key, "tok-1", &[apply()], "applied", None, T0).await.unwrap(),
        CommitResult::Conflicts(vec![0]),
        "sequence 1 applies once"
    );
}

/// A record parked at the gap bound leaves its pointer due in the waiters
/// partition (`gap#NNN`, `register_waiter` with a look, the time it parked
/// on it): the reconciler finds it, claims it, and
/// each look wakes the record only once its predecessor has
/// committed (`waiter_settled` takes the pointer out of the index); a
/// pointer whose record no longer waits leaves the index too.
pub async fn a_parked_waiter_is_due_until_its_predecessor_commits_then_woken_once<B: Backend>(b: &B) {
    let (l, e) = leased(b, "parked-waiter", "tok-1").await;
    let at = Position { stream: "seq#acct_w".into(), seq: 2 };
    l.register_waiter(&at, &e.key, T0 / 1000 + 60, Some(T0 + 5)).await.unwrap();
    let park = Exit::Park { reason: crate::ledger::GAP, subject: None };
    assert!(l.leave(&e.key, "tok-1", &park, T0 + 5).await.unwrap());
    assert_eq!(l.waiter(&at).await.unwrap(), Some(e.key.clone()), "still the commit's pointer");
    let waiters = |page: crate::ledger::DuePage| -> Vec<crate::ledger::WaiterItem> {
        page.items.into_iter().filter_map(|d| if let Due::Waiter(w) = d { Some(w) } else { None }).collect()
    };
    let due = waiters(l.due(DuePartition::Waiters, 0, T0 + 5, 10, None).await.unwrap());
    assert_eq!(due.len(), 1, "{due:?}");
    let w = &due[0];
    assert_eq!((w.key.clone(), w.seq, w.due_at_ms, w.parked_at_ms), (e.key.clone(), 2, T0 + 5, T0 + 5));
    assert!(waiters(l.due(DuePartition::Records, 0, T0 + 5, 10, None).await.unwrap()).is_empty(), "its own partition");
    let item = DueItem::Waiter { stream: &w.stream, sk: &w.sk };
    assert!(l.claim_due(item, w.due_at_ms, T0 + 300_000).await.unwrap().is_some());
    assert_eq!(l.look_at_waiter(w, T0 + 6).await.unwrap(), crate::ledger::WaiterCheck::Waiting);
    assert_eq!(text(&row(&l, &e.key).await, "status"), Some("PARKED"), "not woken before its predecessor");
    assert!(waiters(l.due(DuePartition::Waiters, 0, T0 + 5, 10, None).await.unwrap()).is_empty(), "claimed: later");
    let later = waiters(l.due(DuePartition::Waiters, 0, T0 + 300_000, 10, None).await.unwrap());
    assert_eq!(later.len(), 1, "due again at its next look");

    // The predecessor commits (its processor then dies before waking it).
    let (l2, first) = leased(b, "parked-waiter-1", "tok-1").await;
    let apply = sequence::apply_next("seq#acct_w", 1, "balance", 5, Default::default());
    assert!(matches!(
        l2.commit(&first.key, "tok-1", &[apply], "applied", None, T0).await.unwrap(),
        CommitResult::Committed { .. }
    ));
    assert_eq!(
        l.look_at_waiter(&later[0], T0 + 300_001).await.unwrap(),
        crate::ledger::WaiterCheck::Woken { tenant: "t1".into() }
    );
    let r = row(&l, &e.key).await;
    assert_eq!((text(&r, "status"), num(&r, "due_at")), (Some("RETRYABLE"), Some(T0 + 300_001)));
    assert!(waiters(l.due(DuePartition::Waiters, 0, i64::MAX / 2, 10, None).await.unwrap()).is_empty(), "settled");
    assert_eq!(
        l.look_at_waiter(&later[0], T0 + 300_001).await.unwrap(),
        crate::ledger::WaiterCheck::Woken { tenant: "t1".into() },
        "our own retry after a lost acknowledgement"
    );
    assert_eq!(l.look_at_waiter(&later[0], T0 + 300_002).await.unwrap(), crate::ledger::WaiterCheck::Gone, "once");
    assert_eq!(text(&row(&l, &e.key).await, "status"), Some("RETRYABLE"));
}

/// `dead_refused`: RECEIVED, RETRYABLE or an expired lease → DEAD
/// `caller_error` (in the attention index, out of the due index); a live
/// lease or a terminal record is left alone; a repeat changes nothing.
pub async fn a_record_whose_redrive_is_refused_as_invalid_is_dead_unless_a_worker_holds_it<B: Backend>(b: &B) {
    let (l, e) = claimed(b, "refused").await;
    assert!(l.dead_refused(&e.key, "sqs refused the request (InvalidMessageContents): x", T0 + 1).await.unwrap());
    let r = row(&l, &e.key).await;
    assert_eq!((text(&r, "status"), text(&r, "dead_reason")), (Some("DEAD"), Some("caller_error")));
    assert!(text(&r, "error_message").is_some_and(|m| m.contains("InvalidMessageContents")));
    assert_eq!((text(&r, "due_shard"), text(&r, "attn_shard").is_some()), (None, true));
    assert!(
        l.dead_refused(&e.key, "sqs refused the request (InvalidMessageContents): x", T0 + 1).await.unwrap(),
        "our own retry after a lost acknowledgement"
    );
    assert!(!l.dead_refused(&e.key, "another refusal", T0 + 2).await.unwrap(), "dead already");
    assert_eq!(l.attention().await.unwrap().dead_letters, 1);

    let (l, held) = leased(b, "refused-held", "tok-1").await;
    assert!(!l.dead_refused(&held.key, "m", T0 + 1).await.unwrap(), "a live lease: its worker decides");
    assert_eq!(text(&row(&l, &held.key).await, "status"), Some("PROCESSING"));
    assert!(l.dead_refused(&held.key, "m", T0 + 10_000_000).await.unwrap(), "its lease long expired");
    assert!(!l.dead_refused(&EventKey::new("stripe", "contract", "nobody"), "m", T0).await.unwrap());
}

// -------------------------------------------------------------- reconciler

/// `claim_due`, `reschedule`, `note_redriven`, and the due index's pages.
pub async fn due_items_are_paged_claimed_once_and_rescheduled<B: Backend>(b: &B) {
    let l = b.ledger(7);
    let keys: Vec<EventKey> = {
        let mut k = Vec::new();
        for (i, name) in ["due-a", "due-b", "due-c"].into_iter().enumerate() {
            let mut e = event(name, &body(name), "send-1");
            e.received_at_ms = T0 + i as i64;
            assert_eq!(Ledger::claim(&l, &e, &body(name)).await.unwrap(), Claim::New);
            k.push(e.key);
        }
        k
    };
    let up_to = T0 + REDRIVE_GRACE_MS + 10;
    assert!(l.due(DuePartition::Records, 0, T0, 10, None).await.unwrap().items.is_empty(), "not due yet");
    let first = l.due(DuePartition::Records, 0, up_to, 2, None).await.unwrap();
    let ids = |p: &crate::ledger::DuePage| -> Vec<EventKey> {
        p.items.iter().filter_map(|d| if let Due::Record(r) = d { Some(r.key.clone()) } else { None }).collect()
    };
    assert_eq!(ids(&first), keys[..2].to_vec(), "oldest first");
    let cursor = first.next.clone().expect("a full page says more may follow");
    let second = l.due(DuePartition::Records, 0, up_to, 2, Some(&cursor)).await.unwrap();
    assert_eq!(ids(&second), keys[2..].to_vec());
    let Due::Record(rec) = &first.items[0] else { panic!() };
    assert!(rec.enqueued && rec.status == Status::Received, "its sender holds its send lease to the end");
    assert_eq!(rec.tenant, "t1", "a due record names its tenant");
    assert_eq!(rec.redrive_reason(up_to), Some("not_picked_up"), "handed over, the processor behind");
    assert_eq!(rec.open_since_ms, T0);
    // A sender whose send failed gives its lease back: never sent.
    let given_back = event("due-a", &body("due-a"), "send-1");
    Ledger::release_send_lease(&l, &given_back.key, &given_back.send).await.unwrap();
    let again = l.due(DuePartition::Records, 0, up_to, 2, None).await.unwrap();
    let Due::Record(rec) = &again.items[0] else { panic!() };
    assert!(!rec.enqueued);
    assert_eq!(rec.redrive_reason(up_to), Some("never_sent"));

    let seen = rec.due_at_ms;
    let token = l.claim_due(DueItem::Record(&rec.key), seen, up_to + 60_000).await.unwrap().expect("ours");
    // A run drawing the same token: our own retried claim.
    let retry = b.ledger(7);
    assert_eq!(retry.claim_due(DueItem::Record(&rec.key), seen, up_to + 60_000).await.unwrap(), Some(token.clone()));
    assert_eq!(b.ledger(8).claim_due(DueItem::Record(&rec.key), seen, up_to).await.unwrap(), None, "moved already");
    l.reschedule(DueItem::Record(&rec.key), "not-ours", T0).await.unwrap();
    assert_eq!(num(&row(&l, &rec.key).await, "due_at"), Some(up_to + 60_000), "another run's token moves nothing");
    l.reschedule(DueItem::Record(&rec.key), &token, up_to + 5).await.unwrap();
    let r = row(&l, &rec.key).await;
    assert_eq!((num(&r, "due_at"), num(&r, "redrives")), (Some(up_to + 5), Some(1)));

    l.note_enqueued(&rec.key, T0 + 1).await.unwrap();
    l.note_enqueued(&rec.key, T0 + 2).await.unwrap();
    assert_eq!(num(&row(&l, &rec.key).await, "enqueued_at"), Some(T0 + 1), "keeps the earlier note");
    l.note_enqueued(&EventKey::new("stripe", "contract", "nobody"), T0).await.unwrap();
    assert!(l.show(&EventKey::new("stripe", "contract", "nobody"), false).await.unwrap().is_none(), "creates nothing");

    // A projection item due for a re-check is read whole and claimed by its key.
    let state = Item::from([
        ("pk".into(), str_value("proj#checked#t1#sub_1")),
        ("sk".into(), str_value(crate::projection::STATE_SK)),
        ("due_shard".into(), str_value("chk#000")),
        ("due_at".into(), num_value(T0)),
        ("subscription".into(), str_value("sub_1")),
        ("seats".into(), num_value(3)),
    ]);
    b.put(state.clone()).await;
    let checks = l.due(DuePartition::Checks, 0, T0, 10, None).await.unwrap();
    let [Due::Check(d)] = &checks.items[..] else { panic!("{checks:?}") };
    assert_eq!((d.pk.as_str(), d.due_at_ms, &d.state), ("proj#checked#t1#sub_1", T0, &state));
    assert!(l.claim_due(DueItem::Check(&d.pk), T0, T0 + 1).await.unwrap().is_some());
    assert!(l.claim_due(DueItem::Check(&d.pk), T0, T0 + 1).await.unwrap().is_none(), "claimed once");
}

/// The attention index counts DEAD and PARKED records and DEAD outbox items.
pub async fn the_attention_index_counts_what_needs_an_operator<B: Backend>(b: &B) {
    let (l, dead) = leased(b, "att-dead", "tok-1").await;
    assert!(l.leave(&dead.key, "tok-1", &Exit::Dead { reason: "r", message: "m" }, T0).await.unwrap());
    let (l, parked) = leased(b, "att-parked", "tok-1").await;
    assert!(l.leave(&parked.key, "tok-1", &Exit::Park { reason: "r", subject: None }, T0).await.unwrap());
    let counts = l.attention().await.unwrap();
    assert_eq!((counts.dead_letters, counts.parked, counts.outbox_dead), (1, 1, 0));
    assert_eq!(l.count(Status::Dead).await.unwrap(), 1);
    assert_eq!(
        l.transition(&dead.key, OperatorAction::Replay, &by("op", "fixed"), T0 + 1).await.unwrap(),
        Transitioned::Done { tenant: "t1".into() }
    );
    assert_eq!(l.attention().await.unwrap().dead_letters, 0, "a replayed record leaves the index");
}

// -------------------------------------------------------------- operations

/// `operator_replay`, `operator_park`, `operator_resolve`: from the statuses
/// each may leave, audited, recognising their own retries.
/// An operator's audit entry as the use case hands it to the ledger (the
/// adapter sets its id, time, verb and target).
fn by(operator: &str, reason: &str) -> crate::audit::AuditEntry {
    crate::audit::AuditEntry::new("", 0, "", "", &crate::audit::Caller::named(operator)).because(reason)
}

/// `audit_entry`, `audit_end`: an operator action and its audit entry are
/// one write (a refused action writes none; the action's retry finds its
/// entry and is done, once); a run's entry is written before it and
/// completed once; the log is read by time (paged, inside its window, across
/// months) and by record.
pub async fn an_operator_action_and_its_audit_entry_are_one_write_listed_by_time_and_record<B: Backend>(b: &B) {
    use crate::audit::{AuditEntry, Caller};
    use crate::ports::AuditLog;
    let (l, e) = leased(b, "audited", "tok-1").await;
    assert!(l.leave(&e.key, "tok-1", &Exit::Dead { reason: "r", message: "m" }, T0).await.unwrap());
    // Refused: a RECEIVED record is not replayed.
    let (_, open) = claimed(b, "audited-open").await;
    assert_eq!(
        b.ledger(30).transition(&open.key, OperatorAction::Replay, &by("alice", "no"), T0 + 1).await.unwrap(),
        Transitioned::Refused(Status::Received)
    );
    assert!(l.audit_of(&open.key).await.unwrap().is_empty(), "a refused action writes no entry");
    // Done, and its retry (same token) is done once.
    for _ in 0..2 {
        assert_eq!(
            b.ledger(31).transition(&e.key, OperatorAction::Replay, &by("alice", "fixed"), T0 + 2).await.unwrap(),
            Transitioned::Done { tenant: "t1".into() }
        );
    }
    let entries = l.audit_of(&e.key).await.unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(
        (entry.verb.as_str(), entry.target.as_str(), entry.operator.as_str(), entry.reason.as_str()),
        ("replay", e.key.as_str(), "alice", "fixed")
    );
    assert_eq!((entry.principal.as_str(), entry.result.as_str(), entry.at_ms), ("name:alice", "done", T0 + 2));
    assert_eq!(l.audit_page(T0, T0 + 2, None, 10).await.unwrap().entries, entries);

    // A run: started, then its outcome, once.
    let caller = Caller::named("bob");
    let run = AuditEntry::new(l.audit_id(), T0 + 3, crate::audit::verb::MIGRATE, "table", &caller).because("upgrade");
    l.audit_begin(&run).await.unwrap();
    l.audit_begin(&run).await.unwrap();
    let listed =
        |page: crate::audit::AuditPage| page.entries.into_iter().map(|e| (e.verb, e.result)).collect::<Vec<_>>();
    assert_eq!(
        listed(l.audit_page(T0 + 3, T0 + 3, None, 10).await.unwrap()),
        [("migrate".to_owned(), "started".to_owned())]
    );
    l.audit_end(&run, "done: 3 items").await.unwrap();
    l.audit_end(&run, "done: 3 items").await.unwrap();
    l.audit_end(&run, "failed: later").await.unwrap();
    assert_eq!(
        listed(l.audit_page(T0 + 3, T0 + 3, None, 10).await.unwrap()),
        [("migrate".to_owned(), "done: 3 items".to_owned())],
        "an outcome is recorded once, never overwritten"
    );
    // An end whose begin never happened creates nothing.
    let ghost = AuditEntry::new(l.audit_id(), T0 + 4, crate::audit::verb::ARM, "ep", &caller);
    l.audit_end(&ghost, "done").await.unwrap();
    assert!(l.audit_page(T0 + 4, T0 + 4, None, 10).await.unwrap().entries.is_empty());

    // Paged by time, across a month's end, and only inside the window.
    let next_month = T0 + 40 * 86_400_000;
    let late = AuditEntry::new(l.audit_id(), next_month, crate::audit::verb::ARM, "ep", &caller);
    l.audit_begin(&late).await.unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = l.audit_page(T0, next_month, after.as_deref(), 1).await.unwrap();
        assert!(page.entries.len() <= 1);
        seen.extend(page.entries.iter().map(|e| e.at_ms));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, [T0 + 2, T0 + 3, next_month]);
    assert_eq!(l.audit_page(T0 + 3, next_month - 1, None, 10).await.unwrap().entries.len(), 1);
}

pub async fn operator_transitions_leave_only_their_statuses<B: Backend>(b: &B) {
    let (l, e) = leased(b, "op", "tok-1").await;
    assert_eq!(
        l.transition(&e.key, OperatorAction::Park, &by("alice", "hold"), T0).await.unwrap(),
        Transitioned::Refused(Status::Processing),
        "a PROCESSING record finishes its lease first"
    );
    assert!(l.leave(&e.key, "tok-1", &Exit::Dead { reason: "r", message: "m" }, T0).await.unwrap());
    let op = b.ledger(21);
    assert_eq!(
        op.transition(&e.key, OperatorAction::Replay, &by("alice", "fixed"), T0 + 1).await.unwrap(),
        Transitioned::Done { tenant: "t1".into() }
    );
    // The same command drawing the same token: our own retried update.
    let retry = b.ledger(21);
    assert_eq!(
        retry.transition(&e.key, OperatorAction::Replay, &by("alice", "fixed"), T0 + 1).await.unwrap(),
        Transitioned::Done { tenant: "t1".into() }
    );
    assert_eq!(
        b.ledger(22).transition(&e.key, OperatorAction::Replay, &by("bob", "again"), T0 + 2).await.unwrap(),
        Transitioned::Refused(Status::Retryable)
    );
    let r = row(&l, &e.key).await;
    assert_eq!((text(&r, "status"), num(&r, "attempts"), num(&r, "failures")), (Some("RETRYABLE"), Some(0), Some(0)));
    assert_eq!((num(&r, "due_at"), num(&r, "replays")), (Some(T0 + 1), Some(1)));
    // Open since its replay: the oldest unprocessed age counts from it.
    let due = l.due(DuePartition::Records, 0, T0 + 1, 10, None).await.unwrap();
    let replayed = due.items.iter().find_map(|d| if let Due::Record(r) = d { Some(r) } else { None });
    assert_eq!(replayed.map(|r| (&r.key, r.received_at_ms, r.open_since_ms)), Some((&e.key, T0, T0 + 1)));
    assert_eq!(
        l.transition(&e.key, OperatorAction::Park, &by("alice", "hold"), T0 + 3).await.unwrap(),
        Transitioned::Done { tenant: "t1".into() }
    );
    assert_eq!(text(&row(&l, &e.key).await, "park_reason"), Some("operator alice: hold"));
    assert_eq!(
        l.transition(&e.key, OperatorAction::Resolve, &by("alice", "done by hand"), T0 + 4).await.unwrap(),
        Transitioned::Done { tenant: "t1".into() }
    );
    let r = row(&l, &e.key).await;
    assert_eq!((text(&r, "status"), text(&r, "outcome")), (Some("PROCESSED"), Some("resolved")));
    assert_eq!(
        l.transition(&e.key, OperatorAction::Replay, &by("alice", "x"), T0 + 5).await.unwrap(),
        Transitioned::Refused(Status::Processed)
    );
    let missing = EventKey::new("stripe", "contract", "nobody");
    assert_eq!(l.transition(&missing, OperatorAction::Replay, &by("a", "b"), T0).await.unwrap(), Transitioned::Missing);

    // Rows by status, and one record with its history and payload.
    let (l, open) = claimed(b, "op-open").await;
    OperatorLedger::append_history(&l, &open.key, "note", "looked at", T0 + 7).await.unwrap();
    let all = RowFilter { until_ms: i64::MAX, ..RowFilter::default() };
    let rows = l.rows(Status::Received, 0, &all, 10).await.unwrap();
    assert_eq!(rows.iter().filter_map(|r| text(r, "pk")).collect::<Vec<_>>(), vec![open.key.as_str()]);
    let by_endpoint = RowFilter { endpoint: Some("elsewhere"), ..all.clone() };
    assert!(l.rows(Status::Received, 0, &by_endpoint, 10).await.unwrap().is_empty());
    // By tenant, from every set (the attention index does not carry it).
    let tenant = |t| RowFilter { tenant: Some(t), ..all.clone() };
    assert_eq!(l.rows(Status::Received, 0, &tenant("t1"), 10).await.unwrap().len(), 1);
    assert!(l.rows(Status::Received, 0, &tenant("t2"), 10).await.unwrap().is_empty());
    assert_eq!(l.open_rows(0).await.unwrap().len(), 1);
    let (_, history, payload) = l.show(&open.key, true).await.unwrap().unwrap();
    assert_eq!(history.iter().filter_map(|h| text(h, "kind")).collect::<Vec<_>>(), vec!["note"]);
    assert_eq!(payload, Some(body("op-open")));
    let parked_now = l.transition(&open.key, OperatorAction::Park, &by("alice", "hold"), T0 + 8).await.unwrap();
    assert_eq!(parked_now, Transitioned::Done { tenant: "t1".into() });
    let parked = l.rows(Status::Parked, 0, &all, 10).await.unwrap();
    assert!(parked.iter().any(|r| text(r, "pk") == Some(open.key.as_str())), "{parked:?}");
    let of_t1 = l.rows(Status::Parked, 0, &tenant("t1"), 10).await.unwrap();
    assert_eq!(
        of_t1.iter().map(|r| text(r, "pk")).collect::<Vec<_>>(),
        parked.iter().map(|r| text(r, "pk")).collect::<Vec<_>>()
    );
    assert!(l.rows(Status::Parked, 0, &tenant("t2"), 10).await.unwrap().is_empty());
}

// ------------------------------------------------------------------ outbox

/// `outbox_claim`, `outbox_sent`, `outbox_back_off`, `outbox_dead`: each
/// fenced by the dispatcher's token, each recognising its own retry.
pub async fn outbox_items_are_claimed_sent_backed_off_and_dead_once<B: Backend>(b: &B) {
    let (l, e) = leased(b, "out", "tok-1").await;
    let notify = |action: &str| {
        Op::new(Vec::new(), OnConflict::Stale).notify(OutboxMessage {
            topic_arn: "arn:aws:sns:us-east-1:000000000000:t".into(),
            delivery: None,
            action: action.into(),
            group: "g".into(),
            body: serde_json::json!({"a": action}),
        })
    };
    let CommitResult::Committed { outbox: ids } =
        l.commit(&e.key, "tok-1", &[notify("one"), notify("two")], "applied", None, T0).await.unwrap()
    else {
        panic!("commits")
    };
    let o = b.outbox();
    // Committed claimed by the lease (`tok-1`): due once that claim lapses.
    let lapsed = T0 + crate::message::DISPATCH_LEASE_MS;
    assert!(o.due(0, lapsed - 1, 10).await.unwrap().is_empty(), "its processor sends it");
    assert_eq!(o.due(0, lapsed, 10).await.unwrap().len(), 2, "due when its claim lapses");
    let (a, z) = (&ids[0], &ids[1]);
    // A census of the partition (`states_in`): at most what is asked, and
    // whether more were left, exactly.
    use crate::ports::OutboxPartition::{Dead, Home};
    let (one, more) = o.states_in(Home(0), 1).await.unwrap();
    assert_eq!((one.len(), more), (1, true));
    let (both, more) = o.states_in(Home(0), 2).await.unwrap();
    assert_eq!((both.len(), more), (2, false), "exactly two: none left");
    assert!(both.iter().all(|s| s.status == "SENDING" && s.created_at == Some(T0)), "{both:?}");
    assert!(matches!(o.claim(a, "tok-1", T0, T0 + 30_000).await.unwrap(), OutboxClaim::Claimed(_)), "ours");
    assert_eq!(o.claim(a, "d-2", T0 + 1, T0 + 30_001).await.unwrap(), OutboxClaim::Skipped, "a live claim");
    assert_eq!(o.mark_sent(a, "d-2", None, T0 + 2).await.unwrap(), Held::Lapsed);
    assert_eq!(o.back_off(a, "tok-1", T0 + 5_000, "sns: throttled", T0 + 2).await.unwrap(), Held::Yes);
    assert_eq!(o.back_off(a, "tok-1", T0 + 5_000, "sns: throttled", T0 + 2).await.unwrap(), Held::Yes, "our retry");
    assert_eq!(o.claim(a, "d-3", T0 + 4_999, T0 + 40_000).await.unwrap(), OutboxClaim::Skipped, "not due yet");
    assert!(!o.due(0, T0 + 4_999, 10).await.unwrap().contains(a));
    let OutboxClaim::Claimed(item) = o.claim(a, "d-3", T0 + 5_000, T0 + 40_000).await.unwrap() else { panic!() };
    assert_eq!(item.attempts, 2);
    assert_eq!(o.mark_sent(a, "d-3", None, T0 + 5_001).await.unwrap(), Held::Yes);
    assert_eq!(o.mark_sent(a, "d-3", None, T0 + 5_001).await.unwrap(), Held::Yes, "our retry");
    let sent = b.get(a, crate::adapters::dynamodb::outbox::OUTBOX_SK).await.expect("the sent item");
    let expires = sent.get("expires_at").and_then(Value::as_i64);
    let retention_s = i64::from(crate::policy::DEFAULT_RETENTION_DAYS) * 86_400;
    assert_eq!(expires, Some((T0 + 5_001) / 1000 + retention_s), "a sent item expires after the retention");
    assert_eq!(o.claim(a, "d-4", T0 + 90_000, T0 + 120_000).await.unwrap(), OutboxClaim::Skipped, "sent");
    assert!(!o.due(0, i64::MAX / 2, 10).await.unwrap().contains(a), "a sent item leaves the index");

    // A claim whose dispatcher died lapses; the next one takes it over.
    assert_eq!(o.claim(z, "d-5", lapsed - 1, lapsed).await.unwrap(), OutboxClaim::Skipped, "the commit's claim");
    assert!(matches!(o.claim(z, "d-5", lapsed + 1, lapsed + 1_000).await.unwrap(), OutboxClaim::Claimed(_)));
    assert!(matches!(o.claim(z, "d-6", lapsed + 1_001, lapsed + 31_001).await.unwrap(), OutboxClaim::Claimed(_)));
    assert_eq!(o.dead(z, "d-5", 0, "gave up", lapsed + 1_002).await.unwrap(), Held::Lapsed, "the lapsed claim");
    assert_eq!(o.dead(z, "d-6", 0, "gave up", lapsed + 1_002).await.unwrap(), Held::Yes);
    assert_eq!(o.dead(z, "d-6", 0, "gave up", lapsed + 1_002).await.unwrap(), Held::Yes, "our retry");
    assert_eq!(l.attention().await.unwrap().outbox_dead, 1);
    assert_eq!(o.claim(z, "d-7", i64::MAX / 2, i64::MAX / 2 + 1).await.unwrap(), OutboxClaim::Skipped, "dead");

    // `outbox_revive`: an operator's replay of the DEAD item, and only of a DEAD one.
    assert_eq!(o.dead_items(0, 10).await.unwrap(), std::slice::from_ref(z));
    let (dead, more) = o.states_in(Dead(0), 10).await.unwrap();
    assert_eq!((dead.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), more), (vec![z.as_str()], false));
    assert!(o.states_in(Home(0), 10).await.unwrap().0.iter().all(|s| &s.id != z), "out of its home partition");
    let dead = o.state(z).await.unwrap().expect("the item");
    assert_eq!((dead.status.as_str(), dead.last_error.as_deref()), ("DEAD", Some("gave up")));
    assert!(
        !o.revive(a, "op-1", 0, &by("alice", "fixed").at(T0 + 2_000)).await.unwrap(),
        "a sent item is not replayed"
    );
    assert!(o.revive(z, "op-1", 0, &by("alice", "fixed").at(T0 + 2_000)).await.unwrap());
    assert!(o.revive(z, "op-1", 0, &by("alice", "fixed").at(T0 + 2_000)).await.unwrap(), "our retry");
    assert!(!o.revive(z, "op-2", 0, &by("bob", "again").at(T0 + 2_001)).await.unwrap(), "not DEAD any more");
    let revived = o.state(z).await.unwrap().expect("the item");
    assert_eq!((revived.status.as_str(), revived.due_at, revived.dead_at), ("PENDING", Some(T0 + 2_000), None));
    assert!(o.dead_items(0, 10).await.unwrap().is_empty(), "out of the attention index");
    assert!(o.due(0, T0 + 2_000, 10).await.unwrap().contains(z), "due now");
    assert!(matches!(o.claim(z, "d-8", T0 + 2_000, T0 + 32_000).await.unwrap(), OutboxClaim::Claimed(_)));
    assert_eq!(l.attention().await.unwrap().outbox_dead, 0);
    assert!(o.state("outbox#nothing").await.unwrap().is_none());
}

/// A record leased and committed with one notification (an outbox item,
/// PENDING): the item's id.
async fn one_notification<B: Backend>(b: &B, name: &str) -> String {
    let (l, e) = leased(b, name, "tok-1").await;
    let op = Op::new(Vec::new(), OnConflict::Stale).notify(OutboxMessage {
        topic_arn: "https://hooks.example.com/in".into(),
        delivery: None,
        action: "one".into(),
        group: "g".into(),
        body: serde_json::json!({"a": 1}),
    });
    let CommitResult::Committed { outbox: ids } = l.commit(&e.key, "tok-1", &[op], "applied", None, T0).await.unwrap()
    else {
        panic!("commits")
    };
    ids.into_iter().next().expect("one item")
}

/// `outbox_defer`: a claimed item put back without spending its attempt
/// (fenced; its retry recognises itself). A destination's circuit
/// (`circuit_*`): failures counted once each (a retry meets its token),
/// opened once, one probe at a time after its time is up, closed by a
/// send that got through.
pub async fn a_deferred_item_gives_its_attempt_back_and_a_circuit_opens_probes_and_closes_once<B: Backend>(b: &B) {
    let id = &one_notification(b, "defer").await;
    let o = b.outbox();
    // The committing lease's own claim (the item is written claimed by it).
    let OutboxClaim::Claimed(first) = o.claim(id, "tok-1", T0, T0 + 30_000).await.unwrap() else { panic!() };
    assert_eq!(first.attempts, 1);
    let home = first.shard;
    assert_eq!(o.defer(id, "d-2", "partner", home, "waiting", T0).await.unwrap(), Held::Lapsed, "not the holder");
    assert_eq!(o.defer(id, "tok-1", "partner", home, "waiting", T0).await.unwrap(), Held::Yes);
    assert_eq!(o.defer(id, "tok-1", "partner", home, "waiting", T0).await.unwrap(), Held::Yes, "our retry");
    // It waits in its destination's partition, out of the sweep's.
    assert!(!o.due(home, T0 + 86_400_000, 100).await.unwrap().contains(id), "out of the sweep's partition");
    assert_eq!(o.waiting("partner", T0, 10).await.unwrap(), std::slice::from_ref(id));
    let (waiting, _) = o.states_in(crate::ports::OutboxPartition::Waiting("partner"), 10).await.unwrap();
    assert!(waiting.len() == 1 && waiting[0].waiting && waiting[0].id == *id, "{waiting:?}");
    assert!(o.waiting("partner", T0 - 1, 10).await.unwrap().is_empty(), "waiting since T0");
    assert!(o.waiting("other", T0, 10).await.unwrap().is_empty(), "another destination's partition");
    // `outbox_unwait`: home again, due now; its retry (acknowledgement
    // lost) is told it is home; an item never deferred is not moved.
    assert!(o.unwait(id, "partner", T0 + 5).await.unwrap());
    assert!(o.unwait(id, "partner", T0 + 5).await.unwrap(), "our retry: it is home, to be handed on");
    assert!(o.waiting("partner", T0 + 5, 10).await.unwrap().is_empty());
    assert!(o.due(home, T0 + 5, 100).await.unwrap().contains(id), "due now in its home partition");
    assert!(!o.unwait("outbox#nothing", "partner", T0 + 5).await.unwrap(), "no such item: nothing written");
    let OutboxClaim::Claimed(again) = o.claim(id, "d-3", T0 + 60_000, T0 + 90_000).await.unwrap() else { panic!() };
    assert_eq!(again.attempts, 1, "waiting spent no attempt");
    assert_eq!(again.shard, home, "its home shard");
    let state = o.state(id).await.unwrap().expect("the item");
    assert_eq!((state.status.as_str(), state.last_error.as_deref()), ("SENDING", Some("waiting")));

    let d = "partner";
    assert_eq!(o.circuit(d).await.unwrap(), None, "never written: closed");
    let reset = |now_ms| CircuitChange::Close { now_ms, probe: None };
    assert_eq!(o.change_circuit(d, reset(T0)).await.unwrap(), None, "nothing to reset");
    let failed = o.change_circuit(d, CircuitChange::Failure { token: "f-1", now_ms: T0 }).await.unwrap();
    assert_eq!(failed.map(|c| c.failures), Some(1));
    let retried = o.change_circuit(d, CircuitChange::Failure { token: "f-1", now_ms: T0 }).await.unwrap();
    assert_eq!(retried.map(|c| c.failures), Some(1), "our retry counts once");
    let next = o.change_circuit(d, CircuitChange::Failure { token: "f-2", now_ms: T0 + 1 }).await.unwrap();
    assert_eq!(next.map(|c| c.failures), Some(2));
    let open = |token, until_ms, now_ms| CircuitChange::Open { token, until_ms, now_ms };
    let was_reset = o.change_circuit(d, reset(T0 + 1)).await.unwrap().expect("closed: its failures reset");
    assert_eq!(was_reset.failures, 0);
    let retried = o.change_circuit(d, reset(T0 + 1)).await.unwrap();
    assert_eq!(retried, Some(was_reset), "our retry (its acknowledgement lost) resets again, the same");
    for t in ["f-3", "f-4"] {
        assert!(o.change_circuit(d, CircuitChange::Failure { token: t, now_ms: T0 + 1 }).await.unwrap().is_some());
    }
    let opened = o.change_circuit(d, open("o-1", T0 + 60_000, T0 + 2)).await.unwrap().expect("opened");
    assert_eq!((opened.open_until, opened.failures), (Some(T0 + 60_000), 0));
    assert!(o.change_circuit(d, open("o-1", T0 + 60_000, T0 + 2)).await.unwrap().is_some(), "our retry");
    assert_eq!(o.change_circuit(d, open("o-2", T0 + 60_003, T0 + 3)).await.unwrap(), None, "open already");
    // A success seen by a container that read the circuit closed never closes it.
    assert_eq!(o.change_circuit(d, reset(T0 + 4)).await.unwrap(), None, "open: only a probe closes it");
    let close = |probe, now_ms| CircuitChange::Close { now_ms, probe: Some(probe) };
    assert_eq!(o.change_circuit(d, close("p-0", T0 + 5)).await.unwrap(), None, "no such probe out");
    let probe = |token, until_ms, now_ms| CircuitChange::Probe { token, until_ms, now_ms };
    assert_eq!(o.change_circuit(d, probe("p-1", T0 + 90_000, T0 + 59_999)).await.unwrap(), None, "still open");
    let probing = o.change_circuit(d, probe("p-1", T0 + 90_000, T0 + 60_000)).await.unwrap().expect("the probe");
    assert_eq!((probing.probe_until, probing.probe_token.as_deref()), (Some(T0 + 90_000), Some("p-1")));
    assert!(o.change_circuit(d, probe("p-1", T0 + 90_000, T0 + 60_000)).await.unwrap().is_some(), "our retry");
    assert_eq!(o.change_circuit(d, probe("p-2", T0 + 90_001, T0 + 60_001)).await.unwrap(), None, "one probe");
    // The probe failed: open again (its time was up).
    let reopened = o.change_circuit(d, open("o-3", T0 + 120_000, T0 + 60_002)).await.unwrap().expect("reopened");
    assert_eq!((reopened.open_until, reopened.probe_until), (Some(T0 + 120_000), None));
    assert!(o.change_circuit(d, probe("p-3", T0 + 150_000, T0 + 120_000)).await.unwrap().is_some());
    assert_eq!(o.change_circuit(d, close("p-1", T0 + 120_001)).await.unwrap(), None, "an earlier probe's success");
    let closed = o.change_circuit(d, close("p-3", T0 + 120_001)).await.unwrap().expect("closed");
    let want = Circuit {
        failures: 0,
        failure_token: Some("f-4".into()),
        close_token: Some("p-3".into()),
        ..Circuit::default()
    };
    assert_eq!(closed, want);
    assert_eq!(o.change_circuit(d, close("p-3", T0 + 120_001)).await.unwrap(), Some(want.clone()), "our retry");
    assert_eq!(o.circuit(d).await.unwrap(), Some(closed));
    assert_eq!(o.circuit("other").await.unwrap(), None, "one circuit per destination");
}

/// A destination's rate item: grants a step apart (now when idle, the next
/// slot when busy, refused past the horizon), a slowdown, flights counted
/// in a set; and a delivery held claimed while it waits for its grant,
/// then marked sent with the grant on it.
pub async fn a_rate_limit_grants_a_step_apart_and_counts_flights_once<B: Backend>(b: &B) {
    use crate::ports::{RateChange, RateWritten};
    let (o, d) = (b.outbox(), "partner");
    assert_eq!(o.rate(d).await.unwrap(), None, "never written");
    let now = |now_ms| RateChange::GrantNow { step_ms: 200, now_ms };
    let next = |now_ms| RateChange::GrantNext { step_ms: 200, horizon_ms: 1_000, now_ms };
    let RateWritten::Applied(r) = o.change_rate(d, now(T0)).await.unwrap() else { panic!("idle: granted now") };
    assert_eq!((r.next_at, r.grants, r.granted_at), (Some(T0 + 200), 1, Some(T0)));
    // Its retry (acknowledgement lost) is refused: the next grant is ahead.
    let RateWritten::Refused(Some(met)) = o.change_rate(d, now(T0)).await.unwrap() else { panic!("busy") };
    assert_eq!(met.next_at, Some(T0 + 200));
    for (i, want) in [(0, T0 + 400), (1, T0 + 600), (2, T0 + 800), (3, T0 + 1_000), (4, T0 + 1_200)] {
        let RateWritten::Applied(r) = o.change_rate(d, next(T0 + i)).await.unwrap() else { panic!("{i}") };
        assert_eq!(r.next_at, Some(want), "the slot granted is {} ms on", want - T0 - 200);
    }
    let RateWritten::Refused(Some(met)) = o.change_rate(d, next(T0 + 5)).await.unwrap() else {
        panic!("past the horizon")
    };
    assert_eq!(met.next_at, Some(T0 + 1_200));
    assert!(matches!(o.change_rate(d, next(T0 + 1_200)).await.unwrap(), RateWritten::Refused(_)), "not ahead");
    let slow = RateChange::Slow { resume_ms: T0 + 5_000, factor: 2, until_ms: T0 + 9_000, now_ms: T0 + 10 };
    let RateWritten::Applied(r) = o.change_rate(d, slow.clone()).await.unwrap() else { panic!("slowed") };
    assert_eq!((r.next_at, r.slow_factor, r.slow_until), (Some(T0 + 5_000), 2, Some(T0 + 9_000)));
    assert!(matches!(o.change_rate(d, slow).await.unwrap(), RateWritten::Refused(_)), "later already");
    let keep = RateChange::SlowKeep { factor: 4, until_ms: T0 + 9_500, now_ms: T0 + 11 };
    let RateWritten::Applied(r) = o.change_rate(d, keep).await.unwrap() else { panic!("factor kept") };
    assert_eq!((r.next_at, r.slow_factor, r.throttled_at), (Some(T0 + 5_000), 4, Some(T0 + 11)));

    let take = |flight| RateChange::TakeFlight { flight, max: 2 };
    assert!(matches!(o.change_rate(d, take("1#a")).await.unwrap(), RateWritten::Applied(_)));
    assert!(matches!(o.change_rate(d, take("1#a")).await.unwrap(), RateWritten::Applied(_)), "a set: once");
    let RateWritten::Applied(r) = o.change_rate(d, take("9#b")).await.unwrap() else { panic!("two fit") };
    assert_eq!(r.flights.len(), 2);
    let RateWritten::Refused(Some(met)) = o.change_rate(d, take("9#c")).await.unwrap() else { panic!("full") };
    assert_eq!(met.flights.len(), 2);
    let clean = ["1#a".to_owned()];
    assert!(matches!(o.change_rate(d, RateChange::Clean { expired: &clean }).await.unwrap(), RateWritten::Applied(_)));
    let RateWritten::Applied(r) = o.change_rate(d, RateChange::Land { flight: "9#b" }).await.unwrap() else { panic!() };
    assert!(r.flights.is_empty(), "{r:?}");
    assert!(matches!(o.change_rate(d, RateChange::Land { flight: "9#b" }).await.unwrap(), RateWritten::Refused(_)));
    assert_eq!(o.rate("other").await.unwrap(), None, "one rate per destination");

    // A delivery held for its grant: claimed until then, out of the sweep's reach.
    let id = &one_notification(b, "hold").await;
    let OutboxClaim::Claimed(item) = o.claim(id, "tok-1", T0, T0 + 30_000).await.unwrap() else { panic!() };
    assert_eq!(o.hold(id, "d-2", T0 + 90_000).await.unwrap(), Held::Lapsed, "not the holder");
    assert_eq!(o.hold(id, "tok-1", T0 + 90_000).await.unwrap(), Held::Yes);
    assert_eq!(o.hold(id, "tok-1", T0 + 90_000).await.unwrap(), Held::Yes, "our retry");
    assert!(!o.due(item.shard, T0 + 89_999, 100).await.unwrap().contains(id), "held: not due before");
    assert!(matches!(o.claim(id, "d-3", T0 + 60_000, T0 + 90_000).await.unwrap(), OutboxClaim::Skipped));
    assert_eq!(o.mark_sent(id, "tok-1", Some(T0 + 60_000), T0 + 60_001).await.unwrap(), Held::Yes);
    let state = o.state(id).await.unwrap().expect("the item");
    assert_eq!((state.status.as_str(), state.granted_at), ("SENT", Some(T0 + 60_000)));
}

// ---------------------------------------------------------------- backfill

/// Cursors and schedules, `recorded`, redelivery notes, and a record parked
/// without its payload (`CLAIM` of the parked record, `release_parked`).
pub async fn backfill_cursors_parked_records_and_their_release<B: Backend>(b: &B) {
    let l = b.ledger(1);
    assert_eq!(l.progress("run-1").await.unwrap(), None);
    let p = BackfillProgress { cursor: Some("evt_9".into()), done: false, seen: 10, recovered: 3 };
    l.save_progress("run-1", &p, T0).await.unwrap();
    assert_eq!(l.progress("run-1").await.unwrap(), Some(p));
    let s = ScheduleState { high_water: Some(1_000), current: Some((1_000, 2_000)) };
    l.save_schedule_state("ep", &s, T0).await.unwrap();
    assert_eq!(l.schedule_state("ep").await.unwrap(), Some(s));
    assert_eq!(l.schedule_state("other").await.unwrap(), None);

    let mut e = event("parked", b"", "send-1");
    e.via = Via::Backfill;
    e.payload_hash = crate::ledger::NO_PAYLOAD_HASH.into();
    assert!(!l.recorded(&e.key).await.unwrap());
    let u = UnfetchedEvent {
        reason: "backfill_unrecoverable:no_payload",
        detail: "listed without a payload",
        handle: Some("d-1"),
        origin: Some("repos/o/r/hooks/1"),
        created_s: 1_000,
    };
    assert_eq!(l.park(&e, &u).await.unwrap(), Claim::New);
    assert_eq!(l.park(&e, &u).await.unwrap(), Claim::New, "our own retried put");
    let other = NewEvent { send: SendLease { token: "send-2".into(), until_ms: T0 }, ..e.clone() };
    let Claim::Existing(r) = l.park(&other, &u).await.unwrap() else { panic!("recorded") };
    assert!(r.awaits_payload(), "{r:?}");
    assert!(l.recorded(&e.key).await.unwrap());
    assert_eq!(l.count(Status::Parked).await.unwrap(), 1);
    assert_eq!(
        l.transition(&e.key, OperatorAction::Replay, &by("alice", "x"), T0).await.unwrap(),
        Transitioned::Refused(Status::Parked),
        "a record without its payload cannot be replayed"
    );
    l.note_redelivery(&e.key, "d-1", T0 + 1).await.unwrap();
    l.note(&e.key, "backfill", "parked", T0 + 2).await.unwrap();

    // The payload arrives (a webhook delivery): released once.
    let bytes = body("parked");
    let delivered = NewEvent {
        payload_hash: payload_hash(&bytes),
        content_hash: payload_hash(&bytes),
        send: SendLease { token: "send-3".into(), until_ms: T0 + 10_000 },
        via: Via::Webhook,
        received_at_ms: T0 + 100,
        // Configured for another tenant since: the record's tenant holds.
        tenant: "t9".into(),
        ..e.clone()
    };
    let released = Release::Released { tenant: "t1".into() };
    assert_eq!(l.release(&delivered, &bytes, "webhook").await.unwrap(), released);
    assert_eq!(l.release(&delivered, &bytes, "webhook").await.unwrap(), released, "our own retry");
    let late = NewEvent { send: SendLease { token: "send-4".into(), until_ms: T0 }, ..delivered.clone() };
    assert_eq!(Ledger::release_parked(&l, &late, &bytes, "webhook").await.unwrap(), Release::NotAwaiting);
    let (rec, history, payload) = l.show(&e.key, true).await.unwrap().unwrap();
    assert_eq!((text(&rec, "status"), text(&rec, "released_by")), (Some("RECEIVED"), Some("webhook")));
    assert_eq!(num(&rec, "due_at"), Some(T0 + 100 + REDRIVE_GRACE_MS), "back in the due index");
    assert!(rec.get("attn_shard").is_none() && rec.get("park_reason").is_none(), "{rec:?}");
    assert_eq!(payload.as_deref(), Some(&bytes[..]));
    let kinds: Vec<&str> = history.iter().filter_map(|h| text(h, "kind")).collect();
    assert_eq!(kinds, vec!["redelivery_requested", "backfill"]);

    // Parked for its source but holding a payload (written by an earlier
    // release): not a record that awaits one, so nothing is released.
    let mut held = event("parked-with-payload", &bytes, "send-1");
    held.via = Via::Backfill;
    let mut item = record_item(&held);
    item.insert("status".into(), str_value("PARKED"));
    item.insert("park_reason".into(), str_value("backfill_unrecoverable:no_payload"));
    b.put(item).await;
    let other =
        NewEvent { send: SendLease { token: "send-5".into(), until_ms: T0 }, via: Via::Webhook, ..held.clone() };
    assert_eq!(l.release(&other, &bytes, "webhook").await.unwrap(), Release::NotAwaiting);
    assert_eq!(text(&row(&l, &held.key).await, "status"), Some("PARKED"));
}

// ------------------------------------------------------------------- queue

/// The work queue carries a key alone or with its payload, counts receives,
/// hides a received message for its visibility timeout, and shows it again
/// when asked (no sooner than a second).
pub async fn the_work_queue_carries_keys_payloads_and_receive_counts<B: Backend>(b: &B) {
    let q = b.queue();
    let (k1, k2) = (EventKey::new("stripe", "contract", "q-1"), EventKey::new("stripe", "contract", "q-2"));
    q.send(&k1, "acme").await.unwrap();
    q.send_with_payload(&k2, "globex", &body("q-2")).await.unwrap();
    let mut got = b.receive(10).await;
    got.sort_by_key(|r| r.work.as_ref().map(|w| w.0.as_str().to_owned()));
    let work: Vec<_> = got.iter().map(|r| r.work.clone()).collect();
    assert_eq!(work, vec![Some((k1.clone(), None)), Some((k2.clone(), Some(body("q-2"))))]);
    let groups: Vec<_> = got.iter().map(|r| r.group.as_deref()).collect();
    assert_eq!(groups, [Some("acme"), Some("globex")], "each message in its tenant's group");
    // A record without a tenant: sent, in no group, rather than refused.
    let k3 = EventKey::new("stripe", "contract", "q-3");
    q.send(&k3, "").await.unwrap();
    let lone = b.receive(10).await;
    assert_eq!(lone.iter().map(|r| (r.work.clone(), r.group.clone())).collect::<Vec<_>>(), [(Some((k3, None)), None)]);
    assert!(got.iter().all(|r| !r.last_receive && r.receipt.is_some()));
    assert!(b.receive(10).await.is_empty(), "received messages are hidden");
    q.show_again(got[0].receipt.as_deref().unwrap(), 0).await.unwrap();
    assert!(b.receive(10).await.is_empty(), "shown again no sooner than a second");
    b.wait(1_500).await;
    let again = b.receive(10).await;
    assert_eq!(again.iter().map(|r| r.work.clone()).collect::<Vec<_>>(), vec![Some((k1, None))]);
    assert!(q.show_again("not-a-receipt", 1_000).await.is_err(), "an unknown receipt is refused");
}

/// The delivery queue carries deliveries (with their commit's claim or
/// none) and drain steps, each in its destination's group, ten to a
/// request and more; a message sent with a delay is shown no sooner.
pub async fn the_delivery_queue_carries_deliveries_and_drains_in_their_destinations_groups<B: Backend>(b: &B) {
    use crate::ports::{DeliveryMessage, DeliveryQueue, Handover};
    let q = b.deliveries();
    let deliver = |i: usize, token: Option<&str>| DeliveryMessage::Deliver {
        at: None,
        outbox: format!("outbox#{i:02}"),
        token: token.map(str::to_owned),
    };
    let mut now: Vec<Handover> = (0..11)
        .map(|i| Handover {
            message: deliver(i, (i % 2 == 0).then_some("lease-1")),
            group: if i < 6 { "orders" } else { "partner" }.to_owned(),
            delay_s: 0,
        })
        .collect();
    now.push(Handover {
        message: DeliveryMessage::Drain { destination: "partner".into() },
        group: "partner".into(),
        delay_s: 0,
    });
    let later = Handover { message: deliver(99, None), group: "orders".into(), delay_s: 1 };
    let mut all = now.clone();
    all.push(later.clone());
    let answers = q.hand_over(&all).await;
    assert_eq!(answers.len(), 13);
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let mut got = Vec::new();
    for _ in 0..5 {
        got.extend(b.receive_deliveries(10).await);
    }
    let mut want: Vec<(DeliveryMessage, Option<String>)> =
        now.iter().map(|h| (h.message.clone(), Some(h.group.clone()))).collect();
    let key = |m: &(DeliveryMessage, Option<String>)| format!("{m:?}");
    got.sort_by_key(key);
    want.sort_by_key(key);
    assert_eq!(got, want, "each once, in its destination's group; the delayed one not yet");
    b.wait(1_500).await;
    assert_eq!(b.receive_deliveries(10).await, [(later.message, Some("orders".to_owned()))], "after its delay");
}

/// Several messages sent at once (`SendMessageBatch` on SQS: more than one
/// request for more than ten, or for bodies that together exceed one
/// message) arrive each once, with its payload and in its tenant's group,
/// and each send is answered in order.
pub async fn messages_sent_together_arrive_each_in_its_tenants_group<B: Backend>(b: &B) {
    use crate::ports::Outgoing;
    let q = b.queue();
    let keys: Vec<_> = (0..12).map(|i| EventKey::new("stripe", "contract", &format!("batch-{i:02}"))).collect();
    let tenants: Vec<String> = (0..12).map(|i| format!("tenant-{}", i % 3)).collect();
    // Two bodies of 150 KB: together more than one message may be, each one fits.
    let big = vec![b'x'; 150_000];
    let payloads: Vec<Option<Vec<u8>>> = (0..12)
        .map(|i| match i {
            3 | 4 => Some(big.clone()),
            i if i % 2 == 0 => Some(body(&format!("b-{i}"))),
            _ => None,
        })
        .collect();
    let out: Vec<Outgoing<'_>> =
        (0..12).map(|i| Outgoing { key: &keys[i], tenant: &tenants[i], payload: payloads[i].as_deref() }).collect();
    let results = q.send_all(&out).await;
    assert_eq!(results.len(), 12);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let mut got = Vec::new();
    for _ in 0..6 {
        got.extend(b.receive(10).await);
        if got.len() >= 12 {
            break;
        }
    }
    let mut seen: Vec<_> = got
        .iter()
        .map(|r| {
            let (k, p) = r.work.clone().expect("a work message");
            (k.as_str().to_owned(), p, r.group.clone())
        })
        .collect();
    seen.sort();
    let mut want: Vec<_> =
        (0..12).map(|i| (keys[i].as_str().to_owned(), payloads[i].clone(), Some(tenants[i].clone()))).collect();
    want.sort();
    assert_eq!(seen, want);
    assert!(q.send_all(&[]).await.is_empty());
}

/// The one admission path (the intake's, the backfill's, the drift
/// repair's): new events claimed and sent together with their payloads; an
/// event met again is a duplicate whose record, never sent and let go of,
/// is handed over once; a record parked without its payload is released
/// with the one offered; each answer in order.
pub async fn the_admission_path_claims_hands_over_and_sends_each_once<B: Backend>(b: &B) {
    use crate::admission::{Admission, Admitted};
    let l = b.ledger(seed("admission"));
    let q = b.queue();
    let admission = Admission { ledger: &l, queue: &q, by: "contract", keys: None };
    let (a, c) = (body("adm-a"), body("adm-c"));
    let ea = event("adm-a", &a, "send-a");
    let ec = event("adm-c", &c, "send-c");
    let first = admission.admit(&[(ea.clone(), a.as_slice()), (ec.clone(), c.as_slice())]).await;
    assert!(matches!(first[..], [Admitted::New, Admitted::New]), "{first:?}");
    // Again, after the send leases lapsed: neither is known to be sent (the
    // intake does not note its sends), so each is handed over once.
    let later = |e: &NewEvent, token: &str| NewEvent {
        send: SendLease { token: token.into(), until_ms: T0 + 40_000 },
        received_at_ms: T0 + 30_000,
        ..e.clone()
    };
    let again = admission.admit(&[(later(&ea, "send-a2"), a.as_slice()), (later(&ec, "send-c2"), c.as_slice())]).await;
    assert!(
        matches!(
            again[..],
            [
                Admitted::Duplicate { resent: true, conflict: false },
                Admitted::Duplicate { resent: true, conflict: false }
            ]
        ),
        "{again:?}"
    );
    // And within the new holder's send lease: nothing more.
    let third = admission.admit(&[(later(&ea, "send-a3"), a.as_slice())]).await;
    assert!(matches!(third[..], [Admitted::Duplicate { resent: false, conflict: false }]), "{third:?}");
    // A record a backfill parked without its payload is released with this one.
    let parked = NewEvent {
        payload_hash: crate::ledger::NO_PAYLOAD_HASH.into(),
        content_hash: String::new(),
        via: Via::Backfill,
        ..event("adm-p", &[], "send-p")
    };
    let unfetched = crate::ports::UnfetchedEvent {
        reason: "backfill_unrecoverable:no_payload",
        detail: "listed without a payload",
        handle: None,
        origin: None,
        created_s: 1,
    };
    assert_eq!(BackfillLedger::park(&l, &parked, &unfetched).await.unwrap(), Claim::New);
    let p = body("adm-p");
    let delivered = event("adm-p", &p, "send-p2");
    let released = admission.admit(&[(delivered, p.as_slice())]).await;
    assert!(matches!(&released[..], [Admitted::Released { tenant }] if tenant == "t1"), "{released:?}");
    assert_eq!(text(&row(&l, &parked.key).await, "status"), Some("RECEIVED"));
    // On the queue: each event twice (sent, then handed over), the released one once.
    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend(b.receive(10).await);
    }
    let mut keys: Vec<String> = got.iter().filter_map(|r| r.work.as_ref().map(|w| w.0.as_str().to_owned())).collect();
    keys.sort();
    let mut want = vec![ea.key.as_str(), ea.key.as_str(), ec.key.as_str(), ec.key.as_str(), parked.key.as_str()];
    want.sort_unstable();
    assert_eq!(keys, want);
    assert!(got.iter().all(|r| r.group.as_deref() == Some("t1")));
}

/// `advance_generation` through the admission path: a notification
/// repeated while its record is RECEIVED coalesces; once the record is
/// leased, the repeat is its next generation (`<id>@g2`), noted on the first
/// record; a note that lags is walked past and moved; a note is never moved back.
pub async fn a_notification_repeated_once_its_record_is_leased_is_its_next_generation<B: Backend>(b: &B) {
    use crate::admission::{Admission, Admitted};
    use crate::ledger::Generation;
    let l = b.ledger(seed("generations"));
    let q = b.queue();
    let admission = Admission { ledger: &l, queue: &q, by: "contract", keys: None };
    let bytes = body("note");
    let note = |token: &str, at: i64| NewEvent {
        notification: Some(Generation { n: 1, index_shards: 1 }),
        send: SendLease { token: token.into(), until_ms: at + 10_000 },
        received_at_ms: at,
        ..event("note", &bytes, token)
    };
    let first = note("g-1", T0);
    let gen_key = |n: u32| EventKey::new("stripe", "contract", &crate::ledger::generation_id("note", n));
    let admitted = admission.admit(&[(first.clone(), bytes.as_slice())]).await;
    assert!(matches!(admitted[..], [Admitted::New]), "{admitted:?}");
    let admitted = admission.admit(&[(note("g-2", T0 + 1), bytes.as_slice())]).await;
    assert!(matches!(admitted[..], [Admitted::Duplicate { resent: false, conflict: false }]), "RECEIVED: {admitted:?}");
    assert!(matches!(l.lease(&first.key, "w-1", T0 + 2, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    let admitted = admission.admit(&[(note("g-3", T0 + 3), bytes.as_slice())]).await;
    assert!(matches!(admitted[..], [Admitted::New]), "leased: the next generation, {admitted:?}");
    let second = row(&l, &gen_key(2)).await;
    assert_eq!((text(&second, "status"), num(&second, "generation")), (Some("RECEIVED"), Some(2)));
    assert_eq!(text(&second, "event_id"), Some("note@g2"));
    assert_eq!(num(&row(&l, &first.key).await, "latest_generation"), Some(2));
    let admitted = admission.admit(&[(note("g-4", T0 + 4), bytes.as_slice())]).await;
    assert!(matches!(admitted[..], [Admitted::Duplicate { .. }]), "generation 2 RECEIVED: {admitted:?}");
    // Generation 3 claimed by a delivery that died before noting it.
    assert!(matches!(l.lease(&gen_key(2), "w-2", T0 + 5, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    let died = note("g-5", T0 + 6).generation(3);
    assert_eq!(Ledger::claim(&l, &died, &bytes).await.unwrap(), Claim::New);
    assert_eq!(num(&row(&l, &first.key).await, "latest_generation"), Some(2), "the note lags");
    let admitted = admission.admit(&[(note("g-6", T0 + 7), bytes.as_slice())]).await;
    assert!(matches!(admitted[..], [Admitted::Duplicate { .. }]), "walked to generation 3, RECEIVED: {admitted:?}");
    assert_eq!(num(&row(&l, &first.key).await, "latest_generation"), Some(3), "the walk moved the note");
    // Never moved back (a late write of an older generation).
    l.advance_generation(&first.key, 2, T0 / 1000 + 99).await.unwrap();
    let noted = row(&l, &first.key).await;
    assert_eq!(num(&noted, "latest_generation"), Some(3));
    assert_eq!(num(&noted, "expires_at"), Some(first.expires_at), "the first record lives as long as its last");
    // Sent: the first and generation 2 (generation 3's sender died before sending).
    let mut keys = Vec::new();
    for _ in 0..3 {
        keys.extend(b.receive(10).await.into_iter().filter_map(|r| r.work.map(|w| w.0.as_str().to_owned())));
    }
    keys.sort();
    assert_eq!(keys, vec![first.key.as_str().to_owned(), gen_key(2).as_str().to_owned()]);
}

/// `bind_body`, `take_binding`, `flag_replay`: a body is bound to one
/// identity per endpoint; the same identity again is ours; another meets
/// the holder; a binding whose holder never recorded is taken over once
/// (our own retried take is still ours); a replay is counted on the record.
pub async fn a_body_is_bound_to_one_identity_and_a_replay_is_flagged_on_its_record<B: Backend>(b: &B) {
    use crate::ledger::{BodyBinding, Bound};
    let l = b.ledger(seed("binding"));
    let key = |id: &str| EventKey::new("shopify", "contract", id);
    let (first, second, third) = (key("ev-1"), key("ev-2"), key("ev-3"));
    fn binding<'a>(endpoint: &'a str, k: &'a EventKey, at_ms: i64) -> BodyBinding<'a> {
        BodyBinding { provider: "shopify", endpoint, payload_hash: "h1", key: k, at_ms, expires_at: T0 / 1000 + 86_400 }
    }
    assert_eq!(l.bind_body(&binding("contract", &first, T0)).await.unwrap(), Bound::Ours);
    assert_eq!(l.bind_body(&binding("contract", &first, T0 + 5)).await.unwrap(), Bound::Ours, "its retry");
    let met = l.bind_body(&binding("contract", &second, T0 + 6)).await.unwrap();
    assert_eq!(met, Bound::Other { key: first.clone(), at_ms: T0 });
    let elsewhere = EventKey::new("shopify", "elsewhere", "ev-2");
    assert_eq!(l.bind_body(&binding("elsewhere", &elsewhere, T0)).await.unwrap(), Bound::Ours);
    let take = binding("contract", &second, T0 + 7);
    assert!(l.take_binding(&take, &first).await.unwrap());
    assert!(l.take_binding(&take, &first).await.unwrap(), "our own retried take");
    assert!(!l.take_binding(&binding("contract", &third, T0 + 8), &first).await.unwrap());
    let met = l.bind_body(&binding("contract", &first, T0 + 9)).await.unwrap();
    assert_eq!(met, Bound::Other { key: second, at_ms: T0 + 7 });
    let (l, e) = claimed(b, "replayed").await;
    l.flag_replay(&e.key, "ev-8", T0 + 3).await.unwrap();
    l.flag_replay(&e.key, "ev-9", T0 + 4).await.unwrap();
    let r = row(&l, &e.key).await;
    assert_eq!((num(&r, "body_replays"), text(&r, "last_body_replay_id")), (Some(2), Some("ev-9")));
    assert!(l.flag_replay(&EventKey::new("stripe", "contract", "nobody"), "x", T0).await.is_err());
    assert!(l.existing(&EventKey::new("stripe", "contract", "nobody")).await.unwrap().is_none());
    assert_eq!(l.existing(&e.key).await.unwrap().map(|r| r.status), Some(Status::Received));
}

/// A message received [`MAX_RECEIVES`] times and never deleted moves to the
/// dead-letter queue on its next receive, and is no longer delivered.
pub async fn a_message_received_too_often_moves_to_the_dead_letter_queue<B: Backend>(b: &B) {
    let q = b.queue();
    let k = EventKey::new("stripe", "contract", "dlq-1");
    q.send(&k, "acme").await.unwrap();
    for n in 1..=MAX_RECEIVES {
        let got = b.receive(10).await;
        assert_eq!(got.len(), 1, "receive {n}");
        q.show_again(got[0].receipt.as_deref().unwrap(), 0).await.unwrap();
        b.wait(1_500).await;
    }
    assert!(b.receive(10).await.is_empty(), "moved, not delivered again");
    assert_eq!(b.dead_letters().await, vec![k]);
}

// -------------------------------------------------------------- memory only

/// A transaction retried with its token inside 10 minutes succeeds as the
/// first did; after that the token is forgotten and the retry meets its
/// own commit (the processor then reads `completed_by`).
pub async fn a_transaction_token_is_honoured_for_ten_minutes(w: &crate::adapters::memory::World) {
    use crate::adapters::dynamodb::conditions as cond;
    use crate::adapters::memory::Fault;
    use crate::adapters::memory::table::{TOKEN_WINDOW_MS, TransactError, Write};
    let l = w.ledger();
    let e = event("token", &body("token"), "send-1");
    assert_eq!(Ledger::claim(&l, &e, &body("token")).await.unwrap(), Claim::New);
    assert!(matches!(l.lease(&e.key, "tok-1", T0, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    // An op of two writes goes as one transaction: its retry after a lost
    // acknowledgement is answered as the success it was.
    let put = |pk: &str| crate::projection::Write::put(pk, crate::item::Item::new()).when("attribute_not_exists(pk)");
    let op = crate::projection::Op::new(
        vec![put("proj#tok-a"), put("proj#tok-b")],
        crate::projection::OnConflict::AlreadyApplied,
    );
    w.inject("work.apply", 0, Some(1), Fault::LoseAckOnce);
    assert!(
        matches!(l.apply(&e.key, "tok-1", &op, T0).await.unwrap(), crate::ledger::Applied::Written { .. }),
        "the retry with the same token is answered as the success it was"
    );
    // A new request meets the event's own puts (stamped): recognised.
    assert_eq!(
        l.apply(&e.key, "tok-1", &op, T0).await.unwrap(),
        crate::ledger::Applied::Written { outbox: vec![] },
        "its own"
    );
    // The completion alone is one conditional update: its retry after a lost
    // acknowledgement meets its own write, which `completed_by` tells.
    w.inject("work.commit", 0, Some(1), Fault::LoseAckOnce);
    assert_eq!(l.commit(&e.key, "tok-1", &[], "applied", None, T0).await.unwrap(), CommitResult::Fenced);
    assert_eq!(l.completed_by(&e.key).await.unwrap().as_deref(), Some("tok-1"));
    // The table's own rules: same token and request inside the window
    // succeeds without writing; after it, the request is evaluated again;
    // another request under a used token is refused.
    let e2 = event("token-2", &body("token-2"), "send-1");
    assert_eq!(Ledger::claim(&l, &e2, &body("token-2")).await.unwrap(), Claim::New);
    assert!(matches!(l.lease(&e2.key, "tok-1", T0, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    let complete = [Write::update(e2.key.as_str(), "meta", &cond::complete("tok-1", "applied", None, T0, 0))];
    let mut st = w.state();
    assert_eq!(st.table.transact(&complete, Some("t"), T0), Ok(()));
    assert_eq!(st.table.transact(&complete, Some("t"), T0 + TOKEN_WINDOW_MS - 1), Ok(()), "remembered");
    let other = [Write::update(e2.key.as_str(), "meta", &cond::note_duplicate())];
    assert_eq!(st.table.transact(&other, Some("t"), T0 + 1), Err(TransactError::TokenReused));
    assert!(
        matches!(st.table.transact(&complete, Some("t"), T0 + TOKEN_WINDOW_MS), Err(TransactError::Cancelled(_))),
        "forgotten after 10 minutes: evaluated again, and fenced by its own completion"
    );
}

/// With index lag on, the due index shows a new record only once it
/// settles; reads by key are current.
pub async fn the_indexes_may_lag_the_table(w: &crate::adapters::memory::World) {
    let l = w.ledger();
    w.state().table.set_index_lag(true);
    let e = event("lag", &body("lag"), "send-1");
    assert_eq!(Ledger::claim(&l, &e, &body("lag")).await.unwrap(), Claim::New);
    let up_to = T0 + REDRIVE_GRACE_MS;
    assert!(DueLedger::due(&l, DuePartition::Records, 0, up_to, 10, None).await.unwrap().items.is_empty());
    assert!(matches!(l.lease(&e.key, "tok-1", T0, 30_000).await.unwrap(), LeaseResult::Leased(_)), "by key: current");
    w.state().table.settle();
    let page = DueLedger::due(&l, DuePartition::Records, 0, up_to, 10, None).await.unwrap();
    let [Due::Record(r)] = &page.items[..] else { panic!("{page:?}") };
    assert_eq!(r.status, Status::Processing, "the batch read behind the index is current");
}

/// The state store: a projection reads, by key and strongly consistent,
/// what the commit wrote (every kind of value back as written, the keys
/// included), nothing for a key never written, and a typed read decodes it
/// (a stored item its type cannot read is a permanent error).
pub async fn projection_state_is_read_by_key_as_the_commit_wrote_it<B: Backend>(b: &B) {
    use crate::projection::sequence::{apply_next, stream_key};
    let (l, e) = leased(b, "state-read", "tok-1").await;
    assert_eq!(StateStore::read(&l, "proj#read#t1#a", crate::projection::STATE_SK).await.unwrap(), None);
    let attrs = Item::from([
        ("count".into(), num_value(-3)),
        ("name".into(), str_value("café")),
        ("flag".into(), Value::Bool(true)),
        ("list".into(), Value::L(vec![num_value(1), str_value("x")])),
        ("map".into(), Value::M(Item::from([("k".into(), str_value("v"))]))),
    ]);
    let put = Op::new(vec![Write::put("proj#read#t1#a", attrs.clone())], OnConflict::Stale);
    let seq = apply_next("proj#read#t1#stream", 1, "on_hand", 5, Item::new());
    let CommitResult::Committed { .. } = l.commit(&e.key, "tok-1", &[put, seq], "applied", None, T0).await.unwrap()
    else {
        panic!("our lease commits")
    };
    let mut want = attrs;
    want.insert("applied_by".into(), str_value(e.key.as_str()));
    want.insert("pk".into(), str_value("proj#read#t1#a"));
    want.insert("sk".into(), str_value(crate::projection::STATE_SK));
    let read = StateStore::read(&l, "proj#read#t1#a", crate::projection::STATE_SK).await.unwrap();
    assert_eq!(read, Some(want), "read back as written");
    let cx = ProjectionContext::new(std::sync::Arc::new(l.clone()), 1, 30);
    let stream = cx.read(&stream_key("proj#read#t1#stream")).await.unwrap();
    assert_eq!(stream.and_then(|s| s.last_seq), Some(1), "typed");
    assert!(!cx.exists(&stream_key("proj#read#t1#none")).await.unwrap());
    b.put(Item::from([
        ("pk".into(), str_value("proj#read#t1#bad")),
        ("sk".into(), str_value(crate::projection::STATE_SK)),
        ("last_seq".into(), str_value("seven")),
    ]))
    .await;
    let bad = cx.read(&stream_key("proj#read#t1#bad")).await;
    assert!(matches!(bad, Err(ProjectionError::Permanent(_))), "{bad:?}");
}

/// An op is written on its own before the completion, guarded by its own
/// conditions and not by the lease: one write as one conditional request
/// (put, update, delete), several writes or outbox items as one
/// transaction that stands or falls whole; a failed condition writes
/// nothing and says so.
pub async fn an_op_is_written_on_its_own_guarded_by_its_conditions<B: Backend>(b: &B) {
    use crate::ledger::Applied;
    let (l, e) = leased(b, "apply", "tok-1").await;
    let st = crate::projection::STATE_SK;
    let put = |pk: &str, v: i64| {
        Op::new(
            vec![
                Write::put(pk, Item::from([("v".into(), num_value(v))]))
                    .when("attribute_not_exists(pk) OR v < :v")
                    .value(":v", num_value(v)),
            ],
            OnConflict::Stale,
        )
    };
    assert_eq!(l.apply(&e.key, "tok-1", &put("proj#ap#a", 2), T0).await.unwrap(), Applied::Written { outbox: vec![] });
    // Its repeat meets its own put (stamped `applied_by`): recognised, not
    // a conflict; another event's same write is refused.
    assert_eq!(l.apply(&e.key, "tok-2", &put("proj#ap#a", 2), T0).await.unwrap(), Applied::Written { outbox: vec![] });
    let other = EventKey::new("stripe", "contract", "apply-other");
    assert_eq!(l.apply(&other, "tok-9", &put("proj#ap#a", 2), T0).await.unwrap(), Applied::Conflict, "stale");
    let by = b.get("proj#ap#a", st).await.and_then(|i| i.get("applied_by").and_then(|v| v.as_str().map(str::to_owned)));
    assert_eq!(by.as_deref(), Some(e.key.as_str()));
    // Not fenced by the lease: a worker whose lease was taken over writes
    // what its condition allows (the same as the owner's, or nothing).
    assert_eq!(
        l.apply(&e.key, "tok-old", &put("proj#ap#a", 3), T0).await.unwrap(),
        Applied::Written { outbox: vec![] }
    );
    assert_eq!(b.get("proj#ap#a", st).await.and_then(|i| i.get("v").and_then(Value::as_i64)), Some(3));
    let add = Op::new(
        vec![
            Write::update("proj#ap#a", "ADD v :d").when("v = :at").value(":d", num_value(1)).value(":at", num_value(3)),
        ],
        OnConflict::Replan,
    );
    assert_eq!(l.apply(&e.key, "tok-1", &add, T0).await.unwrap(), Applied::Written { outbox: vec![] });
    assert_eq!(l.apply(&e.key, "tok-1", &add, T0).await.unwrap(), Applied::Conflict);
    let gone = Op::new(vec![Write::delete("proj#ap#a").when("v = :at").value(":at", num_value(4))], OnConflict::Stale);
    assert_eq!(l.apply(&e.key, "tok-1", &gone, T0).await.unwrap(), Applied::Written { outbox: vec![] });
    assert_eq!(b.get("proj#ap#a", st).await, None);
    // Two writes stand or fall together.
    b.put(Item::from([("pk".into(), str_value("proj#ap#taken")), ("sk".into(), str_value(st))])).await;
    let new = |pk: &str| Write::put(pk, Item::new()).when("attribute_not_exists(pk)");
    let both = Op::new(vec![new("proj#ap#b"), new("proj#ap#taken")], OnConflict::AlreadyApplied);
    assert_eq!(l.apply(&e.key, "tok-1", &both, T0).await.unwrap(), Applied::Conflict);
    assert_eq!(b.get("proj#ap#b", st).await, None, "nothing of a refused op");
    // With a notification: the op and its outbox item, claimed by the lease.
    let msg = OutboxMessage {
        topic_arn: "arn:aws:sns:us-east-1:000000000000:t.fifo".into(),
        delivery: None,
        action: "ap.changed".into(),
        group: "acct_1".into(),
        body: serde_json::json!({"n": 1}),
    };
    let noted = Op::new(vec![new("proj#ap#c")], OnConflict::Stale).notify(msg);
    let Applied::Written { outbox } = l.apply(&e.key, "tok-1", &noted, T0).await.unwrap() else {
        panic!("written with its notification")
    };
    assert_eq!(outbox, [crate::message::outbox_id(e.key.as_str(), "ap.changed")]);
    let index_of = |i: Option<Item>| {
        let i = i.expect("the outbox item");
        (i.get("due_shard").and_then(|v| v.as_str().map(str::to_owned)), i.get("due_at").and_then(Value::as_i64))
    };
    assert_eq!(
        index_of(b.get(&outbox[0], "outbox").await),
        (None, None),
        "out of the index: sent before the completion"
    );
    assert_eq!(
        l.apply(&e.key, "tok-2", &noted, T0).await.unwrap(),
        Applied::Written { outbox: vec![] },
        "its own state met again: its notification is there already, not written twice"
    );
    let lapse = T0 + crate::message::DISPATCH_LEASE_MS;
    let (partition, due) = index_of(b.get(&outbox[0], "outbox").await);
    assert!(partition.as_deref().is_some_and(|p| p.starts_with("out#")), "{partition:?}");
    assert_eq!(due, Some(lapse), "the attempt that wrote it died: the sweep's once its claim lapses");
    let o = b.outbox();
    assert_eq!(
        o.claim(&outbox[0], "d-1", T0, T0 + 30_000).await.unwrap(),
        OutboxClaim::Skipped,
        "claimed by the lease"
    );
    // An outbox item alone (a route's delivery): one conditional put.
    let mut delivery = noted.outbox[0].clone();
    delivery.action = "ap.delivered".into();
    let alone = Op { outbox: vec![delivery], ..Op::new(Vec::new(), OnConflict::AlreadyApplied) };
    let Applied::Written { outbox: one } = l.apply(&e.key, "tok-1", &alone, T0).await.unwrap() else {
        panic!("written alone")
    };
    assert_eq!(one, [crate::message::outbox_id(e.key.as_str(), "ap.delivered")]);
    assert_eq!(index_of(b.get(&one[0], "outbox").await), (None, None));
    assert_eq!(l.apply(&e.key, "tok-2", &alone, T0).await.unwrap(), Applied::Conflict, "once, whoever writes it");
    assert_eq!(index_of(b.get(&one[0], "outbox").await).1, Some(lapse), "kept for the sweep by the retry");
    // A notification not sent goes into the index once, its back-off's time
    // kept; a sent one stays out of it.
    let shard = e.key.shard(WorkLedger::shards(&l));
    let mut unsent = noted.outbox[0].clone();
    unsent.action = "ap.failed".into();
    let failing = Op { outbox: vec![unsent], ..Op::new(Vec::new(), OnConflict::AlreadyApplied) };
    let Applied::Written { outbox: failed } = l.apply(&e.key, "tok-1", &failing, T0).await.unwrap() else { panic!() };
    o.back_off(&failed[0], "tok-1", T0 + 99, "publish failed", T0).await.unwrap();
    l.keep_for_sweep(&failed[0], shard, lapse).await.unwrap();
    l.keep_for_sweep(&failed[0], shard, lapse + 5).await.unwrap();
    assert_eq!(index_of(b.get(&failed[0], "outbox").await).1, Some(T0 + 99), "its back-off's time, once");
    let mut sent = noted.outbox[0].clone();
    sent.action = "ap.sent".into();
    let sending = Op { outbox: vec![sent], ..Op::new(Vec::new(), OnConflict::AlreadyApplied) };
    let Applied::Written { outbox: done } = l.apply(&e.key, "tok-1", &sending, T0).await.unwrap() else { panic!() };
    o.mark_sent(&done[0], "tok-1", None, T0).await.unwrap();
    l.keep_for_sweep(&done[0], shard, lapse).await.unwrap();
    assert_eq!(index_of(b.get(&done[0], "outbox").await), (None, None), "sent: never in the index");
    // The record is untouched until its completion.
    assert_eq!(text(&row(&l, &e.key).await, "status"), Some("PROCESSING"));
}

/// `activity_mark` and `sweep_record`: a note marks its window (found by a
/// look back that reaches the window, not by one that starts after it);
/// the last sweep is kept, a later one replaces it, an earlier one (a
/// retry, a slower run) does not.
pub async fn activity_is_marked_by_window_and_the_last_sweep_kept<B: Backend>(b: &B) {
    use crate::ledger::{ACTIVITY_WINDOW_MS, Attention, Sweep};
    use crate::ports::Activity;
    let l = b.ledger(7);
    // Far from every other scenario's time: the marks of a shared table
    // stay apart.
    let at = T0 + 400 * ACTIVITY_WINDOW_MS + 1_000;
    assert!(!l.active_since(at - 3 * ACTIVITY_WINDOW_MS).await.unwrap(), "nothing noted yet");
    l.note_activity(at).await;
    l.note_activity(at + 1).await;
    assert!(l.active_since(at - 3 * ACTIVITY_WINDOW_MS).await.unwrap());
    assert!(l.active_since(at).await.unwrap(), "its own window");
    assert!(!l.active_since(at + ACTIVITY_WINDOW_MS).await.unwrap(), "not a later window");
    let mark = b.get("activity", &format!("mark#{:013}", at - at % ACTIVITY_WINDOW_MS)).await.expect("the mark");
    assert_eq!(mark.get("marked_at").and_then(Value::as_i64), Some(at), "one write per container and window");

    let sweep = |at_ms: i64, quiet: bool, dead: u64| Sweep {
        at_ms,
        quiet,
        attention: Attention { dead_letters: dead, parked: 1, outbox_dead: 2 },
    };
    l.record_sweep(&sweep(at, true, 3)).await.unwrap();
    assert_eq!(l.last_sweep().await.unwrap(), Some(sweep(at, true, 3)));
    l.record_sweep(&sweep(at - 1, false, 9)).await.unwrap();
    assert_eq!(l.last_sweep().await.unwrap(), Some(sweep(at, true, 3)), "an earlier run's is not kept");
    l.record_sweep(&sweep(at + 1, false, 4)).await.unwrap();
    assert_eq!(l.last_sweep().await.unwrap(), Some(sweep(at + 1, false, 4)));
}

/// `due_cursors`, and the due index's entries: a completion leaves its
/// record's entry where it was; a page lists every entry it read, in index
/// order, each with the item read at it; a page starts after a place or at
/// a time. The places kept are a later run's, never an earlier one's; a
/// run's own retry writes the same again.
pub async fn a_finished_records_entry_stays_and_the_places_are_kept<B: Backend>(b: &B) {
    use crate::ledger::{DueCursor, DueCursors};
    let l = b.ledger(7);
    // Far from every other scenario's time: the entries of a shared table stay apart.
    let base = T0 + 500 * 300_000;
    let mut keys = Vec::new();
    for (i, name) in ["place-a", "place-b", "place-c"].into_iter().enumerate() {
        let mut e = event(name, &body(name), "send-1");
        e.received_at_ms = base + i as i64;
        assert_eq!(Ledger::claim(&l, &e, &body(name)).await.unwrap(), Claim::New);
        keys.push(e.key);
    }
    assert!(matches!(l.lease(&keys[1], "tok-b", base + 10, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    let done = l.commit(&keys[1], "tok-b", &[], "applied", None, base + 20).await.unwrap();
    assert!(matches!(done, CommitResult::Committed { .. }), "{done:?}");
    let up_to = base + REDRIVE_GRACE_MS + 10;
    let pks = |p: &crate::ledger::DuePage| -> Vec<String> { p.entries.iter().map(|e| e.place.pk.clone()).collect() };
    let all: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
    let page = l.due(DuePartition::Records, 0, up_to, 10, Some(&DueCursor::from_ms(base))).await.unwrap();
    assert_eq!(pks(&page), all, "every entry, in index order");
    let statuses: Vec<Status> = page
        .entries
        .iter()
        .map(|e| match &page.items[e.item.expect("read")] {
            Due::Record(r) => r.status,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(statuses, [Status::Received, Status::Processed, Status::Received], "the finished one stays");
    assert_eq!(page.entries[1].place.due_at_ms, base + 1 + REDRIVE_GRACE_MS, "where its claim put it");
    let after = l.due(DuePartition::Records, 0, up_to, 10, Some(&page.entries[0].place)).await.unwrap();
    assert_eq!(pks(&after), all[1..], "after a place: the entries that follow it");
    let from = DueCursor::from_ms(base + 2 + REDRIVE_GRACE_MS);
    assert_eq!(pks(&l.due(DuePartition::Records, 0, up_to, 10, Some(&from)).await.unwrap()), all[2..]);
    let past = DueCursor::from_ms(up_to + 1);
    assert!(l.due(DuePartition::Records, 0, up_to, 10, Some(&past)).await.unwrap().entries.is_empty());

    assert_eq!(l.due_cursors().await.unwrap(), DueCursors::default(), "none kept yet");
    let kept = DueCursors {
        shards: std::collections::BTreeMap::from([
            (0, page.entries[1].place.clone()),
            (3, DueCursor { due_at_ms: base, pk: "evt#x#y#z".into(), sk: "meta".into() }),
        ]),
        rewound_at_ms: Some(base),
        at_ms: base + 100,
    };
    l.keep_due_cursors(&kept).await.unwrap();
    assert_eq!(l.due_cursors().await.unwrap(), kept);
    b.ledger(7).keep_due_cursors(&kept).await.unwrap();
    assert_eq!(l.due_cursors().await.unwrap(), kept, "its own retry");
    let earlier = DueCursors { at_ms: base + 99, ..DueCursors::default() };
    l.keep_due_cursors(&earlier).await.unwrap();
    assert_eq!(l.due_cursors().await.unwrap(), kept, "an earlier run's are not kept");
    let later = DueCursors { at_ms: base + 101, rewound_at_ms: Some(base), ..kept.clone() };
    l.keep_due_cursors(&later).await.unwrap();
    assert_eq!(l.due_cursors().await.unwrap(), later);
}

/// `drop_payload`: a PROCESSED record of the `drop_after` policy loses its
/// payload once, whether the record carried it or its item beside it; the
/// record, its hashes and `payload_stored` stay, and its retry meets the
/// note. A record not finished, or of another policy, keeps its payload.
/// Deliveries are settled when every one is SENT or was never made.
pub async fn a_finished_records_payload_is_dropped_once_under_drop_after<B: Backend>(b: &B) {
    use crate::ledger::{DueCursor, Kept};
    let l = b.ledger(seed("drop"));
    // Far from every other scenario's time: the entries of a shared table stay apart.
    let base = T0 + 600 * 300_000;
    let drop_after = Some(Kept { policy: "drop_after", verified_hash: None });
    let up_to = base + REDRIVE_GRACE_MS + 10;
    let drop_of = |page: &crate::ledger::DuePage, key: &EventKey| {
        page.items.iter().find_map(|d| match d {
            Due::Record(r) if &r.key == key => Some(r.drop.clone()),
            _ => None,
        })
    };
    for (name, bytes) in [("drop-small", body("drop-small")), ("drop-large", large_body("drop-large"))] {
        let mut e = event(name, &bytes, "send-1");
        e.received_at_ms = base;
        e.kept.clone_from(&drop_after);
        assert_eq!(Ledger::claim(&l, &e, &bytes).await.unwrap(), Claim::New);
        let page = l.due(DuePartition::Records, 0, up_to, 100, Some(&DueCursor::from_ms(base))).await.unwrap();
        assert_eq!(drop_of(&page, &e.key), Some(None), "{name}: not finished, nothing to drop");
        if name == "drop-small" {
            // (A payload beside its record is deleted before the condition is
            // met: the port is given only what a PROCESSED record says.)
            let early =
                crate::ledger::PayloadDrop { hash: e.payload_hash.clone(), inline: true, processed_at_ms: base };
            assert!(!l.drop_payload(&e.key, &early, base + 1).await.unwrap(), "RECEIVED keeps its payload");
            assert!(b.get(e.key.as_str(), "meta").await.expect("record").contains_key("body"));
        }
        assert!(matches!(l.lease(&e.key, "tok-1", base + 10, 30_000).await.unwrap(), LeaseResult::Leased(_)));
        let done = l.commit(&e.key, "tok-1", &[], "applied", None, base + 20).await.unwrap();
        assert!(matches!(done, CommitResult::Committed { .. }), "{done:?}");
        let page = l.due(DuePartition::Records, 0, up_to, 100, Some(&DueCursor::from_ms(base))).await.unwrap();
        let drop = drop_of(&page, &e.key).flatten().unwrap_or_else(|| panic!("{name}: its payload to drop"));
        assert_eq!(
            (drop.hash.as_str(), drop.inline, drop.processed_at_ms),
            (e.payload_hash.as_str(), name == "drop-small", base + 20)
        );
        assert!(l.drop_payload(&e.key, &drop, base + 30).await.unwrap(), "{name}: dropped");
        assert!(b.ledger(seed("drop")).drop_payload(&e.key, &drop, base + 30).await.unwrap(), "{name}: its own retry");
        let record = b.get(e.key.as_str(), "meta").await.expect("the record stays");
        assert!(!record.contains_key("body") && !record.contains_key("enc"), "{name}: {record:?}");
        let text = |k: &str| record.get(k).and_then(Value::as_str);
        assert_eq!(text("payload_hash"), Some(e.payload_hash.as_str()), "{name}: its hash stays");
        assert_eq!(text("status"), Some("PROCESSED"));
        assert!(record.contains_key("payload_dropped_at") && record.contains_key("payload_stored"), "{record:?}");
        let item = crate::adapters::dynamodb::payload_sk(&e.payload_hash);
        assert!(b.get(e.key.as_str(), &item).await.is_none(), "{name}: no payload item left");
        assert!(l.payload(&e.key, &e.payload_hash).await.unwrap().is_none());
        let page = l.due(DuePartition::Records, 0, up_to, 100, Some(&DueCursor::from_ms(base))).await.unwrap();
        assert_eq!(drop_of(&page, &e.key), Some(None), "{name}: nothing left to drop");
        let mut later = event(name, &bytes, "send-2");
        later.received_at_ms = base + 40;
        later.kept.clone_from(&drop_after);
        let again = Ledger::claim(&l, &later, &bytes).await.unwrap();
        assert!(again != Claim::New, "{name}: a later delivery is not new: {again:?}");
        assert!(b.get(e.key.as_str(), &item).await.is_none(), "{name}: and stores nothing");
        let record = b.get(e.key.as_str(), "meta").await.expect("the record");
        assert!(!record.contains_key("body"), "{name}: and stores nothing in the record");
    }
    // Another policy: kept.
    let mut kept = event("drop-kept", &body("drop-kept"), "send-1");
    kept.received_at_ms = base;
    assert_eq!(Ledger::claim(&l, &kept, &body("drop-kept")).await.unwrap(), Claim::New);
    assert!(matches!(l.lease(&kept.key, "tok-1", base + 10, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    l.commit(&kept.key, "tok-1", &[], "applied", None, base + 20).await.unwrap();
    let page = l.due(DuePartition::Records, 0, up_to, 100, Some(&DueCursor::from_ms(base))).await.unwrap();
    assert_eq!(drop_of(&page, &kept.key), Some(None), "keep: nothing to drop");
    let as_if = crate::ledger::PayloadDrop { hash: kept.payload_hash.clone(), inline: true, processed_at_ms: base };
    assert!(!l.drop_payload(&kept.key, &as_if, base + 30).await.unwrap());
    assert!(b.get(kept.key.as_str(), "meta").await.expect("record").contains_key("body"), "keep keeps");

    // Deliveries: settled when none was made, or each is SENT.
    assert!(l.deliveries_settled(&[]).await.unwrap());
    assert!(l.deliveries_settled(&["outbox#never-made".to_owned()]).await.unwrap());
    let id = one_notification(b, "drop-delivery").await;
    let both = [id.clone(), "outbox#never-made".to_owned()];
    // Written claimed by its committer (SENDING).
    assert!(!l.deliveries_settled(&both).await.unwrap(), "SENDING is not settled");
    b.outbox().mark_sent(&id, "tok-1", None, T0 + 1).await.unwrap();
    assert!(l.deliveries_settled(&both).await.unwrap(), "SENT");
}

/// Erasure ([`crate::sealing`]): an event's data key is made once (a
/// second claim, or our own retried write, gets the first); subjects are
/// noted and listed. An erasure destroys the key (a tombstone a later
/// claim meets), deletes the payload item, removes the record's own copy
/// and subject and notes who erased it, with its audit entry, in one
/// write; only a finished record; its own retry is `Erased`, another's
/// `AlreadyErased`. An erased DEAD record is not replayed.
pub async fn a_data_key_is_made_once_and_an_erasure_destroys_it_and_marks_the_finished_record_once<B: Backend>(b: &B) {
    use crate::ledger::Erasure;
    use crate::ports::PayloadKeys;
    use crate::sealing::{DataKey, KeyState};
    let keys = b.keys();
    let l = b.ledger(seed("erase"));
    let (first, second) = (DataKey::generate().unwrap(), DataKey::generate().unwrap());
    let e = event("erase-small", &body("erase-small"), "send-1");
    assert_eq!(keys.key_of(&e.key).await.unwrap(), KeyState::Missing);
    assert_eq!(keys.key_for(&e.key, &first, e.expires_at).await.unwrap(), KeyState::Live(first.clone()));
    assert_eq!(keys.key_for(&e.key, &second, e.expires_at).await.unwrap(), KeyState::Live(first.clone()), "the first");
    assert_eq!(keys.key_of(&e.key).await.unwrap(), KeyState::Live(first.clone()));

    // Finished records, sealed: small (in the record), large (beside it), and DEAD.
    let mut finished = Vec::new();
    for (name, bytes, dead) in [
        ("erase-small", body("erase-small"), false),
        ("erase-large", large_body("erase-large"), false),
        ("erase-dead", body("erase-dead"), true),
    ] {
        let e = event(name, &bytes, "send-1");
        let KeyState::Live(key) = keys.key_for(&e.key, &DataKey::generate().unwrap(), e.expires_at).await.unwrap()
        else {
            panic!("{name}: a key")
        };
        let sealed = crate::sealing::seal(&key, &e.key, &bytes);
        assert_eq!(Ledger::claim(&l, &e, &sealed).await.unwrap(), Claim::New);
        assert!(matches!(l.lease(&e.key, "tok-1", T0 + 10, 30_000).await.unwrap(), LeaseResult::Leased(_)));
        if dead {
            assert!(l.leave(&e.key, "tok-1", &Exit::Dead { reason: "r", message: "m" }, T0 + 20).await.unwrap());
        } else {
            let done = l.commit(&e.key, "tok-1", &[], "applied", Some("cus_erase"), T0 + 20).await.unwrap();
            assert!(matches!(done, CommitResult::Committed { .. }), "{done:?}");
        }
        keys.index_subject("cus_erase", &e.key, e.expires_at).await.unwrap();
        finished.push(e);
    }
    let mut noted = keys.subject_events("cus_erase").await.unwrap();
    noted.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    let mut want: Vec<EventKey> = finished.iter().map(|e| e.key.clone()).collect();
    want.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    assert_eq!(noted, want);

    // In flight: left alone.
    let open = event("erase-open", &body("erase-open"), "send-1");
    assert_eq!(Ledger::claim(&l, &open, &body("erase-open")).await.unwrap(), Claim::New);
    let entry = by("ops", "subject asked");
    assert_eq!(
        l.erase(&open.key, &open.payload_hash, &entry, T0 + 30).await.unwrap(),
        Erasure::NotFinished(Status::Received)
    );
    assert!(b.get(open.key.as_str(), "meta").await.expect("record").contains_key("body"), "its payload stays");
    let nobody = EventKey::new("stripe", "ep", "erase-nobody");
    assert_eq!(l.erase(&nobody, "h", &entry, T0 + 30).await.unwrap(), Erasure::Missing);

    for e in &finished {
        keys.destroy(&e.key, "ops", T0 + 30, e.expires_at).await.unwrap();
        keys.destroy(&e.key, "someone else", T0 + 31, e.expires_at).await.unwrap();
        assert_eq!(keys.key_of(&e.key).await.unwrap(), KeyState::Erased { at_ms: T0 + 30, by: "ops".into() });
        let again = keys.key_for(&e.key, &DataKey::generate().unwrap(), e.expires_at).await.unwrap();
        assert!(matches!(again, KeyState::Erased { .. }), "a later claim meets the tombstone: {again:?}");

        // Two ledgers of one seed draw the same token: the second is our own retry.
        let mine = || b.ledger(seed(e.key.as_str()));
        assert_eq!(mine().erase(&e.key, &e.payload_hash, &entry, T0 + 40).await.unwrap(), Erasure::Erased);
        let retry = mine().erase(&e.key, &e.payload_hash, &entry, T0 + 40).await.unwrap();
        assert_eq!(retry, Erasure::Erased, "its own retry");
        let other = b.ledger(seed("erase-other")).erase(&e.key, &e.payload_hash, &entry, T0 + 50).await.unwrap();
        assert_eq!(other, Erasure::AlreadyErased);
        let record = b.get(e.key.as_str(), "meta").await.expect("the record stays");
        for gone in ["body", "enc", "subject"] {
            assert!(!record.contains_key(gone), "{}: {gone} left: {record:?}", e.key);
        }
        let text = |k: &str| record.get(k).and_then(Value::as_str);
        assert_eq!(text("payload_hash"), Some(e.payload_hash.as_str()), "its hash stays");
        assert_eq!(text("erased_by"), Some("ops"));
        assert_eq!(text("erase_reason"), Some("subject asked"));
        assert!(record.contains_key("erased_at") && record.contains_key("payload_stored"), "{record:?}");
        let item = crate::adapters::dynamodb::payload_sk(&e.payload_hash);
        assert!(b.get(e.key.as_str(), &item).await.is_none(), "no payload item left");
        assert!(l.payload(&e.key, &e.payload_hash).await.unwrap().is_none());
        let (_, history, _) = l.show(&e.key, false).await.unwrap().expect("shown");
        assert!(
            history.iter().any(|h| h.get("audit_verb").and_then(serde_json::Value::as_str) == Some("erase")),
            "{history:?}"
        );
    }
    let dead = &finished[2];
    let replay = l.transition(&dead.key, OperatorAction::Replay, &entry, T0 + 60).await.unwrap();
    assert_eq!(replay, crate::ledger::Transitioned::Refused(Status::Dead), "an erased record is not replayed");

    for e in &finished {
        keys.forget_subject("cus_erase", &e.key).await.unwrap();
    }
    assert!(keys.subject_events("cus_erase").await.unwrap().is_empty());
}

/// `operator_replay_in_run`: a replay in a bulk run marks its record with
/// the run and is refused on a record the run already replayed (an
/// interrupted run, run again, replays nothing twice); another run, or a
/// plain replay, still may. Records and delivery items are read by key in
/// batches, only those that exist, without payload bytes; the last audit's
/// summary is kept per endpoint.
pub async fn a_replay_in_a_run_is_refused_on_what_the_run_replayed_and_records_are_read_by_key<B: Backend>(b: &B) {
    use crate::ports::{BackfillLedger, OperatorLedger, OutboxStore};
    let (l, e) = leased(b, "in-run", "tok-1").await;
    assert!(l.leave(&e.key, "tok-1", &Exit::Dead { reason: "r", message: "m" }, T0).await.unwrap());
    let entry = by("ops", "bulk").in_run("replay-1");
    let done = l.transition(&e.key, OperatorAction::Replay, &entry, T0 + 10).await.unwrap();
    assert!(matches!(done, crate::ledger::Transitioned::Done { .. }), "{done:?}");
    let record = b.get(e.key.as_str(), "meta").await.expect("record");
    assert_eq!(record.get("replay_run").and_then(Value::as_str), Some("replay-1"));
    // It dies again; the same run does not replay it twice, another run may.
    assert!(matches!(l.lease(&e.key, "tok-2", T0 + 20, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    assert!(l.leave(&e.key, "tok-2", &Exit::Dead { reason: "r", message: "m" }, T0 + 30).await.unwrap());
    let again = b.ledger(seed("in-run-again")).transition(&e.key, OperatorAction::Replay, &entry, T0 + 40).await;
    assert_eq!(again.unwrap(), crate::ledger::Transitioned::Refused(Status::Dead), "the same run");
    let other = by("ops", "bulk").in_run("replay-2");
    let done = b.ledger(seed("in-run-other")).transition(&e.key, OperatorAction::Replay, &other, T0 + 50).await;
    assert!(matches!(done.unwrap(), crate::ledger::Transitioned::Done { .. }), "another run");

    let absent = EventKey::new("stripe", "ep", "in-run-absent");
    let rows = l.records(&[e.key.clone(), absent]).await.unwrap();
    assert_eq!(rows.len(), 1, "only what exists");
    assert_eq!(rows[0].get("pk").and_then(serde_json::Value::as_str), Some(e.key.as_str()));
    assert!(!rows[0].contains_key("body"), "no payload bytes");
    let o = b.outbox();
    assert!(o.states(&["outbox#none".to_owned()]).await.unwrap().is_empty());

    assert_eq!(l.last_audit("ep").await.unwrap(), None);
    l.save_audit("ep", r#"{"missing":0}"#, T0).await.unwrap();
    l.save_audit("ep", r#"{"missing":3}"#, T0 + 1).await.unwrap();
    assert_eq!(l.last_audit("ep").await.unwrap().as_deref(), Some(r#"{"missing":3}"#));
}

/// Runs `$run!(scenario)` for every scenario that runs on both backends.
#[macro_export]
macro_rules! contract_scenarios {
    ($run:ident) => {
        $run!(the_claim_is_new_once_and_its_retry_is_ours);
        $run!(the_send_lease_is_taken_once_released_and_ends_with_the_send);
        $run!(a_record_without_its_payload_adopts_one_once);
        $run!(duplicates_and_conflicts_are_counted_on_the_record);
        $run!(the_lease_is_taken_when_leasable_and_recognises_its_retry);
        $run!(the_commit_is_fenced_names_its_conflicts_and_writes_its_outbox);
        $run!(an_op_is_written_on_its_own_guarded_by_its_conditions);
        $run!(activity_is_marked_by_window_and_the_last_sweep_kept);
        $run!(the_exits_are_fenced_and_recognise_their_retries);
        $run!(a_gap_wakes_its_waiter_and_nothing_else);
        $run!(a_parked_waiter_is_due_until_its_predecessor_commits_then_woken_once);
        $run!(a_record_whose_redrive_is_refused_as_invalid_is_dead_unless_a_worker_holds_it);
        $run!(due_items_are_paged_claimed_once_and_rescheduled);
        $run!(a_finished_records_entry_stays_and_the_places_are_kept);
        $run!(a_finished_records_payload_is_dropped_once_under_drop_after);
        $run!(a_data_key_is_made_once_and_an_erasure_destroys_it_and_marks_the_finished_record_once);
        $run!(a_replay_in_a_run_is_refused_on_what_the_run_replayed_and_records_are_read_by_key);
        $run!(the_attention_index_counts_what_needs_an_operator);
        $run!(operator_transitions_leave_only_their_statuses);
        $run!(an_operator_action_and_its_audit_entry_are_one_write_listed_by_time_and_record);
        $run!(outbox_items_are_claimed_sent_backed_off_and_dead_once);
        $run!(backfill_cursors_parked_records_and_their_release);
        $run!(the_work_queue_carries_keys_payloads_and_receive_counts);
        $run!(the_delivery_queue_carries_deliveries_and_drains_in_their_destinations_groups);
        $run!(a_message_received_too_often_moves_to_the_dead_letter_queue);
        $run!(messages_sent_together_arrive_each_in_its_tenants_group);
        $run!(the_admission_path_claims_hands_over_and_sends_each_once);
        $run!(a_handshake_secret_is_stored_once_and_never_overwritten);
        $run!(a_routes_delivery_is_committed_claimed_by_the_lease_and_refers_to_its_event);
        $run!(a_deferred_item_gives_its_attempt_back_and_a_circuit_opens_probes_and_closes_once);
        $run!(a_rate_limit_grants_a_step_apart_and_counts_flights_once);
        $run!(a_notification_repeated_once_its_record_is_leased_is_its_next_generation);
        $run!(a_body_is_bound_to_one_identity_and_a_replay_is_flagged_on_its_record);
        $run!(projection_state_is_read_by_key_as_the_commit_wrote_it);
    };
}

/// One `#[tokio::test]` per scenario on the backend `$backend` builds (an
/// expression, awaited inside each test).
#[macro_export]
macro_rules! contract_suite {
    ($backend:expr) => {
        macro_rules! __contract_test {
            ($name:ident) => {
                #[tokio::test]
                async fn $name() {
                    let backend = $backend;
                    $crate::contract::$name(&backend).await;
                }
            };
        }
        $crate::contract_scenarios!(__contract_test);
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::dynamodb::conditions::EXPRESSIONS;
    use crate::adapters::memory::{MemLedger, MemOutbox, MemQueue, World};
    use crate::clock::Ambient;

    /// The memory world as a contract backend.
    pub struct Memory(World);

    impl Memory {
        fn new() -> Self {
            Self(World::new(Ambient::fixed(T0, 1)).with_shards(1))
        }
    }

    impl Backend for Memory {
        type Ledger = MemLedger;
        type Outbox = MemOutbox;

        fn ledger(&self, seed: u64) -> MemLedger {
            self.0.with_ambient(Ambient::fixed(T0, seed)).ledger()
        }

        fn outbox(&self) -> MemOutbox {
            self.0.outbox()
        }

        fn table(&self) -> String {
            "memory".into()
        }

        async fn put(&self, item: Item) {
            self.0.seed(&item);
        }

        async fn get(&self, pk: &str, sk: &str) -> Option<Item> {
            self.0.item(pk, sk)
        }

        type Queue = MemQueue;

        fn queue(&self) -> MemQueue {
            self.0.queue().with_max_receives(MAX_RECEIVES)
        }

        async fn receive(&self, max: usize) -> Vec<Received> {
            self.queue().receive(max)
        }

        async fn dead_letters(&self) -> Vec<EventKey> {
            self.0.queue().dead_keys()
        }

        async fn wait(&self, ms: u64) {
            self.0.advance(std::time::Duration::from_millis(ms));
        }

        type Secrets = crate::adapters::memory::MemSecretStore;
        type Keys = crate::adapters::memory::MemKeys;

        fn keys(&self) -> crate::adapters::memory::MemKeys {
            self.0.keys()
        }

        fn secrets(&self) -> crate::adapters::memory::MemSecretStore {
            crate::adapters::memory::MemSecretStore::default()
        }

        type Deliveries = crate::adapters::memory::MemDeliveries;

        fn deliveries(&self) -> crate::adapters::memory::MemDeliveries {
            self.0.deliveries()
        }

        async fn receive_deliveries(&self, max: usize) -> Vec<(crate::ports::DeliveryMessage, Option<String>)> {
            self.0.deliveries().receive_grouped(max).into_iter().map(|(m, g)| (m, Some(g))).collect()
        }
    }

    contract_suite!(Memory::new());

    #[tokio::test]
    async fn a_transaction_token_is_honoured_for_ten_minutes() {
        super::a_transaction_token_is_honoured_for_ten_minutes(&World::new(Ambient::fixed(T0, 1)).with_shards(1)).await;
    }

    #[tokio::test]
    async fn the_indexes_may_lag_the_table() {
        super::the_indexes_may_lag_the_table(&World::new(Ambient::fixed(T0, 1)).with_shards(1)).await;
    }

    /// Every expression a port sends is exercised by some scenario.
    #[tokio::test]
    async fn every_condition_expression_is_exercised() {
        let mut seen = std::collections::BTreeSet::new();
        macro_rules! run {
            ($name:ident) => {
                let m = Memory::new();
                super::$name(&m).await;
                seen.extend(m.0.state().exercised.iter().copied());
            };
        }
        contract_scenarios!(run);
        let table_upgrade = ["migrate_attention", "migrate_due_partition"];
        let missing: Vec<&str> =
            EXPRESSIONS.iter().copied().filter(|e| !seen.contains(e) && !table_upgrade.contains(e)).collect();
        assert!(missing.is_empty(), "expressions no scenario exercises: {missing:?}");
        let unknown: Vec<&str> = seen.iter().copied().filter(|e| !EXPRESSIONS.contains(e)).collect();
        assert!(unknown.is_empty(), "expressions missing from the list: {unknown:?}");
    }
}
