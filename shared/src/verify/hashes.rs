//! What a delivery's bytes say, hashed: the payload hash (the exact bytes)
//! and the content hash (the fact, without what a provider re-renders on
//! each attempt), computed together from what the verifier found while
//! reading the identity, so the body is not parsed twice.

use std::ops::Range;

use sha2::{Digest, Sha256};

use super::provider::ProviderKind;
use super::{Content, stripe};
use crate::identity::{hex_digest, payload_hash};

/// Prefix of Stripe content hashes: SHA-256 of the event's bytes with the
/// value of each top-level `pending_webhooks` member replaced by `0`.
const STRIPE_CONTENT_PREFIX: &str = "c2:";
/// Prefix of the Stripe content hashes written before `c2:` (SHA-256 of the
/// event re-serialized by serde_json without `pending_webhooks`); still
/// recognised by [`same_content`].
const LEGACY_STRIPE_CONTENT_PREFIX: &str = "c:";

/// Hash of what a delivery of `provider` (by name, as records store it)
/// says, as opposed to its exact bytes: the provider's
/// [`Provider::content_hash`](super::provider::Provider::content_hash).
/// Providers' retries of one fact may differ in fields that describe the
/// delivery rather than the fact: Stripe re-renders `pending_webhooks` (the
/// count of endpoints still owed this event) on every attempt; such fields
/// are masked. A name no provider is registered under hashes the bytes.
pub fn content_hash(provider: &str, body: &[u8]) -> String {
    ProviderKind::named(provider).map_or_else(|| payload_hash(body), |p| p.content_hash(body))
}

/// A Stripe event's content hash. For a JSON object it is `c2:` and the
/// SHA-256 of the body with the value of every top-level `pending_webhooks`
/// member replaced by `0`: two bodies have the same content hash exactly
/// when they are equal byte for byte outside those values. (The values are
/// masked rather than the members cut out so that every other byte,
/// whitespace included, keeps counting.) Anything else hashes its bytes.
pub(crate) fn stripe_content_hash(body: &[u8]) -> String {
    match stripe::content(body) {
        Some(content) => delivery_hashes(body, &content).1,
        None => payload_hash(body),
    }
}

/// `(payload_hash, content_hash)` of a verified body, computed together from
/// what its verifier found in it ([`crate::verify::Verified::content`]), so
/// the body is not parsed again: it is hashed once, and a Stripe event's
/// content hash shares the hashing of the bytes before its first
/// `pending_webhooks` value. For the content the provider's verifier found,
/// this equals `(payload_hash(body), content_hash(provider, body))`.
pub fn delivery_hashes(body: &[u8], content: &Content) -> (String, String) {
    match content {
        Content::Bytes => {
            let payload = payload_hash(body);
            (payload.clone(), payload)
        }
        Content::StripeEvent { pending_webhooks } => {
            let in_order = pending_webhooks
                .iter()
                .try_fold(0, |at, r| (at <= r.start && r.start < r.end && r.end <= body.len()).then_some(r.end));
            if in_order.is_some() {
                stripe_hashes(body, pending_webhooks)
            } else {
                // Ranges that do not fit this body (not the verified one): find them again.
                match stripe::content(body) {
                    Some(Content::StripeEvent { pending_webhooks }) => stripe_hashes(body, &pending_webhooks),
                    _ => delivery_hashes(body, &Content::Bytes),
                }
            }
        }
    }
}

/// Hashes `body`, and `body` with each of `masked` (ordered, disjoint
/// ranges) replaced by `0`, hashing the bytes before the first range once.
fn stripe_hashes(body: &[u8], masked: &[Range<usize>]) -> (String, String) {
    let Some(first) = masked.first() else {
        let digest = Sha256::digest(body);
        return (hex_digest("", &digest), hex_digest(STRIPE_CONTENT_PREFIX, &digest));
    };
    let mut payload = Sha256::new();
    payload.update(&body[..first.start]);
    let mut content = payload.clone();
    payload.update(&body[first.start..]);
    let mut at = first.start;
    for r in masked {
        content.update(&body[at..r.start]);
        content.update(b"0");
        at = r.end;
    }
    content.update(&body[at..]);
    (hex_digest("", &payload.finalize()), hex_digest(STRIPE_CONTENT_PREFIX, &content.finalize()))
}

/// Whether a record's stored content hash says the same as this delivery's
/// (the provider's [`Provider::same_content`](super::provider::Provider::same_content)).
pub fn same_content(stored: &str, ours: &str, provider: &str, body: &[u8]) -> bool {
    match ProviderKind::named(provider) {
        Some(p) => p.same_content(stored, ours, body),
        None => stored == ours,
    }
}

/// Stripe's: records written before `c2:` hashes carry a `c:` hash; for
/// those the old hash of this body is computed (only here, on the duplicate
/// path), so a retry that differs from such a record only in
/// `pending_webhooks` is still a duplicate and not a conflict.
pub(crate) fn same_stripe_content(stored: &str, ours: &str, body: &[u8]) -> bool {
    stored == ours
        || (stored.starts_with(LEGACY_STRIPE_CONTENT_PREFIX)
            && legacy_stripe_content_hash(body).is_some_and(|legacy| legacy == stored))
}

/// The content hash as written before `c2:` (a full parse and re-serialization).
fn legacy_stripe_content_hash(body: &[u8]) -> Option<String> {
    let serde_json::Value::Object(mut event) = serde_json::from_slice::<serde_json::Value>(body).ok()? else {
        return None;
    };
    event.remove("pending_webhooks");
    let canonical = serde_json::Value::Object(event).to_string();
    Some(hex_digest(LEGACY_STRIPE_CONTENT_PREFIX, &Sha256::digest(canonical.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_retries_that_differ_only_in_pending_webhooks_have_one_content_hash() {
        let first = br#"{"id":"evt_1","object":"event","pending_webhooks":2,"data":{"object":{"id":"pi_1"}}}"#;
        let retry = br#"{"id":"evt_1","object":"event","pending_webhooks":1,"data":{"object":{"id":"pi_1"}}}"#;
        let changed = br#"{"id":"evt_1","object":"event","pending_webhooks":1,"data":{"object":{"id":"pi_2"}}}"#;
        assert_ne!(payload_hash(first), payload_hash(retry));
        assert_eq!(content_hash("stripe", first), content_hash("stripe", retry));
        assert_ne!(content_hash("stripe", first), content_hash("stripe", changed));
        // Other providers: the bytes are the content.
        assert_eq!(content_hash("github", first), payload_hash(first));
        assert_ne!(content_hash("github", first), content_hash("github", retry));
    }

    const FIXTURES: [&[u8]; 4] = [
        include_bytes!("../../testdata/providers/stripe/events/charge.refunded.json"),
        include_bytes!("../../testdata/providers/stripe/events/customer.subscription.updated.json"),
        include_bytes!("../../testdata/providers/stripe/events/openapi-fixtures3-selected-resources.json"),
        include_bytes!("../../testdata/providers/stripe/events/payment_intent.succeeded.json"),
    ];

    fn stripe(body: &str) -> String {
        content_hash("stripe", body.as_bytes())
    }

    #[test]
    fn stripe_content_hash_ignores_only_the_values_of_top_level_pending_webhooks() {
        let base = r#"{"id":"evt_1", "pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#;
        let h = stripe(base);
        assert!(h.starts_with("c2:") && h.len() == 3 + 64, "{h}");
        let same = [
            r#"{"id":"evt_1", "pending_webhooks": 1, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1", "pending_webhooks": 12345, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1", "pending_webhooks": null, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1", "pending_webhooks": {"a":[1]}, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
        ];
        for body in same {
            assert_eq!(stripe(body), h, "{body}");
        }
        let different = [
            // The nested member is part of the event.
            r#"{"id":"evt_1", "pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":2}}}"#,
            // Whitespace, order, escapes and presence all count.
            r#"{"id":"evt_1", "pending_webhooks":2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1","pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"pending_webhooks": 2, "id":"evt_1", "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt\u005f1", "pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1", "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_2", "pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            // Masked, but a literal 0 is not the same as the member's absence of a mask.
            r#"{"id":"evt_1", "pending_webhooks": 0, "data":{"object":{"id":"pi_1","pending_webhooks":1}}, "x":0}"#,
        ];
        for body in different {
            assert_ne!(stripe(body), h, "{body}");
        }
    }

    #[test]
    fn every_top_level_pending_webhooks_is_masked_including_duplicates_and_escaped_names() {
        let a = r#"{"pending_webhooks":1,"id":"e","pending\u005fwebhooks":2,"pending_webhooks":3}"#;
        let b = r#"{"pending_webhooks":9,"id":"e","pending\u005fwebhooks":8,"pending_webhooks":7}"#;
        assert_eq!(stripe(a), stripe(b));
        // The bytes around each masked value still count.
        let c = r#"{"pending_webhooks":1,"id":"f","pending\u005fwebhooks":2,"pending_webhooks":3}"#;
        assert_ne!(stripe(a), stripe(c));
        // A masked event is the body with each value replaced by 0.
        let masked = r#"{"pending_webhooks":0,"id":"e","pending\u005fwebhooks":0,"pending_webhooks":0}"#;
        assert_eq!(stripe(a), format!("c2:{}", payload_hash(masked.as_bytes())));
    }

    #[test]
    fn bodies_that_are_not_json_objects_and_other_providers_hash_the_bytes() {
        for body in [&b"not json"[..], b"[1,2]", b"\"pending_webhooks\"", b"{\"a\":1", b"{\"a\":\"\xff\"}", b""] {
            assert_eq!(content_hash("stripe", body), payload_hash(body));
        }
        let event = FIXTURES[1];
        for provider in ["github", "standard_webhooks", "hmac", "sns"] {
            assert_eq!(content_hash(provider, event), payload_hash(event));
            assert_eq!(delivery_hashes(event, &Content::Bytes), (payload_hash(event), payload_hash(event)));
        }
    }

    #[test]
    fn hashes_computed_together_equal_the_separate_hashes() {
        let mut masked = 0;
        for body in FIXTURES {
            let content = stripe::content(body).expect("fixtures are JSON objects");
            if matches!(&content, Content::StripeEvent { pending_webhooks } if !pending_webhooks.is_empty()) {
                masked += 1;
            }
            let (payload, content_h) = delivery_hashes(body, &content);
            assert_eq!(payload, payload_hash(body));
            assert_eq!(content_h, content_hash("stripe", body));
            // Ranges that do not belong to this body are found again.
            let past_the_end = body.len() - 1..body.len() + 5;
            let stale = Content::StripeEvent { pending_webhooks: Vec::from([past_the_end]) };
            assert_eq!(delivery_hashes(body, &stale), (payload.clone(), content_h.clone()));
            let unordered = Content::StripeEvent { pending_webhooks: vec![10..12, 2..4] };
            assert_eq!(delivery_hashes(body, &unordered), (payload, content_h));
        }
        assert_eq!(masked, 3, "the three events have a top-level pending_webhooks");
        let no_member = br#"{"id":"evt_1"}"#;
        let content = stripe::content(no_member).unwrap();
        assert_eq!(delivery_hashes(no_member, &content).1, format!("c2:{}", payload_hash(no_member)));
    }

    #[test]
    fn records_with_the_earlier_content_hash_still_recognise_a_retry() {
        let first = br#"{"id":"evt_1","object":"event","pending_webhooks":2,"data":{"object":{"id":"pi_1"}}}"#;
        let retry = br#"{"id":"evt_1","object":"event","pending_webhooks":1,"data":{"object":{"id":"pi_1"}}}"#;
        let changed = br#"{"id":"evt_1","object":"event","pending_webhooks":1,"data":{"object":{"id":"pi_2"}}}"#;
        // What the previous release stored for `first` (SHA-256 of
        // {"data":{"object":{"id":"pi_1"}},"id":"evt_1","object":"event"}).
        let stored = "c:28d3a07fa10a706a84a50ce920adac0fd7e7c17a8c3aec78a5a6ea3d6601c876";
        assert_eq!(legacy_stripe_content_hash(first).as_deref(), Some(stored));
        assert!(same_content(stored, &content_hash("stripe", retry), "stripe", retry));
        assert!(!same_content(stored, &content_hash("stripe", changed), "stripe", changed));
        // Current hashes compare as they are.
        let now = content_hash("stripe", first);
        assert!(same_content(&now, &content_hash("stripe", retry), "stripe", retry));
        assert!(!same_content(&now, &content_hash("stripe", changed), "stripe", changed));
        // Other providers never had `c:` hashes.
        assert!(!same_content(stored, &payload_hash(retry), "github", retry));
        assert!(same_content(&payload_hash(retry), &payload_hash(retry), "github", retry));
    }
}
