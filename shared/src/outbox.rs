//! Effectively-once side effects outside DynamoDB: the transactional outbox.
//!
//! A projection's notification is written as an outbox item in the same
//! transaction as its state change and the completion marker. A dispatcher
//! then claims the item (conditional update), publishes to SNS with a stable
//! idempotency key derived from the event identity (message attribute always;
//! FIFO deduplication id when the topic is FIFO), and marks it sent. A crash
//! between publish and mark leaves the item claimed; once that claim lapses
//! the item is published again — with the same key, so consumers (and FIFO
//! topics) drop the repeat.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use aws_sdk_sns::types::MessageAttributeValue;

use crate::adapters::dynamodb::due_shard_named;
use crate::identity::EventKey;
use crate::ledger::PortError;
use crate::projection::fetch::idempotency_key;

pub const OUTBOX_SK: &str = "outbox";
pub const IDEMPOTENCY_ATTRIBUTE: &str = "idempotency-key";
/// How long a dispatcher may hold an outbox item between claim and mark.
pub const DISPATCH_LEASE_MS: i64 = 30_000;

/// A notification a projection wants sent if (and only if) its op applies.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    pub topic_arn: String,
    /// The logical action, e.g. `subscription.changed`; part of the idempotency key.
    pub action: String,
    /// Ordering group for FIFO topics (e.g. the subject id).
    pub group: String,
    pub body: serde_json::Value,
}

/// The outbox item for `msg` produced by the event `key`.
pub fn outbox_put(
    table: &str,
    key: &EventKey,
    msg: &OutboxMessage,
    now_ms: i64,
    shards: u32,
) -> (String, TransactWriteItem) {
    let idem = idempotency_key(key.as_str(), &msg.action);
    let pk = format!("outbox#{idem}");
    let shard = EventKey::from_stored(key.as_str()).map_or(0, |k| k.shard(shards));
    let item = HashMap::from([
        ("pk".to_owned(), AttributeValue::S(pk.clone())),
        ("sk".to_owned(), AttributeValue::S(OUTBOX_SK.to_owned())),
        ("status".to_owned(), AttributeValue::S("PENDING".into())),
        ("idempotency_key".to_owned(), AttributeValue::S(idem)),
        ("event_key".to_owned(), AttributeValue::S(key.as_str().to_owned())),
        ("topic_arn".to_owned(), AttributeValue::S(msg.topic_arn.clone())),
        ("action".to_owned(), AttributeValue::S(msg.action.clone())),
        ("group_id".to_owned(), AttributeValue::S(msg.group.clone())),
        ("body".to_owned(), AttributeValue::S(msg.body.to_string())),
        ("created_at".to_owned(), AttributeValue::N(now_ms.to_string())),
        ("due_shard".to_owned(), AttributeValue::S(due_shard_named("out", shard))),
        ("due_at".to_owned(), AttributeValue::N(now_ms.to_string())),
    ]);
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap_or_else(|e| unreachable!("table and item are set: {e}"));
    (pk, TransactWriteItem::builder().put(put).build())
}

/// Where a crash is injected in tests ("die between publish and mark").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DispatchFault {
    #[default]
    None,
    AfterPublishBeforeMark,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatched {
    Published,
    /// Sent already, or claimed by a live dispatcher.
    Skipped,
}

#[derive(Clone)]
pub struct Dispatcher {
    ddb: aws_sdk_dynamodb::Client,
    sns: aws_sdk_sns::Client,
    table: String,
    pub fault: DispatchFault,
}

impl Dispatcher {
    pub fn new(ddb: aws_sdk_dynamodb::Client, sns: aws_sdk_sns::Client, table: impl Into<String>) -> Self {
        Self { ddb, sns, table: table.into(), fault: DispatchFault::None }
    }

    /// Claims, publishes and marks one outbox item.
    pub async fn dispatch(&self, pk: &str, now_ms: i64) -> Result<Dispatched, PortError> {
        let token = uuid::Uuid::new_v4().to_string();
        let key = HashMap::from([
            ("pk".to_owned(), AttributeValue::S(pk.to_owned())),
            ("sk".to_owned(), AttributeValue::S(OUTBOX_SK.to_owned())),
        ]);
        // Timeline guarded: two dispatchers (the processor that wrote the item
        // and a sweeper) must not both publish; a dispatcher that died after
        // claiming must not block the item forever.
        let claimed = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key.clone()))
            .update_expression(
                "SET #s = :sending, dispatch_token = :tok, dispatch_until = :until ADD dispatch_attempts :one",
            )
            .condition_expression("#s = :pending OR (#s = :sending AND dispatch_until < :now)")
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":sending", AttributeValue::S("SENDING".into()))
            .expression_attribute_values(":pending", AttributeValue::S("PENDING".into()))
            .expression_attribute_values(":tok", AttributeValue::S(token.clone()))
            .expression_attribute_values(":until", AttributeValue::N((now_ms + DISPATCH_LEASE_MS).to_string()))
            .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .send()
            .await;
        let item = match claimed {
            Ok(out) => out.attributes.unwrap_or_default(),
            Err(e) if e.as_service_error().is_some_and(|se| se.is_conditional_check_failed_exception()) => {
                return Ok(Dispatched::Skipped);
            }
            Err(e) => return Err(crate::adapters::port_error("dynamodb", &e)),
        };
        let get = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        let (topic, idem, group, body) = (get("topic_arn"), get("idempotency_key"), get("group_id"), get("body"));

        let attr = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(&idem)
            .build()
            .map_err(|e| PortError::Unavailable { service: "sns", message: e.to_string() })?;
        let mut publish =
            self.sns.publish().topic_arn(&topic).message(body).message_attributes(IDEMPOTENCY_ATTRIBUTE, attr);
        if topic.ends_with(".fifo") {
            publish = publish
                .message_group_id(if group.is_empty() { "default".to_owned() } else { group })
                .message_deduplication_id(&idem);
        }
        publish
            .send()
            .await
            .map_err(|e| PortError::Unavailable { service: "sns", message: crate::adapters::error_chain(&e) })?;
        metrics::counter!("outbox_published").increment(1);

        if self.fault == DispatchFault::AfterPublishBeforeMark {
            return Err(PortError::Unavailable {
                service: "injected",
                message: "crash after publish, before mark".into(),
            });
        }
        self.ddb
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .update_expression("SET #s = :sent, sent_at = :now REMOVE due_shard, due_at, dispatch_until")
            .condition_expression("dispatch_token = :tok")
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":sent", AttributeValue::S("SENT".into()))
            .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()))
            .expression_attribute_values(":tok", AttributeValue::S(token))
            .send()
            .await
            .map_err(|e| crate::adapters::port_error("dynamodb", &e))?;
        Ok(Dispatched::Published)
    }

    /// Publishes outbox items that are still pending (or whose dispatcher
    /// died) from the `due` index shards `out#000..`, oldest first, at most
    /// `limit`. Items younger than `grace_ms` are left to their processor.
    pub async fn sweep(&self, shards: u32, now_ms: i64, grace_ms: i64, limit: usize) -> Result<usize, PortError> {
        let mut published = 0;
        for shard in 0..shards {
            let out = self
                .ddb
                .query()
                .table_name(&self.table)
                .index_name(crate::adapters::dynamodb::DUE_INDEX)
                .key_condition_expression("due_shard = :s AND due_at <= :t")
                .expression_attribute_values(":s", AttributeValue::S(due_shard_named("out", shard)))
                .expression_attribute_values(":t", AttributeValue::N((now_ms - grace_ms).to_string()))
                .limit(limit as i32)
                .send()
                .await
                .map_err(|e| crate::adapters::port_error("dynamodb", &e))?;
            for item in out.items.unwrap_or_default() {
                if published >= limit {
                    return Ok(published);
                }
                if let Some(pk) = item.get("pk").and_then(|v| v.as_s().ok()) {
                    if self.dispatch(pk, now_ms).await? == Dispatched::Published {
                        published += 1;
                    }
                }
            }
        }
        Ok(published)
    }
}
