//! The backfill's port on the ledger: the intake's claim (one conditional
//! write per event, `via = backfill`), whether a key is recorded, each
//! window's progress in its own item (`pk = backfill#<endpoint>#<window>`,
//! `sk = progress`; no index, expires with the records) and each endpoint's
//! schedule (`pk = backfill#<endpoint>`, `sk = schedule`: the high-water
//! mark and the window in progress; kept).
//!
//! Progress is written without a condition: two runs of one window write the
//! same cursors in the same order, and a stale cursor only makes a page be
//! read again (its events are then already recorded).
//!
//! An event its source cannot serve is parked under its identity (one
//! conditional put, the claim's `conditions::CLAIM`); a delivery or a replay
//! that has its payload releases it (`conditions::release_parked`, after
//! the payload is stored as the claim would store it).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::conditions::{self as cond, Placed};
use super::{DynamoLedger, META_SK, Written, attention_shard, attr, get_n, get_s, n, new_record_item, payload, s};
use crate::identity::EventKey;
use crate::ledger::{Claim, NewEvent, PortError, Release, SendLease, Status};
use crate::policy::expires_at;
use crate::ports::{BackfillLedger, BackfillProgress, Ledger, ScheduleState, UnfetchedEvent, WorkLedger};

/// Room the attributes of a released record take beyond a new record's
/// (the park's evidence), when deciding whether its payload fits inline.
pub(crate) const PARKED_ATTRIBUTES_BYTES: usize = 512;

/// The record of a parked, unfetched event: the claim's identity and
/// provenance, PARKED in the attention index (not in the `due` index), no
/// payload and no send lease, and what a replay needs to ask the source
/// again (`backfill_handle`, `backfill_origin`, `backfill_created`).
pub(crate) fn parked_item(event: &NewEvent, unfetched: &UnfetchedEvent<'_>) -> super::Item {
    // The claim's record, less what only a stored, sendable one has.
    let mut item = super::new_record_item(event);
    for gone in [attr::CONTENT_HASH, attr::SEND_LEASE_UNTIL, attr::DUE_SHARD, attr::DUE_AT] {
        item.remove(gone);
    }
    item.insert(attr::STATUS.into(), s(Status::Parked.as_str()));
    item.insert(attr::PAYLOAD_HASH.into(), s(crate::ledger::NO_PAYLOAD_HASH));
    item.insert(attr::PAYLOAD_STORED.into(), AttributeValue::Bool(false));
    item.insert("attn_shard".into(), s(attention_shard(event.shard)));
    item.insert("attn_at".into(), n(event.received_at_ms));
    item.insert("park_reason".into(), s(unfetched.reason));
    item.insert("parked_at".into(), n(event.received_at_ms));
    item.insert("backfill_detail".into(), s(cond::bounded(unfetched.detail)));
    item.insert("backfill_created".into(), n(unfetched.created_s));
    if let Some(h) = unfetched.handle {
        item.insert("backfill_handle".into(), s(h));
    }
    if let Some(o) = unfetched.origin {
        item.insert("backfill_origin".into(), s(o));
    }
    item
}

impl DynamoLedger {
    /// [`Ledger::release_parked`]: the payload where the claim would put it
    /// (inline when the record stays small, else its own item, else S3),
    /// then one conditional update.
    pub(super) async fn release_parked_record(
        &self,
        event: &NewEvent,
        body: &[u8],
        by: &str,
    ) -> Result<Release, PortError> {
        let stored = payload::encode(body);
        let record = payload::item_size(&new_record_item(event)) + PARKED_ATTRIBUTES_BYTES;
        let placed = if payload::inline(record, stored.bytes.len()) {
            Placed::Inline(stored)
        } else if stored.bytes.len() <= payload::ITEM_PAYLOAD_BYTES {
            self.put_payload(&event.key, &event.payload_hash, body, event.expires_at).await?;
            Placed::Item
        } else {
            let Some(s3) = &self.payloads else {
                return Err(PortError::TooLarge { size: stored.bytes.len(), limit: payload::ITEM_PAYLOAD_BYTES });
            };
            s3.put(&event.key, &event.payload_hash, &stored).await?;
            Placed::S3
        };
        match self.conditional(event.key.as_str(), META_SK, cond::release_parked(event, by, placed), true).await? {
            Written::Applied(new) => Ok(released(&new.unwrap_or_default())),
            // Our own retried update after a lost acknowledgement.
            Written::Refused(met) => Ok(release_refused(met.as_ref(), event)),
        }
    }
}

pub(crate) const PROGRESS_SK: &str = "progress";
pub(crate) const SCHEDULE_SK: &str = "schedule";
/// The last scheduled audit's summary, beside its endpoint's schedule.
pub(crate) const AUDIT_SK: &str = "audit";

pub(crate) fn audit_item(endpoint: &str, report: &str, now_ms: i64) -> super::Item {
    HashMap::from([
        ("pk".into(), s(progress_pk(endpoint))),
        ("sk".into(), s(AUDIT_SK)),
        ("report".into(), s(report)),
        ("updated_at".into(), n(now_ms)),
    ])
}

pub(crate) fn audit_from(item: &super::Item) -> Option<String> {
    super::get_s(item, "report").map(str::to_owned)
}

pub(crate) fn progress_pk(run: &str) -> String {
    format!("backfill#{run}")
}

/// The history entry that notes a redelivery asked for: named by the
/// delivery and the time it was asked, so a retry rewrites the same item.
pub(crate) fn redelivery_item(key: &EventKey, handle: &str, now_ms: i64, retention_days: u32) -> super::Item {
    HashMap::from([
        ("pk".into(), s(key.as_str())),
        ("sk".into(), s(format!("hist#{now_ms:013}#redeliver#{handle}"))),
        ("kind".into(), s("redelivery_requested")),
        ("detail".into(), s(format!("backfill asked the provider to redeliver delivery {handle}"))),
        ("at".into(), n(now_ms)),
        (attr::EXPIRES_AT.into(), n(expires_at(now_ms, retention_days))),
    ])
}

/// An endpoint's schedule item (kept: no expiry).
pub(crate) fn schedule_item(endpoint: &str, st: &ScheduleState, now_ms: i64) -> super::Item {
    let mut item: HashMap<String, AttributeValue> = HashMap::new();
    item.insert("pk".into(), s(progress_pk(endpoint)));
    item.insert("sk".into(), s(SCHEDULE_SK));
    if let Some(hw) = st.high_water {
        item.insert("high_water".into(), n(hw));
    }
    if let Some((since, until)) = st.current {
        item.insert("current_since".into(), n(since));
        item.insert("current_until".into(), n(until));
    }
    item.insert("updated_at".into(), n(now_ms));
    item
}

pub(crate) fn schedule_from(item: &super::Item) -> ScheduleState {
    let current = get_n(item, "current_since").zip(get_n(item, "current_until"));
    ScheduleState { high_water: get_n(item, "high_water"), current }
}

/// A window's progress item (expires with the records).
pub(crate) fn progress_item(run: &str, p: &BackfillProgress, now_ms: i64, retention_days: u32) -> super::Item {
    let mut item: HashMap<String, AttributeValue> = HashMap::new();
    item.insert("pk".into(), s(progress_pk(run)));
    item.insert("sk".into(), s(PROGRESS_SK));
    if let Some(c) = &p.cursor {
        item.insert("cursor".into(), s(c));
    }
    item.insert("done".into(), AttributeValue::Bool(p.done));
    item.insert("seen".into(), n(p.seen));
    item.insert("recovered".into(), n(p.recovered));
    item.insert("updated_at".into(), n(now_ms));
    item.insert(attr::EXPIRES_AT.into(), n(expires_at(now_ms, retention_days)));
    item
}

pub(crate) fn progress_from(item: &super::Item) -> BackfillProgress {
    BackfillProgress {
        cursor: get_s(item, "cursor").map(str::to_owned),
        done: item.get("done").and_then(|v| v.as_bool().ok()).copied().unwrap_or(false),
        seen: get_n(item, "seen").and_then(|v| u64::try_from(v).ok()).unwrap_or(0),
        recovered: get_n(item, "recovered").and_then(|v| u64::try_from(v).ok()).unwrap_or(0),
    }
}

/// A release done, from the record after it (its tenant).
pub(crate) fn released(record: &super::Item) -> Release {
    Release::Released { tenant: get_s(record, attr::TENANT).unwrap_or_default().to_owned() }
}

/// The release's outcome, given what a refused release met: our own
/// retried update (our send token, no longer parked) released it.
pub(crate) fn release_refused(met: Option<&super::Item>, event: &NewEvent) -> Release {
    match met {
        Some(met)
            if get_s(met, attr::SEND_TOKEN) == Some(event.send.token.as_str())
                && get_s(met, attr::STATUS) != Some(Status::Parked.as_str()) =>
        {
            released(met)
        }
        _ => Release::NotAwaiting,
    }
}

impl BackfillLedger for DynamoLedger {
    async fn claim(&self, event: &NewEvent, body: &[u8]) -> Result<Claim, PortError> {
        Ledger::claim(self, event, body).await
    }

    async fn release_send_lease(&self, key: &EventKey, lease: &SendLease) -> Result<(), PortError> {
        Ledger::release_send_lease(self, key, lease).await
    }

    async fn recorded(&self, key: &EventKey) -> Result<bool, PortError> {
        Ok(self.read_meta(key).await?.is_some())
    }

    async fn note_redelivery(&self, key: &EventKey, handle: &str, now_ms: i64) -> Result<(), PortError> {
        // A history entry under the event's key, named by the delivery and
        // the time it was asked for: the SDK's retry of this write rewrites
        // the same item.
        let item = redelivery_item(key, handle, now_ms, self.retention_days);
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| crate::adapters::port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn schedule_state(&self, endpoint: &str) -> Result<Option<ScheduleState>, PortError> {
        Ok(self.read_item(&progress_pk(endpoint), SCHEDULE_SK).await?.as_ref().map(schedule_from))
    }

    async fn save_schedule_state(&self, endpoint: &str, st: &ScheduleState, now_ms: i64) -> Result<(), PortError> {
        let item = schedule_item(endpoint, st, now_ms);
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| crate::adapters::port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn save_audit(&self, endpoint: &str, report: &str, now_ms: i64) -> Result<(), PortError> {
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(audit_item(endpoint, report, now_ms)))
            .send()
            .await
            .map_err(|e| crate::adapters::port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn last_audit(&self, endpoint: &str) -> Result<Option<String>, PortError> {
        Ok(self.read_item(&progress_pk(endpoint), AUDIT_SK).await?.as_ref().and_then(audit_from))
    }

    async fn progress(&self, run: &str) -> Result<Option<BackfillProgress>, PortError> {
        Ok(self.read_item(&progress_pk(run), PROGRESS_SK).await?.as_ref().map(progress_from))
    }

    async fn park(&self, event: &NewEvent, unfetched: &UnfetchedEvent<'_>) -> Result<Claim, PortError> {
        // The claim's conditional put (`attribute_not_exists(pk)`) of
        // the parked record: our own retried put after a lost acknowledgement
        // meets our send token, parked by us.
        self.put_claim(event, parked_item(event, unfetched)).await
    }

    async fn release(&self, event: &NewEvent, body: &[u8], by: &str) -> Result<Release, PortError> {
        self.release_parked_record(event, body, by).await
    }

    async fn note(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) -> Result<(), PortError> {
        WorkLedger::append_history(self, key, kind, detail, now_ms).await
    }

    async fn save_progress(&self, run: &str, p: &BackfillProgress, now_ms: i64) -> Result<(), PortError> {
        let item = progress_item(run, p, now_ms, self.retention_days);
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| crate::adapters::port_error("dynamodb", &e))?;
        Ok(())
    }
}
