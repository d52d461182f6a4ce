//! What a delivery's bytes say, hashed: the payload hash (the exact bytes)
//! and the content hash (the fact, without what a provider re-renders on
//! each attempt), computed together from what the verifier found while
//! reading the identity, so the body is not parsed twice. The content hash
//! of a stored body, by provider name, is `verify::registry::content_hash`.

use super::{Content, stripe};
use crate::identity::{masked_hashes, payload_hash};

/// Prefix of the content hashes of bodies with masked values (an endpoint's `mask`).
const MASKED_PREFIX: &str = "m:";

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
        Content::StripeEvent { pending_webhooks } => stripe::delivery_hashes(body, pending_webhooks),
        Content::Hashed { payload } => (payload.clone(), payload.clone()),
        Content::Masked { ranges } => {
            let fits = ranges
                .iter()
                .try_fold(0, |at, r| (at <= r.start && r.start < r.end && r.end <= body.len()).then_some(r.end));
            match fits {
                Some(_) => masked_hashes(body, ranges, MASKED_PREFIX),
                None => delivery_hashes(body, &Content::Bytes),
            }
        }
    }
}
