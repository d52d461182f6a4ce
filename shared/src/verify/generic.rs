//! Generic HMAC-SHA256 senders (Shopify- and Cashfree-style; Quiltt has its own, `quiltt`): the
//! signature header, an optional prefix (`sha256=`), hex or base64, an
//! optional timestamp header with tolerance, a signed-content template, and
//! the identity taken from a header or a JSON pointer into the body.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderName};

use super::headers::parse_unix_secs;
use super::provider::{BuildContext, EndpointSpec, Provider, Verifier, Verifying, ready};
pub use super::provider::{Encoding, Source};
use super::{
    MAX_SIGNATURE_CANDIDATES, Verified, VerifyError, check_timestamp, checked_event_id, hmac_sha256, json, mac_bytes,
    mac_matches,
};
use crate::secret::Secret;

/// The byte string that is signed, as literal pieces around the body.
/// Parsed from a template such as `"{body}"`, `"{timestamp}.{body}"` or `"{timestamp}{body}"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedContent {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Timestamp,
    Body,
}

impl SignedContent {
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("{body}") {
                pieces.push(Piece::Body);
                rest = r;
            } else if let Some(r) = rest.strip_prefix("{timestamp}") {
                pieces.push(Piece::Timestamp);
                rest = r;
            } else {
                // Past the first character (which may be more than one byte).
                let first = rest.chars().next().map_or(1, char::len_utf8);
                let next = rest[first..].find('{').map_or(rest.len(), |i| i + first);
                pieces.push(Piece::Literal(rest[..next].to_owned()));
                rest = &rest[next..];
            }
        }
        if pieces.iter().filter(|p| **p == Piece::Body).count() != 1 {
            return Err(format!("signed_content {template:?} must contain {{body}} exactly once"));
        }
        if pieces.iter().any(|p| matches!(p, Piece::Literal(l) if l.contains('{') || l.contains('}'))) {
            return Err(format!(
                "signed_content {template:?} has an unknown placeholder (known: {{body}}, {{timestamp}})"
            ));
        }
        Ok(Self { pieces })
    }

    pub fn uses_timestamp(&self) -> bool {
        self.pieces.contains(&Piece::Timestamp)
    }

    fn parts<'a>(&'a self, timestamp: &'a str, body: &'a [u8]) -> Vec<&'a [u8]> {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Literal(l) => l.as_bytes(),
                Piece::Timestamp => timestamp.as_bytes(),
                Piece::Body => body,
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct GenericHmacConfig {
    pub signature_header: HeaderName,
    pub prefix: String,
    pub encoding: Encoding,
    pub timestamp_header: Option<HeaderName>,
    pub tolerance_secs: i64,
    pub signed_content: SignedContent,
    pub id: Source,
    pub event_type: Option<Source>,
}

#[derive(Debug, Clone)]
pub struct GenericHmacVerifier {
    config: GenericHmacConfig,
    secrets: Vec<Secret>,
}

/// Error labels for the configured headers (their names are in the endpoint config).
const SIGNATURE: &str = "configured signature header";
const TIMESTAMP: &str = "configured timestamp header";

impl GenericHmacVerifier {
    pub fn new(config: GenericHmacConfig, secrets: Vec<Secret>) -> Self {
        Self { config, secrets }
    }

    pub fn verify(&self, body: &[u8], headers: &HeaderMap, now: i64) -> Result<Verified, VerifyError> {
        let c = &self.config;
        let values: Vec<&str> = headers
            .get_all(&c.signature_header)
            .iter()
            .map(|v| v.to_str().map(str::trim))
            .collect::<Result<_, _>>()
            .map_err(|_| VerifyError::MalformedHeader(SIGNATURE))?;
        if values.is_empty() {
            return Err(VerifyError::MissingHeader(SIGNATURE));
        }
        // Several signatures may arrive comma-separated (rotation, or joined headers).
        let candidates: Vec<Vec<u8>> = values
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .take(MAX_SIGNATURE_CANDIDATES)
            .filter_map(|item| {
                let raw = item.strip_prefix(c.prefix.as_str())?;
                match c.encoding {
                    Encoding::Hex => hex::decode(raw).ok(),
                    Encoding::Base64 => STANDARD.decode(raw).ok(),
                }
            })
            .filter(|b| !b.is_empty())
            .collect();
        if candidates.is_empty() {
            return Err(VerifyError::MalformedHeader(SIGNATURE));
        }

        let (ts_text, timestamp) = match &c.timestamp_header {
            Some(name) => {
                let mut all = headers.get_all(name).iter();
                let text = match (all.next(), all.next()) {
                    (None, _) => return Err(VerifyError::MissingHeader(TIMESTAMP)),
                    (Some(v), None) => {
                        v.to_str().map_err(|_| VerifyError::MalformedHeader(TIMESTAMP))?.trim().to_owned()
                    }
                    (Some(_), Some(_)) => return Err(VerifyError::MalformedHeader(TIMESTAMP)),
                };
                let ts = parse_unix_secs(&text, TIMESTAMP)?;
                (text, Some(ts))
            }
            None => (String::new(), None),
        };

        let matched = self.secrets.iter().any(|secret| {
            let mac = hmac_sha256(secret.expose(), &c.signed_content.parts(&ts_text, body));
            candidates.iter().any(|cand| mac_matches(&mac, cand))
        });
        if !matched {
            return Err(VerifyError::SignatureMismatch);
        }
        if let Some(ts) = timestamp {
            check_timestamp(ts, now, c.tolerance_secs)?;
        }

        // Authenticated: read identity and type. Only the values the
        // pointers name are parsed; the rest of the body is checked and
        // skipped, in one pass for both.
        let [id_at, type_at] =
            json::pointers(body, [c.id.json_pointer(), c.event_type.as_ref().and_then(Source::json_pointer)]);
        let read = |source: &Source, at: Option<std::ops::Range<usize>>| -> Option<String> {
            match source {
                Source::Header(name) => headers.get(name.as_str())?.to_str().ok().map(|s| s.trim().to_owned()),
                Source::JsonPointer(_) => {
                    let at = at?;
                    if let Some(text) = json::string_at(body, &at) {
                        return Some(text.into_owned());
                    }
                    match serde_json::from_slice::<serde_json::Value>(body.get(at)?).ok()? {
                        serde_json::Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    }
                }
            }
        };
        let id = read(&c.id, id_at).ok_or(VerifyError::MalformedPayload("event id not found where configured"))?;
        let event_type = c.event_type.as_ref().and_then(|source| read(source, type_at));
        Ok(Verified::record(checked_event_id(&id)?, event_type))
    }
}

/// Produces a signature header value for this configuration (tests, tools).
pub fn sign(config: &GenericHmacConfig, secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let mac = mac_bytes(hmac_sha256(secret.expose(), &config.signed_content.parts(&ts, body)));
    let encoded = match config.encoding {
        Encoding::Hex => hex::encode(mac),
        Encoding::Base64 => STANDARD.encode(mac),
    };
    format!("{}{encoded}", config.prefix)
}

/// The generic HMAC sender in the provider registry: everything is in the
/// endpoint's `hmac` section.
pub struct Hmac;

/// Seconds a timestamped generic delivery may be from now, by default.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

impl Verifier for GenericHmacVerifier {
    fn verify<'a>(&'a self, body: &'a [u8], headers: &'a HeaderMap, now_s: i64) -> Verifying<'a> {
        ready(GenericHmacVerifier::verify(self, body, headers, now_s))
    }
}

/// The verifier's configuration from an endpoint's `hmac` section.
fn config_of(spec: &EndpointSpec) -> Result<GenericHmacConfig, String> {
    let h = spec.hmac.as_ref().ok_or("hmac endpoints need an \"hmac\" section")?;
    let header = |what: &str, n: &str| {
        HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes())
            .map_err(|_| format!("hmac.{what} is not a header name"))
    };
    let signed_content = SignedContent::parse(&h.signed_content)?;
    if signed_content.uses_timestamp() != h.timestamp_header.is_some() {
        return Err("hmac.signed_content uses {timestamp} exactly when hmac.timestamp_header is set".into());
    }
    for s in std::iter::once(&h.id).chain(h.event_type.as_ref()) {
        match s {
            Source::Header(n) if HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).is_err() => {
                return Err(format!("{n:?} is not a header name"));
            }
            Source::JsonPointer(p) if !p.starts_with('/') => return Err(format!("{p:?} is not a JSON pointer")),
            _ => {}
        }
    }
    Ok(GenericHmacConfig {
        signature_header: header("signature_header", &h.signature_header)?,
        prefix: h.prefix.clone(),
        encoding: h.encoding,
        timestamp_header: h.timestamp_header.as_deref().map(|t| header("timestamp_header", t)).transpose()?,
        tolerance_secs: spec.tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS),
        signed_content,
        id: h.id.clone(),
        event_type: h.event_type.clone(),
    })
}

impl Provider for Hmac {
    fn name(&self) -> &'static str {
        "hmac"
    }

    fn validate(&self, spec: &EndpointSpec) -> Result<(), String> {
        if !spec.topic_arns.is_empty() {
            return Err("topic_arns only applies to sns endpoints, not hmac".into());
        }
        config_of(spec).map(|_| ())
    }

    fn verifier(
        &self,
        spec: &EndpointSpec,
        secrets: Vec<Secret>,
        _: &BuildContext,
    ) -> Result<Box<dyn Verifier>, String> {
        Ok(Box::new(GenericHmacVerifier::new(config_of(spec)?, secrets)))
    }

    /// The id and type where the endpoint is configured to read them.
    fn sample(&self, spec: &EndpointSpec, event_id: &str, event_type: &str, _: i64) -> Vec<u8> {
        let mut v = serde_json::json!({});
        if let Some(h) = &spec.hmac {
            for (source, value) in [(Some(&h.id), event_id), (h.event_type.as_ref(), event_type)] {
                if let Some(Source::JsonPointer(p)) = source {
                    set_pointer(&mut v, p, value);
                }
            }
        }
        v.to_string().into_bytes()
    }

    fn sign(
        &self,
        spec: &EndpointSpec,
        secret: &Secret,
        event_id: &str,
        event_type: &str,
        now_s: i64,
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        let config = config_of(spec)?;
        let mut headers = vec![(config.signature_header.as_str().to_owned(), sign(&config, secret, now_s, body))];
        if let Some(t) = &config.timestamp_header {
            headers.push((t.as_str().to_owned(), now_s.to_string()));
        }
        if let Source::Header(name) = &config.id {
            headers.push((name.clone(), event_id.to_owned()));
        }
        if let Some(Source::Header(name)) = &config.event_type {
            headers.push((name.clone(), event_type.to_owned()));
        }
        Ok(headers)
    }
}

/// Sets `pointer` (`/a/b`) in `root` to the string `value`, making objects on the way.
fn set_pointer(root: &mut serde_json::Value, pointer: &str, value: &str) {
    let mut cur = root;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let Some(obj) = cur.as_object_mut() else { return };
        if i + 1 == parts.len() {
            obj.insert((*part).to_owned(), serde_json::Value::String(value.to_owned()));
            return;
        }
        cur = obj.entry((*part).to_owned()).or_insert_with(|| serde_json::json!({}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cashfree_like() -> GenericHmacConfig {
        GenericHmacConfig {
            signature_header: HeaderName::from_static("x-webhook-signature"),
            prefix: String::new(),
            encoding: Encoding::Base64,
            timestamp_header: Some(HeaderName::from_static("x-webhook-timestamp")),
            tolerance_secs: 300,
            signed_content: SignedContent::parse("{timestamp}{body}").unwrap(),
            id: Source::JsonPointer("/eventId".into()),
            event_type: Some(Source::JsonPointer("/type".into())),
        }
    }

    fn shopify_like() -> GenericHmacConfig {
        GenericHmacConfig {
            signature_header: HeaderName::from_static("x-shopify-hmac-sha256"),
            prefix: String::new(),
            encoding: Encoding::Base64,
            timestamp_header: None,
            tolerance_secs: 300,
            signed_content: SignedContent::parse("{body}").unwrap(),
            id: Source::Header("x-shopify-webhook-id".into()),
            event_type: Some(Source::Header("x-shopify-topic".into())),
        }
    }

    fn h(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_str(v).unwrap());
        }
        m
    }

    #[test]
    fn timestamped_sender_verifies_and_reads_identity_from_the_body() {
        let c = cashfree_like();
        let body = br#"{"eventId":"qe_1","type":"connection.synced"}"#;
        let now = 1_700_000_000;
        let sig = sign(&c, &Secret::new("s1"), now, body);
        let v = GenericHmacVerifier::new(c, vec![Secret::new("s2"), Secret::new("s1")]);
        let got = v
            .verify(body, &h(&[("x-webhook-signature", sig.clone()), ("x-webhook-timestamp", now.to_string())]), now)
            .unwrap();
        assert_eq!((got.event_id.as_str(), got.event_type.as_deref()), ("qe_1", Some("connection.synced")));
        let hdrs = h(&[("x-webhook-signature", sig), ("x-webhook-timestamp", now.to_string())]);
        assert_eq!(v.verify(body, &hdrs, now + 301), Err(VerifyError::StaleTimestamp));
        assert_eq!(v.verify(body, &hdrs, now - 301), Err(VerifyError::FutureTimestamp));
        assert_eq!(v.verify(br#"{"eventId":"qe_2"}"#, &hdrs, now), Err(VerifyError::SignatureMismatch));
        // The timestamp is signed: moving it breaks the signature.
        let moved = h(&[
            ("x-webhook-signature", hdrs["x-webhook-signature"].to_str().unwrap().to_owned()),
            ("x-webhook-timestamp", (now + 1).to_string()),
        ]);
        assert_eq!(v.verify(body, &moved, now), Err(VerifyError::SignatureMismatch));
    }

    #[test]
    fn header_identity_and_prefixed_hex() {
        let mut c = shopify_like();
        c.encoding = Encoding::Hex;
        c.prefix = "sha256=".into();
        let body = b"{\"order\":1}";
        let sig = sign(&c, &Secret::new("k"), 0, body);
        assert!(sig.starts_with("sha256="));
        let v = GenericHmacVerifier::new(c, vec![Secret::new("k")]);
        let hdrs = h(&[
            ("x-shopify-hmac-sha256", sig),
            ("x-shopify-webhook-id", "wh-9".into()),
            ("x-shopify-topic", "orders/create".into()),
        ]);
        let got = v.verify(body, &hdrs, 0).unwrap();
        assert_eq!((got.event_id.as_str(), got.event_type.as_deref()), ("wh-9", Some("orders/create")));
    }

    #[test]
    fn missing_pieces_are_typed_errors() {
        let v = GenericHmacVerifier::new(cashfree_like(), vec![Secret::new("s")]);
        assert!(matches!(v.verify(b"{}", &HeaderMap::new(), 0), Err(VerifyError::MissingHeader(_))));
        let no_ts = h(&[("x-webhook-signature", "AAAA".into())]);
        assert!(matches!(v.verify(b"{}", &no_ts, 0), Err(VerifyError::MissingHeader(_))));
        let empty = h(&[("x-webhook-signature", "".into()), ("x-webhook-timestamp", "1".into())]);
        assert!(matches!(v.verify(b"{}", &empty, 1), Err(VerifyError::MalformedHeader(_))));
        // Signed correctly, but the configured id is absent.
        let c = cashfree_like();
        let sig = sign(&c, &Secret::new("s"), 5, b"{}");
        let hdrs = h(&[("x-webhook-signature", sig), ("x-webhook-timestamp", "5".into())]);
        assert!(matches!(v.verify(b"{}", &hdrs, 5), Err(VerifyError::MalformedPayload(_))));
    }

    #[test]
    fn templates_are_validated() {
        assert!(SignedContent::parse("{body}").is_ok());
        assert!(SignedContent::parse("v1:{timestamp}.{body}").is_ok());
        assert!(SignedContent::parse("{timestamp}").is_err());
        assert!(SignedContent::parse("{body}{body}").is_err());
        assert!(SignedContent::parse("{nonce}.{body}").is_err());
        assert!(SignedContent::parse("{timestamp}.{body}").unwrap().uses_timestamp());
    }

    #[test]
    fn identity_from_pointers_matches_a_full_parse() {
        let body = br#"{"eventId":1e3,"type":"t","data":{"object":{"id":"obj_\u0031","n":-0,"big":18446744073709551616}},
            "list":[{"id":"first"},{"id":"second"}],"a/b":"slash","m~n":"tilde","dup":"one","dup":"two","obj":{},"nul":null}"#;
        let now = 1_700_000_000;
        let cases: &[(&str, Option<&str>)] = &[
            ("/eventId", Some("1000.0")),
            ("/data/object/id", Some("obj_1")),
            ("/data/object/n", Some("-0.0")),
            ("/data/object/big", Some("1.8446744073709552e+19")),
            ("/list/1/id", Some("second")),
            ("/list/01/id", None),
            ("/a~1b", Some("slash")),
            ("/m~0n", Some("tilde")),
            ("/dup", Some("two")),
            ("/obj", None),
            ("/nul", None),
            ("/missing", None),
            ("eventId", None),
        ];
        for (pointer, expected) in cases {
            let mut c = cashfree_like();
            c.id = Source::JsonPointer((*pointer).into());
            c.event_type = Some(Source::JsonPointer((*pointer).into()));
            let sig = sign(&c, &Secret::new("s"), now, body);
            let v = GenericHmacVerifier::new(c, vec![Secret::new("s")]);
            let got =
                v.verify(body, &h(&[("x-webhook-signature", sig), ("x-webhook-timestamp", now.to_string())]), now);
            // Before: a full parse, then Value::pointer.
            let parsed: serde_json::Value = serde_json::from_slice(body).unwrap();
            let old = match parsed.pointer(pointer) {
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                _ => None,
            };
            assert_eq!(old.as_deref(), *expected, "{pointer}");
            match expected {
                Some(id) => {
                    let got = got.unwrap();
                    assert_eq!((got.event_id.as_str(), got.event_type.as_deref()), (*id, Some(*id)), "{pointer}");
                }
                None => assert!(matches!(got, Err(VerifyError::MalformedPayload(_))), "{pointer}: {got:?}"),
            }
        }
        // A body that is not JSON has no identity in it, whatever the pointer.
        let c = cashfree_like();
        let sig = sign(&c, &Secret::new("s"), now, b"{\"eventId\":\"x\"");
        let v = GenericHmacVerifier::new(c, vec![Secret::new("s")]);
        let hdrs = h(&[("x-webhook-signature", sig), ("x-webhook-timestamp", now.to_string())]);
        assert!(matches!(v.verify(b"{\"eventId\":\"x\"", &hdrs, now), Err(VerifyError::MalformedPayload(_))));
    }

    /// Regression (found by `templates_never_panic`, minimal input `"€"`): a
    /// template starting with a multi-byte character panicked slicing at byte 1.
    #[test]
    fn template_starting_with_a_multibyte_character_is_parsed_not_a_panic() {
        assert!(SignedContent::parse("é{body}").is_ok());
        assert!(SignedContent::parse("é").is_err());
    }

    mod proptests {
        use proptest::prelude::*;

        use super::*;

        fn configs() -> Vec<GenericHmacConfig> {
            let mut hex = shopify_like();
            hex.encoding = Encoding::Hex;
            hex.prefix = "sha256=".into();
            let mut v1 = cashfree_like();
            v1.signed_content = SignedContent::parse("v1:{timestamp}.{body}").unwrap();
            vec![cashfree_like(), shopify_like(), hex, v1]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn templates_never_panic(template in "(\\{body\\}|\\{timestamp\\}|[{}a-zé€😀.:]){0,8}") {
                let _ = SignedContent::parse(&template);
            }

            /// Each configuration: a signed body verifies; one byte changed
            /// in the body or the MAC is rejected; random headers are typed errors.
            #[test]
            fn signed_bodies_round_trip_and_mutations_are_rejected(
                which in 0usize..4,
                id in "[a-zA-Z0-9_]{1,40}",
                extra in prop::collection::vec(any::<u8>(), 0..64),
                ts in 0i64..4_000_000_000,
                at in any::<prop::sample::Index>(),
                flip in 1u8..=255,
                noise in "[ -~]{0,60}",
            ) {
                let c = configs().swap_remove(which);
                let body = format!(r#"{{"eventId":"{id}","type":"t","x":"{}"}}"#, hex::encode(&extra)).into_bytes();
                let sig = sign(&c, &Secret::new("k"), ts, &body);
                let mut hdrs = vec![(c.signature_header.as_str().to_owned(), sig.clone()), ("x-shopify-webhook-id".to_owned(), id.clone())];
                if let Some(t) = &c.timestamp_header {
                    hdrs.push((t.as_str().to_owned(), ts.to_string()));
                }
                let map = |pairs: &[(String, String)]| {
                    let mut m = HeaderMap::new();
                    for (k, v) in pairs {
                        m.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
                    }
                    m
                };
                let v = GenericHmacVerifier::new(c.clone(), vec![Secret::new("k")]);
                prop_assert_eq!(v.verify(&body, &map(&hdrs), ts).unwrap().event_id, id);

                let mut tampered = body.clone();
                tampered[at.index(body.len())] ^= flip;
                prop_assert_eq!(v.verify(&tampered, &map(&hdrs), ts), Err(VerifyError::SignatureMismatch));

                let raw = sig.strip_prefix(c.prefix.as_str()).unwrap();
                let mut mac = match c.encoding { Encoding::Hex => hex::decode(raw).unwrap(), Encoding::Base64 => STANDARD.decode(raw).unwrap() };
                let i = at.index(mac.len());
                mac[i] ^= flip;
                let forged = format!("{}{}", c.prefix, match c.encoding { Encoding::Hex => hex::encode(&mac), Encoding::Base64 => STANDARD.encode(&mac) });
                hdrs[0].1 = forged;
                prop_assert_eq!(v.verify(&body, &map(&hdrs), ts), Err(VerifyError::SignatureMismatch));

                // A noise value (joined to the real one, as API Gateway joins repeats) never panics.
                if HeaderValue::from_str(&noise).is_ok() {
                    hdrs[0].1 = format!("{noise},{sig}");
                    if let Err(e) = v.verify(&body, &map(&hdrs), ts) {
                        prop_assert!(!e.reason().is_empty());
                    }
                }
            }
        }
    }
}
