//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`, HMAC-SHA256
//! over `"{t}.{raw body}"`, keyed with the endpoint secret's UTF-8 bytes.

use std::borrow::Cow;
use std::ops::Range;

use http::HeaderMap;
use sha2::{Digest, Sha256};

use super::headers::{list_items, parse_unix_secs};
use super::provider::{
    BackfillList, BuildContext, Delivery, EndpointSpec, Identity, Provider, SuccessAnswer, Verifier, Verifying, ready,
};
use super::{
    Content, MAX_SIGNATURE_CANDIDATES, Verified, VerifyError, check_timestamp, checked_event_id, event_fields,
    hmac_sha256, mac_bytes, mac_matches,
};
use crate::identity::{hex_digest, masked_hashes, payload_hash};
use crate::secret::Secret;

pub const SIGNATURE_HEADER: &str = "stripe-signature";
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

#[derive(Debug, Clone)]
pub struct StripeVerifier {
    secrets: Vec<Secret>,
    tolerance_secs: i64,
}

impl StripeVerifier {
    /// `secrets` are all active endpoint secrets (more than one during rotation).
    pub fn new(secrets: Vec<Secret>, tolerance_secs: i64) -> Self {
        Self { secrets, tolerance_secs }
    }

    pub fn verify(&self, body: &[u8], headers: &HeaderMap, now: i64) -> Result<Verified, VerifyError> {
        let (timestamp, candidates) = parse_header(headers)?;
        let ts_text = timestamp.to_string();
        let matched = self.secrets.iter().any(|secret| {
            let mac = hmac_sha256(secret.expose(), &[ts_text.as_bytes(), b".", body]);
            candidates.iter().any(|c| mac_matches(&mac, c))
        });
        if !matched {
            return Err(VerifyError::SignatureMismatch);
        }
        check_timestamp(timestamp, now, self.tolerance_secs)?;

        // Authenticated from here on: read the event identity.
        // One pass checks the JSON and finds the identity and the fields
        // that describe the delivery rather than the event.
        let fields = event_fields(body).map_err(|_| VerifyError::MalformedPayload("body is not JSON"))?;
        let id = fields.id.ok_or(VerifyError::MalformedPayload("event has no id"))?;
        let mut verified = Verified::record(checked_event_id(&id)?, fields.event_type.map(Cow::into_owned));
        verified.content = Content::StripeEvent { pending_webhooks: fields.pending_webhooks };
        Ok(verified)
    }
}

/// What a Stripe event's content hash covers; `None` when the body is not a JSON object.
pub(crate) fn content(body: &[u8]) -> Option<Content> {
    let fields = event_fields(body).ok().filter(|f| f.object)?;
    Some(Content::StripeEvent { pending_webhooks: fields.pending_webhooks })
}

/// Extracts the single `t` and up to [`MAX_SIGNATURE_CANDIDATES`] decoded `v1` values.
fn parse_header(headers: &HeaderMap) -> Result<(i64, Vec<Vec<u8>>), VerifyError> {
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for item in list_items(headers, SIGNATURE_HEADER)? {
        let Some((key, value)) = item.split_once('=') else {
            return Err(VerifyError::MalformedHeader(SIGNATURE_HEADER));
        };
        match key {
            "t" => {
                let t = parse_unix_secs(value, SIGNATURE_HEADER)?;
                // A repeated t with another value is ambiguous: refuse it.
                if timestamp.replace(t).is_some_and(|old| old != t) {
                    return Err(VerifyError::MalformedHeader(SIGNATURE_HEADER));
                }
            }
            "v1" if candidates.len() < MAX_SIGNATURE_CANDIDATES => {
                // Undecodable entries cannot match; skip them rather than
                // failing, so one garbled entry does not mask a valid one.
                if let Ok(sig) = hex::decode(value) {
                    candidates.push(sig);
                }
            }
            _ => {} // v0 and future schemes are not checked.
        }
    }
    let timestamp = timestamp.ok_or(VerifyError::MalformedHeader(SIGNATURE_HEADER))?;
    if candidates.is_empty() {
        return Err(VerifyError::SignatureMismatch);
    }
    Ok((timestamp, candidates))
}

/// Prefix of Stripe content hashes: SHA-256 of the event's bytes with the
/// value of each top-level `pending_webhooks` member replaced by `0`.
const CONTENT_PREFIX: &str = "c2:";
/// Prefix of the Stripe content hashes written before `c2:` (SHA-256 of the
/// event re-serialized by serde_json without `pending_webhooks`); still
/// recognised by [`same_content`].
const LEGACY_CONTENT_PREFIX: &str = "c:";

/// A Stripe event's content hash. For a JSON object it is `c2:` and the
/// SHA-256 of the body with the value of every top-level `pending_webhooks`
/// member replaced by `0`: two bodies have the same content hash exactly
/// when they are equal byte for byte outside those values. (The values are
/// masked rather than the members cut out so that every other byte,
/// whitespace included, keeps counting.) Anything else hashes its bytes.
pub fn content_hash(body: &[u8]) -> String {
    match content(body) {
        Some(Content::StripeEvent { pending_webhooks }) => delivery_hashes(body, &pending_webhooks).1,
        _ => payload_hash(body),
    }
}

/// `(payload_hash, content_hash)` of a Stripe event whose `pending_webhooks`
/// values are at `masked` (found by the verifier); ranges that do not fit
/// this body (not the verified one) are found again.
pub(crate) fn delivery_hashes(body: &[u8], masked: &[Range<usize>]) -> (String, String) {
    let in_order =
        masked.iter().try_fold(0, |at, r| (at <= r.start && r.start < r.end && r.end <= body.len()).then_some(r.end));
    if in_order.is_some() {
        return masked_hashes(body, masked, CONTENT_PREFIX);
    }
    match content(body) {
        Some(Content::StripeEvent { pending_webhooks }) => masked_hashes(body, &pending_webhooks, CONTENT_PREFIX),
        _ => {
            let payload = payload_hash(body);
            (payload.clone(), payload)
        }
    }
}

/// Whether a record's stored content hash says the same as `ours` (this
/// body's). Records written before `c2:` hashes carry a `c:` hash; for
/// those the old hash of this body is computed (only here, on the duplicate
/// path), so a retry that differs from such a record only in
/// `pending_webhooks` is still a duplicate and not a conflict.
pub fn same_content(stored: &str, ours: &str, body: &[u8]) -> bool {
    stored == ours
        || (stored.starts_with(LEGACY_CONTENT_PREFIX)
            && legacy_content_hash(body).is_some_and(|legacy| legacy == stored))
}

/// The content hash as written before `c2:` (a full parse and re-serialization).
pub(crate) fn legacy_content_hash(body: &[u8]) -> Option<String> {
    let serde_json::Value::Object(mut event) = serde_json::from_slice::<serde_json::Value>(body).ok()? else {
        return None;
    };
    event.remove("pending_webhooks");
    let canonical = serde_json::Value::Object(event).to_string();
    Some(hex_digest(LEGACY_CONTENT_PREFIX, &Sha256::digest(canonical.as_bytes())))
}

/// Produces a `Stripe-Signature` value, for tests and the developer tool.
pub fn sign(secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let mac = hmac_sha256(secret.expose(), &[ts.as_bytes(), b".", body]);
    format!("t={ts},v1={}", hex::encode(mac_bytes(mac)))
}

/// Stripe in the provider registry.
pub struct Stripe;

impl Verifier for StripeVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, now_s: i64) -> Verifying<'a> {
        ready(StripeVerifier::verify(self, d.body, d.headers, now_s))
    }
}

impl Provider for Stripe {
    fn name(&self) -> &'static str {
        "stripe"
    }

    /// The event's `id` is in the signed body.
    fn identity(&self) -> Identity {
        Identity::SIGNED_EVENT
    }

    /// Stripe marks a delivery successful on any 2xx.
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
    }

    fn summary(&self) -> &'static str {
        "Stripe-Signature: t=…,v1=… hex HMAC-SHA256 of \"{t}.{body}\"; id event id (evt_…); pending_webhooks masked"
    }

    fn verifier(
        &self,
        spec: &EndpointSpec,
        secrets: Vec<Secret>,
        _: &BuildContext,
    ) -> Result<Box<dyn Verifier>, String> {
        Ok(Box::new(StripeVerifier::new(secrets, spec.tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS))))
    }

    /// `pending_webhooks` masked (see [`content_hash`]).
    fn content_hash(&self, body: &[u8]) -> String {
        content_hash(body)
    }

    fn same_content(&self, stored: &str, ours: &str, body: &[u8]) -> bool {
        same_content(stored, ours, body)
    }

    fn event_id(&self, random_hex: &str) -> String {
        format!("evt_{}", &random_hex[..24.min(random_hex.len())])
    }

    fn sample(&self, _: &EndpointSpec, event_id: &str, event_type: &str, now_s: i64) -> Vec<u8> {
        serde_json::json!({
            "id": event_id, "object": "event", "type": event_type, "created": now_s,
            "livemode": false, "data": {"object": {}}
        })
        .to_string()
        .into_bytes()
    }

    fn sign(
        &self,
        _: &EndpointSpec,
        secret: &Secret,
        _: &str,
        _: &str,
        now_s: i64,
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        Ok(vec![(SIGNATURE_HEADER.into(), sign(secret, now_s, body))])
    }

    fn backfill(&self) -> Option<BackfillList> {
        Some(BackfillList::StripeEvents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::MAX_EVENT_ID_LEN;
    use http::HeaderValue;
    use serde_json::Value;

    const VECTOR: &str =
        include_str!("../../testdata/providers/stripe/signature-dotnet-event_test_signature.vector.json");
    const PAYLOAD: &[u8] = include_bytes!("../../testdata/providers/stripe/event_test_signature.payload.json");

    fn vector() -> Value {
        serde_json::from_str(VECTOR).unwrap()
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(value).unwrap());
        h
    }

    fn verifier(secrets: &[&str]) -> StripeVerifier {
        StripeVerifier::new(secrets.iter().map(|s| Secret::new(*s)).collect(), DEFAULT_TOLERANCE_SECS)
    }

    #[test]
    fn sdk_fixed_vector_verifies_and_yields_the_event_identity() {
        let v = vector();
        let header = v["stripe_signature_header"].as_str().unwrap();
        let now = v["timestamp"].as_i64().unwrap() + 100;
        let got = verifier(&["webhook_secret"]).verify(PAYLOAD, &headers(header), now).unwrap();
        assert_eq!(got.event_id, "evt_123");
        assert_eq!(got.event_type.as_deref(), Some("customer.created"));
    }

    #[test]
    fn sign_reproduces_the_sdk_signature() {
        let v = vector();
        let signed = sign(&Secret::new("webhook_secret"), 1_533_204_620, PAYLOAD);
        assert_eq!(signed, format!("t=1533204620,v1={}", v["expected_v1"].as_str().unwrap()));
    }

    #[test]
    fn stale_and_future_timestamps_are_rejected() {
        let header = vector()["stripe_signature_header"].as_str().unwrap().to_owned();
        let v = verifier(&["webhook_secret"]);
        assert_eq!(v.verify(PAYLOAD, &headers(&header), 1_533_204_620 + 400), Err(VerifyError::StaleTimestamp));
        assert_eq!(v.verify(PAYLOAD, &headers(&header), 1_533_204_620 - 301), Err(VerifyError::FutureTimestamp));
        assert!(v.verify(PAYLOAD, &headers(&header), 1_533_204_620 - 300).is_ok());
    }

    #[test]
    fn tampered_body_and_wrong_secret_are_rejected() {
        let header = vector()["stripe_signature_header"].as_str().unwrap().to_owned();
        let mut tampered = PAYLOAD.to_vec();
        tampered.pop(); // the trailing newline is signed
        let now = 1_533_204_700;
        assert_eq!(
            verifier(&["webhook_secret"]).verify(&tampered, &headers(&header), now),
            Err(VerifyError::SignatureMismatch)
        );
        assert_eq!(verifier(&["other"]).verify(PAYLOAD, &headers(&header), now), Err(VerifyError::SignatureMismatch));
    }

    #[test]
    fn rotation_overlap_accepts_either_active_secret_and_either_v1() {
        let body = br#"{"id":"evt_rot","type":"invoice.paid"}"#;
        let now = 1_700_000_000;
        let old = sign(&Secret::new("whsec_old"), now, body);
        let new = sign(&Secret::new("whsec_new"), now, body);
        let both = verifier(&["whsec_new", "whsec_old"]);
        assert!(both.verify(body, &headers(&old), now).is_ok());
        assert!(both.verify(body, &headers(&new), now).is_ok());
        // Stripe sends one v1 per active secret during a roll.
        let new_v1 = new.split_once(",v1=").unwrap().1;
        let multi = format!("{old},v1={new_v1}");
        assert!(verifier(&["whsec_new"]).verify(body, &headers(&multi), now).is_ok());
        assert!(verifier(&["whsec_old"]).verify(body, &headers(&multi), now).is_ok());
        assert_eq!(verifier(&["whsec_gone"]).verify(body, &headers(&multi), now), Err(VerifyError::SignatureMismatch));
    }

    #[test]
    fn header_split_across_values_verifies_like_the_joined_form() {
        let body = br#"{"id":"evt_split","type":"x"}"#;
        let now = 1_700_000_000;
        let signed = sign(&Secret::new("s"), now, body);
        let (t, v1) = signed.split_once(',').unwrap();
        let mut h = HeaderMap::new();
        h.append(SIGNATURE_HEADER, HeaderValue::from_str(t).unwrap());
        h.append(SIGNATURE_HEADER, HeaderValue::from_str(v1).unwrap());
        assert!(verifier(&["s"]).verify(body, &h, now).is_ok());
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let body = b"{}";
        let v = verifier(&["s"]);
        assert_eq!(v.verify(body, &HeaderMap::new(), 0), Err(VerifyError::MissingHeader(SIGNATURE_HEADER)));
        assert_eq!(v.verify(body, &headers("v1=00"), 0), Err(VerifyError::MalformedHeader(SIGNATURE_HEADER)));
        assert_eq!(v.verify(body, &headers("t=1"), 1), Err(VerifyError::SignatureMismatch));
        assert_eq!(v.verify(body, &headers("t=abc,v1=00"), 0), Err(VerifyError::MalformedHeader(SIGNATURE_HEADER)));
        assert_eq!(v.verify(body, &headers("t=1,t=2,v1=00"), 0), Err(VerifyError::MalformedHeader(SIGNATURE_HEADER)));
        assert_eq!(v.verify(body, &headers("garbage"), 0), Err(VerifyError::MalformedHeader(SIGNATURE_HEADER)));
    }

    #[test]
    fn signed_but_malformed_payload_is_reported_after_verification() {
        let now = 1_700_000_000;
        for (body, _why) in
            [(&b"not json"[..], "not json"), (br#"{"type":"x"}"#, "no id"), (br#"{"id":""}"#, "empty id")]
        {
            let h = headers(&sign(&Secret::new("s"), now, body));
            assert!(matches!(verifier(&["s"]).verify(body, &h, now), Err(VerifyError::MalformedPayload(_))));
        }
    }

    /// What the verifier answered for a signed body before it stopped
    /// building a `serde_json::Value`.
    fn identity_by_full_parse(body: &[u8]) -> Result<(String, Option<String>), VerifyError> {
        let event: Value =
            serde_json::from_slice(body).map_err(|_| VerifyError::MalformedPayload("body is not JSON"))?;
        let id =
            event.pointer("/id").and_then(Value::as_str).ok_or(VerifyError::MalformedPayload("event has no id"))?;
        let event_type = event.pointer("/type").and_then(Value::as_str).map(str::to_owned);
        Ok((checked_event_id(id)?, event_type))
    }

    #[test]
    fn signed_adversarial_bodies_get_the_same_answer_as_a_full_parse() {
        let long_id = format!(r#"{{"id":"{}"}}"#, "e".repeat(MAX_EVENT_ID_LEN + 1));
        let max_id = format!(r#"{{"id":"{}"}}"#, "e".repeat(MAX_EVENT_ID_LEN));
        let deep = |n: usize| format!(r#"{{"id":"evt_deep","data":{}0{}}}"#, "[".repeat(n), "]".repeat(n));
        let bodies: Vec<Vec<u8>> = [
            r#"{"id":"evt_1","id":"evt_2","type":"a","type":"b"}"#,
            r#"{"id":"evt\u005f1","type":"customer.\u0063reated"}"#,
            r#"{"id":"evt\n1"}"#,
            r#"{"id":""}"#,
            r#"{"id":12}"#,
            r#"{"id":"evt_1","type":7}"#,
            r#"{"data":{"id":"evt_nested"}}"#,
            r#"[{"id":"evt_1"}]"#,
            r#"{"id":"evt_1",}"#,
            r#"{"id":"evt_1"}x"#,
            r#"{"id":"evt_1","x":"\udc00"}"#,
            r#"{"id":"evt_1","x":-1e400}"#,
            r#"{"id":"evt_1","pending_webhooks":1,"pending_webhooks":2,"data":{"pending_webhooks":3}}"#,
            "\u{feff}{\"id\":\"evt_1\"}",
            &long_id,
            &max_id,
            &deep(125),
            &deep(126),
            &deep(127),
            &deep(100_000),
        ]
        .iter()
        .map(|b| b.as_bytes().to_vec())
        .chain([b"{\"id\":\"evt_\xff\"}".to_vec(), b"{\"id\":\"evt_1\",\"x\":\"\xe2\x82\"}".to_vec()])
        .collect();
        let now = 1_700_000_000;
        for body in &bodies {
            let h = headers(&sign(&Secret::new("s"), now, body));
            let got = verifier(&["s"]).verify(body, &h, now).map(|v| (v.event_id, v.event_type));
            assert_eq!(got, identity_by_full_parse(body), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn the_verified_event_says_where_pending_webhooks_is() {
        let body = br#"{"id":"evt_1", "pending_webhooks": 12,"data":{"pending_webhooks":3},"pending_webhooks":null}"#;
        let now = 1_700_000_000;
        let got = verifier(&["s"]).verify(body, &headers(&sign(&Secret::new("s"), now, body)), now).unwrap();
        let Content::StripeEvent { pending_webhooks } = &got.content else { panic!("{:?}", got.content) };
        let values: Vec<&[u8]> = pending_webhooks.iter().map(|r| &body[r.clone()]).collect();
        assert_eq!(values, vec![&b"12"[..], b"null"]);
        assert_eq!(content(body), Some(got.content));
        assert_eq!(content(b"[1]"), None);
        assert_eq!(content(b"{"), None);
    }

    mod proptests {
        use proptest::prelude::*;

        use super::*;

        fn split_or_joined(signed: &str, split: bool) -> HeaderMap {
            let mut h = HeaderMap::new();
            if split {
                for item in signed.split(',') {
                    h.append(SIGNATURE_HEADER, HeaderValue::from_str(item).unwrap());
                }
            } else {
                h.insert(SIGNATURE_HEADER, HeaderValue::from_str(signed).unwrap());
            }
            h
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// A signed body verifies (joined or split header); any single
            /// byte changed in the body or the MAC is rejected.
            #[test]
            fn signed_bodies_round_trip_and_mutations_are_rejected(
                id in "[a-zA-Z0-9_]{1,40}",
                extra in prop::collection::vec(any::<u8>(), 0..64),
                ts in 0i64..4_000_000_000,
                split in any::<bool>(),
                at in any::<prop::sample::Index>(),
                flip in 1u8..=255,
            ) {
                let body = format!(r#"{{"id":"{id}","x":"{}"}}"#, hex::encode(&extra)).into_bytes();
                let secret = Secret::new("whsec_test");
                let signed = sign(&secret, ts, &body);
                let v = verifier(&["whsec_test"]);
                let got = v.verify(&body, &split_or_joined(&signed, split), ts).unwrap();
                prop_assert_eq!(got.event_id, id);

                let mut tampered = body.clone();
                tampered[at.index(body.len())] ^= flip;
                prop_assert_eq!(v.verify(&tampered, &split_or_joined(&signed, split), ts), Err(VerifyError::SignatureMismatch));

                let (t, mac) = signed.split_once(",v1=").unwrap();
                let mut mac = hex::decode(mac).unwrap();
                let i = at.index(mac.len());
                mac[i] ^= flip;
                let forged = format!("{t},v1={}", hex::encode(mac));
                prop_assert_eq!(v.verify(&body, &split_or_joined(&forged, split), ts), Err(VerifyError::SignatureMismatch));
            }

            /// Random bodies and header values never panic; every rejection is typed.
            #[test]
            fn random_requests_never_panic(
                body in prop::collection::vec(any::<u8>(), 0..256),
                header in "[ -~]{0,120}",
                now in any::<i64>(),
            ) {
                let mut h = HeaderMap::new();
                if let Ok(v) = HeaderValue::from_str(&header) {
                    h.insert(SIGNATURE_HEADER, v);
                }
                if let Err(e) = verifier(&["s"]).verify(&body, &h, now) {
                    prop_assert!(!e.reason().is_empty());
                    prop_assert_ne!(e, VerifyError::CertificateUnavailable);
                }
                // Signed random bytes: verified, then malformed or accepted.
                let h = headers(&sign(&Secret::new("s"), 1_700_000_000, &body));
                match verifier(&["s"]).verify(&body, &h, 1_700_000_000) {
                    Ok(v) => prop_assert!(!v.event_id.is_empty()),
                    Err(e) => prop_assert!(matches!(e, VerifyError::MalformedPayload(_)), "{:?}", e),
                }
            }
        }
    }
}
