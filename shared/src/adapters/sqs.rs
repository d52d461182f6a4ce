//! The work queue on SQS: one message per event key.

use aws_sdk_sqs::Client;
use serde::{Deserialize, Serialize};

use crate::identity::EventKey;
use crate::ledger::PortError;
use crate::ports::WorkQueue;

/// The queue message body. Only the key travels; the ledger holds the rest.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkMessage {
    pub v: u32,
    pub key: String,
}

impl WorkMessage {
    pub fn new(key: &EventKey) -> Self {
        Self { v: 1, key: key.as_str().to_owned() }
    }
}

#[derive(Clone)]
pub struct SqsQueue {
    client: Client,
    queue_url: String,
}

impl SqsQueue {
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self { client, queue_url: queue_url.into() }
    }
}

impl WorkQueue for SqsQueue {
    async fn send(&self, key: &EventKey) -> Result<(), PortError> {
        let body = serde_json::to_string(&WorkMessage::new(key))
            .map_err(|e| PortError::Unavailable { service: "sqs", message: e.to_string() })?;
        self.client.send_message().queue_url(&self.queue_url).message_body(body).send().await.map_err(|e| {
            use aws_sdk_sqs::error::ProvideErrorMetadata;
            let throttled = e
                .as_service_error()
                .and_then(|se| se.code())
                .is_some_and(|c| c.contains("Throttl") || c == "RequestThrottled");
            if throttled {
                PortError::Throttled { service: "sqs" }
            } else {
                PortError::Unavailable { service: "sqs", message: super::error_chain(&e) }
            }
        })?;
        Ok(())
    }
}

/// The work queue's visibility timeout: at least 6 x the processor timeout (20 s).
pub const WORK_QUEUE_VISIBILITY_SECS: i32 = 120;
/// Receives before a work message moves to the dead-letter queue.
pub const MAX_RECEIVE_COUNT: i32 = 10;

/// Creates a standard queue (idempotent) and returns its URL.
pub async fn create_queue(client: &Client, name: &str) -> Result<String, String> {
    let out = client.create_queue().queue_name(name).send().await.map_err(|e| super::error_chain(&e))?;
    out.queue_url.ok_or_else(|| "CreateQueue returned no URL".to_owned())
}

/// The URLs of the work queue and its dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkQueues {
    pub work_url: String,
    pub dead_letter_url: String,
}

/// Creates the work queue as the SAM template defines it: visibility
/// [`WORK_QUEUE_VISIBILITY_SECS`], redrive to `<name>-dlq` after
/// [`MAX_RECEIVE_COUNT`] receives (idempotent).
pub async fn create_work_queues(client: &Client, name: &str) -> Result<WorkQueues, String> {
    use aws_sdk_sqs::types::QueueAttributeName;
    let dead_letter_url = create_queue(client, &format!("{name}-dlq")).await?;
    let attrs = client
        .get_queue_attributes()
        .queue_url(&dead_letter_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| super::error_chain(&e))?;
    let dlq_arn = attrs
        .attributes
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .ok_or("dead-letter queue has no ARN")?;
    let redrive =
        serde_json::json!({ "deadLetterTargetArn": dlq_arn, "maxReceiveCount": MAX_RECEIVE_COUNT }).to_string();
    let out = client
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::VisibilityTimeout, WORK_QUEUE_VISIBILITY_SECS.to_string())
        .attributes(QueueAttributeName::RedrivePolicy, redrive)
        .send()
        .await
        .map_err(|e| super::error_chain(&e))?;
    let work_url = out.queue_url.ok_or("CreateQueue returned no URL")?;
    Ok(WorkQueues { work_url, dead_letter_url })
}
