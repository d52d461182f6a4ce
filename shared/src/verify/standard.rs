//! Standard Webhooks (and Svix, its origin): `webhook-id`, `webhook-timestamp`
//! and `webhook-signature` (`v1,<base64>` entries separated by spaces), with
//! the `svix-*` header aliases. HMAC-SHA256 over `"{id}.{timestamp}.{body}"`
//! keyed with the base64-decoded secret (`whsec_` prefix optional). The body
//! is signed as raw bytes, so non-UTF-8 bodies verify too.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use http::HeaderMap;

use super::headers::{first_of, header_values, parse_unix_secs};
use super::provider::{
    BuildContext, Delivery, EndpointSpec, Identity, Provider, SuccessAnswer, Verifier, Verifying, ready,
};
use super::{
    MAX_SIGNATURE_CANDIDATES, Verified, VerifyError, check_timestamp, checked_event_id, event_fields, hmac_sha256,
    mac_bytes, mac_matches,
};
use crate::secret::Secret;

pub const ID_HEADERS: [&str; 2] = ["webhook-id", "svix-id"];
pub const TIMESTAMP_HEADERS: [&str; 2] = ["webhook-timestamp", "svix-timestamp"];
pub const SIGNATURE_HEADERS: [&str; 2] = ["webhook-signature", "svix-signature"];
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;
const SECRET_PREFIX: &str = "whsec_";

#[derive(Debug, Clone)]
pub struct StandardWebhooksVerifier {
    keys: Vec<Secret>,
    tolerance_secs: i64,
}

/// Decodes a `whsec_<base64>` (or bare base64) secret into key bytes.
pub fn decode_secret(secret: &Secret) -> Result<Secret, &'static str> {
    let text = std::str::from_utf8(secret.expose()).map_err(|_| "secret is not text")?;
    let b64 = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
    let key = STANDARD
        .decode(b64)
        .or_else(|_| STANDARD_NO_PAD.decode(b64.trim_end_matches('=')))
        .map_err(|_| "secret is not base64 (expected whsec_<base64>)")?;
    if key.is_empty() {
        return Err("secret is empty");
    }
    Ok(Secret::new(key))
}

impl StandardWebhooksVerifier {
    /// Takes already decoded keys; see [`decode_secret`].
    pub fn new(keys: Vec<Secret>, tolerance_secs: i64) -> Self {
        Self { keys, tolerance_secs }
    }

    pub fn verify(&self, body: &[u8], headers: &HeaderMap, now: i64) -> Result<Verified, VerifyError> {
        let id = first_of(headers, &ID_HEADERS)?;
        let ts_raw = first_of(headers, &TIMESTAMP_HEADERS)?;
        let timestamp = parse_unix_secs(ts_raw, TIMESTAMP_HEADERS[0])?;
        let candidates = signature_candidates(headers)?;
        let matched = self.keys.iter().any(|key| {
            let mac = hmac_sha256(key.expose(), &[id.as_bytes(), b".", ts_raw.as_bytes(), b".", body]);
            candidates.iter().any(|c| mac_matches(&mac, c))
        });
        if !matched {
            return Err(VerifyError::SignatureMismatch);
        }
        check_timestamp(timestamp, now, self.tolerance_secs)?;
        // The type is a payload convention, not part of the protocol: optional.
        let event_type = event_fields(body).ok().and_then(|f| f.event_type).map(Cow::into_owned);
        Ok(Verified::record(checked_event_id(id)?, event_type))
    }
}

/// The decoded `v1` signatures. Entries are `version,signature` separated by
/// spaces; when a front end joined repeated headers with commas we see
/// `v1,a,v1,b`, so the items are read as (version, signature) pairs. An empty
/// signature (`v1,`) decodes to nothing and can never match.
fn signature_candidates(headers: &HeaderMap) -> Result<Vec<Vec<u8>>, VerifyError> {
    let name = SIGNATURE_HEADERS
        .iter()
        .copied()
        .find(|n| headers.contains_key(*n))
        .ok_or(VerifyError::MissingHeader(SIGNATURE_HEADERS[0]))?;
    let mut tokens = Vec::new();
    for value in header_values(headers, name)? {
        for entry in value.split_ascii_whitespace() {
            tokens.extend(entry.split(','));
        }
    }
    if tokens.len() % 2 != 0 {
        return Err(VerifyError::MalformedHeader(SIGNATURE_HEADERS[0]));
    }
    let mut out = Vec::new();
    for pair in tokens.chunks(2).take(MAX_SIGNATURE_CANDIDATES) {
        if let ("v1", sig) = (pair[0], pair[1]) {
            if let Ok(bytes) = STANDARD.decode(sig) {
                if !bytes.is_empty() {
                    out.push(bytes);
                }
            }
        }
    }
    if out.is_empty() {
        return Err(VerifyError::SignatureMismatch);
    }
    Ok(out)
}

/// Produces a `webhook-signature` value (`v1,<base64>`), for tests and tools.
pub fn sign(key: &Secret, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let mac = hmac_sha256(key.expose(), &[msg_id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    format!("v1,{}", STANDARD.encode(mac_bytes(mac)))
}

/// Standard Webhooks (and Svix) in the provider registry.
pub struct StandardWebhooks;

impl Verifier for StandardWebhooksVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, now_s: i64) -> Verifying<'a> {
        ready(StandardWebhooksVerifier::verify(self, d.body, d.headers, now_s))
    }
}

impl Provider for StandardWebhooks {
    fn name(&self) -> &'static str {
        "standard_webhooks"
    }

    /// `webhook-id` is signed with the body.
    fn identity(&self) -> Identity {
        Identity::SIGNED_EVENT
    }

    /// Svix and Standard Webhooks senders take any 2xx as delivered.
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
    }

    fn summary(&self) -> &'static str {
        "webhook-signature (or svix-signature): v1, base64 HMAC-SHA256 of \"{id}.{timestamp}.{body}\" with the whsec_ secret; id webhook-id"
    }

    /// Each secret must decode ([`decode_secret`]): checked when the keys are built.
    fn verifier(
        &self,
        spec: &EndpointSpec,
        secrets: Vec<Secret>,
        _: &BuildContext,
    ) -> Result<Box<dyn Verifier>, String> {
        let keys = secrets.iter().map(decode_secret).collect::<Result<Vec<_>, _>>().map_err(str::to_owned)?;
        Ok(Box::new(StandardWebhooksVerifier::new(keys, spec.tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS))))
    }

    fn event_id(&self, random_hex: &str) -> String {
        format!("msg_{}", &random_hex[..24.min(random_hex.len())])
    }

    fn sign(
        &self,
        _: &EndpointSpec,
        secret: &Secret,
        event_id: &str,
        _: &str,
        now_s: i64,
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        let key = decode_secret(secret).map_err(str::to_owned)?;
        Ok(vec![
            (ID_HEADERS[0].into(), event_id.to_owned()),
            (TIMESTAMP_HEADERS[0].into(), now_s.to_string()),
            (SIGNATURE_HEADERS[0].into(), sign(&key, event_id, now_s, body)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::Content;
    use http::HeaderValue;
    use serde_json::Value;

    const VECTORS: [&str; 2] = [
        include_str!(
            "../../testdata/providers/standard-webhooks/sign-test-msg_27UH4WbU6Z5A5EzD8u03UvzRbpk.vector.json"
        ),
        include_str!("../../testdata/providers/standard-webhooks/sign-test-msg_p5jXN8AQM9LWM0D4loKWxJek.vector.json"),
    ];

    fn headers(prefix: &str, id: &str, ts: &str, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_bytes(format!("{prefix}-id").as_bytes()).unwrap(),
            HeaderValue::from_str(id).unwrap(),
        );
        h.insert(
            http::HeaderName::from_bytes(format!("{prefix}-timestamp").as_bytes()).unwrap(),
            HeaderValue::from_str(ts).unwrap(),
        );
        h.insert(
            http::HeaderName::from_bytes(format!("{prefix}-signature").as_bytes()).unwrap(),
            HeaderValue::from_str(sig).unwrap(),
        );
        h
    }

    fn verifier_for(v: &Value) -> StandardWebhooksVerifier {
        let key = decode_secret(&Secret::new(v["secret"].as_str().unwrap())).unwrap();
        assert_eq!(hex::encode(key.expose()), v["secret_key_bytes_hex"].as_str().unwrap());
        StandardWebhooksVerifier::new(vec![key], DEFAULT_TOLERANCE_SECS)
    }

    #[test]
    fn spec_vectors_verify_under_both_header_spellings() {
        for raw in VECTORS {
            let v: Value = serde_json::from_str(raw).unwrap();
            let (id, ts) = (v["msg_id"].as_str().unwrap(), v["timestamp"].as_i64().unwrap());
            let payload = v["payload"].as_str().unwrap().as_bytes();
            let expected = v["expected_signature"].as_str().unwrap();
            let key = decode_secret(&Secret::new(v["secret"].as_str().unwrap())).unwrap();
            assert_eq!(sign(&key, id, ts, payload), expected);
            for prefix in ["webhook", "svix"] {
                let got =
                    verifier_for(&v).verify(payload, &headers(prefix, id, &ts.to_string(), expected), ts).unwrap();
                assert_eq!(got.event_id, id);
            }
        }
    }

    #[test]
    fn spec_negative_signatures_are_rejected_and_multi_signature_headers_work() {
        for raw in VECTORS {
            let v: Value = serde_json::from_str(raw).unwrap();
            let (id, ts) = (v["msg_id"].as_str().unwrap(), v["timestamp"].as_i64().unwrap());
            let ts_text = ts.to_string();
            let payload = v["payload"].as_str().unwrap().as_bytes();
            let good = v["expected_signature"].as_str().unwrap();
            for bad in v["negative_signatures"].as_object().unwrap().keys() {
                let err = verifier_for(&v).verify(payload, &headers("webhook", id, &ts_text, bad), ts).unwrap_err();
                assert_eq!(err, VerifyError::SignatureMismatch, "{bad}");
                let both = format!("{bad} {good}");
                assert!(verifier_for(&v).verify(payload, &headers("webhook", id, &ts_text, &both), ts).is_ok());
            }
        }
    }

    #[test]
    fn bare_empty_signature_bypass_is_rejected() {
        let v: Value = serde_json::from_str(VECTORS[1]).unwrap();
        let (id, ts) = (v["msg_id"].as_str().unwrap(), v["timestamp"].as_i64().unwrap());
        for sig in ["v1,", "v1, ", "v1,=", "v1"] {
            let got = verifier_for(&v).verify(b"", &headers("webhook", id, &ts.to_string(), sig), ts);
            assert!(got.is_err(), "{sig:?} accepted");
        }
    }

    #[test]
    fn stale_future_tampered_and_joined_headers() {
        let key = Secret::new(b"0123456789abcdef".to_vec());
        let v = StandardWebhooksVerifier::new(vec![key.clone()], DEFAULT_TOLERANCE_SECS);
        let now = 1_700_000_000;
        let body = br#"{"type":"invoice.paid","data":{}}"#;
        let sig = sign(&key, "msg_1", now, body);
        let ts = now.to_string();
        assert_eq!(
            v.verify(body, &headers("webhook", "msg_1", &ts, &sig), now).unwrap().event_type.as_deref(),
            Some("invoice.paid")
        );
        assert_eq!(
            v.verify(body, &headers("webhook", "msg_1", &ts, &sig), now + 301),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            v.verify(body, &headers("webhook", "msg_1", &ts, &sig), now - 301),
            Err(VerifyError::FutureTimestamp)
        );
        assert_eq!(v.verify(b"{}", &headers("webhook", "msg_1", &ts, &sig), now), Err(VerifyError::SignatureMismatch));
        assert_eq!(v.verify(body, &headers("webhook", "msg_2", &ts, &sig), now), Err(VerifyError::SignatureMismatch));
        // Two signature headers joined by a front end with a comma.
        let joined = format!("{},{sig}", sign(&Secret::new("other"), "msg_1", now, body));
        assert!(v.verify(body, &headers("webhook", "msg_1", &ts, &joined), now).is_ok());
    }

    #[test]
    fn non_utf8_bodies_verify_and_rotation_overlap_works() {
        let (old, new) = (Secret::new(b"old-key-bytes".to_vec()), Secret::new(b"new-key-bytes".to_vec()));
        let v = StandardWebhooksVerifier::new(vec![new.clone(), old.clone()], DEFAULT_TOLERANCE_SECS);
        let body = [0xff, 0xfe, 0x00, 0x80];
        let now = 1_700_000_000;
        for key in [&old, &new] {
            let sig = sign(key, "msg_bin", now, &body);
            let got = v.verify(&body, &headers("webhook", "msg_bin", &now.to_string(), &sig), now).unwrap();
            assert_eq!(got.event_type, None);
        }
    }

    #[test]
    fn secrets_decode_with_or_without_prefix_and_padding() {
        let a = decode_secret(&Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).unwrap();
        let b = decode_secret(&Secret::new("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).unwrap();
        assert_eq!(a, b);
        let padded = decode_secret(&Secret::new("whsec_YWJjZA==")).unwrap();
        let unpadded = decode_secret(&Secret::new("whsec_YWJjZA")).unwrap();
        assert_eq!(padded, unpadded);
        assert!(decode_secret(&Secret::new("whsec_!!!")).is_err());
        assert!(decode_secret(&Secret::new("whsec_")).is_err());
    }

    #[test]
    fn the_type_is_read_like_a_full_parse_and_never_fails_the_delivery() {
        let key = Secret::new(b"0123456789abcdef".to_vec());
        let v = StandardWebhooksVerifier::new(vec![key.clone()], DEFAULT_TOLERANCE_SECS);
        let now = 1_700_000_000;
        let deep = format!(r#"{{"type":"deep","data":{}0{}}}"#, "[".repeat(200), "]".repeat(200));
        let cases: Vec<(Vec<u8>, Option<&str>)> = vec![
            (br#"{"type":"a","type":"b"}"#.to_vec(), Some("b")),
            (br#"{"typ\u0065":"invoice.\u0070aid"}"#.to_vec(), Some("invoice.paid")),
            (br#"{"type":3}"#.to_vec(), None),
            (br#"{"data":{"type":"nested"}}"#.to_vec(), None),
            (br#"[{"type":"in an array"}]"#.to_vec(), None),
            (br#"{"type":"a",}"#.to_vec(), None),
            (deep.into_bytes(), None),
            (b"{\"type\":\"\xff\"}".to_vec(), None),
            (b"plain text".to_vec(), None),
        ];
        for (body, expected) in cases {
            let sig = sign(&key, "msg_1", now, &body);
            let got = v.verify(&body, &headers("webhook", "msg_1", &now.to_string(), &sig), now).unwrap();
            assert_eq!(got.event_type.as_deref(), expected, "{}", String::from_utf8_lossy(&body));
            assert_eq!(got.event_id, "msg_1");
            assert_eq!(got.content, Content::Bytes);
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// A signed message verifies, with its signature alone or among
            /// others (space-separated in one header, or headers joined by
            /// API Gateway's comma); one changed byte of the body, the id or
            /// the MAC, or a timestamp outside the tolerance, is rejected.
            #[test]
            fn signed_messages_round_trip_and_mutations_are_rejected(
                key in prop::collection::vec(any::<u8>(), 16..40),
                id in "[a-zA-Z0-9_-]{1,40}",
                body in prop::collection::vec(any::<u8>(), 0..200),
                ts in 1_000_000_000i64..4_000_000_000,
                shape in 0u8..3,
                at in any::<prop::sample::Index>(),
                flip in 1u8..=255,
                skew in 301i64..100_000,
            ) {
                let key = Secret::new(key);
                let v = StandardWebhooksVerifier::new(vec![key.clone()], DEFAULT_TOLERANCE_SECS);
                let sig = sign(&key, &id, ts, &body);
                let other = sign(&Secret::new(b"another key of 16+".to_vec()), &id, ts, &body);
                let value = match shape {
                    0 => sig.clone(),
                    1 => format!("{other} {sig}"),
                    _ => format!("{other},{sig}"),
                };
                let got = v.verify(&body, &headers("webhook", &id, &ts.to_string(), &value), ts).unwrap();
                prop_assert_eq!(got.event_id, id.clone());

                if !body.is_empty() {
                    let mut tampered = body.clone();
                    tampered[at.index(body.len())] ^= flip;
                    prop_assert_eq!(
                        v.verify(&tampered, &headers("webhook", &id, &ts.to_string(), &value), ts),
                        Err(VerifyError::SignatureMismatch)
                    );
                }
                let other_id = format!("{id}x");
                prop_assert_eq!(
                    v.verify(&body, &headers("webhook", &other_id, &ts.to_string(), &value), ts),
                    Err(VerifyError::SignatureMismatch)
                );
                let mut mac = STANDARD.decode(sig.trim_start_matches("v1,")).unwrap();
                let i = at.index(mac.len());
                mac[i] ^= flip;
                let forged = format!("v1,{}", STANDARD.encode(mac));
                prop_assert_eq!(
                    v.verify(&body, &headers("webhook", &id, &ts.to_string(), &forged), ts),
                    Err(VerifyError::SignatureMismatch)
                );
                for (now, refused) in [(ts + skew, VerifyError::StaleTimestamp), (ts - skew, VerifyError::FutureTimestamp)] {
                    prop_assert_eq!(v.verify(&body, &headers("webhook", &id, &ts.to_string(), &sig), now), Err(refused));
                }
            }

            /// Random header values never panic; every rejection is typed.
            #[test]
            fn random_headers_never_panic(
                id in "[ -~]{0,60}",
                ts in "[ -~]{0,14}",
                sig in "[ -~]{0,200}",
                body in prop::collection::vec(any::<u8>(), 0..100),
                now in any::<i64>(),
            ) {
                let v = StandardWebhooksVerifier::new(vec![Secret::new(b"0123456789abcdef".to_vec())], DEFAULT_TOLERANCE_SECS);
                let mut h = HeaderMap::new();
                for (name, value) in [("webhook-id", &id), ("webhook-timestamp", &ts), ("webhook-signature", &sig)] {
                    if let Ok(value) = HeaderValue::from_str(value) {
                        h.insert(name, value);
                    }
                }
                if let Err(e) = v.verify(&body, &h, now) {
                    prop_assert!(!e.reason().is_empty());
                    prop_assert_ne!(e, VerifyError::CertificateUnavailable);
                }
            }
        }
    }
}
