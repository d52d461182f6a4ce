//! "Object changed" notifications: fetch the authoritative state from the
//! provider, then replace the projection only if the fetched version is newer.
//!
//! Two workers may fetch at different moments and finish in the opposite
//! order. The fetched snapshot carries a version — the object's own version
//! when it has one, else the time of the fetch (provider reads are taken as
//! monotonic) — and the write goes through `snapshot::replace_if_newer`, so
//! the later read always wins, whichever commits last.

use std::future::Future;
use std::pin::Pin;

/// A provider object as fetched, with the version that orders fetches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched<T> {
    pub object: T,
    pub version: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("provider unavailable: {0}")]
    Unavailable(String),
    #[error("provider rejected the request: {0}")]
    Rejected(String),
}

/// A subscription as the provider reports it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub id: String,
    pub customer: String,
    pub status: String,
    pub seats: i64,
}

/// What a subscription fetch returns.
pub type SubscriptionFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Fetched<Option<Subscription>>, ProviderError>> + Send + 'a>>;

/// The provider API the reference application reads (Stripe's, in production).
pub trait SubscriptionSource: Send + Sync {
    /// `object: None` when the provider no longer has the subscription.
    fn subscription<'a>(&'a self, id: &'a str) -> SubscriptionFuture<'a>;
}

/// Kept here for callers of the fetch building block; defined with the outbox value.
pub use crate::message::idempotency_key;
