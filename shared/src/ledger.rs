//! The ledger record: its statuses, the values the use cases decide on, and
//! the outcomes of each transition. The ports that move records between
//! statuses are in `ports`; every conditional write that implements an
//! arrow is in `adapters::dynamodb::conditions`, which draws the whole
//! state machine with the file owning each arrow.
//!
//! ```text
//! (new) ──claim──▶ RECEIVED ──lease──▶ PROCESSING ──commit──▶ PROCESSED
//!                     ▲                  │    │
//!                     │     transient ◀──┘    └── permanent / exhausted ──▶ DEAD
//!                     │     RETRYABLE
//!                     └──── lease expired (crash) is reclaimable
//! ```

use std::collections::BTreeMap;

use crate::identity::EventKey;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Received,
    Processing,
    Retryable,
    Processed,
    Dead,
    Parked,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "RECEIVED",
            Self::Processing => "PROCESSING",
            Self::Retryable => "RETRYABLE",
            Self::Processed => "PROCESSED",
            Self::Dead => "DEAD",
            Self::Parked => "PARKED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Received, Self::Processing, Self::Retryable, Self::Processed, Self::Dead, Self::Parked]
            .into_iter()
            .find(|st| st.as_str() == s)
    }

    /// Terminal records leave the reconciler's index.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Processed | Self::Dead | Self::Parked)
    }
}

/// How an event reached the ledger (`via` on the record).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Via {
    /// Delivered by the provider to the intake.
    #[default]
    Webhook,
    /// Fetched from the provider's API by a backfill (authenticated by the
    /// API's TLS and key, not by a webhook signature).
    Backfill,
    /// A redelivery the backfill asked the provider for; it arrives through
    /// the intake, signed, with the original identity.
    Redelivery,
    /// Made by the reconciler's drift repair (a `recon:` event).
    Reconciliation,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Backfill => "backfill",
            Self::Redelivery => "redelivery",
            Self::Reconciliation => "reconciliation",
        }
    }

    /// `None` (a record written before provenance was recorded) reads as a webhook.
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("backfill") => Self::Backfill,
            Some("redelivery") => Self::Redelivery,
            Some("reconciliation") => Self::Reconciliation,
            _ => Self::Webhook,
        }
    }

    /// Whether two arrivals of one identity may differ in their bytes
    /// without that being a conflict: a body fetched from a provider's API
    /// is rendered anew (Stripe at the event's API version and with today's
    /// `pending_webhooks`; GitHub as parsed JSON), so it never equals the
    /// webhook's bytes. Only two signed deliveries are compared.
    pub fn compares_bytes_with(self, other: Self) -> bool {
        self != Self::Backfill && other != Self::Backfill
    }
}

/// A verified delivery about to be claimed.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub key: EventKey,
    pub provider: String,
    pub endpoint: String,
    pub tenant: String,
    pub event_id: String,
    pub event_type: Option<String>,
    pub payload_hash: String,
    /// Hash of the provider fact's content: equal for two deliveries whose
    /// bytes differ only where a provider's retries may change them (see
    /// [`crate::verify::registry::content_hash`]).
    pub content_hash: String,
    pub received_at_ms: i64,
    /// TTL (epoch seconds) after which the identity may be forgotten.
    pub expires_at: i64,
    /// Shard of the sparse index of non-terminal records.
    pub shard: u32,
    /// The send lease the creating delivery holds while it hands the key to
    /// the queue, so concurrent duplicates do not all send it again.
    pub send: SendLease,
    /// Provenance.
    pub via: Via,
    /// The hash of the whole delivery, for an event that came in a batch
    /// (its own payload is its slice of that body).
    pub batch_hash: Option<String>,
    /// Where the event is a notification
    /// ([`crate::verify::provider::Contract::Notification`]): which
    /// generation of its identity this record is.
    pub notification: Option<Generation>,
    /// What its endpoint's payload policy kept, when not the whole payload
    /// ([`crate::redaction`]).
    pub kept: Option<Kept>,
}

/// What a payload policy other than `keep` did to an event's payload: the
/// record says so (and a route's envelope), and a redacted record keeps the
/// hash of the body as verified beside the hash of what is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// `redact` or `drop_after`.
    pub policy: &'static str,
    /// The verified body's hash, when what is stored differs from it.
    pub verified_hash: Option<String>,
}

/// A notification's generation: the first is the record of its identity,
/// each later one its own record ([`NewEvent::generation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    /// 1 for the first.
    pub n: u32,
    /// The index shard count its records are spread over.
    pub index_shards: u32,
}

/// The identity of a notification's `n`-th generation: its own for the
/// first, then `<id>@g<n>` (`@` is in no identity a notification provider
/// has: a body hash, a large batch's `batch:<hash>`).
pub fn generation_id(event_id: &str, n: u32) -> String {
    if n <= 1 { event_id.to_owned() } else { format!("{event_id}@g{n}") }
}

impl NewEvent {
    /// This notification's `n`-th generation, from its first: the same
    /// delivery under [`generation_id`] (its own key and index shard), with
    /// the same send token, so our own retried claim recognises itself.
    pub fn generation(&self, n: u32) -> NewEvent {
        let shards = self.notification.map_or(1, |g| g.index_shards);
        let event_id = generation_id(&self.event_id, n);
        let key = EventKey::new(&self.provider, &self.endpoint, &event_id);
        let notification = Some(Generation { n, index_shards: shards });
        NewEvent { shard: key.shard(shards), key, event_id, notification, ..self.clone() }
    }
}

/// A body of a provider whose identity comes from an unsigned header
/// ([`crate::verify::provider::Replay::BoundToBody`]), bound to the identity
/// it is recorded under.
#[derive(Debug, Clone, Copy)]
pub struct BodyBinding<'a> {
    pub provider: &'a str,
    pub endpoint: &'a str,
    /// The hash of the body's bytes.
    pub payload_hash: &'a str,
    /// The record it is (to be) recorded under.
    pub key: &'a EventKey,
    pub at_ms: i64,
    /// As long as the record's identity is kept.
    pub expires_at: i64,
}

/// What binding a body found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// Bound to our key (now, or before: the sender's retry, our own retried write).
    Ours,
    /// Another identity holds it, since `at_ms`.
    Other { key: EventKey, at_ms: i64 },
}

/// Who may hand a record to the queue right now, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendLease {
    pub token: String,
    pub until_ms: i64,
}

/// What the claim found when the key already existed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingRecord {
    pub status: Status,
    pub payload_hash: String,
    /// `None` on records written before content hashes existed.
    pub content_hash: Option<String>,
    /// When the intake last handed the key to the queue; `None`: not known
    /// to be sent (the intake does not note its sends).
    pub enqueued_at_ms: Option<i64>,
    /// When the record was created.
    pub received_at_ms: i64,
    /// Until when a delivery holds the right to send it (`None`: released).
    pub send_lease_until_ms: Option<i64>,
    /// Whether the payload item has been written for this record.
    pub payload_stored: bool,
    /// How the record's first arrival came.
    pub via: Via,
    /// The tenant the record was claimed for (its messages' group).
    pub tenant: String,
    /// On a notification's first record: its latest generation (1 when
    /// there is no other, or on any other record).
    pub latest_generation: u32,
}

impl ExistingRecord {
    /// Whether a repeat of this notification coalesces with it: it has not
    /// started being processed (RECEIVED), or its next attempt is still to
    /// come (RETRYABLE, no lease held). A lease taken may have fetched before
    /// the change the repeat announces, so a repeat then, or once it is
    /// finished (PROCESSED, DEAD, PARKED), is the next generation.
    pub fn coalesces(&self) -> bool {
        matches!(self.status, Status::Received | Status::Retryable)
    }

    /// A record a backfill parked because its source could not serve the
    /// event (PARKED `backfill_unrecoverable:<cause>`, no payload): a
    /// delivery of it supplies the payload and releases it.
    pub fn awaits_payload(&self) -> bool {
        self.status == Status::Parked && !self.payload_stored && self.via == Via::Backfill
    }
}

/// The `park_reason` prefix of an event a backfill could not have from its
/// source (`backfill_unrecoverable:<cause>`).
pub const BACKFILL_UNRECOVERABLE: &str = "backfill_unrecoverable:";

/// The `payload_hash` of a record parked without a payload (no body hashes
/// to it).
pub const NO_PAYLOAD_HASH: &str = "none";

/// What releasing a record parked without its payload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The payload is stored and the record RECEIVED, its send lease ours;
    /// the record's tenant (its message's group).
    Released { tenant: String },
    /// It no longer awaits a payload (released by another delivery, or
    /// settled by an operator): nothing written.
    NotAwaiting,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This call created the record.
    New,
    /// The key was already claimed (by an earlier delivery, a concurrent
    /// one, or our own SDK retry whose first response was lost).
    Existing(ExistingRecord),
}

/// A storage or queue fault. Every variant but `TooLarge` is retryable from
/// the sender's point of view (the intake answers 503; 413 for `TooLarge`).
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("throttled by {service}")]
    Throttled { service: &'static str },
    #[error("{service} unavailable: {message}")]
    Unavailable { service: &'static str, message: String },
    /// The payload, stored, is larger than the ledger takes (no payload
    /// bucket is configured for larger ones): retrying cannot help.
    #[error("payload of {size} bytes stored exceeds {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// The service refused the request itself (`ValidationException`, a
    /// transaction cancelled for a validation reason, a parameter SQS or SNS
    /// rejects): the same request is refused again, so retrying cannot
    /// help. The processor and the reconciler end the record DEAD
    /// `caller_error`; the intake still answers 503 (a 4xx would make the
    /// sender drop a genuine event) and counts `intake_caller_error`.
    #[error("{service} refused the request ({code}): {message}")]
    Caller { service: &'static str, code: String, message: String },
}

/// Error codes by which a service says the request itself is wrong.
pub const CALLER_CODES: [&str; 10] = [
    "ValidationException",
    "SerializationException",
    "ItemCollectionSizeLimitExceededException",
    "InvalidParameterValue",
    "InvalidParameterValueException",
    "InvalidParameter",
    "InvalidParameterException",
    "InvalidMessageContents",
    "InvalidAttributeValue",
    "MissingParameter",
];

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
    /// The payload, when the record carries it (small payloads).
    pub payload: Option<Vec<u8>>,
    /// How the event came (a route's envelope says so).
    pub via: Via,
    /// Its endpoint's payload policy when not `keep` (a route's envelope says so).
    pub payload_policy: Option<String>,
}

impl WorkRecord {
    /// Start of the window the gap and transient bounds count from.
    pub fn window_start(&self) -> i64 {
        self.window_start_ms.unwrap_or(self.received_at_ms)
    }

    /// What a lease attempt by `token` at `now_ms` means, given the record a
    /// failed lease condition met (`None`: no record).
    pub fn lease_refused(met: Option<Self>, token: &str, now_ms: i64) -> LeaseResult {
        match met {
            None => LeaseResult::Missing,
            // Our own lease whose acknowledgement was lost.
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
            // RECEIVED fails only if it changed between two reads: try again soon.
            Some(_) => LeaseResult::Busy { until_ms: now_ms },
        }
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

/// What one op of a commit, written on its own before the completion
/// ([`crate::ports::WorkLedger::apply`]), came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The op's writes (and its outbox items, these ids) are stored.
    Written { outbox: Vec<String> },
    /// Its condition failed: nothing of it was written (its
    /// [`crate::projection::OnConflict`] says what that means).
    Conflict,
    /// DynamoDB reported contention inside the op's transaction.
    Contention,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitResult {
    /// Everything committed; these outbox items were written.
    Committed { outbox: Vec<String> },
    /// These ops' conditions failed (indices into the ops given).
    Conflicts(Vec<usize>),
    /// The lease token no longer matches: another worker owns the record, or
    /// our own commit whose acknowledgement was lost (see `completed_token`).
    Fenced,
    /// DynamoDB reported contention or throttling inside the transaction.
    Contention,
}

/// How a leased record leaves PROCESSING other than by a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit<'a> {
    /// RETRYABLE, due at `next_at_ms`. `failure`: a business failure, which
    /// spends the attempt budget (`failures + 1`).
    Retry { next_at_ms: i64, code: &'a str, message: &'a str, failure: bool },
    /// DEAD (terminal).
    Dead { reason: &'a str, message: &'a str },
    /// PARKED (terminal until replayed); no mutation was made.
    Park { reason: &'a str, subject: Option<&'a str> },
}

impl Exit<'_> {
    pub fn to(&self) -> Status {
        match self {
            Self::Retry { .. } => Status::Retryable,
            Self::Dead { .. } => Status::Dead,
            Self::Park { .. } => Status::Parked,
        }
    }
}

/// An operator's transition (audited; `hookledger replay|park|resolve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    /// DEAD or PARKED → RETRYABLE, due now, attempts and failures reset, a
    /// new time window; the key is queued at once.
    Replay,
    /// RECEIVED, RETRYABLE or DEAD → PARKED: stop working on it until replayed.
    Park,
    /// DEAD or PARKED → PROCESSED with outcome `resolved`.
    Resolve,
}

impl OperatorAction {
    pub fn name(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Park => "park",
            Self::Resolve => "resolve",
        }
    }

    /// The statuses the action may leave (a PROCESSING record finishes its lease first).
    pub fn from(self) -> &'static [Status] {
        match self {
            Self::Replay | Self::Resolve => &[Status::Dead, Status::Parked],
            Self::Park => &[Status::Received, Status::Retryable, Status::Dead],
        }
    }

    pub fn to(self) -> Status {
        match self {
            Self::Replay => Status::Retryable,
            Self::Park => Status::Parked,
            Self::Resolve => Status::Processed,
        }
    }

    /// Why the action is refused, for the operator.
    pub fn allowed(self) -> &'static str {
        match self {
            Self::Replay => "only DEAD or PARKED records can be replayed",
            Self::Park => {
                "only RECEIVED, RETRYABLE or DEAD records can be parked; a PROCESSING one must finish its lease first"
            }
            Self::Resolve => "only DEAD or PARKED records can be resolved",
        }
    }
}

/// What an erasure of a record's payload did ([`crate::sealing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Erasure {
    /// Erased now (or by our own write whose acknowledgement was lost).
    Erased,
    /// Erased before.
    AlreadyErased,
    /// No such record.
    Missing,
    /// Still in flight (RECEIVED, PROCESSING, RETRYABLE): left alone.
    NotFinished(Status),
}

/// What an operator transition met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transitioned {
    /// Moved; the record's tenant (a replay queues it in that group).
    Done { tenant: String },
    /// No such record.
    Missing,
    /// The record is in a status the action may not leave.
    Refused(Status),
}

/// A ledger record in the reconciler's `due` index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueRecord {
    pub key: EventKey,
    pub status: Status,
    /// The record's tenant (a re-drive queues it in that group).
    pub tenant: String,
    /// Whether it was handed to the queue: a re-drive noted it
    /// (`enqueued_at`), or the sender that claimed it held its send lease to
    /// the end (the claim writes the lease, and a sender whose send fails
    /// gives it back: no request more for the hand-over). A sender that died
    /// between its claim and its send also leaves its lease to lapse.
    pub enqueued: bool,
    /// The `due_at` read: a claim moves it only from this value.
    pub due_at_ms: i64,
    pub received_at_ms: i64,
    /// Since when it is open: its receipt, or its last replay or wake-up
    /// from a gap when later (the oldest unprocessed age counts from it).
    pub open_since_ms: i64,
    /// The lease's end, for a record in PROCESSING.
    pub lease_expires_at_ms: Option<i64>,
    /// How many times the reconciler claimed it for a re-drive so far.
    pub redrives: u32,
    /// A PROCESSED record of the `drop_after` policy whose payload is still
    /// stored: what the reconciler drops.
    pub drop: Option<PayloadDrop>,
}

/// The stored payload of a finished record whose endpoint keeps payloads
/// only until their event is done (`drop_after`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadDrop {
    /// The stored payload's hash (the key of its item and of its object).
    pub hash: String,
    /// The record carries it itself (no item or object beside it).
    pub inline: bool,
    /// When the record completed.
    pub processed_at_ms: i64,
}

/// How long after its completion a `drop_after` payload is kept: a
/// destination handed a large payload by reference reads the object in
/// that time.
pub const DROP_AFTER_GRACE_MS: i64 = 3_600_000;
/// When a payload waits on deliveries not SENT yet (pending, or DEAD until
/// an operator replays them), the next look.
pub const DROP_RECHECK_MS: i64 = 3_600_000;

/// The longest a record merely waiting (`never_sent`, `not_picked_up`)
/// waits between two re-drives: 4 hours.
pub const MAX_WAITING_REDRIVE_BACKOFF_MS: i64 = 4 * 3_600_000;

impl DueRecord {
    /// When a re-drive of this record (for `reason`) at `now_ms` looks at
    /// it next. A record merely waiting in the queue (a processor backlog)
    /// backs off per record: `base_ms` after its first re-drive, doubling
    /// with each one, at most [`MAX_WAITING_REDRIVE_BACKOFF_MS`]; so a
    /// backlog of duration T re-sends each event at most 1 + log2(T / base)
    /// times (5 per event for an hour at the default 5 minutes), however
    /// many reconciler runs it lasts. The others (a lease that expired, a
    /// retry due) are looked at again after `base_ms`.
    pub fn next_look(&self, reason: &str, base_ms: i64, now_ms: i64) -> i64 {
        let backoff = match reason {
            "never_sent" | "not_picked_up" => {
                base_ms.saturating_mul(1_i64 << self.redrives.min(12)).min(MAX_WAITING_REDRIVE_BACKOFF_MS.max(base_ms))
            }
            _ => base_ms,
        };
        now_ms.saturating_add(backoff)
    }

    /// Why the reconciler re-drives it at `now_ms`; `None`: not its to
    /// re-drive (a live lease is only looked at again when it ends).
    pub fn redrive_reason(&self, now_ms: i64) -> Option<&'static str> {
        match self.status {
            Status::Received if !self.enqueued => Some("never_sent"),
            Status::Received => Some("not_picked_up"),
            Status::Processing if self.lease_expires_at_ms.is_some_and(|end| end >= now_ms) => None,
            Status::Processing => Some("lease_expired"),
            Status::Retryable => Some("retry_due"),
            _ => None,
        }
    }
}

/// An item of the `due` index due now. Each kind has its own partition per
/// shard (records `due#NNN`, outbox items `out#NNN`, re-checks `chk#NNN`),
/// so one kind's backlog never hides another's; a `due#NNN` partition of a
/// table not yet migrated may still hold outbox items and re-checked state
/// (`hookledger migrate` moves them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    Record(DueRecord),
    /// An outbox item pending (due since its creation) or claimed by a
    /// dispatcher that died (due when the claim lapsed).
    Outbox {
        id: String,
        due_at_ms: i64,
    },
    /// A projection's state item due for its next re-check against the
    /// provider.
    Check(CheckItem),
    /// The waiter pointer of a record parked at the gap bound: due for a
    /// look at its stream (has the predecessor committed since?).
    Waiter(WaiterItem),
}

/// A waiter pointer in the waiters partition (`(stream pk, wait#<seq>)`):
/// left by a record parked at the gap bound, so that a predecessor whose
/// processor died between its commit and the wake-up is still found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaiterItem {
    /// The stream's state item `pk` (the pointer's `pk`).
    pub stream: String,
    /// The pointer's `sk` (`wait#<seq>`).
    pub sk: String,
    /// The waiting event's place in its stream.
    pub seq: i64,
    /// The waiting event.
    pub key: EventKey,
    pub due_at_ms: i64,
    /// When its record parked at the gap bound (its looks space out as it
    /// waits longer).
    pub parked_at_ms: i64,
}

/// What a look at a parked waiter found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaiterCheck {
    /// Its predecessor has not committed: it waits (looked at again later).
    Waiting,
    /// Its predecessor committed: the record is RETRYABLE and due now; the
    /// pointer has left the index. With the record's tenant.
    Woken { tenant: String },
    /// The record no longer waits on the gap (replayed, resolved, gone):
    /// the pointer has left the index.
    Gone,
}

impl Due {
    pub fn due_at_ms(&self) -> i64 {
        match self {
            Due::Record(r) => r.due_at_ms,
            Due::Outbox { due_at_ms, .. } => *due_at_ms,
            Due::Check(e) => e.due_at_ms,
            Due::Waiter(w) => w.due_at_ms,
        }
    }
}

/// A partition of the `due` index, one per reconciler phase, in the order a
/// run sweeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DuePartition {
    /// Ledger records (`due#NNN`).
    Records,
    /// Outbox items (`out#NNN`).
    Outbox,
    /// Re-checks against the provider: projection state registered with a
    /// re-check plug-in (`chk#NNN`).
    Checks,
    /// The waiter pointers of records parked at the gap bound (`gap#NNN`):
    /// looked at with their own bound, after the three phases of
    /// [`DuePartition::ALL`] and outside their shares.
    Waiters,
}

impl DuePartition {
    pub const ALL: [DuePartition; 3] = [DuePartition::Records, DuePartition::Outbox, DuePartition::Checks];

    /// The partition-name prefix (`due`, `out`, `chk`).
    pub fn prefix(self) -> &'static str {
        match self {
            DuePartition::Records => "due",
            DuePartition::Outbox => "out",
            DuePartition::Checks => "chk",
            DuePartition::Waiters => "gap",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DuePartition::Records => "records",
            DuePartition::Outbox => "outbox",
            DuePartition::Checks => "checks",
            DuePartition::Waiters => "waiters",
        }
    }
}

/// A place in a `due` partition: an entry's next look and keys (a page
/// read after it starts with the entry that follows), or a start at a time
/// ([`DueCursor::from_ms`]: the entries due at it or later).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DueCursor {
    pub due_at_ms: i64,
    pub pk: String,
    pub sk: String,
}

impl DueCursor {
    /// A start at `at_ms`: a page read after it begins with the first entry
    /// due at `at_ms` or later (no entry has empty keys).
    pub fn from_ms(at_ms: i64) -> Self {
        Self { due_at_ms: at_ms, pk: String::new(), sk: String::new() }
    }

    /// Whether this is a start at a time rather than an entry's place.
    pub fn is_time(&self) -> bool {
        self.pk.is_empty()
    }
}

/// One page of a `due` partition, oldest first; `next`: more items within
/// the range follow. `entries`: every index entry the page read, in index
/// order, whether or not its item was still there to be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DuePage {
    pub items: Vec<Due>,
    pub next: Option<DueCursor>,
    pub entries: Vec<DueEntry>,
}

/// An index entry a page read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueEntry {
    pub place: DueCursor,
    /// The item read at it (its index in the page's `items`); `None`: gone
    /// since the index listed it (or not an item the reconciler knows).
    pub item: Option<usize>,
}

/// Where the records phase has read each shard's `due#NNN` partition to
/// (docs/architecture.md "Finished records stay in the due index"): every
/// entry at or before a shard's place was finished, gone or moved on when a
/// run read it, and due at least [`CURSOR_SETTLE_MS`] before that run. A
/// completion leaves its record's entry in place (a keys-only index: the
/// completion writes nothing to it); the records phase starts after these
/// places instead of at the oldest entry. Kept in one item (`pk =
/// activity`, `sk = cursors`), each run's from its start: a run that ran
/// at the same time and wrote before may be moved back by it, which only
/// reads some entries again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueCursors {
    /// By shard; a shard not here is read from its oldest entry.
    pub shards: BTreeMap<u32, DueCursor>,
    /// When a run last read every shard from [`CURSOR_REWIND_MS`] before
    /// its place (`None`: never).
    pub rewound_at_ms: Option<i64>,
    /// The run that wrote them (its start): a run's write never replaces
    /// a later run's.
    pub at_ms: i64,
}

/// How long after an entry is due the cursor may pass it: far longer than
/// an index entry takes to appear (normally well under a second) and than
/// the clocks of the functions differ, so an entry is never passed before
/// it can be read. Every write that places an entry places it at its
/// writer's now or later.
pub const CURSOR_SETTLE_MS: i64 = 120_000;
/// How far back a rewound run reads (once every [`CURSOR_REWIND_EVERY_MS`]):
/// an entry that appeared in the index later than [`CURSOR_SETTLE_MS`] after
/// its write is found by it.
pub const CURSOR_REWIND_MS: i64 = 15 * 60_000;
/// How often a run reads every shard from [`CURSOR_REWIND_MS`] before its place.
pub const CURSOR_REWIND_EVERY_MS: i64 = 3_600_000;

/// The window an activity mark covers: a container writes at most one mark
/// per window (docs/architecture.md "An idle reconciler").
pub const ACTIVITY_WINDOW_MS: i64 = 300_000;
/// How long after the last activity mark every reconciler run still reads
/// every shard: longer than the longest backoff a write of the pipeline
/// schedules (the outbox's 60 min) plus the re-drive grace.
pub const ACTIVE_FOR_MS: i64 = 2 * 3_600_000;
/// How often a reconciler with no activity still reads every shard: the
/// bound on how late an entry whose mark was lost (or that is due long
/// after its write, a re-check) is found.
pub const FULL_SWEEP_EVERY_MS: i64 = 3_600_000;

/// What the last run that read every shard found, kept for the idle runs
/// after it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// When it ran.
    pub at_ms: i64,
    /// It read every shard without an error, acted on nothing and saw no
    /// open record: the runs after it may skip the shards while nothing
    /// notes activity.
    pub quiet: bool,
    /// Its evidence counts, which the idle runs report again.
    pub attention: Attention,
}

/// What needs an operator, counted from the attention index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attention {
    pub dead_letters: u64,
    pub parked: u64,
    pub outbox_dead: u64,
}

/// A projection's state item due for a re-check against the provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckItem {
    /// The state item's partition key (its `sk` is `state`): which re-check
    /// plug-in it belongs to is read from it.
    pub pk: String,
    pub due_at_ms: i64,
    /// The item as stored, keys included (what the plug-in compares).
    pub state: crate::item::Item,
}

/// What the reconciler claims in the `due` index: a ledger record, a
/// projection item due for a re-check, or a waiter pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueItem<'a> {
    Record(&'a EventKey),
    Check(&'a str),
    /// A waiter pointer: its stream `pk` and its `sk`.
    Waiter {
        stream: &'a str,
        sk: &'a str,
    },
}

/// A stored item as JSON, for operators (binary values shown as their size).
pub type Row = serde_json::Map<String, serde_json::Value>;

/// The error and its sources, for logs (never contains request payloads).
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip() {
        for s in
            [Status::Received, Status::Processing, Status::Retryable, Status::Processed, Status::Dead, Status::Parked]
        {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("DONE"), None);
        assert!(Status::Processed.is_terminal() && !Status::Retryable.is_terminal());
    }
}
