//! The table's names: item sort keys, index names and partitions,
//! attribute names, and the table definition itself. Everything else in
//! the adapter (the conditions, the actors) speaks in these names.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, TimeToLiveSpecification,
};

use crate::adapters::error_chain;
use crate::ledger::{DuePartition, Status};
use crate::policy::due_shard_named;

pub const META_SK: &str = "meta";
pub const DUE_INDEX: &str = "due";
/// The sparse index of what needs an operator: DEAD and PARKED records,
/// DEAD outbox items. Replaces the `status` index of earlier releases (see
/// docs/operations.md, "Upgrading a deployed stack").
pub const ATTENTION_INDEX: &str = "attention";
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
    pub const VIA: &str = "via";
    pub const SEND_LEASE_UNTIL: &str = "send_lease_until";
    pub const ATTN_SHARD: &str = "attn_shard";
    pub const ATTN_AT: &str = "attn_at";
    pub const DUPLICATES: &str = "duplicates";
    pub const SUBJECT: &str = "subject";
    pub const DUE_SHARD: &str = "due_shard";
    pub const DUE_AT: &str = "due_at";
    pub const BODY: &str = "body";
    pub const EXPIRES_AT: &str = super::TTL_ATTRIBUTE;
    /// On a notification's later generation: which it is.
    pub const GENERATION: &str = "generation";
    /// On a notification's first record: its latest generation.
    pub const LATEST_GENERATION: &str = "latest_generation";
    /// On a body binding (`body#…`): the key of the record it is bound to, and since when.
    pub const BOUND_KEY: &str = "bound_key";
    pub const BOUND_AT: &str = "bound_at";
    /// On a record: how often its body came again under another identity, the last such identity.
    pub const BODY_REPLAYS: &str = "body_replays";
    pub const LAST_BODY_REPLAY_ID: &str = "last_body_replay_id";
    /// On a record whose endpoint's payload policy is not `keep`: which it is.
    pub const PAYLOAD_POLICY: &str = "payload_policy";
    /// On a redacted record: the hash of the body as verified (`payload_hash` is of what is stored).
    pub const VERIFIED_HASH: &str = "verified_hash";
    /// On a record of the `drop_after` policy whose payload was dropped: when.
    pub const PAYLOAD_DROPPED_AT: &str = "payload_dropped_at";
    /// An erased record: when (`hookledger erase`; with `erased_by`, `erase_reason`).
    pub const ERASED_AT: &str = "erased_at";
}

/// The sort key of a body binding (`pk = body#<provider>#<endpoint>#<payload hash>`).
pub const BINDING_SK: &str = "binding";

/// The partition key of the binding of a body `payload_hash` delivered to
/// `endpoint` of `provider` (scoped as identities are).
pub fn binding_pk(provider: &str, endpoint: &str, payload_hash: &str) -> String {
    format!("body#{provider}#{endpoint}#{payload_hash}")
}

pub fn payload_sk(payload_hash: &str) -> String {
    format!("payload#{payload_hash}")
}

/// A ledger record's due-index partition: `due#007`.
pub fn due_shard(shard: u32) -> String {
    due_partition(DuePartition::Records, shard)
}

/// The due-index partition of `kind` in `shard`: `due#007` (records),
/// `out#007` (outbox items), `chk#007` (re-checks).
pub fn due_partition(kind: DuePartition, shard: u32) -> String {
    due_shard_named(kind.prefix(), shard)
}

/// Attention-index partition: `attn#007`. DEAD and PARKED records (sorted
/// by receive time) and DEAD outbox items (by the time they died) are in
/// it, so operators list and count them without a scan; every other item
/// stays out.
pub fn attention_shard(shard: u32) -> String {
    due_shard_named("attn", shard)
}

/// Whether records in `status` are in the attention index.
pub fn needs_attention(status: Status) -> bool {
    matches!(status, Status::Dead | Status::Parked)
}

/// What the attention index projects besides its keys: what `list` shows
/// and filters on, and what `stats` counts.
pub const ATTENTION_ATTRIBUTES: [&str; 13] = [
    attr::STATUS,
    attr::PROVIDER,
    attr::ENDPOINT,
    attr::EVENT_TYPE,
    attr::SUBJECT,
    attr::ATTEMPTS,
    attr::RECEIVED_AT,
    attr::DUPLICATES,
    attr::CONFLICTS,
    "dead_reason",
    "park_reason",
    "error_code",
    "outcome",
];

/// The table definition in CloudFormation's shape: what `create_table`
/// creates, and what `infra/check_template.py` compares with the SAM template.
pub fn table_definition() -> serde_json::Value {
    let key_schema = |hash: &str, range: &str| serde_json::json!([{"AttributeName": hash, "KeyType": "HASH"}, {"AttributeName": range, "KeyType": "RANGE"}]);
    serde_json::json!({
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [{"AttributeName": attr::PK, "KeyType": "HASH"}, {"AttributeName": attr::SK, "KeyType": "RANGE"}],
        "AttributeDefinitions": [
            {"AttributeName": attr::PK, "AttributeType": "S"},
            {"AttributeName": attr::SK, "AttributeType": "S"},
            {"AttributeName": attr::DUE_SHARD, "AttributeType": "S"},
            {"AttributeName": attr::DUE_AT, "AttributeType": "N"},
            {"AttributeName": attr::ATTN_SHARD, "AttributeType": "S"},
            {"AttributeName": attr::ATTN_AT, "AttributeType": "N"},
        ],
        "GlobalSecondaryIndexes": [
            {
                // The reconciler reads what is due, then claims it; the claim
                // returns the item. Keys only: no index write when a record
                // changes anything but its next look.
                "IndexName": DUE_INDEX,
                "KeySchema": key_schema(attr::DUE_SHARD, attr::DUE_AT),
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": ATTENTION_INDEX,
                "KeySchema": key_schema(attr::ATTN_SHARD, attr::ATTN_AT),
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ATTENTION_ATTRIBUTES},
            },
        ],
        "TimeToLiveSpecification": {"AttributeName": TTL_ATTRIBUTE, "Enabled": true},
    })
}

fn projection(p: &serde_json::Value) -> Projection {
    let kind = match p["ProjectionType"].as_str() {
        Some("KEYS_ONLY") => ProjectionType::KeysOnly,
        Some("INCLUDE") => ProjectionType::Include,
        _ => ProjectionType::All,
    };
    let names =
        p["NonKeyAttributes"].as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect());
    Projection::builder().projection_type(kind).set_non_key_attributes(names).build()
}

/// Creates the table from [`table_definition`]: keys, the sparse `due` and
/// `attention` indexes, on-demand billing, TTL (idempotent).
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
                .projection(projection(&g["Projection"]))
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    match req.send().await {
        Ok(_) => {}
        Err(e) if e.as_service_error().is_some_and(|se| se.is_resource_in_use_exception()) => return Ok(()),
        Err(e) => return Err(error_chain(&e)),
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
        .map_err(|e| error_chain(&e))?;
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
        assert_eq!(names, [attr::PK, attr::SK, attr::DUE_SHARD, attr::DUE_AT, attr::ATTN_SHARD, attr::ATTN_AT]);
        let indexes: Vec<&str> =
            d["GlobalSecondaryIndexes"].as_array().unwrap().iter().map(|i| i["IndexName"].as_str().unwrap()).collect();
        assert_eq!(indexes, [DUE_INDEX, ATTENTION_INDEX]);
        assert_eq!(d["TimeToLiveSpecification"]["AttributeName"], attr::EXPIRES_AT);
    }
}
