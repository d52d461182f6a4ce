//! The ledger on DynamoDB.
//!
//! One table, two item kinds under the same partition key:
//! - `sk = "meta"`: the small ledger record (status, hashes, counters, index keys);
//! - `sk = "payload#<sha256>"`: the raw body, written once, never rewritten by
//!   status updates (DynamoDB bills a write by the whole item's size).
//!
//! Non-terminal records carry `due_shard`/`due_at`, the keys of the sparse,
//! sharded `due` index the reconciler queries (never a scan).

pub mod outbox;
pub mod work;

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TimeToLiveSpecification,
};

use super::port_error;
use crate::identity::EventKey;
use crate::ledger::{Claim, ExistingRecord, Ledger, NewEvent, PortError, SendLease, Status};
use crate::policy::{DEFAULT_INDEX_SHARDS, REDRIVE_GRACE_MS, due_shard_named};

pub const META_SK: &str = "meta";
pub const DUE_INDEX: &str = "due";
pub const STATUS_INDEX: &str = "status";
pub const TTL_ATTRIBUTE: &str = "expires_at";

/// Attribute names of the ledger record.
pub mod attr {
    pub const PK: &str = "pk";
    pub const SK: &str = "sk";
    pub const PROVIDER: &str = "provider";
    pub const ENDPOINT: &str = "endpoint";
    pub const TENANT: &str = "tenant";
    pub const EVENT_ID: &str = "event_id";
    pub const EVENT_TYPE: &str = "event_type";
    pub const STATUS: &str = "status";
    pub const PAYLOAD_HASH: &str = "payload_hash";
    pub const CONTENT_HASH: &str = "content_hash";
    pub const PAYLOAD_STORED: &str = "payload_stored";
    pub const RECEIVED_AT: &str = "received_at";
    pub const ENQUEUED_AT: &str = "enqueued_at";
    pub const ATTEMPTS: &str = "attempts";
    pub const CONFLICTS: &str = "conflicts";
    pub const LAST_CONFLICT_HASH: &str = "last_conflict_hash";
    pub const LAST_CONFLICT_AT: &str = "last_conflict_at";
    pub const SEND_TOKEN: &str = "send_token";
    pub const SEND_LEASE_UNTIL: &str = "send_lease_until";
    pub const ST_SHARD: &str = "st_shard";
    pub const ST_AT: &str = "st_at";
    pub const DUPLICATES: &str = "duplicates";
    pub const SUBJECT: &str = "subject";
    pub const DUE_SHARD: &str = "due_shard";
    pub const DUE_AT: &str = "due_at";
    pub const BODY: &str = "body";
    pub const EXPIRES_AT: &str = super::TTL_ATTRIBUTE;
}

pub fn payload_sk(payload_hash: &str) -> String {
    format!("payload#{payload_hash}")
}

pub fn due_shard(shard: u32) -> String {
    due_shard_named("due", shard)
}

/// Status-index partition: `DEAD#007`. Every ledger record is in it (sorted
/// by receive time), so operators list and count by status without a scan.
pub fn status_shard(status: Status, shard: u32) -> String {
    format!("{}#{shard:03}", status.as_str())
}

#[derive(Clone)]
pub struct DynamoLedger {
    client: Client,
    table: String,
    shards: u32,
}

impl DynamoLedger {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self { client, table: table.into(), shards: DEFAULT_INDEX_SHARDS }
    }

    /// Sets the number of index shards (must match the intake's `HOOKLEDGER_INDEX_SHARDS`).
    pub fn with_shards(mut self, shards: u32) -> Self {
        self.shards = shards.max(1);
        self
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The status-index partition of `key` in `status`.
    pub fn status_shard(&self, status: Status, key: &EventKey) -> String {
        status_shard(status, key.shard(self.shards))
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    fn key(key: &EventKey, sk: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (attr::PK.to_owned(), AttributeValue::S(key.as_str().to_owned())),
            (attr::SK.to_owned(), AttributeValue::S(sk.to_owned())),
        ])
    }

    /// Writes the payload item (idempotent: same key, same bytes).
    async fn put_payload(&self, key: &EventKey, hash: &str, body: &[u8], expires_at: i64) -> Result<(), PortError> {
        let mut item = Self::key(key, &payload_sk(hash));
        item.insert(attr::BODY.into(), AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(body)));
        item.insert(attr::EXPIRES_AT.into(), n(expires_at));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn read_meta(&self, key: &EventKey) -> Result<Option<HashMap<String, AttributeValue>>, PortError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key, META_SK)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(out.item)
    }
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn get_s<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> Option<&'a str> {
    item.get(name).and_then(|v| v.as_s().ok()).map(String::as_str)
}

fn get_n(item: &HashMap<String, AttributeValue>, name: &str) -> Option<i64> {
    item.get(name).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok())
}

/// Reads the parts of a stored record the intake decides on.
pub fn existing_from_item(item: &HashMap<String, AttributeValue>) -> Result<ExistingRecord, PortError> {
    let corrupt = |what: &str| PortError::Unavailable {
        service: "dynamodb",
        message: format!("ledger record has no valid {what}"),
    };
    Ok(ExistingRecord {
        status: get_s(item, attr::STATUS).and_then(Status::parse).ok_or_else(|| corrupt(attr::STATUS))?,
        payload_hash: get_s(item, attr::PAYLOAD_HASH).ok_or_else(|| corrupt(attr::PAYLOAD_HASH))?.to_owned(),
        content_hash: get_s(item, attr::CONTENT_HASH).map(str::to_owned),
        enqueued_at_ms: get_n(item, attr::ENQUEUED_AT),
        payload_stored: item.get(attr::PAYLOAD_STORED).and_then(|v| v.as_bool().ok()).copied().unwrap_or(false),
    })
}

/// The new ledger record, as written by the claim.
pub fn new_record_item(event: &NewEvent) -> HashMap<String, AttributeValue> {
    let mut item = DynamoLedger::key(&event.key, META_SK);
    item.insert(attr::PROVIDER.into(), s(&event.provider));
    item.insert(attr::ENDPOINT.into(), s(&event.endpoint));
    item.insert(attr::TENANT.into(), s(&event.tenant));
    item.insert(attr::EVENT_ID.into(), s(&event.event_id));
    if let Some(t) = &event.event_type {
        item.insert(attr::EVENT_TYPE.into(), s(t));
    }
    item.insert(attr::STATUS.into(), s(Status::Received.as_str()));
    item.insert(attr::PAYLOAD_HASH.into(), s(&event.payload_hash));
    item.insert(attr::CONTENT_HASH.into(), s(&event.content_hash));
    item.insert(attr::PAYLOAD_STORED.into(), AttributeValue::Bool(false));
    item.insert(attr::RECEIVED_AT.into(), n(event.received_at_ms));
    item.insert(attr::ATTEMPTS.into(), n(0));
    item.insert(attr::CONFLICTS.into(), n(0));
    item.insert(attr::EXPIRES_AT.into(), n(event.expires_at));
    item.insert(attr::SEND_TOKEN.into(), s(&event.send.token));
    item.insert(attr::SEND_LEASE_UNTIL.into(), n(event.send.until_ms));
    item.insert(attr::DUE_SHARD.into(), s(due_shard(event.shard)));
    item.insert(attr::ST_SHARD.into(), s(status_shard(Status::Received, event.shard)));
    item.insert(attr::ST_AT.into(), n(event.received_at_ms));
    item.insert(attr::DUE_AT.into(), n(event.received_at_ms + REDRIVE_GRACE_MS));
    item
}

impl Ledger for DynamoLedger {
    async fn claim(&self, event: &NewEvent) -> Result<Claim, PortError> {
        // Timeline guarded: two deliveries (or our own SDK retry after a lost
        // response) race to create the record; exactly one put passes
        // attribute_not_exists, the other gets the winner's item back. A put
        // that committed and lost its acknowledgement is retried by the SDK
        // and fails against its own record: the send token it wrote says so,
        // and the claim is ours (`Claim::New`), never a duplicate.
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(new_record_item(event)))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Claim::New),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(e)) => {
                    let item = match e.item() {
                        Some(item) => item.clone(),
                        // Emulators without ReturnValuesOnConditionCheckFailure: read it.
                        None => self.read_meta(&event.key).await?.ok_or_else(|| PortError::Unavailable {
                            service: "dynamodb",
                            message: "record vanished after a failed claim".into(),
                        })?,
                    };
                    if get_s(&item, attr::SEND_TOKEN) == Some(event.send.token.as_str()) {
                        return Ok(Claim::New);
                    }
                    Ok(Claim::Existing(existing_from_item(&item)?))
                }
                _ => Err(port_error("dynamodb", &err)),
            },
        }
    }

    async fn store_payload(
        &self,
        key: &EventKey,
        payload_hash: &str,
        body: &[u8],
        expires_at: i64,
    ) -> Result<(), PortError> {
        self.put_payload(key, payload_hash, body, expires_at).await?;
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key, META_SK)))
            .update_expression("SET payload_stored = :t")
            .condition_expression("attribute_exists(pk) AND payload_hash = :h")
            .expression_attribute_values(":t", AttributeValue::Bool(true))
            .expression_attribute_values(":h", s(payload_hash))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn take_send_lease(&self, key: &EventKey, lease: &SendLease, now_ms: i64) -> Result<bool, PortError> {
        // Timeline guarded: the creating delivery is still between its claim
        // and its send when a duplicate arrives; the duplicate must not send
        // too. Only a record never enqueued whose lease is free or expired
        // (its holder failed or crashed) can be taken over.
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key, META_SK)))
            .update_expression("SET send_token = :tok, send_lease_until = :until")
            .condition_expression(
                "attribute_exists(pk) AND attribute_not_exists(enqueued_at) \
                 AND (attribute_not_exists(send_lease_until) OR send_lease_until < :now)",
            )
            .expression_attribute_values(":tok", s(&lease.token))
            .expression_attribute_values(":until", n(lease.until_ms))
            .expression_attribute_values(":now", n(now_ms))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                // Our own retried update after a lost acknowledgement finds
                // the lease it took: still ours (unless the key was sent since).
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => Ok(c.item().is_some_and(|old| {
                    get_s(old, attr::SEND_TOKEN) == Some(lease.token.as_str()) && !old.contains_key(attr::ENQUEUED_AT)
                })),
                _ => Err(port_error("dynamodb", &e)),
            },
        }
    }

    async fn adopt_payload(
        &self,
        key: &EventKey,
        old_hash: &str,
        new_hash: &str,
        body: &[u8],
        expires_at: i64,
        conflict: bool,
    ) -> Result<bool, PortError> {
        self.put_payload(key, new_hash, body, expires_at).await?;
        // Timeline guarded: the creating delivery died (or is slow) between
        // its claim and its payload write, and a later delivery of the same
        // fact carries other bytes. Only a record whose first payload is
        // still missing takes ours; if the first lands meanwhile, its own
        // `payload_stored` update (conditioned on the old hash) fails and it
        // answers 503, or ours fails here and the first is kept. A retry of
        // this update after a lost acknowledgement finds our hash stored.
        let conflict_set = if conflict {
            " ADD conflicts :one SET last_conflict_hash = :old, payload_hash = :new, payload_stored = :t"
        } else {
            " SET payload_hash = :new, payload_stored = :t"
        };
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key, META_SK)))
            .update_expression(conflict_set.trim_start())
            .condition_expression(
                "attribute_exists(pk) AND payload_hash = :old \
                 AND (attribute_not_exists(payload_stored) OR payload_stored = :f)",
            )
            .expression_attribute_values(":old", s(old_hash))
            .expression_attribute_values(":new", s(new_hash))
            .expression_attribute_values(":t", AttributeValue::Bool(true))
            .expression_attribute_values(":f", AttributeValue::Bool(false))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if conflict {
            req = req.expression_attribute_values(":one", n(1));
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    let ours = c.item().is_some_and(|old| {
                        get_s(old, attr::PAYLOAD_HASH) == Some(new_hash)
                            && old.get(attr::PAYLOAD_STORED).and_then(|v| v.as_bool().ok()) == Some(&true)
                    });
                    Ok(ours)
                }
                _ => Err(port_error("dynamodb", &e)),
            },
        }
    }

    async fn release_send_lease(&self, key: &EventKey, lease: &SendLease) -> Result<(), PortError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key, META_SK)))
            .update_expression("REMOVE send_lease_until")
            .condition_expression("send_token = :tok")
            .expression_attribute_values(":tok", s(&lease.token))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // Someone else holds it now: nothing to release.
            Err(e) if e.as_service_error().is_some_and(|se| se.is_conditional_check_failed_exception()) => Ok(()),
            Err(e) => Err(port_error("dynamodb", &e)),
        }
    }

    async fn mark_enqueued(&self, key: &EventKey, at_ms: i64) -> Result<(), PortError> {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key, META_SK)))
            .update_expression("SET enqueued_at = :at REMOVE send_lease_until")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":at", n(at_ms))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn note_duplicate(&self, key: &EventKey) -> Result<(), PortError> {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key, META_SK)))
            .update_expression("ADD duplicates :one")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":one", n(1))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn flag_conflict(&self, key: &EventKey, other_hash: &str, at_ms: i64) -> Result<(), PortError> {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key, META_SK)))
            .update_expression(
                "ADD conflicts :one, duplicates :one SET last_conflict_hash = :h, last_conflict_at = :at",
            )
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":h", s(other_hash))
            .expression_attribute_values(":at", n(at_ms))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }
}

/// The table definition in CloudFormation's shape: what `create_table`
/// creates, and what `infra/check_template.py` compares with the SAM template.
pub fn table_definition() -> serde_json::Value {
    let gsi = |name: &str, hash: &str, range: &str| {
        serde_json::json!({
            "IndexName": name,
            "KeySchema": [{"AttributeName": hash, "KeyType": "HASH"}, {"AttributeName": range, "KeyType": "RANGE"}],
            "Projection": {"ProjectionType": "ALL"},
        })
    };
    serde_json::json!({
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [{"AttributeName": attr::PK, "KeyType": "HASH"}, {"AttributeName": attr::SK, "KeyType": "RANGE"}],
        "AttributeDefinitions": [
            {"AttributeName": attr::PK, "AttributeType": "S"},
            {"AttributeName": attr::SK, "AttributeType": "S"},
            {"AttributeName": attr::DUE_SHARD, "AttributeType": "S"},
            {"AttributeName": attr::DUE_AT, "AttributeType": "N"},
            {"AttributeName": attr::ST_SHARD, "AttributeType": "S"},
            {"AttributeName": attr::ST_AT, "AttributeType": "N"},
        ],
        "GlobalSecondaryIndexes": [gsi(DUE_INDEX, attr::DUE_SHARD, attr::DUE_AT), gsi(STATUS_INDEX, attr::ST_SHARD, attr::ST_AT)],
        "TimeToLiveSpecification": {"AttributeName": TTL_ATTRIBUTE, "Enabled": true},
    })
}

/// Creates the table from [`table_definition`]: keys, the sparse `due`
/// index, the `status` index, on-demand billing, TTL (idempotent).
pub async fn create_table(client: &Client, table: &str) -> Result<(), String> {
    let d = table_definition();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let keys = |schema: &serde_json::Value| -> Result<Vec<KeySchemaElement>, String> {
        schema
            .as_array()
            .into_iter()
            .flatten()
            .map(|k| {
                let kind = if k["KeyType"] == "HASH" { KeyType::Hash } else { KeyType::Range };
                KeySchemaElement::builder()
                    .attribute_name(text(&k["AttributeName"]))
                    .key_type(kind)
                    .build()
                    .map_err(|e| e.to_string())
            })
            .collect()
    };
    let mut req = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .set_key_schema(Some(keys(&d["KeySchema"])?));
    for a in d["AttributeDefinitions"].as_array().into_iter().flatten() {
        let t = if a["AttributeType"] == "N" { ScalarAttributeType::N } else { ScalarAttributeType::S };
        req = req.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(text(&a["AttributeName"]))
                .attribute_type(t)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    for g in d["GlobalSecondaryIndexes"].as_array().into_iter().flatten() {
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(text(&g["IndexName"]))
                .set_key_schema(Some(keys(&g["KeySchema"])?))
                .projection(Projection::builder().projection_type(ProjectionType::All).build())
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    match req.send().await {
        Ok(_) => {}
        Err(e) if e.as_service_error().is_some_and(|se| se.is_resource_in_use_exception()) => return Ok(()),
        Err(e) => return Err(super::error_chain(&e)),
    }
    let ttl = &d["TimeToLiveSpecification"];
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name(text(&ttl["AttributeName"]))
                .enabled(ttl["Enabled"].as_bool().unwrap_or(true))
                .build()
                .map_err(|e| e.to_string())?,
        )
        .send()
        .await
        .map_err(|e| super::error_chain(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_declares_every_key_the_code_writes() {
        let d = table_definition();
        let names: Vec<&str> = d["AttributeDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["AttributeName"].as_str().unwrap())
            .collect();
        assert_eq!(names, [attr::PK, attr::SK, attr::DUE_SHARD, attr::DUE_AT, attr::ST_SHARD, attr::ST_AT]);
        let indexes: Vec<&str> =
            d["GlobalSecondaryIndexes"].as_array().unwrap().iter().map(|i| i["IndexName"].as_str().unwrap()).collect();
        assert_eq!(indexes, [DUE_INDEX, STATUS_INDEX]);
        assert_eq!(d["TimeToLiveSpecification"]["AttributeName"], attr::EXPIRES_AT);
    }
}
