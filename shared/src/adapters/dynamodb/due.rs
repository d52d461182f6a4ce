//! The reconciler's reads and writes ([`DueLedger`]): the sparse `due`
//! index (ledger records `due#…`, entitlements `ent#…`), claims on its
//! items, and the evidence counts from the `status` index. The expressions
//! are in `conditions`.

use aws_sdk_dynamodb::types::{AttributeValue, Select};

use super::conditions as cond;
use super::{
    DUE_INDEX, DynamoLedger, Item, META_SK, STATUS_INDEX, Written, attr, due_shard, get_n, get_s, status_shard,
};
use crate::adapters::port_error;
use crate::app::entitlement::DRIFT_SHARD_PREFIX;
use crate::identity::EventKey;
use crate::ledger::{DriftItem, DueItem, DueRecord, PortError, Status};
use crate::policy::due_shard_named;
use crate::ports::DueLedger;
use crate::projection::STATE_SK;

impl DynamoLedger {
    async fn due_page(&self, partition: &str, up_to: i64, limit: usize) -> Result<Vec<Item>, PortError> {
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

    /// Items in one status-index partition (counted, not read).
    pub(super) async fn count_partition(&self, partition: &str) -> Result<u64, PortError> {
        let mut total = 0;
        let mut start = None;
        loop {
            let page = self
                .client()
                .query()
                .table_name(self.table())
                .index_name(STATUS_INDEX)
                .key_condition_expression("st_shard = :p")
                .expression_attribute_values(":p", AttributeValue::S(partition.to_owned()))
                .select(Select::Count)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| port_error("dynamodb", &e))?;
            total += page.count.max(0) as u64;
            match page.last_evaluated_key {
                Some(k) => start = Some(k),
                None => return Ok(total),
            }
        }
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
        let page = self.due_page(&due_shard(shard), up_to, limit).await?;
        Ok(page
            .iter()
            .filter_map(|i| {
                Some(DueRecord {
                    key: EventKey::from_stored(get_s(i, attr::PK)?)?,
                    status: get_s(i, attr::STATUS).and_then(Status::parse)?,
                    enqueued: i.contains_key(attr::ENQUEUED_AT),
                    due_at_ms: get_n(i, attr::DUE_AT)?,
                })
            })
            .collect())
    }

    async fn due_drift(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<DriftItem>, PortError> {
        let page = self.due_page(&due_shard_named(DRIFT_SHARD_PREFIX, shard), up_to, limit).await?;
        let field = |i: &Item, k: &str| get_s(i, k).unwrap_or_default().to_owned();
        Ok(page
            .iter()
            .filter_map(|i| {
                Some(DriftItem {
                    pk: get_s(i, attr::PK)?.to_owned(),
                    due_at_ms: get_n(i, attr::DUE_AT)?,
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

    async fn count(&self, status: Status) -> Result<u64, PortError> {
        let mut total = 0;
        for shard in 0..self.shards() {
            total += self.count_partition(&status_shard(status, shard)).await?;
        }
        Ok(total)
    }

    async fn oldest_open(&self) -> Result<Option<i64>, PortError> {
        let mut oldest: Option<i64> = None;
        for status in [Status::Received, Status::Retryable, Status::Processing] {
            for shard in 0..self.shards() {
                let out = self
                    .client()
                    .query()
                    .table_name(self.table())
                    .index_name(STATUS_INDEX)
                    .key_condition_expression("st_shard = :p")
                    .expression_attribute_values(":p", AttributeValue::S(status_shard(status, shard)))
                    .scan_index_forward(true)
                    .limit(1)
                    .send()
                    .await
                    .map_err(|e| port_error("dynamodb", &e))?;
                if let Some(at) = out.items.unwrap_or_default().first().and_then(|i| get_n(i, attr::ST_AT)) {
                    oldest = Some(oldest.map_or(at, |o: i64| o.min(at)));
                }
            }
        }
        Ok(oldest)
    }
}
