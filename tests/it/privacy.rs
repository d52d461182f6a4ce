//! Payload policies on the emulator: what a `redact` endpoint removes or
//! masks never reaches the table, the payload bucket, the work queue or a
//! destination, whatever the payload's size (in the record, in its own
//! item, in S3), searched in the raw bytes and in what decoding yields.

use aws_sdk_dynamodb::types::AttributeValue;
use hookledger::adapters::dynamodb::payload::decode;
use hookledger::adapters::s3::{S3Payloads, create_bucket};
use hookledger::adapters::sqs::SqsQueue;
use hookledger::identity::{EventKey, payload_hash};
use hookledger::intake::Intake;
use hookledger::processor::Outcome;

use crate::intake::post;
use crate::large::svix_headers;
use crate::support::{Stack, now_s, s};

/// The marker every redacted value carries.
const MARKER: &str = "PLANTED-SECRET-7f3a";

/// Every readable form of stored bytes: as they are, and inflated when
/// they inflate (the table and the bucket deflate what compresses).
fn readable(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![bytes.to_vec()];
    out.extend(decode(bytes, Some("deflate")));
    out
}

fn holds_marker(bytes: &[u8]) -> bool {
    readable(bytes).iter().any(|b| b.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()))
}

/// Every attribute value's bytes in an item (strings, numbers, blobs, inside lists and maps).
fn values(v: &AttributeValue, out: &mut Vec<Vec<u8>>) {
    match v {
        AttributeValue::S(s) | AttributeValue::N(s) => out.push(s.clone().into_bytes()),
        AttributeValue::B(b) => out.push(b.as_ref().to_vec()),
        AttributeValue::L(l) => l.iter().for_each(|e| values(e, out)),
        AttributeValue::M(m) => m.values().for_each(|e| values(e, out)),
        AttributeValue::Ss(l) => out.extend(l.iter().map(|s| s.clone().into_bytes())),
        _ => {}
    }
}

/// Where the marker is readable: table items, bucket objects, queue messages.
async fn marker_found(stack: &Stack, bucket: &str, queues: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for item in stack.items().await {
        let mut vs = Vec::new();
        item.values().for_each(|v| values(v, &mut vs));
        if vs.iter().any(|b| holds_marker(b)) {
            found.push(format!("table item {} {}", s(&item, "pk"), s(&item, "sk")));
        }
    }
    let s3 = aws_sdk_s3::Client::new(&stack.aws);
    let listed = s3.list_objects_v2().bucket(bucket).send().await.unwrap_or_else(|e| panic!("{e:?}"));
    for object in listed.contents() {
        let key = object.key().unwrap_or_default();
        let got = s3.get_object().bucket(bucket).key(key).send().await.unwrap_or_else(|e| panic!("{e:?}"));
        let bytes = got.body.collect().await.unwrap().into_bytes().to_vec();
        if holds_marker(&bytes) {
            found.push(format!("object {key}"));
        }
    }
    for url in queues {
        for body in stack.drain(url).await {
            if holds_marker(body.as_bytes()) {
                found.push(format!("message on {url}"));
            }
        }
    }
    found
}

/// Where each record's payload is stored: `record`, `item` or `s3`.
async fn places(stack: &Stack, keys: &[EventKey]) -> Vec<String> {
    let mut out = Vec::new();
    for k in keys {
        let r = stack.record(k).await;
        out.push(if r.contains_key("payload_in") {
            s(&r, "payload_in")
        } else if r.contains_key("body") {
            "record".into()
        } else {
            "item".into()
        });
    }
    out
}

/// An inventory delta (the first of its own SKU, `sku-<n>`) with two planted
/// values (a card, an email) and about `bytes` of text that compresses to half.
fn event(n: u64, bytes: usize) -> Vec<u8> {
    let mut noise = String::new();
    let mut block = payload_hash(&n.to_be_bytes());
    while noise.len() < bytes {
        block = payload_hash(block.as_bytes());
        noise.push_str(&block);
    }
    serde_json::json!({"type": "inventory.adjusted", "data": {
        "sku": format!("sku-{n}"), "seq": 1, "delta": 1,
        "card": format!("{MARKER}-4242"), "email": format!("{MARKER}@example.com"), "attachment": noise}})
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn a_redacted_field_never_reaches_the_table_the_bucket_a_queue_or_a_destination() {
    let stack = Stack::new().await;
    let bucket = format!("payloads-{}", &stack.table[3..]);
    create_bucket(&aws_sdk_s3::Client::new(&stack.aws), &bucket).await.unwrap();
    let destination =
        hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("dest-{}", &stack.table[3..])).await.unwrap();
    let dest_arn = hookledger::adapters::sqs::queue_arn(&stack.sqs, &destination).await.unwrap();
    let endpoints = r#"{"svix": {"provider": "standard_webhooks", "secrets": ["env:SVIX"],
        "payload": {"policy": "redact", "remove": ["/data/card"], "mask": ["/data/email"]}}}"#;
    let mut settings = stack.settings();
    settings.max_body_bytes = hookledger::config::MAX_BODY_BYTES_WITH_BUCKET;
    settings.payload_bucket = Some(bucket.clone());
    let ledger = stack.ledger().with_payload_bucket(S3Payloads::from_config(&stack.aws, bucket.clone()));
    let intake = Intake::new(
        stack.endpoints_from(endpoints).await,
        settings,
        ledger.clone(),
        SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
    );

    // One in the record, one in its own item, one in S3.
    let sizes = [("msg_small", 0usize), ("msg_mid", 6 * 1024), ("msg_large", 1024 * 1024)];
    for (i, (id, size)) in sizes.iter().enumerate() {
        let body = event(i as u64, *size);
        assert_eq!(post(&intake, "svix", &svix_headers(id, &body), &body).await, 202, "{id}");
        // Its retry: a duplicate, never stored again.
        assert_eq!(post(&intake, "svix", &svix_headers(id, &body), &body).await, 200, "{id}");
    }
    let keys: Vec<EventKey> = sizes.iter().map(|(id, _)| EventKey::new("standard_webhooks", "svix", id)).collect();
    for k in &keys {
        let r = stack.record(k).await;
        assert_eq!(s(&r, "payload_policy"), "redact", "{k}");
        assert!(!s(&r, "verified_hash").is_empty() && s(&r, "verified_hash") != s(&r, "payload_hash"), "{k}");
    }
    assert_eq!(places(&stack, &keys).await, ["record", "item", "s3"], "each place a payload is stored is covered");

    // The processor as deployed, routing every event to a queue.
    let routes = serde_json::json!({"destinations": {"dest": {"arn": dest_arn}},
        "routes": [{"endpoint": "svix", "to": ["dest"]}]})
    .to_string();
    let vars = [
        ("HOOKLEDGER_TABLE", stack.table.clone()),
        ("HOOKLEDGER_QUEUE_URL", stack.queue_url.clone()),
        ("HOOKLEDGER_ROUTES", routes),
        ("HOOKLEDGER_PAYLOAD_BUCKET", bucket.clone()),
        ("HOOKLEDGER_INDEX_SHARDS", "16".to_owned()),
    ];
    let wsettings = hookledger::wiring::Settings::from_lookup(move |k| {
        vars.iter().find(|(name, _)| *name == k).map(|(_, v)| v.clone())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let wiring = hookledger::wiring::Wiring::new(stack.aws.clone(), wsettings);
    let processor = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
    // The work queue's messages, read before they are processed (each carries its payload or the key).
    let work = stack.drain_queue().await;
    assert_eq!(work.len(), 3, "one message per event");
    assert!(!work.iter().any(|m| holds_marker(m.as_bytes())), "the work queue");
    for k in &keys {
        let report = processor.process(k, now_s() * 1000).await.unwrap_or_else(|e| panic!("{k}: {e}"));
        assert_eq!(report.outcome, Outcome::Applied, "{k}");
    }
    let delivered = stack.drain(&destination).await;
    assert_eq!(delivered.len(), 3, "one delivery per event");
    for envelope in &delivered {
        assert!(!holds_marker(envelope.as_bytes()), "a destination: {envelope:.200}");
        let v: serde_json::Value = serde_json::from_str(envelope).unwrap();
        assert_eq!(v["payload_policy"], "redact", "the envelope says what the policy kept");
        if v.get("event").is_some() {
            assert_eq!(v["event"]["data"]["email"], "[redacted]");
            assert!(v["event"]["data"].get("card").is_none());
        } else {
            assert!(
                v.get("payload_ref").is_some(),
                "too large for the queue: a reference to the stored (redacted) payload"
            );
        }
    }
    let found = marker_found(&stack, &bucket, &[&stack.queue_url, &destination]).await;
    assert!(found.is_empty(), "the marker is readable in {found:?}");

    // The control: the same scan finds the marker where an endpoint keeps the whole payload.
    let keep = Intake::new(
        stack.endpoints().await,
        stack.settings(),
        stack.ledger(),
        SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
    );
    let body = event(9, 0);
    assert_eq!(post(&keep, "svix", &svix_headers("msg_kept", &body), &body).await, 202);
    let found = marker_found(&stack, &bucket, &[&stack.queue_url]).await;
    assert_eq!(found.len(), 2, "the kept record and its work message: {found:?}");
}

/// The bodies of the messages on `url`, left there (received with no
/// visibility timeout, so each shows again at once).
async fn peek(stack: &Stack, url: &str) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..5 {
        let out = stack
            .sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        for m in out.messages.unwrap_or_default() {
            seen.insert(m.message_id.unwrap_or_default(), m.body.unwrap_or_default());
        }
    }
    seen.into_values().collect()
}

/// A queue's message as the processor reads it: its payload, if it carries one.
fn carried(body: &str) -> Option<Vec<u8>> {
    serde_json::from_str::<hookledger::adapters::sqs::WorkMessage>(body).ok()?.payload()
}

/// Erasure on the emulator, one event under each payload policy on an
/// erasable endpoint (in the record, in its own item, in S3): before,
/// nothing stored or queued holds the planted marker in the clear, and the
/// dead-letter queue's copies open to it under their keys; after `erase`,
/// every copy in the table, the key table, the bucket, the work, dead-letter
/// and delivery queues is gone or opens to nothing, searched raw, inflated
/// and opened. A later delivery is a 200 duplicate, not applied again.
#[tokio::test]
async fn after_erase_no_copy_in_the_table_the_bucket_or_a_queue_can_be_read() {
    use hookledger::ports::{PayloadKeys, open_payload};
    let stack = Stack::new().await;
    let id = &stack.table[3..];
    let bucket = format!("payloads-{id}");
    create_bucket(&aws_sdk_s3::Client::new(&stack.aws), &bucket).await.unwrap();
    let keys_table = format!("{}-keys", stack.table);
    hookledger::adapters::dynamodb::keys::create_keys_table(&stack.ddb, &keys_table).await.unwrap();
    let keys = hookledger::adapters::dynamodb::keys::DynamoKeys::new(stack.ddb.clone(), &keys_table);
    // The work queue, its messages moved to a dead-letter queue after one receive.
    let dlq = hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("work-dlq-{id}")).await.unwrap();
    let dlq_arn = hookledger::adapters::sqs::queue_arn(&stack.sqs, &dlq).await.unwrap();
    let policy = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"1"}}"#);
    let work = stack
        .sqs
        .create_queue()
        .queue_name(format!("work-{id}"))
        .attributes(aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy, policy)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let deliveries = hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("deliveries-{id}")).await.unwrap();
    let destination = hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("dest-{id}")).await.unwrap();
    let dest_arn = hookledger::adapters::sqs::queue_arn(&stack.sqs, &destination).await.unwrap();

    let endpoints = r#"{
        "keep": {"provider": "standard_webhooks", "secrets": ["env:SVIX"], "erasable": true},
        "redact": {"provider": "standard_webhooks", "secrets": ["env:SVIX"], "erasable": true,
                   "payload": {"policy": "redact", "remove": ["/data/card"]}},
        "drop": {"provider": "standard_webhooks", "secrets": ["env:SVIX"], "erasable": true,
                 "payload": {"policy": "drop_after"}}}"#;
    let mut settings = stack.settings();
    settings.queue_url = work.clone();
    settings.max_body_bytes = hookledger::config::MAX_BODY_BYTES_WITH_BUCKET;
    settings.payload_bucket = Some(bucket.clone());
    let ledger = stack.ledger().with_payload_bucket(S3Payloads::from_config(&stack.aws, bucket.clone()));
    let intake =
        Intake::new(stack.endpoints_from(endpoints).await, settings, ledger, SqsQueue::new(stack.sqs.clone(), &work))
            .with_keys(std::sync::Arc::new(keys.clone()));
    // In the record, in its own item, in S3.
    let events = [("keep", "msg_keep", 0usize), ("redact", "msg_redact", 6 * 1024), ("drop", "msg_drop", 1024 * 1024)];
    let mut bodies = Vec::new();
    for (i, (endpoint, msg, size)) in events.iter().enumerate() {
        let body = event(100 + i as u64, *size);
        assert_eq!(post(&intake, endpoint, &svix_headers(msg, &body), &body).await, 202, "{endpoint}");
        assert_eq!(post(&intake, endpoint, &svix_headers(msg, &body), &body).await, 200, "{endpoint}: its retry");
        bodies.push(body);
    }
    let keys_of: Vec<EventKey> =
        events.iter().map(|(endpoint, msg, _)| EventKey::new("standard_webhooks", endpoint, msg)).collect();
    assert_eq!(places(&stack, &keys_of).await, ["record", "item", "s3"], "each place a payload is stored is covered");
    let found = marker_found(&stack, &bucket, &[]).await;
    assert!(found.is_empty(), "sealed: the marker is readable in {found:?}");

    // Every work message received once and left: on the dead-letter queue.
    assert_eq!(peek(&stack, &work).await.len(), 3, "one message per event");
    for _ in 0..5 {
        if peek(&stack, &work).await.is_empty() {
            break;
        }
    }
    let dead = peek(&stack, &dlq).await;
    assert_eq!(dead.len(), 3, "the dead-letter queue's copies");
    let mut opened_before = 0;
    for (body, k) in dead.iter().filter_map(|b| carried(b).map(|p| (p, b))).map(|(p, b)| (p, b.clone())) {
        assert!(!holds_marker(&body), "a dead letter in the clear: {k:.120}");
        let key = keys_of.iter().find(|key| k.contains(key.as_str())).unwrap_or_else(|| panic!("{k:.120}"));
        let plain = open_payload(Some(&keys), key, body).await.unwrap().unwrap_or_else(|e| panic!("{key}: {e}"));
        opened_before += usize::from(holds_marker(&plain));
    }
    assert!(opened_before >= 2, "the control: the dead letters that carry their payload open to the marker");

    // Processed as deployed: the routed ones sent to their SQS destination
    // at the commit (a delivery queue configured beside, for HTTPS ones).
    let routes = serde_json::json!({"destinations": {"dest": {"arn": dest_arn}},
        "routes": [{"endpoint": "keep", "to": ["dest"]}, {"endpoint": "redact", "to": ["dest"]}]})
    .to_string();
    let vars = [
        ("HOOKLEDGER_TABLE", stack.table.clone()),
        ("HOOKLEDGER_QUEUE_URL", work.clone()),
        ("HOOKLEDGER_ROUTES", routes),
        ("HOOKLEDGER_PAYLOAD_BUCKET", bucket.clone()),
        ("HOOKLEDGER_INDEX_SHARDS", "16".to_owned()),
        ("HOOKLEDGER_KEYS_TABLE", keys_table.clone()),
        ("HOOKLEDGER_DELIVERY_QUEUE_URL", deliveries.clone()),
    ];
    let wsettings = hookledger::wiring::Settings::from_lookup(move |k| {
        vars.iter().find(|(name, _)| *name == k).map(|(_, v)| v.clone())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let wiring = hookledger::wiring::Wiring::new(stack.aws.clone(), wsettings);
    let processor = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
    for k in &keys_of {
        let report = processor.process(k, now_s() * 1000).await.unwrap_or_else(|e| panic!("{k}: {e}"));
        assert_eq!(report.outcome, Outcome::Applied, "{k}");
    }
    let delivered = stack.drain(&destination).await;
    assert_eq!(delivered.len(), 2);
    for envelope in &delivered {
        let v: serde_json::Value = serde_json::from_str(envelope).unwrap();
        assert!(
            v["event"]["data"].get("card").is_none() || v["endpoint"] == "keep",
            "a redacted field reached a destination"
        );
        // Delivered copies are the user's own systems: erasure cannot reach them.
        assert!(holds_marker(envelope.as_bytes()), "the destination got the event opened");
    }

    // Erased, each of them, by the operator.
    let ops = wiring.ops_read_only().unwrap_or_else(|e| panic!("{e}"));
    let caller = hookledger::audit::Caller::named("dpo");
    for k in &keys_of {
        let erased = ops.erase(k, &caller, "erasure request 42", now_s() * 1000, false).await.unwrap();
        assert_eq!((erased.outcome, erased.sealed), ("erased", true), "{k}");
    }
    // Nothing readable: raw, inflated, or opened under any event's key.
    let found = marker_found(&stack, &bucket, &[]).await;
    assert!(found.is_empty(), "the marker is readable in {found:?}");
    let mut sealed_copies = 0;
    let mut copies: Vec<Vec<u8>> = Vec::new();
    for item in stack.items().await {
        let mut vs = Vec::new();
        item.values().for_each(|v| values(v, &mut vs));
        copies.extend(vs);
    }
    let s3 = aws_sdk_s3::Client::new(&stack.aws);
    let listed = s3.list_objects_v2().bucket(&bucket).send().await.unwrap();
    assert_eq!(listed.contents().len(), 0, "the bucket's object is deleted: {:?}", listed.contents());
    let key_items = stack.ddb.scan().table_name(&keys_table).send().await.unwrap().items.unwrap_or_default();
    for item in &key_items {
        assert!(!item.contains_key("dk"), "a data key survived: {:?}", item.get("pk"));
        let mut vs = Vec::new();
        item.values().for_each(|v| values(v, &mut vs));
        copies.extend(vs);
    }
    for url in [&work, &dlq, &deliveries] {
        for body in peek(&stack, url).await {
            copies.extend(carried(&body));
            copies.push(body.into_bytes());
        }
    }
    for copy in copies {
        assert!(!holds_marker(&copy), "a copy in the clear");
        if hookledger::sealing::is_sealed(&copy) {
            sealed_copies += 1;
            for k in &keys_of {
                let opened = open_payload(Some(&keys), k, copy.clone()).await.unwrap();
                assert!(opened.is_err(), "a sealed copy still opens under {k}");
            }
        }
    }
    assert!(sealed_copies >= 2, "the dead letters' sealed copies were searched ({sealed_copies})");
    for k in &keys_of {
        let r = stack.record(k).await;
        assert!(r.contains_key("erased_at") && !r.contains_key("body"), "{k}: {:?}", r.keys());
        assert!(!s(&r, "payload_hash").is_empty(), "{k}: its identity and hashes stay");
        assert!(matches!(keys.key_of(k).await.unwrap(), hookledger::sealing::KeyState::Erased { .. }));
    }

    // A later delivery of each: a duplicate, nothing stored, queued or applied.
    // The projections' state: every item that is not the ledger's own.
    let projected = || async {
        let mut state: Vec<String> = stack
            .items()
            .await
            .iter()
            .filter(|i| s(i, "pk").starts_with("proj#"))
            .map(|i| format!("{:?}", std::collections::BTreeMap::from_iter(i.iter())))
            .collect();
        state.sort();
        state
    };
    let before = projected().await;
    assert!(before.len() >= 3, "each event applied: {before:?}");
    for (i, (endpoint, msg, _)) in events.iter().enumerate() {
        let status = post(&intake, endpoint, &svix_headers(msg, &bodies[i]), &bodies[i]).await;
        assert_eq!(status, 200, "{endpoint}: a later delivery is a duplicate");
    }
    assert!(peek(&stack, &work).await.is_empty(), "nothing queued again");
    let found = marker_found(&stack, &bucket, &[]).await;
    assert!(found.is_empty(), "nothing stored again: {found:?}");
    assert_eq!(before, projected().await, "not applied again");
}
