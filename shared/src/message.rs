//! The outbox value: a notification a projection wants sent, the
//! idempotency key that makes its repeats recognisable, and what a
//! dispatcher sees and decides. How it is stored
//! (`adapters::dynamodb::outbox`) and dispatched (`outbox`) sits above.

/// A notification a projection wants sent if (and only if) its op applies,
/// or a route's delivery of the event to a destination.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// Where it goes: an SNS topic's ARN (a projection's notification), or
    /// a route destination's (an SNS topic, an SQS queue, an EventBridge
    /// bus). The item's attribute keeps the name it had when only topics
    /// could be named.
    pub topic_arn: String,
    /// The logical action, e.g. `subscription.changed`; part of the idempotency key.
    pub action: String,
    /// Ordering group for FIFO topics (e.g. the subject id).
    pub group: String,
    /// The message; for a route's delivery, the envelope without the
    /// event, which the dispatcher adds from the ledger (the item refers to
    /// the event, it does not copy it).
    pub body: serde_json::Value,
    /// A route's delivery (`None`: a projection's notification).
    pub delivery: Option<Delivery>,
}

/// What a route's delivery carries besides a notification's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The destination's name in `HOOKLEDGER_ROUTES`.
    pub destination: String,
    /// EventBridge: the events' `Source` and `DetailType` (the event type).
    pub source: String,
    pub detail_type: String,
    /// The event's payload (the envelope's `event`), by its hash.
    pub payload_hash: String,
    /// When the event was received (the receipt-to-delivery latency).
    pub received_at_ms: i64,
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
    /// The event that wrote it (`evt#…`).
    pub event_key: String,
    /// When the commit wrote it.
    pub created_at_ms: i64,
    /// A route's delivery (`None`: a projection's notification).
    pub delivery: Option<Delivery>,
}

impl OutboxItem {
    /// The item a commit by the event `key` wrote for `msg` (a route's
    /// delivery is written claimed by the committing lease: attempt 1).
    pub fn committed(key: &crate::identity::EventKey, msg: &OutboxMessage, shards: u32, now_ms: i64) -> Self {
        Self {
            id: outbox_id(key.as_str(), &msg.action),
            idempotency_key: idempotency_key(key.as_str(), &msg.action),
            topic_arn: msg.topic_arn.clone(),
            group: msg.group.clone(),
            body: msg.body.to_string(),
            attempts: 1,
            shard: key.shard(shards),
            event_key: key.as_str().to_owned(),
            created_at_ms: now_ms,
            delivery: msg.delivery.clone(),
        }
    }
}

/// How long a dispatcher may hold an outbox item between claim and mark
/// (also the claim a route's delivery is committed with).
pub const DISPATCH_LEASE_MS: i64 = 30_000;

/// The largest message a destination takes (SNS, SQS and EventBridge:
/// 256 KiB); the code checks it before sending (the emulator checks none).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// What a route's message may count at most, with what its destination
/// counts besides the body (`routes::counted_bytes`): the limit less a
/// margin for what a service counts undocumented (EventBridge's JSON keys).
pub const MAX_COUNTED_BYTES: usize = MAX_MESSAGE_BYTES - 1024;

/// The message attribute carrying the idempotency key (SNS and SQS
/// destinations): consumers de-duplicate on it.
pub const IDEMPOTENCY_ATTRIBUTE: &str = "idempotency-key";

/// The longest `MessageGroupId` SQS and SNS FIFO take.
pub const MAX_GROUP_ID: usize = 128;

/// The `MessageGroupId` a message of `group` is sent with: the group itself
/// when SQS and SNS take it (1-128 characters, each an ASCII letter, digit
/// or punctuation `!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~`), else `sha256-` and
/// the group's SHA-256 in hex (71 characters), so the same group (a
/// subject) is always sent in the same one. Empty stays empty (the
/// publisher's default group).
pub fn message_group_id(group: &str) -> std::borrow::Cow<'_, str> {
    use sha2::{Digest, Sha256};
    let valid =
        group.len() <= MAX_GROUP_ID && group.bytes().all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation());
    if valid {
        std::borrow::Cow::Borrowed(group)
    } else {
        std::borrow::Cow::Owned(format!("sha256-{}", hex::encode(Sha256::digest(group.as_bytes()))))
    }
}

/// A route's envelope with the event added: its JSON as received, or
/// `event_base64` for a body that is not JSON. `head` is the envelope's
/// JSON object without the event.
pub fn envelope(head: &str, payload: &[u8]) -> String {
    use base64::Engine;
    let head = head.trim_end();
    let open = head.strip_suffix('}').unwrap_or(head);
    let sep = if open.trim_end().ends_with('{') { "" } else { "," };
    if serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok() {
        // Its exact bytes: JSON as the provider sent it (whitespace and key order kept).
        let raw = String::from_utf8_lossy(payload);
        format!("{open}{sep}\"event\":{}}}", raw.trim())
    } else {
        let b64 = base64::engine::general_purpose::STANDARD.encode(payload);
        format!("{open}{sep}\"event_base64\":\"{b64}\"}}")
    }
}

/// An outbox item as an operator reads it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OutboxState {
    pub id: String,
    /// `PENDING`, `SENDING`, `SENT` or `DEAD`.
    pub status: String,
    /// A route's destination (`None`: a projection's notification).
    pub destination: Option<String>,
    pub event_key: String,
    pub idempotency_key: String,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// When it is due next (PENDING, SENDING).
    pub due_at: Option<i64>,
    pub sent_at: Option<i64>,
    pub dead_at: Option<i64>,
    /// When it was committed (or replayed).
    pub created_at: Option<i64>,
    /// The rate limit's grant it was sent under (a limited destination).
    pub granted_at: Option<i64>,
    /// The replay run (`deliveries replay`) that gave it a new attempt last.
    pub replay_run: Option<String>,
    /// Its destination's waiting partition it is in (circuit open), if any.
    pub waiting: bool,
    /// When its last attempt failed (with `last_error`).
    pub last_failed_at: Option<i64>,
}

/// A route's envelope too large to carry its event: `payload_ref` instead
/// (the bucket, the object's key, the payload's SHA-256).
pub fn envelope_with_ref(head: &str, payload_ref: &serde_json::Value) -> String {
    let head = head.trim_end();
    let open = head.strip_suffix('}').unwrap_or(head);
    let sep = if open.trim_end().ends_with('{') { "" } else { "," };
    format!("{open}{sep}\"payload_ref\":{payload_ref}}}")
}

/// What a dispatcher's claim met. (One is made per dispatch and moved
/// once: the item is not boxed.)
#[allow(clippy::large_enum_variant)]
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
    /// The publish failed; the item is PENDING again, due at `next_at_ms`.
    Retrying {
        attempts: u32,
        error: String,
        next_at_ms: i64,
    },
    /// Not sent: its destination's circuit is open (until `until_ms`). The
    /// item waits in its destination's waiting partition, no attempt spent,
    /// until the destination is back and drains it.
    Waiting {
        until_ms: i64,
    },
    /// Not sent yet: its destination's limit (rate or in flight) lets it
    /// go at `until_ms`; it waits on the delivery queue, still claimed.
    Paced {
        until_ms: i64,
        /// Whether it holds its grant (else it asks again then).
        granted: bool,
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
    fn the_envelope_carries_the_event_as_received() {
        let head = r#"{"provider":"stripe","idempotency_key":"k"}"#;
        let with = envelope(head, br#"{ "id" : "evt_1" }"#);
        assert_eq!(with, r#"{"provider":"stripe","idempotency_key":"k","event":{ "id" : "evt_1" }}"#);
        let v: serde_json::Value = serde_json::from_str(&with).unwrap();
        assert_eq!(v["event"]["id"], "evt_1");
        let form = envelope(head, b"a=1&b=2");
        let v: serde_json::Value = serde_json::from_str(&form).unwrap();
        assert_eq!(v["event_base64"], "YT0xJmI9Mg==");
        assert_eq!(envelope("{}", b"[1]"), r#"{"event":[1]}"#);
    }

    #[test]
    fn group_ids_are_kept_when_valid_and_hashed_otherwise() {
        assert_eq!(message_group_id("cus_7"), "cus_7");
        assert_eq!(message_group_id("a@b.example"), "a@b.example");
        let punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
        assert_eq!(message_group_id(punct), punct);
        assert_eq!(message_group_id(""), "");
        let edge = "x".repeat(MAX_GROUP_ID);
        assert_eq!(message_group_id(&edge), edge.as_str());
        for bad in ["x".repeat(MAX_GROUP_ID + 1), "a b".into(), "jöhn".into(), "tab\t".into()] {
            let id = message_group_id(&bad);
            assert!(id.starts_with("sha256-") && id.len() == 71, "{bad:?}: {id}");
            assert_eq!(id, message_group_id(&bad), "deterministic");
        }
        assert_ne!(message_group_id("a b"), message_group_id("a  b"));
    }

    #[test]
    fn idempotency_keys_are_stable_per_action() {
        let a = idempotency_key("evt#stripe#e#evt_1", "notify");
        assert_eq!(a, idempotency_key("evt#stripe#e#evt_1", "notify"));
        assert_ne!(a, idempotency_key("evt#stripe#e#evt_1", "email"));
        assert_ne!(a, idempotency_key("evt#stripe#e#evt_2", "notify"));
    }
}

/// What a reconciler run started for deliveries waiting on their destination.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Drains {
    /// Destinations back, with deliveries waiting, whose drain was handed to the queue.
    pub started: u32,
    /// Without a queue: waiting deliveries sent by the run itself.
    pub sent: u32,
    /// Destinations whose circuit is open (deliveries may wait for it).
    pub open: u32,
}
