//! The upgrade path: what an earlier release left in the table and on the
//! queue is still processed, and `hookledger migrate` brings its items to
//! today's indexes (docs/operations.md, "Upgrading a deployed stack").

use std::collections::HashMap;
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue;
use hookledger::adapters::dynamodb::new_record_item;
use hookledger::adapters::dynamodb::outbox::outbox_put;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::config::{DEFAULT_DRIFT_INTERVAL_MS, ReconcilerSettings};
use hookledger::identity::{EventKey, payload_hash};
use hookledger::ledger::{NewEvent, SendLease};
use hookledger::message::OutboxMessage;
use hookledger::ports::WorkQueue;
use hookledger::processor::Outcome;
use hookledger::verify::registry::content_hash;

use crate::processor::pi_succeeded;
use crate::support::{Stack, fast_settings, n, now_s, s};

fn event(key: &EventKey, body: &[u8], received_at_ms: i64) -> NewEvent {
    let parts: Vec<&str> = key.as_str().splitn(4, '#').collect();
    NewEvent {
        key: key.clone(),
        provider: parts[1].into(),
        endpoint: parts[2].into(),
        tenant: "tenant-a".into(),
        event_id: parts[3].into(),
        event_type: None,
        payload_hash: payload_hash(body),
        content_hash: content_hash(parts[1], body),
        received_at_ms,
        expires_at: now_s() + 86_400,
        shard: key.shard(16),
        send: SendLease { token: "earlier-release".into(), until_ms: received_at_ms },
        via: hookledger::ledger::Via::Webhook,
        batch_hash: None,
        kept: None,
        notification: None,
    }
}

async fn put(stack: &Stack, item: HashMap<String, AttributeValue>) {
    stack.ddb.put_item().table_name(&stack.table).set_item(Some(item)).send().await.unwrap();
}

fn av(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn num(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

#[tokio::test]
async fn a_record_and_a_message_of_an_earlier_release_are_processed() {
    let stack = Stack::new().await;
    stack.map_customer_in("tenant-a", "cus_up", "acct_up").await;
    let key = EventKey::new("stripe", "stripe-a", "evt_earlier");
    let body = pi_succeeded("evt_earlier", "pi_up", Some("cus_up"), 700);
    // The record alone, its payload in its own item, raw (no encoding), and a
    // queue message with the key alone: as an earlier release wrote them.
    stack.ledger().claim_record_only(&event(&key, &body, now_s() * 1000)).await.unwrap();
    let mut payload = HashMap::from([
        ("pk".to_owned(), av(key.as_str())),
        ("sk".to_owned(), av(&format!("payload#{}", payload_hash(&body)))),
        ("body".to_owned(), AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(body.clone()))),
    ]);
    payload.insert("expires_at".into(), num(now_s() + 86_400));
    put(&stack, payload).await;
    stack
        .ddb
        .update_item()
        .table_name(&stack.table)
        .key("pk", av(key.as_str()))
        .key("sk", av("meta"))
        .update_expression("SET payload_stored = :t")
        .expression_attribute_values(":t", AttributeValue::Bool(true))
        .send()
        .await
        .unwrap();
    SqsQueue::new(stack.sqs.clone(), &stack.queue_url).send(&key, "t").await.unwrap();
    let sent = stack.drain_queue().await;
    assert_eq!(sent.len(), 1);
    assert!(!sent[0].contains("\"body\""), "an earlier release's message: the key alone");

    let due_shard = s(&stack.record(&key).await, "due_shard");
    let p = stack.processor(fast_settings(), None, None);
    assert_eq!(p.process(&key, now_s() * 1000).await.unwrap().outcome, Outcome::Applied);
    let record = stack.record(&key).await;
    assert_eq!(s(&record, "status"), "PROCESSED");
    assert_eq!(
        s(&record, "due_shard"),
        due_shard,
        "finished: its due entry stays where it was, for the cursor to pass"
    );
}

#[tokio::test]
async fn migrate_brings_an_earlier_releases_items_to_todays_indexes_once() {
    let stack = Stack::new().await;
    let now = now_s() * 1000;
    let (topic, inbox) = stack.notify_topic().await;

    // A DEAD record in the earlier `status` index only.
    let dead = EventKey::new("stripe", "stripe-a", "evt_old_dead");
    let mut record = new_record_item(&event(&dead, b"{}", now - 86_400_000));
    record.insert("status".into(), av("DEAD"));
    record.insert("dead_reason".into(), av("attempts_exhausted"));
    record.insert("st_shard".into(), av(&format!("DEAD#{:03}", dead.shard(16))));
    record.insert("st_at".into(), num(now - 86_400_000));
    record.remove("due_shard");
    record.remove("due_at");
    put(&stack, record).await;

    // A pending outbox item in its own `out#NNN` partition, long overdue
    // (where today's layout keeps it too).
    let producer = EventKey::new("stripe", "stripe-a", "evt_old_outbox");
    let msg = OutboxMessage {
        topic_arn: topic.clone(),
        delivery: None,
        action: "subscription.changed".into(),
        group: "sub_old".into(),
        body: serde_json::json!({"event": "evt_old_outbox"}),
    };
    let (outbox_pk, put_outbox) = outbox_put(&stack.table, &producer, &msg, "", now - 3_600_000, 16, true);
    stack.ddb.transact_write_items().transact_items(put_outbox).send().await.unwrap();
    let old_partition = format!("out#{:03}", producer.shard(16));
    stack
        .ddb
        .update_item()
        .table_name(&stack.table)
        .key("pk", av(&outbox_pk))
        .key("sk", av("outbox"))
        .update_expression("SET due_shard = :p")
        .expression_attribute_values(":p", av(&old_partition))
        .send()
        .await
        .unwrap();

    // An entitlement in `ent#NNN`, `due_at` its last check.
    let checked = now - 10_000;
    put(
        &stack,
        HashMap::from([
            ("pk".to_owned(), av("proj#entitlement#tenant-a#sub_old")),
            ("sk".to_owned(), av("state")),
            ("due_shard".to_owned(), av("ent#005")),
            ("due_at".to_owned(), num(checked)),
        ]),
    )
    .await;

    let (r, out) = stack.cli(&["migrate"]).await;
    r.unwrap();
    let done: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (done["attention"].clone(), done["outbox_moved"].clone(), done["entitlements_moved"].clone()),
        (1.into(), 0.into(), 1.into()),
        "{done}"
    );
    assert_eq!((done["left"].clone(), done["done"].clone()), (0.into(), true.into()), "{done}");
    let (r, out) = stack.cli(&["migrate"]).await;
    r.unwrap();
    let again: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (again["attention"].clone(), again["outbox_moved"].clone(), again["entitlements_moved"].clone()),
        (0.into(), 0.into(), 0.into()),
        "a second run changes nothing: {again}"
    );
    // Both runs in the operator audit log, each with what it did.
    let log = stack.audit_log().await;
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log.iter().all(|e| e["verb"] == "migrate" && e["target"] == stack.table.as_str()), "{log:?}");
    assert!(log[0]["result"].as_str().unwrap().contains("\"attention\":1"), "{log:?}");

    // Today's reconciler and operators see them.
    let ent = stack.state("proj#entitlement#tenant-a#sub_old").await.unwrap();
    assert_eq!((s(&ent, "due_shard").as_str(), n(&ent, "due_at")), ("chk#005", checked + DEFAULT_DRIFT_INTERVAL_MS));
    let summary = stack
        .reconciler(ReconcilerSettings::default(), None)
        .run(now, Instant::now() + std::time::Duration::from_secs(30))
        .await;
    assert_eq!(summary.dead_letters, 1, "{summary:?}");
    assert_eq!(summary.outbox_republished, 1, "{summary:?}");
    assert_eq!(stack.drain(&inbox).await.len(), 1);
    let (r, out) = stack.cli(&["list", "--status", "dead"]).await;
    r.unwrap();
    assert!(out.contains("evt_old_dead") && out.contains("1 record(s)"), "{out}");
}

/// The layout of the release before this one kept outbox items and
/// entitlements in the records' `due#NNN` partitions. Before `hookledger
/// migrate` the reconciler still acts on them there; the migration moves
/// them to `out#NNN` and `chk#NNN` with their next looks, and from there
/// they are acted on again when due.
#[tokio::test]
async fn outbox_items_and_entitlements_in_the_records_partitions_are_acted_on_then_migrated() {
    let stack = Stack::new().await;
    let now = now_s() * 1000;
    let (topic, inbox) = stack.notify_topic().await;
    let (fake, base) = crate::fake_provider::FakeStripe::start().await;
    let source: std::sync::Arc<dyn hookledger::projection::fetch::SubscriptionSource> = std::sync::Arc::new(
        hookledger::adapters::stripe::StripeApi::new(base, hookledger::secret::Secret::new("sk_test_fake")).unwrap(),
    );
    let to_records_partition = |pk: String, sk: &'static str, shard: u32| {
        let ddb = stack.ddb.clone();
        let table = stack.table.clone();
        async move {
            ddb.update_item()
                .table_name(table)
                .key("pk", av(&pk))
                .key("sk", av(sk))
                .update_expression("SET due_shard = :p")
                .expression_attribute_values(":p", av(&format!("due#{shard:03}")))
                .send()
                .await
                .unwrap();
        }
    };
    // Two outbox items in `due#NNN`: one overdue, one younger than the grace.
    let mut outbox = Vec::new();
    for (event, at) in [("evt_due_old", now - 3_600_000), ("evt_due_young", now - 10_000)] {
        let producer = EventKey::new("stripe", "stripe-a", event);
        let msg = OutboxMessage {
            topic_arn: topic.clone(),
            delivery: None,
            action: "subscription.changed".into(),
            group: event.into(),
            body: serde_json::json!({ "event": event }),
        };
        let (pk, put_outbox) = outbox_put(&stack.table, &producer, &msg, "", at, 16, true);
        stack.ddb.transact_write_items().transact_items(put_outbox).send().await.unwrap();
        to_records_partition(pk.clone(), "outbox", producer.shard(16)).await;
        outbox.push(pk);
    }
    // An entitlement in `due#NNN`, its check overdue; the provider agrees.
    fake.set("sub_v2", "cus_v2", "active", 3);
    put(
        &stack,
        HashMap::from([
            ("pk".to_owned(), av("proj#entitlement#tenant-a#sub_v2")),
            ("sk".to_owned(), av("state")),
            ("subscription".to_owned(), av("sub_v2")),
            ("customer".to_owned(), av("cus_v2")),
            ("endpoint".to_owned(), av("stripe-a")),
            ("tenant".to_owned(), av("tenant-a")),
            ("event_id".to_owned(), av("evt_v2")),
            ("status".to_owned(), av("active")),
            ("seats".to_owned(), num(3)),
            ("due_shard".to_owned(), av("due#007")),
            ("due_at".to_owned(), num(now - 10_000)),
        ]),
    )
    .await;

    // Not yet migrated: acted on where they are.
    let r = stack.reconciler(ReconcilerSettings::default(), Some(source));
    let deadline = || Instant::now() + std::time::Duration::from_secs(30);
    let before = r.run(now, deadline()).await;
    assert_eq!((before.outbox_republished, before.drift_checked), (1, 1), "{before:?}");
    assert_eq!(stack.drain(&inbox).await.len(), 1);

    let (res, out) = stack.cli(&["migrate"]).await;
    res.unwrap();
    let done: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((done["outbox_moved"].clone(), done["entitlements_moved"].clone()), (1.into(), 1.into()), "{done}");
    assert_eq!(done["done"], true, "{done}");
    let young = stack.ddb.get_item().table_name(&stack.table).key("pk", av(&outbox[1])).key("sk", av("outbox"));
    let young = young.send().await.unwrap().item.unwrap();
    assert_eq!(
        s(&young, "due_shard"),
        format!("out#{:03}", EventKey::new("stripe", "stripe-a", "evt_due_young").shard(16))
    );
    let ent = stack.state("proj#entitlement#tenant-a#sub_v2").await.unwrap();
    assert_eq!(s(&ent, "due_shard"), "chk#007");
    // Its next look kept: an interval after the run reached it (claims are
    // taken at the clock's current time, so a few ms into the run).
    let next = n(&ent, "due_at") - (now + ReconcilerSettings::default().drift_interval_ms);
    assert!((0..60_000).contains(&next), "its next look kept: {next} ms past the interval");

    // From today's partitions, when due.
    let after = r.run(now + ReconcilerSettings::default().drift_interval_ms + 60_000, deadline()).await;
    assert_eq!((after.outbox_republished, after.drift_checked), (1, 1), "{after:?}");
    assert_eq!(stack.drain(&inbox).await.len(), 1);
    assert!(fake.requests.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    let (res, out) = stack.cli(&["migrate"]).await;
    res.unwrap();
    let again: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((again["outbox_moved"].clone(), again["entitlements_moved"].clone()), (0.into(), 0.into()), "{again}");
}
