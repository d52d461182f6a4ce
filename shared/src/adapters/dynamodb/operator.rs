//! The operator's reads and transitions ([`OperatorLedger`]): DEAD and
//! PARKED records from the `attention` index, open records from the `due`
//! index (keys, then a batch read), never a scan; one record with its
//! history; and the audited replay / park / resolve (expressions in
//! `conditions`). PROCESSED records are in no index: `show` reads one by key.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::audit::{self, Audited};
use super::conditions as cond;
use super::{ATTENTION_INDEX, DynamoLedger, Item, META_SK, attention_shard, attr, due_shard, get_n, get_s, payload_sk};
use crate::adapters::port_error;
use crate::audit::AuditEntry;
use crate::identity::EventKey;
use crate::ledger::{OperatorAction, PortError, Row, Status, Transitioned};
use crate::ports::{OperatorLedger, RowFilter, Shown, WorkLedger};

/// A stored item as JSON, for display (`B` values shown as their size).
/// An item as a row, its payload bytes (`body`) left out.
pub fn without_body(item: &HashMap<String, AttributeValue>) -> Row {
    let mut row = item_json(item);
    row.remove(attr::BODY);
    row
}

pub fn item_json(item: &HashMap<String, AttributeValue>) -> Row {
    item.iter().map(|(k, v)| (k.clone(), value_json(v))).collect()
}

fn value_json(v: &AttributeValue) -> serde_json::Value {
    match v {
        AttributeValue::S(s) => serde_json::Value::String(s.clone()),
        AttributeValue::N(n) => {
            n.parse::<i64>().map(serde_json::Value::from).unwrap_or_else(|_| serde_json::Value::String(n.clone()))
        }
        AttributeValue::Bool(b) => serde_json::Value::Bool(*b),
        AttributeValue::B(b) => serde_json::Value::String(format!("<{} bytes>", b.as_ref().len())),
        AttributeValue::Null(_) => serde_json::Value::Null,
        AttributeValue::L(l) => serde_json::Value::Array(l.iter().map(value_json).collect()),
        AttributeValue::M(m) => serde_json::Value::Object(item_json(m)),
        other => serde_json::Value::String(format!("{other:?}")),
    }
}

/// A transition done, from the record after it (its tenant).
pub(crate) fn transitioned(record: &Item) -> Transitioned {
    Transitioned::Done { tenant: get_s(record, attr::TENANT).unwrap_or_default().to_owned() }
}

/// What a refused operator transition met: nothing (`Missing`), our own
/// retried update after a lost acknowledgement (`Done`), or a status the
/// action may not leave.
pub(crate) fn transition_refused(met: Option<&Item>, token: &str) -> Transitioned {
    match met {
        None => Transitioned::Missing,
        Some(met) if get_s(met, cond::OPERATOR_TOKEN) == Some(token) => transitioned(met),
        Some(met) => match get_s(met, attr::STATUS).and_then(Status::parse) {
            Some(st) => Transitioned::Refused(st),
            None => Transitioned::Missing,
        },
    }
}

/// The row of an item: its attributes as JSON, and `st_at`, the receive
/// time rows are sorted and paged by.
pub(crate) fn row(item: &Item) -> Row {
    let mut r = item_json(item);
    r.insert("st_at".into(), get_n(item, attr::RECEIVED_AT).unwrap_or(0).into());
    r
}

/// Whether an item passes the filter's equality filters, receive-time range
/// and cursor.
pub(crate) fn passes(item: &Item, filter: &RowFilter<'_>) -> bool {
    let at = get_n(item, attr::RECEIVED_AT).unwrap_or(0);
    [
        ("endpoint", filter.endpoint),
        (attr::TENANT, filter.tenant),
        ("event_type", filter.event_type),
        ("subject", filter.subject),
    ]
    .into_iter()
    .all(|(name, want)| want.is_none_or(|w| get_s(item, name) == Some(w)))
        && (filter.since_ms..=filter.until_ms).contains(&at)
        && filter.is_after(at, get_s(item, attr::PK).unwrap_or(""))
}

impl DynamoLedger {
    async fn attention_rows(
        &self,
        status: Status,
        shard: u32,
        filter: &RowFilter<'_>,
        want: usize,
    ) -> Result<Vec<Row>, PortError> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client()
                .query()
                .table_name(self.table())
                .index_name(ATTENTION_INDEX)
                .key_condition_expression("attn_shard = :p AND attn_at BETWEEN :lo AND :hi")
                .filter_expression("sk = :meta AND #st = :st")
                .expression_attribute_names("#st", attr::STATUS)
                .expression_attribute_values(":p", AttributeValue::S(attention_shard(shard)))
                .expression_attribute_values(":lo", AttributeValue::N(filter.since_ms.to_string()))
                .expression_attribute_values(":hi", AttributeValue::N(filter.until_ms.to_string()))
                .expression_attribute_values(":meta", AttributeValue::S(META_SK.to_owned()))
                .expression_attribute_values(":st", AttributeValue::S(status.as_str().to_owned()))
                .scan_index_forward(false)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| port_error("dynamodb", &e))?;
            let mut items = page.items.unwrap_or_default();
            if filter.tenant.is_some() {
                // The index does not carry the tenant: read the records.
                items = self.in_order(items).await?;
            }
            out.extend(items.iter().filter(|i| passes(i, filter)).map(row));
            match page.last_evaluated_key {
                Some(k) if out.len() < want => start = Some(k),
                _ => return Ok(out),
            }
        }
    }

    /// The records of index items, read in one batch, in the items' order
    /// (those gone meanwhile left out).
    async fn in_order(&self, items: Vec<Item>) -> Result<Vec<Item>, PortError> {
        let key = |i: &Item| {
            (get_s(i, attr::PK).unwrap_or_default().to_owned(), get_s(i, attr::SK).unwrap_or_default().to_owned())
        };
        let order: Vec<(String, String)> = items.iter().map(key).collect();
        let keys = order
            .iter()
            .map(|(pk, sk)| {
                HashMap::from([
                    (attr::PK.to_owned(), AttributeValue::S(pk.clone())),
                    (attr::SK.to_owned(), AttributeValue::S(sk.clone())),
                ])
            })
            .collect();
        let mut read: HashMap<(String, String), Item> =
            self.batch_read(keys).await?.into_iter().map(|i| (key(&i), i)).collect();
        Ok(order.iter().filter_map(|k| read.remove(k)).collect())
    }

    /// Every open record of the shard in one of `statuses`, newest first:
    /// the entries after the reconciler's place in the shard (every one
    /// before it is a finished record's, or gone).
    async fn due_rows(&self, statuses: &[Status], shard: u32, filter: &RowFilter<'_>) -> Result<Vec<Row>, PortError> {
        let mut after = self.read_cursors().await?.shards.remove(&shard);
        let partition = due_shard(shard);
        let mut keys = Vec::new();
        loop {
            let (page, next) = self.due_keys(&partition, i64::MAX, 100, after.as_ref()).await?;
            keys.extend(
                page.into_iter()
                    .map(|k| k.into_iter().filter(|(n, _)| n == attr::PK || n == attr::SK).collect::<Item>()),
            );
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        let mut items: Vec<Item> = self
            .batch_read(keys)
            .await?
            .into_iter()
            .filter(|i| statuses.iter().any(|s| get_s(i, attr::STATUS) == Some(s.as_str())) && passes(i, filter))
            .collect();
        let sort_key =
            |i: &Item| (get_n(i, attr::RECEIVED_AT).unwrap_or(0), get_s(i, attr::PK).unwrap_or_default().to_owned());
        items.sort_by_key(|i| std::cmp::Reverse(sort_key(i)));
        Ok(items
            .iter()
            .map(|i| {
                let mut r = row(i);
                if !filter.fields.is_empty() {
                    r.retain(|k, _| filter.fields.contains(&k.as_str()) || k == "st_at" || k == attr::PK);
                }
                r
            })
            .collect())
    }
}

impl OperatorLedger for DynamoLedger {
    fn shards(&self) -> u32 {
        DynamoLedger::shards(self)
    }

    async fn rows(
        &self,
        status: Status,
        shard: u32,
        filter: &RowFilter<'_>,
        want: usize,
    ) -> Result<Vec<Row>, PortError> {
        let rows = match status {
            // DEAD and PARKED: the attention index, newest first.
            Status::Dead | Status::Parked => self.attention_rows(status, shard, filter, want).await?,
            // Open records: every one is in the due index (keys only), after
            // the reconciler's place; read them in batches.
            Status::Received | Status::Processing | Status::Retryable => {
                self.due_rows(&[status], shard, filter).await?
            }
            // Finished records are listed by no index: `show KEY` reads one.
            Status::Processed => Vec::new(),
        };
        Ok(rows)
    }

    async fn open_rows(&self, shard: u32) -> Result<Vec<Row>, PortError> {
        let everything = RowFilter { until_ms: i64::MAX, ..RowFilter::default() };
        self.due_rows(&[Status::Received, Status::Processing, Status::Retryable], shard, &everything).await
    }

    async fn count(&self, status: Status) -> Result<u64, PortError> {
        let everything = RowFilter { until_ms: i64::MAX, ..RowFilter::default() };
        let mut total = 0;
        for shard in 0..self.shards() {
            total += self.rows(status, shard, &everything, usize::MAX).await?.len() as u64;
        }
        Ok(total)
    }

    async fn records(&self, keys: &[EventKey]) -> Result<Vec<Row>, PortError> {
        let keys = keys.iter().map(|k| DynamoLedger::item_key(k.as_str(), META_SK)).collect();
        // Eventually consistent: half the read units; an audit reads what
        // was settled seconds ago.
        Ok(self.batch_read_as(keys, false).await?.iter().map(without_body).collect())
    }

    async fn show(&self, key: &EventKey, with_payload: bool) -> Result<Option<Shown>, PortError> {
        let all = self
            .client()
            .query()
            .table_name(self.table())
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(key.as_str().to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?
            .items
            .unwrap_or_default();
        let sk = |i: &Item| get_s(i, attr::SK).unwrap_or_default().to_owned();
        let Some(record) = all.iter().find(|i| sk(i) == META_SK) else { return Ok(None) };
        let mut history: Vec<&Item> = all.iter().filter(|i| sk(i).starts_with("hist#")).collect();
        history.sort_by_key(|i| sk(i));
        let payload = if with_payload {
            let hash = get_s(record, attr::PAYLOAD_HASH).unwrap_or_default();
            // In the record itself, or in its own item.
            match super::payload::body(record)
                .or_else(|| all.iter().find(|i| sk(i) == payload_sk(hash)).and_then(super::payload::body))
            {
                Some(body) => Some(body),
                None => self.external_payload(key, hash).await?,
            }
        } else {
            None
        };
        Ok(Some((item_json(record), history.into_iter().map(item_json).collect(), payload)))
    }

    async fn transition(
        &self,
        key: &EventKey,
        action: OperatorAction,
        entry: &AuditEntry,
        now_ms: i64,
    ) -> Result<Transitioned, PortError> {
        let token = self.ambient.token();
        let entry = audit::on_record(entry, action.name(), key, &token, now_ms);
        let update = cond::operator(
            action,
            &entry.operator,
            &entry.reason,
            entry.run.as_deref(),
            &token,
            now_ms,
            key.shard(self.shards()),
        );
        let item = audit::update_item(self.table(), key.as_str(), META_SK, update);
        match self.audited(vec![item], &entry).await? {
            Audited::Done => Ok(transitioned(&self.read_meta(key).await?.unwrap_or_default())),
            Audited::Refused(met) => {
                let met = match met.into_iter().next().flatten() {
                    Some(met) if !met.is_empty() => Some(met),
                    _ => self.read_meta(key).await?,
                };
                Ok(transition_refused(met.as_ref(), &token))
            }
        }
    }

    async fn append_history(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) -> Result<(), PortError> {
        WorkLedger::append_history(self, key, kind, detail, now_ms).await
    }

    async fn erase(
        &self,
        key: &EventKey,
        payload_hash: &str,
        entry: &AuditEntry,
        now_ms: i64,
    ) -> Result<crate::ledger::Erasure, PortError> {
        // The copies beside the record first: deleting them again is a no-op.
        let item = Self::key(key, &payload_sk(payload_hash));
        let deleted = self.client().delete_item().table_name(self.table()).set_key(Some(item)).send().await;
        deleted.map_err(|e| port_error("dynamodb", &e))?;
        if let Some(s3) = &self.payloads {
            s3.delete(key, payload_hash).await?;
        }
        let token = self.ambient.token();
        let entry = audit::on_record(entry, crate::audit::verb::ERASE, key, &token, now_ms);
        let update = cond::erase_record(&entry.operator, &entry.reason, now_ms);
        let item = audit::update_item(self.table(), key.as_str(), META_SK, update);
        match self.audited(vec![item], &entry).await? {
            Audited::Done => Ok(crate::ledger::Erasure::Erased),
            Audited::Refused(met) => {
                let met = match met.into_iter().next().flatten() {
                    Some(met) if !met.is_empty() => Some(met),
                    _ => self.read_meta(key).await?,
                };
                Ok(cond::erase_refused(met.as_ref()))
            }
        }
    }
}
