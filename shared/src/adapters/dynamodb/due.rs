//! The reconciler's reads and writes ([`DueLedger`]): the sparse `due`
//! index (per shard one partition for ledger records, `due#NNN`, one for
//! outbox items, `out#NNN`, and one for re-checks, `chk#NNN`; keys only, so
//! the records and entitlements due are then read in one batch), claims on
//! its items, and the evidence from the `attention` index. The expressions
//! are in `conditions`.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};

use super::conditions as cond;
use super::{
    ATTENTION_INDEX, DUE_INDEX, DynamoLedger, Item, META_SK, Written, attention_shard, attr, due_partition, get_n,
    get_s,
};
use crate::adapters::port_error;
use crate::identity::EventKey;
use crate::ledger::{
    Attention, CheckItem, Due, DueCursor, DueCursors, DueEntry, DueItem, DuePage, DuePartition, DueRecord, GAP,
    PayloadDrop, PortError, Status, WaiterCheck, WaiterItem,
};
use crate::ports::DueLedger;
use crate::projection::STATE_SK;

impl DynamoLedger {
    /// The keys (and `due_at`) of the items of `partition` due at `up_to` or
    /// earlier, oldest first, after `after`; and where the page ended when
    /// more may follow.
    pub(super) async fn due_keys(
        &self,
        partition: &str,
        up_to: i64,
        limit: usize,
        after: Option<&DueCursor>,
    ) -> Result<(Vec<Item>, Option<DueCursor>), PortError> {
        // After an entry: from its place on (its `due_at` bounds the range
        // too); from a time: the entries due at it or later.
        let start = after.filter(|c| !c.is_time()).map(|c| {
            HashMap::from([
                (attr::PK.to_owned(), AttributeValue::S(c.pk.clone())),
                (attr::SK.to_owned(), AttributeValue::S(c.sk.clone())),
                (attr::DUE_SHARD.to_owned(), AttributeValue::S(partition.to_owned())),
                (attr::DUE_AT.to_owned(), AttributeValue::N(c.due_at_ms.to_string())),
            ])
        });
        if after.is_some_and(|c| c.due_at_ms > up_to) {
            return Ok((Vec::new(), None));
        }
        let query = self
            .client()
            .query()
            .table_name(self.table())
            .index_name(DUE_INDEX)
            .expression_attribute_values(":s", AttributeValue::S(partition.to_owned()))
            .expression_attribute_values(":t", AttributeValue::N(up_to.to_string()));
        let query = match after {
            Some(c) => query
                .key_condition_expression("due_shard = :s AND due_at BETWEEN :f AND :t")
                .expression_attribute_values(":f", AttributeValue::N(c.due_at_ms.to_string())),
            None => query.key_condition_expression("due_shard = :s AND due_at <= :t"),
        };
        let out = query
            .limit(limit.clamp(1, 100) as i32)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        let next = out.last_evaluated_key.as_ref().and_then(|k| {
            Some(DueCursor {
                due_at_ms: get_n(k, attr::DUE_AT)?,
                pk: get_s(k, attr::PK)?.to_owned(),
                sk: get_s(k, attr::SK)?.to_owned(),
            })
        });
        Ok((out.items.unwrap_or_default(), next))
    }

    /// The items of `keys` (pk, sk), read consistently in batches of 100, in
    /// no particular order; items gone meanwhile are missing.
    ///
    /// Keys DynamoDB leaves unprocessed (throttling, the response's 16 MB)
    /// are asked for again after a backoff with full jitter
    /// ([`BATCH_READ_BACKOFF_MS`], doubling up to [`BATCH_READ_BACKOFF_MAX_MS`]);
    /// once [`BATCH_READ_BUDGET_MS`] have passed with keys still
    /// unprocessed, the read fails as unavailable (the caller's run goes on
    /// with its other shards and meets them next time), so a throttled table
    /// never holds a run in a loop.
    pub(super) async fn batch_read(&self, keys: Vec<Item>) -> Result<Vec<Item>, PortError> {
        self.batch_read_as(keys, true).await
    }

    /// [`Self::batch_read`], strongly consistent or not.
    pub(super) async fn batch_read_as(&self, keys: Vec<Item>, consistent: bool) -> Result<Vec<Item>, PortError> {
        let clock = &self.ambient.clock;
        let give_up = clock.instant() + std::time::Duration::from_millis(BATCH_READ_BUDGET_MS);
        let mut found = Vec::new();
        for chunk in keys.chunks(100) {
            let mut backoff_ms = BATCH_READ_BACKOFF_MS;
            let mut pending = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(chunk.to_vec()))
                    .consistent_read(consistent)
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
                if let Some(left) = &pending {
                    let wait = std::time::Duration::from_millis((backoff_ms as f64 * self.ambient.jitter()) as u64);
                    if clock.instant() + wait >= give_up {
                        return Err(PortError::Unavailable {
                            service: "dynamodb",
                            message: format!(
                                "{} keys still unprocessed after {BATCH_READ_BUDGET_MS} ms of retries (throttled)",
                                left.keys().len()
                            ),
                        });
                    }
                    clock.sleep(wait).await;
                    backoff_ms = (backoff_ms * 2).min(BATCH_READ_BACKOFF_MAX_MS);
                }
            }
        }
        Ok(found)
    }
}

/// The first backoff before unprocessed keys are asked for again (full jitter: a wait in `[0, this]`).
pub const BATCH_READ_BACKOFF_MS: u64 = 50;
/// The backoff's ceiling.
pub const BATCH_READ_BACKOFF_MAX_MS: u64 = 1_000;
/// How long one read may spend retrying unprocessed keys, at most.
pub const BATCH_READ_BUDGET_MS: u64 = 3_000;

/// A due record or entitlement read by key, its next look at `at` (`None`:
/// neither, or malformed).
pub(crate) fn due_of(i: &Item, at: i64) -> Option<Due> {
    let field = |k: &str| get_s(i, k).unwrap_or_default().to_owned();
    let pk = get_s(i, attr::PK)?;
    match get_s(i, attr::SK)? {
        META_SK => {
            let received_at_ms = get_n(i, attr::RECEIVED_AT).unwrap_or(at);
            let reopened = [cond::LAST_REPLAY_AT, cond::WOKEN_AT].into_iter().filter_map(|k| get_n(i, k)).max();
            Some(Due::Record(DueRecord {
                key: EventKey::from_stored(pk)?,
                status: get_s(i, attr::STATUS).and_then(Status::parse)?,
                tenant: field(attr::TENANT),
                // Noted by a re-drive, or its sender's lease never given back.
                enqueued: i.contains_key(attr::ENQUEUED_AT) || i.contains_key(attr::SEND_LEASE_UNTIL),
                due_at_ms: at,
                received_at_ms,
                open_since_ms: reopened.map_or(received_at_ms, |r| r.max(received_at_ms)),
                lease_expires_at_ms: get_n(i, "lease_expires_at"),
                redrives: get_n(i, "redrives").and_then(|r| u32::try_from(r).ok()).unwrap_or(0),
                drop: drop_of(i),
            }))
        }
        sk if sk.starts_with("wait#") => Some(Due::Waiter(WaiterItem {
            stream: pk.to_owned(),
            sk: sk.to_owned(),
            seq: crate::projection::sequence::waiter_seq(sk)?,
            key: get_s(i, "event_key").and_then(EventKey::from_stored)?,
            due_at_ms: at,
            parked_at_ms: get_n(i, crate::projection::sequence::PARKED_AT).unwrap_or(at),
        })),
        STATE_SK => {
            Some(Due::Check(CheckItem { pk: pk.to_owned(), due_at_ms: at, state: super::item::item_from_sdk(i) }))
        }
        _ => None,
    }
}

/// The payload a record of the `drop_after` policy still holds once
/// PROCESSED (`None`: another policy, not finished, or dropped already).
fn drop_of(i: &Item) -> Option<PayloadDrop> {
    let finished = get_s(i, attr::STATUS) == Some(Status::Processed.as_str());
    let dropping = get_s(i, attr::PAYLOAD_POLICY) == Some("drop_after");
    if !finished || !dropping || i.contains_key(attr::PAYLOAD_DROPPED_AT) {
        return None;
    }
    Some(PayloadDrop {
        hash: get_s(i, attr::PAYLOAD_HASH)?.to_owned(),
        inline: i.contains_key(attr::BODY),
        processed_at_ms: get_n(i, "processed_at").unwrap_or(0),
    })
}

/// The keys (`pk`, `sk`) of a due item.
pub(crate) fn keys_of(due: &Due) -> (&str, &str) {
    match due {
        Due::Record(r) => (r.key.as_str(), META_SK),
        Due::Outbox { id, .. } => (id.as_str(), super::outbox::OUTBOX_SK),
        Due::Check(c) => (c.pk.as_str(), crate::projection::STATE_SK),
        Due::Waiter(w) => (w.stream.as_str(), w.sk.as_str()),
    }
}

/// A page of the items read (sorted here, oldest first) and the entries
/// listed, each with the item read at it.
pub(crate) fn page_of(mut items: Vec<Due>, next: Option<DueCursor>, places: Vec<DueCursor>) -> DuePage {
    items.sort_by_key(Due::due_at_ms);
    let at: HashMap<(&str, &str), usize> = items.iter().enumerate().map(|(i, d)| (keys_of(d), i)).collect();
    let entries = places
        .iter()
        .map(|p| DueEntry { place: p.clone(), item: at.get(&(p.pk.as_str(), p.sk.as_str())).copied() })
        .collect();
    DuePage { items, next, entries }
}

/// Whether a refused `claim_due` met our own claim (our retried update).
pub(crate) fn claimed_by(met: Option<&Item>, token: &str) -> bool {
    met.is_some_and(|m| get_s(m, cond::CLAIM_TOKEN) == Some(token))
}

pub(crate) fn item_of(item: DueItem<'_>) -> (&str, &str) {
    match item {
        DueItem::Record(key) => (key.as_str(), META_SK),
        DueItem::Check(pk) => (pk, STATE_SK),
        DueItem::Waiter { stream, sk } => (stream, sk),
    }
}

/// Whether a record (as stored) still waits on a sequence gap: RETRYABLE
/// `gap`, or PARKED `gap` (what `wake` may move).
pub(crate) fn waits_on_gap(record: Option<&Item>) -> bool {
    let Some(r) = record else { return false };
    match get_s(r, attr::STATUS) {
        Some("RETRYABLE") => get_s(r, "error_code") == Some(GAP),
        Some("PARKED") => get_s(r, "park_reason") == Some(GAP),
        _ => false,
    }
}

/// Whether a record was woken at `now_ms` (`wake` writes `woken_at`): the
/// look's own retry after a lost acknowledgement meets its own wake-up.
pub(crate) fn woken_at(record: Option<&Item>, now_ms: i64) -> bool {
    record.and_then(|r| get_n(r, cond::WOKEN_AT)) == Some(now_ms)
}

/// Whether a refused `dead_refused` met its own earlier write (our retry
/// after a lost acknowledgement): DEAD `caller_error` with this message.
pub(crate) fn dead_refused_by(met: Option<&Item>, message: &str) -> bool {
    met.is_some_and(|m| {
        get_s(m, attr::STATUS) == Some("DEAD")
            && get_s(m, "dead_reason") == Some("caller_error")
            && get_s(m, "error_message") == Some(cond::bounded(message).as_str())
    })
}

/// Whether the stream (its state item, as stored) has reached `seq - 1`.
pub(crate) fn predecessor_committed(state: Option<&Item>, seq: i64) -> bool {
    state.and_then(|s| get_n(s, "last_seq")).unwrap_or(0) >= seq - 1
}

impl DueLedger for DynamoLedger {
    fn shards(&self) -> u32 {
        DynamoLedger::shards(self)
    }

    async fn drop_payload(&self, key: &EventKey, drop: &PayloadDrop, now_ms: i64) -> Result<bool, PortError> {
        if !drop.inline {
            // Beside the record: its item, or its object (a payload over an
            // item's size, or one a route handed by reference). Both
            // deletions are no-ops when repeated.
            let item = Self::key(key, &super::schema::payload_sk(&drop.hash));
            let deleted = self.client().delete_item().table_name(self.table()).set_key(Some(item)).send().await;
            deleted.map_err(|e| port_error("dynamodb", &e))?;
            if let Some(s3) = &self.payloads {
                s3.delete(key, &drop.hash).await?;
            }
        }
        Ok(match self.conditional(key.as_str(), META_SK, cond::drop_payload(now_ms), false).await? {
            Written::Applied(_) => true,
            Written::Refused(met) => cond::dropped(met.as_ref()),
        })
    }

    async fn deliveries_settled(&self, ids: &[String]) -> Result<bool, PortError> {
        if ids.is_empty() {
            return Ok(true);
        }
        let keys = ids.iter().map(|id| Self::item_key(id, super::outbox::OUTBOX_SK)).collect();
        let items = self.batch_read(keys).await?;
        Ok(items.iter().all(|i| get_s(i, attr::STATUS) == Some(cond::outbox_status::SENT)))
    }

    async fn active_since(&self, since_ms: i64) -> Result<bool, PortError> {
        self.marked_since(since_ms).await
    }

    async fn last_sweep(&self) -> Result<Option<crate::ledger::Sweep>, PortError> {
        self.read_sweep().await
    }

    async fn record_sweep(&self, sweep: &crate::ledger::Sweep) -> Result<(), PortError> {
        self.write_sweep(sweep).await
    }

    async fn due_cursors(&self) -> Result<DueCursors, PortError> {
        self.read_cursors().await
    }

    async fn keep_due_cursors(&self, cursors: &DueCursors) -> Result<(), PortError> {
        self.write_cursors(cursors).await
    }

    async fn due(
        &self,
        partition: DuePartition,
        shard: u32,
        up_to: i64,
        limit: usize,
        after: Option<&DueCursor>,
    ) -> Result<DuePage, PortError> {
        let (keys, next) = self.due_keys(&due_partition(partition, shard), up_to, limit, after).await?;
        // Outbox items are claimed by id (the claim returns them); records
        // and entitlements are read in one batch.
        let mut out = Vec::new();
        let mut seen: HashMap<(String, String), i64> = HashMap::new();
        let mut to_read = Vec::new();
        let mut entries = Vec::with_capacity(keys.len());
        for k in &keys {
            let (Some(pk), Some(sk), Some(at)) = (get_s(k, attr::PK), get_s(k, attr::SK), get_n(k, attr::DUE_AT))
            else {
                continue;
            };
            entries.push(DueCursor { due_at_ms: at, pk: pk.to_owned(), sk: sk.to_owned() });
            if sk == super::outbox::OUTBOX_SK {
                out.push(Due::Outbox { id: pk.to_owned(), due_at_ms: at });
                continue;
            }
            seen.insert((pk.to_owned(), sk.to_owned()), at);
            to_read.push(HashMap::from([
                (attr::PK.to_owned(), AttributeValue::S(pk.to_owned())),
                (attr::SK.to_owned(), AttributeValue::S(sk.to_owned())),
            ]));
        }
        // The records partition holds finished records too (a completion
        // leaves its entry): read as of a moment ago, half the price. A
        // record read before its latest change only makes the run act on it
        // needlessly (its claim and re-drive meet the record as it is); the
        // cursor passes only entries due long before (`CURSOR_SETTLE_MS`),
        // and a finished record reopens only at a new place.
        let consistent = partition != DuePartition::Records;
        for i in self.batch_read_as(to_read, consistent).await? {
            let (Some(pk), Some(sk)) = (get_s(&i, attr::PK), get_s(&i, attr::SK)) else { continue };
            let Some(&at) = seen.get(&(pk.to_owned(), sk.to_owned())) else { continue };
            out.extend(due_of(&i, at));
        }
        Ok(page_of(out, next, entries))
    }

    async fn claim_due(&self, item: DueItem<'_>, seen: i64, next: i64) -> Result<Option<String>, PortError> {
        let token = self.ambient.token();
        let (pk, sk) = item_of(item);
        match self.conditional(pk, sk, cond::claim_due(seen, next, &token), false).await? {
            Written::Applied(_) => Ok(Some(token)),
            Written::Refused(met) if claimed_by(met.as_ref(), &token) => {
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

    async fn dead_refused(&self, key: &EventKey, message: &str, now_ms: i64) -> Result<bool, PortError> {
        let update = cond::dead_refused(message, now_ms, key.shard(self.shards()));
        match self.conditional(key.as_str(), META_SK, update, false).await? {
            Written::Applied(_) => Ok(true),
            Written::Refused(met) => Ok(dead_refused_by(met.as_ref(), message)),
        }
    }

    async fn look_at_waiter(&self, w: &WaiterItem, now_ms: i64) -> Result<WaiterCheck, PortError> {
        let record = self.read_item(w.key.as_str(), META_SK).await?;
        let tenant = || record.as_ref().and_then(|r| get_s(r, attr::TENANT)).unwrap_or_default().to_owned();
        let check = if woken_at(record.as_ref(), now_ms) {
            // Our own wake-up, whose acknowledgement was lost.
            WaiterCheck::Woken { tenant: tenant() }
        } else if !waits_on_gap(record.as_ref()) {
            WaiterCheck::Gone
        } else if !predecessor_committed(self.read_item(&w.stream, STATE_SK).await?.as_ref(), w.seq) {
            return Ok(WaiterCheck::Waiting);
        } else {
            let wake = cond::wake(GAP, now_ms, w.key.shard(self.shards()));
            if self.conditional_ok(w.key.as_str(), META_SK, wake).await? {
                WaiterCheck::Woken { tenant: tenant() }
            } else {
                WaiterCheck::Gone
            }
        };
        self.conditional_ok(&w.stream, &w.sk, cond::waiter_settled()).await?;
        Ok(check)
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
