//! Translates an SQS batch into processor calls and the results into a
//! partial batch response. Each record is parsed on its own (a malformed
//! body fails that record only); records for different keys run
//! concurrently, repeats of one key in a batch run in order.
//!
//! A record that must come back later stays on the queue, hidden for its
//! delay rounded up to whole seconds (never early: an early return only
//! burns a receive). On its last receive before the queue's dead-letter
//! redrive it is deleted instead: the ledger record is RETRYABLE (or leased)
//! with its due time in the `due` index, and the reconciler re-drives it
//! then. Long waits (gaps, infrastructure outages) thus never reach the DLQ,
//! which stays for messages that cannot be read at all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::https::lazy_subscription_source;
use hookledger::adapters::s3::S3Payloads;
use hookledger::adapters::sqs::{MAX_RECEIVE_COUNT, SqsQueue, WorkMessage};
use hookledger::app::reference_registry;
use hookledger::config::{self, ConfigError};
use hookledger::identity::EventKey;
use hookledger::outbox::Dispatcher;
use hookledger::processor::Processor;
use hookledger::telemetry::{FailureKind, FunctionError};
use lambda_runtime::LambdaEvent;

/// SQS caps a message's visibility at 12 hours.
const MAX_VISIBILITY_SECS: i64 = 43_200;

pub struct App {
    pub processor: Processor,
    pub sqs: aws_sdk_sqs::Client,
    pub queue_url: String,
}

/// Builds the processor from the environment (see README, configuration reference).
pub async fn from_env(aws: &aws_config::SdkConfig) -> Result<App, ConfigError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let table = env("HOOKLEDGER_TABLE").ok_or(ConfigError::Missing("HOOKLEDGER_TABLE"))?;
    let queue_url = env("HOOKLEDGER_QUEUE_URL").ok_or(ConfigError::Missing("HOOKLEDGER_QUEUE_URL"))?;
    let settings = config::processor_settings_from(env)?;
    let notify_topic = env("HOOKLEDGER_NOTIFY_TOPIC_ARN");
    // The Stripe key is read, and its client built, by the first subscription fetch.
    let source = lazy_subscription_source(env, aws)?;
    let ddb = aws_sdk_dynamodb::Client::new(aws);
    let sqs = aws_sdk_sqs::Client::new(aws);
    let dispatcher = Dispatcher::new(ddb.clone(), aws_sdk_sns::Client::new(aws), table.clone());
    let mut ledger = DynamoLedger::new(ddb, table);
    if let Some(bucket) = env("HOOKLEDGER_PAYLOAD_BUCKET") {
        ledger = ledger.with_payload_bucket(S3Payloads::from_config(aws, bucket));
    }
    let processor = Processor::new(ledger, reference_registry(source, notify_topic), Some(dispatcher), settings)
        .with_queue(SqsQueue::new(sqs.clone(), &queue_url));
    Ok(App { processor, sqs, queue_url })
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The visibility timeout (whole seconds) that shows a message again after
/// `delay_ms`: rounded up, so it never comes back before it is due.
pub fn visibility_secs(delay_ms: i64) -> i32 {
    let delay_ms = delay_ms.max(0);
    let secs = delay_ms / 1000 + i64::from(delay_ms % 1000 != 0);
    secs.clamp(1, MAX_VISIBILITY_SECS) as i32
}

/// Whether this is the message's last receive before the queue moves it to
/// the dead-letter queue (`ApproximateReceiveCount` from the record).
pub fn last_receive(receive_count: Option<&str>) -> bool {
    receive_count.and_then(|c| c.trim().parse::<i64>().ok()).is_some_and(|c| c >= i64::from(MAX_RECEIVE_COUNT))
}

/// One record's fate: `Ok(())` delete it, `Err(())` leave it on the queue.
async fn one(app: &App, message_id: &str, receipt: Option<&str>, body: Option<&str>, last: bool) -> Result<(), ()> {
    let message = body.and_then(|b| serde_json::from_str::<WorkMessage>(b).ok());
    let Some((key, message)) = message.and_then(|m| EventKey::from_stored(&m.key).map(|k| (k, m))) else {
        tracing::error!(message_id, "malformed work message; leaving it for the dead-letter queue");
        return Err(());
    };
    let carried = message.payload();
    match app.processor.process_message(&key, carried.as_deref(), now_ms()).await {
        Ok(report) => match report.retry_after_ms {
            None => Ok(()),
            Some(delay_ms) if last => {
                tracing::info!(message_id, key = %key, delay_ms, "last receive; the reconciler re-drives it when due");
                Ok(())
            }
            Some(delay_ms) => {
                if let Some(receipt) = receipt {
                    let secs = visibility_secs(delay_ms);
                    let changed = app
                        .sqs
                        .change_message_visibility()
                        .queue_url(&app.queue_url)
                        .receipt_handle(receipt)
                        .visibility_timeout(secs)
                        .send()
                        .await;
                    if let Err(e) = changed {
                        tracing::warn!(message_id, error = %e, "could not change visibility; default redelivery applies");
                    }
                }
                Err(())
            }
        },
        Err(e) => {
            tracing::warn!(message_id, key = %key, error = %e, "processing failed; message stays on the queue");
            Err(())
        }
    }
}

/// (message id, receipt handle, body, last receive) of one record.
type Received = (String, Option<String>, Option<String>, bool);

pub async fn handle(app: Arc<App>, event: LambdaEvent<SqsEvent>) -> Result<SqsBatchResponse, FunctionError> {
    // Without a message id a failure cannot be reported: the batch is broken.
    let mut groups: BTreeMap<String, Vec<Received>> = BTreeMap::new();
    for record in event.payload.records {
        let id = record
            .message_id
            .filter(|m| !m.is_empty())
            .ok_or_else(|| FunctionError::new(FailureKind::BadEvent, "SQS record without messageId"))?;
        let group = record.body.clone().unwrap_or_default();
        let last = last_receive(record.attributes.get("ApproximateReceiveCount").map(String::as_str));
        groups.entry(group).or_default().push((id, record.receipt_handle, record.body, last));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (_, records) in groups {
        let app = app.clone();
        tasks.spawn(async move {
            let mut failed = Vec::new();
            for (id, receipt, body, last) in records {
                if one(&app, &id, receipt.as_deref(), body.as_deref(), last).await.is_err() {
                    failed.push(id);
                }
            }
            failed
        });
    }
    let mut response = SqsBatchResponse::default();
    while let Some(done) = tasks.join_next().await {
        for id in done.map_err(|e| FunctionError::new(FailureKind::WorkerFailed, e))? {
            response.add_failure(id);
        }
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::event::sqs::SqsMessage;
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
        let ddb = aws_sdk_dynamodb::Client::new(&aws);
        let sqs = aws_sdk_sqs::Client::new(&aws);
        let processor = Processor::new(
            DynamoLedger::new(ddb, "t"),
            reference_registry(None, None),
            None,
            hookledger::config::ProcessorSettings::default(),
        );
        Arc::new(App { processor, sqs, queue_url: "http://127.0.0.1:9/q".into() })
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

    #[test]
    fn visibility_delay_is_rounded_up_never_early() {
        assert_eq!(visibility_secs(1_000), 1);
        assert_eq!(visibility_secs(1_001), 2, "1.001 s must not come back after 1 s");
        assert_eq!(visibility_secs(1_999), 2);
        assert_eq!(visibility_secs(29_500), 30);
        assert_eq!(visibility_secs(0), 1, "at least one second");
        assert_eq!(visibility_secs(-5), 1);
        assert_eq!(visibility_secs(i64::MAX), MAX_VISIBILITY_SECS as i32, "capped at SQS's 12 hours");
    }

    #[test]
    fn only_the_receive_before_the_dead_letter_redrive_is_the_last() {
        assert!(!last_receive(Some("1")));
        assert!(!last_receive(Some("9")));
        assert!(last_receive(Some("10")));
        assert!(last_receive(Some("11")));
        assert!(!last_receive(None), "unknown: keep the message");
        assert!(!last_receive(Some("many")));
    }
}
