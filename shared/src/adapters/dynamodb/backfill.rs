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

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{DynamoLedger, get_n, get_s, n, s};
use crate::identity::EventKey;
use crate::ledger::{Claim, NewEvent, PortError, SendLease};
use crate::policy::DEFAULT_RETENTION_DAYS;
use crate::ports::{BackfillLedger, BackfillProgress, Ledger, ScheduleState};

const PROGRESS_SK: &str = "progress";
const SCHEDULE_SK: &str = "schedule";

fn progress_pk(run: &str) -> String {
    format!("backfill#{run}")
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
        let mut item: HashMap<String, AttributeValue> = HashMap::new();
        item.insert("pk".into(), s(key.as_str()));
        item.insert("sk".into(), s(format!("hist#{now_ms:013}#redeliver#{handle}")));
        item.insert("kind".into(), s("redelivery_requested"));
        item.insert("detail".into(), s(format!("backfill asked the provider to redeliver delivery {handle}")));
        item.insert("at".into(), n(now_ms));
        item.insert(super::attr::EXPIRES_AT.into(), n(now_ms / 1000 + i64::from(DEFAULT_RETENTION_DAYS) * 86_400));
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
        let Some(item) = self.read_item(&progress_pk(endpoint), SCHEDULE_SK).await? else { return Ok(None) };
        let current = get_n(&item, "current_since").zip(get_n(&item, "current_until"));
        Ok(Some(ScheduleState { high_water: get_n(&item, "high_water"), current }))
    }

    async fn save_schedule_state(&self, endpoint: &str, st: &ScheduleState, now_ms: i64) -> Result<(), PortError> {
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
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| crate::adapters::port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn progress(&self, run: &str) -> Result<Option<BackfillProgress>, PortError> {
        let Some(item) = self.read_item(&progress_pk(run), PROGRESS_SK).await? else { return Ok(None) };
        Ok(Some(BackfillProgress {
            cursor: get_s(&item, "cursor").map(str::to_owned),
            done: item.get("done").and_then(|v| v.as_bool().ok()).copied().unwrap_or(false),
            seen: get_n(&item, "seen").and_then(|v| u64::try_from(v).ok()).unwrap_or(0),
            recovered: get_n(&item, "recovered").and_then(|v| u64::try_from(v).ok()).unwrap_or(0),
        }))
    }

    async fn save_progress(&self, run: &str, p: &BackfillProgress, now_ms: i64) -> Result<(), PortError> {
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
        item.insert(super::attr::EXPIRES_AT.into(), n(now_ms / 1000 + i64::from(DEFAULT_RETENTION_DAYS) * 86_400));
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
