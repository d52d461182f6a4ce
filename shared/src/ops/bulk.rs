//! Replay of records by filter: the DEAD or PARKED records of a provider,
//! endpoint, tenant, type glob and receive-time range, read from the sparse
//! `attention` index (no scan), counted before anything changes, replayed
//! in bounded batches, each replay audited. The filter and the reason name
//! the run ([`RecordFilter::run`]); a replay in a run marks its record with
//! it, conditionally, so a run interrupted and started again never replays
//! twice what it replayed (a record it replayed that died again is left for
//! another run, under another reason).

use super::Ops;
use crate::audit::{AuditEntry, Caller};
use crate::identity::EventKey;
use crate::ledger::{OperatorAction, PortError, Row, Status, Transitioned};
use crate::ports::{OperatorLedger, RowFilter, WorkQueue};
use crate::routes::Glob;

/// Which records a bulk replay takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordFilter {
    pub provider: Option<String>,
    pub endpoint: Option<String>,
    pub tenant: Option<String>,
    /// A glob of `*` and `?` (`invoice.*`); a literal is matched exactly.
    pub event_type: Option<String>,
    /// The provider subject the projection named (a customer id, ...).
    pub subject: Option<String>,
    /// DEAD, PARKED, or both when empty.
    pub statuses: Vec<Status>,
    /// Received at or after (unix ms).
    pub since_ms: Option<i64>,
    /// Received before (unix ms).
    pub until_ms: Option<i64>,
    /// Why: kept in each audit entry, and part of the run's name.
    pub reason: String,
}

/// A matching record: its key, status, type and receive time.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Matched {
    pub key: String,
    pub status: String,
    pub event_type: Option<String>,
    pub received_at: Option<i64>,
    pub reason: Option<String>,
}

/// What a filter matched.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Selection {
    /// What a replay of this run replays (oldest first).
    pub records: Vec<Matched>,
    /// PARKED by a backfill without their payload: a replay asks the
    /// provider again (`hookledger replay KEY` with the provider's flags),
    /// so they are listed apart, not replayed by the filter.
    pub need_their_source: Vec<String>,
    /// Replayed by this run already (the rerun of an interrupted run skips them).
    pub replayed_by_this_run: usize,
}

/// What a batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Replayed {
    pub replayed: usize,
    /// Matched but moved meanwhile (another operator, or replayed by this run).
    pub skipped: usize,
}

impl RecordFilter {
    /// The statuses it reads: DEAD and PARKED unless narrowed.
    pub fn statuses(&self) -> Vec<Status> {
        if self.statuses.is_empty() { vec![Status::Dead, Status::Parked] } else { self.statuses.clone() }
    }

    /// Refuses a filter that could replay what is not DEAD or PARKED.
    pub fn check(&self) -> Result<(), String> {
        if let Some(bad) = self.statuses.iter().find(|s| !matches!(s, Status::Dead | Status::Parked)) {
            return Err(format!("--status {}: only DEAD and PARKED records are replayed", bad.as_str()));
        }
        if self.reason.trim().is_empty() {
            return Err("--reason must say why (it is kept in each audit entry, and it names the run)".into());
        }
        if let (Some(s), Some(u)) = (self.since_ms, self.until_ms) {
            if s >= u {
                return Err(format!("--since ({s}) must be before --until ({u})"));
            }
        }
        Ok(())
    }

    /// The run's name: the filter and the reason, hashed. The same command
    /// again is the same run.
    pub fn run(&self) -> String {
        let mut statuses: Vec<&str> = self.statuses().iter().map(|s| s.as_str()).collect();
        statuses.sort_unstable();
        let text = serde_json::json!([
            self.provider,
            self.endpoint,
            self.tenant,
            self.event_type,
            self.subject,
            statuses,
            self.since_ms,
            self.until_ms,
            self.reason
        ])
        .to_string();
        format!("replay-{}", &crate::identity::payload_hash(text.as_bytes())[..16])
    }

    /// Whether an index row passes what the index filter could not check:
    /// the provider, and a type glob.
    fn passes(&self, row: &Row) -> bool {
        let text = |k: &str| row.get(k).and_then(serde_json::Value::as_str);
        let provider = text("provider").or_else(|| text("pk").and_then(|pk| pk.split('#').nth(1)));
        self.provider.as_deref().is_none_or(|p| provider == Some(p))
            && self
                .event_type
                .as_deref()
                .is_none_or(|g| text("event_type").is_some_and(|t| Glob::new(Some(g)).matches(t)))
    }

    fn literal_type(&self) -> Option<&str> {
        self.event_type.as_deref().filter(|t| !t.contains(['*', '?']))
    }
}

fn text(row: &Row, k: &str) -> Option<String> {
    row.get(k).and_then(serde_json::Value::as_str).map(str::to_owned)
}

/// Parked by a backfill without its payload: a replay fetches it again.
fn needs_its_source(record: &Row) -> bool {
    record.get("payload_stored").and_then(serde_json::Value::as_bool) == Some(false)
        && text(record, "park_reason").is_some_and(|r| r.starts_with("backfill_unrecoverable"))
}

impl<Q: WorkQueue, L: OperatorLedger> Ops<Q, L> {
    /// The records `filter`'s run replays: read from the attention index
    /// (each status partition of each shard, at most `max` rows a
    /// partition), then by key in batches (a record's tenant and its run
    /// mark are not in the index). `partial`: a partition held more than
    /// `max`, so run again when these are done.
    pub async fn matching(&self, filter: &RecordFilter, max: usize) -> Result<(Selection, bool), PortError> {
        let rows_filter = RowFilter {
            endpoint: filter.endpoint.as_deref(),
            tenant: None,
            event_type: filter.literal_type(),
            subject: filter.subject.as_deref(),
            since_ms: filter.since_ms.unwrap_or(0),
            // Received before `until`: the index's range is inclusive.
            until_ms: filter.until_ms.map_or(i64::MAX, |u| u - 1),
            fields: &[],
            after: None,
        };
        let mut rows = Vec::new();
        let mut partial = false;
        for status in filter.statuses() {
            for shard in 0..self.ledger.shards() {
                let mut got = self.ledger.rows(status, shard, &rows_filter, max.saturating_add(1)).await?;
                partial |= got.len() > max;
                got.truncate(max);
                rows.extend(got.into_iter().filter(|r| filter.passes(r)));
            }
        }
        let keys: Vec<EventKey> =
            rows.iter().filter_map(|r| text(r, "pk")).filter_map(|pk| EventKey::from_stored(&pk)).collect();
        let records = self.ledger.records(&keys).await?;
        let run = filter.run();
        let mut selection = Selection::default();
        for record in records {
            let status = text(&record, "status").unwrap_or_default();
            let Some(key) = text(&record, "pk") else { continue };
            if !filter.statuses().iter().any(|s| s.as_str() == status) {
                continue; // moved since the index was read
            }
            if filter.tenant.is_some() && text(&record, "tenant") != filter.tenant {
                continue;
            }
            if text(&record, "replay_run").as_deref() == Some(run.as_str()) {
                selection.replayed_by_this_run += 1;
            } else if needs_its_source(&record) {
                selection.need_their_source.push(key);
            } else {
                selection.records.push(Matched {
                    key,
                    status,
                    event_type: text(&record, "event_type"),
                    received_at: record.get("received_at").and_then(serde_json::Value::as_i64),
                    reason: text(&record, "dead_reason").or_else(|| text(&record, "park_reason")),
                });
            }
        }
        selection.records.sort_by(|a, b| (a.received_at, &a.key).cmp(&(b.received_at, &b.key)));
        selection.need_their_source.sort();
        Ok((selection, partial))
    }

    /// Replays `batch` (of [`Self::matching`]) in `filter`'s run: each one
    /// conditionally (still DEAD or PARKED, not replayed by this run), in
    /// one write with its audit entry, then queued.
    pub async fn replay_batch(
        &self,
        filter: &RecordFilter,
        batch: &[Matched],
        caller: &Caller,
        now_ms: i64,
    ) -> Result<Replayed, PortError> {
        let run = filter.run();
        let mut done = Replayed::default();
        self.ledger.note_activity(now_ms).await;
        for m in batch {
            let Some(key) = EventKey::from_stored(&m.key) else {
                done.skipped += 1;
                continue;
            };
            let entry = AuditEntry::new("", now_ms, OperatorAction::Replay.name(), key.as_str(), caller)
                .on_record(&key)
                .because(&filter.reason)
                .in_run(&run);
            match self.ledger.transition(&key, OperatorAction::Replay, &entry, now_ms).await? {
                Transitioned::Done { tenant } => {
                    // A failed send leaves it to the reconciler: it is due now.
                    if let Err(e) = self.queue.send(&key, &tenant).await {
                        tracing::warn!(key = %key, error = %e, "replayed record not queued; the reconciler re-drives it");
                    }
                    done.replayed += 1;
                }
                Transitioned::Missing | Transitioned::Refused(_) => done.skipped += 1,
            }
        }
        Ok(done)
    }
}
