//! Upgrading the items of an earlier release to today's indexes, once, by
//! `hookledger migrate` (see docs/operations.md, "Upgrading a deployed stack"). A migration reads
//! the whole table (a `Scan`, paged; the only scan in Hookledger) and
//! rewrites what it finds, each item with one conditional update (in
//! `conditions`), so it can be run again, and run while the functions work:
//!
//! - DEAD and PARKED records, and DEAD outbox items, enter the sparse
//!   `attention` index (they were in the `status` index);
//! - outbox items and entitlements leave the records' partitions: an outbox
//!   item in `due#NNN` (the layout of the release before) moves to
//!   `out#NNN`, an entitlement in `due#NNN` to `chk#NNN`, both keeping their
//!   next look; an entitlement in `ent#NNN` (the oldest layout, `due_at` its
//!   last check) moves to `chk#NNN`, due at its last check plus the default
//!   drift interval. Until then the reconciler acts on what it finds in
//!   `due#NNN` under its own phase, so nothing waits for the migration.
//!
//! Records in flight need nothing: the processor reads records written
//! without a payload in them, payload items without an encoding, and queue
//! messages without a payload, as earlier releases wrote them.

use super::conditions as cond;
use super::outbox::OUTBOX_SK;
use super::{DynamoLedger, META_SK, attention_shard, attr, due_partition, get_n, get_s};
use crate::adapters::port_error;
use crate::config::DEFAULT_DRIFT_INTERVAL_MS;
use crate::identity::EventKey;
use crate::ledger::{DuePartition, PortError};
use crate::projection::STATE_SK;

/// The due-index partition prefix of re-checked state in the oldest
/// releases (`ent#NNN`, before it shared `due#NNN` with the records).
const LEGACY_DRIFT_SHARD_PREFIX: &str = "ent";

/// What a migration changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Migrated {
    /// Items read.
    pub scanned: u64,
    /// DEAD or PARKED records (and DEAD outbox items) put in the attention index.
    pub attention: u64,
    /// Outbox items moved to `out#NNN`.
    pub outbox_moved: u64,
    /// Re-checked projection state (the entitlements of those releases)
    /// moved to `chk#NNN` (the field keeps its name for scripts that read it).
    pub entitlements_moved: u64,
    /// Items of an earlier layout that changed while the migration read them
    /// (claimed or rewritten meanwhile): run it again for them.
    pub left: u64,
    /// Every item is in today's layout: nothing was left.
    pub done: bool,
}

/// The shard number of an index partition name (`out#007` → 7).
fn shard_number(partition: &str) -> Option<u32> {
    partition.rsplit('#').next()?.parse().ok()
}

impl DynamoLedger {
    /// Brings every item of an earlier release to today's indexes.
    pub async fn migrate(&self) -> Result<Migrated, PortError> {
        let mut done = Migrated::default();
        let mut start = None;
        loop {
            let page = self
                .client()
                .scan()
                .table_name(self.table())
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| port_error("dynamodb", &e))?;
            for item in page.items.unwrap_or_default() {
                done.scanned += 1;
                let (Some(pk), Some(sk)) = (get_s(&item, attr::PK), get_s(&item, attr::SK)) else { continue };
                let status = get_s(&item, attr::STATUS).unwrap_or_default();
                let in_attention = item.contains_key(attr::ATTN_SHARD);
                let update = match sk {
                    META_SK if matches!(status, "DEAD" | "PARKED") && !in_attention => {
                        let Some(key) = EventKey::from_stored(pk) else { continue };
                        let at = get_n(&item, attr::RECEIVED_AT).unwrap_or(0);
                        Some((cond::migrate_attention(status, &attention_shard(key.shard(self.shards())), at), 0))
                    }
                    OUTBOX_SK if status == "DEAD" && !in_attention => {
                        let shard = get_s(&item, "event_key")
                            .and_then(EventKey::from_stored)
                            .map_or(0, |k| k.shard(self.shards()));
                        let at = get_n(&item, "dead_at").unwrap_or(0);
                        Some((cond::migrate_attention(status, &attention_shard(shard), at), 0))
                    }
                    OUTBOX_SK | STATE_SK => {
                        let (Some(from), Some(at)) = (get_s(&item, attr::DUE_SHARD), get_n(&item, attr::DUE_AT)) else {
                            continue;
                        };
                        let (prefix, Some(shard)) = (from.split('#').next().unwrap_or_default(), shard_number(from))
                        else {
                            continue;
                        };
                        let (to, next, kind) = match (sk, prefix) {
                            (OUTBOX_SK, "due") => (DuePartition::Outbox, at, 1),
                            (STATE_SK, "due") => (DuePartition::Checks, at, 2),
                            (STATE_SK, LEGACY_DRIFT_SHARD_PREFIX) => {
                                (DuePartition::Checks, at + DEFAULT_DRIFT_INTERVAL_MS, 2)
                            }
                            _ => continue,
                        };
                        Some((cond::migrate_due_partition(from, at, &due_partition(to, shard), next), kind))
                    }
                    _ => None,
                };
                let Some((update, kind)) = update else { continue };
                if self.conditional_ok(pk, sk, update).await? {
                    match kind {
                        0 => done.attention += 1,
                        1 => done.outbox_moved += 1,
                        _ => done.entitlements_moved += 1,
                    }
                } else if kind != 0 {
                    done.left += 1;
                }
            }
            match page.last_evaluated_key {
                Some(k) => start = Some(k),
                None => {
                    done.done = done.left == 0;
                    return Ok(done);
                }
            }
        }
    }
}
