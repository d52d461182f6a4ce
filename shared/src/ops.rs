//! Operator actions over the ledger: stats, list, show, replay, park,
//! resolve. Reads go through the `status` index (never a table scan); every
//! change is one conditional update that names the statuses it may leave
//! (the [`OperatorLedger`] port; [`OperatorAction`] says which), plus an
//! audit entry in the record's history.

use std::collections::BTreeMap;

use crate::adapters::dynamodb::DynamoLedger;
use crate::identity::EventKey;
use crate::ledger::{OperatorAction, PortError, Row, Status, Transitioned};
use crate::ports::{OperatorLedger, RowFilter, Shown, WorkQueue};

pub use crate::adapters::dynamodb::operator::item_json;

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

pub struct Ops<Q, L = DynamoLedger> {
    ledger: L,
    queue: Q,
}

pub fn parse_key(raw: &str) -> Result<EventKey, OpsError> {
    EventKey::from_stored(raw).ok_or_else(|| OpsError::BadKey(raw.to_owned()))
}

fn row_at(r: &Row) -> i64 {
    r.get("st_at").and_then(serde_json::Value::as_i64).unwrap_or(0)
}

fn row_str<'a>(r: &'a Row, k: &str) -> Option<&'a str> {
    r.get(k).and_then(serde_json::Value::as_str)
}

impl<Q: WorkQueue, L: OperatorLedger> Ops<Q, L> {
    pub fn new(ledger: L, queue: Q) -> Self {
        Self { ledger, queue }
    }

    /// One status partition, newest first, after the filter's cursor.
    async fn partition(
        &self,
        status: Status,
        shard: u32,
        filter: &ListFilter,
        want: usize,
        fields: &[&str],
    ) -> Result<Vec<Row>, PortError> {
        let hi = filter.cursor.as_ref().map_or(i64::MAX, |c| c.0).min(filter.until_ms.unwrap_or(i64::MAX));
        let rows = RowFilter {
            endpoint: filter.endpoint.as_deref(),
            event_type: filter.event_type.as_deref(),
            subject: filter.subject.as_deref(),
            since_ms: filter.since_ms.unwrap_or(0),
            until_ms: hi,
            fields,
        };
        // Newest first, ties by key (descending): keep what sorts after the cursor.
        let after_cursor = |r: &Row| match &filter.cursor {
            None => true,
            Some((at, pk)) => {
                let (r_at, r_pk) = (row_at(r), row_str(r, "pk").unwrap_or(""));
                r_at < *at || (r_at == *at && r_pk < pk.as_str())
            }
        };
        Ok(self.ledger.rows(status, shard, &rows, want).await?.into_iter().filter(|r| after_cursor(r)).collect())
    }

    /// Records matching `filter`, newest first, at most `limit`; and the
    /// cursor for the next page when there may be more.
    pub async fn list(&self, filter: &ListFilter) -> Result<(Vec<Row>, Option<(i64, String)>), PortError> {
        let statuses = if filter.statuses.is_empty() { ALL_STATUSES.to_vec() } else { filter.statuses.clone() };
        let mut all = Vec::new();
        for status in statuses {
            for shard in 0..self.ledger.shards() {
                all.extend(self.partition(status, shard, filter, filter.limit, &[]).await?);
            }
        }
        let pk = |r: &Row| row_str(r, "pk").unwrap_or_default().to_owned();
        all.sort_by_key(|r| std::cmp::Reverse((row_at(r), pk(r))));
        let more = all.len() > filter.limit;
        all.truncate(filter.limit);
        let cursor = if more { all.last().map(|r| (row_at(r), pk(r))) } else { None };
        Ok((all, cursor))
    }

    pub async fn stats(&self, now_ms: i64) -> Result<Stats, PortError> {
        let mut stats = Stats::default();
        let everything = ListFilter { limit: usize::MAX, ..Default::default() };
        let fields = ["provider", "event_type", "duplicates", "st_at"];
        for status in ALL_STATUSES {
            let mut count = 0u64;
            for shard in 0..self.ledger.shards() {
                let rows = self.partition(status, shard, &everything, usize::MAX, &fields).await?;
                for r in &rows {
                    let provider = row_str(r, "provider").unwrap_or_default().to_owned();
                    let ty = row_str(r, "event_type").unwrap_or("-");
                    let dups = r.get("duplicates").and_then(serde_json::Value::as_u64).unwrap_or(0);
                    *stats.by_provider.entry(provider.clone()).or_default() += 1;
                    if status != Status::Processed {
                        *stats.open_by_type.entry(format!("{provider} {ty}")).or_default() += 1;
                    }
                    if matches!(status, Status::Received | Status::Retryable | Status::Processing) {
                        let at = r.get("st_at").and_then(serde_json::Value::as_i64).unwrap_or(now_ms);
                        let age = now_ms - at;
                        stats.oldest_unprocessed_age_ms =
                            Some(stats.oldest_unprocessed_age_ms.map_or(age, |a| a.max(age)));
                    }
                    stats.duplicates += dups;
                    stats.deliveries += 1 + dups;
                }
                count += rows.len() as u64;
            }
            stats.by_status.insert(status.as_str().to_owned(), count);
        }
        stats.duplicate_rate =
            if stats.deliveries == 0 { 0.0 } else { stats.duplicates as f64 / stats.deliveries as f64 };
        Ok(stats)
    }

    /// Counts one status.
    pub async fn count(&self, status: Status) -> Result<u64, PortError> {
        self.ledger.count(status).await
    }

    /// The record, its history (oldest first) and, if asked, its payload.
    pub async fn show(&self, key: &EventKey, with_payload: bool) -> Result<Shown, OpsError> {
        self.ledger.show(key, with_payload).await?.ok_or_else(|| OpsError::UnknownEvent(key.to_string()))
    }

    /// One audited, conditional transition.
    async fn transition(
        &self,
        key: &EventKey,
        action: OperatorAction,
        operator: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), OpsError> {
        match self.ledger.transition(key, action, operator, reason, now_ms).await? {
            Transitioned::Done => {}
            Transitioned::Missing => return Err(OpsError::UnknownEvent(key.to_string())),
            Transitioned::Refused(from) => {
                return Err(OpsError::IllegalTransition {
                    action: action.name(),
                    key: key.to_string(),
                    from: from.as_str(),
                    allowed: action.allowed(),
                });
            }
        }
        self.ledger.append_history(key, action.name(), &format!("by {operator}: {reason}"), now_ms).await?;
        Ok(())
    }

    /// DEAD or PARKED → RETRYABLE, due now, attempts and failures reset, a
    /// new time window (set by the next lease), same identity; audited; the
    /// key is queued at once.
    pub async fn replay(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(key, OperatorAction::Replay, operator, reason, now_ms).await?;
        self.queue.send(key).await?;
        Ok(())
    }

    /// RECEIVED, RETRYABLE or DEAD → PARKED: stop working on it until replayed.
    pub async fn park(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(key, OperatorAction::Park, operator, reason, now_ms).await
    }

    /// DEAD or PARKED → PROCESSED with outcome `resolved`: the operator
    /// settled the outcome outside Hookledger.
    pub async fn resolve(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(key, OperatorAction::Resolve, operator, reason, now_ms).await
    }
}
