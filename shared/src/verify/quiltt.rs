//! Quiltt: `Quiltt-Signature: base64(HMAC-SHA256(secret, "1" + timestamp +
//! raw body))`, with `Quiltt-Timestamp` in Unix seconds (the literal `1` is
//! the scheme's version). A delivery is a batch:
//! `{"environment": {...}, "eventTypes": [...], "events": [{"id", "type",
//! "at", "profile", "record", ...}, ...]}`; each element of `events` is an
//! event of its own, with its own identity.
//!
//! After the signature, the body is split into its events: each is the exact
//! bytes of its element of `events` (a slice of the signed body, never
//! re-serialised), so its payload and content hashes are those of the
//! provider's own rendering.

use std::ops::Range;

use base64::Engine;
use http::HeaderMap;

use super::headers::{parse_unix_secs, single_header};
use super::provider::{
    BuildContext, Delivery, EndpointSpec, Identity, Provider, SuccessAnswer, Verifier, Verifying, ready,
};
use super::{
    Action, BatchEvent, Content, MAX_SIGNATURE_CANDIDATES, Verified, VerifyError, check_timestamp, checked_event_id,
};
use super::{hmac_sha256, json, mac_bytes, mac_matches, malformed_element, push_event};
use crate::secret::Secret;

pub const SIGNATURE_HEADER: &str = "quiltt-signature";
pub const TIMESTAMP_HEADER: &str = "quiltt-timestamp";
/// How far a delivery's timestamp may be from now (Quiltt's own guidance:
/// five minutes).
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;
/// The scheme's version, signed before the timestamp.
const VERSION: &[u8] = b"1";
/// The most events one delivery may carry.
pub const MAX_BATCH_EVENTS: usize = super::MAX_BATCH_EVENTS;

#[derive(Debug, Clone)]
pub struct QuilttVerifier {
    secrets: Vec<Secret>,
    tolerance_secs: i64,
}

impl QuilttVerifier {
    /// `secrets` are all active endpoint secrets (more than one during rotation).
    pub fn new(secrets: Vec<Secret>, tolerance_secs: i64) -> Self {
        Self { secrets, tolerance_secs }
    }

    pub fn verify(&self, body: &[u8], headers: &HeaderMap, now: i64) -> Result<Verified, VerifyError> {
        let timestamp = parse_unix_secs(single_header(headers, TIMESTAMP_HEADER)?, TIMESTAMP_HEADER)?;
        let candidates = signatures(headers)?;
        let ts = timestamp.to_string();
        let matched = self.secrets.iter().any(|secret| {
            let mac = hmac_sha256(secret.expose(), &[VERSION, ts.as_bytes(), body]);
            candidates.iter().any(|c| mac_matches(&mac, c))
        });
        if !matched {
            return Err(VerifyError::SignatureMismatch);
        }
        check_timestamp(timestamp, now, self.tolerance_secs)?;
        // Authenticated from here on.
        let events = events(body)?;
        let first = events.first().map(|e| e.event_id.clone()).unwrap_or_default();
        let mut verified = Verified::record(first, None);
        verified.action = Action::Batch(events);
        Ok(verified)
    }
}

/// The decoded `Quiltt-Signature` values (comma-separated during a rotation),
/// at most [`MAX_SIGNATURE_CANDIDATES`]; undecodable ones cannot match.
fn signatures(headers: &HeaderMap) -> Result<Vec<Vec<u8>>, VerifyError> {
    let raw = single_header(headers, SIGNATURE_HEADER)?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let out: Vec<Vec<u8>> = raw
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .take(MAX_SIGNATURE_CANDIDATES)
        .filter_map(|s| b64.decode(s).ok())
        .collect();
    if out.is_empty() {
        return Err(VerifyError::MalformedHeader(SIGNATURE_HEADER));
    }
    Ok(out)
}

/// The events of a verified batch body: each element of `events`, its id and
/// type, and its bytes. An element without a string `id` refuses the whole
/// delivery (nothing of it is recorded).
pub fn events(body: &[u8]) -> Result<Vec<BatchEvent>, VerifyError> {
    let [list] = json::pointers(body, [Some("/events")]);
    let list = list.ok_or(VerifyError::MalformedPayload("body is not a Quiltt batch (no events array)"))?;
    let slice = &body[list.clone()];
    let mut elements: Vec<Range<usize>> = Vec::new();
    let kind = json::scan(slice, |e| elements.push(e.value.start + list.start..e.value.end + list.start))
        .map_err(|_| VerifyError::MalformedPayload("events is not JSON"))?;
    if kind != json::Kind::Array {
        return Err(VerifyError::MalformedPayload("events is not an array"));
    }
    if elements.is_empty() {
        return Err(VerifyError::MalformedPayload("the batch has no events"));
    }
    if elements.len() > MAX_BATCH_EVENTS {
        return Err(VerifyError::MalformedPayload("the batch has more events than a delivery may carry"));
    }
    let mut out: Vec<BatchEvent> = Vec::with_capacity(elements.len());
    for range in elements {
        let event = &body[range.clone()];
        let [id, kind] = json::pointers(event, [Some("/id"), Some("/type")]);
        // An event without an id (or with one that cannot be an id) is kept
        // apart (parked); the batch's others are recorded as usual.
        let Some(event_id) = id.and_then(|r| json::string_at(event, &r)).and_then(|id| checked_event_id(&id).ok())
        else {
            push_event(&mut out, malformed_element(body, range, "an event of the batch has no id"))?;
            continue;
        };
        let event_type = kind.and_then(|r| json::string_at(event, &r)).map(|t| t.into_owned());
        push_event(&mut out, BatchEvent { event_id, event_type, bytes: range, content: Content::Bytes })?;
    }
    Ok(out)
}

/// Produces a `Quiltt-Signature` value for `timestamp` and `body`, as Quiltt
/// signs (for tests and the developer tool).
pub fn sign(secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    let mac = hmac_sha256(secret.expose(), &[VERSION, timestamp.to_string().as_bytes(), body]);
    base64::engine::general_purpose::STANDARD.encode(mac_bytes(mac))
}

/// A batch in Quiltt's shape with these `(id, type)` events, for tests and
/// the developer tool.
pub fn batch(events: &[(&str, &str)], at: &str) -> Vec<u8> {
    let events: Vec<serde_json::Value> = events
        .iter()
        .map(|(id, kind)| {
            serde_json::json!({
                "id": id, "type": kind, "at": at,
                "profile": {"id": "p_demo", "uuid": "00000000-0000-4000-8000-000000000001", "metadata": null},
                "record": {"id": "conn_demo", "metadata": null}
            })
        })
        .collect();
    let mut types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    types.sort_unstable();
    types.dedup();
    serde_json::json!({
        "environment": {"id": "env_demo", "mode": "sandbox", "name": "Demo", "metadata": null},
        "eventTypes": types,
        "events": events,
    })
    .to_string()
    .into_bytes()
}

/// Quiltt in the provider registry.
pub struct Quiltt;

impl Verifier for QuilttVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, now_s: i64) -> Verifying<'a> {
        ready(QuilttVerifier::verify(self, d.body, d.headers, now_s))
    }
}

impl Provider for Quiltt {
    fn name(&self) -> &'static str {
        "quiltt"
    }

    /// Each event's `id` is in the signed body.
    fn identity(&self) -> Identity {
        Identity::SIGNED_EVENT
    }

    /// Quiltt's public documentation names no status: any 2xx assumed.
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
    }

    fn summary(&self) -> &'static str {
        "Quiltt-Signature: base64 HMAC-SHA256 of \"1\" + Quiltt-Timestamp + body; a batch, each event identified by its id"
    }

    fn verifier(
        &self,
        spec: &EndpointSpec,
        secrets: Vec<Secret>,
        _: &BuildContext,
    ) -> Result<Box<dyn Verifier>, String> {
        Ok(Box::new(QuilttVerifier::new(secrets, spec.tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS))))
    }

    fn split(&self, payload: &[u8]) -> Option<Result<Vec<BatchEvent>, VerifyError>> {
        Some(events(payload))
    }

    /// A batch of one event, in Quiltt's shape.
    fn sample(&self, _: &EndpointSpec, event_id: &str, event_type: &str, now_s: i64) -> Vec<u8> {
        batch(&[(event_id, event_type)], &super::sns::format_timestamp(now_s))
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
        Ok(vec![(SIGNATURE_HEADER.into(), sign(secret, now_s, body)), (TIMESTAMP_HEADER.into(), now_s.to_string())])
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    /// A delivery signed by Python's `hmac` and `base64` (an implementation
    /// independent of this one) over a body in Quiltt's documented shape;
    /// see `testdata/quiltt/README.md`.
    const VECTOR: &str = include_str!("../../testdata/quiltt/batch-3.vector.json");

    fn headers(signature: &str, timestamp: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(signature).unwrap());
        h.insert(TIMESTAMP_HEADER, HeaderValue::from_str(timestamp).unwrap());
        h
    }

    fn vector() -> (Vec<u8>, String, i64, String) {
        let v: serde_json::Value = serde_json::from_str(VECTOR).unwrap();
        let body = v["body"].as_str().unwrap().as_bytes().to_vec();
        let ts = v["timestamp"].as_i64().unwrap();
        (body, v["secret"].as_str().unwrap().to_owned(), ts, v["signature"].as_str().unwrap().to_owned())
    }

    #[test]
    fn the_independent_vector_verifies_and_splits_into_its_events() {
        let (body, secret, ts, signature) = vector();
        assert_eq!(sign(&Secret::new(secret.as_str()), ts, &body), signature, "signed as Quiltt signs");
        let v = QuilttVerifier::new(vec![Secret::new(secret.as_str())], DEFAULT_TOLERANCE_SECS);
        let got = v.verify(&body, &headers(&signature, &ts.to_string()), ts + 10).unwrap();
        let Action::Batch(events) = got.action else { panic!("{got:?}") };
        let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["evt_q1", "evt_q2", "evt_q3"]);
        assert_eq!(events[0].event_type.as_deref(), Some("connection.synced.successful.initial"));
        for e in &events {
            // The exact bytes of the element, parseable on their own.
            let slice: serde_json::Value = serde_json::from_slice(&body[e.bytes.clone()]).unwrap();
            assert_eq!(slice["id"].as_str(), Some(e.event_id.as_str()));
            assert!(body[e.bytes.clone()].starts_with(b"{") && body[e.bytes.clone()].ends_with(b"}"));
        }
    }

    #[test]
    fn tampering_a_wrong_secret_a_stale_or_unversioned_signature_are_refused() {
        let (body, secret, ts, signature) = vector();
        let v = QuilttVerifier::new(vec![Secret::new(secret.as_str())], DEFAULT_TOLERANCE_SECS);
        let ok = headers(&signature, &ts.to_string());
        let mut tampered = body.clone();
        let at = tampered.iter().position(|b| *b == b'3').unwrap();
        tampered[at] = b'4';
        assert_eq!(v.verify(&tampered, &ok, ts).unwrap_err(), VerifyError::SignatureMismatch);
        let wrong = QuilttVerifier::new(vec![Secret::new("not-the-secret")], DEFAULT_TOLERANCE_SECS);
        assert_eq!(wrong.verify(&body, &ok, ts).unwrap_err(), VerifyError::SignatureMismatch);
        assert_eq!(v.verify(&body, &ok, ts + 301).unwrap_err(), VerifyError::StaleTimestamp);
        assert_eq!(v.verify(&body, &ok, ts - 301).unwrap_err(), VerifyError::FutureTimestamp);
        // The generic `{timestamp}{body}` scheme (no version digit) is not Quiltt's.
        let unversioned = {
            let mac = hmac_sha256(secret.as_bytes(), &[ts.to_string().as_bytes(), &body]);
            base64::engine::general_purpose::STANDARD.encode(mac_bytes(mac))
        };
        assert_eq!(
            v.verify(&body, &headers(&unversioned, &ts.to_string()), ts).unwrap_err(),
            VerifyError::SignatureMismatch
        );
        // Another timestamp header than the one signed.
        assert_eq!(
            v.verify(&body, &headers(&signature, &(ts + 1).to_string()), ts).unwrap_err(),
            VerifyError::SignatureMismatch
        );
        // Rotation: either secret.
        let both = QuilttVerifier::new(vec![Secret::new("old"), Secret::new(secret.as_str())], 300);
        assert!(both.verify(&body, &ok, ts).is_ok());
    }

    #[test]
    fn missing_or_malformed_headers_are_named() {
        let v = QuilttVerifier::new(vec![Secret::new("s")], 300);
        assert_eq!(v.verify(b"{}", &HeaderMap::new(), 0).unwrap_err(), VerifyError::MissingHeader(TIMESTAMP_HEADER));
        let mut h = HeaderMap::new();
        h.insert(TIMESTAMP_HEADER, HeaderValue::from_static("100"));
        assert_eq!(v.verify(b"{}", &h, 100).unwrap_err(), VerifyError::MissingHeader(SIGNATURE_HEADER));
        assert_eq!(
            v.verify(b"{}", &headers("!!!", "100"), 100).unwrap_err(),
            VerifyError::MalformedHeader(SIGNATURE_HEADER)
        );
        assert_eq!(
            v.verify(b"{}", &headers("AAAA", "soon"), 100).unwrap_err(),
            VerifyError::MalformedHeader(TIMESTAMP_HEADER)
        );
    }

    /// Only after the signature: a body that is no batch, or two events
    /// with one id, refuse the whole delivery; an event without an id (or
    /// with one that is not a string) is kept apart, the others recorded.
    #[test]
    fn a_batch_that_is_no_batch_is_refused_whole_and_an_event_without_an_id_is_kept_apart() {
        let secret = Secret::new("s");
        let v = QuilttVerifier::new(vec![secret.clone()], 300);
        let signed = |body: &[u8]| v.verify(body, &headers(&sign(&secret, 100, body), "100"), 100);
        for (body, without) in [
            (&br#"{"events":[{"id":"a"},{"type":"x"}]}"#[..], &br#"{"type":"x"}"#[..]),
            (br#"{"events":[{"id":"a"},{"id":7}]}"#, br#"{"id":7}"#),
        ] {
            let Action::Batch(events) = signed(body).unwrap().action else { panic!() };
            let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
            let kept = format!("{}{}", crate::verify::MALFORMED_ID_PREFIX, crate::identity::payload_hash(without));
            assert_eq!(ids, ["a", kept.as_str()], "{}", String::from_utf8_lossy(body));
        }
        for (body, why) in [
            (&br#"{"events":[{"id":"a"},{"id":"a"}]}"#[..], "two events of the batch have the same id"),
            (br#"{"events":[]}"#, "the batch has no events"),
            (br#"{"events":{"id":"a"}}"#, "events is not an array"),
            (br#"{"eventId":"a"}"#, "body is not a Quiltt batch (no events array)"),
            (b"not json", "body is not a Quiltt batch (no events array)"),
        ] {
            assert_eq!(
                signed(body).unwrap_err(),
                VerifyError::MalformedPayload(why),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let one = signed(br#"{"events":[ {"id":"a","type":"t"} ]}"#).unwrap();
        let Action::Batch(events) = one.action else { panic!() };
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].event_id.as_str(), events[0].event_type.as_deref()), ("a", Some("t")));
    }

    #[test]
    fn the_test_batch_round_trips() {
        let body =
            batch(&[("evt_1", "profile.created"), ("evt_2", "connection.synced.successful")], "2026-01-01T00:00:00Z");
        let events = events(&body).unwrap();
        assert_eq!(events.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), ["evt_1", "evt_2"]);
    }
}
