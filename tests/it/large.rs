//! Bodies too large for a DynamoDB item: in S3 (the claim-check pattern)
//! when a payload bucket is configured, refused (413) otherwise.

use base64::Engine;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::s3::{S3Payloads, create_bucket};
use hookledger::adapters::sqs::SqsQueue;
use hookledger::identity::{EventKey, payload_hash};
use hookledger::intake::Intake;
use hookledger::ledger::{NewEvent, PortError, SendLease};
use hookledger::ports::Ledger;
use hookledger::processor::Outcome;
use hookledger::secret::Secret;
use hookledger::verify::standard;
use http::{HeaderMap, HeaderValue};

use crate::intake::post;
use crate::support::{SVIX_SECRET, Stack, fast_settings, now_s, s};

/// An inventory delta carrying about `bytes` of incompressible text.
fn large_event(id: &str, bytes: usize) -> Vec<u8> {
    let mut noise = Vec::with_capacity(bytes);
    let mut block = payload_hash(id.as_bytes()).into_bytes();
    while noise.len() < bytes * 3 / 4 {
        block = payload_hash(&block).into_bytes();
        noise.extend_from_slice(&hex_to_bytes(&block));
    }
    let text = base64::engine::general_purpose::STANDARD.encode(&noise);
    serde_json::json!({"type": "inventory.adjusted", "data": {"sku": "sku-large", "seq": 1, "delta": 4, "attachment": text}})
        .to_string()
        .into_bytes()
}

fn hex_to_bytes(hex: &[u8]) -> Vec<u8> {
    hex.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
}

pub(crate) fn svix_headers(id: &str, body: &[u8]) -> HeaderMap {
    let key = standard::decode_secret(&Secret::new(SVIX_SECRET)).unwrap();
    let mut h = HeaderMap::new();
    h.insert("webhook-id", HeaderValue::from_str(id).unwrap());
    h.insert("webhook-timestamp", HeaderValue::from(now_s()));
    h.insert("webhook-signature", HeaderValue::from_str(&standard::sign(&key, id, now_s(), body)).unwrap());
    h
}

#[tokio::test]
async fn a_body_too_large_for_an_item_goes_to_s3_first_and_is_processed_from_there() {
    let stack = Stack::new().await;
    let bucket = format!("payloads-{}", &stack.table[3..]);
    create_bucket(&aws_sdk_s3::Client::new(&stack.aws), &bucket).await.unwrap();
    let payloads = S3Payloads::from_config(&stack.aws, bucket.clone());
    let mut settings = stack.settings();
    settings.max_body_bytes = hookledger::config::MAX_BODY_BYTES_WITH_BUCKET;
    settings.payload_bucket = Some(bucket.clone());
    let ledger = stack.ledger().with_payload_bucket(payloads.clone());
    let intake = Intake::new(
        stack.endpoints().await,
        settings,
        ledger.clone(),
        SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
    );

    let body = large_event("msg_large", 1024 * 1024);
    assert!(body.len() > 1_000_000);
    let headers = svix_headers("msg_large", &body);
    assert_eq!(post(&intake, "svix", &headers, &body).await, 202);
    let key = EventKey::new("standard_webhooks", "svix", "msg_large");
    let record = stack.record(&key).await;
    assert_eq!(s(&record, "payload_in"), "s3", "{:?}", record.keys().collect::<Vec<_>>());
    assert!(!record.contains_key("body"));
    assert!(crate::support::payload_copies(&stack.items().await).is_empty(), "no payload item");
    assert_eq!(payloads.get(&key, &payload_hash(&body)).await.unwrap().as_deref(), Some(&body[..]), "in S3");
    let sent = stack.drain_queue().await;
    assert_eq!(sent.len(), 1);
    assert!(sent[0].len() < 1_000, "the message carries the key alone");

    // A duplicate: the record says its payload is durable.
    assert_eq!(post(&intake, "svix", &headers, &body).await, 200);

    let p = hookledger::wiring::processor(
        stack.ledger().with_payload_bucket(payloads),
        hookledger_app::reference_registry(None, None),
        None,
        fast_settings(),
    );
    assert_eq!(p.process(&key, now_s() * 1000).await.unwrap().outcome, Outcome::Applied);
    let (r, out) = stack.cli(&["--payload-bucket", &bucket, "show", key.as_str(), "--payload", "--json"]).await;
    r.unwrap();
    assert!(out.contains("sku-large"), "show reads the payload from S3");
}

#[tokio::test]
async fn without_a_payload_bucket_a_payload_too_large_for_an_item_is_refused_not_retried() {
    let stack = Stack::new().await;
    let ledger: DynamoLedger = stack.ledger();
    let body = large_event("msg_refused", 600 * 1024);
    let key = EventKey::new("standard_webhooks", "svix", "msg_refused");
    let event = NewEvent {
        key: key.clone(),
        provider: "standard_webhooks".into(),
        endpoint: "svix".into(),
        tenant: "t".into(),
        event_id: "msg_refused".into(),
        event_type: None,
        payload_hash: payload_hash(&body),
        content_hash: payload_hash(&body),
        received_at_ms: now_s() * 1000,
        expires_at: now_s() + 86_400,
        shard: 0,
        send: SendLease { token: "t".into(), until_ms: 0 },
        via: hookledger::ledger::Via::Webhook,
        batch_hash: None,
        kept: None,
        notification: None,
    };
    match ledger.claim(&event, &body).await {
        Err(PortError::TooLarge { size, limit }) => assert!(size > limit, "{size} > {limit}"),
        other => panic!("{other:?}"),
    }
    assert!(stack.meta_items().await.is_empty(), "nothing claimed");
    // Refused before the record is read: an id already recorded (with a
    // small body) is refused the same way, never taken for its duplicate.
    let small = br#"{"id":"msg_refused"}"#;
    let first = NewEvent { payload_hash: payload_hash(small), content_hash: payload_hash(small), ..event.clone() };
    assert_eq!(ledger.claim(&first, small).await.unwrap(), hookledger::ledger::Claim::New);
    assert!(matches!(ledger.claim(&event, &body).await, Err(PortError::TooLarge { .. })), "refused as too large");
    let answer = hookledger::intake::Outcome::TooLarge { limit: 380 * 1024 }.answer();
    assert_eq!(answer.status, 413, "a permanent refusal, not a retry");
}
