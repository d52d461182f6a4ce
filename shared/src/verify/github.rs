//! GitHub: `X-Hub-Signature-256: sha256=<hex>` over the raw body. The delivery
//! id (`X-GitHub-Delivery`, kept across redeliveries) is the identity and
//! `X-GitHub-Event` the type. The legacy SHA-1 header is not accepted.

use http::HeaderMap;

use super::headers::{list_items, single_header};
use super::provider::{
    BackfillList, BuildContext, Delivery, EndpointSpec, Identity, Provider, SuccessAnswer, Verifier, Verifying, ready,
};
use super::{MAX_SIGNATURE_CANDIDATES, Verified, VerifyError, checked_event_id, hmac_sha256, mac_bytes, mac_matches};
use crate::event::DecodeError;
use crate::secret::Secret;

pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";
pub const DELIVERY_HEADER: &str = "x-github-delivery";
pub const EVENT_HEADER: &str = "x-github-event";

#[derive(Debug, Clone)]
pub struct GithubVerifier {
    secrets: Vec<Secret>,
}

impl GithubVerifier {
    pub fn new(secrets: Vec<Secret>) -> Self {
        Self { secrets }
    }

    pub fn verify(&self, body: &[u8], headers: &HeaderMap) -> Result<Verified, VerifyError> {
        let candidates: Vec<Vec<u8>> = list_items(headers, SIGNATURE_HEADER)?
            .into_iter()
            .take(MAX_SIGNATURE_CANDIDATES)
            .map(|item| {
                item.strip_prefix("sha256=")
                    .and_then(|h| hex::decode(h).ok())
                    .ok_or(VerifyError::MalformedHeader(SIGNATURE_HEADER))
            })
            .collect::<Result<_, _>>()?;
        let matched = self.secrets.iter().any(|secret| {
            let mac = hmac_sha256(secret.expose(), &[body]);
            candidates.iter().any(|c| mac_matches(&mac, c))
        });
        if !matched {
            return Err(VerifyError::SignatureMismatch);
        }
        let delivery = single_header(headers, DELIVERY_HEADER)?;
        let event = single_header(headers, EVENT_HEADER).ok().map(str::to_owned);
        Ok(Verified::record(checked_event_id(delivery)?, event))
    }
}

/// Produces an `X-Hub-Signature-256` value, for tests and the developer tool.
pub fn sign(secret: &Secret, body: &[u8]) -> String {
    format!("sha256={}", hex::encode(mac_bytes(hmac_sha256(secret.expose(), &[body]))))
}

/// GitHub in the provider registry.
pub struct Github;

impl Verifier for GithubVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, _now_s: i64) -> Verifying<'a> {
        ready(GithubVerifier::verify(self, d.body, d.headers))
    }
}

impl Provider for Github {
    fn name(&self) -> &'static str {
        "github"
    }

    /// `X-GitHub-Delivery` is not signed, and GitHub signs no time: a body is bound to the delivery id it was first recorded under (a redelivery keeps both).
    fn identity(&self) -> Identity {
        Identity::BOUND_TO_BODY
    }

    /// GitHub records any 2xx as a successful delivery.
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
    }

    /// GitHub signs no timestamp: nothing but the secrets.
    fn options(&self) -> String {
        String::new()
    }

    fn summary(&self) -> &'static str {
        "X-Hub-Signature-256: sha256= hex HMAC-SHA256 of the body; id X-GitHub-Delivery"
    }

    fn verifier(&self, _: &EndpointSpec, secrets: Vec<Secret>, _: &BuildContext) -> Result<Box<dyn Verifier>, String> {
        Ok(Box::new(GithubVerifier::new(secrets)))
    }

    /// Form-encoded deliveries carry the JSON in `payload=`.
    fn decode(&self, stored_type: Option<&str>, payload: &[u8]) -> Result<(String, serde_json::Value), DecodeError> {
        if !payload.starts_with(b"payload=") {
            return crate::event::decode_json(stored_type, payload);
        }
        let decoded = url::form_urlencoded::parse(payload)
            .find(|(k, _)| k == "payload")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        crate::event::decode_json(stored_type, decoded.as_bytes())
    }

    fn sign(
        &self,
        _: &EndpointSpec,
        secret: &Secret,
        event_id: &str,
        event_type: &str,
        _: i64,
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        Ok(vec![
            (SIGNATURE_HEADER.into(), sign(secret, body)),
            (DELIVERY_HEADER.into(), event_id.to_owned()),
            (EVENT_HEADER.into(), event_type.to_owned()),
        ])
    }

    fn backfill(&self) -> Option<BackfillList> {
        Some(BackfillList::GithubDeliveries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use serde_json::Value;

    const DOCS: &str = include_str!("../../testdata/providers/github/docs-hello-world.vector.json");
    const OCTOKIT: &str = include_str!("../../testdata/providers/github/octokit-webhooks-methods-foo-bar.vector.json");

    fn headers(sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(sig).unwrap());
        h.insert(DELIVERY_HEADER, HeaderValue::from_static("72d3162e-cc78-11e3-81ab-4c9367dc0958"));
        h.insert(EVENT_HEADER, HeaderValue::from_static("push"));
        h
    }

    #[test]
    fn published_vectors_verify() {
        for raw in [DOCS, OCTOKIT] {
            let v: Value = serde_json::from_str(raw).unwrap();
            let secret = Secret::new(v["secret"].as_str().unwrap());
            let payload = v["payload"].as_str().unwrap().as_bytes();
            let expected = v["expected_x_hub_signature_256"].as_str().unwrap();
            assert_eq!(sign(&secret, payload), expected);
            let got = GithubVerifier::new(vec![secret]).verify(payload, &headers(expected)).unwrap();
            assert_eq!(got.event_id, "72d3162e-cc78-11e3-81ab-4c9367dc0958");
            assert_eq!(got.event_type.as_deref(), Some("push"));
        }
    }

    #[test]
    fn docs_example_rejects_tampering_and_wrong_secret() {
        let v: Value = serde_json::from_str(DOCS).unwrap();
        let expected = v["expected_x_hub_signature_256"].as_str().unwrap();
        let good = GithubVerifier::new(vec![Secret::new("It's a Secret to Everybody")]);
        assert_eq!(good.verify(b"Hello, World?", &headers(expected)), Err(VerifyError::SignatureMismatch));
        let wrong = GithubVerifier::new(vec![Secret::new("It's a secret to everybody")]);
        assert_eq!(wrong.verify(b"Hello, World!", &headers(expected)), Err(VerifyError::SignatureMismatch));
    }

    #[test]
    fn legacy_sha1_header_alone_is_not_enough() {
        let v: Value = serde_json::from_str(OCTOKIT).unwrap();
        let payload = v["payload"].as_str().unwrap().as_bytes();
        let mut h = headers("x");
        h.remove(SIGNATURE_HEADER);
        h.insert(
            "x-hub-signature",
            HeaderValue::from_str(v["expected_x_hub_signature_sha1_legacy"].as_str().unwrap()).unwrap(),
        );
        let verifier = GithubVerifier::new(vec![Secret::new("mysecret")]);
        assert_eq!(verifier.verify(payload, &h), Err(VerifyError::MissingHeader(SIGNATURE_HEADER)));
    }

    #[test]
    fn rotation_overlap_and_joined_header_values() {
        let body = b"{\"zen\":\"Keep it logically awesome.\"}";
        let v = GithubVerifier::new(vec![Secret::new("new"), Secret::new("old")]);
        assert!(v.verify(body, &headers(&sign(&Secret::new("old"), body))).is_ok());
        assert!(v.verify(body, &headers(&sign(&Secret::new("new"), body))).is_ok());
        let joined = format!("{},{}", sign(&Secret::new("gone"), body), sign(&Secret::new("new"), body));
        assert!(v.verify(body, &headers(&joined)).is_ok());
    }

    #[test]
    fn malformed_signature_and_missing_delivery_are_typed() {
        let body = b"{}";
        let v = GithubVerifier::new(vec![Secret::new("s")]);
        assert_eq!(v.verify(body, &headers("sha1=abcd")), Err(VerifyError::MalformedHeader(SIGNATURE_HEADER)));
        assert_eq!(v.verify(body, &headers("sha256=zz")), Err(VerifyError::MalformedHeader(SIGNATURE_HEADER)));
        let mut h = headers(&sign(&Secret::new("s"), body));
        h.remove(DELIVERY_HEADER);
        assert_eq!(v.verify(body, &h), Err(VerifyError::MissingHeader(DELIVERY_HEADER)));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// A signed body verifies with its signature alone or joined with
            /// another; one changed byte of the body or the MAC is rejected;
            /// the delivery id is the identity and the event header the type.
            #[test]
            fn signed_bodies_round_trip_and_mutations_are_rejected(
                secret in "[ -~]{1,40}",
                body in prop::collection::vec(any::<u8>(), 0..200),
                delivery in "[a-f0-9-]{1,36}",
                event in "[a-z_]{1,20}",
                joined in any::<bool>(),
                at in any::<prop::sample::Index>(),
                flip in 1u8..=255,
            ) {
                let secret = Secret::new(secret);
                let v = GithubVerifier::new(vec![secret.clone()]);
                let sig = sign(&secret, &body);
                let value = if joined { format!("{},{sig}", sign(&Secret::new("retired secret"), &body)) } else { sig.clone() };
                let mut h = HeaderMap::new();
                h.insert(SIGNATURE_HEADER, HeaderValue::from_str(&value).unwrap());
                h.insert(DELIVERY_HEADER, HeaderValue::from_str(&delivery).unwrap());
                h.insert(EVENT_HEADER, HeaderValue::from_str(&event).unwrap());
                let got = v.verify(&body, &h).unwrap();
                prop_assert_eq!((got.event_id, got.event_type), (delivery.clone(), Some(event.clone())));

                if !body.is_empty() {
                    let mut tampered = body.clone();
                    tampered[at.index(body.len())] ^= flip;
                    prop_assert_eq!(v.verify(&tampered, &h), Err(VerifyError::SignatureMismatch));
                }
                let mut mac = hex::decode(sig.trim_start_matches("sha256=")).unwrap();
                let i = at.index(mac.len());
                mac[i] ^= flip;
                h.insert(SIGNATURE_HEADER, HeaderValue::from_str(&format!("sha256={}", hex::encode(mac))).unwrap());
                prop_assert_eq!(v.verify(&body, &h), Err(VerifyError::SignatureMismatch));
            }

            /// Random header values never panic; every rejection is typed.
            #[test]
            fn random_headers_never_panic(
                sig in "[ -~]{0,160}",
                delivery in "[ -~]{0,60}",
                body in prop::collection::vec(any::<u8>(), 0..100),
            ) {
                let mut h = HeaderMap::new();
                for (name, value) in [(SIGNATURE_HEADER, &sig), (DELIVERY_HEADER, &delivery)] {
                    if let Ok(value) = HeaderValue::from_str(value) {
                        h.insert(name, value);
                    }
                }
                if let Err(e) = GithubVerifier::new(vec![Secret::new("s")]).verify(&body, &h) {
                    prop_assert!(!e.reason().is_empty());
                }
            }
        }
    }
}
