//! Quiltt as Quiltt sends, against the emulator: batches signed
//! `base64(HMAC-SHA256(secret, "1" + timestamp + body))`, each event of
//! `events[]` its own record, processed once.

use std::time::{SystemTime, UNIX_EPOCH};

use hookledger::identity::{EventKey, payload_hash};
use hookledger::intake::IntakeRequest;
use hookledger::secret::Secret;
use hookledger::verify::quiltt;
use http::{HeaderMap, HeaderValue, Method};

use crate::support::{HMAC_SECRET, Stack, fast_settings, key_groups, s};

fn now_s() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn batch(ids: &[String]) -> Vec<u8> {
    let events: Vec<(&str, &str)> = ids.iter().map(|id| (id.as_str(), "connection.synced.successful")).collect();
    quiltt::batch(&events, "2026-11-30T12:00:00Z")
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}_{i:03}")).collect()
}

/// Posts `body` to the `quiltt` endpoint signed with `secret` at `signed_at`
/// (Unix seconds); the answer's status and code.
async fn post(stack: &Stack, body: &[u8], secret: &str, signed_at: i64) -> (u16, &'static str) {
    // Room for a batch of 200 events (the stack's own limit is 16 KiB).
    let settings = hookledger::config::Settings { max_body_bytes: 256 * 1024, ..stack.settings() };
    let queue = hookledger::adapters::sqs::SqsQueue::new(stack.sqs.clone(), &stack.queue_url);
    let intake = hookledger::intake::Intake::new(stack.endpoints().await, settings, stack.ledger(), queue);
    let mut headers = HeaderMap::new();
    headers.insert(
        quiltt::SIGNATURE_HEADER,
        HeaderValue::from_str(&quiltt::sign(&Secret::new(secret), signed_at, body)).unwrap(),
    );
    headers.insert(quiltt::TIMESTAMP_HEADER, HeaderValue::from(signed_at));
    let a = intake
        .handle(IntakeRequest {
            query: "",
            endpoint: "quiltt",
            method: &Method::POST,
            headers: &headers,
            body,
            now: SystemTime::now(),
            request_id: "it",
        })
        .await;
    (a.status, a.code)
}

fn key(id: &str) -> EventKey {
    EventKey::new("quiltt", "quiltt", id)
}

/// Processes every key once; each must end PROCESSED.
async fn process_all(stack: &Stack, keys: &[EventKey]) {
    let p = stack.processor(fast_settings(), None, None);
    let now = now_s() * 1000 + 1;
    for k in keys {
        let report = p.process(k, now).await.unwrap();
        assert!(report.retry_after_ms.is_none(), "{k}: {:?}", report.outcome);
        assert_eq!(s(&stack.record(k).await, "status"), "PROCESSED", "{k}");
    }
}

/// The acceptance of issue 23 for Quiltt: a batch of 3 → 202 and 3 records,
/// each processed once; the same batch again → 200, nothing new; one of its
/// events again beside a new one → only the new one recorded.
#[tokio::test]
async fn a_quiltt_batch_is_three_records_and_again_nothing_new() {
    let stack = Stack::new().await;
    let first = ids("evt_qb", 3);
    let body = batch(&first);
    assert_eq!(post(&stack, &body, HMAC_SECRET, now_s()).await, (202, "accepted"));
    let keys: Vec<EventKey> = first.iter().map(|id| key(id)).collect();
    let events = quiltt::events(&body).unwrap();
    for (k, e) in keys.iter().zip(&events) {
        let r = stack.record(k).await;
        assert_eq!(s(&r, "payload_hash"), payload_hash(&body[e.bytes.clone()]), "{k}: the event's own bytes");
        assert_eq!(s(&r, "event_type"), "connection.synced.successful");
        assert_eq!(s(&r, "batch_hash"), payload_hash(&body), "{k}: the delivery it came in");
    }
    let mut want: Vec<_> = keys.iter().map(|k| (k.as_str().to_owned(), Some("quiltt".to_owned()))).collect();
    want.sort();
    assert_eq!(key_groups(&stack.drain_queue_grouped().await), want, "each sent once, in its tenant's group");
    process_all(&stack, &keys).await;

    assert_eq!(post(&stack, &body, HMAC_SECRET, now_s()).await, (200, "duplicate"));
    assert!(stack.drain_queue().await.is_empty(), "nothing sent again");
    let mixed = batch(&["evt_qb_002".to_owned(), "evt_qb_new".to_owned()]);
    assert_eq!(post(&stack, &mixed, HMAC_SECRET, now_s()).await, (202, "accepted"));
    let sent = key_groups(&stack.drain_queue_grouped().await);
    assert_eq!(sent, [(key("evt_qb_new").as_str().to_owned(), Some("quiltt".to_owned()))], "only the new one");
    assert_eq!(stack.meta_items().await.len(), 4);
}

/// A tampered body, a wrong secret, a stale timestamp and the generic
/// `{timestamp}{body}` scheme are refused (401) and write nothing.
#[tokio::test]
async fn a_tampered_wrongly_signed_or_stale_quiltt_batch_is_refused() {
    let stack = Stack::new().await;
    let body = batch(&ids("evt_qr", 2));
    let now = now_s();
    let mut tampered = body.clone();
    let at = tampered.windows(6).position(|w| w == b"evt_qr").unwrap();
    tampered[at] = b'E';
    let intake = stack.intake().await;
    let signed = |b: &[u8], secret: &str, ts: i64| {
        let mut h = HeaderMap::new();
        h.insert(quiltt::SIGNATURE_HEADER, HeaderValue::from_str(&quiltt::sign(&Secret::new(secret), ts, b)).unwrap());
        h.insert(quiltt::TIMESTAMP_HEADER, HeaderValue::from(ts));
        h
    };
    let cases = [
        ("tampered", signed(&body, HMAC_SECRET, now), tampered.clone()),
        ("wrong secret", signed(&body, "not-the-secret", now), body.clone()),
        ("stale", signed(&body, HMAC_SECRET, now - 600), body.clone()),
    ];
    for (what, headers, b) in cases {
        let a = intake
            .handle(IntakeRequest {
                query: "",
                endpoint: "quiltt",
                method: &Method::POST,
                headers: &headers,
                body: &b,
                now: SystemTime::now(),
                request_id: "it",
            })
            .await;
        assert_eq!(a.status, 401, "{what}: {}", a.code);
    }
    assert!(stack.meta_items().await.is_empty(), "nothing recorded");
    assert!(stack.drain_queue().await.is_empty());
}

/// The keys of drained messages.
fn sent_keys(messages: Vec<String>) -> Vec<String> {
    messages
        .iter()
        .map(|m| serde_json::from_str::<serde_json::Value>(m).unwrap()["key"].as_str().unwrap().to_owned())
        .collect()
}

/// A batch of 200 events goes the large-batch way: the delivery is one
/// record (claimed and sent before the answer), which the processor splits
/// into 200 records through the admission path; each is processed once. (A
/// split retried after any of its calls failed, landed without its
/// acknowledgement or crashed is the exploration's `ProcessorSplit` flow.)
#[tokio::test]
async fn a_batch_of_two_hundred_events_is_two_hundred_records_processed_once() {
    use hookledger::admission::{BATCH_TYPE, LARGE_BATCH, batch_id};
    let stack = Stack::new().await;
    let all = ids("evt_q200", 200);
    assert!(all.len() > LARGE_BATCH);
    let body = batch(&all);
    assert_eq!(post(&stack, &body, HMAC_SECRET, now_s()).await, (202, "accepted"));
    let metas = stack.meta_items().await;
    assert_eq!(metas.len(), 1, "the batch is one record before the answer");
    let batch_key = EventKey::new("quiltt", "quiltt", &batch_id(&payload_hash(&body)));
    let record = stack.record(&batch_key).await;
    assert_eq!(s(&record, "event_type"), BATCH_TYPE);
    assert_eq!(s(&record, "batch_hash"), payload_hash(&body));
    assert_eq!(sent_keys(stack.drain_queue().await), vec![batch_key.as_str().to_owned()]);

    let queue = hookledger::adapters::sqs::SqsQueue::new(stack.sqs.clone(), &stack.queue_url);
    let p = stack.processor(fast_settings(), None, None).with_queue(queue);
    let now = now_s() * 1000 + 1;
    let report = p.process(&batch_key, now).await.unwrap();
    assert!(report.retry_after_ms.is_none(), "{:?}", report.outcome);
    assert_eq!(s(&stack.record(&batch_key).await, "status"), "PROCESSED");
    let metas = stack.meta_items().await;
    assert_eq!(metas.len(), 201, "the batch and its 200 events");
    let events = quiltt::events(&body).unwrap();
    for e in &events {
        let r = stack.record(&key(&e.event_id)).await;
        assert_eq!(s(&r, "payload_hash"), payload_hash(&body[e.bytes.clone()]), "{}: its own bytes", e.event_id);
        assert_eq!(s(&r, "batch_hash"), payload_hash(&body), "{}", e.event_id);
    }
    let sent = sent_keys(stack.drain_queue().await);
    assert_eq!(sent.len(), 200, "each event sent once");
    let keys: Vec<EventKey> = all.iter().map(|id| key(id)).collect();
    let mut expected: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
    let mut got = sent.clone();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);

    process_all(&stack, &keys).await;
    assert_eq!(stack.meta_items().await.len(), 201);
    assert_eq!(post(&stack, &body, HMAC_SECRET, now_s()).await, (200, "duplicate"));
    assert!(stack.drain_queue().await.is_empty(), "a duplicate of a sent batch sends nothing");
}

/// A batch with an element without an id, against the emulator: the others
/// recorded and processed, the element parked `malformed_element`, and the
/// operator sees it in `list`, `failures` and `stats` (the PARKED count
/// `ParkedAlarm` watches).
#[tokio::test]
async fn a_batch_element_without_an_id_is_parked_and_shown_to_the_operator() {
    let stack = Stack::new().await;
    let mut events: Vec<serde_json::Value> = ids("qt_mal", 2)
        .iter()
        .map(|id| serde_json::json!({"id": id, "type": "connection.synced.successful", "data": {}}))
        .collect();
    let no_id = serde_json::json!({"type": "connection.synced.successful", "data": {"no": "id"}});
    events.insert(1, no_id.clone());
    let body = serde_json::json!({"events": events}).to_string().into_bytes();
    assert_eq!(post(&stack, &body, HMAC_SECRET, now_s()).await, (202, "accepted"));
    let bad = format!("{}{}", hookledger::verify::MALFORMED_ID_PREFIX, payload_hash(no_id.to_string().as_bytes()));
    let processor = stack.processor(fast_settings(), None, None);
    for id in [ids("qt_mal", 2)[0].clone(), bad.clone(), ids("qt_mal", 2)[1].clone()] {
        processor.process(&key(&id), now_s() * 1000).await.unwrap();
    }
    for id in ids("qt_mal", 2) {
        assert_eq!(s(&stack.record(&key(&id)).await, "status"), "PROCESSED", "{id}");
    }
    let parked = stack.record(&key(&bad)).await;
    assert_eq!((s(&parked, "status").as_str(), s(&parked, "park_reason").as_str()), ("PARKED", "malformed_element"));

    let (r, out) = stack.cli(&["list", "--status", "parked"]).await;
    r.unwrap();
    assert!(out.contains(&bad[..30]) && out.contains("1 record(s)"), "{out}");
    let (r, out) = stack.cli(&["failures", "--since", "1h"]).await;
    r.unwrap();
    assert!(out.contains("malformed_element"), "{out}");
    let (r, out) = stack.cli(&["stats"]).await;
    r.unwrap();
    assert!(out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["PARKED", "1"]), "{out}");
}
