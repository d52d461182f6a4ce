//! The ledger on DynamoDB.
//!
//! One table, two item kinds under the same partition key:
//! - `sk = "meta"`: the small ledger record (status, hashes, counters, index keys);
//! - `sk = "payload#<sha256>"`: the raw body, written once, never rewritten by
//!   status updates (DynamoDB bills a write by the whole item's size).
//!
//! Non-terminal records carry `due_shard`/`due_at`, the keys of the sparse,
//! sharded `due` index the reconciler queries (never a scan); a PROCESSED
//! record keeps the entry it had (the reconciler reads behind a cursor that
//! passes it). DEAD and PARKED records (and DEAD outbox items) carry
//! `attn_shard`/`attn_at`, the keys of the sparse `attention` index
//! operators and the evidence read.
//!
//! Split by actor, each implementing its use case's port: `claim` (intake),
//! `work` (processor), `due` (reconciler), `operator` (operations), `outbox`
//! (the outbox items). Every condition expression they send is in
//! `conditions`, which draws the state machine.

pub mod activity;
pub mod audit;
pub mod backfill;
pub mod claim;
pub mod conditions;
pub mod due;
pub mod item;
pub mod keys;
pub mod migrate;
pub mod operator;
pub mod outbox;
pub mod payload;
pub mod schema;
pub mod shards;
pub mod work;

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use self::conditions::Update;
pub use self::schema::{
    ATTENTION_INDEX, DUE_INDEX, META_SK, TTL_ATTRIBUTE, attention_shard, attr, create_table, due_partition, due_shard,
    needs_attention, payload_sk, table_definition,
};
use super::port_error;
use crate::identity::EventKey;
use crate::ledger::{ExistingRecord, NewEvent, PortError, Status};
use crate::policy::{DEFAULT_INDEX_SHARDS, REDRIVE_GRACE_MS};

/// A stored item.
pub type Item = HashMap<String, AttributeValue>;

/// What a conditional update did.
pub enum Written {
    /// Applied; the item after the write when asked for (`ReturnValue::AllNew`).
    Applied(Option<Item>),
    /// The condition failed against this item (`None`: there is no item).
    Refused(Option<Item>),
}

#[derive(Clone)]
pub struct DynamoLedger {
    client: Client,
    table: String,
    shards: u32,
    /// Where payloads too large for an item go (none: they are refused).
    payloads: Option<crate::adapters::s3::S3Payloads>,
    /// How long the history items it writes are kept.
    retention_days: u32,
    /// How long the audit entries it writes are kept.
    audit_days: u32,
    /// Tokens and item ids.
    ambient: crate::clock::Ambient,
    /// The last activity window this container marked (its clones share it).
    marked: activity::Marked,
}

impl DynamoLedger {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            shards: DEFAULT_INDEX_SHARDS,
            payloads: None,
            retention_days: crate::policy::DEFAULT_RETENTION_DAYS,
            audit_days: crate::audit::DEFAULT_AUDIT_RETENTION_DAYS,
            ambient: crate::clock::Ambient::system(),
            marked: activity::Marked::default(),
        }
    }

    /// Keeps the history items it writes this long (`HOOKLEDGER_RETENTION_DAYS`).
    pub fn with_retention(mut self, days: u32) -> Self {
        self.retention_days = days;
        self
    }

    /// Draws its tokens and item ids from this entropy.
    pub fn with_ambient(mut self, ambient: crate::clock::Ambient) -> Self {
        self.ambient = ambient;
        self
    }

    /// Stores payloads too large for an item in this bucket.
    pub fn with_payload_bucket(mut self, payloads: crate::adapters::s3::S3Payloads) -> Self {
        self.payloads = Some(payloads);
        self
    }

    /// A payload stored outside the table, if there is one.
    pub(super) async fn external_payload(&self, key: &EventKey, hash: &str) -> Result<Option<Vec<u8>>, PortError> {
        match &self.payloads {
            Some(s3) => s3.get(key, hash).await,
            None => Ok(None),
        }
    }

    /// Sets the number of index shards (must match the intake's `HOOKLEDGER_INDEX_SHARDS`).
    pub fn with_shards(mut self, shards: u32) -> Self {
        self.shards = shards.max(1);
        self
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    fn key(key: &EventKey, sk: &str) -> Item {
        Self::item_key(key.as_str(), sk)
    }

    fn item_key(pk: &str, sk: &str) -> Item {
        HashMap::from([
            (attr::PK.to_owned(), AttributeValue::S(pk.to_owned())),
            (attr::SK.to_owned(), AttributeValue::S(sk.to_owned())),
        ])
    }

    /// Sends one conditional update from `conditions`. A refused write
    /// returns the item its condition met (read consistently when the
    /// endpoint does not return it), so the caller can recognise its own
    /// earlier write.
    async fn conditional(&self, pk: &str, sk: &str, update: Update, return_new: bool) -> Result<Written, PortError> {
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::item_key(pk, sk)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if return_new {
            req = req.return_values(ReturnValue::AllNew);
        }
        match update.apply(req).send().await {
            Ok(out) => Ok(Written::Applied(out.attributes)),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => match c.item() {
                    Some(item) => Ok(Written::Refused(Some(item.clone()))),
                    None => Ok(Written::Refused(self.read_item(pk, sk).await?)),
                },
                _ => Err(port_error("dynamodb", &e)),
            },
        }
    }

    /// Sends one conditional update whose refusal needs no look at the item,
    /// returning the item after it: `Ok(Some(item))` applied, `Ok(None)`
    /// refused.
    async fn conditional_new(&self, pk: &str, sk: &str, update: Update) -> Result<Option<Item>, PortError> {
        let req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::item_key(pk, sk)))
            .return_values(ReturnValue::AllNew);
        match update.apply(req).send().await {
            Ok(out) => Ok(Some(out.attributes.unwrap_or_default())),
            Err(e) if e.as_service_error().is_some_and(|se| se.is_conditional_check_failed_exception()) => Ok(None),
            Err(e) => Err(port_error("dynamodb", &e)),
        }
    }

    /// Sends one conditional update whose refusal needs no look at the item:
    /// `Ok(true)` applied, `Ok(false)` refused.
    async fn conditional_ok(&self, pk: &str, sk: &str, update: Update) -> Result<bool, PortError> {
        let req = self.client.update_item().table_name(&self.table).set_key(Some(Self::item_key(pk, sk)));
        match update.apply(req).send().await {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(|se| se.is_conditional_check_failed_exception()) => Ok(false),
            Err(e) => Err(port_error("dynamodb", &e)),
        }
    }

    /// A strongly consistent read of one item.
    async fn read_item(&self, pk: &str, sk: &str) -> Result<Option<Item>, PortError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::item_key(pk, sk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(out.item)
    }

    /// Writes the payload item (idempotent: same key, same bytes).
    async fn put_payload(&self, key: &EventKey, hash: &str, body: &[u8], expires_at: i64) -> Result<(), PortError> {
        self.put_stored_payload(key, hash, payload::encode(body), expires_at).await
    }

    /// Writes the payload item from its stored form.
    async fn put_stored_payload(
        &self,
        key: &EventKey,
        hash: &str,
        stored: payload::Stored,
        expires_at: i64,
    ) -> Result<(), PortError> {
        let item = stored_payload_item(key, hash, stored, expires_at);
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn read_meta(&self, key: &EventKey) -> Result<Option<Item>, PortError> {
        self.read_item(key.as_str(), META_SK).await
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
        received_at_ms: get_n(item, attr::RECEIVED_AT).unwrap_or(0),
        send_lease_until_ms: get_n(item, attr::SEND_LEASE_UNTIL),
        payload_stored: item.get(attr::PAYLOAD_STORED).and_then(|v| v.as_bool().ok()).copied().unwrap_or(false),
        via: crate::ledger::Via::parse(get_s(item, attr::VIA)),
        tenant: get_s(item, attr::TENANT).unwrap_or_default().to_owned(),
        latest_generation: get_n(item, attr::LATEST_GENERATION).and_then(|g| u32::try_from(g).ok()).unwrap_or(1),
    })
}

/// The payload item of `key` (`sk = payload#<hash>`), written once.
pub fn payload_item(key: &EventKey, hash: &str, body: &[u8], expires_at: i64) -> Item {
    stored_payload_item(key, hash, payload::encode(body), expires_at)
}

/// [`payload_item`] from the body's stored form.
pub fn stored_payload_item(key: &EventKey, hash: &str, stored: payload::Stored, expires_at: i64) -> Item {
    let mut item = DynamoLedger::key(key, &payload_sk(hash));
    payload::put(&mut item, stored);
    item.insert(attr::EXPIRES_AT.into(), n(expires_at));
    item
}

/// The new ledger record, as written by the claim (its payload in it, or
/// written beside it before it: `payload_stored` is true from the start).
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
    item.insert(attr::PAYLOAD_STORED.into(), AttributeValue::Bool(true));
    item.insert(attr::RECEIVED_AT.into(), n(event.received_at_ms));
    item.insert(attr::ATTEMPTS.into(), n(0));
    item.insert(attr::CONFLICTS.into(), n(0));
    item.insert(attr::EXPIRES_AT.into(), n(event.expires_at));
    item.insert(attr::SEND_TOKEN.into(), s(&event.send.token));
    item.insert(attr::SEND_LEASE_UNTIL.into(), n(event.send.until_ms));
    item.insert(attr::VIA.into(), s(event.via.as_str()));
    if let Some(h) = &event.batch_hash {
        item.insert("batch_hash".into(), s(h));
    }
    if let Some(g) = event.notification.filter(|g| g.n > 1) {
        item.insert(attr::GENERATION.into(), n(g.n));
    }
    if let Some(kept) = &event.kept {
        item.insert(attr::PAYLOAD_POLICY.into(), s(kept.policy));
        if let Some(h) = &kept.verified_hash {
            item.insert(attr::VERIFIED_HASH.into(), s(h));
        }
    }
    if !crate::planted::is(crate::planted::Bug::NoDueAtClaim) {
        item.insert(attr::DUE_SHARD.into(), s(due_shard(event.shard)));
        item.insert(attr::DUE_AT.into(), n(event.received_at_ms + REDRIVE_GRACE_MS));
    }
    item
}
