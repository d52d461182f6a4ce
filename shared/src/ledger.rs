//! The ledger record and the ports the intake needs.
//!
//! State machine (design §4). The intake only creates records in RECEIVED;
//! the processor and reconciler own the other transitions.
//!
//! ```text
//! (new) ──claim──▶ RECEIVED ──lease──▶ PROCESSING ──commit──▶ PROCESSED
//!                     ▲                  │    │
//!                     │     transient ◀──┘    └── permanent / exhausted ──▶ DEAD
//!                     │     RETRYABLE
//!                     └──── lease expired (crash) is reclaimable
//! ```

use std::future::Future;

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
    /// [`crate::identity::content_hash`]).
    pub content_hash: String,
    pub received_at_ms: i64,
    /// TTL (epoch seconds) after which the identity may be forgotten.
    pub expires_at: i64,
    /// Shard of the sparse index of non-terminal records.
    pub shard: u32,
    /// The send lease the creating delivery holds while it hands the key to
    /// the queue, so concurrent duplicates do not all send it again.
    pub send: SendLease,
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
    /// When the intake last handed the key to the queue; `None`: never sent.
    pub enqueued_at_ms: Option<i64>,
    /// Whether the payload item has been written for this record.
    pub payload_stored: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This call created the record.
    New,
    /// The key was already claimed (by an earlier delivery, a concurrent
    /// one, or our own SDK retry whose first response was lost).
    Existing(ExistingRecord),
}

/// A storage or queue fault. Every variant is retryable from the sender's
/// point of view (the intake answers 503).
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("throttled by {service}")]
    Throttled { service: &'static str },
    #[error("{service} unavailable: {message}")]
    Unavailable { service: &'static str, message: String },
}

/// The durable event ledger (DynamoDB in production).
pub trait Ledger: Send + Sync {
    /// One conditional write: creates the record unless the key exists; on
    /// conflict returns the existing record (no read before the write).
    fn claim(&self, event: &NewEvent) -> impl Future<Output = Result<Claim, PortError>> + Send;
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
}

/// The work queue between intake and processor (SQS in production).
pub trait WorkQueue: Send + Sync {
    fn send(&self, key: &EventKey) -> impl Future<Output = Result<(), PortError>> + Send;
}

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
