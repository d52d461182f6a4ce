//! Providers, one module each: its signature verifier and its `impl
//! Provider` (`provider.rs`: the trait; `registry.rs`: every provider by
//! name; `certificates.rs`: SNS's signing certificates).
//!
//! Every verifier takes the raw body bytes and the request headers, checks the
//! signature before it interprets anything in the body, compares in constant
//! time and returns a typed [`VerifyError`]. Only after a successful check does
//! it read the event identity and type from the payload.

pub mod asana;
pub mod certificates;
pub mod discord;
mod elements;
pub mod generic;
pub mod github;
pub mod graph;
pub mod hashes;
mod headers;
pub(crate) mod json;
mod meta;
pub mod presets;
pub mod provider;
pub mod quiltt;
pub mod registry;
pub mod sns;
pub mod standard;
pub mod stripe;

use std::borrow::Cow;
use std::ops::Range;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub use headers::header_values;

/// What a verified delivery asks the intake to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// An event to claim and hand to the processor.
    Record,
    /// An SNS subscription confirmation for an allowed topic: visit the URL.
    ConfirmSubscription { subscribe_url: url::Url },
    /// An SNS unsubscribe confirmation: acknowledged, nothing recorded.
    Unsubscribed,
    /// A delivery carrying several events (Quiltt): each is claimed and
    /// handed to the processor as an event of its own.
    Batch(Vec<BatchEvent>),
    /// A handshake the provider asked for (Slack's `url_verification`),
    /// authenticated: answered 200 with `body` as `content_type`, nothing recorded.
    Reply { content_type: &'static str, body: String },
    /// A handshake answered by echoing a header (Asana's `X-Hook-Secret`,
    /// once the secret is stored): 200 with no body, nothing recorded.
    ReplyHeader { name: &'static str, value: String },
    /// A message a provider sends without an identity by design (Slack's
    /// `app_rate_limited`), authenticated: acknowledged (200), counted,
    /// nothing recorded.
    Acknowledge { what: &'static str },
}

/// The longest value a handshake's answer echoes.
pub const MAX_ECHO_LEN: usize = 256;

/// Whether `v` may be echoed by a handshake's answer: 1 to
/// [`MAX_ECHO_LEN`] letters, digits and `._~-` (`^[A-Za-z0-9._~-]{1,256}$`).
/// Every echo is also sent as `text/plain` with `nosniff`.
pub fn echoable(v: &str) -> bool {
    (1..=MAX_ECHO_LEN).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._~-".contains(&b))
}

/// The id a batch's element is recorded under when it cannot be read as an
/// event (no id, an id that cannot be one, no type where the provider
/// always names one, not an object): `malformed:` and the SHA-256 of its
/// bytes, so the provider's retry of the batch meets it again. The
/// processor parks such a record (`malformed_element`) for an operator; the
/// batch's other events are recorded as usual.
pub const MALFORMED_ID_PREFIX: &str = "malformed:";

/// The most events one batch delivery may carry (Meta batches up to 1,000).
pub const MAX_BATCH_EVENTS: usize = 1_000;

/// The reason a malformed element's record is parked with.
pub const MALFORMED_ELEMENT: &str = "malformed_element";

/// Whether an event id is a malformed element's ([`MALFORMED_ID_PREFIX`]).
pub fn is_malformed_element(event_id: &str) -> bool {
    event_id.starts_with(MALFORMED_ID_PREFIX)
}

/// The element at `range` of `body`, kept as a malformed element
/// ([`MALFORMED_ID_PREFIX`]); `why` is logged, never its bytes.
pub(crate) fn malformed_element(body: &[u8], range: Range<usize>, why: &'static str) -> BatchEvent {
    let event_id = format!("{MALFORMED_ID_PREFIX}{}", crate::identity::payload_hash(&body[range.clone()]));
    tracing::warn!(event_id = %event_id, why, "an element of a batch is kept as malformed");
    BatchEvent { event_id, event_type: None, bytes: range, content: Content::Bytes }
}

/// Adds `event` to a batch's events, unless an event with its id is there:
/// two equal malformed elements are one; two events of one id refuse the
/// batch (one would hide the other).
pub(crate) fn push_event(out: &mut Vec<BatchEvent>, event: BatchEvent) -> Result<(), VerifyError> {
    if out.iter().any(|e| e.event_id == event.event_id) {
        if is_malformed_element(&event.event_id) {
            return Ok(());
        }
        return Err(VerifyError::MalformedPayload("two events of the batch have the same id"));
    }
    out.push(event);
    Ok(())
}

/// One event of a batch delivery: its identity, and which bytes of the
/// signed body are the event (its payload: a slice, never re-serialised).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEvent {
    pub event_id: String,
    pub event_type: Option<String>,
    pub bytes: Range<usize>,
    /// What the event's bytes say (ranges relative to the event's bytes).
    pub content: Content,
}

/// The authenticated facts a verifier extracts from a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The provider's stable identifier for this fact (kept across retries).
    pub event_id: String,
    /// The provider's event type, when the protocol names one.
    pub event_type: Option<String>,
    pub action: Action,
    /// Which bytes of the verified body say what the fact is (see
    /// [`hashes::delivery_hashes`]), found while reading the identity.
    pub content: Content,
}

impl Verified {
    pub fn record(event_id: String, event_type: Option<String>) -> Self {
        Self { event_id, event_type, action: Action::Record, content: Content::Bytes }
    }
}

/// Which bytes of a verified body make up the fact it delivers, as opposed to
/// the delivery. Byte ranges refer to the body the verifier was given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Content {
    /// Every byte: the content hash is the payload hash.
    #[default]
    Bytes,
    /// A Stripe event (a JSON object): every byte but the values of its
    /// top-level `pending_webhooks` members, which Stripe re-renders on each
    /// attempt.
    StripeEvent { pending_webhooks: Vec<Range<usize>> },
    /// Every byte but these values (ordered, disjoint): the fields an
    /// endpoint's `mask` names, which its provider changes between retries.
    Masked { ranges: Vec<Range<usize>> },
    /// Every byte, whose payload hash the verifier already computed (an
    /// identity that is the body's hash).
    Hashed { payload: String },
}

/// Why a delivery was not accepted by its verifier.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("malformed header {0}")]
    MalformedHeader(&'static str),
    #[error("no signature matches any active secret")]
    SignatureMismatch,
    #[error("timestamp is older than the tolerance")]
    StaleTimestamp,
    #[error("timestamp is further in the future than the tolerance")]
    FutureTimestamp,
    #[error("message is not a well-formed signed envelope: {0}")]
    MalformedEnvelope(&'static str),
    #[error("signing certificate URL rejected: {0}")]
    CertificateUrl(&'static str),
    #[error("signing certificate rejected: {0}")]
    CertificateInvalid(&'static str),
    #[error("signing certificate could not be fetched")]
    CertificateUnavailable,
    #[error("topic is not allowed for this endpoint")]
    TopicNotAllowed,
    #[error("signed payload is malformed: {0}")]
    MalformedPayload(&'static str),
    /// A handshake this endpoint does not take now (Asana's secret offered
    /// outside an operator's window, or once one is stored).
    #[error("handshake refused: {0}")]
    HandshakeRefused(&'static str),
    /// A store the check needs could not answer (retry later).
    #[error("a store the check needs is unavailable: {0}")]
    Unavailable(&'static str),
}

impl VerifyError {
    /// A short stable label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingHeader(_) => "missing_header",
            Self::MalformedHeader(_) => "malformed_header",
            Self::SignatureMismatch => "signature_mismatch",
            Self::StaleTimestamp => "stale_timestamp",
            Self::FutureTimestamp => "future_timestamp",
            Self::MalformedEnvelope(_) => "malformed_envelope",
            Self::CertificateUrl(_) => "certificate_url",
            Self::CertificateInvalid(_) => "certificate_invalid",
            Self::CertificateUnavailable => "certificate_unavailable",
            Self::TopicNotAllowed => "topic_not_allowed",
            Self::MalformedPayload(_) => "malformed_payload",
            Self::HandshakeRefused(_) => "handshake_refused",
            Self::Unavailable(_) => "unavailable",
        }
    }
}

/// Upper bound on signature candidates looked at per request, so a header
/// stuffed with thousands of entries cannot buy unbounded HMAC work.
pub const MAX_SIGNATURE_CANDIDATES: usize = 16;

/// Longest provider identifier accepted as an event identity.
pub const MAX_EVENT_ID_LEN: usize = 256;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA256 over the concatenation of `parts`.
pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC accepts keys of any length; new_from_slice cannot fail for it.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    for p in parts {
        mac.update(p);
    }
    mac
}

/// The finished MAC bytes (for signing helpers).
pub(crate) fn mac_bytes(mac: HmacSha256) -> Vec<u8> {
    mac.finalize().into_bytes().to_vec()
}

/// Constant-time check of `candidate` against the MAC state (consumes a clone).
pub(crate) fn mac_matches(mac: &HmacSha256, candidate: &[u8]) -> bool {
    mac.clone().verify_slice(candidate).is_ok()
}

/// Checks a signed timestamp against `now` with a symmetric tolerance.
pub(crate) fn check_timestamp(ts: i64, now: i64, tolerance_secs: i64) -> Result<(), VerifyError> {
    if ts < now.saturating_sub(tolerance_secs) {
        return Err(VerifyError::StaleTimestamp);
    }
    if ts > now.saturating_add(tolerance_secs) {
        return Err(VerifyError::FutureTimestamp);
    }
    Ok(())
}

/// Validates a provider identifier before it becomes part of a ledger key.
pub(crate) fn checked_event_id(id: &str) -> Result<String, VerifyError> {
    if id.is_empty() || id.len() > MAX_EVENT_ID_LEN || id.chars().any(char::is_control) {
        return Err(VerifyError::MalformedPayload("event id is empty, too long or has control characters"));
    }
    Ok(id.to_owned())
}

/// The top-level members of a JSON event that the intake reads, found in one
/// pass: `id` and `type` when they are strings (the last of duplicates, as a
/// parser into a map keeps) and where the values of `pending_webhooks` are.
#[derive(Debug)]
pub(crate) struct EventFields<'a> {
    pub object: bool,
    pub id: Option<Cow<'a, str>>,
    pub event_type: Option<Cow<'a, str>>,
    pub pending_webhooks: Vec<Range<usize>>,
}

/// Reads [`EventFields`]; `Err` when the body is not JSON.
pub(crate) fn event_fields(body: &[u8]) -> Result<EventFields<'_>, json::NotJson> {
    let (mut id, mut event_type, mut pending_webhooks) = (None, None, Vec::new());
    let kind = json::scan(body, |entry| {
        if let json::Key::Name(name) = &entry.key {
            match name.as_ref() {
                "id" => id = Some(entry.value),
                "type" => event_type = Some(entry.value),
                "pending_webhooks" => pending_webhooks.push(entry.value),
                _ => {}
            }
        }
    })?;
    Ok(EventFields {
        object: kind == json::Kind::Object,
        id: id.and_then(|r| json::string_at(body, &r)),
        event_type: event_type.and_then(|r| json::string_at(body, &r)),
        pending_webhooks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_window_is_symmetric_and_inclusive() {
        assert_eq!(check_timestamp(1000, 1300, 300), Ok(()));
        assert_eq!(check_timestamp(1600, 1300, 300), Ok(()));
        assert_eq!(check_timestamp(999, 1300, 300), Err(VerifyError::StaleTimestamp));
        assert_eq!(check_timestamp(1601, 1300, 300), Err(VerifyError::FutureTimestamp));
    }

    #[test]
    fn event_ids_are_bounded() {
        assert!(checked_event_id("evt_1").is_ok());
        assert!(checked_event_id("").is_err());
        assert!(checked_event_id(&"a".repeat(MAX_EVENT_ID_LEN + 1)).is_err());
        assert!(checked_event_id("evt\n1").is_err());
    }

    #[test]
    fn only_plain_values_are_echoed() {
        assert!(echoable("tHiSiSaChAlLeNgE-1234"));
        assert!(echoable(&"a".repeat(MAX_ECHO_LEN)));
        for bad in ["", "a b", "<script>", "a&b", "a\nb", "é", &"a".repeat(MAX_ECHO_LEN + 1)] {
            assert!(!echoable(bad), "{bad:?}");
        }
    }
}
