//! Projection state, read through a port. A projection names each kind of
//! state it keeps by a typed key ([`StateKey<S>`]): the key's type says how
//! the stored item decodes ([`State`]), so a reader cannot take one
//! projection's item for another's, and a test reads the same types from
//! the memory world as the functions read from DynamoDB.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use super::ProjectionError;
use crate::item::Item;

/// What a state read returns: the stored item, if any.
pub type StateFuture<'a> = Pin<Box<dyn Future<Output = Result<Option<Item>, ProjectionError>> + Send + 'a>>;

/// The store projections read their state from: one strongly consistent
/// read by key. Implemented by the DynamoDB ledger (one `GetItem`) and by
/// the memory world; the contract suite holds both to the same answers.
/// A store that cannot answer says [`ProjectionError::Unavailable`].
pub trait StateStore: Send + Sync {
    fn read<'a>(&'a self, pk: &'a str, sk: &'a str) -> StateFuture<'a>;
}

/// A kind of projection state: how its stored item decodes. A stored item
/// that does not decode is [`ProjectionError::Permanent`] (retrying reads
/// the same item).
pub trait State: Sized {
    fn decode(item: &Item) -> Result<Self, ProjectionError>;
}

/// The whole stored item, for state without a type of its own.
impl State for Item {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        Ok(item.clone())
    }
}

/// The key of one state item, tied to the type it decodes as.
pub struct StateKey<S> {
    pk: String,
    state: PhantomData<fn() -> S>,
}

impl<S> StateKey<S> {
    pub fn new(pk: impl Into<String>) -> Self {
        Self { pk: pk.into(), state: PhantomData }
    }

    /// The item's partition key (its sort key is `state`).
    pub fn pk(&self) -> &str {
        &self.pk
    }
}

impl<S> Clone for StateKey<S> {
    fn clone(&self) -> Self {
        Self::new(self.pk.clone())
    }
}

impl<S> std::fmt::Debug for StateKey<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateKey({})", self.pk)
    }
}

impl<S> PartialEq for StateKey<S> {
    fn eq(&self, other: &Self) -> bool {
        self.pk == other.pk
    }
}

/// A required number of a stored item, or a permanent error naming it.
pub fn required_n(item: &Item, name: &str) -> Result<i64, ProjectionError> {
    crate::item::get_n(item, name)
        .ok_or_else(|| ProjectionError::Permanent(format!("stored state has no whole number `{name}`")))
}

/// A required string of a stored item, or a permanent error naming it.
pub fn required_s<'a>(item: &'a Item, name: &str) -> Result<&'a str, ProjectionError> {
    crate::item::get_s(item, name)
        .ok_or_else(|| ProjectionError::Permanent(format!("stored state has no string `{name}`")))
}
