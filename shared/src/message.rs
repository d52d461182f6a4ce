//! The outbox value: a notification a projection wants sent, and the
//! idempotency key that makes its repeats recognisable. How it is stored
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
