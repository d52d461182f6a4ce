//! One home per provider: the [`Provider`] trait, which each provider's
//! module implements beside its verifier. Everything that depends on who sent a delivery — validating an
//! endpoint's configuration, building its verifier, decoding a stored
//! payload, the content hash of a duplicate, signing a delivery for tests
//! and `hookledger send`, the list a backfill reads from — asks the
//! endpoint's [`ProviderKind`], never compares a provider's name.
//!
//! The trait lives here, below the providers' modules; the registry that
//! names them all is `verify::registry`, above them. Adding a provider: its
//! module (verifier and `impl Provider`), its vectors, one line in the
//! registry and one row in `docs/providers.md` (a test checks that every
//! registered provider has its row).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::HeaderMap;
use serde::Deserialize;

use super::certificates::CertificateCache;
use super::{Verified, VerifyError};
use crate::event::DecodeError;
use crate::identity::payload_hash;
use crate::secret::Secret;

/// A future a verifier returns (most are ready at once; SNS's may fetch a
/// certificate).
pub type Verifying<'a> = Pin<Box<dyn Future<Output = Result<Verified, VerifyError>> + Send + 'a>>;

/// A delivery as a verifier sees it: the raw bytes, the headers, the method
/// and the query string as received (some providers sign the URL).
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub body: &'a [u8],
    pub headers: &'a HeaderMap,
    pub method: &'a http::Method,
    /// The raw query string, without `?` (empty when there is none).
    pub query: &'a str,
}

/// A configured endpoint's verifier: a delivery in, the authenticated facts
/// (one event or several) out, judged at `now_s`.
pub trait Verifier: Send + Sync {
    fn verify<'a>(&'a self, delivery: Delivery<'a>, now_s: i64) -> Verifying<'a>;

    /// Completes a subscription the provider asked for (SNS: the visit to
    /// the validated `SubscribeURL`). Providers that never ask refuse.
    fn confirm<'a>(&'a self, url: &'a url::Url) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        let _ = url;
        Box::pin(async { Err("this provider has no subscriptions to confirm".to_owned()) })
    }
}

/// The list of past events a backfill reads from, for the providers that keep one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillList {
    /// Stripe's `/v1/events`.
    StripeEvents,
    /// A GitHub hook's deliveries (which can also be redelivered).
    GithubDeliveries,
}

/// A provider's own success answer ([`Provider::success`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Success {
    pub status: u16,
    /// `(content type, body)` instead of the intake's JSON body.
    pub body: Option<(&'static str, &'static str)>,
}

/// The answer a provider needs to a delivery that is recorded, or was
/// before ([`Provider::success`]): every provider declares one, so the docs'
/// table and the wire are checked against the same value
/// (`docs/providers.md`, "Answers the providers need").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuccessAnswer {
    /// The intake's own: 202 for a new event, 200 for a duplicate, with a
    /// JSON body; for a provider whose documentation takes any 2xx.
    Accepted,
    /// Exactly this, for a new event and a duplicate alike.
    Exactly(Success),
}

impl SuccessAnswer {
    /// 200 with the intake's JSON body: for a provider that completes a
    /// delivery only on 200.
    pub const OK: Self = Self::Exactly(Success { status: 200, body: None });

    /// The answer in place of the intake's, if any.
    pub fn exactly(self) -> Option<Success> {
        match self {
            Self::Accepted => None,
            Self::Exactly(s) => Some(s),
        }
    }

    /// How `docs/providers.md` writes it (its answers table starts each
    /// cell with this).
    pub fn describe(self) -> String {
        match self {
            Self::Accepted => "202 (200 for a duplicate)".into(),
            Self::Exactly(Success { status, body: None }) => format!("{status} (JSON body)"),
            Self::Exactly(Success { status, body: Some((_, "")) }) => format!("{status}, empty body"),
            Self::Exactly(Success { status, body: Some((_, body)) }) => format!("{status} `{body}`"),
        }
    }
}

/// What a provider's identity claims about its facts ([`Provider::identity`];
/// `docs/providers.md`, "Identity contracts").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// A stable identity per fact: the same identity again is the same fact.
    Event,
    /// "Something changed, fetch it": no identity of its own, so identical
    /// bytes may announce a later change. A repeat coalesces only while the
    /// previous identical one has not started being processed; after that it
    /// is the next generation of the identity, processed again
    /// (`admission`, "notifications by generation").
    Notification,
    /// A batch whose elements are events or notifications, each by its own
    /// bytes ([`Provider::notification`]).
    PerElement,
}

/// Whether a captured authentic body can be replayed under another identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// The identity is inside what is signed (the body, a signed header, or
    /// the body's hash): another identity fails the signature or meets the
    /// same record.
    Signed,
    /// The identity is an unsigned header and the provider signs no
    /// timestamp, but byte-identical bodies are one fact: a body recorded
    /// under one identity and sent again under another is a replay (answered
    /// 200, flagged, never applied twice).
    BoundToBody,
    /// The identity is an unsigned header, and identical bodies may be
    /// distinct facts (or the body is not authenticated at all): left as it
    /// is; the docs say why.
    Unbound,
}

/// A provider's identity contract ([`Provider::identity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub contract: Contract,
    pub replay: Replay,
}

impl Identity {
    /// A stable identity inside what is signed (most providers).
    pub const SIGNED_EVENT: Self = Self { contract: Contract::Event, replay: Replay::Signed };
    /// A notification identified by its bytes (Dropbox).
    pub const NOTIFICATION: Self = Self { contract: Contract::Notification, replay: Replay::Signed };
    /// A stable id from an unsigned header, no signed time; identical bodies are one fact.
    pub const BOUND_TO_BODY: Self = Self { contract: Contract::Event, replay: Replay::BoundToBody };
    /// A stable id that cannot be bound to the signed bytes (an unsigned header
    /// whose bodies may repeat, or a body that is not authenticated).
    pub const UNBOUND: Self = Self { contract: Contract::Event, replay: Replay::Unbound };

    /// How `docs/providers.md` writes it (its identity table's second and third cells).
    pub fn describe(self) -> (&'static str, &'static str) {
        let contract = match self.contract {
            Contract::Event => "event",
            Contract::Notification => "notification",
            Contract::PerElement => "per element",
        };
        let replay = match self.replay {
            Replay::Signed => "impossible",
            Replay::BoundToBody => "bound to the body",
            Replay::Unbound => "not bound",
        };
        (contract, replay)
    }
}

/// What [`Provider::handshakes`] builds its requests from.
#[derive(Clone, Copy)]
pub struct HandshakeInput<'a> {
    pub spec: &'a EndpointSpec,
    pub secret: Option<&'a Secret>,
    pub verify_token: Option<&'a Secret>,
    /// A fresh plain value (letters and digits): the challenge, or the
    /// secret a provider hands over.
    pub nonce: &'a str,
    pub now_s: i64,
}

/// One handshake as the provider makes it, and the answer it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// What it is (`url_verification`, `get`, …).
    pub name: &'static str,
    pub method: http::Method,
    /// The raw query string (without `?`).
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The answer it needs: status, content type and body (`None`: any
    /// content type and body), and a header it must carry.
    pub expect: HandshakeAnswer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeAnswer {
    pub status: u16,
    pub content_type: Option<&'static str>,
    pub body: String,
    pub header: Option<(&'static str, String)>,
}

impl HandshakeAnswer {
    /// What is wrong with an answer (its status, content type, body and the
    /// expected header's value), if anything: a JSON body is compared as JSON.
    pub fn mismatch(
        &self,
        status: u16,
        content_type: Option<&str>,
        body: &str,
        header: Option<&str>,
    ) -> Option<String> {
        if status != self.status {
            return Some(format!("status {status}, not {}", self.status));
        }
        if let Some(want) = self.content_type {
            if content_type != Some(want) {
                return Some(format!("content type {content_type:?}, not {want}"));
            }
            let same = if want == "application/json" {
                serde_json::from_str::<serde_json::Value>(body).ok() == serde_json::from_str(&self.body).ok()
            } else {
                body == self.body
            };
            if !same {
                return Some(format!("body {body:?}, not {:?}", self.body));
            }
        }
        if let Some((name, value)) = &self.header {
            if header != Some(value.as_str()) {
                return Some(format!("header {name} {header:?}, not {value:?}"));
            }
        }
        None
    }
}

/// What [`Provider::verifier`] may use besides the endpoint's secrets.
pub struct BuildContext {
    pub certificates: Arc<CertificateCache>,
    /// The endpoint's `verify_token`, resolved (for a provider that takes one).
    pub verify_token: Option<Secret>,
    /// Where a provider that hands its secret over at a handshake
    /// ([`Provider::learns_secret`]: Asana) has it stored, and this endpoint's name.
    pub learned: Option<(Arc<dyn SecretStore>, String)>,
}

impl BuildContext {
    /// A context with only the certificate cache (no verify token, no store).
    pub fn new(certificates: Arc<CertificateCache>) -> Self {
        Self { certificates, verify_token: None, learned: None }
    }
}

/// A future a [`SecretStore`] returns; `Err` is a fault (retry later), its text for logs.
pub type Storing<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// What [`SecretStore::store_once`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The secret is stored now.
    New,
    /// The same secret was there already (this write's own retry, or the
    /// same offer again).
    Same,
    /// Another secret is there: it stays.
    Other,
}

/// Secrets a provider hands over at a handshake (Asana's `X-Hook-Secret`),
/// per endpoint: stored once, while an operator's window is open, and never
/// overwritten. `adapters::handshake` keeps them in SSM (SecureString); the
/// memory world in a map; one contract scenario runs on both.
pub trait SecretStore: Send + Sync {
    /// Until when (Unix seconds) the endpoint's window is open, if one was opened.
    fn window(&self, endpoint: &str) -> Storing<'_, Option<i64>>;
    /// Opens (or moves) the endpoint's window until `until_s` (the operator's `arm`).
    fn open_window(&self, endpoint: &str, until_s: i64) -> Storing<'_, ()>;
    /// Stores `secret` as the endpoint's unless one is there; a write whose
    /// acknowledgement was lost meets itself as [`Stored::Same`].
    fn store_once<'a>(&'a self, endpoint: &'a str, secret: &'a Secret) -> Storing<'a, Stored>;
    /// The endpoint's stored secret, if one was stored.
    fn load(&self, endpoint: &str) -> Storing<'_, Option<Secret>>;
}

/// Everything about one provider (or family of senders) that the rest of
/// the code needs.
pub trait Provider: Send + Sync + 'static {
    /// Its name in `HOOKLEDGER_ENDPOINTS`, in identity keys, records and metrics.
    fn name(&self) -> &'static str;

    /// Whether its endpoints are verified with shared secrets (SNS's are
    /// verified with AWS's certificates and take none).
    fn takes_secrets(&self) -> bool {
        true
    }

    /// Checks the parts of an endpoint's spec that only this provider
    /// reads (the secrets' presence and the common fields are checked for
    /// every provider before).
    fn validate(&self, spec: &EndpointSpec) -> Result<(), String> {
        no_sections(self.name(), spec)
    }

    /// The verifier of an endpoint, with its secrets resolved.
    fn verifier(
        &self,
        spec: &EndpointSpec,
        secrets: Vec<Secret>,
        cx: &BuildContext,
    ) -> Result<Box<dyn Verifier>, String>;

    /// `(event type, JSON body)` of a payload stored from one of its
    /// deliveries (or, for a batch, one event's bytes).
    fn decode(&self, stored_type: Option<&str>, payload: &[u8]) -> Result<(String, serde_json::Value), DecodeError> {
        crate::event::decode_json(stored_type, payload)
    }

    /// The hash that decides whether a retry says the same as the recorded
    /// delivery: the payload hash unless the provider re-renders fields on
    /// each attempt (those are masked).
    fn content_hash(&self, body: &[u8]) -> String {
        payload_hash(body)
    }

    /// Whether a record's stored content hash says the same as `ours`, the
    /// content hash of `body` (a provider whose hash changed form also
    /// recognises its old one).
    fn same_content(&self, stored: &str, ours: &str, body: &[u8]) -> bool {
        let _ = body;
        stored == ours
    }

    /// A fresh event id in the provider's own shape, from 32 random hex digits.
    fn event_id(&self, random_hex: &str) -> String {
        random_hex.to_owned()
    }

    /// A body such as the provider sends, carrying `event_id` and
    /// `event_type` where its verifier reads them (`hookledger send`).
    fn sample(&self, spec: &EndpointSpec, event_id: &str, event_type: &str, now_s: i64) -> Vec<u8> {
        let _ = (spec, event_id);
        serde_json::json!({"type": event_type, "timestamp": now_s, "data": {}}).to_string().into_bytes()
    }

    /// The headers the provider sends with `body`, signed with `secret`, as
    /// `(name, value)`; `Err` when the provider's deliveries cannot be
    /// signed with a shared secret.
    fn sign(
        &self,
        spec: &EndpointSpec,
        secret: &Secret,
        event_id: &str,
        event_type: &str,
        now_s: i64,
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String>;

    /// `body` as the provider sends it once signed with `secret`: most send
    /// it as it is; a provider whose signature is inside the body (Mailgun)
    /// writes it there. Called before [`Provider::sign`].
    fn seal(&self, spec: &EndpointSpec, secret: &Secret, now_s: i64, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let _ = (spec, secret, now_s);
        Ok(body)
    }

    /// The content type its deliveries carry.
    fn content_type(&self) -> &'static str {
        "application/json"
    }

    /// One line on how it signs and what identifies an event (`hookledger providers`).
    fn summary(&self) -> &'static str {
        ""
    }

    /// What an endpoint of this provider may set besides `provider`,
    /// `tenant` and `secrets` (`hookledger providers`).
    fn options(&self) -> String {
        "tolerance_secs".into()
    }

    /// The events of a stored payload that carries several (a batch:
    /// each one's identity, type and bytes); `None` for a provider whose
    /// deliveries are one event each. Runs on verified payloads only.
    fn split(&self, payload: &[u8]) -> Option<Result<Vec<super::BatchEvent>, VerifyError>> {
        let _ = payload;
        None
    }

    /// The methods its deliveries and handshakes use (POST; GET too for a
    /// provider that checks the endpoint with a GET, as Meta and Dropbox do).
    /// Any other method is answered 405.
    fn methods(&self) -> &'static [http::Method] {
        &[http::Method::POST]
    }

    /// Whether it hands its secret over at a handshake (Asana), to be
    /// stored while an operator's window is open: its endpoint's `secrets`
    /// are then optional.
    fn learns_secret(&self) -> bool {
        false
    }

    /// The handshakes it makes, as it makes them (`hookledger send
    /// --handshake` plays them against an endpoint; a test drives each
    /// through the intake): `secret` signs those it signs, `verify_token`
    /// is the endpoint's, `nonce` the challenge (or the secret Asana hands over).
    fn handshakes(&self, hs: HandshakeInput<'_>) -> Result<Vec<Handshake>, String> {
        let _ = hs;
        Ok(Vec::new())
    }

    /// Whether its endpoint names a `verify_token` (a secret reference: the
    /// value the operator gave the provider, which it echoes on its GET check).
    fn takes_verify_token(&self) -> bool {
        false
    }

    /// The answer it needs when a delivery (of this type) is recorded, or
    /// was before: the intake's 202 (200 for a duplicate) where its
    /// documentation takes any 2xx, else exactly what it needs (Mailgun:
    /// 200; Xero: 200 with no body; Discord: a deferred interaction
    /// response). No default: every provider says it.
    fn success(&self, event_type: Option<&str>) -> SuccessAnswer;

    /// What its identities claim: an event's or a notification's, and
    /// whether a body can be replayed under another one. No default: every
    /// provider says it (`docs/providers.md`, "Identity contracts").
    fn identity(&self) -> Identity;

    /// Whether one event's bytes (a delivery, or an element of a batch) are
    /// a notification ([`Contract::Notification`]): by the contract, or
    /// element by element where it is [`Contract::PerElement`].
    fn notification(&self, event: &[u8]) -> bool {
        let _ = event;
        self.identity().contract == Contract::Notification
    }

    /// Whether any of its events can repeat as a later generation of one
    /// identity (a notification): by the contract, or where some elements
    /// of a [`Contract::PerElement`] batch may be notifications.
    fn repeats(&self) -> bool {
        self.identity().contract == Contract::Notification
    }

    /// Whether `hookledger send` can sign its deliveries with the endpoint's
    /// secrets (not Discord's: it signs with a private key of its own).
    fn tool_signs(&self) -> bool {
        self.takes_secrets()
    }

    /// The list a backfill can read its past events from, if it keeps one.
    fn backfill(&self) -> Option<BackfillList> {
        None
    }
}

/// A provider, as an endpoint names it: compared, printed and parsed by name.
#[derive(Clone, Copy)]
pub struct ProviderKind(&'static dyn Provider);

impl ProviderKind {
    /// The kind of a registered provider (the registry's constants and lookup
    /// are in `verify::registry`).
    pub const fn of(provider: &'static dyn Provider) -> Self {
        Self(provider)
    }

    pub fn as_str(self) -> &'static str {
        self.0.name()
    }

    pub fn provider(self) -> &'static dyn Provider {
        self.0
    }
}

impl std::ops::Deref for ProviderKind {
    type Target = dyn Provider;
    fn deref(&self) -> &Self::Target {
        self.0
    }
}

impl PartialEq for ProviderKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}
impl Eq for ProviderKind {}

impl std::fmt::Debug for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Endpoint configuration as written in `HOOKLEDGER_ENDPOINTS`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    pub provider: ProviderKind,
    /// The account/tenant this endpoint belongs to (defaults to its name).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Secret references, all active at once (rotation overlap).
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub tolerance_secs: Option<i64>,
    /// SNS only: topics allowed to deliver (and to be subscribed to).
    #[serde(default)]
    pub topic_arns: Vec<String>,
    /// Generic HMAC only.
    #[serde(default)]
    pub hmac: Option<HmacSpec>,
    /// The URL the provider is configured to call (`https://…/webhooks/<name>`),
    /// for providers that sign it (`{url}`).
    #[serde(default)]
    pub public_url: Option<String>,
    /// A secret reference: the verify token the operator gave a provider
    /// that checks the endpoint with a GET (Meta).
    #[serde(default)]
    pub verify_token: Option<String>,
    /// What is kept of each verified payload ([`crate::redaction`]):
    /// `keep` (default), `redact` or `drop_after`.
    #[serde(default)]
    pub payload: crate::redaction::PayloadPolicy,
    /// Each payload sealed under a data key of its own event, so that
    /// `hookledger erase` can make every copy unreadable
    /// ([`crate::sealing`]; needs `HOOKLEDGER_KEYS_TABLE`).
    #[serde(default)]
    pub erasable: bool,
}

/// The `hmac` section of a generic endpoint (see docs/configuration.md for
/// each option); checked and compiled by `verify::generic`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HmacSpec {
    /// How the sender authenticates: an HMAC (default), a shared token in a
    /// header, or HTTP basic auth.
    #[serde(default)]
    pub auth: Auth,
    /// The header(s) carrying the signature (any may match), or the token.
    #[serde(default)]
    pub signature_header: Option<OneOrMany>,
    /// A JSON pointer to the signature in the body (instead of a header).
    #[serde(default)]
    pub signature_pointer: Option<String>,
    /// The header value is a `k=v` list (`t=…,v1=…`, `ts=…;h1=…`).
    #[serde(default)]
    pub list: Option<SignatureList>,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub encoding: Option<Encoding>,
    #[serde(default)]
    pub algorithm: Algorithm,
    /// How the secret's text becomes the HMAC key.
    #[serde(default)]
    pub key: KeyEncoding,
    #[serde(default)]
    pub timestamp_header: Option<String>,
    /// A JSON pointer to the timestamp in the body.
    #[serde(default)]
    pub timestamp_pointer: Option<String>,
    #[serde(default)]
    pub timestamp_format: TimestampFormat,
    #[serde(default = "default_signed_content")]
    pub signed_content: String,
    pub id: Source,
    #[serde(default, rename = "type")]
    pub event_type: Option<Source>,
    /// JSON pointers of values that change between a provider's retries
    /// (attempt counters): masked in the content hash.
    #[serde(default)]
    pub mask: Vec<String>,
}

fn default_signed_content() -> String {
    "{body}".to_owned()
}

/// One header name, or several.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn names(&self) -> Vec<&str> {
        match self {
            Self::One(n) => vec![n.as_str()],
            Self::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// How a generic sender authenticates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Auth {
    #[default]
    Hmac,
    /// The secret itself in `signature_header` (after `prefix`), compared in constant time.
    Token,
    /// `Authorization: Basic …`, the secret being `user:password`.
    Basic,
}

/// A signature header of `k=v` items.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureList {
    /// Between items: `,` (default) or `;`.
    #[serde(default = "default_separator")]
    pub separator: String,
    /// The key of the signature items (`v1`, `h1`); several may match.
    pub signature: String,
    /// The key of the timestamp item (`t`, `ts`), which is then signed.
    #[serde(default)]
    pub timestamp: Option<String>,
}

fn default_separator() -> String {
    ",".to_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Hex,
    Base64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    Sha1,
    #[default]
    Sha256,
    Sha512,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyEncoding {
    /// The secret's bytes (default).
    #[default]
    Text,
    Hex,
    Base64,
    /// `whsec_<base64>` (the prefix optional).
    Whsec,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimestampFormat {
    #[default]
    Seconds,
    Milliseconds,
    /// `2026-12-02T10:00:00Z` (a fraction and an offset allowed).
    Rfc3339,
}

/// Where a value comes from: a request header, a JSON pointer into the
/// body, several of those joined by `:` (an identity built from several
/// fields), or the body's hash (for senders that give no id).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Header(String),
    JsonPointer(String),
    Composite(Vec<Source>),
    BodyHash,
}

/// The provider-specific sections a provider without any refuses.
pub fn no_sections(name: &str, spec: &EndpointSpec) -> Result<(), String> {
    if !spec.topic_arns.is_empty() {
        return Err(format!("topic_arns only applies to sns endpoints, not {name}"));
    }
    if spec.hmac.is_some() {
        return Err(format!("the hmac section only applies to hmac endpoints, not {name}"));
    }
    if spec.public_url.is_some() {
        return Err(format!("public_url is for providers that sign their URL, not {name}"));
    }
    Ok(())
}

/// A verifier that is ready at once, as a [`Verifier`].
pub(crate) fn ready<'a>(result: Result<Verified, VerifyError>) -> Verifying<'a> {
    Box::pin(std::future::ready(result))
}
