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

/// A batch of 200 events ends as 200 records, each processed once.
#[tokio::test]
async fn a_batch_of_two_hundred_events_is_two_hundred_records_processed_once() {
    let stack = Stack::new().await;
    let all = ids("evt_q200", 200);
    let body = batch(&all);
    assert_eq!(post(&stack, &body, HMAC_SECRET, now_s()).await, (202, "accepted"));
    assert_eq!(stack.meta_items().await.len(), 200);
    let sent = stack.drain_queue().await;
    assert_eq!(sent.len(), 200, "each sent once");
    let keys: Vec<EventKey> = all.iter().map(|id| key(id)).collect();
    process_all(&stack, &keys).await;
    assert_eq!(post(&stack, &body, HMAC_SECRET, now_s()).await, (200, "duplicate"));
}
