//! Every condition expression on ledger records and outbox items, and the
//! index bookkeeping that goes with each status, written once. The actor
//! modules (`claim`, `work`, `operator`, `due`, `outbox`) send these writes
//! and read what a failed condition met; nothing else builds an expression
//! on a ledger record or an outbox item.
//!
//! The ledger record (`sk = "meta"`), each arrow with its write here and the
//! file that sends it:
//!
//! ```text
//!                      claim (claim.rs)
//!   (new) ───────────────────────────────▶ RECEIVED ◀─┐ payload_stored, take/release_send_lease,
//!                                             │       │ mark_enqueued, note_duplicate, flag_conflict,
//!                                             │       │ adopt_payload (claim.rs); note_redriven (due.rs)
//!                  lease (work.rs)            ▼       │
//!   RECEIVED | RETRYABLE due | PROCESSING expired ──▶ PROCESSING
//!   PROCESSING(token) ── complete (work.rs, in the commit transaction) ──▶ PROCESSED
//!   PROCESSING(token) ── leave Retry (work.rs) ──▶ RETRYABLE(due)
//!   PROCESSING(token) ── leave Dead  (work.rs) ──▶ DEAD
//!   PROCESSING(token) ── leave Park  (work.rs) ──▶ PARKED
//!   RETRYABLE gap | PARKED gap ── wake (work.rs) ──▶ RETRYABLE, due now
//!   DEAD | PARKED ── operator Replay (operator.rs) ──▶ RETRYABLE, due now
//!   RECEIVED | RETRYABLE | DEAD ── operator Park (operator.rs) ──▶ PARKED
//!   DEAD | PARKED ── operator Resolve (operator.rs) ──▶ PROCESSED (resolved)
//!   any due item ── claim_due, reschedule (due.rs) ──▶ same status, next look moved
//!   (new) ── CLAIM of a parked record (backfill.rs) ──▶ PARKED backfill_unrecoverable:<cause>, no payload
//!   PARKED backfill_unrecoverable ── release_parked (backfill.rs; the intake, replay) ──▶ RECEIVED
//!   items of an earlier release ── migrate_attention, migrate_due_partition (migrate.rs) ──▶ today's indexes
//! ```
//!
//! The outbox item (`sk = "outbox"`):
//!
//! ```text
//!   (new) ── outbox_new (outbox.rs, in the commit transaction) ──▶ PENDING(due)
//!   PENDING due | SENDING lapsed ── outbox_claim (outbox.rs) ──▶ SENDING(token)
//!   SENDING(token) ── outbox_sent     (outbox.rs) ──▶ SENT
//!   SENDING(token) ── outbox_back_off (outbox.rs) ──▶ PENDING(due later)
//!   SENDING(token) ── outbox_dead     (outbox.rs) ──▶ DEAD (attention index)
//!   SENDING(token) ── outbox_defer    (outbox.rs) ──▶ PENDING(due later), the attempt given back
//! ```
//!
//! A destination's circuit (`dest#<name>`, `sk = "circuit"`, outbox.rs):
//!
//! ```text
//!   closed ── circuit_failure ──▶ closed, one more failure   ── circuit_open ──▶ open(until)
//!   open, time up ── circuit_probe ──▶ one probe out ── circuit_close ──▶ closed | circuit_open ──▶ open
//! ```
//!
//! Index bookkeeping ([`Update::to`]): every status change sets `#st`; DEAD
//! and PARKED enter the sparse `attention` index (`attn_shard`, `attn_at` =
//! `received_at`), every other status leaves it; DEAD and PARKED leave the
//! sparse `due` index (`due_shard`, `due_at`, `next_attempt_at` removed);
//! the completion (PROCESSED) leaves its entry where it is, which costs the
//! keys-only index nothing (the reconciler's cursor passes it, the TTL
//! removes it with the record); a non-terminal status names its next look
//! (`due_at`, and `due_shard` when it comes back into the index), except
//! the lease, which keeps it; RETRYABLE's `next_attempt_at` is its
//! `due_at`. Every write that places an entry places it at its writer's
//! now or later (the cursor relies on it).
//!
//! Every write lets its own retry recognise itself: the SDK retries a
//! request whose acknowledgement was lost, and the retry fails its condition
//! against the write it already made. Each write therefore stores a token the
//! caller compares with the item the failed condition returns.

use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;

use super::schema::{attention_shard, attr, due_shard, needs_attention};
use crate::ledger::{Exit, OperatorAction, SendLease, Status};

/// Longest error message kept on a record.
pub const MAX_ERROR_LEN: usize = 300;

/// Business failures recorded on the record (the attempt budget).
pub const FAILURES: &str = "failures";
/// Start of the window the time bounds count from.
pub const WINDOW_START: &str = "window_start";
/// The token of the invocation that last left PROCESSING.
pub const TRANSITION_TOKEN: &str = "transition_token";
/// The token of the reconciler run that last claimed a due item.
pub const CLAIM_TOKEN: &str = "redrive_token";
/// The token of the operator command that last changed the record.
pub const OPERATOR_TOKEN: &str = "operator_token";
/// When an operator last replayed the record.
pub const LAST_REPLAY_AT: &str = "last_replay_at";
/// On a record a bulk replay (`replay --filter`) replayed: its run.
pub const REPLAY_RUN: &str = "replay_run";
/// When the record was last woken from a sequence gap.
pub const WOKEN_AT: &str = "woken_at";

/// The condition of the claim's put: the key is new.
pub const CLAIM: &str = "attribute_not_exists(pk)";
/// The condition of the outbox item's put (in the commit transaction).
pub const OUTBOX_NEW: &str = "attribute_not_exists(pk)";

/// Every expression here by name: the two puts' conditions ([`CLAIM`],
/// [`OUTBOX_NEW`]) and each update's [`Update::name`]. The contract suite
/// (`crate::contract`) exercises each one that a port sends; the table
/// upgrade's two (`migrate_*`) are the emulator tests' of `migrate.rs`.
pub const EXPRESSIONS: &[&str] = &[
    "activity_mark",
    "sweep_record",
    "due_cursors",
    "outbox_index",
    "claim",
    "outbox_new",
    "payload_stored",
    "take_send_lease",
    "release_send_lease",
    "adopt_payload",
    "mark_enqueued",
    "note_duplicate",
    "flag_conflict",
    "lease",
    "complete",
    "leave_retry",
    "leave_dead",
    "leave_park",
    "wake",
    "operator_replay",
    "operator_replay_in_run",
    "operator_park",
    "operator_resolve",
    "claim_due",
    "reschedule",
    "note_redriven",
    "outbox_claim",
    "outbox_sent",
    "outbox_back_off",
    "outbox_dead",
    "outbox_revive",
    "outbox_defer",
    "outbox_unwait",
    "circuit_failure",
    "circuit_open",
    "circuit_probe",
    "circuit_close",
    "circuit_reset",
    "rate_grant_now",
    "rate_grant_next",
    "rate_slow",
    "rate_slow_keep",
    "flight_take",
    "flight_land",
    "flight_clean",
    "outbox_hold",
    "release_parked",
    "migrate_attention",
    "migrate_due_partition",
    "waiter_settled",
    "dead_refused",
    "advance_generation",
    "bind_body",
    "take_binding",
    "flag_replay",
    "audit_entry",
    "audit_end",
    "drop_payload",
    "erase_record",
];

/// A conditional update: its expressions and their values.
#[derive(Debug, Clone, Default)]
pub struct Update {
    set: Vec<String>,
    remove: Vec<&'static str>,
    add: Vec<&'static str>,
    delete: Vec<&'static str>,
    pub condition: String,
    values: Vec<(String, AttributeValue)>,
    uses_status: bool,
    /// Its name in [`EXPRESSIONS`].
    name: &'static str,
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Where a status change leaves the record in the `due` index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Stays in the index (same partition), next look at this time.
    At(i64),
    /// Comes back into the index (it had left it), next look at this time.
    Reenter(i64),
    /// Stays in the index as it is (the lease: a record whose lease is
    /// still live when its due time comes is only rescheduled by the
    /// reconciler; not moving it saves two index writes per event).
    Keep,
    /// Leaves the index (terminal statuses).
    Leave,
}

impl Update {
    fn when(name: &'static str, condition: impl Into<String>) -> Self {
        Self { condition: condition.into(), name, ..Self::default() }
    }

    /// Its name in [`EXPRESSIONS`].
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The expression attribute values (`:name` → value).
    pub fn values(&self) -> &[(String, AttributeValue)] {
        &self.values
    }

    /// The expression attribute names (`#st` when the write touches the status).
    pub fn names(&self) -> Vec<(&'static str, &'static str)> {
        if self.uses_status { vec![("#st", attr::STATUS)] } else { Vec::new() }
    }

    fn set(mut self, clause: impl Into<String>) -> Self {
        self.set.push(clause.into());
        self
    }

    fn remove(mut self, name: &'static str) -> Self {
        self.remove.push(name);
        self
    }

    fn add(mut self, clause: &'static str) -> Self {
        self.add.push(clause);
        self
    }

    /// `DELETE p :v`: elements out of a set (the set goes when it is empty).
    fn delete(mut self, clause: &'static str) -> Self {
        self.delete.push(clause);
        self
    }

    fn value(mut self, name: &str, v: AttributeValue) -> Self {
        self.values.push((name.to_owned(), v));
        self
    }

    fn status(mut self) -> Self {
        self.uses_status = true;
        self
    }

    /// The index bookkeeping of a status change, written once (see the module docs).
    pub fn to(mut self, to: Status, shard: u32, due: Due) -> Self {
        self = self.status().set("#st = :bk_to").value(":bk_to", s(to.as_str()));
        // DEAD and PARKED are in the attention index, sorted by receipt;
        // everything else is not.
        self = if needs_attention(to) {
            self.set("attn_shard = :bk_attn").set("attn_at = received_at").value(":bk_attn", s(attention_shard(shard)))
        } else {
            self.remove("attn_shard").remove("attn_at")
        };
        // Terminal statuses leave the due index, but for a completion, which
        // leaves its entry where it is (the reconciler's cursor passes it).
        debug_assert!(
            if to.is_terminal() {
                due == Due::Leave || (to == Status::Processed && due == Due::Keep)
            } else {
                due != Due::Leave
            },
            "terminal statuses leave the due index (a completion may leave its entry in place)"
        );
        match due {
            Due::Leave => self.remove("due_shard").remove("due_at").remove("next_attempt_at"),
            Due::Keep => self,
            Due::At(at) | Due::Reenter(at) => {
                self = self.set("due_at = :bk_due").value(":bk_due", n(at));
                if let Due::Reenter(_) = due {
                    self = self.set("due_shard = :bk_ds").value(":bk_ds", s(due_shard(shard)));
                }
                if to == Status::Retryable {
                    self = self.set("next_attempt_at = :bk_due");
                }
                self
            }
        }
    }

    /// The update expression.
    pub fn expression(&self) -> String {
        let mut out = Vec::new();
        if !self.set.is_empty() {
            out.push(format!("SET {}", self.set.join(", ")));
        }
        if !self.remove.is_empty() {
            out.push(format!("REMOVE {}", self.remove.join(", ")));
        }
        if !self.add.is_empty() {
            out.push(format!("ADD {}", self.add.join(", ")));
        }
        if !self.delete.is_empty() {
            out.push(format!("DELETE {}", self.delete.join(", ")));
        }
        out.join(" ")
    }

    /// Puts the expressions and values on an `UpdateItem` request.
    pub fn apply(self, mut req: UpdateItemFluentBuilder) -> UpdateItemFluentBuilder {
        req = req.update_expression(self.expression()).condition_expression(&self.condition);
        if self.uses_status {
            req = req.expression_attribute_names("#st", attr::STATUS);
        }
        for (k, v) in self.values {
            req = req.expression_attribute_values(k, v);
        }
        req
    }

    /// The same write as a transaction item's update.
    pub fn transact(
        self,
        table: &str,
        key: std::collections::HashMap<String, AttributeValue>,
    ) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
        let mut b = aws_sdk_dynamodb::types::Update::builder()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(self.expression())
            .condition_expression(&self.condition);
        if self.uses_status {
            b = b.expression_attribute_names("#st", attr::STATUS);
        }
        for (k, v) in self.values {
            b = b.expression_attribute_values(k, v);
        }
        b
    }
}

/// Error text kept on a record: bounded (never a payload).
pub fn bounded(msg: &str) -> String {
    let mut end = msg.len().min(MAX_ERROR_LEN);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    msg[..end].to_owned()
}

// ---------------------------------------------------------------- intake (claim.rs)

/// RECEIVED: the payload item of `hash` is written.
pub fn payload_stored(hash: &str) -> Update {
    Update::when("payload_stored", "attribute_exists(pk) AND payload_hash = :h")
        .set("payload_stored = :t")
        .value(":t", AttributeValue::Bool(true))
        .value(":h", s(hash))
}

/// Timeline guarded: the creating delivery is still between its claim and
/// its send when a duplicate arrives; the duplicate must not send too. Only
/// a record never enqueued whose lease is free or expired (its holder failed
/// or crashed) can be taken over. Our own retried update after a lost
/// acknowledgement meets the lease it took (same `send_token`).
pub fn take_send_lease(lease: &SendLease, now_ms: i64) -> Update {
    Update::when(
        "take_send_lease",
        "attribute_exists(pk) AND attribute_not_exists(enqueued_at) \
         AND (attribute_not_exists(send_lease_until) OR send_lease_until < :now)",
    )
    .set("send_token = :tok")
    .set("send_lease_until = :until")
    .value(":tok", s(&lease.token))
    .value(":until", n(lease.until_ms))
    .value(":now", n(now_ms))
}

/// Gives the send lease back, if it is still ours.
pub fn release_send_lease(lease: &SendLease) -> Update {
    Update::when("release_send_lease", "send_token = :tok").remove("send_lease_until").value(":tok", s(&lease.token))
}

/// Timeline guarded: the creating delivery died (or is slow) between its
/// claim and its payload write, and a later delivery of the same fact
/// carries other bytes. Only a record whose first payload is still missing
/// takes ours; if the first lands meanwhile, its own `payload_stored` update
/// (conditioned on the old hash) fails and it answers 503, or ours fails here
/// and the first is kept. A retry of this update after a lost
/// acknowledgement finds our hash stored.
pub fn adopt_payload(old_hash: &str, new_hash: &str, conflict: bool) -> Update {
    let mut u = Update::when(
        "adopt_payload",
        "attribute_exists(pk) AND payload_hash = :old \
         AND (attribute_not_exists(payload_stored) OR payload_stored = :f)",
    );
    if conflict {
        u = u.add("conflicts :one").set("last_conflict_hash = :old").value(":one", n(1));
    }
    u.set("payload_hash = :new")
        .set("payload_stored = :t")
        .value(":old", s(old_hash))
        .value(":new", s(new_hash))
        .value(":t", AttributeValue::Bool(true))
        .value(":f", AttributeValue::Bool(false))
}

/// The intake handed the key to the queue (drops the send lease).
pub fn mark_enqueued(at_ms: i64) -> Update {
    Update::when("mark_enqueued", "attribute_exists(pk)")
        .set("enqueued_at = :at")
        .remove("send_lease_until")
        .value(":at", n(at_ms))
}

/// Counts a duplicate delivery (evidence for the duplicate rate).
pub fn note_duplicate() -> Update {
    Update::when("note_duplicate", "attribute_exists(pk)").add("duplicates :one").value(":one", n(1))
}

/// "Same id, different payload": keeps the first, counts the conflict once.
pub fn flag_conflict(other_hash: &str, at_ms: i64) -> Update {
    Update::when("flag_conflict", "attribute_exists(pk)")
        .add("conflicts :one")
        .add("duplicates :one")
        .set("last_conflict_hash = :h")
        .set("last_conflict_at = :at")
        .value(":one", n(1))
        .value(":h", s(other_hash))
        .value(":at", n(at_ms))
}

// ------------------------------------------- notifications and body bindings (claim.rs)

/// A notification's first record notes that generation `n` exists, and
/// lives as long as it (`expires_at`, the generation's), so it outlives
/// every generation it points to. Never moved back: a late or retried write
/// of an older generation is refused, which its caller takes as done.
pub fn advance_generation(generation: u32, expires_at: i64) -> Update {
    Update::when(
        "advance_generation",
        "attribute_exists(pk) AND (attribute_not_exists(latest_generation) OR latest_generation < :n)",
    )
    .set("latest_generation = :n")
    .set(format!("{} = :exp", super::schema::attr::EXPIRES_AT))
    .value(":n", n(generation))
    .value(":exp", n(expires_at))
}

/// Binds a body to the identity it is recorded under (`body#…`, `sk =
/// "binding"`), unless another identity holds it: created if absent, kept
/// as it is by the same identity (its sender's retry, our own retried
/// write). Refused, it returns the holder.
pub fn bind_body(key: &str, at_ms: i64, expires_at: i64) -> Update {
    Update::when("bind_body", "attribute_not_exists(pk) OR bound_key = :k")
        .set("bound_key = :k")
        .set("bound_at = if_not_exists(bound_at, :at)")
        .set(format!("{} = :exp", super::schema::attr::EXPIRES_AT))
        .value(":k", s(key))
        .value(":at", n(at_ms))
        .value(":exp", n(expires_at))
}

/// Moves a binding whose holder never recorded its event (it died between
/// binding and claiming) to `key`, if `from` still holds it.
pub fn take_binding(from: &str, key: &str, at_ms: i64, expires_at: i64) -> Update {
    Update::when("take_binding", "bound_key = :from")
        .set("bound_key = :k")
        .set("bound_at = :at")
        .set(format!("{} = :exp", super::schema::attr::EXPIRES_AT))
        .value(":from", s(from))
        .value(":k", s(key))
        .value(":at", n(at_ms))
        .value(":exp", n(expires_at))
}

/// A body recorded under this record's identity came again under another
/// (`other_id`): a replay, counted and shown, never recorded.
pub fn flag_replay(other_id: &str, at_ms: i64) -> Update {
    Update::when("flag_replay", "attribute_exists(pk)")
        .add("body_replays :one")
        .set("last_body_replay_id = :id")
        .set("last_body_replay_at = :at")
        .value(":one", n(1))
        .value(":id", s(other_id))
        .value(":at", n(at_ms))
}

// ------------------------------------------------------------ processor (work.rs)

/// Timeline guarded: two workers receive the same key (duplicate message,
/// redelivery, reconciler re-drive); exactly one update passes. A worker
/// that crashed holds an expired lease: the next one takes over and the
/// crashed one's commit fails the fence. Our own lease whose acknowledgement
/// was lost fails the condition on the SDK's retry: the returned record
/// names us as `lease_owner`, so it is ours (no attempt burned, not "busy").
/// The lease does not move the record in the `due` index (an index write
/// saved): when its due time comes and the lease is still live, the
/// reconciler moves it to the lease's end instead of re-driving it.
pub fn lease(token: &str, now_ms: i64, lease_ms: i64, shard: u32) -> Update {
    let expires = now_ms + lease_ms;
    Update::when(
        "lease",
        "attribute_exists(pk) AND (#st = :received \
         OR (#st = :retryable AND next_attempt_at <= :now) \
         OR (#st = :processing AND lease_expires_at < :now))",
    )
    .to(Status::Processing, shard, Due::Keep)
    .set("lease_owner = :tok")
    .set("lease_expires_at = :exp")
    .set("last_attempt_at = :now")
    .set(format!("{WINDOW_START} = if_not_exists({WINDOW_START}, :now)"))
    .add("attempts :one")
    .value(":received", s(Status::Received.as_str()))
    .value(":retryable", s(Status::Retryable.as_str()))
    .value(":processing", s(Status::Processing.as_str()))
    .value(":tok", s(token))
    .value(":exp", n(expires))
    .value(":now", n(now_ms))
    .value(":one", n(1))
}

/// The fence every exit from PROCESSING carries: still ours.
fn fenced(name: &'static str, token: &str) -> Update {
    let fence = if name == "complete" && crate::planted::is(crate::planted::Bug::NoFence) {
        "attribute_exists(pk) OR #st = :processing OR lease_owner = :tok"
    } else {
        "#st = :processing AND lease_owner = :tok"
    };
    Update::when(name, fence)
        .status()
        .value(":processing", s(Status::Processing.as_str()))
        .value(":tok", s(token))
        .remove("lease_owner")
        .remove("lease_expires_at")
}

/// The completion marker, committed in one transaction with the
/// projection's writes and outbox items. Timeline guarded: a worker whose
/// lease was taken over cannot complete (the fence); our own commit whose
/// acknowledgement was lost is recognised by `completed_token`.
pub fn complete(token: &str, outcome: &str, subject: Option<&str>, now_ms: i64, shard: u32) -> Update {
    let mut u = fenced("complete", token)
        .to(Status::Processed, shard, Due::Keep)
        .set("outcome = :o")
        .set("processed_at = :now")
        .set("completed_token = :tok")
        .value(":o", s(outcome))
        .value(":now", n(now_ms));
    if let Some(subj) = subject {
        u = u.set("subject = :subj").value(":subj", s(subj));
    }
    u
}

/// Timeline guarded: our lease expired while we stalled and another worker
/// took the record over: the token no longer matches, we are fenced. Or our
/// own update committed but its acknowledgement was lost and the SDK retried
/// it: the retry fails the condition against our own write, and the
/// returned record carries our token as `transition_token` (each invocation
/// leaves PROCESSING at most once, so the token names exactly this
/// transition): success, not fenced.
pub fn leave(token: &str, exit: &Exit<'_>, now_ms: i64, shard: u32) -> Update {
    let name = match exit {
        Exit::Retry { .. } => "leave_retry",
        Exit::Dead { .. } => "leave_dead",
        Exit::Park { .. } => "leave_park",
    };
    let u = fenced(name, token).set(format!("{TRANSITION_TOKEN} = :tok"));
    match *exit {
        Exit::Retry { next_at_ms, code, message, failure } => {
            let u = u
                .to(Status::Retryable, shard, Due::At(next_at_ms))
                .set("error_code = :code")
                .set("error_message = :msg")
                .value(":code", s(code))
                .value(":msg", s(bounded(message)));
            if failure {
                u.set(format!("{FAILURES} = if_not_exists({FAILURES}, :zero) + :one"))
                    .value(":zero", n(0))
                    .value(":one", n(1))
            } else {
                u
            }
        }
        Exit::Dead { reason, message } => u
            .to(Status::Dead, shard, Due::Leave)
            .set("dead_reason = :reason")
            .set("error_message = :msg")
            .set("dead_at = :now")
            .value(":reason", s(reason))
            .value(":msg", s(bounded(message)))
            .value(":now", n(now_ms)),
        Exit::Park { reason, subject } => {
            let u = u
                .to(Status::Parked, shard, Due::Leave)
                .set("park_reason = :reason")
                .set("parked_at = :now")
                .value(":reason", s(bounded(reason)))
                .value(":now", n(now_ms));
            match subject {
                Some(subj) => u.set("subject = :subj").value(":subj", s(subj)),
                None => u,
            }
        }
    }
}

/// Timeline guarded: the waiter may be anywhere by now. Only a record still
/// waiting on the gap is touched; one in flight (PROCESSING) checks the
/// stream itself after it leaves PROCESSING, so it cannot miss the commit
/// that made this call. A retry of this update after a lost acknowledgement
/// meets a RETRYABLE record still marked `gap` and writes the same values
/// again. A new time window starts at the next lease.
pub fn wake(gap: &str, now_ms: i64, shard: u32) -> Update {
    Update::when(
        "wake",
        "attribute_exists(pk) AND ((#st = :retryable AND error_code = :gap) \
         OR (#st = :parked AND park_reason = :gap))",
    )
    .to(Status::Retryable, shard, Due::Reenter(now_ms))
    .set(format!("{WOKEN_AT} = :now"))
    .remove(WINDOW_START)
    .value(":retryable", s(Status::Retryable.as_str()))
    .value(":parked", s(Status::Parked.as_str()))
    .value(":gap", s(gap))
    .value(":now", n(now_ms))
}

// --------------------------------------------------------- operator (operator.rs)

/// One audited operator transition from the statuses `action` may leave.
/// Timeline guarded: the record may have moved since the operator looked
/// (a worker leased it, another operator acted): the condition names the
/// statuses the action may leave, and a refusal reports the status met. Our
/// own retried update after a lost acknowledgement meets our
/// `operator_token`: done, not refused.
///
/// A replay in a bulk run (`replay --filter`, `run`) marks the record with
/// it (`replay_run`) and is refused on a record that already carries it: an
/// interrupted run, run again, never replays twice what it replayed.
pub fn operator(
    action: OperatorAction,
    operator: &str,
    reason: &str,
    run: Option<&str>,
    token: &str,
    now_ms: i64,
    shard: u32,
) -> Update {
    let from: Vec<String> = (0..action.from().len()).map(|i| format!("#st = :from{i}")).collect();
    let in_run = run.filter(|_| action == OperatorAction::Replay);
    let name = match action {
        OperatorAction::Replay if in_run.is_some() => "operator_replay_in_run",
        OperatorAction::Replay => "operator_replay",
        OperatorAction::Park => "operator_park",
        OperatorAction::Resolve => "operator_resolve",
    };
    let not_this_run = if in_run.is_some() {
        format!(" AND (attribute_not_exists({REPLAY_RUN}) OR {REPLAY_RUN} <> :run)")
    } else {
        String::new()
    };
    let mut u = Update::when(name, format!("attribute_exists(pk) AND ({}){not_this_run}", from.join(" OR ")))
        .set(format!("{OPERATOR_TOKEN} = :optok"))
        .value(":optok", s(token))
        .value(":now", n(now_ms));
    for (i, st) in action.from().iter().enumerate() {
        u = u.value(&format!(":from{i}"), s(st.as_str()));
    }
    if let Some(run) = in_run {
        u = u.set(format!("{REPLAY_RUN} = :run")).value(":run", s(run));
    }
    match action {
        OperatorAction::Replay => not_awaiting_payload(u)
            .to(Status::Retryable, shard, Due::Reenter(now_ms))
            .set("attempts = :zero")
            .set(format!("{FAILURES} = :zero"))
            .set("last_replay_by = :op")
            .set("last_replay_reason = :why")
            .set(format!("{LAST_REPLAY_AT} = :now"))
            .remove(WINDOW_START)
            .add("replays :one")
            .value(":zero", n(0))
            .value(":one", n(1))
            .value(":op", s(operator))
            .value(":why", s(reason)),
        OperatorAction::Park => u
            .to(Status::Parked, shard, Due::Leave)
            .set("park_reason = :why")
            .set("parked_at = :now")
            .value(":why", s(format!("operator {operator}: {reason}"))),
        OperatorAction::Resolve => u
            .to(Status::Processed, shard, Due::Leave)
            .set("outcome = :resolved")
            .set("processed_at = :now")
            .set("resolved_by = :op")
            .set("resolve_reason = :why")
            .value(":resolved", s("resolved"))
            .value(":op", s(operator))
            .value(":why", s(reason)),
    }
}

// ------------------------------------------------------------- reconciler (due.rs)

/// Timeline guarded: two runs at once read the same due item; only the one
/// whose update still finds `due_at = seen` acts, the other's fails. Our own
/// SDK retry after a lost acknowledgement fails the same way, against our
/// write: the item it met carries our token, so we own it. The item stays in
/// the index, due at its next look (if the action fails or the run dies, a
/// later run acts again).
pub fn claim_due(seen: i64, next: i64, token: &str) -> Update {
    Update::when("claim_due", "due_at = :seen")
        .set("due_at = :next")
        .set(format!("{CLAIM_TOKEN} = :tok"))
        .add("redrives :one")
        .value(":next", n(next))
        .value(":seen", n(seen))
        .value(":tok", s(token))
        .value(":one", n(1))
}

/// A waiter pointer leaves the due index: its record was woken, or no
/// longer waits on the gap. Only an existing pointer (a pointer expired by
/// its TTL is not recreated); a repeat meets an item already out of the
/// index and writes the same.
pub fn waiter_settled() -> Update {
    Update::when("waiter_settled", "attribute_exists(event_key)").remove("due_shard").remove("due_at")
}

/// Timeline guarded: another run may have claimed the item since; its token
/// then differs and its schedule stands. A retry of our own update writes
/// the same values again.
pub fn reschedule(token: &str, at: i64) -> Update {
    Update::when("reschedule", format!("{CLAIM_TOKEN} = :tok"))
        .set("due_at = :at")
        .value(":at", n(at))
        .value(":tok", s(token))
}

/// Timeline guarded: the intake or an earlier re-drive may have noted it
/// first (keep the first time), the record may be gone (TTL), and our own
/// retry after a lost acknowledgement meets our own note.
pub fn note_redriven(now_ms: i64) -> Update {
    Update::when("note_redriven", "attribute_exists(pk) AND attribute_not_exists(enqueued_at)")
        .set("enqueued_at = :now")
        .value(":now", n(now_ms))
}

/// Timeline guarded: a record the reconciler could not re-drive because the
/// request itself was refused as invalid (a caller error: the same send is
/// refused again) ends DEAD `caller_error`, but only while no worker holds
/// it (RECEIVED, RETRYABLE, or PROCESSING with its lease expired). A retry
/// after a lost acknowledgement meets a DEAD record: nothing written twice.
pub fn dead_refused(message: &str, now_ms: i64, shard: u32) -> Update {
    Update::when(
        "dead_refused",
        "attribute_exists(pk) AND (#st = :received OR #st = :retryable \
         OR (#st = :processing AND lease_expires_at < :now))",
    )
    .to(Status::Dead, shard, Due::Leave)
    .set("dead_reason = :reason")
    .set("error_message = :msg")
    .set("dead_at = :now")
    .value(":received", s(Status::Received.as_str()))
    .value(":retryable", s(Status::Retryable.as_str()))
    .value(":processing", s(Status::Processing.as_str()))
    .value(":reason", s("caller_error"))
    .value(":msg", s(bounded(message)))
    .value(":now", n(now_ms))
}

// ------------------------------------------------------------ outbox (outbox.rs)

/// Outbox statuses.
pub mod outbox_status {
    pub const PENDING: &str = "PENDING";
    pub const SENDING: &str = "SENDING";
    pub const SENT: &str = "SENT";
    pub const DEAD: &str = "DEAD";
}
use outbox_status::{DEAD, PENDING, SENDING, SENT};

/// Timeline guarded: two dispatchers (the processor that wrote the item and
/// a sweeper, or two sweepers) must not both publish; a dispatcher that died
/// after claiming must not block the item forever (its claim lapses, and
/// `due_at` is set to the lapse so the sweeper looks again then); an item
/// backing off is not taken before it is due; and our own SDK retry after a
/// lost acknowledgement meets our token and continues as the owner.
pub fn outbox_claim(token: &str, now_ms: i64, until_ms: i64) -> Update {
    Update::when(
        "outbox_claim",
        "(#st = :pending AND (attribute_not_exists(due_at) OR due_at <= :now)) \
         OR (#st = :sending AND dispatch_until < :now)",
    )
    .status()
    .set("#st = :sending")
    .set("dispatch_token = :tok")
    .set("dispatch_until = :until")
    .set("due_at = :until")
    .add("dispatch_attempts :one")
    .value(":sending", s(SENDING))
    .value(":pending", s(PENDING))
    .value(":tok", s(token))
    .value(":until", n(until_ms))
    .value(":now", n(now_ms))
    .value(":one", n(1))
}

/// The fence on every write after the claim: still the claim's holder.
fn dispatch_fenced(name: &'static str, token: &str) -> Update {
    Update::when(name, "#st = :sending AND dispatch_token = :tok")
        .status()
        .value(":sending", s(SENDING))
        .value(":tok", s(token))
        .remove("dispatch_until")
}

/// Timeline guarded: only the holder of the claim marks it sent. Our own
/// retry after a lost acknowledgement meets SENT with our token: done. A
/// dispatcher whose claim lapsed and was taken over has published anyway;
/// the new owner publishes again with the same key.
///
/// A sent item is kept for the retention (`expires_at`), as the identity of
/// the event that wrote it is: a redelivery within it still finds the
/// outcome, and nothing is kept forever.
pub fn outbox_sent(token: &str, granted_at: Option<i64>, now_ms: i64, expires_at: i64) -> Update {
    let sent = dispatch_fenced("outbox_sent", token);
    let sent = match granted_at {
        // The rate limit's grant it went under: the evidence of the limit.
        Some(at) => sent.set("granted_at = :granted").value(":granted", n(at)),
        None => sent,
    };
    sent.set("#st = :sent")
        .set("sent_at = :now")
        .set("expires_at = :exp")
        .remove("due_shard")
        .remove("due_at")
        .value(":sent", s(SENT))
        .value(":now", n(now_ms))
        .value(":exp", n(expires_at))
}

/// Timeline guarded: only the claim's holder records its failure; our own
/// retry after a lost acknowledgement meets our token with the outcome
/// already written. A lapsed claim taken over by another dispatcher leaves
/// the item to it.
pub fn outbox_back_off(token: &str, next_at_ms: i64, error: &str, now_ms: i64) -> Update {
    dispatch_fenced("outbox_back_off", token)
        .set("#st = :pending")
        .set("last_error = :err")
        .set("last_failed_at = :now")
        .set("due_at = :next")
        .value(":pending", s(PENDING))
        .value(":err", s(error))
        .value(":now", n(now_ms))
        .value(":next", n(next_at_ms))
}

/// A notification written out of the index (sent before its completion)
/// and not sent: its send failed, or the attempt that wrote it died. Into
/// its shard's outbox partition, due at `at_ms` (the end of the claim it
/// was written with) unless a back-off set its time; the sweep claims it
/// once the claim lapses. Refused, changing nothing: sent, dead, or in the
/// index already (its own retry, or a delivery).
pub fn outbox_index(partition: &str, at_ms: i64) -> Update {
    Update::when(
        "outbox_index",
        "attribute_exists(pk) AND attribute_not_exists(due_shard) AND (#st = :pending OR #st = :sending)",
    )
    .status()
    .set("due_shard = :p")
    .set("due_at = if_not_exists(due_at, :at)")
    .value(":p", s(partition))
    .value(":at", n(at_ms))
    .value(":pending", s(PENDING))
    .value(":sending", s(SENDING))
}

/// Not sent: the destination's circuit is open. PENDING again, moved out of
/// the sweep's partition into its destination's waiting partition
/// (`wait_partition`, ordered by when it began to wait), its home partition
/// kept beside it (`home_due`) for [`outbox_unwait`]; the claim's attempt
/// given back (`ADD -1`): waiting for a destination spends none. Fenced like
/// every write after the claim.
pub fn outbox_defer(token: &str, wait_partition: &str, home_partition: &str, why: &str, now_ms: i64) -> Update {
    dispatch_fenced("outbox_defer", token)
        .set("#st = :pending")
        .set("last_error = :err")
        .set("deferred_at = :now")
        .set("due_shard = :wait")
        .set("home_due = :home")
        .set("due_at = :now")
        .add("dispatch_attempts :back")
        .value(":pending", s(PENDING))
        .value(":err", s(why))
        .value(":now", n(now_ms))
        .value(":wait", s(wait_partition))
        .value(":home", s(home_partition))
        .value(":back", n(-1))
}

/// A waiting delivery, its destination back: into its home partition
/// again (`home_due`), due now, so the sweep finds it when its hand-over is
/// lost. Only while it is still in `wait_partition`: a retry after a lost
/// acknowledgement, or a second drain, meets it moved and writes nothing.
pub fn outbox_unwait(wait_partition: &str, now_ms: i64) -> Update {
    Update::when("outbox_unwait", "due_shard = :wait")
        .set("due_shard = home_due")
        .set("due_at = :now")
        .remove("home_due")
        .value(":wait", s(wait_partition))
        .value(":now", n(now_ms))
}

/// An activity mark (`pk = activity`, `sk = mark#<window>`): this
/// container is about to add or move due entries in the window. Moved
/// forward only; its retry, or another container's mark of the same
/// window, changes nothing that matters (the mark exists).
pub fn activity_mark(now_ms: i64, expires_at_s: i64) -> Update {
    Update::when("activity_mark", "attribute_not_exists(marked_at) OR marked_at < :now")
        .set("marked_at = :now")
        .set("expires_at = :exp")
        .value(":now", n(now_ms))
        .value(":exp", n(expires_at_s))
}

/// Where the records phase has read each shard to (`pk = activity`, `sk =
/// cursors`; see [`crate::ledger::DueCursors`]), unless a later run's are
/// kept already. A shard's place is `[due_at, pk, sk]` under its number;
/// the run's own retry after a lost acknowledgement writes the same again.
pub fn due_cursors(cursors: &crate::ledger::DueCursors) -> Update {
    let places = cursors
        .shards
        .iter()
        .map(|(shard, c)| {
            (shard.to_string(), AttributeValue::L(vec![n(c.due_at_ms), s(c.pk.clone()), s(c.sk.clone())]))
        })
        .collect();
    let mut u = Update::when("due_cursors", "attribute_not_exists(cursors_at) OR cursors_at <= :at")
        .set("cursors_at = :at")
        .set("places = :places")
        .value(":at", n(cursors.at_ms))
        .value(":places", AttributeValue::M(places));
    if let Some(at) = cursors.rewound_at_ms {
        u = u.set("rewound_at = :rw").value(":rw", n(at));
    }
    u
}

/// What a run that read every shard found (`pk = activity`, `sk =
/// sweep`), unless a later run's is kept already.
pub fn sweep_record(sweep: &crate::ledger::Sweep) -> Update {
    Update::when("sweep_record", "attribute_not_exists(swept_at) OR swept_at < :at")
        .set("swept_at = :at")
        .set("quiet = :quiet")
        .set("dead_letters = :dead")
        .set("parked = :parked")
        .set("outbox_dead = :odead")
        .value(":at", n(sweep.at_ms))
        .value(":quiet", AttributeValue::Bool(sweep.quiet))
        .value(":dead", n(sweep.attention.dead_letters))
        .value(":parked", n(sweep.attention.parked))
        .value(":odead", n(sweep.attention.outbox_dead))
}

/// A destination's circuit (`dest#<name>`, `sk = "circuit"`): one more
/// failure in a row. Its own retry after a lost acknowledgement meets its
/// token and is refused (then recognised): a failure counts once.
pub fn circuit_failure(token: &str, now_ms: i64) -> Update {
    Update::when("circuit_failure", "attribute_not_exists(failure_token) OR failure_token <> :tok")
        .set("failure_token = :tok")
        .set("failed_at = :now")
        .add("failures :one")
        .value(":tok", s(token))
        .value(":now", n(now_ms))
        .value(":one", n(1))
}

/// Opens the circuit until `until_ms`, unless it is open now (another
/// dispatcher opened it first). A failed probe reopens it (its time is up).
pub fn circuit_open(token: &str, until_ms: i64, now_ms: i64) -> Update {
    Update::when("circuit_open", "attribute_not_exists(open_until) OR open_until <= :now")
        .set("open_until = :until")
        .set("open_token = :tok")
        .set("opened_at = :now")
        .set("failures = :zero")
        .remove("probe_until")
        .remove("probe_token")
        .value(":until", n(until_ms))
        .value(":tok", s(token))
        .value(":now", n(now_ms))
        .value(":zero", n(0))
}

/// The one probe of an open circuit whose time is up: refused while it is
/// open or while another dispatcher's probe is out.
pub fn circuit_probe(token: &str, until_ms: i64, now_ms: i64) -> Update {
    Update::when("circuit_probe", "open_until <= :now AND (attribute_not_exists(probe_until) OR probe_until <= :now)")
        .set("probe_until = :until")
        .set("probe_token = :tok")
        .value(":until", n(until_ms))
        .value(":tok", s(token))
        .value(":now", n(now_ms))
}

/// The probe `token` holds got through: closed, no failures; refused
/// unless that probe is the one out (a failed probe's reopening, or another
/// probe, came first). Its retry is recognised by `close_token`.
pub fn circuit_close(token: &str, now_ms: i64) -> Update {
    Update::when("circuit_close", "probe_token = :tok")
        .set("failures = :zero")
        .set("closed_at = :now")
        .set("close_token = :tok")
        .remove("open_until")
        .remove("open_token")
        .remove("probe_until")
        .remove("probe_token")
        .value(":zero", n(0))
        .value(":tok", s(token))
        .value(":now", n(now_ms))
}

/// A send (not a probe) got through while the circuit was closed: its
/// failures in a row reset; refused when the circuit was never written
/// (nothing to reset) or is open (another dispatcher opened it since this
/// one read it: only a probe closes it). The same again on a retry.
pub fn circuit_reset(now_ms: i64) -> Update {
    Update::when("circuit_reset", "attribute_exists(failures) AND attribute_not_exists(open_until)")
        .set("failures = :zero")
        .set("closed_at = :now")
        .value(":zero", n(0))
        .value(":now", n(now_ms))
}

/// A destination's rate item (`dest#<name>`, `sk = "rate"`, `outbox::limit`):
/// `next_at` is the earliest time of the next grant (a theoretical arrival
/// time), every grant moves it one step on, so grants are at least one step
/// apart whoever takes them.
///
/// Idle (`next_at` in the past, or no item): the grant is now, the next one
/// step later. Its retry after a lost acknowledgement is refused (the next
/// grant is in the future now) and takes the next slot: a slot wasted,
/// never one too many.
pub fn rate_grant_now(step_ms: i64, now_ms: i64) -> Update {
    Update::when("rate_grant_now", "attribute_not_exists(next_at) OR next_at <= :now")
        .set("next_at = :next")
        .set("granted_at = :now")
        .add("grants :one")
        .value(":now", n(now_ms))
        .value(":next", n(now_ms + step_ms))
        .value(":one", n(1))
}

/// Busy: the grant is the next slot (`next_at`, in the future but within
/// `horizon_ms`), and the one after is a step later. Its retry takes
/// another slot (one wasted, never one too many).
pub fn rate_grant_next(step_ms: i64, horizon_ms: i64, now_ms: i64) -> Update {
    Update::when("rate_grant_next", "next_at > :now AND next_at <= :edge")
        .set("next_at = next_at + :step")
        .set("granted_at = :now")
        .add("grants :one")
        .value(":now", n(now_ms))
        .value(":edge", n(now_ms + horizon_ms))
        .value(":step", n(step_ms))
        .value(":one", n(1))
}

/// The destination throttled us (a 429, or a `Retry-After`): no grant
/// before `resume_ms`, and each step `factor` times longer until
/// `until_ms`. Refused when the next grant is later already (then
/// [`rate_slow_keep`] sets the factor alone). The same write again on a retry.
pub fn rate_slow(resume_ms: i64, factor: u32, until_ms: i64, now_ms: i64) -> Update {
    Update::when("rate_slow", "attribute_not_exists(next_at) OR next_at < :resume")
        .set("next_at = :resume")
        .set("slow_factor = :f")
        .set("slow_until = :until")
        .set("throttled_at = :now")
        .value(":resume", n(resume_ms))
        .value(":f", n(factor))
        .value(":until", n(until_ms))
        .value(":now", n(now_ms))
}

/// [`rate_slow`] when the next grant is later than `resume_ms` already.
pub fn rate_slow_keep(factor: u32, until_ms: i64, now_ms: i64) -> Update {
    Update::when("rate_slow_keep", "attribute_exists(next_at)")
        .set("slow_factor = :f")
        .set("slow_until = :until")
        .set("throttled_at = :now")
        .value(":f", n(factor))
        .value(":until", n(until_ms))
        .value(":now", n(now_ms))
}

/// One send in flight (`flight`: `<until>#<token>`, in the `flights` set),
/// refused while `max` are. Its retry adds the same element again (a
/// set): it counts once, and a refusal that meets it is recognised.
pub fn flight_take(flight: &str, max: u32) -> Update {
    Update::when("flight_take", "attribute_not_exists(flights) OR size(flights) < :max")
        .add("flights :f")
        .value(":f", AttributeValue::Ss(vec![flight.to_owned()]))
        .value(":max", n(max))
}

/// The send landed: out of the set (the same on a retry).
pub fn flight_land(flight: &str) -> Update {
    Update::when("flight_land", "attribute_exists(flights)")
        .delete("flights :f")
        .value(":f", AttributeValue::Ss(vec![flight.to_owned()]))
}

/// Flights whose time is up (their dispatcher died before it landed them) out of the set.
pub fn flight_clean(expired: &[String]) -> Update {
    Update::when("flight_clean", "attribute_exists(flights)")
        .delete("flights :f")
        .value(":f", AttributeValue::Ss(expired.to_vec()))
}

/// A claimed delivery kept claimed until `until_ms`: it waits for its
/// grant (the destination's rate limit) on the delivery queue, and the
/// sweep leaves it alone meanwhile. Fenced on the claim.
pub fn outbox_hold(token: &str, until_ms: i64) -> Update {
    Update::when("outbox_hold", "#st = :sending AND dispatch_token = :tok")
        .status()
        .value(":sending", s(SENDING))
        .value(":tok", s(token))
        .set("dispatch_until = :until")
        .set("due_at = :until")
        .value(":until", n(until_ms))
}

/// As [`outbox_back_off`], but the attempts are exhausted: out of the due
/// index, into the `OUTBOX_DEAD#…` status partition.
pub fn outbox_dead(token: &str, attention_partition: &str, error: &str, now_ms: i64) -> Update {
    dispatch_fenced("outbox_dead", token)
        .set("#st = :dead")
        .set("last_error = :err")
        .set("last_failed_at = :now")
        .set("dead_at = :now")
        .set("attn_shard = :st")
        .set("attn_at = :now")
        .remove("due_shard")
        .remove("due_at")
        .value(":dead", s(DEAD))
        .value(":err", s(error))
        .value(":now", n(now_ms))
        .value(":st", s(attention_partition))
}

/// An operator's replay of a DEAD item (a route's delivery): PENDING, due
/// now in its shard's outbox partition, its retry bound counted from now,
/// who and why kept on it, the replaying run's token too. Timeline guarded:
/// only a DEAD item is replayed. It goes in one transaction with its audit
/// entry: our own retry after a lost acknowledgement finds the entry, and a
/// rerun of the same batch meets PENDING with its run's token (both done).
pub fn outbox_revive(token: &str, due_partition: &str, operator: &str, reason: &str, now_ms: i64) -> Update {
    Update::when("outbox_revive", "#st = :dead")
        .status()
        .set("#st = :pending")
        .set("due_shard = :p")
        .set("due_at = :now")
        .set("created_at = :now")
        .set("revive_token = :tok")
        .set("replayed_by = :who")
        .set("replay_reason = :why")
        .remove("attn_shard")
        .remove("attn_at")
        .remove("dead_at")
        .value(":dead", s(DEAD))
        .value(":pending", s(PENDING))
        .value(":tok", s(token))
        .value(":p", s(due_partition))
        .value(":who", s(operator))
        .value(":why", s(reason))
        .value(":now", n(now_ms))
}

// -------------------------------------------------------------- audit (audit.rs)

/// An audit entry (and its record's copy) is put once: its id is the
/// writing call's token, so a put that finds it is that call's retry.
pub const AUDIT_ENTRY: &str = "attribute_not_exists(pk)";

/// A run's entry completed with its outcome: only an entry that exists and
/// is still `started` (a begin that failed leaves nothing to complete, and
/// an outcome is never overwritten), or that holds this very outcome (our
/// own retry after a lost acknowledgement).
pub fn audit_end(result: &str) -> Update {
    Update::when("audit_end", "attribute_exists(pk) AND (audit_result = :started OR audit_result = :result)")
        .set("audit_result = :result")
        .value(":started", s(crate::audit::STARTED))
        .value(":result", s(result))
}

// ------------------------------------------------------------ upgrade (migrate.rs)

/// A DEAD or PARKED record (or a DEAD outbox item) of an earlier release
/// enters the attention index. Timeline guarded: the item may have moved on
/// since the scan read it (replayed, resolved): only an item still in the
/// status read, and not in the index yet, is touched; a retry of this
/// update finds it there and changes nothing.
pub fn migrate_attention(status: &str, partition: &str, at: i64) -> Update {
    Update::when("migrate_attention", "#st = :st AND attribute_not_exists(attn_shard)")
        .status()
        .set("attn_shard = :p")
        .set("attn_at = :at")
        .value(":st", s(status))
        .value(":p", s(partition))
        .value(":at", n(at))
}

/// An outbox item or entitlement of an earlier release moves from its own
/// partition (`out#NNN`, `ent#NNN`) to its shard's `due#NNN`, due at `at`.
/// Timeline guarded: only while it is still in the partition the scan read
/// (a dispatcher or a reconciler of the earlier release may have moved it);
/// a retry finds it moved and changes nothing.
/// An item of an earlier layout moves to its partition of today's, if it is
/// still where and when the migration read it (a claim or a rewrite since
/// then keeps its own next look; the migration's rerun meets it moved).
pub fn migrate_due_partition(from: &str, seen_at: i64, to: &str, at: i64) -> Update {
    Update::when("migrate_due_partition", "due_shard = :from AND due_at = :seen")
        .set("due_shard = :to")
        .set("due_at = :at")
        .value(":from", s(from))
        .value(":seen", n(seen_at))
        .value(":to", s(to))
        .value(":at", n(at))
}

// ---------------------------------------------------------- backfill (backfill.rs)

/// Where a released record's payload is.
pub enum Placed {
    /// In the record itself (small payloads; set by this write).
    Inline(super::payload::Stored),
    /// In its own item (`sk = payload#<hash>`), written before this write.
    Item,
    /// In S3, written before this write (`payload_in = s3`).
    S3,
}

/// Timeline guarded: a record a backfill parked without its payload
/// (PARKED `backfill_unrecoverable:…`, `payload_stored` false) gets its
/// payload from a webhook delivery of the same identity or from an
/// operator's replay, which fetched it again; both may come at once, and an
/// operator may have resolved it. Only a record still parked that way is
/// released: RECEIVED, back in the `due` index (due after the re-drive
/// grace), out of the attention index, with the releaser's hashes, `via` and
/// send lease, received now (the age of an open record counts from its
/// release) and kept for the retention from now. The payload is stored
/// before (or, inline, by) this write. The loser of a race meets a record
/// no longer parked and changes nothing; our own retried update after a
/// lost acknowledgement meets our `send_token`: released.
pub fn release_parked(event: &crate::ledger::NewEvent, by: &str, placed: Placed) -> Update {
    let due_at = event.received_at_ms + crate::policy::REDRIVE_GRACE_MS;
    let u =
        Update::when("release_parked", "#st = :parked AND begins_with(park_reason, :unrec) AND payload_stored = :f")
            .to(Status::Received, event.shard, Due::Reenter(due_at))
            .set("payload_hash = :h")
            .set("content_hash = :ch")
            .set("payload_stored = :t")
            .set("send_token = :tok")
            .set("send_lease_until = :until")
            .set("via = :via")
            .set("received_at = :now")
            .set("released_at = :now")
            .set("released_by = :by")
            .set(format!("{} = :exp", attr::EXPIRES_AT))
            .remove("park_reason")
            .value(":parked", s(Status::Parked.as_str()))
            .value(":unrec", s(crate::ledger::BACKFILL_UNRECOVERABLE))
            .value(":f", AttributeValue::Bool(false))
            .value(":t", AttributeValue::Bool(true))
            .value(":h", s(&event.payload_hash))
            .value(":ch", s(&event.content_hash))
            .value(":tok", s(&event.send.token))
            .value(":until", n(event.send.until_ms))
            .value(":via", s(event.via.as_str()))
            .value(":now", n(event.received_at_ms))
            .value(":by", s(bounded(by)))
            .value(":exp", n(event.expires_at));
    match placed {
        Placed::Inline(stored) => {
            let u = u
                .set(format!("{} = :body", attr::BODY))
                .value(":body", AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(stored.bytes)));
            match stored.encoding {
                Some(enc) => u.set(format!("{} = :enc", super::payload::ENCODING)).value(":enc", s(enc)),
                None => u,
            }
        }
        Placed::Item => u,
        Placed::S3 => u.set("payload_in = :in").value(":in", s("s3")),
    }
}

/// Replay refuses a record a backfill parked without its payload: made
/// RETRYABLE, it would only fail for want of one. `hookledger replay`
/// fetches it from its source again instead ([`release_parked`]).
fn not_awaiting_payload(u: Update) -> Update {
    let condition = format!(
        "{} AND (attribute_not_exists(park_reason) OR NOT begins_with(park_reason, :unrec)) AND attribute_not_exists({})",
        u.condition,
        attr::ERASED_AT
    );
    Update { condition, ..u }.value(":unrec", s(crate::ledger::BACKFILL_UNRECOVERABLE))
}

/// The payload of a finished record whose endpoint keeps it only until
/// then (`drop_after`): the record's own copy removed and the drop noted
/// (`payload_dropped_at`); `payload_stored` stays, so a later delivery of
/// the event is still a duplicate and never stores it again. Only a
/// PROCESSED record of that policy not dropped yet; our own retry after a
/// lost acknowledgement meets the note ([`dropped`]).
pub fn drop_payload(now_ms: i64) -> Update {
    Update::when(
        "drop_payload",
        "#st = :processed AND payload_policy = :drop AND attribute_not_exists(payload_dropped_at)",
    )
    .status()
    .remove(attr::BODY)
    .remove(super::payload::ENCODING)
    .set("payload_dropped_at = :now")
    .value(":processed", s(Status::Processed.as_str()))
    .value(":drop", s("drop_after"))
    .value(":now", n(now_ms))
}

/// An erased record ([`crate::sealing`], `hookledger erase`): its own
/// copy of the payload and its subject removed, the erasure noted (when,
/// by whom, why). Its identity, status, hashes and `payload_stored` stay,
/// so a later delivery of the event is a duplicate that stores nothing.
/// Only a finished record (PROCESSED, DEAD, PARKED) not erased yet: one in
/// flight would be worked on without its payload. Our own retry after a
/// lost acknowledgement finds its audit entry.
pub fn erase_record(operator: &str, reason: &str, now_ms: i64) -> Update {
    Update::when(
        "erase_record",
        "attribute_exists(pk) AND (#st = :processed OR #st = :dead OR #st = :parked) AND attribute_not_exists(erased_at)",
    )
    .status()
    .remove(attr::BODY)
    .remove(super::payload::ENCODING)
    .remove("subject")
    .set(format!("{} = :now", attr::ERASED_AT))
    .set("erased_by = :op")
    .set("erase_reason = :why")
    .value(":processed", s(Status::Processed.as_str()))
    .value(":dead", s(Status::Dead.as_str()))
    .value(":parked", s(Status::Parked.as_str()))
    .value(":now", n(now_ms))
    .value(":op", s(operator))
    .value(":why", s(reason))
}

/// What a refused [`erase_record`] met: erased already, or not finished.
pub fn erase_refused(met: Option<&std::collections::HashMap<String, AttributeValue>>) -> crate::ledger::Erasure {
    use crate::ledger::Erasure;
    let Some(met) = met.filter(|m| !m.is_empty()) else { return Erasure::Missing };
    if met.contains_key(attr::ERASED_AT) {
        return Erasure::AlreadyErased;
    }
    match met.get(attr::STATUS).and_then(|v| v.as_s().ok()).and_then(|v| Status::parse(v)) {
        Some(st) => Erasure::NotFinished(st),
        None => Erasure::Missing,
    }
}

/// Whether a record a refused [`drop_payload`] met has its payload dropped.
pub fn dropped(met: Option<&std::collections::HashMap<String, AttributeValue>>) -> bool {
    met.is_some_and(|m| m.contains_key(attr::PAYLOAD_DROPPED_AT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_statuses_leave_the_due_index_and_retryable_names_its_next_attempt() {
        let dead = leave("t", &Exit::Dead { reason: "r", message: "m" }, 5, 3).expression();
        assert!(
            dead.contains("#st = :bk_to") && dead.contains("attn_shard = :bk_attn, attn_at = received_at"),
            "{dead}"
        );
        assert!(dead.contains("REMOVE lease_owner, lease_expires_at, due_shard, due_at, next_attempt_at"), "{dead}");
        let retry =
            leave("t", &Exit::Retry { next_at_ms: 9, code: "c", message: "m", failure: true }, 5, 3).expression();
        assert!(retry.contains("due_at = :bk_due") && retry.contains("next_attempt_at = :bk_due"), "{retry}");
        assert!(!retry.contains("due_shard"), "stays in its partition: {retry}");
        let woken = wake("gap", 5, 3).expression();
        assert!(woken.contains("due_shard = :bk_ds") && woken.contains("attn_at, window_start"), "{woken}");
        let resolved = operator(OperatorAction::Resolve, "op", "why", None, "tok", 5, 3).expression();
        assert!(resolved.contains("due_shard, due_at, next_attempt_at"), "{resolved}");
    }

    #[test]
    fn the_lease_does_not_move_the_record_in_any_index() {
        let e = lease("tok", 1_000, 30_000, 0).expression();
        assert!(!e.contains("due_at") && !e.contains("due_shard") && !e.contains("next_attempt_at ="), "{e}");
        assert!(e.contains("REMOVE attn_shard, attn_at"), "not in the attention index: {e}");
    }

    #[test]
    fn dead_and_parked_records_enter_the_attention_index_and_leave_it_when_replayed() {
        let parked = leave("t", &Exit::Park { reason: "r", subject: None }, 5, 7);
        assert!(parked.values.contains(&(":bk_attn".into(), s("attn#007"))));
        let replayed = operator(OperatorAction::Replay, "op", "why", None, "tok", 5, 7).expression();
        assert!(replayed.contains("REMOVE") && replayed.contains("attn_shard, attn_at"), "{replayed}");
        // The completion leaves the attention index and its due entry where
        // it is: no index write for it.
        let processed = complete("t", "applied", None, 5, 7).expression();
        assert!(processed.contains("REMOVE") && processed.contains("attn_shard, attn_at"), "{processed}");
        assert!(!processed.contains("due_shard") && !processed.contains("due_at"), "the entry stays: {processed}");
    }

    #[test]
    fn every_placeholder_used_has_a_value_and_every_value_is_used() {
        let updates = [
            payload_stored("h"),
            take_send_lease(&SendLease { token: "t".into(), until_ms: 1 }, 0),
            release_send_lease(&SendLease { token: "t".into(), until_ms: 1 }),
            adopt_payload("a", "b", true),
            adopt_payload("a", "b", false),
            mark_enqueued(1),
            note_duplicate(),
            flag_conflict("h", 1),
            lease("t", 1, 2, 0),
            complete("t", "applied", Some("cus"), 1, 0),
            complete("t", "applied", None, 1, 0),
            leave("t", &Exit::Retry { next_at_ms: 1, code: "c", message: "m", failure: false }, 1, 0),
            leave("t", &Exit::Retry { next_at_ms: 1, code: "c", message: "m", failure: true }, 1, 0),
            leave("t", &Exit::Dead { reason: "r", message: "m" }, 1, 0),
            leave("t", &Exit::Park { reason: "r", subject: Some("s") }, 1, 0),
            wake("gap", 1, 0),
            operator(OperatorAction::Replay, "o", "r", None, "t", 1, 0),
            operator(OperatorAction::Replay, "o", "r", Some("run"), "t", 1, 0),
            operator(OperatorAction::Park, "o", "r", None, "t", 1, 0),
            operator(OperatorAction::Resolve, "o", "r", None, "t", 1, 0),
            claim_due(1, 2, "t"),
            reschedule("t", 1),
            note_redriven(1),
            outbox_claim("t", 1, 2),
            outbox_sent("t", None, 1, 2),
            outbox_back_off("t", 1, "e", 1),
            outbox_dead("t", "attn#000", "e", 1),
            migrate_attention("DEAD", "attn#001", 5),
            release_parked(&released_event(), "webhook", Placed::Item),
            release_parked(&released_event(), "webhook", Placed::S3),
            release_parked(&released_event(), "operator alice", Placed::Inline(super::super::payload::encode(b"{}"))),
            migrate_due_partition("due#001", 4, "out#001", 5),
        ];
        for u in updates {
            let text = format!("{} {}", u.expression(), u.condition);
            let used: std::collections::BTreeSet<String> = text
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .filter(|w| w.starts_with(':'))
                .map(str::to_owned)
                .collect();
            let given: std::collections::BTreeSet<String> = u.values.iter().map(|(k, _)| k.clone()).collect();
            assert_eq!(used, given, "{text}");
            assert_eq!(u.values.len(), given.len(), "a value given twice: {text}");
            assert_eq!(text.contains("#st"), u.uses_status, "{text}");
        }
    }

    fn released_event() -> crate::ledger::NewEvent {
        let key = crate::identity::EventKey::new("github", "gh", "g-1");
        crate::ledger::NewEvent {
            shard: 3,
            key,
            provider: "github".into(),
            endpoint: "gh".into(),
            tenant: "gh".into(),
            event_id: "g-1".into(),
            event_type: Some("push".into()),
            payload_hash: "h".into(),
            content_hash: "c".into(),
            received_at_ms: 1_000,
            expires_at: 9,
            send: SendLease { token: "tok".into(), until_ms: 2_000 },
            via: crate::ledger::Via::Webhook,
            batch_hash: None,
            kept: None,
            notification: None,
        }
    }

    #[test]
    fn a_record_parked_without_its_payload_is_released_into_the_due_index_and_not_replayed() {
        let u = release_parked(&released_event(), "webhook", Placed::S3);
        let e = u.expression();
        assert!(u.condition.contains("begins_with(park_reason, :unrec) AND payload_stored = :f"), "{}", u.condition);
        assert!(e.contains("due_shard = :bk_ds") && e.contains("due_at = :bk_due"), "back in the due index: {e}");
        assert!(e.contains("attn_shard, attn_at") && e.contains("park_reason"), "out of the attention index: {e}");
        assert!(e.contains("payload_in = :in") && e.contains("send_token = :tok"), "{e}");
        let inline = release_parked(&released_event(), "webhook", Placed::Inline(super::super::payload::encode(b"{}")));
        assert!(inline.expression().contains("body = :body"), "{}", inline.expression());
        let replay = operator(OperatorAction::Replay, "op", "why", None, "tok", 5, 3);
        assert!(replay.condition.contains("NOT begins_with(park_reason, :unrec)"), "{}", replay.condition);
        let park = operator(OperatorAction::Park, "op", "why", None, "tok", 5, 3);
        assert!(!park.condition.contains("park_reason"), "only replay is guarded: {}", park.condition);
    }
}
