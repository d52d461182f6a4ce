//! The outbox item on DynamoDB: its attribute names and the conditional put
//! that writes it inside a processor's commit transaction.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

use crate::identity::EventKey;
use crate::message::{OutboxMessage, idempotency_key};
use crate::policy::due_shard_named;

pub const OUTBOX_SK: &str = "outbox";
/// Due-index partition prefix of outbox items: `out#007`.
pub const OUTBOX_SHARD_PREFIX: &str = "out";

/// Attribute names of the outbox item.
pub mod attr {
    pub const PK: &str = "pk";
    pub const SK: &str = "sk";
    pub const STATUS: &str = "status";
    pub const IDEMPOTENCY_KEY: &str = "idempotency_key";
    pub const EVENT_KEY: &str = "event_key";
    pub const TOPIC_ARN: &str = "topic_arn";
    pub const ACTION: &str = "action";
    pub const GROUP_ID: &str = "group_id";
    pub const BODY: &str = "body";
    pub const CREATED_AT: &str = "created_at";
    pub const DUE_SHARD: &str = "due_shard";
    pub const DUE_AT: &str = "due_at";
    pub const DISPATCH_TOKEN: &str = "dispatch_token";
    pub const DISPATCH_ATTEMPTS: &str = "dispatch_attempts";
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
        (attr::PK.to_owned(), AttributeValue::S(pk.clone())),
        (attr::SK.to_owned(), AttributeValue::S(OUTBOX_SK.to_owned())),
        (attr::STATUS.to_owned(), AttributeValue::S("PENDING".into())),
        (attr::IDEMPOTENCY_KEY.to_owned(), AttributeValue::S(idem)),
        (attr::EVENT_KEY.to_owned(), AttributeValue::S(key.as_str().to_owned())),
        (attr::TOPIC_ARN.to_owned(), AttributeValue::S(msg.topic_arn.clone())),
        (attr::ACTION.to_owned(), AttributeValue::S(msg.action.clone())),
        (attr::GROUP_ID.to_owned(), AttributeValue::S(msg.group.clone())),
        (attr::BODY.to_owned(), AttributeValue::S(msg.body.to_string())),
        (attr::CREATED_AT.to_owned(), AttributeValue::N(now_ms.to_string())),
        (attr::DUE_SHARD.to_owned(), AttributeValue::S(due_shard_named(OUTBOX_SHARD_PREFIX, shard))),
        (attr::DUE_AT.to_owned(), AttributeValue::N(now_ms.to_string())),
    ]);
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap_or_else(|e| unreachable!("table and item are set: {e}"));
    (pk, TransactWriteItem::builder().put(put).build())
}
