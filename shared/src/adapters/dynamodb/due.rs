//! The reconciler's reads and writes ([`DueLedger`]): the sparse `due`
//! index (ledger records `due#…`, entitlements `ent#…`; keys only, so the
//! items due are then read in one batch), claims on its items, and the
//! evidence from the `attention` index. The expressions are in `conditions`.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};

use super::conditions as cond;
use super::{
    ATTENTION_INDEX, DUE_INDEX, DynamoLedger, Item, META_SK, Written, attention_shard, attr, due_shard, get_n, get_s,
};
use crate::adapters::port_error;
use crate::app::entitlement::DRIFT_SHARD_PREFIX;
use crate::identity::EventKey;
use crate::ledger::{Attention, DriftItem, DueItem, DueRecord, PortError, Status};
use crate::policy::due_shard_named;
use crate::ports::DueLedger;
use crate::projection::STATE_SK;

impl DynamoLedger {
    /// The keys (and `due_at`) of the items of `partition` due at `up_to` or
    /// earlier, oldest first.
    pub(super) async fn due_keys(&self, partition: &str, up_to: i64, limit: usize) -> Result<Vec<Item>, PortError> {
        let out = self
            .client()
            .query()
            .table_name(self.table())
            .index_name(DUE_INDEX)
            .key_condition_expression("due_shard = :s AND due_at <= :t")
            .expression_attribute_values(":s", AttributeValue::S(partition.to_owned()))
            .expression_attribute_values(":t", AttributeValue::N(up_to.to_string()))
            .limit(limit.clamp(1, 100) as i32)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(out.items.unwrap_or_default())
    }

    /// The items of `keys` (pk, sk), read consistently in batches of 100, in
    /// no particular order; items gone meanwhile are missing.
    pub(super) async fn batch_read(&self, keys: Vec<Item>) -> Result<Vec<Item>, PortError> {
        let mut found = Vec::new();
        for chunk in keys.chunks(100) {
            let mut pending = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(chunk.to_vec()))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| PortError::Unavailable { service: "dynamodb", message: e.to_string() })?,
            );
            while let Some(request) = pending.take() {
                let out = self
                    .client()
                    .batch_get_item()
                    .request_items(self.table(), request)
                    .send()
                    .await
                    .map_err(|e| port_error("dynamodb", &e))?;
                found.extend(out.responses.and_then(|mut r| r.remove(self.table())).unwrap_or_default());
                pending =
                    out.unprocessed_keys.and_then(|mut u| u.remove(self.table())).filter(|k| !k.keys().is_empty());
            }
        }
        Ok(found)
    }

    /// The items due in `partition`, read in full, with the `due_at` the
    /// index showed (a claim moves it only from that value), oldest first.
    async fn due_items(&self, partition: &str, up_to: i64, limit: usize) -> Result<Vec<(i64, Item)>, PortError> {
        let keys = self.due_keys(partition, up_to, limit).await?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let seen: HashMap<(String, String), i64> = keys
            .iter()
            .filter_map(|k| {
                Some(((get_s(k, attr::PK)?.to_owned(), get_s(k, attr::SK)?.to_owned()), get_n(k, attr::DUE_AT)?))
            })
            .collect();
        let only_keys = keys
            .iter()
            .map(|k| {
                k.iter()
                    .filter(|(n, _)| *n == attr::PK || *n == attr::SK)
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect()
            })
            .collect();
        let mut items: Vec<(i64, Item)> = self
            .batch_read(only_keys)
            .await?
            .into_iter()
            .filter_map(|i| {
                let at = *seen.get(&(get_s(&i, attr::PK)?.to_owned(), get_s(&i, attr::SK)?.to_owned()))?;
                Some((at, i))
            })
            .collect();
        items.sort_by_key(|(at, _)| *at);
        Ok(items)
    }
}

fn item_of(item: DueItem<'_>) -> (&str, &'static str) {
    match item {
        DueItem::Record(key) => (key.as_str(), META_SK),
        DueItem::Drift(pk) => (pk, STATE_SK),
    }
}

impl DueLedger for DynamoLedger {
    fn shards(&self) -> u32 {
        DynamoLedger::shards(self)
    }

    async fn due_records(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<DueRecord>, PortError> {
        let items = self.due_items(&due_shard(shard), up_to, limit).await?;
        Ok(items
            .iter()
            .filter_map(|(seen, i)| {
                Some(DueRecord {
                    key: EventKey::from_stored(get_s(i, attr::PK)?)?,
                    status: get_s(i, attr::STATUS).and_then(Status::parse)?,
                    enqueued: i.contains_key(attr::ENQUEUED_AT),
                    due_at_ms: *seen,
                    received_at_ms: get_n(i, attr::RECEIVED_AT).unwrap_or(*seen),
                    lease_expires_at_ms: get_n(i, "lease_expires_at"),
                })
            })
            .collect())
    }

    async fn due_drift(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<DriftItem>, PortError> {
        let items = self.due_items(&due_shard_named(DRIFT_SHARD_PREFIX, shard), up_to, limit).await?;
        let field = |i: &Item, k: &str| get_s(i, k).unwrap_or_default().to_owned();
        Ok(items
            .iter()
            .filter_map(|(seen, i)| {
                Some(DriftItem {
                    pk: get_s(i, attr::PK)?.to_owned(),
                    due_at_ms: *seen,
                    subscription: field(i, "subscription"),
                    customer: field(i, "customer"),
                    endpoint: field(i, "endpoint"),
                    tenant: field(i, "tenant"),
                    event_id: field(i, "event_id"),
                    status: get_s(i, "status").map(str::to_owned),
                    seats: get_n(i, "seats"),
                })
            })
            .collect())
    }

    async fn claim_due(&self, item: DueItem<'_>, seen: i64, next: i64) -> Result<Option<String>, PortError> {
        let token = uuid::Uuid::new_v4().to_string();
        let (pk, sk) = item_of(item);
        match self.conditional(pk, sk, cond::claim_due(seen, next, &token), false).await? {
            Written::Applied(_) => Ok(Some(token)),
            Written::Refused(Some(met)) if get_s(&met, cond::CLAIM_TOKEN) == Some(token.as_str()) => {
                tracing::info!(item = %pk, "claim acknowledgement lost; continuing as its owner");
                Ok(Some(token))
            }
            Written::Refused(_) => Ok(None),
        }
    }

    async fn reschedule(&self, item: DueItem<'_>, token: &str, at: i64) -> Result<(), PortError> {
        let (pk, sk) = item_of(item);
        self.conditional_ok(pk, sk, cond::reschedule(token, at)).await.map(|_| ())
    }

    async fn note_enqueued(&self, key: &EventKey, now_ms: i64) -> Result<(), PortError> {
        self.conditional_ok(key.as_str(), META_SK, cond::note_redriven(now_ms)).await.map(|_| ())
    }

    async fn attention(&self) -> Result<Attention, PortError> {
        let mut counts = Attention::default();
        for shard in 0..self.shards() {
            let mut start = None;
            loop {
                let page = self
                    .client()
                    .query()
                    .table_name(self.table())
                    .index_name(ATTENTION_INDEX)
                    .key_condition_expression("attn_shard = :p")
                    .expression_attribute_values(":p", AttributeValue::S(attention_shard(shard)))
                    .projection_expression("sk, #st")
                    .expression_attribute_names("#st", attr::STATUS)
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .map_err(|e| port_error("dynamodb", &e))?;
                for i in page.items.unwrap_or_default() {
                    match (get_s(&i, attr::SK), get_s(&i, attr::STATUS)) {
                        (Some(META_SK), Some("DEAD")) => counts.dead_letters += 1,
                        (Some(META_SK), Some("PARKED")) => counts.parked += 1,
                        (Some(super::outbox::OUTBOX_SK), Some("DEAD")) => counts.outbox_dead += 1,
                        _ => {}
                    }
                }
                match page.last_evaluated_key {
                    Some(k) => start = Some(k),
                    None => break,
                }
            }
        }
        Ok(counts)
    }
}
