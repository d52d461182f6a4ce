//! Translates an SQS batch into processor calls and the results into a
//! partial batch response. Each record is parsed on its own (a malformed
//! body fails that record only); records for different keys run
//! concurrently, repeats of one key in a batch run in order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::secrets::AwsSecretResolver;
use hookledger::adapters::sqs::WorkMessage;
use hookledger::app::reference_registry;
use hookledger::config::{self, ConfigError};
use hookledger::identity::EventKey;
use hookledger::outbox::Dispatcher;
use hookledger::processor::Processor;
use lambda_runtime::{Error, LambdaEvent};

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
    let resolver = AwsSecretResolver::new(aws_sdk_ssm::Client::new(aws));
    let source = hookledger::adapters::stripe::source_from_env(env, &resolver).await?;
    let ddb = aws_sdk_dynamodb::Client::new(aws);
    let dispatcher = Dispatcher::new(ddb.clone(), aws_sdk_sns::Client::new(aws), table.clone());
    let processor = Processor::new(
        DynamoLedger::new(ddb, table),
        reference_registry(source, notify_topic),
        Some(dispatcher),
        settings,
    );
    Ok(App { processor, sqs: aws_sdk_sqs::Client::new(aws), queue_url })
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// One record's fate: `Ok(())` delete it, `Err(())` leave it on the queue.
async fn one(app: &App, message_id: &str, receipt: Option<&str>, body: Option<&str>) -> Result<(), ()> {
    let key =
        body.and_then(|b| serde_json::from_str::<WorkMessage>(b).ok()).and_then(|m| EventKey::from_stored(&m.key));
    let Some(key) = key else {
        tracing::error!(message_id, "malformed work message; leaving it for the dead-letter queue");
        return Err(());
    };
    match app.processor.process(&key, now_ms()).await {
        Ok(report) => match report.retry_after_ms {
            None => Ok(()),
            Some(delay_ms) => {
                if let Some(receipt) = receipt {
                    let secs = (delay_ms / 1000).clamp(1, MAX_VISIBILITY_SECS) as i32;
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

/// (message id, receipt handle, body) of one record.
type Received = (String, Option<String>, Option<String>);

pub async fn handle(app: Arc<App>, event: LambdaEvent<SqsEvent>) -> Result<SqsBatchResponse, Error> {
    // Without a message id a failure cannot be reported: the batch is broken.
    let mut groups: BTreeMap<String, Vec<Received>> = BTreeMap::new();
    for record in event.payload.records {
        let id = record.message_id.filter(|m| !m.is_empty()).ok_or("SQS record without messageId")?;
        let group = record.body.clone().unwrap_or_default();
        groups.entry(group).or_default().push((id, record.receipt_handle, record.body));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (_, records) in groups {
        let app = app.clone();
        tasks.spawn(async move {
            let mut failed = Vec::new();
            for (id, receipt, body) in records {
                if one(&app, &id, receipt.as_deref(), body.as_deref()).await.is_err() {
                    failed.push(id);
                }
            }
            failed
        });
    }
    let mut response = SqsBatchResponse::default();
    while let Some(done) = tasks.join_next().await {
        for id in done? {
            response.add_failure(id);
        }
    }
    Ok(response)
}
