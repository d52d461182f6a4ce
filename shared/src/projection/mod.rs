//! Projections: user code that turns one verified provider event into
//! writes. Each [`Op`] is written on its own, guarded by its own conditions,
//! before the ledger's completion marker (fenced by the lease token): a
//! repeat of an op, by a retry or by a worker fenced out meanwhile, is a
//! no-op or the same write (docs/architecture.md "The commit").
//!
//! A projection reads its state through a [`StateStore`] (typed by
//! [`StateKey`]) and returns a [`Decision`]. Its writes come grouped in
//! [`Op`]s of [`Write`]s, built from the contract building blocks of
//! design §6:
//!
//! | contract | building block |
//! |---|---|
//! | full snapshot + monotonic revision | [`snapshot::replace_if_newer`] |
//! | status with precedence | [`precedence::advance`] |
//! | independent additive operation | [`additive::apply_once`] |
//! | ordered deltas with sequence | [`sequence::decide`] + [`sequence::apply_next`] |
//! | "object changed" notification | [`fetch`]: fetch, then `replace_if_newer` by fetched version |
//! | state compared with the provider later | [`recheck`]: a plug-in the reconciler runs |
//!
//! Every op carries the conditions that make it safe to repeat; when one
//! fails, [`OnConflict`] says what that means, so a retry after a crash
//! converges to the state of applying the event once. Nothing here names a
//! storage SDK: the adapters turn [`Write`]s into their store's requests.

pub mod additive;
pub mod fetch;
pub mod precedence;
pub mod recheck;
pub mod sequence;
pub mod snapshot;
pub mod state;
pub mod write;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::identity::EventKey;
pub use crate::item::{Item, Value, get_n, get_s, n, s};
use crate::message::OutboxMessage;
pub use state::{State, StateFuture, StateKey, StateStore};
pub use write::{Action, Write};

/// The verified event handed to projections.
#[derive(Debug, Clone)]
pub struct EventContext {
    pub key: EventKey,
    pub provider: String,
    pub endpoint: String,
    pub tenant: String,
    pub event_id: String,
    pub event_type: String,
    /// The provider's JSON (for SNS: the decoded `Message`).
    pub body: serde_json::Value,
    /// When the intake (or a backfill, a repair) recorded the event.
    pub received_at_ms: i64,
    /// When this attempt at it began (the time a projection that schedules
    /// a re-check counts from).
    pub processing_at_ms: i64,
}

/// What the projection wants done with the event.
#[derive(Debug)]
pub enum Decision {
    /// Write these ops (possibly none), then the completion marker.
    Apply(Vec<Op>),
    /// Nothing to do for this event: PROCESSED with outcome `ignored`.
    Ignore(&'static str),
    /// Every effect of this event was applied before (by business identity):
    /// PROCESSED with outcome `duplicate`.
    Duplicate,
    /// The subject is unknown (no mapping): PARKED, no mutation.
    Park(String),
    /// A predecessor is missing: RETRYABLE without spending the attempt
    /// budget, woken when the predecessor commits; PARKED (`gap`) once the
    /// gap bound has passed.
    Defer(Gap),
}

/// Why an event waits, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub reason: String,
    /// This event's place in its ordered stream. When set, the processor
    /// leaves a waiter pointer there, so the commit of `seq - 1` makes this
    /// event due at once instead of at its next scheduled look.
    pub waiter: Option<sequence::Position>,
}

/// What a failed condition on an op means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    /// The stored state is newer: this event is stale; drop the op.
    Stale,
    /// This operation was applied before (by its business identity): drop it.
    AlreadyApplied,
    /// The state moved underneath the plan: plan again from fresh reads.
    Replan,
}

/// A group of writes that stand or fall together.
///
/// A **guarded** op (every building block's: [`Op::guarded`]) carries
/// conditions that make its repeat, by a retry or by a worker fenced out
/// meanwhile, a no-op or the same write: it is written on its own before
/// the completion (one write as one conditional request; several, or a
/// put with notifications, as docs/architecture.md "The commit" says).
/// Any other op ([`Op::new`]: an `ADD` with no guard, a write whose
/// condition does not make a repeat harmless) is committed with the
/// completion marker in one transaction fenced by the lease, so that only
/// the lease's owner applies it, once.
#[derive(Debug, Clone)]
pub struct Op {
    pub writes: Vec<Write>,
    pub on_conflict: OnConflict,
    /// Whether its own conditions make a repeat harmless (see above).
    pub guarded: bool,
    /// Outbound notifications written (as outbox items) only if the op applies.
    pub outbox: Vec<OutboxMessage>,
    /// The stream position this op applies, if it is an ordered delta: once
    /// it commits, the event waiting for the next position is woken.
    pub advances: Option<sequence::Position>,
}

impl Op {
    /// An op fenced by the lease: committed with the completion marker.
    pub fn new(writes: Vec<Write>, on_conflict: OnConflict) -> Self {
        Self { writes, on_conflict, guarded: false, outbox: Vec::new(), advances: None }
    }

    /// An op whose conditions make its repeat, by anyone, a no-op or the
    /// same write: written on its own before the completion.
    pub fn guarded(writes: Vec<Write>, on_conflict: OnConflict) -> Self {
        Self { guarded: true, ..Self::new(writes, on_conflict) }
    }

    pub fn notify(mut self, msg: OutboxMessage) -> Self {
        self.outbox.push(msg);
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    /// Retrying cannot help (malformed or unsupported payload).
    #[error("permanent: {0}")]
    Permanent(String),
    /// The projection's own logic failed; a later attempt may succeed. Spends
    /// the attempt budget (`max_attempts`), then DEAD (`attempts_exhausted`).
    #[error("transient: {0}")]
    Transient(String),
    /// Infrastructure the projection reads was unavailable (DynamoDB
    /// throttling or errors, the provider's API answering 5xx/429 or not at
    /// all). Does not spend the attempt budget: bounded by time instead.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

pub type PlanFuture<'a> = Pin<Box<dyn Future<Output = Result<Decision, ProjectionError>> + Send + 'a>>;

/// Where projections read: their state, by key, strongly consistent. No
/// SDK client: the state store is a port (the DynamoDB ledger in the
/// functions, the memory world in tests), and writes are the [`Op`]s a
/// projection returns.
#[derive(Clone)]
pub struct ProjectionContext {
    pub state: Arc<dyn StateStore>,
    /// Shards of the `due` index, for state the reconciler re-checks.
    pub shards: u32,
    /// `HOOKLEDGER_RETENTION_DAYS`: how long state that stops mattering
    /// (an ended subscription's entitlement) is kept.
    pub retention_days: u32,
}

impl ProjectionContext {
    pub fn new(state: Arc<dyn StateStore>, shards: u32, retention_days: u32) -> Self {
        Self { state, shards, retention_days }
    }

    /// The state stored under `key` (`sk = "state"`), decoded as its type.
    pub async fn read<S: State>(&self, key: &StateKey<S>) -> Result<Option<S>, ProjectionError> {
        match self.state.read(key.pk(), STATE_SK).await? {
            Some(item) => S::decode(&item).map(Some),
            None => Ok(None),
        }
    }

    /// Whether anything is stored under `key`.
    pub async fn exists<S: State>(&self, key: &StateKey<S>) -> Result<bool, ProjectionError> {
        Ok(self.state.read(key.pk(), STATE_SK).await?.is_some())
    }

    /// Where a state item the reconciler re-checks is due: its `due`
    /// attributes, set on the item (`due_shard` from its subject, `due_at`).
    pub fn recheck_at(&self, subject: &str, due_at_ms: i64) -> [(String, Value); 2] {
        let shard = crate::policy::due_shard_named(
            crate::ledger::DuePartition::Checks.prefix(),
            crate::identity::shard_of(subject, self.shards),
        );
        [("due_shard".to_owned(), s(shard)), ("due_at".to_owned(), n(due_at_ms))]
    }
}

/// Sort key of projection state items.
pub const STATE_SK: &str = "state";

/// A projection: registered for the provider events it handles.
pub trait Projection: Send + Sync {
    fn name(&self) -> &'static str;
    fn handles(&self, provider: &str, event_type: &str) -> bool;
    fn plan<'a>(&'a self, event: &'a EventContext, cx: &'a ProjectionContext) -> PlanFuture<'a>;
    /// The provider subject the event is about (customer, message, SKU), for
    /// operators' filters. Read from the payload only; no I/O.
    fn subject(&self, _event: &EventContext) -> Option<String> {
        None
    }
}

/// The registered projections and the re-checks of their state. Every
/// projection that handles an event plans it; their ops commit together.
#[derive(Clone, Default)]
pub struct Registry {
    projections: Vec<Arc<dyn Projection>>,
    rechecks: recheck::Rechecks,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(mut self, p: impl Projection + 'static) -> Self {
        self.projections.push(Arc::new(p));
        self
    }

    /// Registers a re-check of state a projection keeps (beside it).
    pub fn recheck(mut self, r: impl recheck::Recheck + 'static) -> Self {
        self.rechecks = self.rechecks.register(r);
        self
    }

    /// The re-checks registered, for the reconciler.
    pub fn rechecks(&self) -> recheck::Rechecks {
        self.rechecks.clone()
    }

    /// The first subject a matching projection names.
    pub fn subject(&self, event: &EventContext) -> Option<String> {
        self.matching(&event.provider, &event.event_type).iter().find_map(|p| p.subject(event))
    }

    pub fn matching(&self, provider: &str, event_type: &str) -> Vec<Arc<dyn Projection>> {
        self.projections.iter().filter(|p| p.handles(provider, event_type)).cloned().collect()
    }
}
