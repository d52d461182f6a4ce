//! The processor Lambda handler from real SQS event fixtures: partial batch
//! responses, per-record parsing, visibility for busy records.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use hookledger::adapters::sqs::WorkMessage;
use hookledger::identity::EventKey;
use hookledger::ports::WorkLedger as _;
use lambda_runtime::{Context, LambdaEvent};
use processor::handler::{App, handle};
use serde_json::{Value, json};

use crate::processor::pi_succeeded;
use crate::support::{Stack, fast_settings, now_s, s};

const EVENT: &str = include_str!("../fixtures/sqs/example-sqs-event.json");
const BATCH_RESPONSE: &str = include_str!("../fixtures/sqs/example-sqs-batch-response.json");

/// An SQS event whose records are the fixture's record with (id, receipt, body) replaced.
pub fn sqs_event(records: &[(String, String, String)]) -> SqsEvent {
    let fixture: Value = serde_json::from_str(EVENT).unwrap();
    let template = fixture["Records"][0].clone();
    let recs: Vec<Value> = records
        .iter()
        .map(|(id, receipt, body)| {
            let mut r = template.clone();
            r["messageId"] = json!(id);
            r["receiptHandle"] = json!(receipt);
            r["body"] = json!(body);
            r
        })
        .collect();
    serde_json::from_value(json!({ "Records": recs })).unwrap()
}

pub async fn send_and_receive(stack: &Stack, bodies: &[String]) -> Vec<(String, String, String)> {
    for b in bodies {
        stack.sqs.send_message().queue_url(&stack.queue_url).message_body(b).send().await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < bodies.len() {
        let out = stack
            .sqs
            .receive_message()
            .queue_url(&stack.queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(1)
            .send()
            .await
            .unwrap();
        for m in out.messages.unwrap_or_default() {
            got.push((m.message_id.unwrap(), m.receipt_handle.unwrap(), m.body.unwrap()));
        }
    }
    got
}

/// What Lambda's SQS event source mapping does with a partial batch response.
pub async fn ack_successes(
    stack: &Stack,
    received: &[(String, String, String)],
    resp: &aws_lambda_events::event::sqs::SqsBatchResponse,
) {
    for (id, receipt, _) in received {
        if !resp.batch_item_failures.iter().any(|f| &f.item_identifier == id) {
            stack.sqs.delete_message().queue_url(&stack.queue_url).receipt_handle(receipt).send().await.unwrap();
        }
    }
}

pub fn work(key: &EventKey) -> String {
    serde_json::to_string(&WorkMessage::new(key)).unwrap()
}

#[tokio::test]
async fn partial_batch_failure_reports_only_the_records_that_must_come_back() {
    let stack = Stack::new().await;
    stack.map_customer("cus_h", "acct_h").await;
    let ok =
        stack.claim("stripe", "stripe-a", "evt_h1", None, &pi_succeeded("evt_h1", "pi_h1", Some("cus_h"), 10)).await;
    let busy =
        stack.claim("stripe", "stripe-a", "evt_h2", None, &pi_succeeded("evt_h2", "pi_h2", Some("cus_h"), 20)).await;
    // Another worker holds a live lease on `busy` for two minutes.
    stack.ledger().lease(&busy, "other-worker", now_s() * 1000, 120_000).await.unwrap();

    let received = send_and_receive(&stack, &[work(&ok), work(&busy), "Message Body".to_owned()]).await;
    let id_of = |body: &str| received.iter().find(|r| r.2 == body).unwrap().0.clone();
    let app = Arc::new(App {
        processor: Arc::new(stack.processor(fast_settings(), None, None)),
        queue: Arc::new(hookledger::adapters::sqs::SqsQueue::new(stack.sqs.clone(), &stack.queue_url)),
        dispatcher: Arc::new(stack.dispatcher()),
    });
    let resp = handle(app.clone(), LambdaEvent::new(sqs_event(&received), Context::default())).await.unwrap();

    let mut failed: Vec<String> = resp.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
    failed.sort();
    let mut expected = vec![id_of(&work(&busy)), id_of("Message Body")];
    expected.sort();
    assert_eq!(failed, expected, "only the busy and the malformed records stay");
    assert_eq!(s(&stack.record(&ok).await, "status"), "PROCESSED");

    // Same JSON shape as the runtime's batch-response fixture.
    let ours = serde_json::to_value(&resp).unwrap();
    let theirs: Value = serde_json::from_str(BATCH_RESPONSE).unwrap();
    assert_eq!(
        ours.as_object().unwrap().keys().collect::<Vec<_>>(),
        theirs.as_object().unwrap().keys().collect::<Vec<_>>()
    );
    assert!(ours["batchItemFailures"][0]["itemIdentifier"].is_string());

    // As Lambda's event source mapping does: delete what did not fail.
    ack_successes(&stack, &received, &resp).await;
    // The busy record's message was hidden for the rest of the lease; the
    // malformed one comes back after its 1 s visibility.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let back: Vec<String> = stack.drain_queue().await;
    assert_eq!(back, ["Message Body"]);
}

#[tokio::test]
async fn a_record_without_a_message_id_breaks_the_batch() {
    let stack = Stack::new().await;
    let app = Arc::new(App {
        processor: Arc::new(stack.processor(fast_settings(), None, None)),
        queue: Arc::new(hookledger::adapters::sqs::SqsQueue::new(stack.sqs.clone(), &stack.queue_url)),
        dispatcher: Arc::new(stack.dispatcher()),
    });
    let mut fixture: Value = serde_json::from_str(EVENT).unwrap();
    fixture["Records"][0].as_object_mut().unwrap().remove("messageId");
    let event: SqsEvent = serde_json::from_value(fixture).unwrap();
    assert!(handle(app, LambdaEvent::new(event, Context::default())).await.is_err());
}
