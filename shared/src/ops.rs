//! Operator actions over the ledger: list, show, replay, park, resolve (the
//! figures are `insight`'s). Reads go through the sparse `attention` and
//! `due` indexes (never a table scan); every
//! change is one conditional update that names the statuses it may leave
//! (the [`OperatorLedger`] port; [`OperatorAction`] says which), written in
//! one transaction with its operator audit entry ([`crate::audit`]).

use crate::audit::{AuditEntry, Caller};
use crate::identity::EventKey;
use crate::ledger::{Erasure, OperatorAction, PortError, Row, Status, Transitioned};
use crate::ports::{OperatorLedger, PayloadKeys, RowFilter, Shown, WorkQueue};
use crate::sealing::KeyState;

pub const ALL_STATUSES: [Status; 6] =
    [Status::Received, Status::Processing, Status::Retryable, Status::Processed, Status::Dead, Status::Parked];

/// The statuses `list` and `stats` see: every record that is not finished.
/// PROCESSED records are in no index (an index write saved per event);
/// `show KEY` reads one.
pub const INDEXED_STATUSES: [Status; 5] =
    [Status::Received, Status::Processing, Status::Retryable, Status::Dead, Status::Parked];

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

/// Why a replay of a record a backfill parked without its payload is refused.
pub const NEEDS_ITS_SOURCE: &str = "a backfill parked it without its payload (its provider would not serve it); \
     `hookledger replay` fetches it from the provider again, and a webhook delivery of it releases it";

impl OpsError {
    /// A replay refused because a backfill parked the record without its
    /// payload (the condition on the replay refuses it): `hookledger replay`
    /// fetches it from its source instead (`backfill::Backfill::release`).
    pub fn needs_its_source(&self) -> bool {
        matches!(self, Self::IllegalTransition { action, from, .. }
            if *action == OperatorAction::Replay.name() && *from == Status::Parked.as_str())
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

pub struct Ops<Q, L> {
    ledger: L,
    queue: Q,
    /// The data keys of sealed payloads, for `erase`.
    keys: Option<std::sync::Arc<dyn PayloadKeys>>,
}

/// What an erasure did to one event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Erased {
    pub key: String,
    /// `erased`, `already erased`, `would erase` (a dry run), `in flight`
    /// (RECEIVED, PROCESSING or RETRYABLE: left alone; erase it again once
    /// it settles), or `unknown` (no such record).
    pub outcome: &'static str,
    /// Its status, when the record exists.
    pub status: Option<String>,
    /// Whether its payload was sealed under a key of its own, destroyed by
    /// the erasure: then every copy anywhere (a queue's, a backup's) is
    /// unreadable. Unsealed, only the ledger's copies are deleted.
    pub sealed: bool,
}

impl Erased {
    /// Whether the event's payload is erased (now or before) or gone.
    pub fn settled(&self) -> bool {
        matches!(self.outcome, "erased" | "already erased" | "unknown")
    }
}

/// Why an erasure could not run.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    #[error("erasing by subject needs the key store (HOOKLEDGER_KEYS_TABLE): subjects are indexed there")]
    NoKeyStore,
    #[error(transparent)]
    Storage(#[from] PortError),
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
        Self { ledger, queue, keys: None }
    }

    /// Erases sealed payloads by destroying their keys in `keys`.
    pub fn with_keys(mut self, keys: std::sync::Arc<dyn PayloadKeys>) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Erases one event's payload ([`crate::sealing`]): its data key
    /// destroyed (a tombstone, so a later delivery is a duplicate that
    /// stores nothing), then its ledger copies deleted and the record marked
    /// erased with its audit entry (who, why). Identity, status and hashes
    /// stay. A record still in flight is left alone (`in flight`). Each
    /// step is safe to repeat: run it again after any failure.
    pub async fn erase(
        &self,
        key: &EventKey,
        caller: &Caller,
        reason: &str,
        now_ms: i64,
        dry_run: bool,
    ) -> Result<Erased, PortError> {
        let mut out = Erased { key: key.as_str().to_owned(), outcome: "unknown", status: None, sealed: false };
        let Some((record, _, _)) = self.ledger.show(key, false).await? else { return Ok(out) };
        let text = |k: &str| record.get(k).and_then(serde_json::Value::as_str).map(str::to_owned);
        let status = text("status").as_deref().and_then(Status::parse);
        out.status = status.map(|s| s.as_str().to_owned());
        let state = match &self.keys {
            Some(keys) => keys.key_of(key).await?,
            None => KeyState::Missing,
        };
        out.sealed = !matches!(state, KeyState::Missing);
        if record.get("erased_at").is_some_and(|v| !v.is_null()) && !matches!(state, KeyState::Live(_)) {
            out.outcome = "already erased";
            return Ok(out);
        }
        if !matches!(status, Some(Status::Processed | Status::Dead | Status::Parked)) {
            out.outcome = "in flight";
            return Ok(out);
        }
        if dry_run {
            out.outcome = "would erase";
            return Ok(out);
        }
        if let (Some(keys), KeyState::Live(_)) = (&self.keys, &state) {
            let expires_at = record.get("expires_at").and_then(serde_json::Value::as_i64).unwrap_or(0);
            keys.destroy(key, &caller.operator, now_ms, expires_at).await?;
        }
        let hash = text("payload_hash").unwrap_or_default();
        let entry =
            AuditEntry::new("", now_ms, crate::audit::verb::ERASE, key.as_str(), caller).on_record(key).because(reason);
        out.outcome = match self.ledger.erase(key, &hash, &entry, now_ms).await? {
            Erasure::Erased => "erased",
            Erasure::AlreadyErased => "already erased",
            Erasure::Missing => "unknown",
            Erasure::NotFinished(st) => {
                out.status = Some(st.as_str().to_owned());
                "in flight"
            }
        };
        Ok(out)
    }

    /// Erases every event noted under `subject` (only `endpoint`'s, when
    /// given), one at a time, and forgets each note once its event is
    /// settled. The subject index holds erasable endpoints' events.
    pub async fn erase_subject(
        &self,
        subject: &str,
        endpoint: Option<&str>,
        caller: &Caller,
        reason: &str,
        now_ms: i64,
        dry_run: bool,
    ) -> Result<Vec<Erased>, EraseError> {
        let keys = self.keys.as_ref().ok_or(EraseError::NoKeyStore)?;
        let events = keys.subject_events(subject).await?;
        let mut out = Vec::with_capacity(events.len());
        for key in events {
            if endpoint.is_some_and(|e| key.as_str().split('#').nth(2) != Some(e)) {
                continue;
            }
            let erased = self.erase(&key, caller, reason, now_ms, dry_run).await?;
            if !dry_run && erased.settled() {
                keys.forget_subject(subject, &key).await?;
            }
            out.push(erased);
        }
        Ok(out)
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
            tenant: None,
            event_type: filter.event_type.as_deref(),
            subject: filter.subject.as_deref(),
            since_ms: filter.since_ms.unwrap_or(0),
            until_ms: hi,
            fields,
            after: filter.cursor.as_ref().map(|(at, pk)| (*at, pk.as_str())),
        };
        self.ledger.rows(status, shard, &rows, want).await
    }

    /// Records matching `filter`, newest first, at most `limit`; and the
    /// cursor for the next page when there may be more.
    pub async fn list(&self, filter: &ListFilter) -> Result<(Vec<Row>, Option<(i64, String)>), PortError> {
        let statuses = if filter.statuses.is_empty() { INDEXED_STATUSES.to_vec() } else { filter.statuses.clone() };
        let mut all = Vec::new();
        for status in statuses {
            for shard in 0..self.ledger.shards() {
                // One more than the page: a partition with more than `limit`
                // rows after the cursor says "there are more".
                all.extend(self.partition(status, shard, filter, filter.limit.saturating_add(1), &[]).await?);
            }
        }
        let pk = |r: &Row| row_str(r, "pk").unwrap_or_default().to_owned();
        all.sort_by_key(|r| std::cmp::Reverse((row_at(r), pk(r))));
        let more = all.len() > filter.limit;
        all.truncate(filter.limit);
        let cursor = if more { all.last().map(|r| (row_at(r), pk(r))) } else { None };
        Ok((all, cursor))
    }

    /// Counts one status.
    pub async fn count(&self, status: Status) -> Result<u64, PortError> {
        self.ledger.count(status).await
    }

    /// The record, its history (oldest first) and, if asked, its payload.
    /// A sealed payload is opened under its event's key; an erased one's
    /// is none.
    pub async fn show(&self, key: &EventKey, with_payload: bool) -> Result<Shown, OpsError> {
        let (record, history, payload) =
            self.ledger.show(key, with_payload).await?.ok_or_else(|| OpsError::UnknownEvent(key.to_string()))?;
        let payload = match payload {
            Some(bytes) => crate::ports::open_payload(self.keys.as_deref(), key, bytes).await?.ok(),
            None => None,
        };
        Ok((record, history, payload))
    }

    /// One conditional transition and its audit entry, as one write; the
    /// record's tenant.
    async fn transition(
        &self,
        key: &EventKey,
        action: OperatorAction,
        caller: &Caller,
        reason: &str,
        now_ms: i64,
    ) -> Result<String, OpsError> {
        // A replay or a release makes the record due again.
        self.ledger.note_activity(now_ms).await;
        let entry = AuditEntry::new("", now_ms, action.name(), key.as_str(), caller).on_record(key).because(reason);
        match self.ledger.transition(key, action, &entry, now_ms).await? {
            Transitioned::Done { tenant } => Ok(tenant),
            Transitioned::Missing => Err(OpsError::UnknownEvent(key.to_string())),
            // PARKED may be replayed, unless a backfill parked it without its payload.
            Transitioned::Refused(Status::Parked) if action == OperatorAction::Replay => {
                Err(OpsError::IllegalTransition {
                    action: action.name(),
                    key: key.to_string(),
                    from: Status::Parked.as_str(),
                    allowed: NEEDS_ITS_SOURCE,
                })
            }
            Transitioned::Refused(from) => Err(OpsError::IllegalTransition {
                action: action.name(),
                key: key.to_string(),
                from: from.as_str(),
                allowed: action.allowed(),
            }),
        }
    }

    /// DEAD or PARKED → RETRYABLE, due now, attempts and failures reset, a
    /// new time window (set by the next lease), same identity; audited in the
    /// same write; the key is queued at once (a failed send leaves it to the
    /// reconciler, which re-drives the record: it is due now). A record a
    /// backfill parked without its payload is refused
    /// ([`OpsError::needs_its_source`]): `hookledger replay` fetches it from
    /// its provider again (`backfill::Backfill::release`).
    pub async fn replay(&self, key: &EventKey, caller: &Caller, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        let tenant = self.transition(key, OperatorAction::Replay, caller, reason, now_ms).await?;
        self.queue.send(key, &tenant).await?;
        Ok(())
    }

    /// RECEIVED, RETRYABLE or DEAD → PARKED: stop working on it until replayed.
    pub async fn park(&self, key: &EventKey, caller: &Caller, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(key, OperatorAction::Park, caller, reason, now_ms).await.map(drop)
    }

    /// DEAD or PARKED → PROCESSED with outcome `resolved`: the operator
    /// settled the outcome outside Hookledger.
    pub async fn resolve(&self, key: &EventKey, caller: &Caller, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(key, OperatorAction::Resolve, caller, reason, now_ms).await.map(drop)
    }
}

pub mod bulk;

#[cfg(test)]
mod tests;
