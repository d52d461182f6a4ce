//! The ledger ports on the memory table, each method its DynamoDB
//! adapter's writes (`adapters::dynamodb::{claim, work, due, operator,
//! backfill, outbox}`) with the same expressions and the same reading of
//! what a refused write met.

use aws_sdk_dynamodb::types::AttributeValue;

use super::table::{Refusal, TransactError, Write};
use super::{MemLedger, MemOutbox, State, World};
use crate::adapters::dynamodb::activity;
use crate::adapters::dynamodb::backfill::{
    PARKED_ATTRIBUTES_BYTES, PROGRESS_SK, SCHEDULE_SK, parked_item, progress_from, progress_item, progress_pk,
    redelivery_item, release_refused, schedule_from, schedule_item,
};
use crate::adapters::dynamodb::claim::{PAYLOAD_IN, adopted_already, bound_to, claim_met, send_lease_ours};
use crate::adapters::dynamodb::conditions::{self as cond, Placed, Update};
use crate::adapters::dynamodb::due::{
    claimed_by, dead_refused_by, due_of, item_of, predecessor_committed, waits_on_gap, woken_at,
};
use crate::adapters::dynamodb::item::{item_from_sdk, item_to_sdk};
use crate::adapters::dynamodb::operator::{item_json, passes, row, transition_refused, transitioned};
use crate::adapters::dynamodb::outbox::{
    OUTBOX_SK, claim_refused, claimed, dead_partition, held_by, outbox_partition, short, text, wait_partition,
};
use crate::adapters::dynamodb::schema::{BINDING_SK, binding_pk};
use crate::adapters::dynamodb::work::{
    commit_cancelled, commit_items, history_item, left_by, op_cancelled, op_items, ours, put_then_notify, single,
    work_record,
};
use crate::adapters::dynamodb::{
    ATTENTION_INDEX, DUE_INDEX, Item, META_SK, attention_shard, attr, due_partition, due_shard, existing_from_item,
    new_record_item, payload, payload_item, payload_sk,
};
use crate::identity::EventKey;
use crate::ledger::{
    Applied, Attention, BodyBinding, Bound, Claim, CommitResult, Due, DueCursor, DueCursors, DueItem, DuePage,
    DuePartition, ExistingRecord, Exit, GAP, LeaseResult, NewEvent, OperatorAction, PortError, Release, Row, SendLease,
    Status, Sweep, Transitioned, WaiterCheck, WaiterItem, WorkRecord,
};
use crate::message::{Held, OutboxClaim};
use crate::ports::{
    Activity, BackfillLedger, BackfillProgress, DueLedger, Ledger, OperatorLedger, OutboxStore, RowFilter,
    ScheduleState, Shown, UnfetchedEvent, WorkLedger,
};
use crate::projection::sequence::{Position, waiter_sk};
use crate::projection::{Op, ProjectionError, STATE_SK, StateFuture, StateStore};

fn invalid(message: String) -> PortError {
    PortError::Unavailable { service: "dynamodb", message: format!("ValidationException: {message}") }
}

fn get_s<'a>(item: &'a Item, k: &str) -> Option<&'a str> {
    item.get(k).and_then(|v| v.as_s().ok()).map(String::as_str)
}

fn get_n(item: &Item, k: &str) -> Option<i64> {
    item.get(k).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok())
}

/// A written update: `Ok(new item)`, or what the refused write met.
enum Written {
    Applied(Item),
    Refused(Option<Item>),
}

/// The tenant a stored record names.
fn tenant_of(record: Option<&Item>) -> String {
    record
        .and_then(|r| r.get(crate::adapters::dynamodb::attr::TENANT))
        .and_then(|v| v.as_s().ok())
        .cloned()
        .unwrap_or_default()
}

impl State {
    /// One conditions.rs update, as `UpdateItem` with `ALL_OLD` on failure.
    fn conditional(&mut self, pk: &str, sk: &str, u: &Update) -> Result<Written, PortError> {
        self.exercised.insert(u.name());
        match self.table.write(&Write::update(pk, sk, u)) {
            Ok(new) => Ok(Written::Applied(new.unwrap_or_default())),
            Err(Refusal::Condition(met)) => Ok(Written::Refused(met)),
            Err(Refusal::Invalid(e)) => Err(invalid(e)),
            Err(Refusal::Conflict) => unreachable!("single writes are never in contention"),
        }
    }

    /// An update whose refusal is an error (the adapter's `update_meta`).
    fn update_or_fail(&mut self, key: &EventKey, u: &Update) -> Result<(), PortError> {
        match self.conditional(key.as_str(), META_SK, u)? {
            Written::Applied(_) => Ok(()),
            Written::Refused(_) => Err(PortError::Unavailable {
                service: "dynamodb",
                message: "ConditionalCheckFailedException: the conditional request failed".into(),
            }),
        }
    }

    fn put(&mut self, item: Item) -> Result<(), PortError> {
        self.table.write(&Write::put(item, None)).map(|_| ()).map_err(|e| invalid(format!("{e:?}")))
    }

    fn put_claim(&mut self, event: &NewEvent, record: Item) -> Result<Claim, PortError> {
        self.exercised.insert("claim");
        match self.table.write(&Write::put(record, Some(cond::CLAIM))) {
            Ok(_) => Ok(Claim::New),
            Err(Refusal::Condition(Some(met))) => claim_met(event, &met),
            Err(Refusal::Condition(None)) => unreachable!("a put that met no item passes attribute_not_exists"),
            Err(Refusal::Invalid(e)) => Err(invalid(e)),
            Err(Refusal::Conflict) => unreachable!("single writes are never in contention"),
        }
    }

    fn bucket_put(&mut self, key: &EventKey, hash: &str, body: &[u8], size: usize) -> Result<(), PortError> {
        match &mut self.bucket {
            Some(b) => {
                b.insert(format!("{}/{hash}", key.as_str()), body.to_vec());
                Ok(())
            }
            None => Err(PortError::TooLarge { size, limit: payload::ITEM_PAYLOAD_BYTES }),
        }
    }
}

impl World {
    pub(super) fn read(&self, pk: &str, sk: &str) -> Option<Item> {
        self.state().table.get(pk, sk).cloned()
    }

    pub(super) fn now(&self) -> i64 {
        self.ambient.clock.now_ms()
    }
}

impl MemLedger {
    /// The record's item, as DynamoDB stores it.
    pub fn item(&self, key: &EventKey) -> Option<Item> {
        self.0.read(key.as_str(), META_SK)
    }

    /// The record, typed as the processor reads it.
    pub fn record(&self, key: &EventKey) -> Option<WorkRecord> {
        self.item(key).as_ref().and_then(work_record)
    }

    /// One attribute of the record, as text (numbers as their digits).
    pub fn field(&self, key: &EventKey, name: &str) -> Option<String> {
        let item = self.item(key)?;
        match item.get(name)? {
            AttributeValue::S(s) | AttributeValue::N(s) => Some(s.clone()),
            AttributeValue::Bool(b) => Some(b.to_string()),
            other => Some(format!("{other:?}")),
        }
    }

    /// The record's history entries, oldest first: `(kind, detail)`.
    pub fn history(&self, key: &EventKey) -> Vec<(String, String)> {
        let st = self.0.state();
        st.table
            .partition(key.as_str())
            .into_iter()
            .filter(|i| get_s(i, attr::SK).is_some_and(|sk| sk.starts_with("hist#")))
            .map(|i| {
                (get_s(i, "kind").unwrap_or_default().to_owned(), get_s(i, "detail").unwrap_or_default().to_owned())
            })
            .collect()
    }

    /// Creates a record in the state a test needs: the claim's item for
    /// `event`, then `edit` on it (no condition, no fault).
    pub fn arrange(&self, event: &NewEvent, body: &[u8], edit: impl FnOnce(&mut Item)) {
        let mut item = new_record_item(event);
        payload::put(&mut item, payload::encode(body));
        edit(&mut item);
        self.0.state().table.insert(item);
    }
}

impl MemLedger {
    /// A record as the intake writes it (an empty payload), moved to
    /// `status` with the index attributes conditions.rs's bookkeeping leaves
    /// for it, received at `received_at`; then `extra` (a JSON object:
    /// strings, integers and booleans set, `null` removes).
    pub fn add(&self, key: &EventKey, status: Status, received_at: i64, extra: serde_json::Value) {
        let mut parts = key.as_str().splitn(4, '#').skip(1);
        let (provider, endpoint, event_id) =
            (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        let shard = key.shard(self.0.shards);
        let event = NewEvent {
            key: key.clone(),
            provider: provider.into(),
            endpoint: endpoint.into(),
            tenant: endpoint.into(),
            event_id: event_id.into(),
            event_type: Some("invoice.paid".into()),
            payload_hash: crate::identity::payload_hash(b""),
            content_hash: crate::identity::payload_hash(b""),
            received_at_ms: received_at,
            expires_at: received_at / 1000 + 86_400 * 30,
            shard,
            send: SendLease { token: format!("send-{event_id}"), until_ms: received_at + 10_000 },
            via: crate::ledger::Via::Webhook,
            batch_hash: None,
            kept: None,
            notification: None,
        };
        let mut item = new_record_item(&event);
        let n = |v: i64| AttributeValue::N(v.to_string());
        item.insert(attr::STATUS.into(), AttributeValue::S(status.as_str().into()));
        if status != Status::Received {
            item.insert(attr::ENQUEUED_AT.into(), n(received_at));
            item.remove(attr::SEND_LEASE_UNTIL);
        }
        match status {
            Status::Received => {}
            Status::Processing => {
                item.insert("lease_owner".into(), AttributeValue::S("another-worker".into()));
                item.insert("lease_expires_at".into(), n(received_at + 30_000));
            }
            Status::Retryable => {
                item.insert(attr::DUE_AT.into(), n(received_at));
                item.insert("next_attempt_at".into(), n(received_at));
            }
            Status::Dead | Status::Parked => {
                item.remove(attr::DUE_SHARD);
                item.remove(attr::DUE_AT);
                item.insert(attr::ATTN_SHARD.into(), AttributeValue::S(attention_shard(shard)));
                item.insert(attr::ATTN_AT.into(), n(received_at));
            }
            // Its completion left its due entry where its claim put it.
            Status::Processed => {
                item.insert("outcome".into(), AttributeValue::S("applied".into()));
            }
        }
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            match v {
                serde_json::Value::Null => {
                    item.remove(&k);
                }
                serde_json::Value::String(s) => {
                    item.insert(k, AttributeValue::S(s));
                }
                serde_json::Value::Bool(b) => {
                    item.insert(k, AttributeValue::Bool(b));
                }
                serde_json::Value::Number(x) => {
                    item.insert(k, AttributeValue::N(x.to_string()));
                }
                other => panic!("{k}: {other} is not an attribute add() writes"),
            }
        }
        self.0.state().table.insert(item);
    }

    /// Changes the record's item as it is (another actor's write, arranged).
    pub fn edit(&self, key: &EventKey, f: impl FnOnce(&mut Item)) {
        let mut st = self.0.state();
        let mut item = st.table.get(key.as_str(), META_SK).cloned().unwrap_or_else(|| panic!("{key}: no record"));
        f(&mut item);
        st.table.insert(item);
    }

    /// Every record's key, in key order.
    pub fn keys(&self) -> Vec<EventKey> {
        let st = self.0.state();
        st.table
            .items()
            .filter(|i| get_s(i, attr::SK) == Some(META_SK))
            .filter_map(|i| get_s(i, attr::PK).and_then(EventKey::from_stored))
            .collect()
    }

    /// Stores a record as the processor reads it, with `body` as its payload
    /// item and the index attributes its status has.
    pub fn insert_record(&self, r: &WorkRecord, body: &[u8]) {
        self.0.state().table.insert(payload_item(&r.key, &r.payload_hash, body, 0));
        self.insert_record_only(r);
    }

    /// [`MemLedger::insert_record`] without a payload item (its payload never stored).
    pub fn insert_record_only(&self, r: &WorkRecord) {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let n = |v: i64| AttributeValue::N(v.to_string());
        let shard = r.key.shard(self.0.shards);
        let mut item = Item::from([
            (attr::PK.into(), s(r.key.as_str())),
            (attr::SK.into(), s(META_SK)),
            (attr::STATUS.into(), s(r.status.as_str())),
            (attr::PROVIDER.into(), s(&r.provider)),
            (attr::ENDPOINT.into(), s(&r.endpoint)),
            (attr::TENANT.into(), s(&r.tenant)),
            (attr::EVENT_ID.into(), s(&r.event_id)),
            (attr::PAYLOAD_HASH.into(), s(&r.payload_hash)),
            (attr::PAYLOAD_STORED.into(), AttributeValue::Bool(true)),
            (attr::ATTEMPTS.into(), n(i64::from(r.attempts))),
            (cond::FAILURES.into(), n(i64::from(r.failures))),
            (attr::RECEIVED_AT.into(), n(r.received_at_ms)),
        ]);
        let text = [
            (attr::EVENT_TYPE, &r.event_type),
            ("lease_owner", &r.lease_owner),
            ("completed_token", &r.completed_token),
            (cond::TRANSITION_TOKEN, &r.transition_token),
        ];
        for (k, v) in text {
            if let Some(v) = v {
                item.insert(k.into(), s(v));
            }
        }
        let numbers = [
            (cond::WINDOW_START, r.window_start_ms),
            ("lease_expires_at", r.lease_expires_at_ms),
            ("next_attempt_at", r.next_attempt_at_ms),
        ];
        for (k, v) in numbers {
            if let Some(v) = v {
                item.insert(k.into(), n(v));
            }
        }
        if !r.status.is_terminal() {
            let due = r.next_attempt_at_ms.unwrap_or(r.received_at_ms + crate::policy::REDRIVE_GRACE_MS);
            item.insert(attr::DUE_SHARD.into(), s(&due_shard(shard)));
            item.insert(attr::DUE_AT.into(), n(due));
        } else if matches!(r.status, Status::Dead | Status::Parked) {
            item.insert(attr::ATTN_SHARD.into(), s(&attention_shard(shard)));
            item.insert(attr::ATTN_AT.into(), n(r.received_at_ms));
        }
        if let Some(p) = &r.payload {
            payload::put(&mut item, payload::encode(p));
        }
        self.0.state().table.insert(item);
    }

    /// The record as the operator sees it (`show`'s row).
    pub fn row(&self, key: &EventKey) -> Option<Row> {
        self.item(key).map(|i| row(&i))
    }

    /// The record's history entries as rows, oldest first.
    pub fn history_rows(&self, key: &EventKey) -> Vec<Row> {
        let st = self.0.state();
        st.table
            .partition(key.as_str())
            .into_iter()
            .filter(|i| get_s(i, attr::SK).is_some_and(|sk| sk.starts_with("hist#")))
            .map(item_json)
            .collect()
    }

    /// Whether any record has a history entry.
    pub fn no_history(&self) -> bool {
        self.0.state().table.items().all(|i| !get_s(i, attr::SK).is_some_and(|sk| sk.starts_with("hist#")))
    }

    /// Writes the payload item of `key` (its own item, as the claim writes a
    /// large one) and makes it the record's payload.
    pub fn put_payload(&self, key: &EventKey, body: &[u8]) {
        let hash = crate::identity::payload_hash(body);
        let mut st = self.0.state();
        st.table.insert(payload_item(key, &hash, body, 0));
        let mut item = st.table.get(key.as_str(), META_SK).cloned().unwrap_or_default();
        item.insert(attr::PAYLOAD_HASH.into(), AttributeValue::S(hash));
        item.remove(attr::BODY);
        st.table.insert(item);
    }
}

/// Sets `name` to a string or number on an item (for [`MemLedger::arrange`]).
pub fn set(item: &mut Item, name: &str, value: impl Into<Value>) {
    match value.into() {
        Value::S(s) => item.insert(name.to_owned(), AttributeValue::S(s)),
        Value::N(n) => item.insert(name.to_owned(), AttributeValue::N(n.to_string())),
        Value::Bool(b) => item.insert(name.to_owned(), AttributeValue::Bool(b)),
        Value::Gone => item.remove(name),
    };
}

/// A value for [`set`].
pub enum Value {
    S(String),
    N(i64),
    Bool(bool),
    Gone,
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::S(s.to_owned())
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::N(n)
    }
}

impl From<Option<i64>> for Value {
    fn from(n: Option<i64>) -> Self {
        n.map_or(Value::Gone, Value::N)
    }
}

// ------------------------------------------------------------------ intake

impl Ledger for MemLedger {
    async fn claim(&self, event: &NewEvent, body: &[u8]) -> Result<Claim, PortError> {
        self.0.call_on("ledger.claim", event.key.as_str(), |_, st| claim(st, event, body))
    }

    async fn store_payload(&self, key: &EventKey, hash: &str, body: &[u8], expires_at: i64) -> Result<(), PortError> {
        self.0.call_on("ledger.store_payload", key.as_str(), |_, st| {
            st.put(payload_item(key, hash, body, expires_at))?;
            st.update_or_fail(key, &cond::payload_stored(hash))
        })
    }

    async fn adopt_payload(
        &self,
        key: &EventKey,
        old_hash: &str,
        new_hash: &str,
        body: &[u8],
        expires_at: i64,
        conflict: bool,
    ) -> Result<bool, PortError> {
        self.0.call_on("ledger.adopt_payload", key.as_str(), |_, st| {
            st.put(payload_item(key, new_hash, body, expires_at))?;
            Ok(match st.conditional(key.as_str(), META_SK, &cond::adopt_payload(old_hash, new_hash, conflict))? {
                Written::Applied(_) => true,
                Written::Refused(met) => adopted_already(met.as_ref(), new_hash),
            })
        })
    }

    async fn take_send_lease(&self, key: &EventKey, lease: &SendLease, now_ms: i64) -> Result<bool, PortError> {
        self.0.call_on("ledger.take_send_lease", key.as_str(), |_, st| {
            Ok(match st.conditional(key.as_str(), META_SK, &cond::take_send_lease(lease, now_ms))? {
                Written::Applied(_) => true,
                Written::Refused(met) => send_lease_ours(met.as_ref(), lease),
            })
        })
    }

    async fn release_send_lease(&self, key: &EventKey, lease: &SendLease) -> Result<(), PortError> {
        self.0.call_on("ledger.release_send_lease", key.as_str(), |_, st| {
            st.conditional(key.as_str(), META_SK, &cond::release_send_lease(lease)).map(|_| ())
        })
    }

    async fn mark_enqueued(&self, key: &EventKey, at_ms: i64) -> Result<(), PortError> {
        self.0
            .call_on("ledger.mark_enqueued", key.as_str(), |_, st| st.update_or_fail(key, &cond::mark_enqueued(at_ms)))
    }

    async fn note_duplicate(&self, key: &EventKey) -> Result<(), PortError> {
        self.0.call_on("ledger.note_duplicate", key.as_str(), |_, st| st.update_or_fail(key, &cond::note_duplicate()))
    }

    async fn flag_conflict(&self, key: &EventKey, other_hash: &str, at_ms: i64) -> Result<(), PortError> {
        self.0.call_on("ledger.flag_conflict", key.as_str(), |_, st| {
            st.update_or_fail(key, &cond::flag_conflict(other_hash, at_ms))
        })
    }

    async fn existing(&self, key: &EventKey) -> Result<Option<ExistingRecord>, PortError> {
        self.0.call_on("ledger.existing", key.as_str(), |_, st| {
            st.table.get(key.as_str(), META_SK).map(existing_from_item).transpose()
        })
    }

    async fn advance_generation(&self, first: &EventKey, n: u32, expires_at: i64) -> Result<(), PortError> {
        self.0.call_on("ledger.advance_generation", first.as_str(), |_, st| {
            st.conditional(first.as_str(), META_SK, &cond::advance_generation(n, expires_at)).map(|_| ())
        })
    }

    async fn bind_body(&self, binding: &BodyBinding<'_>) -> Result<Bound, PortError> {
        let pk = binding_pk(binding.provider, binding.endpoint, binding.payload_hash);
        self.0.call_on("ledger.bind_body", binding.key.as_str(), |_, st| {
            let update = cond::bind_body(binding.key.as_str(), binding.at_ms, binding.expires_at);
            match st.conditional(&pk, BINDING_SK, &update)? {
                Written::Applied(_) => Ok(Bound::Ours),
                Written::Refused(met) => bound_to(met.as_ref(), binding.key),
            }
        })
    }

    async fn take_binding(&self, binding: &BodyBinding<'_>, from: &EventKey) -> Result<bool, PortError> {
        let pk = binding_pk(binding.provider, binding.endpoint, binding.payload_hash);
        self.0.call_on("ledger.take_binding", binding.key.as_str(), |_, st| {
            let update = cond::take_binding(from.as_str(), binding.key.as_str(), binding.at_ms, binding.expires_at);
            Ok(match st.conditional(&pk, BINDING_SK, &update)? {
                Written::Applied(_) => true,
                Written::Refused(met) => matches!(bound_to(met.as_ref(), binding.key)?, Bound::Ours),
            })
        })
    }

    async fn flag_replay(&self, key: &EventKey, other_id: &str, at_ms: i64) -> Result<(), PortError> {
        self.0.call_on("ledger.flag_replay", key.as_str(), |_, st| {
            st.update_or_fail(key, &cond::flag_replay(other_id, at_ms))
        })
    }

    async fn release_parked(&self, event: &NewEvent, body: &[u8], by: &str) -> Result<Release, PortError> {
        self.0.call_on("ledger.release_parked", event.key.as_str(), |_, st| release(st, event, body, by))
    }
}

/// The claim, placed as the DynamoDB adapter places it: in the record, or
/// beside it (its own item, or the bucket) after reading the record (a
/// duplicate writes nothing) and before the record.
fn claim(st: &mut State, event: &NewEvent, body: &[u8]) -> Result<Claim, PortError> {
    let mut record = new_record_item(event);
    let stored = payload::encode(body);
    if payload::inline(payload::item_size(&record), stored.bytes.len()) {
        payload::put(&mut record, stored);
        return st.put_claim(event, record);
    }
    let too_large = stored.bytes.len() > payload::ITEM_PAYLOAD_BYTES;
    if too_large && st.bucket.is_none() {
        return Err(PortError::TooLarge { size: stored.bytes.len(), limit: payload::ITEM_PAYLOAD_BYTES });
    }
    if let Some(met) = st.table.get(event.key.as_str(), META_SK) {
        return claim_met(event, &met.clone());
    }
    if too_large {
        st.bucket_put(&event.key, &event.payload_hash, body, stored.bytes.len())?;
        record.insert(PAYLOAD_IN.into(), AttributeValue::S("s3".into()));
    } else {
        st.put(payload_item(&event.key, &event.payload_hash, body, event.expires_at))?;
    }
    st.put_claim(event, record)
}

fn release(st: &mut State, event: &NewEvent, body: &[u8], by: &str) -> Result<Release, PortError> {
    let stored = payload::encode(body);
    let record = payload::item_size(&new_record_item(event)) + PARKED_ATTRIBUTES_BYTES;
    let placed = if payload::inline(record, stored.bytes.len()) {
        Placed::Inline(stored)
    } else if stored.bytes.len() <= payload::ITEM_PAYLOAD_BYTES {
        st.put(payload_item(&event.key, &event.payload_hash, body, event.expires_at))?;
        Placed::Item
    } else {
        st.bucket_put(&event.key, &event.payload_hash, body, stored.bytes.len())?;
        Placed::S3
    };
    Ok(match st.conditional(event.key.as_str(), META_SK, &cond::release_parked(event, by, placed))? {
        Written::Applied(new) => crate::adapters::dynamodb::backfill::released(&new),
        Written::Refused(met) => release_refused(met.as_ref(), event),
    })
}

// --------------------------------------------------------------- processor

/// As the DynamoDB ledger: the record's own payload, else its payload item.
impl crate::ports::EventPayloads for MemLedger {
    fn event_payload<'a>(
        &'a self,
        event_key: &'a EventKey,
        payload_hash: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<crate::ports::EventPayload, PortError>> + Send + 'a>>
    {
        use crate::ports::EventPayload;
        Box::pin(async move {
            let Some(record) = self.record(event_key) else { return Ok(EventPayload::Gone) };
            if let Some(inline) = record.payload {
                return Ok(EventPayload::Bytes(inline));
            }
            Ok(match WorkLedger::payload(self, event_key, payload_hash).await? {
                Some(body) => EventPayload::Bytes(body),
                None => EventPayload::TooLarge,
            })
        })
    }

    fn payload_ref<'a>(
        &'a self,
        event_key: &'a EventKey,
        payload_hash: &'a str,
        bytes: Option<&'a [u8]>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Option<crate::ports::PayloadRef>, PortError>> + Send + 'a>,
    > {
        let r = self.0.call_on("payload.ref", event_key.as_str(), |_, st| {
            let Some(bucket) = &mut st.bucket else { return Ok(None) };
            if let Some(b) = bytes {
                bucket.insert(format!("{}/{payload_hash}", event_key.as_str()), b.to_vec());
            }
            Ok(Some(crate::ports::PayloadRef {
                bucket: "memory".into(),
                key: crate::adapters::s3::S3Payloads::object_key(event_key, payload_hash),
                sha256: payload_hash.to_owned(),
            }))
        });
        Box::pin(async move { r })
    }
}

impl WorkLedger for MemLedger {
    async fn keep_for_sweep(&self, id: &str, shard: u32, at_ms: i64) -> Result<(), PortError> {
        let update = cond::outbox_index(&crate::adapters::dynamodb::outbox::outbox_partition(shard), at_ms);
        self.0.call_on("work.keep_for_sweep", id, |_, st| st.conditional(id, OUTBOX_SK, &update).map(|_| ()))
    }

    fn shards(&self) -> u32 {
        self.0.shards
    }

    async fn lease(&self, key: &EventKey, token: &str, now_ms: i64, lease_ms: i64) -> Result<LeaseResult, PortError> {
        let shard = key.shard(self.0.shards);
        self.0.call_on("work.lease", key.as_str(), |_, st| {
            match st.conditional(key.as_str(), META_SK, &cond::lease(token, now_ms, lease_ms, shard))? {
                Written::Applied(new) => work_record(&new)
                    .map(|r| LeaseResult::Leased(Box::new(r)))
                    .ok_or_else(|| invalid("leased record is malformed".into())),
                Written::Refused(met) => {
                    Ok(WorkRecord::lease_refused(met.as_ref().and_then(work_record), token, now_ms))
                }
            }
        })
    }

    async fn payload(&self, key: &EventKey, hash: &str) -> Result<Option<Vec<u8>>, PortError> {
        self.0.call_on("work.payload", key.as_str(), |_, st| {
            Ok(match st.table.get(key.as_str(), &payload_sk(hash)).and_then(payload::body) {
                Some(body) => Some(body),
                None => st.bucket.as_ref().and_then(|b| b.get(&format!("{}/{hash}", key.as_str())).cloned()),
            })
        })
    }

    async fn apply(&self, key: &EventKey, token: &str, op: &Op, now_ms: i64) -> Result<Applied, PortError> {
        let shards = self.0.shards;
        // The same token on every try of this call, as the SDK retries it.
        let request_token = self.0.ambient.token();
        let record = |st: &mut super::State, written: bool| {
            st.applied.push(super::AppliedCall {
                key: key.as_str().to_owned(),
                token: token.to_owned(),
                op: label(op),
                written,
            });
        };
        // One request each, as the adapter sends them: `Ok(true)` written
        // (or met this event's own put), `Ok(false)` refused.
        let alone = |item: &aws_sdk_dynamodb::types::TransactWriteItem, st: &mut super::State| {
            let write = Write::from_sdk(item).map_err(invalid)?;
            if item.put().is_some_and(|p| p.condition_expression() == Some(cond::OUTBOX_NEW)) {
                st.exercised.insert("outbox_new");
            }
            match st.table.write(&write) {
                Ok(_) => Ok(true),
                Err(Refusal::Invalid(e)) => Err(invalid(e)),
                // Only a put's refusal returns the item it met (`ALL_OLD`).
                Err(Refusal::Condition(met)) => Ok(item.put().is_some() && ours(met.as_ref(), key)),
                Err(Refusal::Conflict) => unreachable!("single writes are never in contention"),
            }
        };
        if let Some((put, notes)) = put_then_notify("memory", key, token, op, now_ms, shards) {
            let written = self.0.call_on("work.apply", key.as_str(), |_, st| {
                let written = alone(&put, st)?;
                record(st, written);
                Ok(written)
            })?;
            if !written {
                return Ok(Applied::Conflict);
            }
            let mut outbox = Vec::new();
            for (id, item) in notes {
                if self.0.call_on("work.apply", key.as_str(), |_, st| alone(&item, st))? {
                    outbox.push(id);
                } else {
                    // Written by an attempt that died before it sent it.
                    self.keep_for_sweep(&id, key.shard(shards), now_ms + crate::message::DISPATCH_LEASE_MS).await?;
                }
            }
            return Ok(Applied::Written { outbox });
        }
        if let Some((item, outbox)) = single("memory", key, token, op, now_ms, shards) {
            let written = self.0.call_on("work.apply", key.as_str(), |_, st| {
                let written = alone(&item, st)?;
                record(st, written);
                Ok(written)
            })?;
            if written {
                return Ok(Applied::Written { outbox });
            }
            // A notification of an attempt that died before it sent it.
            if let ([], [msg]) = (op.writes.as_slice(), op.outbox.as_slice())
                && msg.delivery.is_none()
            {
                let id = crate::message::outbox_id(key.as_str(), &msg.action);
                self.keep_for_sweep(&id, key.shard(shards), now_ms + crate::message::DISPATCH_LEASE_MS).await?;
            }
            return Ok(Applied::Conflict);
        }
        self.0.call_on("work.apply", key.as_str(), |w, st| {
            let (items, outbox) = op_items("memory", key, token, op, now_ms, shards, false);
            if items.is_empty() {
                return Ok(Applied::Written { outbox });
            }
            let writes = items.iter().map(Write::from_sdk).collect::<Result<Vec<_>, _>>().map_err(invalid)?;
            if !outbox.is_empty() {
                st.exercised.insert("outbox_new");
            }
            let result = st.table.transact(&writes, Some(&request_token), w.now());
            record(st, result.is_ok());
            match result {
                Ok(()) => Ok(Applied::Written { outbox }),
                Err(TransactError::Cancelled(reasons)) => {
                    let codes = Refusal::codes(&reasons);
                    // Only the puts ask for the item they met (`ALL_OLD`).
                    let met: Vec<Option<super::expr::Item>> = reasons
                        .iter()
                        .zip(&items)
                        .map(|(r, item)| match r {
                            Some(Refusal::Condition(met)) if item.put().is_some() => met.clone(),
                            _ => None,
                        })
                        .collect();
                    op_cancelled(&codes, &met, key)
                }
                Err(e) => Err(invalid(format!("{e:?}"))),
            }
        })
    }

    async fn commit(
        &self,
        key: &EventKey,
        token: &str,
        ops: &[Op],
        outcome: &str,
        subject: Option<&str>,
        now_ms: i64,
    ) -> Result<CommitResult, PortError> {
        let shards = self.0.shards;
        // The same token on every try of this call, as the SDK retries it.
        let request_token = self.0.ambient.token();
        self.0.call_on("work.commit", key.as_str(), |w, st| {
            if ops.iter().all(|op| op.writes.is_empty() && op.outbox.is_empty()) {
                // The completion alone: one conditional update.
                st.exercised.insert("complete");
                let update = cond::complete(token, outcome, subject, now_ms, key.shard(shards));
                let written = st.conditional(key.as_str(), META_SK, &update)?;
                let committed = matches!(written, Written::Applied(_));
                st.commits.push(super::CommitCall {
                    key: key.as_str().to_owned(),
                    token: token.to_owned(),
                    ops: Vec::new(),
                    outcome: outcome.to_owned(),
                    subject: subject.map(str::to_owned),
                    committed,
                });
                return Ok(if committed {
                    CommitResult::Committed { outbox: Vec::new() }
                } else {
                    CommitResult::Fenced
                });
            }
            let (items, owner, outbox) = commit_items("memory", key, token, ops, outcome, subject, now_ms, shards)?;
            let writes = items.iter().map(Write::from_sdk).collect::<Result<Vec<_>, _>>().map_err(invalid)?;
            st.exercised.insert("complete");
            if !outbox.is_empty() {
                st.exercised.insert("outbox_new");
            }
            let result = st.table.transact(&writes, Some(&request_token), w.now());
            st.commits.push(super::CommitCall {
                key: key.as_str().to_owned(),
                token: token.to_owned(),
                ops: ops.iter().map(label).collect(),
                outcome: outcome.to_owned(),
                subject: subject.map(str::to_owned),
                committed: result.is_ok(),
            });
            match result {
                Ok(()) => Ok(CommitResult::Committed { outbox: outbox.clone() }),
                Err(TransactError::Cancelled(reasons)) => {
                    let codes = Refusal::codes(&reasons);
                    commit_cancelled(&codes, &owner)
                }
                Err(e) => Err(invalid(format!("{e:?}"))),
            }
        })
    }

    async fn completed_by(&self, key: &EventKey) -> Result<Option<String>, PortError> {
        self.0.call_on("work.completed_by", key.as_str(), |_, st| {
            Ok(st.table.get(key.as_str(), META_SK).and_then(work_record).and_then(|r| r.completed_token))
        })
    }

    async fn leave(&self, key: &EventKey, token: &str, exit: &Exit<'_>, now_ms: i64) -> Result<bool, PortError> {
        let shard = key.shard(self.0.shards);
        self.0.call_on("work.leave", key.as_str(), |_, st| {
            Ok(match st.conditional(key.as_str(), META_SK, &cond::leave(token, exit, now_ms, shard))? {
                Written::Applied(_) => true,
                Written::Refused(met) => left_by(met.as_ref(), token),
            })
        })
    }

    async fn wake(&self, key: &EventKey, now_ms: i64) -> Result<Option<String>, PortError> {
        let shard = key.shard(self.0.shards);
        self.0.call_on("work.wake", key.as_str(), |_, st| {
            Ok(match st.conditional(key.as_str(), META_SK, &cond::wake(GAP, now_ms, shard))? {
                Written::Applied(new) => Some(tenant_of(Some(&new))),
                Written::Refused(_) => None,
            })
        })
    }

    async fn append_history(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) -> Result<(), PortError> {
        let id = self.0.ambient.entropy.token_simple();
        let item = history_item(key, kind, detail, now_ms, &id, self.0.retention_days);
        self.0.call_on("work.append_history", key.as_str(), |_, st| st.put(item.clone()))
    }

    async fn register_waiter(
        &self,
        at: &Position,
        key: &EventKey,
        expires_at: i64,
        look_at: Option<i64>,
    ) -> Result<(), PortError> {
        let due = look_at.map(|t| (due_partition(DuePartition::Waiters, key.shard(self.0.shards)), t));
        let item = item_to_sdk(&crate::projection::sequence::waiter_item(at, key, expires_at, due));
        self.0.call_on("work.register_waiter", key.as_str(), |_, st| st.put(item.clone()))
    }

    async fn waiter(&self, at: &Position) -> Result<Option<EventKey>, PortError> {
        self.0.call_on("work.waiter", &at.stream, |_, st| {
            Ok(st
                .table
                .get(&at.stream, &waiter_sk(at.seq))
                .and_then(|i| get_s(i, "event_key"))
                .and_then(EventKey::from_stored))
        })
    }

    async fn predecessor_applied(&self, at: &Position) -> Result<bool, PortError> {
        self.0.call_on("work.predecessor_applied", &at.stream, |_, st| {
            let last = st.table.get(&at.stream, STATE_SK).and_then(|i| get_n(i, "last_seq")).unwrap_or(0);
            Ok(last >= at.seq - 1)
        })
    }
}

/// An op by the `pk` of its first write.
fn label(op: &Op) -> String {
    op.writes.first().map(|w| w.pk.clone()).unwrap_or_default()
}

/// Projection state is read from the world's table, by key.
impl StateStore for MemLedger {
    fn read<'a>(&'a self, pk: &'a str, sk: &'a str) -> StateFuture<'a> {
        Box::pin(async move {
            self.0
                .call_on("state.read", pk, |_, st| Ok(st.table.get(pk, sk).map(item_from_sdk)))
                .map_err(|e| ProjectionError::Unavailable(e.to_string()))
        })
    }
}

// -------------------------------------------------------------- reconciler

impl Activity for MemLedger {
    async fn note_activity(&self, now_ms: i64) {
        let window = activity::window(now_ms);
        if self.0.state().marked == Some(window) {
            return;
        }
        let sk = activity::mark_sk(window);
        let marked = self.0.call_on("activity.note", activity::ACTIVITY_PK, |_, st| {
            st.conditional(activity::ACTIVITY_PK, &sk, &activity::mark(now_ms)).map(|_| ())
        });
        if marked.is_ok() {
            self.0.state().marked = Some(window);
        }
    }
}

impl Activity for MemOutbox {
    async fn note_activity(&self, now_ms: i64) {
        MemLedger(self.0.clone()).note_activity(now_ms).await
    }
}

impl DueLedger for MemLedger {
    fn shards(&self) -> u32 {
        self.0.shards
    }

    async fn drop_payload(
        &self,
        key: &EventKey,
        drop: &crate::ledger::PayloadDrop,
        now_ms: i64,
    ) -> Result<bool, PortError> {
        self.0.call_on("due.drop_payload", key.as_str(), |_, st| {
            if !drop.inline {
                st.table.remove(key.as_str(), &payload_sk(&drop.hash));
                if let Some(b) = &mut st.bucket {
                    b.remove(&format!("{}/{}", key.as_str(), drop.hash));
                }
            }
            Ok(match st.conditional(key.as_str(), META_SK, &cond::drop_payload(now_ms))? {
                Written::Applied(_) => true,
                Written::Refused(met) => cond::dropped(met.as_ref()),
            })
        })
    }

    async fn deliveries_settled(&self, ids: &[String]) -> Result<bool, PortError> {
        self.0.call_on("due.deliveries_settled", "", |_, st| {
            Ok(ids.iter().all(|id| {
                st.table.get(id, OUTBOX_SK).is_none_or(|i| text(i, attr::STATUS) == cond::outbox_status::SENT)
            }))
        })
    }

    async fn active_since(&self, since_ms: i64) -> Result<bool, PortError> {
        let from = activity::mark_sk(activity::window(since_ms));
        self.0.call_on("due.active_since", activity::ACTIVITY_PK, |_, st| {
            Ok(st.table.partition(activity::ACTIVITY_PK).iter().any(|i| {
                i.get("sk").and_then(|v| v.as_s().ok()).is_some_and(|sk| {
                    sk.starts_with("mark#") && sk.as_str() >= from.as_str() && sk.as_str() <= activity::MARK_LAST
                })
            }))
        })
    }

    async fn last_sweep(&self) -> Result<Option<Sweep>, PortError> {
        self.0.call_on("due.last_sweep", activity::ACTIVITY_PK, |_, st| {
            Ok(st.table.get(activity::ACTIVITY_PK, activity::SWEEP_SK).and_then(activity::sweep_of))
        })
    }

    async fn record_sweep(&self, sweep: &Sweep) -> Result<(), PortError> {
        self.0.call_on("due.record_sweep", activity::ACTIVITY_PK, |_, st| {
            st.conditional(activity::ACTIVITY_PK, activity::SWEEP_SK, &cond::sweep_record(sweep)).map(|_| ())
        })
    }

    async fn due_cursors(&self) -> Result<DueCursors, PortError> {
        self.0.call_on("due.due_cursors", activity::ACTIVITY_PK, |_, st| {
            Ok(st.table.get(activity::ACTIVITY_PK, activity::CURSORS_SK).map(activity::cursors_of).unwrap_or_default())
        })
    }

    async fn keep_due_cursors(&self, cursors: &DueCursors) -> Result<(), PortError> {
        self.0.call_on("due.keep_due_cursors", activity::ACTIVITY_PK, |_, st| {
            st.conditional(activity::ACTIVITY_PK, activity::CURSORS_SK, &cond::due_cursors(cursors)).map(|_| ())
        })
    }

    async fn due(
        &self,
        partition: DuePartition,
        shard: u32,
        up_to: i64,
        limit: usize,
        after: Option<&DueCursor>,
    ) -> Result<DuePage, PortError> {
        let name = due_partition(partition, shard);
        self.0.call_on("due.due", &name, |_, st| {
            let limit = limit.clamp(1, 100);
            let keys: Vec<(i64, (String, String))> = st
                .table
                .index(DUE_INDEX, &name, Some(up_to))
                .into_iter()
                .map(|(at, k, _)| (at, k))
                .filter(|(at, (pk, sk))| {
                    after.is_none_or(|c| (*at, pk.as_str(), sk.as_str()) > (c.due_at_ms, c.pk.as_str(), c.sk.as_str()))
                })
                .collect();
            let more = keys.len() > limit;
            let page: Vec<_> = keys.into_iter().take(limit).collect();
            let next = if more {
                page.last().map(|(at, (pk, sk))| DueCursor { due_at_ms: *at, pk: pk.clone(), sk: sk.clone() })
            } else {
                None
            };
            let mut out = Vec::new();
            let entries = page
                .iter()
                .map(|(at, (pk, sk))| DueCursor { due_at_ms: *at, pk: pk.clone(), sk: sk.clone() })
                .collect();
            for (at, (pk, sk)) in page {
                if sk == OUTBOX_SK {
                    out.push(Due::Outbox { id: pk, due_at_ms: at });
                    continue;
                }
                // The batch read is by key: current, even when the index lags.
                if let Some(i) = st.table.get(&pk, &sk) {
                    out.extend(due_of(i, at));
                }
            }
            Ok(crate::adapters::dynamodb::due::page_of(out, next, entries))
        })
    }

    async fn claim_due(&self, item: DueItem<'_>, seen: i64, next: i64) -> Result<Option<String>, PortError> {
        let token = self.0.ambient.token();
        let (pk, sk) = item_of(item);
        self.0.call_on("due.claim_due", pk, |_, st| {
            Ok(match st.conditional(pk, sk, &cond::claim_due(seen, next, &token))? {
                Written::Applied(_) => Some(token.clone()),
                Written::Refused(met) if claimed_by(met.as_ref(), &token) => Some(token.clone()),
                Written::Refused(_) => None,
            })
        })
    }

    async fn reschedule(&self, item: DueItem<'_>, token: &str, at: i64) -> Result<(), PortError> {
        let (pk, sk) = item_of(item);
        self.0.call_on("due.reschedule", pk, |_, st| st.conditional(pk, sk, &cond::reschedule(token, at)).map(|_| ()))
    }

    async fn dead_refused(&self, key: &EventKey, message: &str, now_ms: i64) -> Result<bool, PortError> {
        let update = cond::dead_refused(message, now_ms, key.shard(self.0.shards));
        self.0.call_on("due.dead_refused", key.as_str(), |_, st| {
            Ok(match st.conditional(key.as_str(), META_SK, &update)? {
                Written::Applied(_) => true,
                Written::Refused(met) => dead_refused_by(met.as_ref(), message),
            })
        })
    }

    async fn look_at_waiter(&self, w: &WaiterItem, now_ms: i64) -> Result<WaiterCheck, PortError> {
        let shard = w.key.shard(self.0.shards);
        self.0.call_on("due.look_at_waiter", w.key.as_str(), |_, st| {
            let record = st.table.get(w.key.as_str(), META_SK);
            let tenant = tenant_of(record);
            let check = if woken_at(record, now_ms) {
                WaiterCheck::Woken { tenant }
            } else if !waits_on_gap(record) {
                WaiterCheck::Gone
            } else if !predecessor_committed(st.table.get(&w.stream, STATE_SK), w.seq) {
                return Ok(WaiterCheck::Waiting);
            } else {
                match st.conditional(w.key.as_str(), META_SK, &cond::wake(GAP, now_ms, shard))? {
                    Written::Applied(_) => WaiterCheck::Woken { tenant },
                    Written::Refused(_) => WaiterCheck::Gone,
                }
            };
            st.conditional(&w.stream, &w.sk, &cond::waiter_settled())?;
            Ok(check)
        })
    }

    async fn note_enqueued(&self, key: &EventKey, now_ms: i64) -> Result<(), PortError> {
        self.0.call_on("due.note_enqueued", key.as_str(), |_, st| {
            st.conditional(key.as_str(), META_SK, &cond::note_redriven(now_ms)).map(|_| ())
        })
    }

    async fn attention(&self) -> Result<Attention, PortError> {
        let shards = self.0.shards;
        self.0.call("due.attention", |_, st| {
            let mut counts = Attention::default();
            for shard in 0..shards {
                for (_, (_, sk), i) in st.table.index(ATTENTION_INDEX, &attention_shard(shard), None) {
                    match (sk.as_str(), get_s(&i, attr::STATUS)) {
                        (META_SK, Some("DEAD")) => counts.dead_letters += 1,
                        (META_SK, Some("PARKED")) => counts.parked += 1,
                        (OUTBOX_SK, Some("DEAD")) => counts.outbox_dead += 1,
                        _ => {}
                    }
                }
            }
            Ok(counts)
        })
    }
}

// -------------------------------------------------------------- operations

impl OperatorLedger for MemLedger {
    fn shards(&self) -> u32 {
        self.0.shards
    }

    async fn rows(
        &self,
        status: Status,
        shard: u32,
        filter: &RowFilter<'_>,
        want: usize,
    ) -> Result<Vec<Row>, PortError> {
        self.0.call("operator.rows", |w, st| {
            Ok(match status {
                Status::Dead | Status::Parked => {
                    // Newest first, in pages of the index (DynamoDB: 1 MB),
                    // the filter applied to each page, until `want` rows.
                    let index: Vec<_> = st
                        .table
                        .index(ATTENTION_INDEX, &attention_shard(shard), None)
                        .into_iter()
                        .rev()
                        .filter(|(at, _, _)| (filter.since_ms..=filter.until_ms).contains(at))
                        .collect();
                    let mut rows = Vec::new();
                    for page in index.chunks(w.page_items) {
                        rows.extend(
                            page.iter()
                                .filter(|(_, (_, sk), i)| {
                                    sk == META_SK
                                        && get_s(i, attr::STATUS) == Some(status.as_str())
                                        && passes(i, filter)
                                })
                                .map(|(_, _, i)| row(i)),
                        );
                        if rows.len() >= want {
                            break;
                        }
                    }
                    rows
                }
                Status::Received | Status::Processing | Status::Retryable => open(st, &[status], shard, filter),
                Status::Processed => Vec::new(),
            })
        })
    }

    async fn open_rows(&self, shard: u32) -> Result<Vec<Row>, PortError> {
        let everything = RowFilter { until_ms: i64::MAX, ..RowFilter::default() };
        self.0.call("operator.open_rows", |_, st| {
            Ok(open(st, &[Status::Received, Status::Processing, Status::Retryable], shard, &everything))
        })
    }

    async fn count(&self, status: Status) -> Result<u64, PortError> {
        let everything = RowFilter { until_ms: i64::MAX, ..RowFilter::default() };
        let mut total = 0;
        for shard in 0..self.0.shards {
            total += self.rows(status, shard, &everything, usize::MAX).await?.len() as u64;
        }
        Ok(total)
    }

    async fn records(&self, keys: &[EventKey]) -> Result<Vec<Row>, PortError> {
        let mut out = Vec::new();
        for chunk in keys.chunks(100) {
            out.extend(self.0.call("operator.records", |_, st| {
                Ok(chunk
                    .iter()
                    .filter_map(|k| st.table.get(k.as_str(), META_SK))
                    .map(crate::adapters::dynamodb::operator::without_body)
                    .collect::<Vec<Row>>())
            })?);
        }
        Ok(out)
    }

    async fn show(&self, key: &EventKey, with_payload: bool) -> Result<Option<Shown>, PortError> {
        self.0.call_on("operator.show", key.as_str(), |_, st| {
            let all = st.table.partition(key.as_str());
            let sk = |i: &Item| get_s(i, attr::SK).unwrap_or_default().to_owned();
            let Some(record) = all.iter().find(|i| sk(i) == META_SK) else { return Ok(None) };
            let history: Vec<Row> = all.iter().filter(|i| sk(i).starts_with("hist#")).map(|i| item_json(i)).collect();
            let payload = if with_payload {
                let hash = get_s(record, attr::PAYLOAD_HASH).unwrap_or_default();
                payload::body(record)
                    .or_else(|| all.iter().find(|i| sk(i) == payload_sk(hash)).and_then(|i| payload::body(i)))
                    .or_else(|| st.bucket.as_ref().and_then(|b| b.get(&format!("{}/{hash}", key.as_str())).cloned()))
            } else {
                None
            };
            Ok(Some((item_json(record), history, payload)))
        })
    }

    async fn transition(
        &self,
        key: &EventKey,
        action: OperatorAction,
        entry: &crate::audit::AuditEntry,
        now_ms: i64,
    ) -> Result<Transitioned, PortError> {
        use crate::adapters::dynamodb::audit::{self, Audited};
        let token = self.0.ambient.token();
        let entry = audit::on_record(entry, action.name(), key, &token, now_ms);
        let update = cond::operator(
            action,
            &entry.operator,
            &entry.reason,
            entry.run.as_deref(),
            &token,
            now_ms,
            key.shard(self.0.shards),
        );
        let name = update.name();
        let item = audit::update_item("memory", key.as_str(), META_SK, update);
        match self.0.audited("operator.transition", vec![item], &entry, &[name])? {
            Audited::Done => Ok(transitioned(&self.0.read(key.as_str(), META_SK).unwrap_or_default())),
            Audited::Refused(met) => {
                let met = match met.into_iter().next().flatten() {
                    Some(met) if !met.is_empty() => Some(met),
                    _ => self.0.read(key.as_str(), META_SK),
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
        entry: &crate::audit::AuditEntry,
        now_ms: i64,
    ) -> Result<crate::ledger::Erasure, PortError> {
        use crate::adapters::dynamodb::audit::{self, Audited};
        self.0.call_on("operator.erase_copies", key.as_str(), |_, st| {
            st.table.remove(key.as_str(), &payload_sk(payload_hash));
            if let Some(b) = &mut st.bucket {
                b.remove(&format!("{}/{payload_hash}", key.as_str()));
            }
            Ok(())
        })?;
        let token = self.0.ambient.token();
        let entry = audit::on_record(entry, crate::audit::verb::ERASE, key, &token, now_ms);
        let update = cond::erase_record(&entry.operator, &entry.reason, now_ms);
        let name = update.name();
        let item = audit::update_item("memory", key.as_str(), META_SK, update);
        match self.0.audited("operator.erase", vec![item], &entry, &[name])? {
            Audited::Done => Ok(crate::ledger::Erasure::Erased),
            Audited::Refused(met) => {
                let met = match met.into_iter().next().flatten() {
                    Some(met) if !met.is_empty() => Some(met),
                    _ => self.0.read(key.as_str(), META_SK),
                };
                Ok(cond::erase_refused(met.as_ref()))
            }
        }
    }
}

/// Open records of one shard from the due index (keys), read by key,
/// newest first (the adapter's `due_rows`).
fn open(st: &State, statuses: &[Status], shard: u32, filter: &RowFilter<'_>) -> Vec<Row> {
    let place = st
        .table
        .get(activity::ACTIVITY_PK, activity::CURSORS_SK)
        .map(activity::cursors_of)
        .and_then(|mut c| c.shards.remove(&shard));
    let mut items: Vec<Item> = st
        .table
        .index(DUE_INDEX, &due_shard(shard), None)
        .into_iter()
        .filter(|(at, (pk, sk), _)| {
            place.as_ref().is_none_or(|c| (*at, pk.as_str(), sk.as_str()) > (c.due_at_ms, c.pk.as_str(), c.sk.as_str()))
        })
        .filter_map(|(_, (pk, sk), _)| st.table.get(&pk, &sk).cloned())
        .filter(|i| statuses.iter().any(|s| get_s(i, attr::STATUS) == Some(s.as_str())) && passes(i, filter))
        .collect();
    let sort_key =
        |i: &Item| (get_n(i, attr::RECEIVED_AT).unwrap_or(0), get_s(i, attr::PK).unwrap_or_default().to_owned());
    items.sort_by_key(|i| std::cmp::Reverse(sort_key(i)));
    items
        .iter()
        .map(|i| {
            let mut r = row(i);
            if !filter.fields.is_empty() {
                r.retain(|k, _| filter.fields.contains(&k.as_str()) || k == "st_at" || k == attr::PK);
            }
            r
        })
        .collect()
}

// ---------------------------------------------------------------- backfill

impl BackfillLedger for MemLedger {
    async fn claim(&self, event: &NewEvent, body: &[u8]) -> Result<Claim, PortError> {
        Ledger::claim(self, event, body).await
    }

    async fn release_send_lease(&self, key: &EventKey, lease: &SendLease) -> Result<(), PortError> {
        Ledger::release_send_lease(self, key, lease).await
    }

    async fn recorded(&self, key: &EventKey) -> Result<bool, PortError> {
        self.0.call_on("backfill.recorded", key.as_str(), |_, st| Ok(st.table.get(key.as_str(), META_SK).is_some()))
    }

    async fn note_redelivery(&self, key: &EventKey, handle: &str, now_ms: i64) -> Result<(), PortError> {
        let item = redelivery_item(key, handle, now_ms, self.0.retention_days);
        self.0.call_on("backfill.note_redelivery", key.as_str(), |_, st| st.put(item.clone()))
    }

    async fn progress(&self, run: &str) -> Result<Option<BackfillProgress>, PortError> {
        self.0.call_on("backfill.progress", run, |_, st| {
            Ok(st.table.get(&progress_pk(run), PROGRESS_SK).map(progress_from))
        })
    }

    async fn schedule_state(&self, endpoint: &str) -> Result<Option<ScheduleState>, PortError> {
        self.0.call_on("backfill.schedule_state", endpoint, |_, st| {
            Ok(st.table.get(&progress_pk(endpoint), SCHEDULE_SK).map(schedule_from))
        })
    }

    async fn save_schedule_state(&self, endpoint: &str, state: &ScheduleState, now_ms: i64) -> Result<(), PortError> {
        let item = schedule_item(endpoint, state, now_ms);
        self.0.call_on("backfill.save_schedule_state", endpoint, |_, st| st.put(item.clone()))
    }

    async fn save_audit(&self, endpoint: &str, report: &str, now_ms: i64) -> Result<(), PortError> {
        let item = crate::adapters::dynamodb::backfill::audit_item(endpoint, report, now_ms);
        self.0.call_on("backfill.save_audit", endpoint, |_, st| st.put(item.clone()))
    }

    async fn last_audit(&self, endpoint: &str) -> Result<Option<String>, PortError> {
        use crate::adapters::dynamodb::backfill::{AUDIT_SK, audit_from};
        self.0.call_on("backfill.last_audit", endpoint, |_, st| {
            Ok(st.table.get(&progress_pk(endpoint), AUDIT_SK).and_then(audit_from))
        })
    }

    async fn save_progress(&self, run: &str, progress: &BackfillProgress, now_ms: i64) -> Result<(), PortError> {
        let item = progress_item(run, progress, now_ms, self.0.retention_days);
        self.0.call_on("backfill.save_progress", run, |_, st| st.put(item.clone()))
    }

    async fn park(&self, event: &NewEvent, unfetched: &UnfetchedEvent<'_>) -> Result<Claim, PortError> {
        let item = parked_item(event, unfetched);
        self.0.call_on("backfill.park", event.key.as_str(), |_, st| st.put_claim(event, item.clone()))
    }

    async fn release(&self, event: &NewEvent, body: &[u8], by: &str) -> Result<Release, PortError> {
        self.0.call_on("backfill.release", event.key.as_str(), |_, st| release(st, event, body, by))
    }

    async fn note(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) -> Result<(), PortError> {
        WorkLedger::append_history(self, key, kind, detail, now_ms).await
    }
}

// ------------------------------------------------------------------ outbox

/// An outbox item, typed: the attributes its transitions read and write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxView {
    pub status: String,
    pub idempotency_key: String,
    pub topic_arn: String,
    pub group: String,
    pub body: String,
    /// The event's index shard (its `out#NNN` partition, or `attn#NNN` once DEAD).
    pub shard: u32,
    /// `due_at`; `None`: out of the `due` index (SENT, DEAD, or a
    /// notification sent before its completion).
    pub due_at: Option<i64>,
    /// Its partition of the `due` index; `None`: out of it.
    pub due_shard: Option<String>,
    pub token: Option<String>,
    /// `dispatch_until`: when the current claim lapses.
    pub until: Option<i64>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub sent_at: Option<i64>,
    pub dead_at: Option<i64>,
}

impl OutboxView {
    /// A PENDING item as the processor's commit writes it, due at `due_at`.
    pub fn pending(idempotency_key: &str, topic_arn: &str, shard: u32, due_at: i64) -> Self {
        Self {
            status: cond::outbox_status::PENDING.into(),
            idempotency_key: idempotency_key.to_owned(),
            topic_arn: topic_arn.to_owned(),
            group: format!("cus_{idempotency_key}"),
            body: format!(r#"{{"subscription":"sub_{idempotency_key}","status":"active"}}"#),
            shard,
            due_at: Some(due_at),
            due_shard: Some(outbox_partition(shard)),
            token: None,
            until: None,
            attempts: 0,
            last_error: None,
            sent_at: None,
            dead_at: None,
        }
    }

    fn item(&self, id: &str) -> Item {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let n = |v: i64| AttributeValue::N(v.to_string());
        let mut i = Item::from([
            ("pk".into(), s(id)),
            ("sk".into(), s(OUTBOX_SK)),
            ("status".into(), s(&self.status)),
            ("idempotency_key".into(), s(&self.idempotency_key)),
            ("topic_arn".into(), s(&self.topic_arn)),
            ("group_id".into(), s(&self.group)),
            ("body".into(), s(&self.body)),
            ("dispatch_attempts".into(), n(i64::from(self.attempts))),
        ]);
        if self.status == cond::outbox_status::DEAD {
            i.insert("attn_shard".into(), s(&dead_partition(self.shard)));
            i.insert("attn_at".into(), n(self.dead_at.unwrap_or(0)));
        }
        if let Some(at) = self.due_at {
            i.insert("due_shard".into(), s(&outbox_partition(self.shard)));
            i.insert("due_at".into(), n(at));
        }
        for (k, v) in [("dispatch_token", &self.token), ("last_error", &self.last_error)] {
            if let Some(v) = v {
                i.insert(k.into(), s(v));
            }
        }
        for (k, v) in [("dispatch_until", self.until), ("sent_at", self.sent_at), ("dead_at", self.dead_at)] {
            if let Some(v) = v {
                i.insert(k.into(), n(v));
            }
        }
        i
    }

    fn from_item(i: &Item) -> Self {
        let opt = |k: &str| get_s(i, k).map(str::to_owned);
        let partition = get_s(i, "due_shard").or_else(|| get_s(i, "attn_shard")).unwrap_or_default();
        Self {
            status: text(i, "status"),
            idempotency_key: text(i, "idempotency_key"),
            topic_arn: text(i, "topic_arn"),
            group: text(i, "group_id"),
            body: text(i, "body"),
            shard: partition.rsplit('#').next().and_then(|s| s.parse().ok()).unwrap_or(0),
            due_at: get_n(i, "due_at"),
            due_shard: opt("due_shard"),
            token: opt("dispatch_token"),
            until: get_n(i, "dispatch_until"),
            attempts: get_n(i, "dispatch_attempts").and_then(|a| u32::try_from(a).ok()).unwrap_or(0),
            last_error: opt("last_error"),
            sent_at: get_n(i, "sent_at"),
            dead_at: get_n(i, "dead_at"),
        }
    }
}

impl MemOutbox {
    /// Writes an outbox item as it is.
    pub fn put(&self, id: &str, item: &OutboxView) {
        self.0.state().table.insert(item.item(id));
    }

    /// Makes the item `id` a route's delivery to `destination`, committed
    /// at `created_at` by the event `evt#acme#main#<its idempotency key>`
    /// (the attributes the processor's commit writes besides a notification's).
    pub fn set_delivery(&self, id: &str, destination: &str, created_at: i64) {
        use crate::adapters::dynamodb::outbox::attr;
        let mut st = self.0.state();
        let mut item = st.table.get(id, OUTBOX_SK).cloned().unwrap_or_else(|| panic!("no outbox item {id}"));
        let event = EventKey::new("acme", "main", &text(&item, attr::IDEMPOTENCY_KEY));
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let n = |v: i64| AttributeValue::N(v.to_string());
        for (k, v) in [
            (attr::DESTINATION, s(destination)),
            (attr::SOURCE, s("hookledger")),
            (attr::DETAIL_TYPE, s("thing.changed")),
            (attr::PAYLOAD_HASH, s("h")),
            (attr::EVENT_KEY, s(event.as_str())),
            (attr::RECEIVED_AT, n(created_at)),
            (attr::CREATED_AT, n(created_at)),
        ] {
            item.insert(k.to_owned(), v);
        }
        st.table.insert(item);
    }

    /// The outbox item, typed.
    pub fn get(&self, id: &str) -> OutboxView {
        OutboxView::from_item(&self.0.read(id, OUTBOX_SK).unwrap_or_else(|| panic!("no outbox item {id}")))
    }

    /// The item's status.
    pub fn status(&self, id: &str) -> String {
        self.get(id).status
    }

    /// [`OutboxStore::claim`], at once (another dispatcher acting meanwhile).
    pub fn claim_now(&self, id: &str, token: &str, now_ms: i64, until_ms: i64) -> Result<OutboxClaim, PortError> {
        self.0.call_on("outbox.claim", id, |_, st| {
            Ok(match st.conditional(id, OUTBOX_SK, &cond::outbox_claim(token, now_ms, until_ms))? {
                Written::Applied(item) => OutboxClaim::Claimed(claimed(&item)),
                Written::Refused(met) => claim_refused(met.as_ref(), token),
            })
        })
    }

    /// Every write of this item fails from now on (throttled).
    pub fn fail_writes_of(&self, id: &str) {
        for call in ["outbox.claim", "outbox.mark_sent", "outbox.back_off", "outbox.dead"] {
            self.0.inject_on(call, id, None, super::Fault::Throttle);
        }
    }

    /// The outbox item's attribute, as text.
    pub fn field(&self, id: &str, name: &str) -> Option<String> {
        let item = self.0.read(id, OUTBOX_SK)?;
        match item.get(name)? {
            AttributeValue::S(s) | AttributeValue::N(s) => Some(s.clone()),
            other => Some(format!("{other:?}")),
        }
    }

    fn fenced(&self, call: &str, id: &str, token: &str, update: &Update) -> Result<Held, PortError> {
        self.0.call_on(call, id, |_, st| {
            Ok(match st.conditional(id, OUTBOX_SK, update)? {
                Written::Applied(_) => Held::Yes,
                Written::Refused(met) => held_by(met.as_ref(), token),
            })
        })
    }
}

impl OutboxStore for MemOutbox {
    async fn claim(&self, id: &str, token: &str, now_ms: i64, until_ms: i64) -> Result<OutboxClaim, PortError> {
        self.claim_now(id, token, now_ms, until_ms)
    }

    async fn hold(&self, id: &str, token: &str, until_ms: i64) -> Result<Held, PortError> {
        self.fenced("outbox.hold", id, token, &cond::outbox_hold(token, until_ms))
    }

    async fn mark_sent(&self, id: &str, token: &str, granted_at: Option<i64>, now_ms: i64) -> Result<Held, PortError> {
        let expires_at = crate::policy::expires_at(now_ms, self.0.retention_days);
        self.fenced("outbox.mark_sent", id, token, &cond::outbox_sent(token, granted_at, now_ms, expires_at))
    }

    async fn back_off(
        &self,
        id: &str,
        token: &str,
        next_at_ms: i64,
        error: &str,
        now_ms: i64,
    ) -> Result<Held, PortError> {
        self.fenced("outbox.back_off", id, token, &cond::outbox_back_off(token, next_at_ms, &short(error), now_ms))
    }

    async fn defer(
        &self,
        id: &str,
        token: &str,
        destination: &str,
        shard: u32,
        why: &str,
        now_ms: i64,
    ) -> Result<Held, PortError> {
        let update =
            cond::outbox_defer(token, &wait_partition(destination), &outbox_partition(shard), &short(why), now_ms);
        self.fenced("outbox.defer", id, token, &update)
    }

    async fn waiting(&self, destination: &str, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
        self.0.call_on("outbox.waiting", destination, |_, st| {
            Ok(st
                .table
                .index(DUE_INDEX, &wait_partition(destination), Some(up_to))
                .into_iter()
                .filter(|(_, (_, sk), _)| sk == OUTBOX_SK)
                .map(|(_, (pk, _), _)| pk)
                .take(limit.clamp(1, 100))
                .collect())
        })
    }

    async fn unwait(&self, id: &str, destination: &str, now_ms: i64) -> Result<bool, PortError> {
        let update = cond::outbox_unwait(&wait_partition(destination), now_ms);
        self.0.call_on("outbox.unwait", id, |_, st| {
            Ok(match st.conditional(id, OUTBOX_SK, &update)? {
                Written::Applied(_) => true,
                Written::Refused(met) => crate::adapters::dynamodb::outbox::unwaited(met.as_ref()),
            })
        })
    }

    async fn dead(&self, id: &str, token: &str, shard: u32, error: &str, now_ms: i64) -> Result<Held, PortError> {
        self.fenced("outbox.dead", id, token, &cond::outbox_dead(token, &dead_partition(shard), &short(error), now_ms))
    }

    async fn state(&self, id: &str) -> Result<Option<crate::message::OutboxState>, PortError> {
        self.0.call_on("outbox.state", id, |_, st| {
            Ok(st.table.get(id, OUTBOX_SK).map(crate::adapters::dynamodb::outbox::state_of))
        })
    }

    async fn states(&self, ids: &[String]) -> Result<Vec<crate::message::OutboxState>, PortError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(100) {
            out.extend(self.0.call("outbox.states", |_, st| {
                Ok(chunk
                    .iter()
                    .filter_map(|id| st.table.get(id, OUTBOX_SK))
                    .map(crate::adapters::dynamodb::outbox::state_of)
                    .collect::<Vec<_>>())
            })?);
        }
        Ok(out)
    }

    async fn states_in(
        &self,
        partition: crate::ports::OutboxPartition<'_>,
        max: usize,
    ) -> Result<(Vec<crate::message::OutboxState>, bool), PortError> {
        use crate::ports::OutboxPartition;
        let (index, name) = match partition {
            OutboxPartition::Home(shard) => (DUE_INDEX, outbox_partition(shard)),
            OutboxPartition::Waiting(d) => (DUE_INDEX, wait_partition(d)),
            OutboxPartition::Dead(shard) => (ATTENTION_INDEX, dead_partition(shard)),
        };
        self.0.call_on("outbox.states_in", &name, |_, st| {
            let all: Vec<_> = st
                .table
                .index(index, &name, None)
                .into_iter()
                .filter(|(_, (_, sk), _)| sk == OUTBOX_SK)
                .filter_map(|(_, (pk, sk), _)| st.table.get(&pk, &sk).map(crate::adapters::dynamodb::outbox::state_of))
                .collect();
            let more = all.len() > max;
            Ok((all.into_iter().take(max).collect(), more))
        })
    }

    async fn dead_items(&self, shard: u32, limit: usize) -> Result<Vec<String>, PortError> {
        self.0.call_on("outbox.dead_items", "", |_, st| {
            let mut found: Vec<(i64, String)> = st
                .table
                .index(ATTENTION_INDEX, &dead_partition(shard), None)
                .into_iter()
                .filter(|(_, (_, sk), _)| sk == OUTBOX_SK)
                .map(|(at, (pk, _), _)| (at, pk))
                .collect();
            found.sort_by_key(|f| std::cmp::Reverse(f.0));
            Ok(found.into_iter().map(|(_, pk)| pk).take(limit.clamp(1, 1000)).collect())
        })
    }

    async fn revive(
        &self,
        id: &str,
        run: &str,
        shard: u32,
        entry: &crate::audit::AuditEntry,
    ) -> Result<bool, PortError> {
        use crate::adapters::dynamodb::audit::{self, Audited};
        use crate::adapters::dynamodb::outbox::{revive_entry, revived_by};
        let entry = revive_entry(entry, id, &self.0.ambient.token());
        let update =
            cond::outbox_revive(run, &outbox_partition(shard), &entry.operator, &short(&entry.reason), entry.at_ms);
        let name = update.name();
        let item = audit::update_item("memory", id, OUTBOX_SK, update);
        match self.0.audited("outbox.revive", vec![item], &entry, &[name])? {
            Audited::Done => Ok(true),
            Audited::Refused(met) => {
                let met = match met.into_iter().next().flatten() {
                    Some(met) if !met.is_empty() => Some(met),
                    _ => self.0.read(id, OUTBOX_SK),
                };
                Ok(revived_by(met.as_ref(), run))
            }
        }
    }

    async fn due(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
        self.0.call_on("outbox.due", "", |_, st| {
            Ok(st
                .table
                .index(DUE_INDEX, &outbox_partition(shard), Some(up_to))
                .into_iter()
                .filter(|(_, (_, sk), _)| sk == OUTBOX_SK)
                .map(|(_, (pk, _), _)| pk)
                .take(limit.clamp(1, 100))
                .collect())
        })
    }
}

impl crate::ports::CircuitStore for MemOutbox {
    async fn rate(&self, destination: &str) -> Result<Option<crate::ports::Rate>, PortError> {
        use crate::adapters::dynamodb::outbox::{RATE_SK, circuit_pk, rate_of};
        let pk = circuit_pk(destination);
        self.0.call_on("rate.read", destination, |_, st| Ok(st.table.get(&pk, RATE_SK).map(rate_of)))
    }

    async fn change_rate(
        &self,
        destination: &str,
        change: crate::ports::RateChange<'_>,
    ) -> Result<crate::ports::RateWritten, PortError> {
        use crate::adapters::dynamodb::outbox::{RATE_SK, circuit_pk, rate_of, rate_update};
        use crate::ports::RateWritten;
        let update = rate_update(&change);
        let pk = circuit_pk(destination);
        self.0.call_on("rate.change", destination, |_, st| {
            Ok(match st.conditional(&pk, RATE_SK, &update)? {
                Written::Applied(_) => {
                    RateWritten::Applied(st.table.get(&pk, RATE_SK).map(rate_of).unwrap_or_default())
                }
                Written::Refused(met) => RateWritten::Refused(met.as_ref().map(rate_of)),
            })
        })
    }

    async fn circuit(&self, destination: &str) -> Result<Option<crate::ports::Circuit>, PortError> {
        use crate::adapters::dynamodb::outbox::{CIRCUIT_SK, circuit_of, circuit_pk};
        let pk = circuit_pk(destination);
        self.0.call_on("circuit.read", destination, |_, st| Ok(st.table.get(&pk, CIRCUIT_SK).map(circuit_of)))
    }

    async fn change_circuit(
        &self,
        destination: &str,
        change: crate::ports::CircuitChange<'_>,
    ) -> Result<Option<crate::ports::Circuit>, PortError> {
        use crate::adapters::dynamodb::outbox::{CIRCUIT_SK, circuit_of, circuit_pk, circuit_update};
        let (update, ours) = circuit_update(change);
        let pk = circuit_pk(destination);
        self.0.call_on("circuit.change", destination, |_, st| {
            Ok(match st.conditional(&pk, CIRCUIT_SK, &update)? {
                Written::Applied(_) => st.table.get(&pk, CIRCUIT_SK).map(circuit_of),
                Written::Refused(met) => met.as_ref().map(circuit_of).filter(|c| ours(c)),
            })
        })
    }
}
