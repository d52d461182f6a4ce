//! Projections: user code that turns one verified provider event into
//! DynamoDB writes, committed in the same transaction as the ledger's
//! completion marker (fenced by the lease token).
//!
//! A projection returns a [`Decision`]. Its writes come grouped in [`Op`]s,
//! built from the contract building blocks of design §6:
//!
//! | contract | building block |
//! |---|---|
//! | full snapshot + monotonic revision | [`snapshot::replace_if_newer`] |
//! | status with precedence | [`precedence::advance`] |
//! | independent additive operation | [`additive::apply_once`] |
//! | ordered deltas with sequence | [`sequence::decide`] + [`sequence::apply_next`] |
//! | "object changed" notification | [`fetch`]: fetch, then `replace_if_newer` by fetched version |
//!
//! Every op carries the conditions that make it safe to repeat; when one
//! fails, [`OnConflict`] says what that means, so a retry after a crash
//! converges to the state of applying the event once.

pub mod additive;
pub mod fetch;
pub mod precedence;
pub mod sequence;
pub mod snapshot;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use crate::identity::EventKey;
use crate::ledger::error_chain;
use crate::message::OutboxMessage;

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
}

/// What the projection wants done with the event.
#[derive(Debug)]
pub enum Decision {
    /// Commit these ops (possibly none) with the completion marker.
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

/// A group of writes that stand or fall together within the transaction.
#[derive(Debug, Clone)]
pub struct Op {
    pub writes: Vec<TransactWriteItem>,
    pub on_conflict: OnConflict,
    /// Outbound notifications written (as outbox items) only if the op applies.
    pub outbox: Vec<OutboxMessage>,
    /// The stream position this op applies, if it is an ordered delta: once
    /// it commits, the event waiting for the next position is woken.
    pub advances: Option<sequence::Position>,
}

impl Op {
    pub fn new(writes: Vec<TransactWriteItem>, on_conflict: OnConflict) -> Self {
        Self { writes, on_conflict, outbox: Vec::new(), advances: None }
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

/// Where projections read and write.
#[derive(Clone)]
pub struct ProjectionContext {
    pub ddb: aws_sdk_dynamodb::Client,
    pub table: String,
    /// Shards of the `due` index, for projections the reconciler checks.
    pub shards: u32,
    /// `HOOKLEDGER_RETENTION_DAYS`: how long state that stops mattering
    /// (an ended subscription's entitlement) is kept.
    pub retention_days: u32,
}

impl ProjectionContext {
    /// A strongly consistent read of one projection item (`sk = "state"`).
    pub async fn read_state(&self, pk: &str) -> Result<Option<HashMap<String, AttributeValue>>, ProjectionError> {
        let out = self
            .ddb
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.to_owned()))
            .key("sk", AttributeValue::S(STATE_SK.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| ProjectionError::Unavailable(error_chain(&e)))?;
        Ok(out.item)
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

/// The registered projections. Every projection that handles an event plans
/// it; their ops commit together.
#[derive(Clone, Default)]
pub struct Registry {
    projections: Vec<Arc<dyn Projection>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(mut self, p: impl Projection + 'static) -> Self {
        self.projections.push(Arc::new(p));
        self
    }

    /// The first subject a matching projection names.
    pub fn subject(&self, event: &EventContext) -> Option<String> {
        self.matching(&event.provider, &event.event_type).iter().find_map(|p| p.subject(event))
    }

    pub fn matching(&self, provider: &str, event_type: &str) -> Vec<Arc<dyn Projection>> {
        self.projections.iter().filter(|p| p.handles(provider, event_type)).cloned().collect()
    }
}

/// Helpers shared by the building blocks.
pub(crate) fn key_of(pk: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("pk".to_owned(), AttributeValue::S(pk.to_owned())),
        ("sk".to_owned(), AttributeValue::S(STATE_SK.to_owned())),
    ])
}

/// A DynamoDB number attribute.
pub fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A DynamoDB string attribute.
pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// Reads a number attribute from a stored item.
pub fn get_n(item: &HashMap<String, AttributeValue>, name: &str) -> Option<i64> {
    item.get(name).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok())
}

/// Reads a string attribute from a stored item.
pub fn get_s<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> Option<&'a str> {
    item.get(name).and_then(|v| v.as_s().ok()).map(String::as_str)
}
