//! Generic senders (Shopify-, Cashfree-, Linear-, GitLab-style; Quiltt has
//! its own, `quiltt`), configured by an endpoint's `hmac` section:
//!
//! - **how it authenticates**: an HMAC (SHA-1, SHA-256 or SHA-512, the key
//!   the secret's text, hex, base64 or `whsec_`), a shared token in a header,
//!   or HTTP basic auth (both compared in constant time);
//! - **where the signature is**: one header or several (any may match), a
//!   `k=v` list in a header (`t=…,v1=…`, `ts=…;h1=…`, the timestamp then taken
//!   from the same list), or a JSON pointer into the body; an optional
//!   prefix (`sha256=`), hex or base64;
//! - **the timestamp**: in seconds, milliseconds or RFC 3339, from a header,
//!   the list or the body, checked against a tolerance once the signature
//!   matched;
//! - **what is signed**: a template of `{body}`, `{timestamp}`,
//!   `{header:NAME}`, `{method}`, `{url}` (the endpoint's `public_url` with
//!   the query as received), `{form_sorted}` (Twilio's sorted POST
//!   parameters) and `{json:POINTER}` around literal text;
//! - **the identity**: a header, a JSON pointer, a composite of several
//!   (joined by `:`), or the body's hash; the type likewise; and `mask`, the
//!   JSON pointers of values that change between retries (masked in the
//!   content hash, so a retry is not a conflict).
//!
//! Everything is checked when the endpoint is loaded, with an error that
//! names the option.

use std::borrow::Cow;
use std::ops::Range;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac as HmacOf, KeyInit, Mac};
use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use super::headers::parse_unix_secs;
use super::provider::{
    Algorithm, Auth, BuildContext, Delivery, EndpointSpec, HmacSpec, Identity, KeyEncoding, Provider, SignatureList,
    SuccessAnswer, TimestampFormat, Verifier, Verifying, ready,
};
pub use super::provider::{Encoding, Source};
use super::{Content, MAX_SIGNATURE_CANDIDATES, Verified, VerifyError, check_timestamp, checked_event_id, json, sns};
use crate::identity::payload_hash;
use crate::secret::Secret;

/// The byte string that is signed: literal pieces and placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedContent {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Timestamp,
    Body,
    Header(HeaderName),
    Method,
    Url,
    FormSorted,
    Json(String),
}

const PLACEHOLDERS: &str = "{body}, {timestamp}, {header:NAME}, {method}, {url}, {form_sorted}, {json:POINTER}";

impl SignedContent {
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix('{') {
                let end = r.find('}').ok_or_else(|| format!("signed_content {template:?} has an unclosed {{"))?;
                let (name, after) = (&r[..end], &r[end + 1..]);
                pieces.push(match name {
                    "body" => Piece::Body,
                    "timestamp" => Piece::Timestamp,
                    "method" => Piece::Method,
                    "url" => Piece::Url,
                    "form_sorted" => Piece::FormSorted,
                    _ if name.starts_with("header:") => {
                        let h = &name["header:".len()..];
                        Piece::Header(
                            HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
                                .map_err(|_| format!("signed_content: {h:?} is not a header name"))?,
                        )
                    }
                    _ if name.starts_with("json:/") => Piece::Json(name["json:".len()..].to_owned()),
                    _ => {
                        return Err(format!(
                            "signed_content {template:?} has an unknown placeholder {{{name}}} (known: {PLACEHOLDERS})"
                        ));
                    }
                });
                rest = after;
            } else {
                let next = rest.find('{').unwrap_or(rest.len());
                let literal = &rest[..next];
                if literal.contains('}') {
                    return Err(format!("signed_content {template:?} has a }} without its {{"));
                }
                pieces.push(Piece::Literal(literal.to_owned()));
                rest = &rest[next..];
            }
        }
        let count = |p: &Piece| pieces.iter().filter(|q| *q == p).count();
        if count(&Piece::Body) > 1 || count(&Piece::FormSorted) > 1 {
            return Err(format!("signed_content {template:?} may contain {{body}} and {{form_sorted}} once each"));
        }
        let covers = pieces.iter().any(|p| matches!(p, Piece::Body | Piece::FormSorted | Piece::Json(_)));
        if !covers {
            return Err(format!(
                "signed_content {template:?} must contain {{body}}, {{form_sorted}} or a {{json:…}} field"
            ));
        }
        Ok(Self { pieces })
    }

    pub fn uses_timestamp(&self) -> bool {
        self.pieces.contains(&Piece::Timestamp)
    }

    /// Whether the body's bytes are signed whole (so a timestamp inside it is signed too).
    fn uses_body(&self) -> bool {
        self.pieces.contains(&Piece::Body)
    }

    fn uses_url(&self) -> bool {
        self.pieces.contains(&Piece::Url)
    }

    /// The signed bytes' parts for this delivery.
    fn parts<'a>(
        &'a self,
        d: &Delivery<'a>,
        url: &'a str,
        timestamp: &'a str,
    ) -> Result<Vec<Cow<'a, [u8]>>, VerifyError> {
        let mut out = Vec::with_capacity(self.pieces.len());
        for p in &self.pieces {
            out.push(match p {
                Piece::Literal(l) => Cow::Borrowed(l.as_bytes()),
                Piece::Timestamp => Cow::Borrowed(timestamp.as_bytes()),
                Piece::Body => Cow::Borrowed(d.body),
                Piece::Method => Cow::Borrowed(d.method.as_str().as_bytes()),
                Piece::Url if d.query.is_empty() => Cow::Borrowed(url.as_bytes()),
                Piece::Url => Cow::Owned(format!("{url}?{}", d.query).into_bytes()),
                Piece::Header(name) => {
                    let v = d.headers.get(name).ok_or(VerifyError::MissingHeader(SIGNED_HEADER))?;
                    Cow::Borrowed(v.as_bytes())
                }
                Piece::FormSorted => Cow::Owned(form_sorted(d.body)),
                Piece::Json(pointer) => {
                    let [at] = json::pointers(d.body, [Some(pointer.as_str())]);
                    let text =
                        at.and_then(|r| json_text(d.body, &r)).ok_or(VerifyError::MissingHeader(SIGNED_FIELD))?;
                    Cow::Owned(text.into_bytes())
                }
            });
        }
        Ok(out)
    }
}

/// Twilio's canonical form: the POST parameters sorted by name, each name
/// followed by its value, concatenated.
fn form_sorted(body: &[u8]) -> Vec<u8> {
    // Borrowed where nothing is escaped; one buffer for the result.
    let mut params: Vec<(Cow<'_, str>, Cow<'_, str>)> = url::form_urlencoded::parse(body).collect();
    params.sort_unstable();
    let mut out = Vec::with_capacity(body.len());
    for (k, v) in &params {
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out
}

/// The text of a JSON string or number at `at` in `body`.
pub(super) fn json_text(body: &[u8], at: &Range<usize>) -> Option<String> {
    if let Some(text) = json::string_at(body, at) {
        return Some(text.into_owned());
    }
    match serde_json::from_slice::<serde_json::Value>(body.get(at.clone())?).ok()? {
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Where the timestamp is read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TimestampAt {
    Header(HeaderName),
    List,
    Pointer(String),
}

/// An endpoint's `hmac` section, checked and compiled.
#[derive(Debug, Clone)]
pub struct GenericHmacConfig {
    auth: Auth,
    signature_headers: Vec<HeaderName>,
    signature_pointer: Option<String>,
    list: Option<SignatureList>,
    prefix: String,
    encoding: Encoding,
    algorithm: Algorithm,
    key: KeyEncoding,
    timestamp: Option<TimestampAt>,
    timestamp_format: TimestampFormat,
    tolerance_secs: i64,
    signed_content: SignedContent,
    url: String,
    id: Source,
    event_type: Option<Source>,
    mask: Vec<String>,
    /// Every JSON pointer the identity, the type and the mask read, once
    /// each: found in one pass over the body.
    fields: Vec<String>,
}

/// Every JSON pointer an identity, a type and a mask read, once each.
fn fields_of(id: &Source, event_type: Option<&Source>, mask: &[String]) -> Vec<String> {
    let mut wanted: Vec<&str> = Vec::new();
    source_pointers(id, &mut wanted);
    if let Some(t) = event_type {
        source_pointers(t, &mut wanted);
    }
    wanted.extend(mask.iter().map(String::as_str));
    let mut fields: Vec<String> = Vec::new();
    for p in wanted {
        if !fields.iter().any(|f| f == p) {
            fields.push(p.to_owned());
        }
    }
    fields
}

/// The JSON pointers `source` reads.
fn source_pointers<'a>(source: &'a Source, out: &mut Vec<&'a str>) {
    match source {
        Source::JsonPointer(p) => out.push(p),
        Source::Composite(parts) => parts.iter().for_each(|p| source_pointers(p, out)),
        Source::Header(_) | Source::BodyHash => {}
    }
}

/// Error labels for configured names (their values are in the endpoint config).
const SIGNATURE: &str = "configured signature header";
const TIMESTAMP: &str = "configured timestamp";
const SIGNED_HEADER: &str = "configured signed header";
const SIGNED_FIELD: &str = "configured signed field";
const AUTHORIZATION: &str = "authorization";

fn header_name(what: &str, n: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes())
        .map_err(|_| format!("hmac.{what}: {n:?} is not a header name"))
}

fn pointer(what: &str, p: &str) -> Result<String, String> {
    if p.starts_with('/') { Ok(p.to_owned()) } else { Err(format!("hmac.{what}: {p:?} is not a JSON pointer")) }
}

fn checked_source(what: &str, s: &Source, top: bool) -> Result<(), String> {
    match s {
        Source::Header(n) => header_name(what, n).map(|_| ()),
        Source::JsonPointer(p) => pointer(what, p).map(|_| ()),
        Source::Composite(parts) if top && matches!(what, "id" | "type") && !parts.is_empty() => {
            parts.iter().try_for_each(|p| checked_source(what, p, false))
        }
        Source::BodyHash if top && what == "id" => Ok(()),
        _ => Err(format!(
            "hmac.{what}: a header, a json_pointer{}",
            if what == "id" { ", a composite of those, or body_hash" } else { " or a composite of those" }
        )),
    }
}

/// A `public_url` as the provider calls it: https (http only for a local
/// host), with no query or fragment.
fn checked_public_url(raw: &str) -> Result<String, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("public_url {raw:?}: {e}"))?;
    let local = matches!(url.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
    if !(url.scheme() == "https" || (url.scheme() == "http" && local)) {
        return Err(format!("public_url {raw:?} must be https"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("public_url {raw:?} must have no query or fragment"));
    }
    Ok(raw.to_owned())
}

impl GenericHmacConfig {
    /// Checks and compiles an `hmac` section (`tolerance_secs` and
    /// `public_url` are the endpoint's).
    pub fn from_spec(h: &HmacSpec, tolerance_secs: i64, public_url: Option<&str>) -> Result<Self, String> {
        let signature_headers = match &h.signature_header {
            Some(names) => {
                names.names().into_iter().map(|n| header_name("signature_header", n)).collect::<Result<Vec<_>, _>>()?
            }
            None => Vec::new(),
        };
        let signature_pointer = h.signature_pointer.as_deref().map(|p| pointer("signature_pointer", p)).transpose()?;
        let mut timestamp = None;
        if let Some(t) = &h.timestamp_header {
            timestamp = Some(TimestampAt::Header(header_name("timestamp_header", t)?));
        }
        if let Some(p) = &h.timestamp_pointer {
            if timestamp.is_some() {
                return Err("hmac: timestamp_header and timestamp_pointer exclude each other".into());
            }
            timestamp = Some(TimestampAt::Pointer(pointer("timestamp_pointer", p)?));
        }
        if let Some(list) = &h.list {
            if !matches!(list.separator.as_str(), "," | ";") {
                return Err("hmac.list.separator is \",\" or \";\"".into());
            }
            if list.signature.is_empty() || list.timestamp.as_deref() == Some("") {
                return Err("hmac.list: signature (and timestamp, when set) name the items' keys".into());
            }
            if list.timestamp.is_some() {
                if timestamp.is_some() {
                    return Err("hmac: the timestamp comes from one place: the list, a header or the body".into());
                }
                timestamp = Some(TimestampAt::List);
            }
        }
        let signed_content = SignedContent::parse(&h.signed_content)?;
        let url = match (signed_content.uses_url(), public_url) {
            (true, Some(u)) => checked_public_url(u)?,
            (true, None) => return Err("hmac.signed_content uses {url}: the endpoint needs its public_url".into()),
            (false, _) => String::new(),
        };
        let encoding = match h.auth {
            Auth::Hmac => {
                if signature_headers.is_empty() == signature_pointer.is_none() {
                    return Err(
                        "hmac: the signature is in signature_header or at signature_pointer (one of them)".into()
                    );
                }
                if h.list.is_some() && signature_headers.is_empty() {
                    return Err("hmac.list reads the signature_header".into());
                }
                // A timestamp read from a body that is signed whole is signed.
                let in_signed_body = matches!(timestamp, Some(TimestampAt::Pointer(_))) && signed_content.uses_body();
                if signed_content.uses_timestamp() != timestamp.is_some() && !in_signed_body {
                    return Err(
                        "hmac.signed_content uses {timestamp} exactly when a timestamp is configured (timestamp_header, timestamp_pointer or list.timestamp; a timestamp_pointer into a body signed whole needs none): an unsigned timestamp proves nothing".into(),
                    );
                }
                if signature_pointer.is_some()
                    && (signed_content.uses_body() || signed_content.pieces.contains(&Piece::FormSorted))
                {
                    return Err("hmac: a signature inside the body cannot sign the whole body ({body}, {form_sorted}): sign {json:POINTER} fields".into());
                }
                h.encoding.ok_or("hmac.encoding: hex or base64")?
            }
            Auth::Token | Auth::Basic => {
                let extra = h.signature_pointer.is_some()
                    || h.list.is_some()
                    || timestamp.is_some()
                    || h.encoding.is_some()
                    || h.signed_content != "{body}"
                    || h.algorithm != Algorithm::default()
                    || h.key != KeyEncoding::default();
                if extra {
                    return Err(
                        "hmac: token and basic endpoints take no signature, timestamp, encoding or key options".into(),
                    );
                }
                match (h.auth, signature_headers.len()) {
                    (Auth::Token, 1) | (Auth::Basic, 0) => {}
                    (Auth::Token, _) => return Err("hmac: a token endpoint names one signature_header".into()),
                    _ => return Err("hmac: a basic endpoint reads Authorization (no signature_header)".into()),
                }
                Encoding::Hex
            }
        };
        checked_source("id", &h.id, true)?;
        if let Some(t) = &h.event_type {
            checked_source("type", t, true)?;
        }
        let mask = h.mask.iter().map(|p| pointer("mask", p)).collect::<Result<Vec<_>, _>>()?;
        let fields = fields_of(&h.id, h.event_type.as_ref(), &mask);
        Ok(Self {
            fields,
            auth: h.auth,
            signature_headers,
            signature_pointer,
            list: h.list.clone(),
            prefix: h.prefix.clone(),
            encoding,
            algorithm: h.algorithm,
            key: h.key,
            timestamp,
            timestamp_format: h.timestamp_format,
            tolerance_secs,
            signed_content,
            url,
            id: h.id.clone(),
            event_type: h.event_type.clone(),
            mask,
        })
    }

    /// Whether the signature is hex (read in either case).
    pub fn hex(&self) -> bool {
        self.encoding == Encoding::Hex
    }

    /// Whether a timestamp is checked (so a stale delivery is refused).
    pub fn timestamped(&self) -> bool {
        self.timestamp.is_some()
    }

    /// Whether the bytes of the body are authenticated (not so for token
    /// and basic-auth senders, nor for a signature inside the body).
    pub fn signs_body(&self) -> bool {
        self.auth == Auth::Hmac
            && self.signed_content.pieces.iter().any(|p| matches!(p, Piece::Body | Piece::FormSorted))
    }

    /// The HMAC keys of `secrets` as this endpoint decodes them.
    pub fn keys(&self, secrets: &[Secret]) -> Result<Vec<Secret>, String> {
        secrets
            .iter()
            .enumerate()
            .map(|(i, s)| decode_key(self.key, s).map_err(|why| format!("secret {}: {why}", i + 1)))
            .collect()
    }
}

fn decode_key(encoding: KeyEncoding, secret: &Secret) -> Result<Secret, &'static str> {
    let text = || std::str::from_utf8(secret.expose()).map_err(|_| "not text").map(str::trim);
    let bytes = match encoding {
        KeyEncoding::Text => return Ok(secret.clone()),
        KeyEncoding::Hex => hex::decode(text()?).map_err(|_| "not hex")?,
        KeyEncoding::Base64 => STANDARD.decode(text()?).map_err(|_| "not base64")?,
        KeyEncoding::Whsec => {
            let t = text()?;
            STANDARD.decode(t.strip_prefix("whsec_").unwrap_or(t)).map_err(|_| "not whsec_<base64>")?
        }
    };
    if bytes.is_empty() {
        return Err("empty");
    }
    Ok(Secret::new(bytes))
}

/// The MAC of `parts` under `key`.
fn mac(algorithm: Algorithm, key: &[u8], parts: &[Cow<'_, [u8]>]) -> Vec<u8> {
    fn run<M: Mac + KeyInit>(key: &[u8], parts: &[Cow<'_, [u8]>]) -> Vec<u8> {
        // HMAC accepts keys of any length.
        let mut m = <M as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().to_vec()
    }
    match algorithm {
        Algorithm::Sha1 => run::<HmacOf<sha1::Sha1>>(key, parts),
        Algorithm::Sha256 => run::<HmacOf<Sha256>>(key, parts),
        Algorithm::Sha512 => run::<HmacOf<Sha512>>(key, parts),
    }
}

/// Constant-time equality of two secrets-derived byte strings of any length
/// (their SHA-256 digests are compared).
pub(super) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    bool::from(Sha256::digest(a).ct_eq(&Sha256::digest(b)))
}

/// Seconds since the epoch of an RFC 3339 time (`Z` or `±HH:MM`, a fraction allowed).
fn rfc3339_secs(text: &str) -> Option<i64> {
    let t = text.trim();
    if let Some(base) = t.strip_suffix(['Z', 'z']) {
        return sns::parse_timestamp(&format!("{base}Z"));
    }
    let (base, offset) = t.split_at_checked(t.len().checked_sub(6)?)?;
    let o = offset.as_bytes();
    let sign = match o[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    if o[3] != b':' || !o[1..3].iter().chain(&o[4..6]).all(u8::is_ascii_digit) {
        return None;
    }
    let (hh, mm) =
        (i64::from(o[1] - b'0') * 10 + i64::from(o[2] - b'0'), i64::from(o[4] - b'0') * 10 + i64::from(o[5] - b'0'));
    if hh > 23 || mm > 59 {
        return None;
    }
    Some(sns::parse_timestamp(&format!("{base}Z"))? - sign * (hh * 3600 + mm * 60))
}

fn timestamp_secs(format: TimestampFormat, text: &str) -> Result<i64, VerifyError> {
    match format {
        TimestampFormat::Seconds => parse_unix_secs(text, TIMESTAMP),
        TimestampFormat::Milliseconds => {
            let digits = !text.is_empty() && text.len() <= 15 && text.bytes().all(|b| b.is_ascii_digit());
            let ms: i64 = if digits {
                text.parse().map_err(|_| VerifyError::MalformedHeader(TIMESTAMP))?
            } else {
                return Err(VerifyError::MalformedHeader(TIMESTAMP));
            };
            Ok(ms.div_euclid(1000))
        }
        TimestampFormat::Rfc3339 => rfc3339_secs(text).ok_or(VerifyError::MalformedHeader(TIMESTAMP)),
    }
}

/// The timestamp text as it is signed, for `now_s`, in `format`.
fn timestamp_text(format: TimestampFormat, now_s: i64) -> String {
    match format {
        TimestampFormat::Seconds => now_s.to_string(),
        TimestampFormat::Milliseconds => (now_s * 1000).to_string(),
        TimestampFormat::Rfc3339 => sns::format_timestamp(now_s),
    }
}

#[derive(Debug, Clone)]
pub struct GenericHmacVerifier {
    config: GenericHmacConfig,
    /// HMAC keys (decoded), or the tokens / `user:password` pairs.
    secrets: Vec<Secret>,
}

impl GenericHmacVerifier {
    /// `secrets` as resolved; decoded here per the endpoint's `key`.
    pub fn new(config: GenericHmacConfig, secrets: Vec<Secret>) -> Result<Self, String> {
        let secrets = config.keys(&secrets)?;
        Ok(Self { config, secrets })
    }

    /// Verifies a POST delivery with no query (tests and benches).
    pub fn verify(&self, body: &[u8], headers: &HeaderMap, now: i64) -> Result<Verified, VerifyError> {
        self.verify_delivery(&Delivery { body, headers, method: &http::Method::POST, query: "" }, now)
    }

    pub fn verify_delivery(&self, d: &Delivery<'_>, now: i64) -> Result<Verified, VerifyError> {
        self.authenticate(d, now)?;
        // Authenticated: read identity, type and the masked values.
        self.identify(d)
    }

    /// Hex HMAC of `msg` under the endpoint's first secret, with its
    /// algorithm (a provider's handshake that proves the secret: Zoom's).
    pub fn first_mac_hex(&self, msg: &[u8]) -> String {
        self.secrets
            .first()
            .map(|k| hex::encode(mac(self.config.algorithm, k.expose(), &[Cow::Borrowed(msg)])))
            .unwrap_or_default()
    }

    /// The signature (or token, or credentials) and the timestamp alone,
    /// for a caller that reads the identities itself (a batch).
    pub fn authenticate(&self, d: &Delivery<'_>, now: i64) -> Result<(), VerifyError> {
        match self.config.auth {
            Auth::Hmac => self.check_hmac(d, now),
            Auth::Token => self.check_token(d),
            Auth::Basic => self.check_basic(d),
        }
    }

    fn header_values<'a>(&self, d: &Delivery<'a>) -> Result<Vec<&'a str>, VerifyError> {
        let mut values = Vec::new();
        for name in &self.config.signature_headers {
            for v in d.headers.get_all(name) {
                values.push(v.to_str().map_err(|_| VerifyError::MalformedHeader(SIGNATURE))?.trim());
            }
        }
        Ok(values)
    }

    fn check_hmac(&self, d: &Delivery<'_>, now: i64) -> Result<(), VerifyError> {
        let c = &self.config;
        let mut raw: Vec<String> = Vec::new();
        let mut listed_ts: Option<String> = None;
        if let Some(p) = &c.signature_pointer {
            let [at] = json::pointers(d.body, [Some(p.as_str())]);
            raw.extend(at.and_then(|r| json_text(d.body, &r)));
            if raw.is_empty() {
                return Err(VerifyError::MissingHeader(SIGNATURE));
            }
        } else {
            let values = self.header_values(d)?;
            if values.is_empty() {
                return Err(VerifyError::MissingHeader(SIGNATURE));
            }
            for v in values {
                match &c.list {
                    Some(list) => {
                        for item in v.split(list.separator.as_str()).map(str::trim).filter(|i| !i.is_empty()) {
                            let Some((k, val)) = item.split_once('=') else { continue };
                            if k.trim() == list.signature {
                                // At most MAX_SIGNATURE_CANDIDATES are kept (a stuffed header buys nothing).
                                if raw.len() < MAX_SIGNATURE_CANDIDATES {
                                    raw.push(val.trim().to_owned());
                                }
                            } else if list.timestamp.as_deref() == Some(k.trim())
                                && listed_ts.replace(val.trim().to_owned()).is_some()
                            {
                                return Err(VerifyError::MalformedHeader(TIMESTAMP));
                            }
                        }
                    }
                    None => {
                        let room = MAX_SIGNATURE_CANDIDATES.saturating_sub(raw.len());
                        raw.extend(v.split(',').map(str::trim).filter(|s| !s.is_empty()).take(room).map(str::to_owned));
                    }
                }
            }
        }
        let candidates: Vec<Vec<u8>> = raw
            .iter()
            .take(MAX_SIGNATURE_CANDIDATES)
            .filter_map(|item| {
                let encoded = item.strip_prefix(c.prefix.as_str())?;
                match c.encoding {
                    Encoding::Hex => hex::decode(encoded).ok(),
                    Encoding::Base64 => STANDARD.decode(encoded).ok(),
                }
            })
            .filter(|b| !b.is_empty())
            .collect();
        if candidates.is_empty() {
            return Err(VerifyError::MalformedHeader(SIGNATURE));
        }
        let ts_text = match &c.timestamp {
            None => None,
            Some(TimestampAt::List) => Some(listed_ts.ok_or(VerifyError::MissingHeader(TIMESTAMP))?),
            Some(TimestampAt::Header(name)) => {
                let mut all = d.headers.get_all(name).iter();
                match (all.next(), all.next()) {
                    (None, _) => return Err(VerifyError::MissingHeader(TIMESTAMP)),
                    (Some(v), None) => {
                        Some(v.to_str().map_err(|_| VerifyError::MalformedHeader(TIMESTAMP))?.trim().to_owned())
                    }
                    (Some(_), Some(_)) => return Err(VerifyError::MalformedHeader(TIMESTAMP)),
                }
            }
            Some(TimestampAt::Pointer(p)) => {
                let [at] = json::pointers(d.body, [Some(p.as_str())]);
                Some(at.and_then(|r| json_text(d.body, &r)).ok_or(VerifyError::MissingHeader(TIMESTAMP))?)
            }
        };
        let timestamp = ts_text.as_deref().map(|t| timestamp_secs(c.timestamp_format, t)).transpose()?;
        let parts = c.signed_content.parts(d, &c.url, ts_text.as_deref().unwrap_or(""))?;
        let matched = self.secrets.iter().any(|key| {
            let ours = mac(c.algorithm, key.expose(), &parts);
            // Every candidate is compared (in constant time each).
            candidates.iter().fold(false, |hit, cand| hit | bool::from(ours.as_slice().ct_eq(cand.as_slice())))
        });
        if !matched {
            return Err(VerifyError::SignatureMismatch);
        }
        if let Some(ts) = timestamp {
            check_timestamp(ts, now, c.tolerance_secs)?;
        }
        Ok(())
    }

    fn check_token(&self, d: &Delivery<'_>) -> Result<(), VerifyError> {
        let values = self.header_values(d)?;
        let [value] = values.as_slice() else {
            return Err(if values.is_empty() {
                VerifyError::MissingHeader(SIGNATURE)
            } else {
                VerifyError::MalformedHeader(SIGNATURE)
            });
        };
        let token = value.strip_prefix(self.config.prefix.as_str()).ok_or(VerifyError::SignatureMismatch)?;
        let matched = self.secrets.iter().fold(false, |hit, s| hit | same_secret(s.expose(), token.as_bytes()));
        if matched { Ok(()) } else { Err(VerifyError::SignatureMismatch) }
    }

    fn check_basic(&self, d: &Delivery<'_>) -> Result<(), VerifyError> {
        let value = d.headers.get(http::header::AUTHORIZATION).ok_or(VerifyError::MissingHeader(AUTHORIZATION))?;
        let value = value.to_str().map_err(|_| VerifyError::MalformedHeader(AUTHORIZATION))?.trim();
        let (scheme, encoded) = value.split_once(' ').ok_or(VerifyError::MalformedHeader(AUTHORIZATION))?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(VerifyError::MalformedHeader(AUTHORIZATION));
        }
        let pair = STANDARD.decode(encoded.trim()).map_err(|_| VerifyError::MalformedHeader(AUTHORIZATION))?;
        let matched = self.secrets.iter().fold(false, |hit, s| hit | same_secret(s.expose(), &pair));
        if matched { Ok(()) } else { Err(VerifyError::SignatureMismatch) }
    }

    /// The identity, type and content of an authenticated delivery.
    pub fn identify(&self, d: &Delivery<'_>) -> Result<Verified, VerifyError> {
        let c = &self.config;
        // Every configured field in one pass over the body.
        let found = json::pointers_many(d.body, &c.fields);
        let at = |p: &str| c.fields.iter().position(|f| f == p).and_then(|i| found[i].clone());
        let id = read(&c.id, d, &at).ok_or(VerifyError::MalformedPayload("event id not found where configured"))?;
        let event_type = c.event_type.as_ref().and_then(|source| read(source, d, &at));
        let body_hash_id = matches!(c.id, Source::BodyHash);
        let mut verified = Verified::record(checked_event_id(&id)?, event_type);
        if !c.mask.is_empty() {
            let mut ranges: Vec<Range<usize>> = c.mask.iter().filter_map(|p| at(p)).collect();
            ranges.sort_by_key(|r| r.start);
            ranges.dedup_by(|later, earlier| later.start < earlier.end);
            verified.content = Content::Masked { ranges };
        } else if body_hash_id {
            // The id is the payload hash: not computed again.
            verified.content = Content::Hashed { payload: id };
        }
        Ok(verified)
    }
}

/// Where the values at the `mask` pointers are in `body`: ordered and
/// disjoint (of nested pointers, the outer value is kept).
pub fn mask_ranges<S: AsRef<str>>(body: &[u8], mask: &[S]) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> =
        mask.iter().filter_map(|p| json::pointers(body, [Some(p.as_ref())])[0].clone()).collect();
    ranges.sort_by_key(|r| r.start);
    ranges.dedup_by(|later, earlier| later.start < earlier.end);
    ranges
}

/// The value `source` names in this delivery (`at`: where each JSON pointer's value is).
fn read(source: &Source, d: &Delivery<'_>, at: &dyn Fn(&str) -> Option<Range<usize>>) -> Option<String> {
    match source {
        Source::Header(name) => d.headers.get(name.as_str())?.to_str().ok().map(|s| s.trim().to_owned()),
        Source::JsonPointer(p) => json_text(d.body, &at(p)?),
        Source::Composite(parts) => {
            let values: Option<Vec<String>> = parts.iter().map(|p| read(p, d, at)).collect();
            Some(values?.join(":"))
        }
        Source::BodyHash => Some(payload_hash(d.body)),
    }
}

/// The headers a sender of this configuration sends with `body` at
/// `now_s` (for tests and the developer tool): the signature (or token, or
/// basic credentials), its timestamp, and the id and type where they are
/// read from headers. `extra` are the other headers the delivery carries
/// (read by `{header:NAME}`).
pub fn sign_headers(
    config: &GenericHmacConfig,
    secret: &Secret,
    now_s: i64,
    body: &[u8],
    extra: &[(String, String)],
) -> Result<Vec<(String, String)>, String> {
    let c = config;
    let first = c.signature_headers.first().map(|h| h.as_str().to_owned());
    match c.auth {
        Auth::Token => {
            return Ok(vec![(
                first.unwrap_or_default(),
                format!("{}{}", c.prefix, String::from_utf8_lossy(secret.expose())),
            )]);
        }
        Auth::Basic => {
            return Ok(vec![("authorization".into(), format!("Basic {}", STANDARD.encode(secret.expose())))]);
        }
        Auth::Hmac => {}
    }
    let Some(header) = first else {
        // The signature is inside the body ([`seal`] writes it); nothing goes in the headers.
        return Ok(Vec::new());
    };
    let ts = timestamp_text(c.timestamp_format, now_s);
    let mut headers = HeaderMap::new();
    for (k, v) in extra {
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), http::HeaderValue::from_str(v)) {
            headers.append(k, v);
        }
    }
    let d = Delivery { body, headers: &headers, method: &http::Method::POST, query: "" };
    let parts = c.signed_content.parts(&d, &c.url, &ts).map_err(|e| e.to_string())?;
    let key = decode_key(c.key, secret).map_err(str::to_owned)?;
    let mac = mac(c.algorithm, key.expose(), &parts);
    let encoded = match c.encoding {
        Encoding::Hex => hex::encode(mac),
        Encoding::Base64 => STANDARD.encode(mac),
    };
    let signature = format!("{}{encoded}", c.prefix);
    let mut out = Vec::new();
    match (&c.list, &c.timestamp) {
        (Some(list), Some(TimestampAt::List)) => {
            let t = list.timestamp.as_deref().unwrap_or("t");
            out.push((header, format!("{t}={ts}{}{}={signature}", list.separator, list.signature)));
        }
        (Some(list), _) => out.push((header, format!("{}={signature}", list.signature))),
        (None, _) => out.push((header, signature)),
    }
    if let Some(TimestampAt::Header(t)) = &c.timestamp {
        out.push((t.as_str().to_owned(), ts));
    }
    Ok(out)
}

/// `body` with the signature (and its timestamp) written inside it, as a
/// sender whose signature is in the body sends it (Mailgun): the timestamp
/// at `timestamp_pointer` is set to `now_s`, then the signature at
/// `signature_pointer`. A configuration whose signature is in a header
/// returns the body as it is.
pub fn seal(config: &GenericHmacConfig, secret: &Secret, now_s: i64, body: Vec<u8>) -> Result<Vec<u8>, String> {
    let c = config;
    let Some(at) = &c.signature_pointer else { return Ok(body) };
    let mut doc: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("the body to sign is not JSON: {e}"))?;
    let ts = timestamp_text(c.timestamp_format, now_s);
    if let Some(TimestampAt::Pointer(p)) = &c.timestamp {
        set_pointer(&mut doc, p, &ts);
    }
    let with_ts = serde_json::to_vec(&doc).map_err(|e| e.to_string())?;
    let headers = HeaderMap::new();
    let d = Delivery { body: &with_ts, headers: &headers, method: &http::Method::POST, query: "" };
    let parts = c.signed_content.parts(&d, &c.url, &ts).map_err(|e| e.to_string())?;
    let key = decode_key(c.key, secret).map_err(str::to_owned)?;
    let mac = mac(c.algorithm, key.expose(), &parts);
    let encoded = match c.encoding {
        Encoding::Hex => hex::encode(mac),
        Encoding::Base64 => STANDARD.encode(mac),
    };
    set_pointer(&mut doc, at, &format!("{}{encoded}", c.prefix));
    serde_json::to_vec(&doc).map_err(|e| e.to_string())
}

/// The signature header value alone (tests, benches): see [`sign_headers`].
pub fn sign(config: &GenericHmacConfig, secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    sign_headers(config, secret, timestamp, body, &[])
        .ok()
        .and_then(|h| h.into_iter().next())
        .map(|(_, v)| v)
        .unwrap_or_default()
}

/// The generic HMAC sender in the provider registry: everything is in the
/// endpoint's `hmac` section.
pub struct Hmac;

/// Seconds a timestamped generic delivery may be from now, by default.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

impl Verifier for GenericHmacVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, now_s: i64) -> Verifying<'a> {
        ready(self.verify_delivery(&d, now_s))
    }
}

/// The verifier's configuration from an endpoint's `hmac` section.
pub fn config_of(spec: &EndpointSpec) -> Result<GenericHmacConfig, String> {
    let h = spec.hmac.as_ref().ok_or("hmac endpoints need an \"hmac\" section")?;
    GenericHmacConfig::from_spec(h, spec.tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS), spec.public_url.as_deref())
}

impl Provider for Hmac {
    fn name(&self) -> &'static str {
        "hmac"
    }

    /// As configured: an `id` from a header the section does not sign cannot be bound to the body (the sender's contract is unknown).
    fn identity(&self) -> Identity {
        Identity::UNBOUND
    }

    /// A configured sender: the intake's answer (any 2xx is what such senders check).
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
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
        Ok(Box::new(GenericHmacVerifier::new(config_of(spec)?, secrets)?))
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

    fn seal(&self, spec: &EndpointSpec, secret: &Secret, now_s: i64, body: Vec<u8>) -> Result<Vec<u8>, String> {
        seal(&config_of(spec)?, secret, now_s, body)
    }

    fn summary(&self) -> &'static str {
        "any HMAC (SHA-1/256/512), shared token or basic-auth sender, as its hmac section says"
    }

    fn options(&self) -> String {
        "hmac (required), public_url, tolerance_secs".into()
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
        let mut ids = Vec::new();
        if let Source::Header(name) = &config.id {
            ids.push((name.clone(), event_id.to_owned()));
        }
        if let Some(Source::Header(name)) = &config.event_type {
            ids.push((name.clone(), event_type.to_owned()));
        }
        let mut headers = sign_headers(&config, secret, now_s, body, &ids)?;
        headers.extend(ids);
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

    /// A configuration from its `hmac` section's JSON.
    pub(super) fn config(section: serde_json::Value) -> GenericHmacConfig {
        config_at(section, None)
    }

    fn config_at(section: serde_json::Value, public_url: Option<&str>) -> GenericHmacConfig {
        let spec: HmacSpec = serde_json::from_value(section).unwrap();
        GenericHmacConfig::from_spec(&spec, 300, public_url).unwrap()
    }

    fn cashfree_like() -> GenericHmacConfig {
        config(serde_json::json!({"signature_header": "x-webhook-signature", "encoding": "base64",
            "timestamp_header": "x-webhook-timestamp", "signed_content": "{timestamp}{body}",
            "id": {"json_pointer": "/eventId"}, "type": {"json_pointer": "/type"}}))
    }

    fn shopify_like() -> GenericHmacConfig {
        config(serde_json::json!({"signature_header": "x-shopify-hmac-sha256", "encoding": "base64",
            "id": {"header": "x-shopify-webhook-id"}, "type": {"header": "x-shopify-topic"}}))
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
        let v = GenericHmacVerifier::new(c, vec![Secret::new("s2"), Secret::new("s1")]).unwrap();
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
        let v = GenericHmacVerifier::new(c, vec![Secret::new("k")]).unwrap();
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
        let v = GenericHmacVerifier::new(cashfree_like(), vec![Secret::new("s")]).unwrap();
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
            c.fields = fields_of(&c.id, c.event_type.as_ref(), &c.mask);
            let sig = sign(&c, &Secret::new("s"), now, body);
            let v = GenericHmacVerifier::new(c, vec![Secret::new("s")]).unwrap();
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
        let v = GenericHmacVerifier::new(c, vec![Secret::new("s")]).unwrap();
        let hdrs = h(&[("x-webhook-signature", sig), ("x-webhook-timestamp", now.to_string())]);
        assert!(matches!(v.verify(b"{\"eventId\":\"x\"", &hdrs, now), Err(VerifyError::MalformedPayload(_))));
    }

    fn verifier(section: serde_json::Value, public_url: Option<&str>, secret: &str) -> GenericHmacVerifier {
        GenericHmacVerifier::new(config_at(section, public_url), vec![Secret::new(secret)]).unwrap()
    }

    fn raw_mac<M: Mac + KeyInit>(key: &[u8], msg: &[u8]) -> Vec<u8> {
        let mut m = <M as KeyInit>::new_from_slice(key).unwrap();
        m.update(msg);
        m.finalize().into_bytes().to_vec()
    }

    /// Twilio's published example (its security docs): the URL with its
    /// query, then the POST parameters sorted, HMAC-SHA1 with the auth token.
    #[test]
    fn twilios_documented_example_verifies_with_url_and_sorted_form() {
        let v = verifier(
            serde_json::json!({"signature_header": "x-twilio-signature", "encoding": "base64", "algorithm": "sha1",
                "signed_content": "{url}{form_sorted}", "id": "body_hash"}),
            Some("https://mycompany.com/myapp.php"),
            "12345",
        );
        let body = b"CallSid=CA1234567890ABCDE&Caller=%2B12349013030&Digits=1234&From=%2B12349013030&To=%2B18005551212";
        let hdrs = h(&[("x-twilio-signature", "0/KCTR6DLpKmkAf8muzZqo1nDgQ=".into())]);
        let post = http::Method::POST;
        let d = |query| Delivery { body, headers: &hdrs, method: &post, query };
        let got = v.verify_delivery(&d("foo=1&bar=2"), 0).unwrap();
        assert_eq!(got.event_id, payload_hash(body), "no id: the body's hash");
        assert_eq!(v.verify_delivery(&d("foo=1&bar=3"), 0), Err(VerifyError::SignatureMismatch));
        assert_eq!(v.verify_delivery(&d(""), 0), Err(VerifyError::SignatureMismatch));
    }

    /// A `t=…,v1=…` list, the timestamp taken from it: the same deliveries
    /// the Stripe verifier's own signer makes.
    #[test]
    fn a_key_value_list_takes_its_timestamp_from_the_list() {
        let v = verifier(
            serde_json::json!({"signature_header": "stripe-signature", "encoding": "hex",
                "list": {"signature": "v1", "timestamp": "t"}, "signed_content": "{timestamp}.{body}",
                "id": {"json_pointer": "/id"}}),
            None,
            "whsec_test",
        );
        let body = br#"{"id":"evt_1","type":"x"}"#;
        let now = 1_700_000_000;
        let sig = super::super::stripe::sign(&Secret::new("whsec_test"), now, body);
        let other = super::super::stripe::sign(&Secret::new("other"), now, body);
        let both = format!("{sig},{}", other.split(',').nth(1).unwrap());
        assert_eq!(v.verify(body, &h(&[("stripe-signature", both)]), now).unwrap().event_id, "evt_1");
        assert_eq!(
            v.verify(body, &h(&[("stripe-signature", sig.clone())]), now + 301),
            Err(VerifyError::StaleTimestamp)
        );
        let moved = sig.replace(&format!("t={now}"), &format!("t={}", now + 1));
        assert_eq!(v.verify(body, &h(&[("stripe-signature", moved)]), now), Err(VerifyError::SignatureMismatch));
        let twice = format!("t={now},{sig}");
        assert!(matches!(
            v.verify(body, &h(&[("stripe-signature", twice)]), now),
            Err(VerifyError::MalformedHeader(_))
        ));
        // `ts=…;h1=…` (Paddle's shape), signed `{timestamp}:{body}`.
        let p = verifier(
            serde_json::json!({"signature_header": "paddle-signature", "encoding": "hex",
                "list": {"separator": ";", "signature": "h1", "timestamp": "ts"}, "signed_content": "{timestamp}:{body}",
                "id": {"json_pointer": "/id"}}),
            None,
            "pdl_ntfset_k",
        );
        let mac = hex::encode(raw_mac::<HmacOf<Sha256>>(
            b"pdl_ntfset_k",
            format!("{now}:").as_bytes().iter().chain(body).copied().collect::<Vec<u8>>().as_slice(),
        ));
        assert!(p.verify(body, &h(&[("paddle-signature", format!("ts={now};h1={mac}"))]), now).is_ok());
    }

    #[test]
    fn algorithms_keys_and_timestamp_formats() {
        let body = br#"{"id":"e1","at":"2026-12-02T10:00:00+01:00"}"#;
        let now = 1_796_202_000; // 2026-12-02T09:00:00Z
        // SHA-512 with a hex key, the timestamp in milliseconds.
        let v = verifier(
            serde_json::json!({"signature_header": "x-sig", "encoding": "hex", "algorithm": "sha512", "key": "hex",
                "timestamp_header": "x-ts", "timestamp_format": "milliseconds", "signed_content": "{timestamp}.{body}",
                "id": {"json_pointer": "/id"}}),
            None,
            "00ff10",
        );
        let ms = (now * 1000 + 250).to_string();
        let msg: Vec<u8> = format!("{ms}.").into_bytes().into_iter().chain(body.iter().copied()).collect();
        let sig = hex::encode(raw_mac::<HmacOf<Sha512>>(&[0x00, 0xff, 0x10], &msg));
        assert_eq!(v.verify(body, &h(&[("x-sig", sig.clone()), ("x-ts", ms.clone())]), now).unwrap().event_id, "e1");
        assert_eq!(v.verify(body, &h(&[("x-sig", sig), ("x-ts", ms)]), now + 400), Err(VerifyError::StaleTimestamp));
        // A whsec_ key, the RFC 3339 timestamp in the body (with an offset).
        let w = verifier(
            serde_json::json!({"signature_header": "x-sig", "encoding": "base64", "key": "whsec",
                "timestamp_pointer": "/at", "timestamp_format": "rfc3339", "signed_content": "{timestamp}{body}",
                "id": {"json_pointer": "/id"}}),
            None,
            "whsec_AAECAw==",
        );
        let msg: Vec<u8> = b"2026-12-02T10:00:00+01:00".iter().chain(body).copied().collect();
        let sig = STANDARD.encode(raw_mac::<HmacOf<Sha256>>(&[0, 1, 2, 3], &msg));
        assert!(w.verify(body, &h(&[("x-sig", sig.clone())]), now).is_ok());
        assert_eq!(w.verify(body, &h(&[("x-sig", sig)]), now - 3600), Err(VerifyError::FutureTimestamp));
        assert_eq!(rfc3339_secs("2026-12-02T09:00:00Z"), Some(now));
        assert_eq!(rfc3339_secs("2026-12-02T04:00:00.5-05:00"), Some(now));
        assert_eq!(rfc3339_secs("2026-12-02T09:00:00+25:00"), None);
        // A key that does not decode is refused when the endpoint is built.
        let bad = GenericHmacVerifier::new(
            config(serde_json::json!({"signature_header": "x", "encoding": "hex", "key": "hex", "id": "body_hash"})),
            vec![Secret::new("zz")],
        );
        assert_eq!(bad.err().as_deref(), Some("secret 1: not hex"));
    }

    /// Several signature headers (any may match), a signature in the body
    /// over fields of the body (Mailgun's shape), a signed header.
    #[test]
    fn signatures_in_several_headers_or_in_the_body() {
        let body = b"{\"id\":\"m1\"}";
        let v = verifier(
            serde_json::json!({"signature_header": ["x-new-sig", "x-old-sig"], "encoding": "hex",
                "signed_content": "{header:x-request-id}.{method}.{body}", "id": {"header": "x-request-id"}}),
            None,
            "k",
        );
        let msg: Vec<u8> = b"r-1.POST.".iter().chain(body.iter()).copied().collect();
        let sig = hex::encode(raw_mac::<HmacOf<Sha256>>(b"k", &msg));
        assert_eq!(
            v.verify(body, &h(&[("x-old-sig", sig.clone()), ("x-request-id", "r-1".into())]), 0).unwrap().event_id,
            "r-1"
        );
        assert_eq!(
            v.verify(body, &h(&[("x-old-sig", sig), ("x-request-id", "r-2".into())]), 0),
            Err(VerifyError::SignatureMismatch)
        );

        let mailgun = verifier(
            serde_json::json!({"signature_pointer": "/signature/signature", "encoding": "hex",
                "timestamp_pointer": "/signature/timestamp", "signed_content": "{timestamp}{json:/signature/token}",
                "id": {"json_pointer": "/event-data/id"}}),
            None,
            "mg-key",
        );
        let now = 1_700_000_000i64;
        let sig = hex::encode(raw_mac::<HmacOf<Sha256>>(b"mg-key", format!("{now}tok-1").as_bytes()));
        let body = serde_json::json!({"signature": {"timestamp": now.to_string(), "token": "tok-1", "signature": sig},
            "event-data": {"id": "ev-9", "event": "delivered"}})
        .to_string();
        assert_eq!(mailgun.verify(body.as_bytes(), &HeaderMap::new(), now).unwrap().event_id, "ev-9");
        let forged = body.replace("tok-1", "tok-2");
        assert_eq!(mailgun.verify(forged.as_bytes(), &HeaderMap::new(), now), Err(VerifyError::SignatureMismatch));
    }

    #[test]
    fn shared_tokens_and_basic_auth_are_compared_whole() {
        let gitlab = verifier(
            serde_json::json!({"auth": "token", "signature_header": "x-gitlab-token", "id": {"header": "x-gitlab-event-uuid"}}),
            None,
            "glpat-secret",
        );
        let ok = h(&[("x-gitlab-token", "glpat-secret".into()), ("x-gitlab-event-uuid", "u-1".into())]);
        assert_eq!(gitlab.verify(b"{}", &ok, 0).unwrap().event_id, "u-1");
        for wrong in ["glpat-secre", "glpat-secretx", "", "GLPAT-SECRET"] {
            let bad = h(&[("x-gitlab-token", wrong.into()), ("x-gitlab-event-uuid", "u-1".into())]);
            assert_eq!(gitlab.verify(b"{}", &bad, 0), Err(VerifyError::SignatureMismatch), "{wrong:?}");
        }
        assert!(matches!(gitlab.verify(b"{}", &HeaderMap::new(), 0), Err(VerifyError::MissingHeader(_))));
        let postmark =
            verifier(serde_json::json!({"auth": "basic", "id": {"json_pointer": "/MessageID"}}), None, "hook:pa55");
        let auth = |pair: &str| h(&[("authorization", format!("Basic {}", STANDARD.encode(pair)))]);
        assert_eq!(postmark.verify(br#"{"MessageID":"pm-1"}"#, &auth("hook:pa55"), 0).unwrap().event_id, "pm-1");
        assert_eq!(
            postmark.verify(br#"{"MessageID":"pm-1"}"#, &auth("hook:pa56"), 0),
            Err(VerifyError::SignatureMismatch)
        );
        let bearer = h(&[("authorization", "Bearer hook:pa55".into())]);
        assert!(matches!(postmark.verify(b"{}", &bearer, 0), Err(VerifyError::MalformedHeader(_))));
    }

    /// A composite identity; the retry counter masked: a retry has the same
    /// content hash, a changed fact does not.
    #[test]
    fn composite_identities_and_masked_retry_counters() {
        let v = verifier(
            serde_json::json!({"signature_header": "x-sig", "encoding": "hex",
                "id": {"composite": [{"json_pointer": "/portalId"}, {"json_pointer": "/eventId"}]},
                "mask": ["/attemptNumber"]}),
            None,
            "k",
        );
        let signed = |body: &[u8]| h(&[("x-sig", hex::encode(raw_mac::<HmacOf<Sha256>>(b"k", body)))]);
        let first = br#"{"portalId":7,"eventId":"e5","attemptNumber":0,"x":1}"#;
        let retry = br#"{"portalId":7,"eventId":"e5","attemptNumber":3,"x":1}"#;
        let other = br#"{"portalId":7,"eventId":"e5","attemptNumber":3,"x":2}"#;
        let hashes = |body: &[u8]| {
            let got = v.verify(body, &signed(body), 0).unwrap();
            assert_eq!(got.event_id, "7:e5");
            super::super::hashes::delivery_hashes(body, &got.content)
        };
        let (a, b, c) = (hashes(first), hashes(retry), hashes(other));
        assert_ne!(a.0, b.0, "the bytes differ");
        assert_eq!(a.1, b.1, "the fact does not");
        assert!(a.1.starts_with("m:"));
        assert_ne!(a.1, c.1);
    }

    #[test]
    fn each_option_is_checked_when_the_endpoint_is_loaded() {
        let cases = [
            (serde_json::json!({"encoding": "hex", "id": "body_hash"}), "signature_header or at signature_pointer"),
            (serde_json::json!({"signature_header": "x", "id": "body_hash"}), "hmac.encoding"),
            (serde_json::json!({"signature_header": "x y", "encoding": "hex", "id": "body_hash"}), "not a header name"),
            (
                serde_json::json!({"signature_header": "x", "encoding": "hex", "timestamp_header": "t", "id": "body_hash"}),
                "unsigned timestamp",
            ),
            (
                serde_json::json!({"signature_header": "x", "encoding": "hex", "signed_content": "{url}{body}", "id": "body_hash"}),
                "public_url",
            ),
            (
                serde_json::json!({"signature_header": "x", "encoding": "hex", "signed_content": "{nonce}{body}", "id": "body_hash"}),
                "unknown placeholder {nonce}",
            ),
            (
                serde_json::json!({"signature_header": "x", "encoding": "hex", "list": {"separator": "|", "signature": "v1"}, "id": "body_hash"}),
                "separator",
            ),
            (
                serde_json::json!({"signature_header": "x", "encoding": "hex", "id": {"json_pointer": "id"}}),
                "not a JSON pointer",
            ),
            (
                serde_json::json!({"signature_header": "x", "encoding": "hex", "id": "body_hash", "type": "body_hash"}),
                "hmac.type",
            ),
            (
                serde_json::json!({"signature_header": "x", "encoding": "hex", "id": {"composite": [{"composite": []}]}}),
                "hmac.id",
            ),
            (
                serde_json::json!({"auth": "token", "signature_header": "x", "encoding": "hex", "id": "body_hash"}),
                "token and basic",
            ),
            (serde_json::json!({"auth": "basic", "signature_header": "x", "id": "body_hash"}), "Authorization"),
            (
                serde_json::json!({"signature_header": "x", "encoding": "hex", "id": "body_hash", "mask": ["n"]}),
                "hmac.mask",
            ),
        ];
        for (section, needle) in cases {
            let spec: HmacSpec = serde_json::from_value(section.clone()).unwrap();
            let err =
                GenericHmacConfig::from_spec(&spec, 300, None).err().unwrap_or_else(|| panic!("accepted {section}"));
            assert!(err.contains(needle), "{section}: {err}");
        }
        let spec: HmacSpec = serde_json::from_value(serde_json::json!({"signature_header": "x", "encoding": "hex",
            "signed_content": "{url}{body}", "id": "body_hash"}))
        .unwrap();
        for (url, ok) in [
            ("https://h.example/webhooks/e", true),
            ("http://h.example/w", false),
            ("http://localhost:9000/w", true),
            ("https://h.example/w?x=1", false),
        ] {
            assert_eq!(GenericHmacConfig::from_spec(&spec, 300, Some(url)).is_ok(), ok, "{url}");
        }
    }

    /// The tool's signer and the verifier agree for every shape it can sign.
    #[test]
    fn what_the_tool_signs_verifies() {
        let now = 1_700_000_000;
        let body = br#"{"id":"s1","type":"t"}"#;
        for section in [
            serde_json::json!({"signature_header": "x-sig", "encoding": "hex", "prefix": "sha256=", "id": {"json_pointer": "/id"}}),
            serde_json::json!({"signature_header": "x-sig", "encoding": "base64", "algorithm": "sha1", "timestamp_header": "x-ts", "timestamp_format": "milliseconds", "signed_content": "{timestamp}.{body}", "id": {"json_pointer": "/id"}}),
            serde_json::json!({"signature_header": "x-sig", "encoding": "hex", "list": {"signature": "v1", "timestamp": "t"}, "signed_content": "{timestamp}.{body}", "id": {"json_pointer": "/id"}}),
            serde_json::json!({"signature_header": "x-sig", "encoding": "hex", "algorithm": "sha512", "timestamp_header": "x-ts", "timestamp_format": "rfc3339", "signed_content": "{timestamp}{header:x-id}{body}", "id": {"header": "x-id"}}),
            serde_json::json!({"auth": "token", "signature_header": "x-token", "prefix": "Bearer ", "id": {"json_pointer": "/id"}}),
            serde_json::json!({"auth": "basic", "id": {"json_pointer": "/id"}}),
        ] {
            let c = config(section.clone());
            let extra = vec![("x-id".to_owned(), "s1".to_owned())];
            let mut pairs = sign_headers(&c, &Secret::new("sec:ret"), now, body, &extra).unwrap();
            pairs.extend(extra);
            let hdrs = h(&pairs
                .iter()
                .map(|(k, v)| (Box::leak(k.clone().into_boxed_str()) as &'static str, v.clone()))
                .collect::<Vec<_>>());
            let v = GenericHmacVerifier::new(c, vec![Secret::new("sec:ret")]).unwrap();
            assert_eq!(v.verify(body, &hdrs, now).map(|v| v.event_id), Ok("s1".to_owned()), "{section}");
        }
    }

    /// A header stuffed with entries buys at most MAX_SIGNATURE_CANDIDATES
    /// comparisons: a good signature behind them is not looked at.
    #[test]
    fn signature_candidates_are_bounded() {
        let v = GenericHmacVerifier::new(shopify_like(), vec![Secret::new("k")]).unwrap();
        let body = b"{}";
        let good = sign(&shopify_like(), &Secret::new("k"), 0, body);
        let filler = vec!["AAAA"; MAX_SIGNATURE_CANDIDATES].join(",");
        let late = h(&[("x-shopify-hmac-sha256", format!("{filler},{good}")), ("x-shopify-webhook-id", "w".into())]);
        assert_eq!(v.verify(body, &late, 0), Err(VerifyError::SignatureMismatch));
        let early = h(&[("x-shopify-hmac-sha256", format!("{good},{filler}")), ("x-shopify-webhook-id", "w".into())]);
        assert!(v.verify(body, &early, 0).is_ok());
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
            let sha1 = config(serde_json::json!({"signature_header": "x-hub-signature", "prefix": "sha1=",
                "encoding": "hex", "algorithm": "sha1", "id": {"header": "x-shopify-webhook-id"}}));
            let sha512_ms = config(serde_json::json!({"signature_header": "x-sig", "encoding": "base64",
                "algorithm": "sha512", "timestamp_header": "x-ts", "timestamp_format": "milliseconds",
                "signed_content": "{timestamp}.{method}.{body}", "id": {"json_pointer": "/eventId"}}));
            vec![cashfree_like(), shopify_like(), hex, v1, sha1, sha512_ms]
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
                which in 0usize..6,
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
                // The signature first, then its timestamp, then the id.
                let mut hdrs = sign_headers(&c, &Secret::new("k"), ts, &body, &[]).unwrap();
                hdrs.push(("x-shopify-webhook-id".to_owned(), id.clone()));
                let map = |pairs: &[(String, String)]| {
                    let mut m = HeaderMap::new();
                    for (k, v) in pairs {
                        m.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
                    }
                    m
                };
                let v = GenericHmacVerifier::new(c.clone(), vec![Secret::new("k")]).unwrap();
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
