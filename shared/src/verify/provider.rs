//! One home per provider: the [`Provider`] trait, which each provider's
//! module implements beside its verifier, and the [`REGISTRY`] that names
//! them all. Everything that depends on who sent a delivery — validating an
//! endpoint's configuration, building its verifier, decoding a stored
//! payload, the content hash of a duplicate, signing a delivery for tests
//! and `hookledger send`, the list a backfill reads from — asks the
//! endpoint's [`ProviderKind`], never compares a provider's name.
//!
//! Adding a provider: its module (verifier and `impl Provider`), its
//! vectors, one line in [`REGISTRY`] and one row in `docs/providers.md`
//! (a test checks that every registered provider has its row).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::HeaderMap;
use serde::Deserialize;

use super::generic::{Encoding, Source};
use super::sns::CertificateCache;
use super::{Verified, VerifyError};
use crate::event::DecodeError;
use crate::identity::payload_hash;
use crate::secret::Secret;

/// Every provider an endpoint can name, in the order `docs/providers.md` lists them.
pub const REGISTRY: &[&dyn Provider] = &[
    &super::stripe::Stripe,
    &super::github::Github,
    &super::standard::StandardWebhooks,
    &super::sns::Sns,
    &super::quiltt::Quiltt,
    &super::generic::Hmac,
];

/// A future a verifier returns (most are ready at once; SNS's may fetch a
/// certificate).
pub type Verifying<'a> = Pin<Box<dyn Future<Output = Result<Verified, VerifyError>> + Send + 'a>>;

/// A configured endpoint's verifier: raw bytes and headers in, the
/// authenticated facts (one event or several) out.
pub trait Verifier: Send + Sync {
    fn verify<'a>(&'a self, body: &'a [u8], headers: &'a HeaderMap, now_s: i64) -> Verifying<'a>;

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

/// What [`Provider::verifier`] may use besides the endpoint's secrets.
pub struct BuildContext {
    pub certificates: Arc<CertificateCache>,
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

    /// The events of a stored payload that carries several (a batch:
    /// each one's identity, type and bytes); `None` for a provider whose
    /// deliveries are one event each. Runs on verified payloads only.
    fn split(&self, payload: &[u8]) -> Option<Result<Vec<super::BatchEvent>, VerifyError>> {
        let _ = payload;
        None
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
    pub const STRIPE: Self = Self(&super::stripe::Stripe);
    pub const GITHUB: Self = Self(&super::github::Github);
    pub const STANDARD_WEBHOOKS: Self = Self(&super::standard::StandardWebhooks);
    pub const SNS: Self = Self(&super::sns::Sns);
    pub const QUILTT: Self = Self(&super::quiltt::Quiltt);
    pub const HMAC: Self = Self(&super::generic::Hmac);

    /// The registered provider of this name.
    pub fn named(name: &str) -> Option<Self> {
        REGISTRY.iter().find(|p| p.name() == name).map(|p| Self(*p))
    }

    pub fn as_str(self) -> &'static str {
        self.0.name()
    }

    pub fn provider(self) -> &'static dyn Provider {
        self.0
    }

    /// The names of every registered provider, for error messages.
    pub fn names() -> String {
        REGISTRY.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
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

impl<'de> Deserialize<'de> for ProviderKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::named(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown provider {name:?} (known: {})", Self::names())))
    }
}

/// `(event type, JSON body)` of a payload a record of `provider` stored; a
/// name no provider is registered under (a record older than its
/// provider's removal) is decoded as plain JSON.
pub fn decode(
    provider: &str,
    stored_type: Option<&str>,
    payload: &[u8],
) -> Result<(String, serde_json::Value), DecodeError> {
    match ProviderKind::named(provider) {
        Some(p) => p.decode(stored_type, payload),
        None => crate::event::decode_json(stored_type, payload),
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HmacSpec {
    pub signature_header: String,
    #[serde(default)]
    pub prefix: String,
    pub encoding: Encoding,
    #[serde(default)]
    pub timestamp_header: Option<String>,
    #[serde(default = "default_signed_content")]
    pub signed_content: String,
    pub id: Source,
    #[serde(default, rename = "type")]
    pub event_type: Option<Source>,
}

fn default_signed_content() -> String {
    "{body}".to_owned()
}

/// The provider-specific sections a provider without any refuses.
pub fn no_sections(name: &str, spec: &EndpointSpec) -> Result<(), String> {
    if !spec.topic_arns.is_empty() {
        return Err(format!("topic_arns only applies to sns endpoints, not {name}"));
    }
    if spec.hmac.is_some() {
        return Err(format!("the hmac section only applies to hmac endpoints, not {name}"));
    }
    Ok(())
}

/// A verifier that is ready at once, as a [`Verifier`].
pub(crate) fn ready<'a>(result: Result<Verified, VerifyError>) -> Verifying<'a> {
    Box::pin(std::future::ready(result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_is_registered_once_and_found_by_its_name() {
        let mut names: Vec<&str> = REGISTRY.iter().map(|p| p.name()).collect();
        for name in &names {
            assert_eq!(ProviderKind::named(name).map(ProviderKind::as_str), Some(*name));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len(), "two providers share a name");
        for k in [
            ProviderKind::STRIPE,
            ProviderKind::GITHUB,
            ProviderKind::STANDARD_WEBHOOKS,
            ProviderKind::SNS,
            ProviderKind::QUILTT,
            ProviderKind::HMAC,
        ] {
            assert!(names.contains(&k.as_str()), "{k} is a constant but not registered");
        }
        assert_eq!(ProviderKind::named("stripe "), None);
    }

    /// Adding a provider means a row in docs/providers.md: each registered
    /// name appears there as `` `name` `` in the table's first column.
    #[test]
    fn every_registered_provider_has_its_row_in_the_docs() {
        let docs = include_str!("../../../docs/providers.md");
        let missing: Vec<&str> = REGISTRY
            .iter()
            .map(|p| p.name())
            .filter(|n| !docs.lines().any(|l| l.starts_with("| ") && l.contains(&format!("`{n}`"))))
            .collect();
        assert!(missing.is_empty(), "docs/providers.md has no row for {missing:?}");
    }

    #[test]
    fn an_unknown_provider_is_refused_with_the_known_ones() {
        let err = serde_json::from_str::<ProviderKind>("\"paypal\"").unwrap_err().to_string();
        assert!(err.contains("unknown provider \"paypal\"") && err.contains("stripe, github"), "{err}");
        assert_eq!(serde_json::from_str::<ProviderKind>("\"quiltt\"").unwrap(), ProviderKind::QUILTT);
    }

    #[test]
    fn stored_payloads_of_unregistered_providers_decode_as_json() {
        let (t, b) = decode("gone", None, br#"{"type":"x.y","n":1}"#).unwrap();
        assert_eq!((t.as_str(), b["n"].as_i64()), ("x.y", Some(1)));
        assert_eq!(super::super::hashes::content_hash("gone", b"abc"), payload_hash(b"abc"));
    }

    #[test]
    fn provider_shapes_decode() {
        let (t, b) = decode("stripe", Some("invoice.paid"), br#"{"id":"evt_1","type":"invoice.paid"}"#).unwrap();
        assert_eq!((t.as_str(), b["id"].as_str()), ("invoice.paid", Some("evt_1")));
        let sns =
            serde_json::json!({"Type": "Notification", "Message": "{\"notificationType\":\"Bounce\"}"}).to_string();
        let (t, b) = decode("sns", Some("ses.Bounce"), sns.as_bytes()).unwrap();
        assert_eq!((t.as_str(), b["notificationType"].as_str()), ("ses.Bounce", Some("Bounce")));
        let (t, b) = decode("github", Some("push"), b"payload=%7B%22ref%22%3A%22refs%2Fheads%2Fmain%22%7D").unwrap();
        assert_eq!((t.as_str(), b["ref"].as_str()), ("push", Some("refs/heads/main")));
        let (t, _) = decode("standard_webhooks", None, br#"{"type":"seats.snapshot"}"#).unwrap();
        assert_eq!(t, "seats.snapshot");
    }

    #[test]
    fn undecodable_payloads_are_permanent_errors() {
        assert!(decode("stripe", None, b"\xff\xfe").is_err());
        assert!(decode("standard_webhooks", None, br#"{"no":"type"}"#).is_err());
        assert!(decode("sns", None, br#"{"Type":"Notification"}"#).is_err());
    }

    mod proptests {
        use proptest::prelude::*;

        use super::*;
        use crate::event::DecodeError;

        fn payload() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..200),
                r#"\{("(type|Message|id)":("[ -~]{0,10}"|[0-9]{1,3}|null|\{\}),?){0,3}\}"#.prop_map(String::into_bytes),
                "payload=[ -~]{0,40}".prop_map(String::into_bytes),
                any::<String>()
                    .prop_map(|m| serde_json::json!({"Type": "Notification", "Message": m}).to_string().into_bytes()),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any stored payload, for any provider: a type and a body, or
            /// the typed (permanent) decode error; never a panic.
            #[test]
            fn decoding_never_panics_and_errors_are_typed(
                provider in prop::sample::select(REGISTRY.iter().map(|p| p.name()).chain(["other"]).collect::<Vec<_>>()),
                stored_type in prop::option::of("[a-z.]{0,10}"),
                payload in payload(),
            ) {
                match decode(provider, stored_type.as_deref(), &payload) {
                    Ok((ty, _)) => if let Some(t) = &stored_type { prop_assert_eq!(&ty, t) },
                    Err(DecodeError(why)) => prop_assert!(!why.is_empty()),
                }
            }
        }
    }
}

#[cfg(test)]
mod registry_only {
    use super::REGISTRY;

    fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// No production code outside a provider's own module names a provider
    /// in a string (`"stripe"`): everything provider-specific goes through
    /// the registry. Test modules and files of tests are not looked at.
    #[test]
    fn no_code_outside_the_registry_matches_on_a_provider_name() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["shared/src", "cli/src", "functions"] {
            sources(&root.join(dir), &mut files);
        }
        let mut found = Vec::new();
        for file in files {
            let rel = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
            let suite = rel.ends_with("/contract.rs");
            if suite || rel.ends_with("/tests.rs") || rel.contains("/tests/") || rel.ends_with("_tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let production = text.split("#[cfg(test)]").next().unwrap_or_default();
            for p in REGISTRY {
                let quoted = format!("\"{}\"", p.name());
                let own = production.contains(&format!("fn name(&self) -> &'static str {{\n        {quoted}"));
                let matches = [
                    format!("== {quoted}"),
                    format!("!= {quoted}"),
                    format!("{quoted} =>"),
                    format!("| {quoted}"),
                    format!("({quoted},"),
                    format!("provider: {quoted}"),
                    format!("new({quoted}"),
                    format!("content_hash({quoted}"),
                ];
                for (n, line) in production.lines().enumerate() {
                    let matched = matches.iter().any(|m| line.contains(m.as_str()));
                    if !own && matched && !line.trim_start().starts_with("//") {
                        found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(found.is_empty(), "provider names outside their modules:\n{}", found.join("\n"));
    }
}
