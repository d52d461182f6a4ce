//! Where outbox items go ([`Publisher`]), by the kind of their target's ARN:
//!
//! - an **SNS topic**: `Publish`, the idempotency key as the message
//!   attribute `idempotency-key` always, and as the deduplication id (with
//!   the group) on a FIFO topic;
//! - an **SQS queue**: `SendMessage` to the queue's URL, the key as the
//!   attribute `idempotency-key`; a standard queue gets `MessageGroupId` =
//!   the group (the tenant: fair queues), a FIFO one the group (the
//!   subject: order per subject) and `MessageDeduplicationId` = the key;
//! - an **EventBridge bus**: `PutEvents` of one entry (`Source`,
//!   `DetailType` = the event type, `Detail` = the envelope), its per-entry
//!   result checked (a failed entry is a failed publish);
//! - an **HTTPS endpoint** (its reference by name, `destination:<name>`,
//!   or an earlier release's URL): POSTed as Standard Webhooks by
//!   [`super::webhooks::HttpsSender`] to the URL its routes name, when the
//!   publisher has one.
//!
//! A FIFO group that SQS would refuse arrives here hashed already
//! (`message::message_group_id`, by the dispatcher).
//!
//! The EventBridge client is built on the first publish to a bus.

use std::sync::OnceLock;

use aws_sdk_sns::types::MessageAttributeValue;
use aws_sdk_sqs::types::MessageAttributeValue as SqsAttribute;

use super::error_chain;
use super::webhooks::HttpsSender;
use crate::ports::{Publication, PublishError, Publisher};
use crate::routes::{Arn, Kind};

/// The message attribute carrying the idempotency key (SNS and SQS).
pub const IDEMPOTENCY_ATTRIBUTE: &str = super::sns::IDEMPOTENCY_ATTRIBUTE;

#[derive(Clone)]
pub struct AwsPublisher {
    /// For the clients built on first use (SQS, EventBridge); `None`: SNS only.
    aws: Option<aws_config::SdkConfig>,
    sns: aws_sdk_sns::Client,
    sqs: std::sync::Arc<OnceLock<aws_sdk_sqs::Client>>,
    events: std::sync::Arc<OnceLock<aws_sdk_eventbridge::Client>>,
    /// HTTPS destinations (`None`: a URL target is refused).
    https: Option<HttpsSender>,
}

impl AwsPublisher {
    /// Every kind of destination, on `aws` (the SQS and EventBridge clients
    /// are built on their first publish).
    pub fn new(aws: &aws_config::SdkConfig) -> Self {
        Self {
            aws: Some(aws.clone()),
            sns: aws_sdk_sns::Client::new(aws),
            sqs: std::sync::Arc::default(),
            events: std::sync::Arc::default(),
            https: None,
        }
    }

    /// Sends to HTTPS destinations with `sender`.
    pub fn with_https(mut self, sender: HttpsSender) -> Self {
        self.https = Some(sender);
        self
    }

    /// Every kind of destination, on these clients (the EventBridge client
    /// built from `aws` on its first publish).
    pub fn with_clients(aws: &aws_config::SdkConfig, sns: aws_sdk_sns::Client, sqs: aws_sdk_sqs::Client) -> Self {
        let publisher = Self {
            aws: Some(aws.clone()),
            sns,
            sqs: std::sync::Arc::default(),
            events: std::sync::Arc::default(),
            https: None,
        };
        let _ = publisher.sqs.set(sqs);
        publisher
    }

    /// SNS topics only, on this client (tests that wire by hand).
    pub fn sns_only(sns: aws_sdk_sns::Client) -> Self {
        Self { aws: None, sns, sqs: std::sync::Arc::default(), events: std::sync::Arc::default(), https: None }
    }

    fn config(&self) -> Result<&aws_config::SdkConfig, String> {
        self.aws.as_ref().ok_or_else(|| "this publisher sends to SNS topics only".to_owned())
    }

    fn sqs_client(&self) -> Result<&aws_sdk_sqs::Client, String> {
        let aws = self.config()?;
        Ok(self.sqs.get_or_init(|| aws_sdk_sqs::Client::new(aws)))
    }

    fn events(&self) -> Result<&aws_sdk_eventbridge::Client, String> {
        let aws = self.config()?;
        Ok(self.events.get_or_init(|| aws_sdk_eventbridge::Client::new(aws)))
    }

    async fn sns(&self, out: Publication<'_>) -> Result<(), String> {
        let attr = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(out.idempotency_key)
            .build()
            .map_err(|e| e.to_string())?;
        let mut publish =
            self.sns.publish().topic_arn(out.target).message(out.body).message_attributes(IDEMPOTENCY_ATTRIBUTE, attr);
        if out.target.ends_with(".fifo") {
            publish = publish
                .message_group_id(if out.group.is_empty() { "default" } else { out.group })
                .message_deduplication_id(out.idempotency_key);
        }
        publish.send().await.map(|_| ()).map_err(|e| error_chain(&e))
    }

    async fn sqs(&self, arn: &Arn, fifo: bool, out: Publication<'_>) -> Result<(), String> {
        let attr = SqsAttribute::builder()
            .data_type("String")
            .string_value(out.idempotency_key)
            .build()
            .map_err(|e| e.to_string())?;
        let group = if out.group.is_empty() { "default" } else { out.group };
        let mut send = self
            .sqs_client()?
            .send_message()
            .queue_url(arn.queue_url())
            .message_body(out.body)
            .message_attributes(IDEMPOTENCY_ATTRIBUTE, attr)
            .message_group_id(group);
        if fifo {
            send = send.message_deduplication_id(out.idempotency_key);
        }
        send.send().await.map(|_| ()).map_err(|e| error_chain(&e))
    }

    async fn eventbridge(&self, out: Publication<'_>) -> Result<(), String> {
        let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .event_bus_name(out.target)
            .source(out.source.unwrap_or(crate::routes::DEFAULT_SOURCE))
            .detail_type(out.detail_type.unwrap_or(crate::routes::DEFAULT_DETAIL_TYPE))
            .detail(out.body)
            .build();
        let answer = self.events()?.put_events().entries(entry).send().await.map_err(|e| error_chain(&e))?;
        if answer.failed_entry_count() > 0 {
            let why = answer
                .entries()
                .iter()
                .find_map(|e| e.error_code().map(|c| format!("{c}: {}", e.error_message().unwrap_or(""))))
                .unwrap_or_else(|| "the entry failed".into());
            return Err(format!("eventbridge: {why}"));
        }
        Ok(())
    }
}

impl Publisher for AwsPublisher {
    async fn publish(&self, out: Publication<'_>) -> Result<(), PublishError> {
        if crate::routes::is_https_target(out.target) {
            let https = self.https.as_ref().ok_or_else(|| "this publisher sends to no HTTPS destination".to_owned())?;
            return https.send(out).await;
        }
        let arn = Arn::parse(out.target)?;
        match arn.kind {
            Kind::Sns => self.sns(out).await,
            Kind::Sqs { fifo } => self.sqs(&arn, fifo, out).await,
            Kind::EventBridge => self.eventbridge(out).await,
            Kind::Https => Err(format!("{} is not an ARN of a topic, queue or bus", out.target)),
        }
        .map_err(PublishError::from)
    }
}
