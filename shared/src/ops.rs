//! Operator actions over the ledger: stats, list, show, replay, park,
//! resolve. Reads go through the `status` index (never a table scan); every
//! change is one conditional update that names the statuses it may leave,
//! plus an audit entry in the record's history.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure, Select};

use crate::adapters::dynamodb::{DynamoLedger, META_SK, STATUS_INDEX, attr, due_shard, payload_sk, status_shard};
use crate::adapters::port_error;
use crate::identity::EventKey;
use crate::ledger::WorkQueue;
use crate::ledger::{PortError, Status};

pub const ALL_STATUSES: [Status; 6] =
    [Status::Received, Status::Processing, Status::Retryable, Status::Processed, Status::Dead, Status::Parked];

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("no event with key {0}")]
    UnknownEvent(String),
    #[error("{0:?} is not an event key (expected evt#<provider>#<endpoint>#<event id>)")]
    BadKey(String),
    #[error("cannot {action} {key}: it is {from} ({allowed})")]
    IllegalTransition { action: &'static str, key: String, from: &'static str, allowed: &'static str },
    #[error(transparent)]
    Storage(#[from] PortError),
}

/// A stored item as JSON, for display (`B` values shown as their size).
pub fn item_json(item: &HashMap<String, AttributeValue>) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (k, v) in item {
        out.insert(k.clone(), value_json(v));
    }
    serde_json::Value::Object(out)
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
        AttributeValue::M(m) => item_json(m),
        other => serde_json::Value::String(format!("{other:?}")),
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Empty: every status.
    pub statuses: Vec<Status>,
    pub endpoint: Option<String>,
    pub event_type: Option<String>,
    pub subject: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub limit: usize,
    /// Continue after this (receive time, key), from the previous page.
    pub cursor: Option<(i64, String)>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    pub by_status: BTreeMap<String, u64>,
    /// (provider, event type) → count, for records not PROCESSED.
    pub open_by_type: BTreeMap<String, u64>,
    pub by_provider: BTreeMap<String, u64>,
    pub oldest_unprocessed_age_ms: Option<i64>,
    pub deliveries: u64,
    pub duplicates: u64,
    pub duplicate_rate: f64,
}

pub struct Ops<Q> {
    ledger: DynamoLedger,
    queue: Q,
}

pub fn parse_key(raw: &str) -> Result<EventKey, OpsError> {
    EventKey::from_stored(raw).ok_or_else(|| OpsError::BadKey(raw.to_owned()))
}

impl<Q: WorkQueue> Ops<Q> {
    pub fn new(ledger: DynamoLedger, queue: Q) -> Self {
        Self { ledger, queue }
    }

    /// Pages through one status partition, newest first.
    async fn query_partition(
        &self,
        partition: &str,
        filter: &ListFilter,
        want: usize,
        projection: Option<&str>,
    ) -> Result<Vec<HashMap<String, AttributeValue>>, PortError> {
        let mut out = Vec::new();
        let mut start = None;
        let lo = filter.since_ms.unwrap_or(0);
        let hi = filter.cursor.as_ref().map_or(i64::MAX, |c| c.0).min(filter.until_ms.unwrap_or(i64::MAX));
        // Newest first, ties by key (descending): keep what sorts after the cursor.
        let after_cursor = |i: &HashMap<String, AttributeValue>| match &filter.cursor {
            None => true,
            Some((at, pk)) => {
                let i_at =
                    i.get(attr::ST_AT).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
                let i_pk = i.get(attr::PK).and_then(|v| v.as_s().ok()).map_or("", String::as_str);
                i_at < *at || (i_at == *at && i_pk < pk.as_str())
            }
        };
        loop {
            let mut q = self
                .ledger
                .client()
                .query()
                .table_name(self.ledger.table())
                .index_name(STATUS_INDEX)
                .key_condition_expression("st_shard = :p AND st_at BETWEEN :lo AND :hi")
                .expression_attribute_values(":p", AttributeValue::S(partition.to_owned()))
                .expression_attribute_values(":lo", AttributeValue::N(lo.to_string()))
                .expression_attribute_values(":hi", AttributeValue::N(hi.to_string()))
                .scan_index_forward(false)
                .set_exclusive_start_key(start.take());
            let mut filters = Vec::new();
            if let Some(e) = &filter.endpoint {
                filters.push("endpoint = :e");
                q = q.expression_attribute_values(":e", AttributeValue::S(e.clone()));
            }
            if let Some(t) = &filter.event_type {
                filters.push("event_type = :t");
                q = q.expression_attribute_values(":t", AttributeValue::S(t.clone()));
            }
            if let Some(s) = &filter.subject {
                filters.push("subject = :s");
                q = q.expression_attribute_values(":s", AttributeValue::S(s.clone()));
            }
            if !filters.is_empty() {
                q = q.filter_expression(filters.join(" AND "));
            }
            if let Some(p) = projection {
                q = q.projection_expression(p);
            }
            let page = q.send().await.map_err(|e| port_error("dynamodb", &e))?;
            out.extend(page.items.unwrap_or_default().into_iter().filter(|i| after_cursor(i)));
            match page.last_evaluated_key {
                Some(k) if out.len() < want => start = Some(k),
                _ => return Ok(out),
            }
        }
    }

    /// Records matching `filter`, newest first, at most `limit`; and the
    /// cursor for the next page when there may be more.
    pub async fn list(
        &self,
        filter: &ListFilter,
    ) -> Result<(Vec<HashMap<String, AttributeValue>>, Option<(i64, String)>), PortError> {
        let statuses = if filter.statuses.is_empty() { ALL_STATUSES.to_vec() } else { filter.statuses.clone() };
        let mut all = Vec::new();
        for status in statuses {
            for shard in 0..self.ledger.shards() {
                all.extend(self.query_partition(&status_shard(status, shard), filter, filter.limit, None).await?);
            }
        }
        let at = |i: &HashMap<String, AttributeValue>| {
            i.get(attr::ST_AT).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0)
        };
        let pk = |i: &HashMap<String, AttributeValue>| {
            i.get(attr::PK).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
        };
        all.sort_by_key(|i| std::cmp::Reverse((at(i), pk(i))));
        let more = all.len() > filter.limit;
        all.truncate(filter.limit);
        let cursor = if more { all.last().map(|i| (at(i), pk(i))) } else { None };
        Ok((all, cursor))
    }

    pub async fn stats(&self, now_ms: i64) -> Result<Stats, PortError> {
        let mut stats = Stats::default();
        let everything = ListFilter { limit: usize::MAX, ..Default::default() };
        for status in ALL_STATUSES {
            let mut count = 0u64;
            for shard in 0..self.ledger.shards() {
                let items = self
                    .query_partition(
                        &status_shard(status, shard),
                        &everything,
                        usize::MAX,
                        Some("provider, event_type, duplicates, st_at"),
                    )
                    .await?;
                for i in &items {
                    let provider = i.get("provider").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
                    let ty = i.get("event_type").and_then(|v| v.as_s().ok()).cloned().unwrap_or_else(|| "-".into());
                    let dups = i
                        .get("duplicates")
                        .and_then(|v| v.as_n().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0);
                    *stats.by_provider.entry(provider.clone()).or_default() += 1;
                    if status != Status::Processed {
                        *stats.open_by_type.entry(format!("{provider} {ty}")).or_default() += 1;
                    }
                    if matches!(status, Status::Received | Status::Retryable | Status::Processing) {
                        let at = i
                            .get(attr::ST_AT)
                            .and_then(|v| v.as_n().ok())
                            .and_then(|v| v.parse::<i64>().ok())
                            .unwrap_or(now_ms);
                        let age = now_ms - at;
                        stats.oldest_unprocessed_age_ms =
                            Some(stats.oldest_unprocessed_age_ms.map_or(age, |a| a.max(age)));
                    }
                    stats.duplicates += dups;
                    stats.deliveries += 1 + dups;
                }
                count += items.len() as u64;
            }
            stats.by_status.insert(status.as_str().to_owned(), count);
        }
        stats.duplicate_rate =
            if stats.deliveries == 0 { 0.0 } else { stats.duplicates as f64 / stats.deliveries as f64 };
        Ok(stats)
    }

    /// Counts one status (used by the reconciler's summary).
    pub async fn count(&self, status: Status) -> Result<u64, PortError> {
        let mut total = 0;
        for shard in 0..self.ledger.shards() {
            let mut start = None;
            loop {
                let page = self
                    .ledger
                    .client()
                    .query()
                    .table_name(self.ledger.table())
                    .index_name(STATUS_INDEX)
                    .key_condition_expression("st_shard = :p")
                    .expression_attribute_values(":p", AttributeValue::S(status_shard(status, shard)))
                    .select(Select::Count)
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .map_err(|e| port_error("dynamodb", &e))?;
                total += page.count.max(0) as u64;
                match page.last_evaluated_key {
                    Some(k) => start = Some(k),
                    None => break,
                }
            }
        }
        Ok(total)
    }

    /// The record, its history (oldest first) and, if asked, its payload.
    pub async fn show(
        &self,
        key: &EventKey,
        with_payload: bool,
    ) -> Result<(HashMap<String, AttributeValue>, Vec<HashMap<String, AttributeValue>>, Option<Vec<u8>>), OpsError>
    {
        let all = self
            .ledger
            .client()
            .query()
            .table_name(self.ledger.table())
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(key.as_str().to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| OpsError::Storage(port_error("dynamodb", &e)))?
            .items
            .unwrap_or_default();
        let sk = |i: &HashMap<String, AttributeValue>| {
            i.get(attr::SK).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
        };
        let record =
            all.iter().find(|i| sk(i) == META_SK).cloned().ok_or_else(|| OpsError::UnknownEvent(key.to_string()))?;
        let mut history: Vec<_> = all.iter().filter(|i| sk(i).starts_with("hist#")).cloned().collect();
        history.sort_by_key(sk);
        let payload = if with_payload {
            let hash = record.get(attr::PAYLOAD_HASH).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
            all.iter()
                .find(|i| sk(i) == payload_sk(&hash))
                .and_then(|i| i.get(attr::BODY).and_then(|b| b.as_b().ok()).map(|b| b.as_ref().to_vec()))
        } else {
            None
        };
        Ok((record, history, payload))
    }

    /// One audited, conditional transition. `from` lists the statuses it may leave.
    #[allow(clippy::too_many_arguments)]
    async fn transition(
        &self,
        key: &EventKey,
        action: &'static str,
        from: &[Status],
        allowed: &'static str,
        to: Status,
        set: &str,
        remove: &str,
        values: Vec<(&str, AttributeValue)>,
    ) -> Result<(), OpsError> {
        let mut cond = Vec::new();
        let mut req = self
            .ledger
            .client()
            .update_item()
            .table_name(self.ledger.table())
            .key(attr::PK, AttributeValue::S(key.as_str().to_owned()))
            .key(attr::SK, AttributeValue::S(META_SK.to_owned()))
            .expression_attribute_names("#st", attr::STATUS)
            .expression_attribute_values(":to", AttributeValue::S(to.as_str().to_owned()))
            .expression_attribute_values(":stnext", AttributeValue::S(self.ledger.status_shard(to, key)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        for (i, st) in from.iter().enumerate() {
            cond.push(format!("#st = :from{i}"));
            req = req.expression_attribute_values(format!(":from{i}"), AttributeValue::S(st.as_str().to_owned()));
        }
        for (k, v) in values {
            req = req.expression_attribute_values(k, v);
        }
        let remove = if remove.is_empty() { String::new() } else { format!(" REMOVE {remove}") };
        let result = req
            .update_expression(format!("SET #st = :to, st_shard = :stnext, {set}{remove}"))
            .condition_expression(format!("attribute_exists(pk) AND ({})", cond.join(" OR ")))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    let from = c
                        .item()
                        .and_then(|i| i.get(attr::STATUS))
                        .and_then(|v| v.as_s().ok())
                        .and_then(|s| Status::parse(s));
                    match from {
                        None => Err(OpsError::UnknownEvent(key.to_string())),
                        Some(st) => Err(OpsError::IllegalTransition {
                            action,
                            key: key.to_string(),
                            from: st.as_str(),
                            allowed,
                        }),
                    }
                }
                _ => Err(OpsError::Storage(port_error("dynamodb", &e))),
            },
        }
    }

    /// DEAD or PARKED → RETRYABLE, due now, attempts and failures reset, a
    /// new time window (set by the next lease), same identity; audited; the
    /// key is queued at once.
    pub async fn replay(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(
            key,
            "replay",
            &[Status::Dead, Status::Parked],
            "only DEAD or PARKED records can be replayed",
            Status::Retryable,
            "next_attempt_at = :now, due_shard = :ds, due_at = :now, attempts = :zero, failures = :zero, \
             last_replay_by = :op, last_replay_reason = :why, last_replay_at = :now ADD replays :one",
            "window_start",
            vec![
                (":now", AttributeValue::N(now_ms.to_string())),
                (":ds", AttributeValue::S(due_shard(key.shard(self.ledger.shards())))),
                (":zero", AttributeValue::N("0".into())),
                (":one", AttributeValue::N("1".into())),
                (":op", AttributeValue::S(operator.to_owned())),
                (":why", AttributeValue::S(reason.to_owned())),
            ],
        )
        .await?;
        self.ledger.append_history(key, "replay", &format!("by {operator}: {reason}"), now_ms).await?;
        self.queue.send(key).await?;
        Ok(())
    }

    /// RECEIVED, RETRYABLE or DEAD → PARKED: stop working on it until replayed.
    pub async fn park(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(
            key,
            "park",
            &[Status::Received, Status::Retryable, Status::Dead],
            "only RECEIVED, RETRYABLE or DEAD records can be parked; a PROCESSING one must finish its lease first",
            Status::Parked,
            "park_reason = :why, parked_at = :now",
            "due_shard, due_at, next_attempt_at",
            vec![
                (":why", AttributeValue::S(format!("operator {operator}: {reason}"))),
                (":now", AttributeValue::N(now_ms.to_string())),
            ],
        )
        .await?;
        self.ledger.append_history(key, "park", &format!("by {operator}: {reason}"), now_ms).await?;
        Ok(())
    }

    /// DEAD or PARKED → PROCESSED with outcome `resolved`: the operator
    /// settled the outcome outside Hookledger.
    pub async fn resolve(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(
            key,
            "resolve",
            &[Status::Dead, Status::Parked],
            "only DEAD or PARKED records can be resolved",
            Status::Processed,
            "outcome = :resolved, processed_at = :now, resolved_by = :op, resolve_reason = :why",
            "due_shard, due_at, next_attempt_at",
            vec![
                (":resolved", AttributeValue::S("resolved".into())),
                (":now", AttributeValue::N(now_ms.to_string())),
                (":op", AttributeValue::S(operator.to_owned())),
                (":why", AttributeValue::S(reason.to_owned())),
            ],
        )
        .await?;
        self.ledger.append_history(key, "resolve", &format!("by {operator}: {reason}"), now_ms).await?;
        Ok(())
    }
}
