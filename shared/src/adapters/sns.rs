//! Outbox publishing on SNS ([`Publisher`]): the idempotency key travels as
//! a message attribute always, and as the deduplication id on FIFO topics.

use aws_sdk_sns::types::MessageAttributeValue;

use super::error_chain;
use crate::ports::Publisher;

/// The message attribute carrying the idempotency key.
pub const IDEMPOTENCY_ATTRIBUTE: &str = "idempotency-key";

#[derive(Clone)]
pub struct SnsPublisher {
    client: aws_sdk_sns::Client,
}

impl SnsPublisher {
    pub fn new(client: aws_sdk_sns::Client) -> Self {
        Self { client }
    }
}

impl Publisher for SnsPublisher {
    async fn publish(&self, topic_arn: &str, body: &str, idempotency_key: &str, group: &str) -> Result<(), String> {
        let attr = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(idempotency_key)
            .build()
            .map_err(|e| e.to_string())?;
        let mut publish =
            self.client.publish().topic_arn(topic_arn).message(body).message_attributes(IDEMPOTENCY_ATTRIBUTE, attr);
        if topic_arn.ends_with(".fifo") {
            publish = publish
                .message_group_id(if group.is_empty() { "default" } else { group })
                .message_deduplication_id(idempotency_key);
        }
        publish.send().await.map(|_| ()).map_err(|e| error_chain(&e))
    }
}
