//! The dispatcher on the memory world (`adapters::memory`).

use super::*;
use crate::adapters::memory::{MemOutbox, MemPublisher, OutboxView, Published, World};
use crate::backoff::Backoff;
use crate::clock::Ambient;

// The statuses as the DynamoDB adapter writes them.
const PENDING: &str = "PENDING";
const SENDING: &str = "SENDING";
const SENT: &str = "SENT";
const DEAD: &str = "DEAD";

const NOW: i64 = 1_700_000_000_000;
const GRACE: i64 = 60_000;
const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:entitlements";

// ------------------------------------------------------------------- the world

/// A PENDING item as the processor's commit writes it, due at `due_at`.
fn pending(key: &str, shard: u32, due_at: i64) -> OutboxView {
    OutboxView::pending(key, TOPIC, shard, due_at)
}

/// Claimed by another dispatcher until `until`, after `attempts` claims.
fn sending(key: &str, shard: u32, until: i64, attempts: u32) -> OutboxView {
    OutboxView {
        status: SENDING.into(),
        token: Some("another-dispatcher".into()),
        until: Some(until),
        attempts,
        ..pending(key, shard, until)
    }
}

fn call_of(item: &OutboxView) -> Published {
    Published {
        topic_arn: item.topic_arn.clone(),
        body: item.body.clone(),
        idempotency_key: item.idempotency_key.clone(),
        group: item.group.clone(),
        ok: true,
    }
}

const POLICY: DispatchPolicy =
    DispatchPolicy { backoff: Backoff { base_ms: 1_000, max_ms: 60_000 }, max_attempts: 3, delivery_bound_ms: 600_000 };

fn dispatcher() -> (MemOutbox, MemPublisher, Dispatcher<MemOutbox, MemPublisher>) {
    let w = World::new(Ambient::fixed(NOW, 3));
    let (store, publisher) = (w.outbox(), w.publisher());
    let d = Dispatcher::with_ports(store.clone(), publisher.clone()).with_policy(POLICY);
    (store, publisher, d)
}

// ------------------------------------------------------------------- dispatch

#[tokio::test]
async fn a_due_item_is_published_once_with_its_key_topic_group_and_body_and_marked_sent() {
    let (store, publisher, d) = dispatcher();
    let item = pending("k1", 3, NOW);
    store.put("outbox#k1", &item);

    assert_eq!(d.dispatch("outbox#k1", NOW).await.unwrap(), Dispatched::Published);

    assert_eq!(publisher.attempts(), vec![call_of(&item)]);
    let sent = store.get("outbox#k1");
    assert_eq!((sent.status.as_str(), sent.attempts, sent.sent_at), (SENT, 1, Some(NOW)));
    assert_eq!((sent.due_at, sent.until), (None, None), "a SENT item leaves the due index: {sent:?}");
    // Any later dispatch (processor, sweeper) leaves it alone.
    assert_eq!(d.dispatch("outbox#k1", NOW + 10 * DISPATCH_LEASE_MS).await.unwrap(), Dispatched::Skipped);
    assert_eq!(publisher.attempts().len(), 1);
}

#[tokio::test]
async fn claimed_not_yet_due_sent_dead_and_unknown_items_are_skipped_without_publishing() {
    let (store, publisher, d) = dispatcher();
    let items = [
        // The claim lapses only once `dispatch_until < now`.
        ("outbox#live", sending("live", 0, NOW, 1)),
        ("outbox#later", pending("later", 0, NOW + 1)),
        (
            "outbox#sent",
            OutboxView {
                status: SENT.into(),
                due_at: None,
                due_shard: None,
                sent_at: Some(NOW - 5),
                ..pending("sent", 0, 0)
            },
        ),
        (
            "outbox#dead",
            OutboxView { status: DEAD.into(), due_at: None, due_shard: None, attempts: 3, ..pending("dead", 0, 0) },
        ),
    ];
    for (id, item) in &items {
        store.put(id, item);
    }
    for (id, item) in &items {
        assert_eq!(d.dispatch(id, NOW).await.unwrap(), Dispatched::Skipped, "{id}");
        assert_eq!(&store.get(id), item, "{id} unchanged");
    }
    assert_eq!(d.dispatch("outbox#nothing", NOW).await.unwrap(), Dispatched::Skipped);
    assert!(publisher.attempts().is_empty(), "{:?}", publisher.attempts());
}

#[tokio::test]
async fn a_failed_publish_puts_the_item_back_due_after_half_to_all_of_the_backoff() {
    let (store, publisher, d) = dispatcher();
    publisher.fail_all();
    for i in 0..40 {
        let id = format!("outbox#k{i}");
        store.put(&id, &pending(&format!("k{i}"), 0, NOW));
        match d.dispatch(&id, NOW).await.unwrap() {
            Dispatched::Retrying { attempts: 1, error, .. } => assert!(error.starts_with("sns: "), "{error}"),
            other => panic!("{other:?}"),
        }
        let item = store.get(&id);
        assert_eq!(item.status.as_str(), PENDING);
        assert_eq!(item.until, None);
        assert!(item.last_error.as_deref().is_some_and(|e| e.starts_with("sns: ")), "{item:?}");
        // Attempt 1 failed: base 1 s, jittered down to half at most.
        let delay = item.due_at.unwrap() - NOW;
        assert!((500..=1_000).contains(&delay), "{delay}");
        // Not taken again before it is due.
        assert_eq!(d.dispatch(&id, NOW + delay - 1).await.unwrap(), Dispatched::Skipped);
        // Attempt 2 fails too: 2 s, jittered.
        let at = NOW + delay;
        let next_at_ms = match d.dispatch(&id, at).await.unwrap() {
            Dispatched::Retrying { attempts: 2, error, next_at_ms } if error == "sns: throttled by sns" => next_at_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(Some(next_at_ms), store.get(&id).due_at, "the outcome says when it is due");
        let delay = store.get(&id).due_at.unwrap() - at;
        assert!((1_000..=2_000).contains(&delay), "{delay}");
    }
    assert_eq!(publisher.attempts().len(), 80);
}

#[tokio::test]
async fn the_failure_at_max_attempts_makes_the_item_dead() {
    let (store, publisher, d) = dispatcher();
    publisher.fail_all();
    store.put("outbox#k", &pending("k", 5, NOW));
    let mut now = NOW;
    for attempt in 1..POLICY.max_attempts {
        assert!(
            matches!(d.dispatch("outbox#k", now).await.unwrap(), Dispatched::Retrying { attempts, .. } if attempts == attempt)
        );
        now = store.get("outbox#k").due_at.unwrap();
    }
    match d.dispatch("outbox#k", now).await.unwrap() {
        Dispatched::Dead { attempts: 3, error } => assert_eq!(error, "sns: throttled by sns"),
        other => panic!("{other:?}"),
    }
    let item = store.get("outbox#k");
    assert_eq!((item.status.as_str(), item.due_at, item.dead_at, item.shard), (DEAD, None, Some(now), 5));
    assert_eq!(d.dispatch("outbox#k", now + 100 * DISPATCH_LEASE_MS).await.unwrap(), Dispatched::Skipped);
    assert_eq!(publisher.attempts().len(), 3);
}

#[tokio::test]
async fn an_item_whose_dispatchers_kept_dying_goes_dead_without_publishing() {
    let (store, publisher, d) = dispatcher();
    // Claimed max_attempts times, no outcome recorded, the last claim lapsed.
    store.put("outbox#k", &sending("k", 2, NOW - 1, POLICY.max_attempts));

    assert_eq!(
        d.dispatch("outbox#k", NOW).await.unwrap(),
        Dispatched::Dead { attempts: 4, error: "3 claims without an outcome".into() }
    );
    assert!(publisher.attempts().is_empty());
    let item = store.get("outbox#k");
    assert_eq!((item.status.as_str(), item.attempts, item.due_at), (DEAD, 4, None));
    assert_eq!(item.last_error.as_deref(), Some("3 claims without an outcome"));
}

#[tokio::test]
async fn the_last_allowed_claim_still_publishes() {
    let (store, publisher, d) = dispatcher();
    store.put("outbox#k", &sending("k", 2, NOW - 1, POLICY.max_attempts - 1));

    assert_eq!(d.dispatch("outbox#k", NOW).await.unwrap(), Dispatched::Published);
    assert_eq!(publisher.published().len(), 1);
    assert_eq!((store.status("outbox#k").as_str(), store.get("outbox#k").attempts), (SENT, POLICY.max_attempts));
}

#[tokio::test]
async fn a_claim_that_lapsed_during_the_publish_still_reports_published_and_the_new_owner_republishes() {
    let (store, publisher, d) = dispatcher();
    let item = pending("k", 0, NOW);
    store.put("outbox#k", &item);
    // The publish stalls past the lease; another dispatcher claims the item meanwhile.
    let other = store.clone();
    let takeover = NOW + DISPATCH_LEASE_MS + 1;
    store.0.during("publisher.publish", 0, move |_| {
        let met = other.claim_now("outbox#k", "other", takeover, takeover + DISPATCH_LEASE_MS).unwrap();
        assert!(matches!(met, OutboxClaim::Claimed(_)), "{met:?}");
    });

    assert_eq!(d.dispatch("outbox#k", NOW).await.unwrap(), Dispatched::Published);
    let held = store.get("outbox#k");
    assert_eq!((held.status.as_str(), held.token.as_deref(), held.attempts), (SENDING, Some("other"), 2));

    // The other owner died too; the next dispatch publishes again, with the same key.
    let later = takeover + DISPATCH_LEASE_MS + 1;
    assert_eq!(d.dispatch("outbox#k", later).await.unwrap(), Dispatched::Published);
    assert_eq!(publisher.attempts(), vec![call_of(&item), call_of(&item)]);
    assert_eq!(store.status("outbox#k"), SENT);
}

#[tokio::test]
async fn a_failure_recorded_after_the_claim_lapsed_leaves_the_item_to_its_new_owner() {
    let (store, publisher, d) = dispatcher();
    store.put("outbox#k", &pending("k", 0, NOW));
    publisher.fail_all();
    let other = store.clone();
    store.0.during("publisher.publish", 0, move |_| {
        let at = NOW + DISPATCH_LEASE_MS + 1;
        other.claim_now("outbox#k", "other", at, at + DISPATCH_LEASE_MS).unwrap();
    });

    assert!(matches!(d.dispatch("outbox#k", NOW).await.unwrap(), Dispatched::Retrying { attempts: 1, .. }));
    let item = store.get("outbox#k");
    assert_eq!((item.status.as_str(), item.token.as_deref(), item.last_error), (SENDING, Some("other"), None));
}

#[tokio::test]
async fn a_crash_after_publish_leaves_the_item_sending_and_it_is_republished_with_the_same_key_once_the_claim_lapses() {
    let (store, publisher, healthy) = dispatcher();
    let item = pending("k", 1, NOW);
    store.put("outbox#k", &item);
    let mut crashing = healthy.clone();
    crashing.fault = DispatchFault::AfterPublishBeforeMark;

    assert!(crashing.dispatch("outbox#k", NOW).await.is_err());
    let held = store.get("outbox#k");
    assert_eq!(held.status.as_str(), SENDING);
    // The claim's end is its next look in the due index.
    assert_eq!((held.until, held.due_at), (Some(NOW + DISPATCH_LEASE_MS), Some(NOW + DISPATCH_LEASE_MS)));

    // While the claim is live nobody else publishes.
    assert_eq!(healthy.dispatch("outbox#k", NOW + DISPATCH_LEASE_MS).await.unwrap(), Dispatched::Skipped);
    assert_eq!(publisher.attempts().len(), 1);

    assert_eq!(healthy.dispatch("outbox#k", NOW + DISPATCH_LEASE_MS + 1).await.unwrap(), Dispatched::Published);
    assert_eq!(publisher.attempts(), vec![call_of(&item), call_of(&item)]);
    let sent = store.get("outbox#k");
    assert_eq!((sent.status.as_str(), sent.attempts), (SENT, 2));
}

// ---------------------------------------------------------------------- sweep

#[tokio::test]
async fn the_sweeper_republishes_an_item_whose_dispatcher_crashed() {
    let (store, publisher, healthy) = dispatcher();
    store.put("outbox#k", &pending("k", 1, NOW));
    let mut crashing = healthy.clone();
    crashing.fault = DispatchFault::AfterPublishBeforeMark;
    assert!(crashing.dispatch("outbox#k", NOW).await.is_err());

    let lapse = NOW + DISPATCH_LEASE_MS;
    assert_eq!(healthy.sweep(2, lapse + GRACE - 1, GRACE, 10).await.unwrap(), 0, "claim live or within grace");
    assert_eq!(healthy.sweep(2, lapse + GRACE + 1, GRACE, 10).await.unwrap(), 1);
    let keys: Vec<String> = publisher.attempts().into_iter().map(|c| c.idempotency_key).collect();
    assert_eq!(keys, ["k", "k"]);
    assert_eq!(store.status("outbox#k"), SENT);
}

#[tokio::test]
async fn sweep_publishes_only_items_older_than_the_grace_across_its_shards() {
    let (store, publisher, d) = dispatcher();
    store.put("outbox#old0", &pending("old0", 0, NOW - 5 * GRACE));
    store.put("outbox#young0", &pending("young0", 0, NOW - GRACE + 1));
    store.put("outbox#edge1", &pending("edge1", 1, NOW - GRACE));
    store.put("outbox#old2", &pending("old2", 2, NOW - 2 * GRACE));
    store.put("outbox#beyond", &pending("beyond", 3, NOW - 5 * GRACE));
    store.put("outbox#claimed", &sending("claimed", 1, NOW + 1, 1));

    assert_eq!(d.sweep(3, NOW, GRACE, 100).await.unwrap(), 3);

    let mut keys: Vec<String> = publisher.attempts().into_iter().map(|c| c.idempotency_key).collect();
    keys.sort();
    assert_eq!(keys, ["edge1", "old0", "old2"]);
    for (id, status) in [
        ("outbox#old0", SENT),
        ("outbox#edge1", SENT),
        ("outbox#old2", SENT),
        ("outbox#young0", PENDING),
        ("outbox#beyond", PENDING),
        ("outbox#claimed", SENDING),
    ] {
        assert_eq!(store.status(id), status, "{id}");
    }
}

#[tokio::test]
async fn sweep_takes_the_oldest_first_and_stops_at_its_limit() {
    let (store, publisher, d) = dispatcher();
    store.put("outbox#a", &pending("a", 0, NOW - 5 * GRACE));
    store.put("outbox#b", &pending("b", 0, NOW - 3 * GRACE));
    store.put("outbox#c", &pending("c", 0, NOW - 4 * GRACE));
    store.put("outbox#d", &pending("d", 1, NOW - 9 * GRACE));

    assert_eq!(d.sweep(2, NOW, GRACE, 2).await.unwrap(), 2);
    let keys: Vec<String> = publisher.attempts().into_iter().map(|c| c.idempotency_key).collect();
    assert_eq!(keys, ["a", "c"]);
    assert_eq!((store.status("outbox#b").as_str(), store.status("outbox#d").as_str()), (PENDING, PENDING));

    assert_eq!(d.sweep(2, NOW, GRACE, 2).await.unwrap(), 2);
    assert_eq!(publisher.attempts().len(), 4);
    assert_eq!(d.sweep(2, NOW, GRACE, 2).await.unwrap(), 0);
}

#[tokio::test]
async fn one_items_store_or_publish_failure_does_not_stop_the_sweep() {
    let (store, publisher, d) = dispatcher();
    store.put("outbox#throttled", &pending("throttled", 0, NOW - 3 * GRACE));
    store.put("outbox#refused", &pending("refused", 0, NOW - 2 * GRACE));
    store.put("outbox#fine", &pending("fine", 1, NOW - 2 * GRACE));
    store.fail_writes_of("outbox#throttled");
    publisher.fail_call(0);

    assert_eq!(d.sweep(2, NOW, GRACE, 10).await.unwrap(), 1);

    let calls: Vec<(String, bool)> = publisher.attempts().into_iter().map(|c| (c.idempotency_key, c.ok)).collect();
    assert_eq!(calls, [("refused".to_owned(), false), ("fine".to_owned(), true)]);
    let throttled = store.get("outbox#throttled");
    assert_eq!((throttled.status.as_str(), throttled.attempts), (PENDING, 0));
    let refused = store.get("outbox#refused");
    assert_eq!((refused.status.as_str(), refused.attempts), (PENDING, 1));
    assert!(refused.due_at.unwrap() > NOW);
    assert_eq!(store.status("outbox#fine"), SENT);
}

#[test]
fn the_default_policy_gives_up_after_hours_not_minutes() {
    let p = DispatchPolicy::default();
    let total: i64 = (1..p.max_attempts).map(|a| p.backoff.delay_ms(a, 1.0)).sum();
    assert!((2 * 3_600_000..=4 * 3_600_000).contains(&total), "{total}");
}

/// A publisher whose every send is refused with an answer: permanent, or
/// retried no sooner than `after_ms` (an HTTPS destination's `Retry-After`).
struct Answering(PublishError);

impl Publisher for Answering {
    async fn publish(&self, _: Publication<'_>) -> Result<(), PublishError> {
        Err(self.0.clone())
    }
}

/// A retried answer's `Retry-After` puts the next try no sooner than it
/// asks (at most an hour), beyond the backoff; a permanent answer (an
/// HTTPS destination's 4xx) is DEAD at once, its first bytes kept.
#[tokio::test]
async fn retry_after_is_honoured_and_a_permanent_answer_is_dead_at_once() {
    for (after, want_at_least) in [(600_000, 600_000), (10 * 3_600_000, 3_600_000)] {
        let w = World::new(Ambient::fixed(NOW, 3));
        let store = w.outbox();
        store.put("outbox#k1", &pending("k1", 0, NOW));
        let refused = PublishError::Retry { message: "d: answered 429".into(), after_ms: Some(after), throttled: true };
        let d = Dispatcher::with_ports(store.clone(), Answering(refused)).with_policy(POLICY);
        assert!(matches!(d.dispatch("outbox#k1", NOW).await.unwrap(), Dispatched::Retrying { .. }));
        let item = store.get("outbox#k1");
        assert_eq!(item.status, PENDING);
        let due = item.due_at.unwrap() - NOW;
        // The backoff alone is at most POLICY's 1 s here.
        assert!((want_at_least..=want_at_least + 1_000).contains(&due), "{after}: due in {due} ms");
    }
    let w = World::new(Ambient::fixed(NOW, 3));
    let store = w.outbox();
    store.put("outbox#k1", &pending("k1", 0, NOW));
    let gone = PublishError::Permanent("d: answered 410: gone for good".into());
    let d = Dispatcher::with_ports(store.clone(), Answering(gone)).with_policy(POLICY);
    match d.dispatch("outbox#k1", NOW).await.unwrap() {
        Dispatched::Dead { attempts: 1, error } => assert_eq!(error, "d: answered 410: gone for good"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get("outbox#k1").status, DEAD);
}

/// A refusal its destination classes as brief (an HTTPS consumer's 401
/// while it deploys) is retried with the backoff while the delivery is
/// younger than its bound (from its commit), then DEAD with the answer.
#[tokio::test]
async fn a_refusal_retried_for_a_bound_is_dead_once_the_delivery_is_older_than_it() {
    let w = World::new(Ambient::fixed(NOW, 3));
    let store = w.outbox();
    let id = "outbox#k1";
    let mut item = pending("k1", 0, NOW);
    item.topic_arn = crate::routes::https_reference("partner");
    store.put(id, &item);
    store.set_delivery(id, "partner", NOW);
    let refused = PublishError::Refused { message: "partner: answered 401: rotating".into(), retry_for_ms: 3_600_000 };
    let d = Dispatcher::with_ports(store.clone(), Answering(refused))
        .with_policy(DispatchPolicy { delivery_bound_ms: 24 * 3_600_000, ..POLICY })
        .with_payloads(std::sync::Arc::new(OneEvent));
    let mut now = NOW;
    while now < NOW + 3_600_000 {
        match d.dispatch(id, now).await.unwrap() {
            Dispatched::Retrying { error, .. } => assert_eq!(error, "partner: answered 401: rotating"),
            other => panic!("{} s after its commit: {other:?}", (now - NOW) / 1000),
        }
        now = store.get(id).due_at.unwrap();
    }
    match d.dispatch(id, now).await.unwrap() {
        Dispatched::Dead { error, .. } => {
            assert!(error.contains("answered 401") && error.contains("3600 s"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get(id).status, DEAD);
}

/// A delivery an earlier release wrote with its HTTPS destination's URL
/// (its query and all) as its target is still sent after an upgrade: to the
/// destination it names, through its circuit.
#[tokio::test]
async fn a_delivery_written_with_its_url_by_an_earlier_release_is_still_sent_to_its_destination() {
    let (store, publisher, d) = dispatcher();
    let id = "outbox#old";
    let mut item = pending("old", 0, NOW);
    item.topic_arn = "https://hooks.example.com/in?token=s3cret".into();
    store.put(id, &item);
    store.set_delivery(id, "partner", NOW);
    let d = d.with_payloads(std::sync::Arc::new(OneEvent));
    assert_eq!(d.dispatch(id, NOW).await.unwrap(), Dispatched::Published);
    let sent = publisher.published();
    assert_eq!(sent.len(), 1);
    assert_eq!(store.status(id), SENT);
    let circuit = crate::ports::CircuitStore::circuit(&store, "partner").await.unwrap();
    assert_eq!(circuit, None, "a success on a closed circuit writes nothing");
    assert!(crate::routes::is_https_target(&sent[0].topic_arn), "sent as an HTTPS delivery");
}

/// Every event's payload is `{}`.
struct OneEvent;

impl crate::ports::EventPayloads for OneEvent {
    fn event_payload<'a>(
        &'a self,
        _: &'a EventKey,
        _: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<crate::ports::EventPayload, PortError>> + Send + 'a>>
    {
        Box::pin(async { Ok(crate::ports::EventPayload::Bytes(b"{}".to_vec())) })
    }
}

const QUEUE: &str = "arn:aws:sqs:eu-west-1:123456789012:orders";

/// A route's delivery to the `orders` SQS queue, due now.
fn queue_delivery(store: &MemOutbox, i: u32) -> String {
    delivery_to(store, i, QUEUE, "orders")
}

/// A route's delivery to `destination` (its target `target`), due now.
fn delivery_to(store: &MemOutbox, i: u32, target: &str, destination: &str) -> String {
    let id = format!("outbox#{destination}{i}");
    let mut item = pending(&format!("{destination}{i}"), 0, NOW);
    item.topic_arn = target.into();
    store.put(&id, &item);
    store.set_delivery(&id, destination, NOW);
    id
}

/// Every destination kind has a circuit: an SQS queue that fails opens
/// its circuit after the threshold, and its deliveries then wait unsent,
/// spending no attempt.
#[tokio::test]
async fn an_sqs_destination_that_fails_opens_its_circuit_and_its_deliveries_wait() {
    let (store, publisher, d) = dispatcher();
    let d = d.with_payloads(std::sync::Arc::new(OneEvent));
    publisher.refuse(QUEUE);
    let threshold = circuit::CircuitPolicy::default().threshold;
    for i in 0..threshold + 3 {
        let id = queue_delivery(&store, i);
        let got = d.dispatch(&id, NOW + i64::from(i)).await.unwrap();
        if i < threshold {
            assert!(matches!(got, Dispatched::Retrying { .. }), "{i}: {got:?}");
        } else {
            assert!(matches!(got, Dispatched::Waiting { .. }), "{i}: {got:?}");
            assert_eq!(store.get(&id).attempts, 0, "{i}: waiting spends no attempt");
        }
    }
    assert_eq!(publisher.attempts().len(), threshold as usize, "no send while open");
    let circuit = crate::ports::CircuitStore::circuit(&store, "orders").await.unwrap().unwrap();
    assert!(circuit.open_until.is_some(), "{circuit:?}");
}

/// A success seen by a container whose copy of the circuit is closed (read
/// before another container opened it) never closes it: only the probe
/// does, so two containers cannot make it flap.
#[tokio::test]
async fn a_success_seen_with_an_old_copy_never_closes_a_circuit_another_container_opened() {
    let w = World::new(Ambient::fixed(NOW, 3));
    let (store, publisher) = (w.outbox(), w.publisher());
    let container = || {
        Dispatcher::with_ports(store.clone(), publisher.clone())
            .with_policy(POLICY)
            .with_payloads(std::sync::Arc::new(OneEvent))
    };
    let (a, b) = (container(), container());
    let partner = crate::routes::https_reference("partner");
    let delivery = |i| delivery_to(&store, i, &partner, "partner");
    publisher.refuse(&partner);
    // A fails once: its copy says closed, one failure.
    let first = delivery(0);
    assert!(matches!(a.dispatch(&first, NOW).await.unwrap(), Dispatched::Retrying { .. }));
    // B fails until the circuit opens.
    let threshold = circuit::CircuitPolicy::default().threshold;
    for i in 1..threshold {
        let id = delivery(i);
        assert!(matches!(b.dispatch(&id, NOW + 10).await.unwrap(), Dispatched::Retrying { .. }));
    }
    let open = crate::ports::CircuitStore::circuit(&store, "partner").await.unwrap().unwrap();
    assert!(open.open_until.is_some(), "opened by B: {open:?}");
    // The queue is back; A, trusting its copy, sends one through.
    publisher.restore(&partner);
    let id = delivery(10);
    assert_eq!(a.dispatch(&id, NOW + 2_000).await.unwrap(), Dispatched::Published);
    let after = crate::ports::CircuitStore::circuit(&store, "partner").await.unwrap().unwrap();
    assert_eq!(after.open_until, open.open_until, "still open: only the probe closes it");
    // Its probe, once the open time is up, closes it.
    let id = delivery(11);
    let later = open.open_until.unwrap() + 1;
    assert_eq!(b.dispatch(&id, later).await.unwrap(), Dispatched::Published);
    let closed = crate::ports::CircuitStore::circuit(&store, "partner").await.unwrap().unwrap();
    assert_eq!((closed.open_until, closed.failures), (None, 0), "closed by the probe");
}

/// What a drain may hand on, by the circuit's state: nothing for a
/// destination that never opened (nothing can wait for it) or is open, the
/// probe's one once its open time is up, everything once a probe closed it
/// (the close removes the open token: the close token says it opened once).
#[tokio::test]
async fn a_drain_hands_on_nothing_while_open_the_probe_when_due_and_all_once_a_probe_closed_it() {
    use crate::ports::{CircuitChange, CircuitStore};
    let world = World::new(Ambient::fixed(NOW, 3));
    let store = world.outbox();
    let policy = CircuitPolicy { read_every_ms: 0, ..CircuitPolicy::default() };
    let circuits = Circuits::new(policy);
    assert_eq!(circuits.drainable(&store, "d", NOW).await, 0, "never opened");
    let open = CircuitChange::Open { token: "o-1", until_ms: NOW + 60_000, now_ms: NOW };
    store.change_circuit("d", open).await.unwrap();
    assert_eq!(circuits.drainable(&store, "d", NOW + 1).await, 0, "open");
    assert_eq!(circuits.drainable(&store, "d", NOW + 60_000).await, 1, "its time up: the probe's one");
    let probe = CircuitChange::Probe { token: "p-1", until_ms: NOW + 90_000, now_ms: NOW + 60_000 };
    store.change_circuit("d", probe).await.unwrap().expect("the probe");
    assert_eq!(circuits.drainable(&store, "d", NOW + 60_001).await, 0, "a probe is out");
    let close = CircuitChange::Close { now_ms: NOW + 60_002, probe: Some("p-1") };
    let closed = store.change_circuit("d", close).await.unwrap().expect("closed by its probe");
    assert_eq!((closed.open_token, closed.open_until), (None, None));
    assert_eq!(circuits.drainable(&store, "d", NOW + 60_003).await, usize::MAX, "back: everything waiting");
}

// ------------------------------------------------------------------- limits

/// Grants (or sends) `at`, sorted: the most that fall in any one-second
/// window `[t, t + 1000)`.
fn most_in_a_second(at: &[i64]) -> usize {
    let mut at = at.to_vec();
    at.sort_unstable();
    let mut most = 0;
    let mut start = 0;
    for end in 0..at.len() {
        while at[end] - at[start] >= 1000 {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// A policy whose bound a long backlog does not reach.
const PATIENT: DispatchPolicy = DispatchPolicy { delivery_bound_ms: 86_400_000, ..POLICY };

fn limited(world: &World, limits: crate::routes::Limits) -> Dispatcher<MemOutbox, MemPublisher> {
    Dispatcher::with_ports(world.outbox(), world.publisher())
        .with_policy(PATIENT)
        .with_ambient(world.ambient().clone())
        .with_payloads(std::sync::Arc::new(OneEvent))
        .with_queue(std::sync::Arc::new(world.deliveries()))
        .with_limits([("orders".to_owned(), limits)])
}

#[test]
fn the_window_count_sees_a_burst_anywhere() {
    assert_eq!(most_in_a_second(&[0, 200, 400, 600, 800, 1000]), 5);
    assert_eq!(most_in_a_second(&[0, 999, 1000, 1001, 5000]), 3);
    assert_eq!(most_in_a_second(&[]), 0);
}

/// What a backlog drained through the delivery queue by four dispatchers
/// taking its messages in turn shows: (grants, send times, paced with a
/// grant, paced without one).
async fn drain_backlog(n: u32, rate: usize, wait_in_place_ms: i64) -> (Vec<i64>, Vec<i64>, u32, u32) {
    let world = World::new(Ambient::fixed(NOW, 5)).with_shards(1);
    let store = world.outbox();
    let limits = crate::routes::Limits { step_ms: Some(1000 / rate as i64), in_flight: None };
    let dispatchers: Vec<_> = (0..4).map(|_| limited(&world, limits).with_wait_in_place(wait_in_place_ms)).collect();
    let ids: Vec<String> = (0..n).map(|i| queue_delivery(&store, i)).collect();
    let messages: Vec<crate::ports::Handover> = ids
        .iter()
        .map(|id| crate::ports::Handover {
            message: crate::ports::DeliveryMessage::Deliver { outbox: id.clone(), token: None, at: None },
            group: "orders".into(),
            delay_s: 0,
        })
        .collect();
    crate::ports::DeliveryQueue::hand_over(&world.deliveries(), &messages).await;
    let clock = world.ambient().clone();
    let (mut turn, mut paced, mut later) = (0usize, 0u32, 0u32);
    while !world.deliveries().is_empty() {
        let batch = world.deliveries().receive(10);
        if batch.is_empty() {
            let next = world.deliveries().next_visible().unwrap();
            clock.clock.sleep(std::time::Duration::from_millis((next - clock.now_ms()).max(0) as u64)).await;
            continue;
        }
        for m in batch {
            let d = &dispatchers[turn % 4];
            turn += 1;
            match d.take(&m, clock.now_ms()).await.unwrap() {
                Some(Dispatched::Paced { granted: true, .. }) => paced += 1,
                Some(Dispatched::Paced { granted: false, .. }) => later += 1,
                Some(Dispatched::Published) | None => {}
                other => panic!("{other:?}"),
            }
        }
    }
    let mut grants = Vec::new();
    for id in &ids {
        let state = store.state(id).await.unwrap().unwrap();
        assert_eq!(state.status, SENT, "{id}");
        let granted = state.granted_at.expect("sent under a grant");
        assert!(state.sent_at.unwrap() >= granted, "{id}: sent before its grant");
        grants.push(granted);
    }
    (grants, world.publisher().send_times(QUEUE), paced, later)
}

/// A backlog of 10,000 deliveries to a destination limited to 10 a
/// second, taken from the delivery queue by 4 dispatchers in turn (four
/// containers: four limiters, each with its own copy of the rate item), on
/// a virtual clock: no one-second window holds more than 10 grants, the
/// destination sees every delivery once, at or after its grant, and the
/// drain takes the time the rate says (1,000 s), not less. Grants up to 15
/// minutes ahead wait on the queue with their grant; past that, deliveries
/// wait without one and ask again (both paths taken).
#[tokio::test]
async fn a_backlog_of_ten_thousand_across_four_dispatchers_never_gets_more_grants_a_second_than_its_limit() {
    let (grants, sends, paced, later) = drain_backlog(10_000, 10, 0).await;
    assert_eq!(sends.len(), 10_000, "each delivery sent once");
    assert_eq!(most_in_a_second(&grants), 10, "never more than the limit's grants in a second");
    let took = sends.iter().max().unwrap() - sends.iter().min().unwrap();
    assert!(took >= 9_999 * 100, "the drain took {took} ms");
    assert!(paced > 0 && later > 0, "paced {paced}, later {later}");
}

/// Dispatchers that wait for a grant within a second in place send at the
/// grant itself: the destination's own clock sees the limit too.
#[tokio::test]
async fn waited_in_place_the_sends_are_at_their_grants() {
    let (mut grants, mut sends, _, _) = drain_backlog(2_000, 20, 1_000).await;
    assert_eq!(sends.len(), 2_000);
    assert_eq!(most_in_a_second(&grants), 20);
    assert_eq!(most_in_a_second(&sends), 20, "the destination sees at most 20 in any second");
    grants.sort_unstable();
    sends.sort_unstable();
    assert_eq!(grants, sends, "each sent at its grant");
}

/// The rule for a destination that throttles us: a 429 with `Retry-After:
/// 3` pauses every grant for 3 s and doubles the step (halves the rate)
/// for 5 minutes after the pause; a second 429 in that time doubles it
/// again; then the rate is the limit again. The delivery itself is retried
/// no sooner than its `Retry-After`.
#[tokio::test]
async fn a_429_with_retry_after_pauses_the_destination_then_halves_its_rate_for_a_while() {
    use crate::ports::CircuitStore;
    let world = World::new(Ambient::fixed(NOW, 5)).with_shards(1);
    let store = world.outbox();
    let limits = crate::routes::Limits { step_ms: Some(100), in_flight: None };
    let d = limited(&world, limits);
    world.publisher().throttle(QUEUE, Some(3_000), 1);
    let first = queue_delivery(&store, 0);
    match d.dispatch(&first, NOW).await.unwrap() {
        Dispatched::Retrying { next_at_ms, .. } => assert!(next_at_ms >= NOW + 3_000, "its own Retry-After"),
        other => panic!("{other:?}"),
    }
    let rate = store.rate("orders").await.unwrap().unwrap();
    assert_eq!((rate.next_at, rate.slow_factor), (Some(NOW + 3_000), 2), "{rate:?}");
    assert_eq!(rate.slow_until, Some(NOW + 3_000 + limit::SLOW_FOR_MS));
    // Another container: nothing before the pause is over, then 200 ms apart.
    let other = Limiter::new();
    let grant = |at| other.grant(&store, "orders", 100, at);
    assert_eq!(grant(NOW + 10).await, Grant::At { slot_ms: NOW + 3_000 });
    assert_eq!(grant(NOW + 20).await, Grant::At { slot_ms: NOW + 3_200 });
    // A second 429 while slowed: 4 times the step.
    other.throttled(&store, "orders", None, NOW + 3_300).await;
    let rate = store.rate("orders").await.unwrap().unwrap();
    assert_eq!((rate.next_at, rate.slow_factor), (Some(NOW + 4_300), 4), "paused 1 s without a Retry-After");
    assert_eq!(grant(NOW + 3_300).await, Grant::At { slot_ms: NOW + 4_300 });
    assert_eq!(grant(NOW + 3_301).await, Grant::At { slot_ms: NOW + 4_700 });
    // Five minutes after the pause, the limit again.
    let later = NOW + 4_300 + limit::SLOW_FOR_MS + 1;
    assert_eq!(grant(later).await, Grant::Now { slot_ms: later });
    assert_eq!(grant(later).await, Grant::At { slot_ms: later + 100 });
}

/// Grants never go further than 15 minutes ahead: past that the answer is
/// to ask again later, and a container whose copy is already past it
/// answers so without a write.
#[tokio::test]
async fn past_fifteen_minutes_of_grants_a_delivery_asks_again_later_without_a_write() {
    use crate::ports::{CircuitStore, RateChange};
    let world = World::new(Ambient::fixed(NOW, 5)).with_shards(1);
    let store = world.outbox();
    let limiter = Limiter::new();
    let far = NOW + limit::GRANT_AHEAD_MS + 5_000;
    store
        .change_rate("orders", RateChange::Slow { resume_ms: far, factor: 1, until_ms: far, now_ms: NOW })
        .await
        .unwrap();
    assert_eq!(limiter.grant(&store, "orders", 100, NOW).await, Grant::Later { retry_ms: NOW + 5_000 });
    let writes = world.calls_named("rate.change").len();
    assert_eq!(limiter.grant(&store, "orders", 100, NOW + 1).await, Grant::Later { retry_ms: NOW + 5_000 });
    assert_eq!(world.calls_named("rate.change").len(), writes, "its copy answered");
    assert_eq!(limiter.grant(&store, "orders", 100, NOW + 5_000).await, Grant::At { slot_ms: far });
}

/// `max_in_flight`: a flight per send, refused at the limit; a retried
/// take (its acknowledgement lost) counts once; a landed flight frees its
/// place; a dead dispatcher's flight is cleared once its time is up.
#[tokio::test]
async fn flights_are_counted_once_freed_when_landed_and_cleared_when_their_time_is_up() {
    use crate::ports::{CircuitStore, RateChange, RateWritten};
    let world = World::new(Ambient::fixed(NOW, 5)).with_shards(1);
    let store = world.outbox();
    let limiter = Limiter::new();
    let a = limiter.take_flight(&store, "p", 2, "a", NOW).await.expect("the first");
    let b = limiter.take_flight(&store, "p", 2, "b", NOW).await.expect("the second");
    assert_eq!(limiter.take_flight(&store, "p", 2, "c", NOW).await, None, "two in flight");
    // The first take again, as the SDK retries it after a lost acknowledgement.
    let again = store.change_rate("p", RateChange::TakeFlight { flight: &a, max: 2 }).await.unwrap();
    assert!(matches!(again, RateWritten::Refused(Some(ref r)) if r.flights.contains(&a)), "{again:?}");
    assert_eq!(limiter.take_flight(&store, "p", 2, "a", NOW).await, Some(a.clone()), "recognised as ours");
    limiter.land(&store, "p", &a).await;
    let c = limiter.take_flight(&store, "p", 2, "c", NOW + 1).await.expect("a place freed");
    // `b`'s dispatcher died: its flight is cleared when its time is up.
    assert_eq!(limiter.take_flight(&store, "p", 2, "d", NOW + limit::FLIGHT_MS).await, None);
    let d = limiter.take_flight(&store, "p", 2, "d", NOW + limit::FLIGHT_MS + 1).await.expect("b's time is up");
    let flights = store.rate("p").await.unwrap().unwrap().flights;
    assert!(flights.contains(&c) && flights.contains(&d) && !flights.contains(&b), "{flights:?}");
}

/// A delivery over its destination's `max_in_flight` is not failed: it
/// waits on the queue a second, claimed, and its attempt is not spent.
#[tokio::test]
async fn a_delivery_over_max_in_flight_waits_on_the_queue() {
    let world = World::new(Ambient::fixed(NOW, 5)).with_shards(1);
    let store = world.outbox();
    let d = limited(&world, crate::routes::Limits { step_ms: None, in_flight: Some(1) });
    let other = Limiter::new();
    other.take_flight(&store, "orders", 1, "someone", NOW).await.expect("the one flight");
    let id = queue_delivery(&store, 0);
    match d.dispatch(&id, NOW).await.unwrap() {
        Dispatched::Paced { until_ms, granted: false } => assert_eq!(until_ms, NOW + limit::NO_FLIGHT_RETRY_MS),
        other => panic!("{other:?}"),
    }
    let state = store.state(&id).await.unwrap().unwrap();
    assert_eq!(state.status, SENDING, "claimed while it waits");
    assert_eq!(state.due_at, Some(NOW + limit::NO_FLIGHT_RETRY_MS + crate::message::DISPATCH_LEASE_MS));
    assert_eq!(world.deliveries().len(), 1, "back on the queue");
    assert!(world.publisher().attempts().is_empty(), "not sent");
}

/// Sealed payloads by event key (an erasable endpoint's events).
#[derive(Default)]
struct SealedEvents(std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>);

impl crate::ports::EventPayloads for SealedEvents {
    fn event_payload<'a>(
        &'a self,
        key: &'a EventKey,
        _: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<crate::ports::EventPayload, PortError>> + Send + 'a>>
    {
        let bytes = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key.as_str()).cloned();
        Box::pin(async move { Ok(bytes.map_or(crate::ports::EventPayload::Gone, crate::ports::EventPayload::Bytes)) })
    }
}

/// A delivery of a sealed event (an erasable endpoint's) is sent with its
/// payload opened under the event's key; once the event is erased, its
/// delivery is DEAD at once and nothing is sent.
#[tokio::test]
async fn a_sealed_event_is_opened_for_its_envelope_and_an_erased_ones_delivery_is_dead() {
    use crate::ports::PayloadKeys;
    use crate::sealing::{DataKey, KeyState, seal};
    let w = World::new(Ambient::fixed(NOW, 3));
    let (store, publisher, keys) = (w.outbox(), w.publisher(), w.keys());
    let sealed = SealedEvents::default();
    for i in 0..2 {
        let event = EventKey::new("acme", "main", &format!("orders{i}"));
        let KeyState::Live(k) = keys.key_for(&event, &DataKey::generate().unwrap(), 0).await.unwrap() else {
            panic!("a key")
        };
        let bytes = seal(&k, &event, br#"{"card":"SEALED-MARKER"}"#);
        sealed.0.lock().unwrap().insert(event.as_str().to_owned(), bytes);
    }
    let d = Dispatcher::with_ports(store.clone(), publisher.clone())
        .with_policy(POLICY)
        .with_payloads(std::sync::Arc::new(sealed))
        .with_keys(std::sync::Arc::new(keys.clone()));
    let first = queue_delivery(&store, 0);
    assert_eq!(d.dispatch(&first, NOW).await.unwrap(), Dispatched::Published);
    assert!(publisher.published()[0].body.contains("SEALED-MARKER"), "sent opened");
    keys.destroy(&EventKey::new("acme", "main", "orders1"), "ops", NOW, 0).await.unwrap();
    let second = queue_delivery(&store, 1);
    let got = d.dispatch(&second, NOW).await.unwrap();
    assert_eq!(store.status(&second), DEAD, "{got:?}");
    assert_eq!(publisher.attempts().len(), 1, "nothing sent for the erased event");
}
