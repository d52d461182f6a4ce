//! The outbox value: a notification a projection wants sent, the
//! idempotency key that makes its repeats recognisable, and what a
//! dispatcher sees and decides. How it is stored
//! (`adapters::dynamodb::outbox`) and dispatched (`outbox`) sits above.

/// A notification a projection wants sent if (and only if) its op applies.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    pub topic_arn: String,
    /// The logical action, e.g. `subscription.changed`; part of the idempotency key.
    pub action: String,
    /// Ordering group for FIFO topics (e.g. the subject id).
    pub group: String,
    pub body: serde_json::Value,
}

/// A stable idempotency key for one logical outbound action of one event:
/// the same on every attempt, different for different actions.
pub fn idempotency_key(event_key: &str, action: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(format!("{event_key}\n{action}").as_bytes()))
}

/// The outbox item's id (`outbox#<idempotency key>`) of `action` for the
/// event `event_key`: the same on every attempt, so a commit recognised as
/// ours after a lost acknowledgement finds the items it wrote.
pub fn outbox_id(event_key: &str, action: &str) -> String {
    format!("outbox#{}", idempotency_key(event_key, action))
}

/// An outbox item a dispatcher has claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxItem {
    /// The item's key (`outbox#<idempotency key>`).
    pub id: String,
    pub idempotency_key: String,
    pub topic_arn: String,
    pub group: String,
    pub body: String,
    /// Claims so far, this one included.
    pub attempts: u32,
    /// Index shard of the event that wrote it.
    pub shard: u32,
}

/// What a dispatcher's claim met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboxClaim {
    /// Ours now (or already ours: our own retried claim).
    Claimed(OutboxItem),
    /// Sent already, claimed by a live dispatcher, not yet due, or dead.
    Skipped,
}

/// Whether a dispatcher's write after its claim was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Stored (now, or by our own earlier try whose acknowledgement was lost).
    Yes,
    /// The claim lapsed and another dispatcher took the item over.
    Lapsed,
}

/// The outcome of one dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatched {
    Published,
    /// Sent already, claimed by a live dispatcher, not yet due, or dead.
    Skipped,
    /// The publish failed; the item is PENDING again, due after its backoff.
    Retrying {
        attempts: u32,
        error: String,
    },
    /// The publish failed and the attempts are exhausted: the item is DEAD.
    Dead {
        attempts: u32,
        error: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_stable_per_action() {
        let a = idempotency_key("evt#stripe#e#evt_1", "notify");
        assert_eq!(a, idempotency_key("evt#stripe#e#evt_1", "notify"));
        assert_ne!(a, idempotency_key("evt#stripe#e#evt_1", "email"));
        assert_ne!(a, idempotency_key("evt#stripe#e#evt_2", "notify"));
    }
}
