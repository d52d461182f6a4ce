//! The processor's transitions on the ledger record, one conditional
//! expression each (design §4):
//!
//! ```text
//! lease     RECEIVED | RETRYABLE (due) | PROCESSING (lease expired) → PROCESSING(token, expiry, attempts+1)
//! commit    PROCESSING(token) → PROCESSED   + projection writes + outbox items, one transaction
//! retry     PROCESSING(token) → RETRYABLE(next_attempt_at)           (+1 failure if business logic failed)
//! dead      PROCESSING(token) → DEAD(reason)
//! park      PROCESSING(token) → PARKED(reason)
//! wake      RETRYABLE(gap) | PARKED(gap) → RETRYABLE, due now       (its predecessor committed)
//! ```
//!
//! Every transition out of PROCESSING is conditioned on the lease token
//! (fencing): a worker whose lease was taken over can neither mutate nor
//! complete. Every one also lets its own retry recognise itself: the SDK
//! retries a request whose response was lost, and the retry fails its
//! condition against the write it already made. The lease compares the
//! returned record's `lease_owner`, the exits from PROCESSING compare its
//! `transition_token`, and the commit compares its `completed_token`, with
//! this invocation's token; a match is success, never "busy" or "fenced".
//!
//! `attempts` counts leases (evidence); `failures` counts business failures
//! (the attempt budget). `window_start` is set by the first lease after
//! receipt, replay or wake: the time bounds on gaps and transient faults
//! count from it.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use super::outbox::outbox_put;
use super::{DynamoLedger, META_SK, attr, payload_sk};
use crate::adapters::port_error;
use crate::identity::EventKey;
use crate::ledger::{PortError, Status};
use crate::policy::DEFAULT_RETENTION_DAYS;
use crate::projection::Op;

/// Longest error message kept on a record.
pub const MAX_ERROR_LEN: usize = 300;

/// Business failures recorded on the record (the attempt budget).
pub const FAILURES: &str = "failures";
/// Start of the window the time bounds count from.
pub const WINDOW_START: &str = "window_start";
/// The token of the invocation that last left PROCESSING.
pub const TRANSITION_TOKEN: &str = "transition_token";
/// `error_code` of a record deferred on a sequence gap, and `park_reason` of
/// one parked at the gap bound.
pub const GAP: &str = "gap";

/// The record fields the processor works from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRecord {
    pub key: EventKey,
    pub status: Status,
    pub provider: String,
    pub endpoint: String,
    pub tenant: String,
    pub event_id: String,
    pub event_type: Option<String>,
    pub payload_hash: String,
    /// Leases taken (evidence; a lease lost to a crash counts here too).
    pub attempts: u32,
    /// Business failures recorded (the attempt budget).
    pub failures: u32,
    pub received_at_ms: i64,
    /// When the current window of the time bounds started (first lease after
    /// receipt, replay or wake).
    pub window_start_ms: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at_ms: Option<i64>,
    pub next_attempt_at_ms: Option<i64>,
    pub completed_token: Option<String>,
    /// The token of the invocation that last moved the record out of PROCESSING.
    pub transition_token: Option<String>,
}

impl WorkRecord {
    /// Start of the window the gap and transient bounds count from.
    pub fn window_start(&self) -> i64 {
        self.window_start_ms.unwrap_or(self.received_at_ms)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseResult {
    Leased(Box<WorkRecord>),
    /// No such record (expired by TTL, or a foreign message).
    Missing,
    /// PROCESSED, DEAD or PARKED: nothing to do.
    Final(Status),
    /// Another worker holds a live lease until then.
    Busy {
        until_ms: i64,
    },
    /// RETRYABLE, not due yet.
    NotDue {
        at_ms: i64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitResult {
    /// Everything committed; these outbox items were written.
    Committed { outbox: Vec<String> },
    /// These ops' conditions failed (indices into the ops given).
    Conflicts(Vec<usize>),
    /// The lease token no longer matches: another worker owns the record.
    Fenced,
    /// DynamoDB reported contention or throttling inside the transaction.
    Contention,
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn bounded(msg: &str) -> String {
    let mut end = msg.len().min(MAX_ERROR_LEN);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    msg[..end].to_owned()
}

pub fn work_record(item: &HashMap<String, AttributeValue>) -> Option<WorkRecord> {
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
    })
}

impl DynamoLedger {
    fn meta_key(key: &EventKey) -> HashMap<String, AttributeValue> {
        HashMap::from([(attr::PK.to_owned(), s(key.as_str())), (attr::SK.to_owned(), s(META_SK))])
    }

    /// Reads the record (strongly consistent).
    pub async fn read_record(&self, key: &EventKey) -> Result<Option<WorkRecord>, PortError> {
        let out = self
            .client()
            .get_item()
            .table_name(self.table())
            .set_key(Some(Self::meta_key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(out.item.as_ref().and_then(work_record))
    }

    /// Takes the lease if the record is leasable now.
    pub async fn lease(
        &self,
        key: &EventKey,
        token: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<LeaseResult, PortError> {
        // Timeline guarded: two workers receive the same key (duplicate
        // message, redelivery, reconciler re-drive); exactly one update
        // passes. A worker that crashed holds an expired lease: the next one
        // takes over and the crashed one's commit will fail the fence. Our
        // own lease whose response was lost fails the condition on the SDK's
        // retry: the returned record names us as lease owner, so it is ours
        // (no attempt burned, not "busy").
        let result = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(Self::meta_key(key)))
            .update_expression(
                "SET #st = :processing, lease_owner = :tok, lease_expires_at = :exp, due_at = :exp, \
                 last_attempt_at = :now, st_shard = :stp, window_start = if_not_exists(window_start, :now) \
                 ADD attempts :one",
            )
            .condition_expression(
                "attribute_exists(pk) AND (#st = :received \
                 OR (#st = :retryable AND next_attempt_at <= :now) \
                 OR (#st = :processing AND lease_expires_at < :now))",
            )
            .expression_attribute_names("#st", attr::STATUS)
            .expression_attribute_values(":processing", s(Status::Processing.as_str()))
            .expression_attribute_values(":received", s(Status::Received.as_str()))
            .expression_attribute_values(":retryable", s(Status::Retryable.as_str()))
            .expression_attribute_values(":tok", s(token))
            .expression_attribute_values(":exp", n(now_ms + lease_ms))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":stp", s(self.status_shard(Status::Processing, key)))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let old = match result {
            Ok(out) => {
                return out
                    .attributes
                    .as_ref()
                    .and_then(work_record)
                    .map(|r| LeaseResult::Leased(Box::new(r)))
                    .ok_or_else(|| PortError::Unavailable {
                        service: "dynamodb",
                        message: "leased record is malformed".into(),
                    });
            }
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => match c.item() {
                    Some(item) => work_record(item),
                    None => self.read_record(key).await?,
                },
                _ => return Err(port_error("dynamodb", &e)),
            },
        };
        Ok(match old {
            None => LeaseResult::Missing,
            Some(r) if r.status == Status::Processing && r.lease_owner.as_deref() == Some(token) => {
                LeaseResult::Leased(Box::new(r))
            }
            Some(r) if r.status.is_terminal() => LeaseResult::Final(r.status),
            Some(r) if r.status == Status::Processing => {
                LeaseResult::Busy { until_ms: r.lease_expires_at_ms.unwrap_or(now_ms) }
            }
            Some(r) if r.status == Status::Retryable => {
                LeaseResult::NotDue { at_ms: r.next_attempt_at_ms.unwrap_or(now_ms) }
            }
            // RECEIVED fails only if it changed between our two reads: try again soon.
            Some(_) => LeaseResult::Busy { until_ms: now_ms },
        })
    }

    pub async fn payload(&self, key: &EventKey, hash: &str) -> Result<Option<Vec<u8>>, PortError> {
        let out = self
            .client()
            .get_item()
            .table_name(self.table())
            .key(attr::PK, s(key.as_str()))
            .key(attr::SK, s(payload_sk(hash)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(out.item.and_then(|i| i.get(attr::BODY).and_then(|b| b.as_b().ok()).map(|b| b.as_ref().to_vec())))
    }

    /// Commits the ops, their outbox items and the completion marker in one
    /// transaction conditioned on this lease token.
    pub async fn commit(
        &self,
        key: &EventKey,
        token: &str,
        ops: &[Op],
        outcome: &str,
        subject: Option<&str>,
        now_ms: i64,
    ) -> Result<CommitResult, PortError> {
        let shards = self.shards();
        let mut items: Vec<TransactWriteItem> = Vec::new();
        let mut owner: Vec<usize> = Vec::new();
        let mut outbox = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            for w in &op.writes {
                items.push(w.clone());
                owner.push(i);
            }
            for msg in &op.outbox {
                let (pk, put) = outbox_put(self.table(), key, msg, now_ms, shards);
                items.push(put);
                owner.push(i);
                outbox.push(pk);
            }
        }
        let subject_set = if subject.is_some() { ", subject = :subj" } else { "" };
        let mut completion = Update::builder()
            .table_name(self.table())
            .set_key(Some(Self::meta_key(key)))
            .update_expression(format!(
                "SET #st = :processed, outcome = :o, processed_at = :now, completed_token = :tok, \
                 st_shard = :stdone{subject_set} REMOVE lease_owner, lease_expires_at, due_shard, due_at, next_attempt_at"
            ))
            .expression_attribute_values(":stdone", s(self.status_shard(Status::Processed, key)));
        if let Some(subj) = subject {
            completion = completion.expression_attribute_values(":subj", s(subj));
        }
        let completion = completion
            .condition_expression("#st = :processing AND lease_owner = :tok")
            .expression_attribute_names("#st", attr::STATUS)
            .expression_attribute_values(":processed", s(Status::Processed.as_str()))
            .expression_attribute_values(":processing", s(Status::Processing.as_str()))
            .expression_attribute_values(":o", s(outcome))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":tok", s(token))
            .build()
            .map_err(|e| PortError::Unavailable { service: "dynamodb", message: e.to_string() })?;
        items.push(TransactWriteItem::builder().update(completion).build());

        let result = self.client().transact_write_items().set_transact_items(Some(items)).send().await;
        let err = match result {
            Ok(_) => return Ok(CommitResult::Committed { outbox }),
            Err(e) => e,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancel)) = err.as_service_error() else {
            return Err(port_error("dynamodb", &err));
        };
        let reasons = cancel.cancellation_reasons();
        let code = |i: usize| reasons.get(i).and_then(|r| r.code()).unwrap_or("None");
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
        if reasons.is_empty() {
            // No reasons given: we cannot tell which item failed.
            return Err(PortError::Unavailable {
                service: "dynamodb",
                message: "transaction cancelled without reasons".into(),
            });
        }
        Ok(CommitResult::Contention)
    }

    /// `Ok(true)`: this invocation's transition is stored (now, or by the
    /// earlier try whose response was lost). `Ok(false)`: fenced.
    async fn leave_processing(
        &self,
        key: &EventKey,
        token: &str,
        to: Status,
        set: &str,
        remove: &str,
        values: Vec<(&str, AttributeValue)>,
    ) -> Result<bool, PortError> {
        // Timeline guarded: our lease expired while we stalled and another
        // worker took the record over: the token no longer matches, we are
        // fenced. Or our own update committed but its response was lost and
        // the SDK retried it: the retry fails the condition against our own
        // write, and the returned record carries our token as
        // `transition_token` (each invocation leaves PROCESSING at most once,
        // so the token names exactly this transition): success, not fenced.
        let mut req = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(Self::meta_key(key)))
            .update_expression(format!(
                "SET {set}, st_shard = :stnext, transition_token = :tok REMOVE lease_owner, lease_expires_at{remove}"
            ))
            .condition_expression("#st = :processing AND lease_owner = :tok")
            .expression_attribute_names("#st", attr::STATUS)
            .expression_attribute_values(":processing", s(Status::Processing.as_str()))
            .expression_attribute_values(":stnext", s(self.status_shard(to, key)))
            .expression_attribute_values(":tok", s(token))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        for (k, v) in values {
            req = req.expression_attribute_values(k, v);
        }
        let old = match req.send().await {
            Ok(_) => return Ok(true),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => match c.item() {
                    Some(item) => work_record(item),
                    None => self.read_record(key).await?,
                },
                _ => return Err(port_error("dynamodb", &e)),
            },
        };
        Ok(old.is_some_and(|r| r.transition_token.as_deref() == Some(token)))
    }

    /// PROCESSING → RETRYABLE after an infrastructure fault or a gap (the
    /// attempt budget is not spent); `Ok(false)` if fenced.
    pub async fn retry(
        &self,
        key: &EventKey,
        token: &str,
        next_at_ms: i64,
        code: &str,
        message: &str,
    ) -> Result<bool, PortError> {
        self.to_retryable(key, token, next_at_ms, code, message, false).await
    }

    /// PROCESSING → RETRYABLE after a business failure: `failures + 1`;
    /// `Ok(false)` if fenced.
    pub async fn retry_after_failure(
        &self,
        key: &EventKey,
        token: &str,
        next_at_ms: i64,
        code: &str,
        message: &str,
    ) -> Result<bool, PortError> {
        self.to_retryable(key, token, next_at_ms, code, message, true).await
    }

    async fn to_retryable(
        &self,
        key: &EventKey,
        token: &str,
        next_at_ms: i64,
        code: &str,
        message: &str,
        count_failure: bool,
    ) -> Result<bool, PortError> {
        let mut values = vec![
            (":retryable", s(Status::Retryable.as_str())),
            (":next", n(next_at_ms)),
            (":code", s(code)),
            (":msg", s(bounded(message))),
        ];
        let set = if count_failure {
            values.extend([(":zero", n(0)), (":one", n(1))]);
            "#st = :retryable, next_attempt_at = :next, due_at = :next, error_code = :code, error_message = :msg, \
             failures = if_not_exists(failures, :zero) + :one"
        } else {
            "#st = :retryable, next_attempt_at = :next, due_at = :next, error_code = :code, error_message = :msg"
        };
        self.leave_processing(key, token, Status::Retryable, set, "", values).await
    }

    /// A gap closed: the record waiting on it (RETRYABLE, deferred by `gap`;
    /// or PARKED at the gap bound) becomes RETRYABLE and due now, with a new
    /// time window. `Ok(false)`: it was not waiting (already applied, in
    /// flight, or waiting for something else).
    pub async fn wake(&self, key: &EventKey, now_ms: i64) -> Result<bool, PortError> {
        // Timeline guarded: the waiter may be anywhere by now. Only a record
        // still waiting on the gap is touched; one in flight (PROCESSING)
        // checks the stream itself after it leaves PROCESSING, so it cannot
        // miss the commit that made this call. A retry of this update after
        // a lost response meets a RETRYABLE record still marked `gap` and
        // writes the same values again.
        let result = self
            .client()
            .update_item()
            .table_name(self.table())
            .set_key(Some(Self::meta_key(key)))
            .update_expression(
                "SET #st = :retryable, st_shard = :str, next_attempt_at = :now, due_at = :now, due_shard = :ds, \
                 woken_at = :now REMOVE window_start",
            )
            .condition_expression(
                "attribute_exists(pk) AND ((#st = :retryable AND error_code = :gap) \
                 OR (#st = :parked AND park_reason = :gap))",
            )
            .expression_attribute_names("#st", attr::STATUS)
            .expression_attribute_values(":retryable", s(Status::Retryable.as_str()))
            .expression_attribute_values(":parked", s(Status::Parked.as_str()))
            .expression_attribute_values(":gap", s(GAP))
            .expression_attribute_values(":str", s(self.status_shard(Status::Retryable, key)))
            .expression_attribute_values(":ds", s(super::due_shard(key.shard(self.shards()))))
            .expression_attribute_values(":now", n(now_ms))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(|se| se.is_conditional_check_failed_exception()) => Ok(false),
            Err(e) => Err(port_error("dynamodb", &e)),
        }
    }

    /// PROCESSING → DEAD (terminal, out of the due index); `Ok(false)` if fenced.
    pub async fn dead(
        &self,
        key: &EventKey,
        token: &str,
        reason: &str,
        message: &str,
        now_ms: i64,
    ) -> Result<bool, PortError> {
        self.leave_processing(
            key,
            token,
            Status::Dead,
            "#st = :dead, dead_reason = :reason, error_message = :msg, dead_at = :now",
            ", due_shard, due_at, next_attempt_at",
            vec![
                (":dead", s(Status::Dead.as_str())),
                (":reason", s(reason)),
                (":msg", s(bounded(message))),
                (":now", n(now_ms)),
            ],
        )
        .await
    }

    /// PROCESSING → PARKED (unknown subject; no mutation); `Ok(false)` if fenced.
    pub async fn park(
        &self,
        key: &EventKey,
        token: &str,
        reason: &str,
        subject: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, PortError> {
        let mut values =
            vec![(":parked", s(Status::Parked.as_str())), (":reason", s(bounded(reason))), (":now", n(now_ms))];
        let set = match subject {
            Some(subj) => {
                values.push((":subj", s(subj)));
                "#st = :parked, park_reason = :reason, parked_at = :now, subject = :subj"
            }
            None => "#st = :parked, park_reason = :reason, parked_at = :now",
        };
        self.leave_processing(key, token, Status::Parked, set, ", due_shard, due_at, next_attempt_at", values).await
    }

    /// Appends an entry to the record's history (`sk = hist#<ms>#<id>`), shown
    /// by `hookledger show`. Kept as long as identities are.
    pub async fn append_history(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) -> Result<(), PortError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let item = HashMap::from([
            (attr::PK.to_owned(), s(key.as_str())),
            (attr::SK.to_owned(), s(format!("hist#{now_ms:013}#{}", &id[..8]))),
            ("kind".to_owned(), s(kind)),
            ("detail".to_owned(), s(bounded(detail))),
            ("at".to_owned(), n(now_ms)),
            (attr::EXPIRES_AT.to_owned(), n(now_ms / 1000 + i64::from(DEFAULT_RETENTION_DAYS) * 86_400)),
        ]);
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }
}
