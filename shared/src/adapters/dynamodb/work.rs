//! The processor's transitions on the ledger record ([`WorkLedger`]), one
//! conditional write each (the expressions are in `conditions`):
//!
//! ```text
//! lease     RECEIVED | RETRYABLE (due) | PROCESSING (lease expired) → PROCESSING(token, expiry, attempts+1)
//! apply     each projection op before the commit, guarded by its own conditions
//! commit    PROCESSING(token) → PROCESSED   (+ a route's deliveries, one transaction)
//! leave     PROCESSING(token) → RETRYABLE(next_attempt_at) | DEAD(reason) | PARKED(reason)
//! wake      RETRYABLE(gap) | PARKED(gap) → RETRYABLE, due now       (its predecessor committed)
//! ```
//!
//! Every transition out of PROCESSING is conditioned on the lease token
//! (fencing): a worker whose lease was taken over can neither mutate nor
//! complete. Every one also lets its own retry recognise itself: the lease
//! compares the returned record's `lease_owner`, the exits from PROCESSING
//! compare its `transition_token`, and the commit its `completed_token`,
//! with this invocation's token; a match is success, never "busy" or
//! "fenced".
//!
//! `attempts` counts leases (evidence); `failures` counts business failures
//! (the attempt budget). `window_start` is set by the first lease after
//! receipt, replay or wake: the time bounds on gaps and transient faults
//! count from it.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use super::conditions::{self as cond, FAILURES, TRANSITION_TOKEN, WINDOW_START};
use super::outbox::outbox_put;
use super::{DynamoLedger, Item, META_SK, Written, attr, payload_sk};
use crate::adapters::port_error;
use crate::identity::EventKey;
use crate::ledger::{Applied, CommitResult, Exit, GAP, LeaseResult, PortError, Status, WorkRecord};
use crate::message::DISPATCH_LEASE_MS;
use crate::policy::expires_at;
use crate::ports::{EventPayload, WorkLedger};
use crate::projection::sequence::{Position, waiter_sk};
use crate::projection::{Op, ProjectionError, STATE_SK, StateFuture, StateStore};

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub fn work_record(item: &Item) -> Option<WorkRecord> {
    let gs = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
    let gn = |k: &str| item.get(k).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok());
    Some(WorkRecord {
        key: EventKey::from_stored(&gs(attr::PK)?)?,
        status: Status::parse(&gs(attr::STATUS)?)?,
        provider: gs(attr::PROVIDER)?,
        endpoint: gs(attr::ENDPOINT)?,
        tenant: gs(attr::TENANT)?,
        event_id: gs(attr::EVENT_ID)?,
        event_type: gs(attr::EVENT_TYPE),
        payload_hash: gs(attr::PAYLOAD_HASH)?,
        attempts: gn(attr::ATTEMPTS).unwrap_or(0).try_into().unwrap_or(u32::MAX),
        failures: gn(FAILURES).unwrap_or(0).try_into().unwrap_or(u32::MAX),
        received_at_ms: gn(attr::RECEIVED_AT).unwrap_or(0),
        window_start_ms: gn(WINDOW_START),
        lease_owner: gs("lease_owner"),
        lease_expires_at_ms: gn("lease_expires_at"),
        next_attempt_at_ms: gn("next_attempt_at"),
        completed_token: gs("completed_token"),
        transition_token: gs(TRANSITION_TOKEN),
        payload: super::payload::body(item),
        via: crate::ledger::Via::parse(gs(attr::VIA).as_deref()),
        payload_policy: gs(attr::PAYLOAD_POLICY),
    })
}

impl DynamoLedger {
    /// Reads the record (strongly consistent).
    pub async fn read_record(&self, key: &EventKey) -> Result<Option<WorkRecord>, PortError> {
        Ok(self.read_meta(key).await?.as_ref().and_then(work_record))
    }
}

/// Projection state is read from the ledger's table: one strongly
/// consistent `GetItem` by key.
impl StateStore for DynamoLedger {
    fn read<'a>(&'a self, pk: &'a str, sk: &'a str) -> StateFuture<'a> {
        Box::pin(async move {
            let item = self.read_item(pk, sk).await.map_err(|e| ProjectionError::Unavailable(e.to_string()))?;
            Ok(item.as_ref().map(super::item::item_from_sdk))
        })
    }
}

/// An event's payload for a route's delivery: on its record when small,
/// else its payload item; one in S3 (over 380 KiB) is over every
/// destination's limit and is not read.
impl crate::ports::EventPayloads for DynamoLedger {
    fn event_payload<'a>(
        &'a self,
        event_key: &'a EventKey,
        payload_hash: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<EventPayload, PortError>> + Send + 'a>> {
        Box::pin(async move {
            let Some(record) = self.read_record(event_key).await? else { return Ok(EventPayload::Gone) };
            if let Some(inline) = record.payload {
                return Ok(EventPayload::Bytes(inline));
            }
            let item = self.read_item(event_key.as_str(), &super::schema::payload_sk(payload_hash)).await?;
            Ok(match item.as_ref().and_then(super::payload::body) {
                Some(body) => EventPayload::Bytes(body),
                None => EventPayload::TooLarge,
            })
        })
    }

    /// The payload's object in the payload bucket: put there as it is (not
    /// compressed) when the caller holds it; an intake that stored it there
    /// (over 380 KiB) may have compressed it (`hookledger-enc: deflate`).
    fn payload_ref<'a>(
        &'a self,
        event_key: &'a EventKey,
        payload_hash: &'a str,
        bytes: Option<&'a [u8]>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Option<crate::ports::PayloadRef>, PortError>> + Send + 'a>,
    > {
        Box::pin(async move {
            let Some(s3) = &self.payloads else { return Ok(None) };
            if let Some(b) = bytes {
                let stored = super::payload::Stored { bytes: b.to_vec(), encoding: None };
                s3.put(event_key, payload_hash, &stored).await?;
            }
            Ok(Some(crate::ports::PayloadRef {
                bucket: s3.bucket().to_owned(),
                key: crate::adapters::s3::S3Payloads::object_key(event_key, payload_hash),
                sha256: payload_hash.to_owned(),
            }))
        })
    }
}

/// The commit's transaction items, the op each belongs to, the outbox ids.
pub(crate) type CommitItems = (Vec<TransactWriteItem>, Vec<usize>, Vec<String>);

/// The commit's transaction: each op's writes and outbox items, then the
/// completion marker last; which op each item belongs to; the outbox ids.
#[allow(clippy::too_many_arguments)]
pub(crate) fn commit_items(
    table: &str,
    key: &EventKey,
    token: &str,
    ops: &[Op],
    outcome: &str,
    subject: Option<&str>,
    now_ms: i64,
    shards: u32,
) -> Result<CommitItems, PortError> {
    let mut items: Vec<TransactWriteItem> = Vec::new();
    let mut owner: Vec<usize> = Vec::new();
    let mut outbox = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let (mine, ids) = op_items(table, key, token, op, now_ms, shards, true);
        owner.extend(std::iter::repeat_n(i, mine.len()));
        items.extend(mine);
        outbox.extend(ids);
    }
    let completion = cond::complete(token, outcome, subject, now_ms, key.shard(shards))
        .transact(table, DynamoLedger::key(key, META_SK))
        .build()
        .map_err(|e| PortError::Unavailable { service: "dynamodb", message: e.to_string() })?;
    items.push(TransactWriteItem::builder().update(completion).build());
    Ok((items, owner, outbox))
}

/// The attribute every projection put carries: the event that wrote it, so
/// that a retry of the put (after a lost acknowledgement, a crash before
/// the completion, a worker fenced out meanwhile) recognises its own write
/// in the item its refused condition met.
pub const APPLIED_BY: &str = "applied_by";

/// A projection write as the commit sends it: a put stamped with the event.
fn stamped(key: &EventKey, w: &crate::projection::Write) -> crate::projection::Write {
    let mut w = w.clone();
    if let crate::projection::Action::Put(attrs) = &mut w.action {
        attrs.insert(APPLIED_BY.to_owned(), crate::item::Value::S(key.as_str().to_owned()));
    }
    w
}

/// Whether an item a refused condition met is this event's own put.
pub(crate) fn ours(met: Option<&Item>, key: &EventKey) -> bool {
    met.and_then(|i| i.get(APPLIED_BY)).and_then(|v| v.as_s().ok()).is_some_and(|by| by == key.as_str())
}

/// One op's transaction items (its writes, then its outbox items claimed
/// by `token`) and the outbox ids.
pub(crate) fn op_items(
    table: &str,
    key: &EventKey,
    token: &str,
    op: &Op,
    now_ms: i64,
    shards: u32,
    indexed: bool,
) -> (Vec<TransactWriteItem>, Vec<String>) {
    let mut items: Vec<TransactWriteItem> =
        op.writes.iter().map(|w| super::item::transact(table, &stamped(key, w))).collect();
    let mut outbox = Vec::new();
    for msg in &op.outbox {
        let (pk, put) = outbox_put(table, key, msg, token, now_ms, shards, indexed);
        items.push(put);
        outbox.push(pk);
    }
    (items, outbox)
}

/// An op that goes as one conditional request (one write, or one outbox
/// item), as the transaction item it would be, with its outbox ids.
pub(crate) fn single(
    table: &str,
    key: &EventKey,
    token: &str,
    op: &Op,
    now_ms: i64,
    shards: u32,
) -> Option<(TransactWriteItem, Vec<String>)> {
    match (op.writes.as_slice(), op.outbox.as_slice()) {
        ([w], []) if super::item::alone(w) => Some((super::item::transact(table, &stamped(key, w)), Vec::new())),
        ([], [msg]) => {
            let (pk, put) = outbox_put(table, key, msg, token, now_ms, shards, false);
            Some((put, vec![pk]))
        }
        _ => None,
    }
}

/// An op of one put and its notifications: the put goes first on its own,
/// then each notification on its own (see docs/architecture.md "The
/// commit"). Its put, stamped, and the notifications' items and ids.
pub(crate) fn put_then_notify(
    table: &str,
    key: &EventKey,
    token: &str,
    op: &Op,
    now_ms: i64,
    shards: u32,
) -> Option<(TransactWriteItem, Vec<(String, TransactWriteItem)>)> {
    match op.writes.as_slice() {
        [w] if matches!(w.action, crate::projection::Action::Put(_)) && !op.outbox.is_empty() => Some((
            super::item::transact(table, &stamped(key, w)),
            op.outbox.iter().map(|m| outbox_put(table, key, m, token, now_ms, shards, false)).collect(),
        )),
        _ => None,
    }
}

/// What a cancelled op transaction means: a condition failed (unless the
/// item it met is this event's own put: then the op was written before, by
/// us), or contention. `met`: the items the refused conditions met.
pub(crate) fn op_cancelled(codes: &[&str], met: &[Option<Item>], key: &EventKey) -> Result<Applied, PortError> {
    if codes.contains(&"ConditionalCheckFailed") {
        let refused = codes.iter().zip(met.iter().chain(std::iter::repeat(&None)));
        if refused.filter(|(c, _)| **c == "ConditionalCheckFailed").all(|(_, m)| ours(m.as_ref(), key)) {
            return Ok(Applied::Written { outbox: Vec::new() });
        }
        return Ok(Applied::Conflict);
    }
    if let Some(reason) = codes.iter().find(|c| matches!(**c, "ValidationError" | "ItemCollectionSizeLimitExceeded")) {
        return Err(PortError::Caller {
            service: "dynamodb",
            code: format!("TransactionCanceled:{reason}"),
            message: format!("an op's transaction was cancelled: {}", codes.join(", ")),
        });
    }
    if codes.is_empty() {
        return Err(PortError::Unavailable {
            service: "dynamodb",
            message: "transaction cancelled without reasons".into(),
        });
    }
    Ok(Applied::Contention)
}

/// What a cancelled commit means, from the cancellation reasons' codes (one
/// per item; the completion marker last): the fence failed, or these ops'
/// conditions, or contention.
pub(crate) fn commit_cancelled(codes: &[&str], owner: &[usize]) -> Result<CommitResult, PortError> {
    let code = |i: usize| codes.get(i).copied().unwrap_or("None");
    let fence_index = owner.len();
    if code(fence_index) == "ConditionalCheckFailed" {
        return Ok(CommitResult::Fenced);
    }
    let mut conflicts: Vec<usize> =
        (0..owner.len()).filter(|i| code(*i) == "ConditionalCheckFailed").map(|i| owner[i]).collect();
    conflicts.dedup();
    if !conflicts.is_empty() {
        return Ok(CommitResult::Conflicts(conflicts));
    }
    // A validation reason: the same transaction is refused again.
    if let Some(reason) = codes.iter().find(|c| matches!(**c, "ValidationError" | "ItemCollectionSizeLimitExceeded")) {
        return Err(PortError::Caller {
            service: "dynamodb",
            code: format!("TransactionCanceled:{reason}"),
            message: format!("the commit transaction was cancelled: {}", codes.join(", ")),
        });
    }
    if codes.is_empty() {
        // No reasons given: we cannot tell which item failed.
        return Err(PortError::Unavailable {
            service: "dynamodb",
            message: "transaction cancelled without reasons".into(),
        });
    }
    Ok(CommitResult::Contention)
}

/// Whether a refused exit from PROCESSING met our own exit (our retried
/// update after a lost acknowledgement: its transition token is ours).
pub(crate) fn left_by(met: Option<&super::Item>, token: &str) -> bool {
    met.and_then(work_record).is_some_and(|r| r.transition_token.as_deref() == Some(token))
}

/// A history entry (`sk = hist#<time>#<id>`): evidence, not state.
pub(crate) fn history_item(
    key: &EventKey,
    kind: &str,
    detail: &str,
    now_ms: i64,
    id: &str,
    retention_days: u32,
) -> super::Item {
    HashMap::from([
        (attr::PK.to_owned(), s(key.as_str())),
        (attr::SK.to_owned(), s(format!("hist#{now_ms:013}#{}", &id[..8.min(id.len())]))),
        ("kind".to_owned(), s(kind)),
        ("detail".to_owned(), s(cond::bounded(detail))),
        ("at".to_owned(), n(now_ms)),
        (attr::EXPIRES_AT.to_owned(), n(expires_at(now_ms, retention_days))),
    ])
}

impl WorkLedger for DynamoLedger {
    async fn keep_for_sweep(&self, id: &str, shard: u32, at_ms: i64) -> Result<(), PortError> {
        let update = cond::outbox_index(&super::outbox::outbox_partition(shard), at_ms);
        self.conditional(id, super::outbox::OUTBOX_SK, update, false).await.map(|_| ())
    }

    fn shards(&self) -> u32 {
        DynamoLedger::shards(self)
    }

    async fn lease(&self, key: &EventKey, token: &str, now_ms: i64, lease_ms: i64) -> Result<LeaseResult, PortError> {
        let update = cond::lease(token, now_ms, lease_ms, key.shard(self.shards()));
        match self.conditional(key.as_str(), META_SK, update, true).await? {
            Written::Applied(new) => {
                new.as_ref().and_then(work_record).map(|r| LeaseResult::Leased(Box::new(r))).ok_or_else(|| {
                    PortError::Unavailable { service: "dynamodb", message: "leased record is malformed".into() }
                })
            }
            Written::Refused(met) => Ok(WorkRecord::lease_refused(met.as_ref().and_then(work_record), token, now_ms)),
        }
    }

    async fn payload(&self, key: &EventKey, hash: &str) -> Result<Option<Vec<u8>>, PortError> {
        let item = self.read_item(key.as_str(), &payload_sk(hash)).await?;
        match item.as_ref().and_then(super::payload::body) {
            Some(body) => Ok(Some(body)),
            // Too large for an item: in S3.
            None => self.external_payload(key, hash).await,
        }
    }

    async fn apply(&self, key: &EventKey, token: &str, op: &Op, now_ms: i64) -> Result<Applied, PortError> {
        if let Some((item, outbox)) = single(self.table(), key, token, op, now_ms, self.shards()) {
            return Ok(match super::item::write_alone(self.client(), &item).await? {
                None => Applied::Written { outbox },
                Some(met) if ours(met.as_ref(), key) => Applied::Written { outbox },
                Some(_) => {
                    // A notification of an attempt that died before it sent it.
                    if let ([], [msg]) = (op.writes.as_slice(), op.outbox.as_slice())
                        && msg.delivery.is_none()
                    {
                        let id = crate::message::outbox_id(key.as_str(), &msg.action);
                        self.keep_for_sweep(&id, key.shard(self.shards()), now_ms + DISPATCH_LEASE_MS).await?;
                    }
                    Applied::Conflict
                }
            });
        }
        if let Some((put, notes)) = put_then_notify(self.table(), key, token, op, now_ms, self.shards()) {
            if let Some(met) = super::item::write_alone(self.client(), &put).await? {
                if !ours(met.as_ref(), key) {
                    return Ok(Applied::Conflict);
                }
            }
            // Refused: written by an earlier attempt that died before it
            // sent it: into the index unless sent (the sweep takes it over
            // once that attempt's claim lapses).
            let mut outbox = Vec::new();
            for (id, item) in notes {
                if super::item::write_alone(self.client(), &item).await?.is_none() {
                    outbox.push(id);
                } else {
                    self.keep_for_sweep(&id, key.shard(self.shards()), now_ms + DISPATCH_LEASE_MS).await?;
                }
            }
            return Ok(Applied::Written { outbox });
        }
        let (items, outbox) = op_items(self.table(), key, token, op, now_ms, self.shards(), false);
        if items.is_empty() {
            return Ok(Applied::Written { outbox });
        }
        let result = self
            .client()
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(self.ambient.token())
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Applied::Written { outbox }),
            Err(e) => e,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancel)) = err.as_service_error() else {
            return Err(port_error("dynamodb", &err));
        };
        let codes: Vec<&str> = cancel.cancellation_reasons().iter().map(|r| r.code().unwrap_or("None")).collect();
        let met: Vec<Option<Item>> = cancel.cancellation_reasons().iter().map(|r| r.item().cloned()).collect();
        op_cancelled(&codes, &met, key)
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
        if ops.iter().all(|op| op.writes.is_empty() && op.outbox.is_empty()) {
            // The completion alone: one conditional update.
            let update = cond::complete(token, outcome, subject, now_ms, key.shard(self.shards()));
            return Ok(match self.conditional(key.as_str(), META_SK, update, false).await? {
                Written::Applied(_) => CommitResult::Committed { outbox: Vec::new() },
                Written::Refused(_) => CommitResult::Fenced,
            });
        }
        let (items, owner, outbox) =
            commit_items(self.table(), key, token, ops, outcome, subject, now_ms, self.shards())?;
        // The SDK's retry of this call reuses the token; drawn from the
        // ledger's entropy (the SDK would draw a random one itself).
        let result = self
            .client()
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(self.ambient.token())
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(CommitResult::Committed { outbox }),
            Err(e) => e,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancel)) = err.as_service_error() else {
            return Err(port_error("dynamodb", &err));
        };
        let codes: Vec<&str> = cancel.cancellation_reasons().iter().map(|r| r.code().unwrap_or("None")).collect();
        commit_cancelled(&codes, &owner)
    }

    async fn completed_by(&self, key: &EventKey) -> Result<Option<String>, PortError> {
        Ok(self.read_record(key).await?.and_then(|r| r.completed_token))
    }

    async fn leave(&self, key: &EventKey, token: &str, exit: &Exit<'_>, now_ms: i64) -> Result<bool, PortError> {
        let update = cond::leave(token, exit, now_ms, key.shard(self.shards()));
        match self.conditional(key.as_str(), META_SK, update, false).await? {
            Written::Applied(_) => Ok(true),
            Written::Refused(met) => Ok(left_by(met.as_ref(), token)),
        }
    }

    async fn wake(&self, key: &EventKey, now_ms: i64) -> Result<Option<String>, PortError> {
        let update = cond::wake(GAP, now_ms, key.shard(self.shards()));
        let tenant = |r: &Item| super::get_s(r, attr::TENANT).unwrap_or_default().to_owned();
        Ok(self.conditional_new(key.as_str(), META_SK, update).await?.map(|new| tenant(&new)))
    }

    /// Appends an entry to the record's history (`sk = hist#<ms>#<id>`), shown
    /// by `hookledger show`. Kept as long as identities are.
    async fn append_history(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) -> Result<(), PortError> {
        let item = history_item(key, kind, detail, now_ms, &self.ambient.entropy.token_simple(), self.retention_days);
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn register_waiter(
        &self,
        at: &Position,
        key: &EventKey,
        expires_at: i64,
        look_at: Option<i64>,
    ) -> Result<(), PortError> {
        let partition = super::due_partition(crate::ledger::DuePartition::Waiters, key.shard(self.shards()));
        let due = look_at.map(|t| (partition, t));
        let item = crate::projection::sequence::waiter_item(at, key, expires_at, due);
        // Idempotent: a repeat writes the same item.
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(super::item::item_to_sdk(&item)))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }

    async fn waiter(&self, at: &Position) -> Result<Option<EventKey>, PortError> {
        let item = self.read_item(&at.stream, &waiter_sk(at.seq)).await?;
        Ok(item.as_ref().and_then(|i| super::get_s(i, "event_key")).and_then(EventKey::from_stored))
    }

    async fn predecessor_applied(&self, at: &Position) -> Result<bool, PortError> {
        let state = self.read_item(&at.stream, STATE_SK).await?;
        Ok(super::due::predecessor_committed(state.as_ref(), at.seq))
    }
}

#[cfg(test)]
mod caller_tests {
    use super::*;

    #[test]
    fn a_commit_cancelled_for_a_validation_reason_is_a_caller_error() {
        let got = commit_cancelled(&["None", "ValidationError", "None"], &[0, 1]);
        assert!(
            matches!(got, Err(PortError::Caller { ref code, .. }) if code == "TransactionCanceled:ValidationError"),
            "{got:?}"
        );
        assert!(matches!(
            commit_cancelled(&["None", "TransactionConflict", "None"], &[0, 1]),
            Ok(CommitResult::Contention)
        ));
        assert!(matches!(
            commit_cancelled(&["None", "None", "ConditionalCheckFailed"], &[0, 1]),
            Ok(CommitResult::Fenced)
        ));
    }
}
