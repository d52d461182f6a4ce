//! Translates an SQS batch into the processor's batch use case
//! (`hookledger::batch`) and its answer into a partial batch response.
//! Each record is decoded on its own by the queue's adapter (a malformed
//! body fails that record only).

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use hookledger::adapters::sqs::{self, SqsQueue};
use hookledger::config::ConfigError;
use hookledger::ports::DeliveryMessage;
use hookledger::projection::Registry;
use hookledger::telemetry::{FailureKind, FunctionError};
use hookledger::wiring::{LiveDispatcher, LiveProcessor, Wiring};
use lambda_runtime::LambdaEvent;

pub struct App {
    pub processor: Arc<LiveProcessor>,
    /// Where a message that must come back later is shown again.
    pub queue: Arc<SqsQueue>,
    /// The delivery queue's consumer (the function's second event source).
    pub dispatcher: Arc<LiveDispatcher>,
}

/// Builds the processor from the composition root (see the configuration
/// reference) with the application's projections (`main.rs` registers them).
pub fn from_wiring(wiring: &Wiring, registry: Registry) -> Result<App, ConfigError> {
    Ok(App {
        processor: Arc::new(wiring.processor(registry)?),
        queue: Arc::new(wiring.queue()?),
        dispatcher: Arc::new(wiring.dispatcher()?),
    })
}

/// Two event sources: the work queue (events to process) and the delivery
/// queue (route deliveries and drain steps, `DeliveryMessage`), told apart
/// by each record's body.
pub async fn handle(app: Arc<App>, event: LambdaEvent<SqsEvent>) -> Result<SqsBatchResponse, FunctionError> {
    // Without a message id a failure cannot be reported: the batch is broken.
    let mut batch = Vec::new();
    let mut deliveries = Vec::new();
    for record in event.payload.records {
        let id = record
            .message_id
            .filter(|m| !m.is_empty())
            .ok_or_else(|| FunctionError::new(FailureKind::BadEvent, "SQS record without messageId"))?;
        if let Some(message) = record.body.as_deref().and_then(sqs::delivery_message) {
            deliveries.push((id, message));
            continue;
        }
        let count = record.attributes.get("ApproximateReceiveCount").map(String::as_str);
        let group = record.attributes.get("MessageGroupId").map(String::as_str);
        batch.push(sqs::received(id, record.receipt_handle, record.body.as_deref(), count, group));
    }
    let mut response = SqsBatchResponse::default();
    if !batch.is_empty() {
        let stay = hookledger::batch::process(app.processor.clone(), app.queue.clone(), batch)
            .await
            .map_err(|e| FunctionError::new(FailureKind::WorkerFailed, e))?;
        for id in stay {
            response.add_failure(id);
        }
    }
    for id in deliver(&app.dispatcher, deliveries).await {
        response.add_failure(id);
    }
    Ok(response)
}

/// The delivery queue's messages, taken at once; the ids of those whose
/// ledger calls failed (they come back after the visibility timeout).
async fn deliver(dispatcher: &LiveDispatcher, messages: Vec<(String, DeliveryMessage)>) -> Vec<String> {
    let clock = hookledger::clock::Ambient::system();
    let takes = messages.into_iter().map(|(id, message)| {
        let now = clock.now_ms();
        async move {
            match dispatcher.take(&message, now).await {
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "delivery message not taken; it comes back");
                    Some(id)
                }
            }
        }
    });
    futures::future::join_all(takes).await.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::event::sqs::SqsMessage;
    use hookledger::adapters::sqs::WorkMessage;
    use hookledger::identity::EventKey;
    use proptest::prelude::*;

    /// An app whose AWS endpoint refuses connections: a record that parses
    /// fails on its ledger read, one that does not never reaches it.
    fn offline_app() -> Arc<App> {
        let aws = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
                aws_sdk_dynamodb::config::Credentials::new("k", "s", None, None, "test"),
            ))
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .build();
        let vars = |k: &str| match k {
            "HOOKLEDGER_TABLE" => Some("t".to_owned()),
            "HOOKLEDGER_QUEUE_URL" => Some("http://127.0.0.1:9/q".to_owned()),
            _ => None,
        };
        let settings = hookledger::wiring::Settings::from_lookup(vars).unwrap();
        Arc::new(from_wiring(&Wiring::new(aws, settings), Registry::new()).unwrap())
    }

    fn record(id: Option<String>, body: Option<String>, count: Option<String>) -> SqsMessage {
        let mut m = SqsMessage::default();
        m.message_id = id;
        m.receipt_handle = Some("r".into());
        m.body = body;
        if let Some(c) = count {
            m.attributes.insert("ApproximateReceiveCount".into(), c);
        }
        m
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Random batches (bodies: garbage, JSON, work messages with odd
        /// keys, repeats; receive counts: numbers and garbage): no panic;
        /// every record that is not a readable work message is reported
        /// failed (it stays for the dead-letter queue) and only records of
        /// the batch are; a record without a message id fails the batch.
        #[test]
        fn random_sqs_batches_fail_record_by_record_never_panic(
            records in prop::collection::vec((
                prop::option::weighted(0.95, "[a-z0-9-]{1,12}"),
                prop::option::weighted(0.95, prop_oneof![
                    "\\PC{0,60}",
                    "\\{\"v\": ?1, ?\"key\": ?\"[ -~]{0,30}\"\\}",
                    "evt#[a-z]{1,6}#[a-z]{1,6}#[a-z0-9]{1,8}".prop_map(|k| serde_json::json!({"v": 1, "key": k, "body": "{}"}).to_string()),
                    "[ -~]{0,20}".prop_map(|k| serde_json::json!({"v": 1, "key": k, "body_b64": "!!"}).to_string()),
                ]),
                prop::option::of(prop_oneof!["[0-9]{1,3}", "[ -~]{0,5}"]),
            ), 0..8)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let ids: Vec<Option<String>> = records.iter().map(|r| r.0.clone()).collect();
            let malformed: Vec<String> = records
                .iter()
                .filter(|(_, body, _)| {
                    body.as_deref()
                        .and_then(|b| serde_json::from_str::<WorkMessage>(b).ok())
                        .and_then(|m| EventKey::from_stored(&m.key))
                        .is_none()
                })
                .filter_map(|(id, _, _)| id.clone())
                .collect();
            let mut event = SqsEvent::default();
            event.records = records.into_iter().map(|(id, body, count)| record(id, body, count)).collect();
            let out = rt.block_on(handle(offline_app(), LambdaEvent::new(event, lambda_runtime::Context::default())));
            if ids.iter().any(|id| id.as_deref().is_none_or(str::is_empty)) {
                let d: lambda_runtime::Diagnostic = out.unwrap_err().into();
                prop_assert_eq!(d.error_type, "Hookledger.BadEvent");
            } else {
                let failed: Vec<String> = out.unwrap().batch_item_failures.into_iter().map(|f| f.item_identifier).collect();
                for id in &failed {
                    prop_assert!(ids.iter().any(|i| i.as_deref() == Some(id.as_str())), "{id} is not in the batch");
                }
                for id in &malformed {
                    prop_assert!(failed.contains(id), "malformed {id} not reported");
                }
            }
        }
    }
}
