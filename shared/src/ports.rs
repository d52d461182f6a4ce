//! The ports: what each use case needs from storage, the queue and the
//! publisher, in the use case's own words. The AWS implementations are in
//! `adapters`; `adapters::memory` (the `testkit` feature) implements every
//! one in memory for the use cases' unit tests, and the contract suite
//! (`contract`) runs the same scenarios on both.
//!
//! | use case | ports |
//! |---|---|
//! | intake | [`Ledger`], [`WorkQueue`] |
//! | processor | [`WorkLedger`], [`WorkQueue`], [`Dispatch`] |
//! | batch (the processor's queue batch) | the processor's, [`Redelivery`] |
//! | dispatcher | [`OutboxStore`], [`Publisher`] |
//! | reconciler | [`DueLedger`] (with [`Ledger`]), [`WorkQueue`], [`Dispatch`] |
//! | operations | [`OperatorLedger`], [`WorkQueue`] |
//! | backfill | [`BackfillLedger`], [`BackfillSource`], [`WorkQueue`] |
//! | insight (`stats`, `failures`) | [`OperatorLedger`], [`MetricsReader`] |
//!
//! The ports sit right above `projection`: the processor's commit carries
//! projection ops, and gap waiters are stream positions.

use std::future::Future;

use crate::identity::EventKey;
use crate::ledger::Release;
use crate::ledger::{
    Applied, Attention, BodyBinding, Bound, Claim, CommitResult, DueCursor, DueCursors, DueItem, DuePage, DuePartition,
    ExistingRecord, Exit, LeaseResult, NewEvent, OperatorAction, PortError, Row, SendLease, Status, Sweep,
    Transitioned, WaiterCheck, WaiterItem,
};
use crate::message::{Dispatched, Held, OutboxClaim};
use crate::projection::Op;
use crate::projection::sequence::Position;

/// The durable event ledger (DynamoDB in production).
pub trait Ledger: Activity + Send + Sync {
    /// One round trip: creates the record and its payload item together
    /// (atomically) unless the key exists; on conflict returns the existing
    /// record (no read before the write). A record created by `claim` has its
    /// payload durable (`payload_stored`).
    fn claim(&self, event: &NewEvent, body: &[u8]) -> impl Future<Output = Result<Claim, PortError>> + Send;
    /// Stores the raw payload in its own item, which status updates never rewrite.
    fn store_payload(
        &self,
        key: &EventKey,
        payload_hash: &str,
        body: &[u8],
        expires_at: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Stores `body` for a record whose own payload was never stored, and
    /// makes it the record's payload (`payload_hash := new_hash`), unless the
    /// first payload was stored meanwhile. `conflict`: the content differs
    /// (counted and flagged as a conflict). `Ok(false)`: the first payload is
    /// durable now and was kept.
    fn adopt_payload(
        &self,
        key: &EventKey,
        old_hash: &str,
        new_hash: &str,
        body: &[u8],
        expires_at: i64,
        conflict: bool,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// Takes the send lease of a record that was never enqueued, if no live
    /// lease is held by another delivery (a lease already holding this
    /// token, our own retried write, counts as taken). `Ok(false)`: someone
    /// else sends.
    fn take_send_lease(
        &self,
        key: &EventKey,
        lease: &SendLease,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// Gives the send lease back after a failed send, so a retry can send at once.
    fn release_send_lease(
        &self,
        key: &EventKey,
        lease: &SendLease,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Notes that the key was handed to the queue (and drops the send lease).
    fn mark_enqueued(&self, key: &EventKey, at_ms: i64) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Counts a duplicate delivery on the record (evidence for the duplicate rate).
    fn note_duplicate(&self, key: &EventKey) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Flags "same id, different payload": keeps the first, counts the conflict.
    fn flag_conflict(
        &self,
        key: &EventKey,
        other_hash: &str,
        at_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// The record at `key` as a claim would meet it (a strongly consistent
    /// read); `None` when there is none.
    fn existing(&self, key: &EventKey) -> impl Future<Output = Result<Option<ExistingRecord>, PortError>> + Send;
    /// Notes on a notification's first record that its generation `n`
    /// exists, and keeps that record as long as the generation
    /// (`expires_at`). Never moves it back: finding a later one noted is no error.
    fn advance_generation(
        &self,
        first: &EventKey,
        n: u32,
        expires_at: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Binds a body to the identity it is to be recorded under, unless
    /// another holds it ([`Bound::Other`]: its key and since when).
    fn bind_body(&self, binding: &BodyBinding<'_>) -> impl Future<Output = Result<Bound, PortError>> + Send;
    /// Moves a binding from `from` (an identity that never recorded) to
    /// ours; `Ok(false)` when `from` no longer holds it (our own retried
    /// write that moved it counts as moved).
    fn take_binding(
        &self,
        binding: &BodyBinding<'_>,
        from: &EventKey,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// Counts on `key`'s record that its body came again under `other_id`.
    fn flag_replay(
        &self,
        key: &EventKey,
        other_id: &str,
        at_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// A record a backfill parked without its payload
    /// ([`ExistingRecord::awaits_payload`](crate::ledger::ExistingRecord::awaits_payload))
    /// gets `body` as its payload (stored first: in the record, its own
    /// item or S3, as the claim would store it) and is released in one
    /// conditional write: RECEIVED, back in the `due` index, the send lease
    /// `event.send`'s, `via` = `event.via`, `released_by` = `by`.
    /// `Release::NotAwaiting`: it was released or settled meanwhile (our
    /// own retried write, meeting its own lease, is `Released`). A store
    /// that never holds such records need not implement it.
    fn release_parked(
        &self,
        event: &NewEvent,
        body: &[u8],
        by: &str,
    ) -> impl Future<Output = Result<Release, PortError>> + Send {
        let _ = (event, body, by);
        async {
            Err(PortError::Unavailable {
                service: "ledger",
                message: "this ledger cannot release parked records".into(),
            })
        }
    }
}

/// One message for the work queue: the key, the tenant whose fair share it
/// is served from (SQS fair queues: its `MessageGroupId`), read from the
/// record, and the payload when it travels with the key.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub key: &'a EventKey,
    pub tenant: &'a str,
    pub payload: Option<&'a [u8]>,
}

/// The most messages one `send_all` request carries (SQS `SendMessageBatch`).
pub const SEND_BATCH_MAX: usize = 10;

/// The work queue between intake and processor (SQS in production). Every
/// message carries its record's tenant, so one tenant's flood is served
/// after the quiet tenants' messages, not before them.
pub trait WorkQueue: Send + Sync {
    /// Sends the key alone (the processor reads the payload item).
    fn send(&self, key: &EventKey, tenant: &str) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Sends the key with the payload, so the processor need not read it
    /// (it checks it against the record's hash). A queue that cannot carry
    /// this payload sends the key alone.
    fn send_with_payload(
        &self,
        key: &EventKey,
        tenant: &str,
        payload: &[u8],
    ) -> impl Future<Output = Result<(), PortError>> + Send {
        let _ = payload;
        self.send(key, tenant)
    }
    /// Sends several messages, [`SEND_BATCH_MAX`] to a request; one result
    /// per message, in order (a batch may fail for some of its messages
    /// only).
    fn send_all(&self, messages: &[Outgoing<'_>]) -> impl Future<Output = Vec<Result<(), PortError>>> + Send {
        async move {
            let mut out = Vec::with_capacity(messages.len());
            for m in messages {
                out.push(match m.payload {
                    Some(p) => self.send_with_payload(m.key, m.tenant, p).await,
                    None => self.send(m.key, m.tenant).await,
                });
            }
            out
        }
    }
}

/// One work message as the processor received it, decoded by the queue's
/// adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub message_id: String,
    /// What shows the message again or deletes it.
    pub receipt: Option<String>,
    /// The event key and the payload the message carries; `None`: the
    /// message is not a readable work message.
    pub work: Option<(EventKey, Option<Vec<u8>>)>,
    /// Whether this is the message's last receive before the queue moves it
    /// to the dead-letter queue.
    pub last_receive: bool,
    /// The message's group (its tenant), when the queue reported it.
    pub group: Option<String>,
}

/// The received side of the work queue: a message left on the queue comes
/// back after its visibility timeout.
pub trait Redelivery: Send + Sync {
    /// Shows the received message again no earlier than `delay_ms` from now.
    fn show_again(&self, receipt: &str, delay_ms: i64) -> impl Future<Output = Result<(), PortError>> + Send;
}

/// The processor's transitions on the ledger record, each one conditional
/// write fenced by the lease token.
pub trait WorkLedger: Activity + Send + Sync {
    /// Index shards (the record's due-index partition depends on them).
    fn shards(&self) -> u32;
    /// A notification written out of the `due` index (a guarded op's, sent
    /// before the completion) and not sent: into `shard`'s outbox partition,
    /// due at `at_ms` at the latest (a back-off's time kept), for the sweep.
    /// Nothing when it is sent, dead, or there already (its own retry).
    fn keep_for_sweep(&self, id: &str, shard: u32, at_ms: i64) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Takes the lease if the record is leasable now (RECEIVED; RETRYABLE
    /// and due; PROCESSING with an expired lease). Our own lease whose
    /// acknowledgement was lost is `Leased`.
    fn lease(
        &self,
        key: &EventKey,
        token: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> impl Future<Output = Result<LeaseResult, PortError>> + Send;
    /// The stored raw payload, if its item exists.
    fn payload(&self, key: &EventKey, hash: &str) -> impl Future<Output = Result<Option<Vec<u8>>, PortError>> + Send;
    /// Writes one op of a commit before its completion, guarded by its own
    /// conditions only (not by the lease: each op's condition makes a
    /// repeat by anyone a no-op, see docs/architecture.md "The commit"): a
    /// single write as one conditional request, several writes or outbox
    /// items (claimed by `token`) as one transaction of their own.
    fn apply(
        &self,
        key: &EventKey,
        token: &str,
        op: &Op,
        now_ms: i64,
    ) -> impl Future<Output = Result<Applied, PortError>> + Send;
    /// Commits the completion marker (PROCESSED, `outcome`) fenced by
    /// `token`, with `ops` (a route's deliveries) in the same transaction
    /// when there are any; on its own, one conditional update.
    fn commit(
        &self,
        key: &EventKey,
        token: &str,
        ops: &[Op],
        outcome: &str,
        subject: Option<&str>,
        now_ms: i64,
    ) -> impl Future<Output = Result<CommitResult, PortError>> + Send;
    /// The token of the commit that completed the record, if any (tells our
    /// own commit whose acknowledgement was lost from a real fence).
    fn completed_by(&self, key: &EventKey) -> impl Future<Output = Result<Option<String>, PortError>> + Send;
    /// PROCESSING(token) → RETRYABLE / DEAD / PARKED. `Ok(true)`: stored
    /// (now, or by our own earlier try); `Ok(false)`: fenced.
    fn leave(
        &self,
        key: &EventKey,
        token: &str,
        exit: &Exit<'_>,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// A gap closed: a record still waiting on it (RETRYABLE `gap`, or
    /// PARKED `gap`) becomes RETRYABLE and due now; `Ok(Some(tenant))`,
    /// the record's tenant. `Ok(None)`: not waiting.
    fn wake(&self, key: &EventKey, now_ms: i64) -> impl Future<Output = Result<Option<String>, PortError>> + Send;
    /// Appends an audit entry to the record's history (evidence, not state).
    fn append_history(
        &self,
        key: &EventKey,
        kind: &str,
        detail: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Leaves the pointer that lets the commit of `at.seq - 1` wake `key`.
    /// `look_at`: the pointer is also due then in the records partition of
    /// `key`'s shard (a record parked at the gap bound), so the reconciler
    /// looks at its stream even if the predecessor's wake-up never comes.
    fn register_waiter(
        &self,
        at: &Position,
        key: &EventKey,
        expires_at: i64,
        look_at: Option<i64>,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// The event waiting at `at`, if one left a pointer.
    fn waiter(&self, at: &Position) -> impl Future<Output = Result<Option<EventKey>, PortError>> + Send;
    /// Whether the stream of `at` has reached `at.seq - 1`.
    fn predecessor_applied(&self, at: &Position) -> impl Future<Output = Result<bool, PortError>> + Send;
}

/// Publishing a committed outbox item (the dispatcher, seen from the
/// processor and the reconciler).
pub trait Dispatch: Send + Sync {
    /// Claims, publishes and marks one outbox item.
    fn dispatch(&self, id: &str, now_ms: i64) -> impl Future<Output = Result<Dispatched, PortError>> + Send;
    /// Publishes and marks an item its committer holds under `token` (a
    /// route's delivery, written claimed), with the event's `payload`.
    fn dispatch_committed(
        &self,
        item: &crate::message::OutboxItem,
        token: &str,
        payload: &[u8],
        now_ms: i64,
    ) -> impl Future<Output = Result<Dispatched, PortError>> + Send;
    /// Outbox items of `shard` due at `up_to` or earlier, oldest first.
    fn due(&self, shard: u32, up_to: i64, limit: usize) -> impl Future<Output = Result<Vec<String>, PortError>> + Send;
    /// Whether deliveries are handed to a delivery queue (else sent where met).
    fn queued(&self) -> bool {
        false
    }
    /// The routes' destinations it delivers to, by name.
    fn destinations(&self) -> Vec<String> {
        Vec::new()
    }
    /// A commit's route deliveries, claimed under `token`, handed to the
    /// delivery queue; `false`: there is none (send them inline).
    fn hand_over_committed(
        &self,
        items: &[crate::message::OutboxItem],
        token: &str,
    ) -> impl Future<Output = bool> + Send {
        let _ = (items, token);
        async { false }
    }
    /// Due items handed to the delivery queue; how many were.
    fn hand_over_ids(&self, ids: &[String]) -> impl Future<Output = usize> + Send {
        let _ = ids;
        async { 0 }
    }
    /// Drains started for destinations back with deliveries waiting.
    fn drains(&self, now_ms: i64, budget: usize) -> impl Future<Output = crate::message::Drains> + Send {
        let _ = (now_ms, budget);
        async { crate::message::Drains::default() }
    }
}

/// A message of the delivery queue: a delivery to send (by its outbox id;
/// `token`: the claim its committing processor wrote it under, so the
/// dispatcher continues that claim instead of waiting for it to lapse), or
/// a destination whose waiting deliveries are to be drained.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DeliveryMessage {
    Deliver {
        outbox: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// The rate limit's grant it already holds (its send waits for it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<i64>,
    },
    Drain {
        destination: String,
    },
}

/// One message handed to the delivery queue, shown `delay_s` later (at
/// most SQS's 900 s).
#[derive(Debug, Clone)]
pub struct Handover {
    pub message: DeliveryMessage,
    /// The destination's name (the message group).
    pub group: String,
    pub delay_s: u32,
}

/// What a [`DeliveryQueue`] answers: one result per message, in order.
pub type HandedOver<'a> = std::pin::Pin<Box<dyn Future<Output = Vec<Result<(), PortError>>> + Send + 'a>>;

/// The delivery queue (`HOOKLEDGER_DELIVERY_QUEUE_URL`): route deliveries
/// sent apart from the processor, by the dispatcher's own concurrency.
pub trait DeliveryQueue: Send + Sync {
    /// Sends the messages, ten to a request; one result per message, in order.
    fn hand_over<'a>(&'a self, messages: &'a [Handover]) -> HandedOver<'a>;
}

/// The outbox items' transitions, each conditional on the dispatcher's token.
///
/// ```text
/// PENDING(due) ──claim──▶ SENDING(token) ──mark_sent──▶ SENT
///    ▲                      │        │
///    └─ back_off, defer ◀───┘        └── dead ──▶ DEAD
/// ```
pub trait OutboxStore: Activity + Send + Sync {
    /// Claims a due PENDING item, or a SENDING one whose claim lapsed.
    fn claim(
        &self,
        id: &str,
        token: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> impl Future<Output = Result<OutboxClaim, PortError>> + Send;
    /// SENDING(token) → SENT; `granted_at`: the rate limit's grant it was sent under.
    fn mark_sent(
        &self,
        id: &str,
        token: &str,
        granted_at: Option<i64>,
        now_ms: i64,
    ) -> impl Future<Output = Result<Held, PortError>> + Send;
    /// SENDING(token) kept claimed until `until_ms` (its due time too): it
    /// waits on the delivery queue for its destination's rate limit.
    fn hold(&self, id: &str, token: &str, until_ms: i64) -> impl Future<Output = Result<Held, PortError>> + Send;
    /// SENDING(token) → PENDING, due at `next_at_ms`.
    fn back_off(
        &self,
        id: &str,
        token: &str,
        next_at_ms: i64,
        error: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<Held, PortError>> + Send;
    /// SENDING(token) → PENDING in `destination`'s waiting partition (out of
    /// the sweep's `shard`), the claim's attempt given back: not sent, its
    /// destination's circuit is open. It waits there, costing nothing, until
    /// [`Self::unwait`] moves it back.
    fn defer(
        &self,
        id: &str,
        token: &str,
        destination: &str,
        shard: u32,
        why: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<Held, PortError>> + Send;
    /// Deliveries waiting for `destination` since `up_to` or earlier, the
    /// longest waiting first, at most `limit`.
    fn waiting(
        &self,
        destination: &str,
        up_to: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>, PortError>> + Send;
    /// A waiting delivery back into its home partition, due now. `Ok(true)`:
    /// it is there now (moved by this call, or by an earlier one whose
    /// acknowledgement was lost); `Ok(false)`: it was not waiting (sent,
    /// dead, or never deferred).
    fn unwait(&self, id: &str, destination: &str, now_ms: i64) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// SENDING(token) → DEAD (out of the due index, counted apart).
    fn dead(
        &self,
        id: &str,
        token: &str,
        shard: u32,
        error: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<Held, PortError>> + Send;
    /// Items of `shard` due at `up_to` or earlier, oldest first.
    fn due(&self, shard: u32, up_to: i64, limit: usize) -> impl Future<Output = Result<Vec<String>, PortError>> + Send;
    /// The item, as an operator reads it (`None`: no such item).
    fn state(&self, id: &str) -> impl Future<Output = Result<Option<crate::message::OutboxState>, PortError>> + Send;
    /// The items of these ids that exist (batched where the store allows).
    fn states(
        &self,
        ids: &[String],
    ) -> impl Future<Output = Result<Vec<crate::message::OutboxState>, PortError>> + Send {
        async move {
            let mut out = Vec::new();
            for id in ids {
                out.extend(self.state(id).await?);
            }
            Ok(out)
        }
    }
    /// DEAD items of `shard` (the attention index), newest first, at most `limit`.
    fn dead_items(&self, shard: u32, limit: usize) -> impl Future<Output = Result<Vec<String>, PortError>> + Send;
    /// The items of one partition as an operator reads them, at most `max`
    /// (paged through the index, read in batches of a hundred); `true`
    /// beside them when more were left unread.
    fn states_in(
        &self,
        partition: OutboxPartition<'_>,
        max: usize,
    ) -> impl Future<Output = Result<(Vec<crate::message::OutboxState>, bool), PortError>> + Send;
    /// DEAD → PENDING, due now, by an operator (who and why on the item),
    /// with its audit entry in the same write (`entry.id` is the write's
    /// token: a retry that finds its entry is done). `Ok(false)`: the item
    /// is not DEAD (and no entry is written).
    fn revive(
        &self,
        id: &str,
        run: &str,
        shard: u32,
        entry: &crate::audit::AuditEntry,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
}

/// One message for a [`Publisher`]: where it goes, what it says, and the
/// key that makes its repeats recognisable.
#[derive(Debug, Clone, Copy)]
pub struct Publication<'a> {
    /// An SNS topic's, an SQS queue's or an EventBridge bus's ARN, or an
    /// HTTPS destination's URL.
    pub target: &'a str,
    pub body: &'a str,
    pub idempotency_key: &'a str,
    /// SQS and SNS FIFO: the message group (SQS standard: the tenant, for fair queues).
    pub group: &'a str,
    /// EventBridge: the events' `Source` and `DetailType`.
    pub source: Option<&'a str>,
    pub detail_type: Option<&'a str>,
    /// A route's destination, by name (an HTTPS destination's secrets and
    /// address policy are found by it); `None`: a projection's notification.
    pub destination: Option<&'a str>,
    /// When it is sent (an HTTPS delivery's `webhook-timestamp`).
    pub now_ms: i64,
}

/// Why a publish failed: worth another try, or never.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    /// A timeout, a refused connection, a throttled call, a 5xx, 408 or 429;
    /// `after_ms`: not before this long (an HTTPS answer's `Retry-After`);
    /// `throttled`: the destination asked us to slow down (a 429, or any
    /// answer with a `Retry-After`).
    Retry { message: String, after_ms: Option<i64>, throttled: bool },
    /// An answer no retry changes (an HTTPS destination's 4xx whose class
    /// is `permanent`): the delivery is DEAD at once, with the answer.
    Permanent(String),
    /// A refusal that may pass (an HTTPS destination's 401 while it
    /// deploys or rotates a secret): retried while the delivery is younger
    /// than `retry_for_ms` (from its commit or replay), then DEAD.
    Refused { message: String, retry_for_ms: i64 },
}

impl PublishError {
    pub fn message(&self) -> &str {
        match self {
            Self::Retry { message, .. } | Self::Permanent(message) | Self::Refused { message, .. } => message,
        }
    }
}

impl From<String> for PublishError {
    fn from(message: String) -> Self {
        Self::Retry { message, after_ms: None, throttled: false }
    }
}

/// Where outbox items go: SNS topics, SQS queues, EventBridge buses and
/// HTTPS endpoints (`adapters::destinations`). `Err`: the publish failed
/// (the reason, never a payload).
pub trait Publisher: Send + Sync {
    fn publish(&self, out: Publication<'_>) -> impl Future<Output = Result<(), PublishError>> + Send;
}

/// A destination's circuit breaker as stored (one item per destination,
/// `dest#<name>`), read by every dispatcher of the destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Circuit {
    /// Failed sends in a row (reset when one gets through).
    pub failures: u32,
    /// Open: no sends until then; past it, one probe may go.
    pub open_until: Option<i64>,
    /// A probe is out until then (its holder's token beside it).
    pub probe_until: Option<i64>,
    pub probe_token: Option<String>,
    /// The token of the last failure counted (its retry recognises itself).
    pub failure_token: Option<String>,
    /// The token of the dispatcher that opened it last.
    pub open_token: Option<String>,
    /// The token of the probe that closed it last.
    pub close_token: Option<String>,
}

/// A change to a destination's [`Circuit`]; each recognises its own retry
/// after a lost acknowledgement by its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitChange<'a> {
    /// One more failure in a row.
    Failure { token: &'a str, now_ms: i64 },
    /// Open until `until_ms` (refused while it is open already).
    Open { token: &'a str, until_ms: i64, now_ms: i64 },
    /// The one probe of an open circuit whose time is up, until `until_ms`
    /// (refused while it is open or another probe is out).
    Probe { token: &'a str, until_ms: i64, now_ms: i64 },
    /// A send got through. Through the probe `probe` holds: closed, only
    /// while that probe is the one out. Any other send: the failures reset,
    /// only while the circuit is not open (a success seen by a container
    /// with an old copy never closes a circuit another one opened).
    Close { now_ms: i64, probe: Option<&'a str> },
}

/// A destination's rate item as stored (`dest#<name>`, `sk = "rate"`),
/// shared by every dispatcher of the destination (`outbox::limit`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rate {
    /// The earliest time of the next grant (`None`: never granted).
    pub next_at: Option<i64>,
    /// The last grant's time, as its dispatcher's clock read it.
    pub granted_at: Option<i64>,
    /// Grants made, ever (lost acknowledgements' wasted slots included).
    pub grants: u64,
    /// Steps this many times longer until `slow_until` (the destination throttled us).
    pub slow_factor: u32,
    pub slow_until: Option<i64>,
    /// When the destination last throttled us (a 429 or a `Retry-After`).
    pub throttled_at: Option<i64>,
    /// Sends in flight: `<until>#<token>` each.
    pub flights: Vec<String>,
}

/// A change to a destination's [`Rate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateChange<'a> {
    /// A grant now, refused unless the destination is idle (`next_at` past).
    GrantNow { step_ms: i64, now_ms: i64 },
    /// The next slot, refused unless it is in the future and within `horizon_ms`.
    GrantNext { step_ms: i64, horizon_ms: i64, now_ms: i64 },
    /// No grant before `resume_ms`; steps `factor` times longer until
    /// `until_ms` (refused when the next grant is later already).
    Slow { resume_ms: i64, factor: u32, until_ms: i64, now_ms: i64 },
    /// The factor alone (when [`RateChange::Slow`] was refused).
    SlowKeep { factor: u32, until_ms: i64, now_ms: i64 },
    /// One send in flight, refused while `max` are.
    TakeFlight { flight: &'a str, max: u32 },
    /// A send landed.
    Land { flight: &'a str },
    /// Flights whose time is up, out.
    Clean { expired: &'a [String] },
}

/// What a [`RateChange`] did: applied (the rate after it), or refused (the rate it met).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateWritten {
    Applied(Rate),
    Refused(Option<Rate>),
}

/// A partition of outbox items an operator's census reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxPartition<'a> {
    /// `shard`'s home partition: every item still to send (due or not yet).
    Home(u32),
    /// A destination's deliveries waiting for its circuit.
    Waiting(&'a str),
    /// `shard`'s DEAD items.
    Dead(u32),
}

/// Where destinations' circuits and rates are kept (the ledger's table).
pub trait CircuitStore: Send + Sync {
    /// The rate item of `destination` (`None`: never written).
    fn rate(&self, destination: &str) -> impl Future<Output = Result<Option<Rate>, PortError>> + Send;
    /// Applies `change` to `destination`'s rate item.
    fn change_rate(
        &self,
        destination: &str,
        change: RateChange<'_>,
    ) -> impl Future<Output = Result<RateWritten, PortError>> + Send;
    /// The circuit of `destination` (`None`: never written: closed).
    fn circuit(&self, destination: &str) -> impl Future<Output = Result<Option<Circuit>, PortError>> + Send;
    /// The circuits of `destinations`, in their order (one request for up to
    /// a hundred on DynamoDB).
    fn circuits(
        &self,
        destinations: &[String],
    ) -> impl Future<Output = Result<Vec<Option<Circuit>>, PortError>> + Send {
        async move {
            let mut out = Vec::with_capacity(destinations.len());
            for d in destinations {
                out.push(self.circuit(d).await?);
            }
            Ok(out)
        }
    }
    /// Applies `change`: `Some(circuit)` as it is after it (ours, or our
    /// own retried write), `None` refused.
    fn change_circuit(
        &self,
        destination: &str,
        change: CircuitChange<'_>,
    ) -> impl Future<Output = Result<Option<Circuit>, PortError>> + Send;
}

/// An event's payload as a route's delivery reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventPayload {
    Bytes(Vec<u8>),
    /// Stored outside the table (S3): larger than any destination takes, so not read.
    TooLarge,
    /// No such payload (expired with its record).
    Gone,
}

/// Where a payload too large for a destination is, for its consumer to read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PayloadRef {
    pub bucket: String,
    pub key: String,
    pub sha256: String,
}

/// A boxed future of a dyn-compatible port.
pub type PortFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = Result<T, PortError>> + Send + 'a>>;

/// The data keys of sealed payloads ([`crate::sealing`]) and the subject
/// index that finds an erasure's events, in a store without backups (its
/// own DynamoDB table, no point-in-time recovery).
pub trait PayloadKeys: Send + Sync {
    /// The event's data key: `fresh` stored now unless the event has one
    /// (one conditional write that returns the key already there: a retried
    /// claim, or our own retried write, seals under the first key). An
    /// erased event's tombstone is [`KeyState::Erased`](crate::sealing::KeyState::Erased).
    fn key_for<'a>(
        &'a self,
        event: &'a EventKey,
        fresh: &'a crate::sealing::DataKey,
        expires_at: i64,
    ) -> PortFuture<'a, crate::sealing::KeyState>;
    /// The event's data key as stored (a strongly consistent read).
    fn key_of<'a>(&'a self, event: &'a EventKey) -> PortFuture<'a, crate::sealing::KeyState>;
    /// Overwrites the event's key with a tombstone (who, when), kept until
    /// `expires_at` (the record's): every sealed copy is unreadable from
    /// now on. Repeating it is harmless.
    fn destroy<'a>(&'a self, event: &'a EventKey, by: &'a str, at_ms: i64, expires_at: i64) -> PortFuture<'a, ()>;
    /// Notes that `event` is about `subject` (until `expires_at`).
    fn index_subject<'a>(&'a self, subject: &'a str, event: &'a EventKey, expires_at: i64) -> PortFuture<'a, ()>;
    /// The events noted under `subject`, in key order.
    fn subject_events<'a>(&'a self, subject: &'a str) -> PortFuture<'a, Vec<EventKey>>;
    /// Removes the note that `event` is about `subject`.
    fn forget_subject<'a>(&'a self, subject: &'a str, event: &'a EventKey) -> PortFuture<'a, ()>;
}

/// `bytes` of `event` opened: as they are when they are not sealed, else
/// under the event's key (one read of `keys`; none configured: the key is
/// missing). `Ok(Err(_))`: they will never open.
pub async fn open_payload(
    keys: Option<&dyn PayloadKeys>,
    event: &EventKey,
    bytes: Vec<u8>,
) -> Result<Result<Vec<u8>, crate::sealing::Unreadable>, PortError> {
    if !crate::sealing::is_sealed(&bytes) {
        return Ok(Ok(bytes));
    }
    let state = match keys {
        Some(keys) => keys.key_of(event).await?,
        None => crate::sealing::KeyState::Missing,
    };
    Ok(crate::sealing::open_with(&state, event, bytes))
}

/// The stored payload of an event, by its key and payload hash (a route's
/// delivery refers to the event; the dispatcher reads it when it sends).
pub trait EventPayloads: Send + Sync {
    fn event_payload<'a>(
        &'a self,
        event_key: &'a EventKey,
        payload_hash: &'a str,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<EventPayload, PortError>> + Send + 'a>>;

    /// The payload in the payload bucket (put there from `bytes` when given;
    /// else it is there already), for an envelope too large to carry it;
    /// `Ok(None)`: no payload bucket.
    fn payload_ref<'a>(
        &'a self,
        event_key: &'a EventKey,
        payload_hash: &'a str,
        bytes: Option<&'a [u8]>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Option<PayloadRef>, PortError>> + Send + 'a>> {
        let _ = (event_key, payload_hash, bytes);
        Box::pin(async { Ok(None) })
    }
}

/// Activity marks: a note that this container is about to add or move
/// entries of the `due` index, so that a reconciler run with nothing noted
/// lately need not read every shard (docs/architecture.md "An idle
/// reconciler"). At most one write per container and
/// [`crate::ledger::ACTIVITY_WINDOW_MS`]; a failed note is not an error
/// (it is tried again at the next note; the reconciler's periodic full
/// sweep bounds what a lost mark delays).
pub trait Activity: Send + Sync {
    fn note_activity(&self, now_ms: i64) -> impl Future<Output = ()> + Send;
}

/// The reconciler's view: the `due` index, claims on its items, and the
/// evidence counts. Drift repairs create records through [`Ledger`].
pub trait DueLedger: Ledger {
    fn shards(&self) -> u32;
    /// Whether any activity was noted at `since_ms` or later (one query).
    fn active_since(&self, since_ms: i64) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// What the last run that read every shard found (one read by key).
    fn last_sweep(&self) -> impl Future<Output = Result<Option<Sweep>, PortError>> + Send;
    /// Keeps what a run that read every shard found (unless a later one
    /// is kept already).
    fn record_sweep(&self, sweep: &Sweep) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Where the records phase has read each shard to (one read by key;
    /// default when never written).
    fn due_cursors(&self) -> impl Future<Output = Result<DueCursors, PortError>> + Send;
    /// Keeps where the records phase has read each shard to (one write),
    /// unless a later run's are kept already; its own retry after a lost
    /// acknowledgement writes the same again.
    fn keep_due_cursors(&self, cursors: &DueCursors) -> impl Future<Output = Result<(), PortError>> + Send;
    /// The items of one partition of `shard` due at `up_to` or earlier,
    /// oldest first, after `after` (a page's `next`), at most `limit`
    /// (≤ 100): one query, and one batch read of the records and
    /// re-checked state it found. A records partition of a table not yet
    /// migrated may also yield outbox items and re-checked state.
    fn due(
        &self,
        partition: DuePartition,
        shard: u32,
        up_to: i64,
        limit: usize,
        after: Option<&DueCursor>,
    ) -> impl Future<Output = Result<DuePage, PortError>> + Send;
    /// Moves a due item's next look from `seen` to `next` with a fresh claim
    /// token. `Ok(Some(token))`: this run owns it (our own retried claim
    /// included); `Ok(None)`: another run moved it first.
    fn claim_due(
        &self,
        item: DueItem<'_>,
        seen: i64,
        next: i64,
    ) -> impl Future<Output = Result<Option<String>, PortError>> + Send;
    /// Moves a claimed item's next look to `at`, if the claim is still ours.
    fn reschedule(&self, item: DueItem<'_>, token: &str, at: i64)
    -> impl Future<Output = Result<(), PortError>> + Send;
    /// Notes that a re-driven record was handed to the queue (keeps an
    /// earlier note).
    fn note_enqueued(&self, key: &EventKey, now_ms: i64) -> impl Future<Output = Result<(), PortError>> + Send;
    /// DEAD and PARKED records and DEAD outbox items (all shards; one query
    /// per shard).
    fn attention(&self) -> impl Future<Output = Result<Attention, PortError>> + Send;
    /// Drops the payload of a finished record of the `drop_after` policy:
    /// its item and its object (when beside the record) deleted, then the
    /// record's own copy removed and the drop noted, on condition that it
    /// is PROCESSED, of that policy and not dropped yet. `Ok(true)`:
    /// dropped (now, or by our own earlier try whose acknowledgement was
    /// lost); `Ok(false)`: not such a record. `drop` must come from a record
    /// read PROCESSED ([`crate::ledger::DueRecord::drop`]): no status follows
    /// PROCESSED, so the copies beside the record go first, and a repeat
    /// after a crash between two steps finds the rest to do.
    fn drop_payload(
        &self,
        key: &EventKey,
        drop: &crate::ledger::PayloadDrop,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// Whether every outbox item of `ids` is SENT or does not exist.
    fn deliveries_settled(&self, ids: &[String]) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// A record whose re-drive was refused as invalid (a caller error)
    /// ends DEAD `caller_error` with `message`, if no worker holds it.
    /// `Ok(false)`: it moved on meanwhile (or is gone); our own retry after
    /// a lost acknowledgement meets our write and is `Ok(true)`.
    fn dead_refused(
        &self,
        key: &EventKey,
        message: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// A look at a parked waiter ([`Due::Waiter`](crate::ledger::Due::Waiter), claimed): if its
    /// predecessor committed, the record is woken (RETRYABLE, due now) and
    /// the pointer leaves the index; if the record no longer waits on the
    /// gap, the pointer leaves the index too.
    fn look_at_waiter(
        &self,
        waiter: &WaiterItem,
        now_ms: i64,
    ) -> impl Future<Output = Result<WaiterCheck, PortError>> + Send;
}

/// Which records an operator lists.
#[derive(Debug, Clone, Default)]
pub struct RowFilter<'a> {
    pub endpoint: Option<&'a str>,
    /// Only this tenant's records.
    pub tenant: Option<&'a str>,
    pub event_type: Option<&'a str>,
    pub subject: Option<&'a str>,
    /// Receive time range, inclusive.
    pub since_ms: i64,
    pub until_ms: i64,
    /// Only these attributes (all when empty).
    pub fields: &'a [&'a str],
    /// Only rows that sort after this one (newest first, ties by key
    /// descending): `(st_at, pk)` of the last row of the previous page.
    pub after: Option<(i64, &'a str)>,
}

impl RowFilter<'_> {
    /// Whether a row at `(at, pk)` comes after the cursor.
    pub fn is_after(&self, at: i64, pk: &str) -> bool {
        match self.after {
            None => true,
            Some((c_at, c_pk)) => at < c_at || (at == c_at && pk < c_pk),
        }
    }
}

/// A record as `show` gives it: the record, its history (oldest first) and,
/// if asked, its payload.
pub type Shown = (Row, Vec<Row>, Option<Vec<u8>>);

/// The operator's view: the `status` index and audited transitions.
pub trait OperatorLedger: Activity + Send + Sync {
    fn shards(&self) -> u32;
    /// One status partition, newest first, after the filter's cursor; pages
    /// until it has `want` rows (or the partition ends).
    fn rows(
        &self,
        status: Status,
        shard: u32,
        filter: &RowFilter<'_>,
        want: usize,
    ) -> impl Future<Output = Result<Vec<Row>, PortError>> + Send;
    /// Every open record of one shard (RECEIVED, PROCESSING, RETRYABLE),
    /// whole, in one pass where the store allows it.
    fn open_rows(&self, shard: u32) -> impl Future<Output = Result<Vec<Row>, PortError>> + Send {
        async move {
            let all = RowFilter { until_ms: i64::MAX, ..RowFilter::default() };
            let mut out = Vec::new();
            for status in [Status::Received, Status::Processing, Status::Retryable] {
                out.extend(self.rows(status, shard, &all, usize::MAX).await?);
            }
            Ok(out)
        }
    }
    /// Records in `status` (all shards).
    fn count(&self, status: Status) -> impl Future<Output = Result<u64, PortError>> + Send;
    /// The records of these keys that exist, read by key in batches (one
    /// `BatchGetItem` per hundred keys: no index, no scan), without their
    /// payload bytes.
    fn records(&self, keys: &[EventKey]) -> impl Future<Output = Result<Vec<Row>, PortError>> + Send;
    /// The record, its history (oldest first) and, if asked, its payload.
    fn show(&self, key: &EventKey, with_payload: bool)
    -> impl Future<Output = Result<Option<Shown>, PortError>> + Send;
    /// One conditional transition from the statuses `action` may leave, and
    /// its audit entry, as one write: the entry exists if and only if the
    /// transition happened (`entry.id`, `at_ms`, `verb` and `target` are the
    /// adapter's to set: the call's token, `now_ms`, the action, the key).
    fn transition(
        &self,
        key: &EventKey,
        action: OperatorAction,
        entry: &crate::audit::AuditEntry,
        now_ms: i64,
    ) -> impl Future<Output = Result<Transitioned, PortError>> + Send;
    fn append_history(
        &self,
        key: &EventKey,
        kind: &str,
        detail: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Erases a finished record's payload from the ledger: its payload item
    /// (`payload_hash`'s) and bucket object deleted (no-ops when repeated),
    /// then, in one transaction with its audit entry, its own copy removed
    /// and the erasure noted ([`crate::ledger::Erasure`]).
    fn erase(
        &self,
        key: &EventKey,
        payload_hash: &str,
        entry: &crate::audit::AuditEntry,
        now_ms: i64,
    ) -> impl Future<Output = Result<crate::ledger::Erasure, PortError>> + Send;
}

/// The operator audit log ([`crate::audit`]): read by time and by record,
/// and the entries of runs (written before, completed after).
pub trait AuditLog: Send + Sync {
    /// Entries written in `[since_ms, until_ms]`, oldest first, after
    /// `after` (a page's `next`), at most `limit`: one query per month of
    /// the window, never a scan.
    fn audit_page(
        &self,
        since_ms: i64,
        until_ms: i64,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<crate::audit::AuditPage, PortError>> + Send;
    /// The entries of actions on one record, oldest first (one query of its partition).
    fn audit_of(&self, key: &EventKey)
    -> impl Future<Output = Result<Vec<crate::audit::AuditEntry>, PortError>> + Send;
    /// Writes a run's entry (`result = started`) before the run; its retry
    /// writes nothing new.
    fn audit_begin(&self, entry: &crate::audit::AuditEntry) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Completes a run's entry with its outcome (only an entry that exists).
    fn audit_end(
        &self,
        entry: &crate::audit::AuditEntry,
        result: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// A fresh, unique entry id (the ledger's token).
    fn audit_id(&self) -> String;
}

/// A time range of the functions' metrics, cut into periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricWindow {
    pub since_ms: i64,
    pub until_ms: i64,
    pub period_s: i64,
}

/// One period of one metric series: the sum, the number of samples and the
/// largest sample recorded in it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MetricPoint {
    pub at_ms: i64,
    pub sum: f64,
    pub count: f64,
    pub max: f64,
}

/// One metric under one set of dimensions (`provider`, `endpoint`, ...).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricSeries {
    pub name: String,
    pub dimensions: Vec<(String, String)>,
    pub points: Vec<MetricPoint>,
}

/// The functions' metrics (CloudWatch in production): what the operator's
/// figures for throughput, latency and the duplicate rate come from, so
/// that no count is ever kept in, or read from, the ledger.
pub trait MetricsReader: Send + Sync {
    /// Every series of these metrics in the window. Its cost depends on the
    /// number of series (providers, endpoints, outcomes), never on traffic.
    fn read(
        &self,
        names: &[&str],
        window: &MetricWindow,
    ) -> impl Future<Output = Result<Vec<MetricSeries>, PortError>> + Send;
}

/// What a backfill asks a provider's API for: events created in
/// `[since_s, until_s)` (epoch seconds), of these types (empty: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub since_s: i64,
    pub until_s: i64,
    pub types: Vec<String>,
}

impl Window {
    /// A stable name for this window of this endpoint (the cursor item's key).
    pub fn run_id(&self, endpoint: &str) -> String {
        let mut types = self.types.clone();
        types.sort();
        format!("{endpoint}#{}#{}#{}", self.since_s, self.until_s, types.join(","))
    }
}

/// One event as the provider's API lists it: its identity (the webhook's
/// event id), type and time, and the bytes the API returned for it (the
/// payload stored) — `None` when the list does not carry them (GitHub lists
/// deliveries without payloads: [`BackfillSource::body`] fetches one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceEvent {
    pub event_id: String,
    pub event_type: Option<String>,
    pub created_s: i64,
    pub body: Option<Vec<u8>>,
    /// The provider's handle for this delivery (GitHub's delivery id), to
    /// fetch its body or ask for it again.
    pub handle: Option<String>,
}

/// A page of the provider's list, newest first; `next`: the opaque cursor of
/// the following page (`None`: the window is exhausted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcePage {
    pub events: Vec<SourceEvent>,
    pub next: Option<String>,
}

/// Why a page could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    /// 429 or a secondary rate limit: wait `retry_after_s` when the provider
    /// says, else back off; `should_retry: false` when it says not to retry.
    RateLimited { retry_after_s: Option<u64>, should_retry: bool },
    /// Network, timeout, 5xx: try again later.
    Unavailable(String),
    /// The request is wrong (bad key, unknown account, bad cursor): do not retry.
    Rejected(String),
    /// This one event cannot be had from the source, and asking again will
    /// not change that (a per-event failure: the rest of the list is fine).
    /// `detail` says why, never with the payload.
    Unfetchable { cause: Unfetchable, detail: String },
}

/// The largest body a backfill takes by default
/// (`HOOKLEDGER_MAX_BACKFILL_BODY_BYTES`): 25 MiB.
pub const DEFAULT_MAX_BACKFILL_BODY_BYTES: usize = 25 * 1024 * 1024;
/// The most `HOOKLEDGER_MAX_BACKFILL_BODY_BYTES` may be (the body is held in
/// memory, with its compressed copy).
pub const MAX_MAX_BACKFILL_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Why one listed event cannot be had from its source. The backfill records
/// it under its identity, PARKED `backfill_unrecoverable:<cause>` without a
/// payload, and moves on; a replay or a webhook delivery of it releases it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfetchable {
    /// Listed, but no payload is served for it (GitHub keeps none for some
    /// deliveries).
    NoPayload,
    /// What is served for it is not JSON.
    NotJson,
    /// The source answers this 4xx for the event (not 401/403/429: those
    /// are about the key or the rate, and stop the run instead).
    Status(u16),
    /// Larger than a backfill takes (`HOOKLEDGER_MAX_BACKFILL_BODY_BYTES`),
    /// or than the ledger stores without a payload bucket.
    TooLarge,
}

impl Unfetchable {
    /// The cause as the park reason names it: `no_payload`, `not_json`,
    /// `http_<status>`, `too_large`.
    pub fn cause(self) -> String {
        match self {
            Self::NoPayload => "no_payload".into(),
            Self::NotJson => "not_json".into(),
            Self::Status(code) => format!("http_{code}"),
            Self::TooLarge => "too_large".into(),
        }
    }

    /// The park reason of an event parked for this cause.
    pub fn park_reason(self) -> String {
        format!("{}{}", crate::ledger::BACKFILL_UNRECOVERABLE, self.cause())
    }
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RateLimited { retry_after_s, should_retry } => {
                write!(f, "rate limited (retry after {retry_after_s:?} s, should retry: {should_retry})")
            }
            Self::Unavailable(m) => write!(f, "provider unavailable: {m}"),
            Self::Rejected(m) => write!(f, "provider refused the request: {m}"),
            Self::Unfetchable { cause, detail } => {
                write!(f, "the provider cannot serve this event ({}): {detail}", cause.cause())
            }
        }
    }
}

/// Whether `hook` names a hook GitHub lists deliveries for.
pub fn valid_github_hook(hook: &str) -> bool {
    let parts: Vec<&str> = hook.split('/').collect();
    let name = |p: &str| {
        !p.is_empty() && p != "." && p != ".." && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    let id = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    match parts.as_slice() {
        ["repos", owner, repo, "hooks", hook_id] => name(owner) && name(repo) && id(hook_id),
        ["orgs", org, "hooks", hook_id] => name(org) && id(hook_id),
        ["app", "hook"] => true,
        _ => false,
    }
}

/// A provider's list of the events it sent (Stripe's events, GitHub's hook
/// deliveries): the backfill's source.
pub trait BackfillSource: Send + Sync {
    /// The page after `cursor` (the first page when `None`).
    fn page(
        &self,
        window: &Window,
        cursor: Option<&str>,
    ) -> impl Future<Output = Result<SourcePage, SourceError>> + Send;

    /// The body of an event the list carried without it.
    fn body(&self, event: &SourceEvent) -> impl Future<Output = Result<Vec<u8>, SourceError>> + Send {
        let body = event.body.clone();
        async move {
            body.ok_or_else(|| {
                SourceError::Rejected("the list carries no body and there is no way to fetch one".into())
            })
        }
    }

    /// Asks the provider to deliver the event to the endpoint again (it then
    /// arrives through the intake, signed, with its identity).
    fn redeliver(&self, event: &SourceEvent) -> impl Future<Output = Result<(), SourceError>> + Send {
        let _ = event;
        async { Err(SourceError::Rejected("this provider cannot redeliver".into())) }
    }

    /// Where this source reads, beyond the endpoint's provider: GitHub's
    /// hook path, Stripe's connected account. Kept on an event parked as
    /// unfetchable, so a replay asks the same place again.
    fn origin(&self) -> Option<String> {
        None
    }
}

/// An event a backfill could not have from its source, as it is parked
/// (PARKED `reason`, `payload_stored` false, no payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnfetchedEvent<'a> {
    /// `backfill_unrecoverable:<cause>` ([`Unfetchable::park_reason`]).
    pub reason: &'a str,
    /// Why, for the operator (never a payload).
    pub detail: &'a str,
    /// The source's handle of the event (GitHub's delivery id).
    pub handle: Option<&'a str>,
    /// [`BackfillSource::origin`].
    pub origin: Option<&'a str>,
    /// When the source says the event was created (epoch seconds).
    pub created_s: i64,
}

/// Where a backfill run stands: the cursor of the next page to read, and
/// whether the window is done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackfillProgress {
    pub cursor: Option<String>,
    pub done: bool,
    /// Counts so far (the run resumes them).
    pub seen: u64,
    pub recovered: u64,
}

/// Where an endpoint's scheduled backfill stands: everything created before
/// `high_water` (epoch seconds) has been read; `current` is the window being
/// read now (kept until it completes, so its cursor stays valid).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduleState {
    pub high_water: Option<i64>,
    pub current: Option<(i64, i64)>,
}

/// What the backfill needs from the ledger: the same claim as a webhook
/// delivery, whether a key is recorded (for a dry run), and its progress.
pub trait BackfillLedger: Activity + Send + Sync {
    fn claim(&self, event: &NewEvent, body: &[u8]) -> impl Future<Output = Result<Claim, PortError>> + Send;
    fn release_send_lease(
        &self,
        key: &EventKey,
        lease: &SendLease,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    fn recorded(&self, key: &EventKey) -> impl Future<Output = Result<bool, PortError>> + Send;
    /// Marks, under the event's key, that a redelivery was asked for (the
    /// record's history shows it once the delivery arrives).
    fn note_redelivery(
        &self,
        key: &EventKey,
        handle: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    fn progress(&self, run: &str) -> impl Future<Output = Result<Option<BackfillProgress>, PortError>> + Send;
    /// A scheduled backfill's state for one endpoint.
    fn schedule_state(&self, endpoint: &str) -> impl Future<Output = Result<Option<ScheduleState>, PortError>> + Send;
    /// Keeps the last scheduled audit's summary of `endpoint` (JSON).
    fn save_audit(
        &self,
        endpoint: &str,
        report: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// The last scheduled audit's summary of `endpoint` (JSON), if any.
    fn last_audit(&self, endpoint: &str) -> impl Future<Output = Result<Option<String>, PortError>> + Send;
    fn save_schedule_state(
        &self,
        endpoint: &str,
        state: &ScheduleState,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    fn save_progress(
        &self,
        run: &str,
        progress: &BackfillProgress,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
    /// Records an event its source cannot serve under its identity, PARKED
    /// without a payload: one conditional put that creates the record only
    /// if the key is new (as the claim does). `Claim::New`: parked now (our
    /// own retried put, meeting the record it made, included);
    /// `Claim::Existing`: the identity is recorded already.
    fn park(
        &self,
        event: &NewEvent,
        unfetched: &UnfetchedEvent<'_>,
    ) -> impl Future<Output = Result<Claim, PortError>> + Send;
    /// Gives a record parked without its payload the payload fetched now and
    /// releases it: [`Ledger::release_parked`].
    fn release(
        &self,
        event: &NewEvent,
        body: &[u8],
        by: &str,
    ) -> impl Future<Output = Result<Release, PortError>> + Send;
    /// Appends an audit entry to the record's history.
    fn note(
        &self,
        key: &EventKey,
        kind: &str,
        detail: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
}
