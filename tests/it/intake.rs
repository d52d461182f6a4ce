//! The intake against the emulator: claim, payload, queue, answers.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_sqs::config::retry::RetryConfig;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::intake::IntakeRequest;
use hookledger::secret::Secret;
use hookledger::verify::{github, stripe};
use http::{HeaderMap, HeaderValue, Method};

use crate::support::{self, STRIPE_SECRET, Stack, now_s};

fn stripe_event(id: &str, ty: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "object": "event", "type": ty, "data": {"object": {"id": "sub_1"}}})
        .to_string()
        .into_bytes()
}

fn stripe_headers(body: &[u8], secret: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        stripe::SIGNATURE_HEADER,
        HeaderValue::from_str(&stripe::sign(&Secret::new(secret), now_s(), body)).unwrap(),
    );
    h
}

pub async fn post(
    intake: &hookledger::intake::Intake<impl hookledger::ports::Ledger, impl hookledger::ports::WorkQueue>,
    endpoint: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> u16 {
    intake
        .handle(IntakeRequest {
            query: "",
            endpoint,
            method: &Method::POST,
            headers,
            body,
            now: SystemTime::now(),
            request_id: "it",
        })
        .await
        .status
}

#[tokio::test]
async fn new_event_gives_one_record_one_payload_and_one_message() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let body = stripe_event("evt_new", "customer.subscription.updated");
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 202);

    let metas = stack.meta_items().await;
    assert_eq!(metas.len(), 1);
    let m = &metas[0];
    assert_eq!(support::s(m, "pk"), "evt#stripe#stripe-a#evt_new");
    assert_eq!(support::s(m, "status"), "RECEIVED");
    assert_eq!(support::s(m, "tenant"), "tenant-a");
    assert_eq!(support::s(m, "event_type"), "customer.subscription.updated");
    assert_eq!(support::s(m, "payload_hash"), hookledger::identity::payload_hash(&body));
    assert!(!m.contains_key("enqueued_at"), "the send is not noted (a round trip the answer does not wait for)");
    assert_eq!(m["payload_stored"].as_bool().ok(), Some(&true), "the payload came with the record");
    assert!(m.contains_key("expires_at") && m.contains_key("due_shard"));
    assert!(m.contains_key("body"), "a small payload travels in the record");

    let copies = support::payload_copies(&stack.items().await);
    assert_eq!(copies.len(), 1, "one stored copy");
    assert_eq!(copies[0].1, body, "raw bytes stored as received");

    let msgs = stack.drain_queue().await;
    assert_eq!(msgs.len(), 1);
    let msg: serde_json::Value = serde_json::from_str(&msgs[0]).unwrap();
    assert_eq!(msg["key"], "evt#stripe#stripe-a#evt_new");
}

#[tokio::test]
async fn second_delivery_answers_200_and_sends_nothing_new() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let body = stripe_event("evt_dup", "invoice.paid");
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 202);
    // A retry is signed again with a newer timestamp, same body.
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 200);
    assert_eq!(stack.meta_items().await.len(), 1);
    assert_eq!(stack.drain_queue().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_deliveries_give_one_record_and_one_message() {
    let stack = Stack::new().await;
    let intake = Arc::new(stack.intake().await);
    let body = stripe_event("evt_burst", "invoice.paid");
    let headers = stripe_headers(&body, STRIPE_SECRET);
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (intake, headers, body) = (intake.clone(), headers.clone(), body.clone());
            tokio::spawn(async move { post(&intake, "stripe-a", &headers, &body).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 31, "{statuses:?}");
    assert_eq!(stack.meta_items().await.len(), 1);
    assert_eq!(stack.drain_queue().await.len(), 1);
}

#[tokio::test]
async fn invalid_signature_stores_nothing_and_sends_nothing() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let body = stripe_event("evt_forged", "invoice.paid");
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, "whsec_wrong"), &body).await, 401);
    assert_eq!(post(&intake, "stripe-a", &HeaderMap::new(), &body).await, 401);
    let mut tampered = body.clone();
    tampered.push(b' ');
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &tampered).await, 401);
    assert!(stack.items().await.is_empty());
    assert!(stack.drain_queue().await.is_empty());
}

#[tokio::test]
async fn sqs_failure_after_the_claim_answers_503_and_the_retry_sends_the_message() {
    let stack = Stack::new().await;
    // A queue client whose endpoint refuses connections: SQS is down.
    let down = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&stack.aws)
            .endpoint_url("http://127.0.0.1:1")
            .retry_config(RetryConfig::standard().with_max_attempts(1))
            .timeout_config(
                aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(2))
                    .build(),
            )
            .build(),
    );
    let broken = stack.intake_with_queue(SqsQueue::new(down, &stack.queue_url)).await;
    let body = stripe_event("evt_sqs_down", "invoice.paid");
    let answer = broken
        .handle(IntakeRequest {
            query: "",
            endpoint: "stripe-a",
            method: &Method::POST,
            headers: &stripe_headers(&body, STRIPE_SECRET),
            body: &body,
            now: SystemTime::now(),
            request_id: "it",
        })
        .await;
    assert_eq!((answer.status, answer.retry_after), (503, Some(5)));
    let metas = stack.meta_items().await;
    assert_eq!(metas.len(), 1, "the claim is durable");
    assert!(!metas[0].contains_key("enqueued_at"), "and not noted as sent");
    assert!(!metas[0].contains_key("send_lease_until"), "its send lease given back");
    assert!(stack.drain_queue().await.is_empty());

    // The provider retries once SQS is back: the existing, never-sent record is sent.
    let healthy = stack.intake().await;
    assert_eq!(post(&healthy, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 200);
    assert_eq!(stack.drain_queue().await.len(), 1);
    // Further retries send nothing more while that send's lease lives.
    assert_eq!(post(&healthy, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 200);
    assert!(stack.drain_queue().await.is_empty());
}

#[tokio::test]
async fn dynamodb_failure_answers_503_and_sends_nothing() {
    let stack = Stack::new().await;
    let mut settings = stack.settings();
    settings.table_name = "no-such-table".into();
    let intake = hookledger::intake::Intake::new(
        stack.endpoints().await,
        settings,
        hookledger::adapters::dynamodb::DynamoLedger::new(stack.ddb.clone(), "no-such-table"),
        SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
    );
    let body = stripe_event("evt_ddb_down", "invoice.paid");
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 503);
    assert!(stack.drain_queue().await.is_empty());
}

#[tokio::test]
async fn the_same_event_id_on_two_endpoints_gives_two_records() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let body = stripe_event("evt_shared", "invoice.paid");
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 202);
    assert_eq!(post(&intake, "stripe-b", &stripe_headers(&body, STRIPE_SECRET), &body).await, 202);
    let mut keys: Vec<String> = stack.meta_items().await.iter().map(|m| support::s(m, "pk")).collect();
    keys.sort();
    assert_eq!(keys, ["evt#stripe#stripe-a#evt_shared", "evt#stripe#stripe-b#evt_shared"]);
    assert_eq!(stack.drain_queue().await.len(), 2);
}

#[tokio::test]
async fn same_id_with_a_different_payload_is_flagged_not_overwritten() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let first = stripe_event("evt_conflict", "invoice.paid");
    let second = stripe_event("evt_conflict", "invoice.voided");
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&first, STRIPE_SECRET), &first).await, 202);
    let answer = intake
        .handle(IntakeRequest {
            query: "",
            endpoint: "stripe-a",
            method: &Method::POST,
            headers: &stripe_headers(&second, STRIPE_SECRET),
            body: &second,
            now: SystemTime::now(),
            request_id: "it",
        })
        .await;
    assert_eq!((answer.status, answer.code), (200, "duplicate_conflict"));
    let m = &stack.meta_items().await[0];
    assert_eq!(support::s(m, "payload_hash"), hookledger::identity::payload_hash(&first), "first kept");
    assert_eq!(support::s(m, "event_type"), "invoice.paid");
    assert_eq!(m["conflicts"].as_n().unwrap(), "1");
    assert_eq!(m["duplicates"].as_n().unwrap(), "1", "the duplicate is counted once");
    assert_eq!(support::s(m, "last_conflict_hash"), hookledger::identity::payload_hash(&second));
    assert_eq!(stack.drain_queue().await.len(), 1);
}

#[tokio::test]
async fn github_delivery_id_is_the_identity_across_redeliveries() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let body = std::fs::read(support::testdata("providers/github/push/payload.json")).unwrap();
    let mut h = HeaderMap::new();
    h.insert(
        github::SIGNATURE_HEADER,
        HeaderValue::from_str(&github::sign(&Secret::new(support::GITHUB_SECRET), &body)).unwrap(),
    );
    h.insert(github::DELIVERY_HEADER, HeaderValue::from_static("9f0ad2c0-0000-11ef-8000-000000000001"));
    h.insert(github::EVENT_HEADER, HeaderValue::from_static("push"));
    assert_eq!(post(&intake, "gh", &h, &body).await, 202);
    assert_eq!(post(&intake, "gh", &h, &body).await, 200, "a requested redelivery keeps X-GitHub-Delivery");
    let m = &stack.meta_items().await[0];
    assert_eq!(support::s(m, "pk"), "evt#github#gh#9f0ad2c0-0000-11ef-8000-000000000001");
    assert_eq!(support::s(m, "event_type"), "push");
}

pub mod sns {
    use super::*;
    use hookledger::verify::sns::{SnsMessage, signing};

    pub fn signed(kind: &str, topic: &str) -> Vec<u8> {
        signed_message(
            kind,
            topic,
            &format!("it-{}", uuid::Uuid::new_v4()),
            &std::fs::read_to_string(support::testdata("providers/ses/docs/notification-delivery.json")).unwrap(),
        )
    }

    pub fn signed_message(kind: &str, topic: &str, message_id: &str, message: &str) -> Vec<u8> {
        let mut msg = SnsMessage {
            kind: kind.to_owned(),
            message_id: message_id.to_owned(),
            topic_arn: topic.to_owned(),
            message: message.to_owned(),
            timestamp: signing::timestamp(now_s()),
            signature_version: "2".to_owned(),
            signature: String::new(),
            signing_cert_url: "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0000test0000.pem"
                .to_owned(),
            subject: None,
            token: (kind != "Notification").then(|| "tok".to_owned()),
            subscribe_url: (kind != "Notification").then(|| {
                format!("https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn={topic}&Token=tok")
            }),
        };
        let key = std::fs::read_to_string(support::testdata("test-sns/test-signing-key.pem")).unwrap();
        signing::sign(&mut msg, &key).unwrap();
        serde_json::to_vec(&msg).unwrap()
    }

    #[tokio::test]
    async fn ses_notification_through_sns_is_recorded_with_its_ses_type() {
        let stack = Stack::new().await;
        let intake = stack.intake().await;
        let body = signed("Notification", support::SNS_TOPIC);
        let mut h = HeaderMap::new();
        h.insert("x-amz-sns-message-type", HeaderValue::from_static("Notification"));
        assert_eq!(post(&intake, "ses", &h, &body).await, 202);
        assert_eq!(post(&intake, "ses", &h, &body).await, 200);
        let m = &stack.meta_items().await[0];
        assert_eq!(support::s(m, "event_type"), "ses.Delivery");
        assert_eq!(stack.drain_queue().await.len(), 1);
        let fetched = stack.sns_getter.fetched.lock().unwrap().clone();
        assert_eq!(fetched.len(), 1, "certificate fetched once, then cached: {fetched:?}");
    }

    #[tokio::test]
    async fn subscription_for_an_allowed_topic_is_confirmed_and_others_refused() {
        let stack = Stack::new().await;
        let intake = stack.intake().await;
        let body = signed("SubscriptionConfirmation", support::SNS_TOPIC);
        assert_eq!(post(&intake, "ses", &HeaderMap::new(), &body).await, 200);
        let fetched = stack.sns_getter.fetched.lock().unwrap().clone();
        assert!(fetched.iter().any(|u| u.contains("Action=ConfirmSubscription")), "{fetched:?}");

        let other = signed("SubscriptionConfirmation", "arn:aws:sns:eu-west-1:123456789012:someone-else");
        assert_eq!(post(&intake, "ses", &HeaderMap::new(), &other).await, 403);
        assert_eq!(
            stack.sns_getter.fetched.lock().unwrap().len(),
            fetched.len(),
            "nothing fetched for a refused topic"
        );
        assert!(stack.items().await.is_empty(), "confirmations are not ledger events");
    }
}

#[tokio::test]
async fn crash_between_claim_and_send_is_recovered_by_the_next_delivery_once_the_lease_lapses() {
    use hookledger::identity::{EventKey, payload_hash};
    use hookledger::ledger::{NewEvent, SendLease};

    let stack = Stack::new().await;
    let body = stripe_event("evt_crashed", "invoice.paid");
    let key = EventKey::new("stripe", "stripe-a", "evt_crashed");
    let now_ms = now_s() * 1000;
    // A delivery claimed the record, then its Lambda died: no payload, no send,
    // and a send lease that has already lapsed.
    let crashed = NewEvent {
        key: key.clone(),
        provider: "stripe".into(),
        endpoint: "stripe-a".into(),
        tenant: "tenant-a".into(),
        event_id: "evt_crashed".into(),
        event_type: Some("invoice.paid".into()),
        payload_hash: payload_hash(&body),
        content_hash: payload_hash(&body),
        received_at_ms: now_ms - 60_000,
        expires_at: now_s() + 86_400,
        shard: 0,
        send: SendLease { token: "dead-lambda".into(), until_ms: now_ms - 45_000 },
        via: hookledger::ledger::Via::Webhook,
        batch_hash: None,
        kept: None,
        notification: None,
    };
    // (A record of the previous release: its intake wrote the payload in a
    // second request.)
    stack.ledger().claim_record_only(&crashed).await.unwrap();

    let intake = stack.intake().await;
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 200);
    assert_eq!(stack.drain_queue().await.len(), 1, "the retry hands the record over");
    let payloads = support::payload_copies(&stack.items().await).len();
    assert_eq!(payloads, 1, "and stores the payload the crash never wrote");
}

#[tokio::test]
async fn a_live_send_lease_held_by_another_delivery_is_respected() {
    use hookledger::identity::{EventKey, payload_hash};
    use hookledger::ledger::{NewEvent, SendLease};
    use hookledger::ports::Ledger;

    let stack = Stack::new().await;
    let body = stripe_event("evt_inflight", "invoice.paid");
    let now_ms = now_s() * 1000;
    let inflight = NewEvent {
        key: EventKey::new("stripe", "stripe-a", "evt_inflight"),
        provider: "stripe".into(),
        endpoint: "stripe-a".into(),
        tenant: "tenant-a".into(),
        event_id: "evt_inflight".into(),
        event_type: None,
        payload_hash: payload_hash(&body),
        content_hash: payload_hash(&body),
        received_at_ms: now_ms,
        expires_at: now_s() + 86_400,
        shard: 0,
        send: SendLease { token: "first-delivery".into(), until_ms: now_ms + 60_000 },
        via: hookledger::ledger::Via::Webhook,
        batch_hash: None,
        kept: None,
        notification: None,
    };
    stack.ledger().claim(&inflight, &body).await.unwrap();
    let intake = stack.intake().await;
    assert_eq!(post(&intake, "stripe-a", &stripe_headers(&body, STRIPE_SECRET), &body).await, 200);
    assert!(stack.drain_queue().await.is_empty(), "the first delivery is still sending it");
}

/// One endpoint whose secret cannot be resolved at the cold start (an SSM
/// parameter not there yet) fails neither the cold start nor the other
/// endpoints: its deliveries are answered 503 with `Retry-After`, its secret
/// is tried again once the bound has passed, and then it works.
#[tokio::test]
async fn an_endpoint_whose_secret_cannot_be_resolved_answers_503_alone_and_works_once_it_resolves() {
    use hookledger::clock::{Ambient, ManualClock, SeededEntropy};
    use hookledger::intake::waiting::RETRY_EVERY_MS;
    let stack = Stack::new().await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (good, late) = (format!("/hookledger/it-{id}/good"), format!("/hookledger/it-{id}/late"));
    let put = |name: String| async move {
        let body = serde_json::json!({"Name": name, "Value": STRIPE_SECRET, "Type": "SecureString"});
        crate::iam::emulator("ssm", "AmazonSSM.PutParameter", body).await;
    };
    put(good.clone()).await;
    let endpoints = serde_json::json!({
        "stripe-good": {"provider": "stripe", "secrets": [format!("ssm:{good}")]},
        "stripe-late": {"provider": "stripe", "secrets": [format!("ssm:{late}")]},
    })
    .to_string();
    let (table, queue) = (stack.table.clone(), stack.queue_url.clone());
    let settings = hookledger::wiring::Settings::from_lookup(move |k| match k {
        "HOOKLEDGER_TABLE" => Some(table.clone()),
        "HOOKLEDGER_QUEUE_URL" => Some(queue.clone()),
        "HOOKLEDGER_ENDPOINTS" => Some(endpoints.clone()),
        _ => None,
    })
    .unwrap();
    let clock = Arc::new(ManualClock::at(now_s() * 1000));
    let ambient = Ambient { clock: clock.clone(), entropy: Arc::new(SeededEntropy::new(3)) };
    let wiring = hookledger::wiring::Wiring::new(stack.aws.clone(), settings).with_ambient(ambient);
    let intake = wiring.intake().await.expect("one endpoint's secret does not fail the cold start");
    assert_eq!(intake.waiting_endpoints(), ["stripe-late"]);

    let body = stripe_event("evt_secret_late", "invoice.paid");
    let send = |endpoint: &'static str| {
        let (intake, body) = (&intake, body.clone());
        async move {
            intake
                .handle(IntakeRequest {
                    query: "",
                    endpoint,
                    method: &Method::POST,
                    headers: &stripe_headers(&body, STRIPE_SECRET),
                    body: &body,
                    now: SystemTime::now(),
                    request_id: "it",
                })
                .await
        }
    };
    assert_eq!(send("stripe-good").await.status, 202, "the other endpoint works");
    let waiting = send("stripe-late").await;
    assert_eq!((waiting.status, waiting.retry_after), (503, Some((RETRY_EVERY_MS / 1000) as u32)));
    assert!(!waiting.detail.contains(&late), "the answer names no parameter: {}", waiting.detail);

    // The parameter is created; within the bound nothing is tried again.
    put(late.clone()).await;
    clock.advance(Duration::from_millis(10_000));
    let still = send("stripe-late").await;
    assert_eq!((still.status, still.retry_after), (503, Some(20)));
    clock.advance(Duration::from_millis((RETRY_EVERY_MS - 10_000) as u64));
    assert_eq!(send("stripe-late").await.status, 202, "resolved once the bound has passed");
    assert!(intake.waiting_endpoints().is_empty());
    assert_eq!(send("stripe-late").await.status, 200, "and it stays built");
}
