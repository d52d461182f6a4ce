//! The work queue on SQS: one message per event key.

use aws_sdk_sqs::Client;
use serde::{Deserialize, Serialize};

use crate::identity::EventKey;
use crate::ledger::{PortError, WorkQueue};

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

/// Creates a standard queue (idempotent) and returns its URL.
pub async fn create_queue(client: &Client, name: &str) -> Result<String, String> {
    let out = client.create_queue().queue_name(name).send().await.map_err(|e| super::error_chain(&e))?;
    out.queue_url.ok_or_else(|| "CreateQueue returned no URL".to_owned())
}
