//! Amazon SNS over HTTPS (and SES notifications carried inside it).
//!
//! Order of checks. Everything before step 6 is local and cheap, so a
//! stranger's request that fails it costs no network at all:
//! 1. the body parses as an SNS envelope of a known `Type`;
//! 2. its `TopicArn` is on the endpoint's allow-list;
//! 3. the envelope has the fields its type needs (`MessageId`, `Token`,
//!    `SubscribeURL`, a supported `SignatureVersion`);
//! 4. `SigningCertURL` is exactly `https://sns.<region>.amazonaws.com[.cn]/SimpleNotificationService-<id>.pem`
//!    (no port, user-info, query or fragment), `<region>` is a real AWS
//!    region from the closed list below, and it is the `TopicArn`'s region;
//! 5. `Timestamp` is at most [`MAX_MESSAGE_AGE_SECS`] old and at most
//!    [`MAX_CLOCK_SKEW_SECS`] ahead; `Signature` is base64 of an RSA-sized
//!    signature;
//! 6. the certificate (see [`CertificateCache`]: bounded, single-flight,
//!    timed-out fetches; negative caching) is for SNS and valid now; its RSA
//!    key verifies `Signature` over the canonical string to sign
//!    (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA).
//!
//! Only then is `Message` looked at (for the SES event type).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::HeaderMap;
use rsa::PublicKey;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::pkcs8::DecodePublicKey;
use rsa::signature::Verifier;
use rsa::traits::PublicKeyParts;
use serde::Deserialize;
use url::Url;

use super::headers::header_values;
use super::provider::{self, BuildContext, EndpointSpec, Provider, Verifying};
use super::{Action, Content, Verified, VerifyError, checked_event_id};
use crate::event::DecodeError;
use crate::secret::Secret;

pub const MESSAGE_TYPE_HEADER: &str = "x-amz-sns-message-type";
/// Certificates larger than this are not SNS signing certificates.
pub const MAX_CERTIFICATE_BYTES: usize = 16 * 1024;
/// Oldest `Timestamp` accepted. SNS stops retrying an HTTP/S delivery after at
/// most 3,600 s (a hard limit of its delivery policies); this allows twice that.
pub const MAX_MESSAGE_AGE_SECS: i64 = 2 * 3600;
/// How far a `Timestamp` may be ahead of our clock.
pub const MAX_CLOCK_SKEW_SECS: i64 = 300;
/// Signature lengths in bytes of the RSA key sizes accepted for signing
/// certificates (2048, 3072, 4096 bits; SNS uses 2048).
const SIGNATURE_LENGTHS: [usize; 3] = [256, 384, 512];
/// Longest certificate id accepted in `SimpleNotificationService-<id>.pem`
/// (AWS's are 32 hex digits).
const MAX_CERTIFICATE_ID_LEN: usize = 64;

/// A certificate fetch that takes longer than this is abandoned (503).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(2);
/// At most this many outbound certificate fetches per container in any
/// [`FETCH_WINDOW_SECS`]; beyond it, unseen URLs are answered 503 without a fetch.
pub const FETCH_BUDGET: u32 = 8;
pub const FETCH_WINDOW_SECS: i64 = 60;
/// A URL whose host answered without an SNS certificate (e.g. 404) is refused
/// (401) for this long without being fetched again.
pub const REFUSED_TTL_SECS: i64 = 300;
/// A URL whose fetch failed transiently (unreachable, timeout, 5xx) is
/// answered 503 for this long without being fetched again.
pub const UNAVAILABLE_TTL_SECS: i64 = 15;
/// Certificates that verified a signature (only AWS can add to these).
const VERIFIED_CAPACITY: usize = 64;
/// Certificates fetched but not (yet) used for a valid signature.
const UNVERIFIED_CAPACITY: usize = 16;
/// Remembered fetch failures.
const FAILED_CAPACITY: usize = 256;

/// Fetches an already validated HTTPS URL. Behind a trait so tests serve
/// certificates without network and count fetches.
pub trait HttpsGet: Send + Sync {
    fn get<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>>;
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The host answered, with this non-success HTTP status.
    #[error("answered HTTP {0}")]
    Status(u16),
    /// No usable answer: connection, TLS, timeout, oversized or broken body.
    #[error("fetch failed: {0}")]
    Failed(String),
}

/// The AWS partitions SNS signs messages in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Partition {
    Aws,
    AwsUsGov,
    AwsCn,
}

impl Partition {
    /// The partition field of an ARN.
    fn arn_name(self) -> &'static str {
        match self {
            Self::Aws => "aws",
            Self::AwsUsGov => "aws-us-gov",
            Self::AwsCn => "aws-cn",
        }
    }

    /// The domain SNS endpoints of the partition live under.
    fn dns_suffix(self) -> &'static str {
        match self {
            Self::Aws | Self::AwsUsGov => ".amazonaws.com",
            Self::AwsCn => ".amazonaws.com.cn",
        }
    }
}

/// Every region SNS can sign from, closed: a certificate URL or topic naming
/// any other region is refused before anything is fetched. Taken from the
/// AWS SDK's partition data; add a region here when AWS opens one.
const REGIONS: &[(&str, Partition)] = &[
    ("af-south-1", Partition::Aws),
    ("ap-east-1", Partition::Aws),
    ("ap-east-2", Partition::Aws),
    ("ap-northeast-1", Partition::Aws),
    ("ap-northeast-2", Partition::Aws),
    ("ap-northeast-3", Partition::Aws),
    ("ap-south-1", Partition::Aws),
    ("ap-south-2", Partition::Aws),
    ("ap-southeast-1", Partition::Aws),
    ("ap-southeast-2", Partition::Aws),
    ("ap-southeast-3", Partition::Aws),
    ("ap-southeast-4", Partition::Aws),
    ("ap-southeast-5", Partition::Aws),
    ("ap-southeast-6", Partition::Aws),
    ("ap-southeast-7", Partition::Aws),
    ("ca-central-1", Partition::Aws),
    ("ca-west-1", Partition::Aws),
    ("eu-central-1", Partition::Aws),
    ("eu-central-2", Partition::Aws),
    ("eu-north-1", Partition::Aws),
    ("eu-south-1", Partition::Aws),
    ("eu-south-2", Partition::Aws),
    ("eu-west-1", Partition::Aws),
    ("eu-west-2", Partition::Aws),
    ("eu-west-3", Partition::Aws),
    ("il-central-1", Partition::Aws),
    ("me-central-1", Partition::Aws),
    ("me-south-1", Partition::Aws),
    ("mx-central-1", Partition::Aws),
    ("sa-east-1", Partition::Aws),
    ("us-east-1", Partition::Aws),
    ("us-east-2", Partition::Aws),
    ("us-west-1", Partition::Aws),
    ("us-west-2", Partition::Aws),
    ("us-gov-east-1", Partition::AwsUsGov),
    ("us-gov-west-1", Partition::AwsUsGov),
    ("cn-north-1", Partition::AwsCn),
    ("cn-northwest-1", Partition::AwsCn),
];

fn partition_of(region: &str) -> Option<Partition> {
    REGIONS.iter().find(|(r, _)| *r == region).map(|(_, p)| *p)
}

/// The region of `<prefix><region><partition's DNS suffix>`, if `<region>`
/// is a known region of the partition that suffix belongs to.
fn region_in_host<'a>(host: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = host.strip_prefix(prefix)?;
    let (region, suffix) = match rest.strip_suffix(".amazonaws.com.cn") {
        Some(region) => (region, ".amazonaws.com.cn"),
        None => (rest.strip_suffix(".amazonaws.com")?, ".amazonaws.com"),
    };
    partition_of(region).filter(|p| p.dns_suffix() == suffix).map(|_| region)
}

/// The region of `arn:<partition>:sns:<region>:<account>:<name>`, if the
/// region is known and belongs to that partition.
pub fn topic_region(topic_arn: &str) -> Option<&str> {
    let mut parts = topic_arn.splitn(6, ':');
    let (arn, partition, service, region, account, name) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let known = partition_of(region).is_some_and(|p| p.arn_name() == partition);
    (arn == "arn" && service == "sns" && known && !account.is_empty() && !name.is_empty()).then_some(region)
}

/// An SNS message as delivered over HTTP, or as an SNS record in a Lambda event
/// (which spells `SigningCertUrl`/`SubscribeUrl` and may carry `"Subject": null`).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct SnsMessage {
    #[serde(rename = "Type")]
    pub kind: String,
    pub message_id: String,
    pub topic_arn: String,
    pub message: String,
    pub timestamp: String,
    pub signature_version: String,
    pub signature: String,
    #[serde(rename = "SigningCertURL", alias = "SigningCertUrl")]
    pub signing_cert_url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, rename = "SubscribeURL", alias = "SubscribeUrl", skip_serializing_if = "Option::is_none")]
    pub subscribe_url: Option<String>,
}

impl SnsMessage {
    /// The canonical string to sign: `"Key\nValue\n"` for each key present,
    /// in the order AWS documents for the message type. `None` for unknown types.
    pub fn string_to_sign(&self) -> Option<String> {
        let mut out = String::with_capacity(self.message.len() + 512);
        let mut push = |k: &str, v: Option<&str>| {
            if let Some(v) = v {
                out.push_str(k);
                out.push('\n');
                out.push_str(v);
                out.push('\n');
            }
        };
        match self.kind.as_str() {
            "Notification" => {
                push("Message", Some(&self.message));
                push("MessageId", Some(&self.message_id));
                push("Subject", self.subject.as_deref());
                push("Timestamp", Some(&self.timestamp));
                push("TopicArn", Some(&self.topic_arn));
                push("Type", Some(&self.kind));
            }
            "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
                push("Message", Some(&self.message));
                push("MessageId", Some(&self.message_id));
                push("SubscribeURL", self.subscribe_url.as_deref());
                push("Timestamp", Some(&self.timestamp));
                push("Token", self.token.as_deref());
                push("TopicArn", Some(&self.topic_arn));
                push("Type", Some(&self.kind));
            }
            _ => return None,
        }
        Some(out)
    }
}

/// Parses `raw` and insists it is already in canonical form, so that what we
/// checked is what gets fetched (no user-info, explicit port, escapes, dots).
fn canonical_https(raw: &str, what: &'static str) -> Result<Url, VerifyError> {
    let url = Url::parse(raw).map_err(|_| VerifyError::CertificateUrl(what))?;
    if url.scheme() != "https" {
        return Err(VerifyError::CertificateUrl("scheme must be https"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(VerifyError::CertificateUrl("user-info is not allowed"));
    }
    if url.fragment().is_some() {
        return Err(VerifyError::CertificateUrl("fragment is not allowed"));
    }
    let host = url.host_str().ok_or(VerifyError::CertificateUrl(what))?;
    if region_in_host(host, "sns.").is_none() {
        return Err(VerifyError::CertificateUrl("host is not an SNS endpoint"));
    }
    let authority_end = raw.get(8..).and_then(|r| r.find('/')).map(|i| i + 8);
    if raw.get(8..authority_end.unwrap_or(raw.len())) != Some(host) {
        return Err(VerifyError::CertificateUrl("port or non-canonical authority is not allowed"));
    }
    Ok(url)
}

/// Validates `SigningCertURL` without touching the network.
pub fn validate_certificate_url(raw: &str) -> Result<Url, VerifyError> {
    let url = canonical_https(raw, "certificate URL is not a URL")?;
    if url.query().is_some() {
        return Err(VerifyError::CertificateUrl("query is not allowed"));
    }
    let name = url.path().strip_prefix("/SimpleNotificationService-").and_then(|p| p.strip_suffix(".pem"));
    if !name.is_some_and(|n| {
        !n.is_empty() && n.len() <= MAX_CERTIFICATE_ID_LEN && n.bytes().all(|b| b.is_ascii_alphanumeric())
    }) {
        return Err(VerifyError::CertificateUrl("path is not /SimpleNotificationService-<id>.pem"));
    }
    if url.as_str() != raw {
        return Err(VerifyError::CertificateUrl("URL is not in canonical form"));
    }
    Ok(url)
}

/// Validates `SigningCertURL` for a message of `topic_arn`: a valid URL (see
/// [`validate_certificate_url`]) on the SNS host of the topic's own region.
pub fn certificate_url_for_topic(raw: &str, topic_arn: &str) -> Result<Url, VerifyError> {
    let url = validate_certificate_url(raw)?;
    let topic_region =
        topic_region(topic_arn).ok_or(VerifyError::CertificateUrl("TopicArn does not name a known region"))?;
    if url.host_str().and_then(|h| region_in_host(h, "sns.")) != Some(topic_region) {
        return Err(VerifyError::CertificateUrl("certificate URL is not in the TopicArn's region"));
    }
    Ok(url)
}

/// Validates a `SubscribeURL` before it is visited.
pub fn validate_subscribe_url(raw: &str) -> Result<Url, VerifyError> {
    let url = canonical_https(raw, "subscribe URL is not a URL")?;
    let confirm = url.query_pairs().any(|(k, v)| k == "Action" && v == "ConfirmSubscription");
    if url.path() != "/" || !confirm {
        return Err(VerifyError::CertificateUrl("subscribe URL is not a ConfirmSubscription call"));
    }
    Ok(url)
}

#[derive(Clone)]
struct CachedKey {
    key: Arc<PublicKey>,
    not_before: i64,
    not_after: i64,
}

/// Why a URL is answered without fetching it again (until its TTL lapses).
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// The host answered, but not with a usable SNS certificate: 401.
    Invalid(&'static str),
    /// No usable answer; AWS retries a 503.
    Unavailable,
}

impl Failure {
    fn error(self) -> VerifyError {
        match self {
            Self::Invalid(why) => VerifyError::CertificateInvalid(why),
            Self::Unavailable => VerifyError::CertificateUnavailable,
        }
    }

    fn ttl(self) -> i64 {
        match self {
            Self::Invalid(_) => REFUSED_TTL_SECS,
            Self::Unavailable => UNAVAILABLE_TTL_SECS,
        }
    }
}

/// What the cache knows about one URL.
enum Known {
    /// The certificate, and whether it has verified a signature before.
    Key(CachedKey, bool),
    Failed(Failure),
}

#[derive(Default)]
struct CacheState {
    /// Certificates that verified at least one signature. Only a message
    /// signed by AWS can add one, so strangers cannot evict these.
    verified: HashMap<String, CachedKey>,
    /// Certificates fetched from a valid URL that have not verified a
    /// signature yet, with when they were fetched. Bounded separately.
    unverified: HashMap<String, (CachedKey, i64)>,
    /// Recent failures per URL, until when they stand.
    failed: HashMap<String, (Failure, i64)>,
    /// The current fetch-budget window, the fetches made in it and the
    /// fetches refused for want of budget.
    window_start: i64,
    window_fetches: u32,
    window_refused: u32,
}

/// Whether a fetch may be made now.
enum Budget {
    Granted,
    /// Spent for this window; `first` on the first refusal in the window.
    Spent {
        first: bool,
    },
}

impl CacheState {
    fn known(&self, url: &str, now: i64) -> Option<Known> {
        if let Some(entry) = self.verified.get(url) {
            return Some(Known::Key(entry.clone(), true));
        }
        if let Some((entry, _)) = self.unverified.get(url) {
            return Some(Known::Key(entry.clone(), false));
        }
        match self.failed.get(url) {
            Some((failure, until)) if now < *until => Some(Known::Failed(*failure)),
            _ => None,
        }
    }

    /// Takes one fetch from the budget of the current window.
    fn take_fetch(&mut self, now: i64) -> Budget {
        if now < self.window_start || now >= self.window_start.saturating_add(FETCH_WINDOW_SECS) {
            self.window_start = now;
            self.window_fetches = 0;
            self.window_refused = 0;
        }
        if self.window_fetches >= FETCH_BUDGET {
            self.window_refused = self.window_refused.saturating_add(1);
            return Budget::Spent { first: self.window_refused == 1 };
        }
        self.window_fetches += 1;
        Budget::Granted
    }

    fn fetched(&mut self, url: &str, entry: CachedKey, now: i64) {
        self.failed.remove(url);
        if self.unverified.len() >= UNVERIFIED_CAPACITY {
            let oldest = self.unverified.iter().min_by_key(|(_, (_, at))| *at).map(|(u, _)| u.clone());
            if let Some(oldest) = oldest {
                self.unverified.remove(&oldest);
            }
        }
        self.unverified.insert(url.to_owned(), (entry, now));
    }

    fn failed(&mut self, url: &str, failure: Failure, now: i64) {
        if self.failed.len() >= FAILED_CAPACITY {
            self.failed.retain(|_, (_, until)| now < *until);
        }
        if self.failed.len() >= FAILED_CAPACITY {
            let soonest = self.failed.iter().min_by_key(|(_, (_, until))| *until).map(|(u, _)| u.clone());
            if let Some(soonest) = soonest {
                self.failed.remove(&soonest);
            }
        }
        self.failed.insert(url.to_owned(), (failure, now.saturating_add(failure.ttl())));
    }

    /// `entry` just verified a signature: keep it where only AWS-signed
    /// messages can reach.
    fn verified(&mut self, url: &str, entry: CachedKey) {
        self.unverified.remove(url);
        if self.verified.len() >= VERIFIED_CAPACITY && !self.verified.contains_key(url) {
            let first_to_expire = self.verified.iter().min_by_key(|(_, e)| e.not_after).map(|(u, _)| u.clone());
            if let Some(first_to_expire) = first_to_expire {
                self.verified.remove(&first_to_expire);
            }
        }
        self.verified.insert(url.to_owned(), entry);
    }
}

/// Fetches and parses signing certificates for the life of a warm container
/// (keyed by the validated URL), so that a stranger cannot make it fetch
/// much, wait long, or forget a certificate it needs:
///
/// * at most one fetch at a time, and a request that waited for another's
///   fetch of the same URL uses its result (single flight);
/// * at most [`FETCH_BUDGET`] fetches per [`FETCH_WINDOW_SECS`]; each is cut
///   off after [`FETCH_TIMEOUT`];
/// * a URL whose host had no SNS certificate is refused (401) for
///   [`REFUSED_TTL_SECS`], one that could not be fetched is answered 503 for
///   [`UNAVAILABLE_TTL_SECS`], both without fetching again;
/// * a certificate joins the protected set only once it has verified a
///   signature; fetched-but-unproven ones live in a small separate set, so
///   unverified fetches never evict a certificate in use.
pub struct CertificateCache {
    getter: Arc<dyn HttpsGet>,
    state: Mutex<CacheState>,
    fetching: tokio::sync::Mutex<()>,
    fetch_timeout: Duration,
}

impl CertificateCache {
    pub fn new(getter: Arc<dyn HttpsGet>) -> Self {
        Self {
            getter,
            state: Mutex::new(CacheState::default()),
            fetching: tokio::sync::Mutex::new(()),
            fetch_timeout: FETCH_TIMEOUT,
        }
    }

    /// Overrides [`FETCH_TIMEOUT`] (tests, local tools).
    pub fn with_fetch_timeout(mut self, timeout: Duration) -> Self {
        self.fetch_timeout = timeout;
        self
    }

    pub fn getter(&self) -> &Arc<dyn HttpsGet> {
        &self.getter
    }

    fn state(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks `signature` over `signed` with the certificate at `url`, which
    /// must be valid at `now`. A certificate that verifies joins the
    /// protected set.
    async fn verify_signature(
        &self,
        url: &Url,
        now: i64,
        version: &str,
        signed: &[u8],
        signature: &[u8],
    ) -> Result<(), VerifyError> {
        let (entry, proven) = self.key_for(url, now).await?;
        if now < entry.not_before || now > entry.not_after {
            return Err(VerifyError::CertificateInvalid("certificate is not valid at this time"));
        }
        if signature.len() != entry.key.size() || !signature_matches(&entry.key, version, signed, signature)? {
            return Err(VerifyError::SignatureMismatch);
        }
        if !proven {
            self.state().verified(url.as_str(), entry);
        }
        Ok(())
    }

    async fn key_for(&self, url: &Url, now: i64) -> Result<(CachedKey, bool), VerifyError> {
        let known = self.state().known(url.as_str(), now);
        match known {
            Some(Known::Key(entry, proven)) => return Ok((entry, proven)),
            Some(Known::Failed(failure)) => return Err(failure.error()),
            None => {}
        }
        let _one_at_a_time = self.fetching.lock().await;
        // Another request may have fetched this URL while we waited.
        let known = self.state().known(url.as_str(), now);
        match known {
            Some(Known::Key(entry, proven)) => return Ok((entry, proven)),
            Some(Known::Failed(failure)) => return Err(failure.error()),
            None => {}
        }
        let budget = self.state().take_fetch(now);
        if let Budget::Spent { first } = budget {
            if first {
                tracing::warn!(
                    budget = FETCH_BUDGET,
                    window_secs = FETCH_WINDOW_SECS,
                    "SNS certificate fetch budget spent; unseen certificate URLs answered 503 until the window turns"
                );
            }
            // 503, not 4xx: SNS retries only 5xx, and this may be a genuine
            // message whose certificate is not cached yet. Not remembered
            // per URL, so the genuine URL is fetchable once the window turns.
            return Err(VerifyError::CertificateUnavailable);
        }
        let outcome = match tokio::time::timeout(self.fetch_timeout, self.getter.get(url)).await {
            Ok(Ok(pem)) => parse_certificate(&pem).map_err(|e| match e {
                VerifyError::CertificateInvalid(why) => Failure::Invalid(why),
                _ => Failure::Invalid("not an SNS signing certificate"),
            }),
            Ok(Err(FetchError::Status(status))) if is_definitive(status) => {
                Err(Failure::Invalid("no SNS certificate at this URL"))
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, cert_url = %url, "SNS certificate fetch failed");
                Err(Failure::Unavailable)
            }
            Err(_) => {
                tracing::warn!(cert_url = %url, "SNS certificate fetch timed out");
                Err(Failure::Unavailable)
            }
        };
        let mut state = self.state();
        match outcome {
            Ok(entry) => {
                state.fetched(url.as_str(), entry.clone(), now);
                Ok((entry, false))
            }
            Err(failure) => {
                state.failed(url.as_str(), failure, now);
                Err(failure.error())
            }
        }
    }
}

/// An HTTP status from an SNS host that settles the question (the
/// certificate is not there); others (5xx, 408, 429) may pass.
fn is_definitive(status: u16) -> bool {
    (300..500).contains(&status) && status != 408 && status != 429
}

/// Parses a PEM certificate, checks it names SNS, and extracts its RSA key.
fn parse_certificate(pem_bytes: &[u8]) -> Result<CachedKey, VerifyError> {
    if pem_bytes.len() > MAX_CERTIFICATE_BYTES {
        return Err(VerifyError::CertificateInvalid("certificate too large"));
    }
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem_bytes).map_err(|_| VerifyError::CertificateInvalid("not PEM"))?;
    let cert = pem.parse_x509().map_err(|_| VerifyError::CertificateInvalid("not an X.509 certificate"))?;
    // Older SNS certificates encode the CN as a T61String, which
    // `as_str` refuses; the raw bytes are compared as ASCII instead.
    let names_sns = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| std::str::from_utf8(cn.as_slice()).ok())
        .any(|cn| cn == "sns.amazonaws.com" || region_in_host(cn, "sns-signing.").is_some());
    if !names_sns {
        return Err(VerifyError::CertificateInvalid("certificate is not issued to SNS"));
    }
    let key = PublicKey::from_public_key_der(cert.public_key().raw)
        .map_err(|_| VerifyError::CertificateInvalid("certificate key is not RSA"))?;
    if !SIGNATURE_LENGTHS.contains(&key.size()) {
        return Err(VerifyError::CertificateInvalid("certificate key size is not 2048, 3072 or 4096 bits"));
    }
    let validity = cert.validity();
    Ok(CachedKey {
        key: Arc::new(key),
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
    })
}

/// Checks an RSA PKCS#1 v1.5 signature for SignatureVersion 1 or 2.
pub fn signature_matches(
    key: &PublicKey,
    version: &str,
    message: &[u8],
    signature: &[u8],
) -> Result<bool, VerifyError> {
    let sig = Signature::try_from(signature)
        .map_err(|_| VerifyError::MalformedEnvelope("signature is not a valid RSA signature"))?;
    let ok = match version {
        "1" => VerifyingKey::<sha1::Sha1>::new(key.clone()).verify(message, &sig).is_ok(),
        "2" => VerifyingKey::<sha2::Sha256>::new(key.clone()).verify(message, &sig).is_ok(),
        _ => {
            return Err(VerifyError::MalformedEnvelope("unsupported SignatureVersion"));
        }
    };
    Ok(ok)
}

pub struct SnsVerifier {
    topic_arns: Vec<String>,
    certs: Arc<CertificateCache>,
}

impl SnsVerifier {
    pub fn new(topic_arns: Vec<String>, certs: Arc<CertificateCache>) -> Self {
        Self { topic_arns, certs }
    }

    pub fn certificates(&self) -> &Arc<CertificateCache> {
        &self.certs
    }

    pub async fn verify(&self, body: &[u8], headers: &HeaderMap, now: i64) -> Result<Verified, VerifyError> {
        let msg: SnsMessage =
            serde_json::from_slice(body).map_err(|_| VerifyError::MalformedEnvelope("body is not an SNS message"))?;
        if let Some(declared) = header_values(headers, MESSAGE_TYPE_HEADER)?.first() {
            if *declared != msg.kind {
                return Err(VerifyError::MalformedEnvelope("message type header disagrees with the body"));
            }
        }
        self.verify_message(&msg, now).await
    }

    pub async fn verify_message(&self, msg: &SnsMessage, now: i64) -> Result<Verified, VerifyError> {
        // Everything before the certificate is local and cheap.
        let string_to_sign = msg.string_to_sign().ok_or(VerifyError::MalformedEnvelope("unknown message Type"))?;
        if !self.topic_arns.contains(&msg.topic_arn) {
            return Err(VerifyError::TopicNotAllowed);
        }
        if checked_event_id(&msg.message_id).is_err() {
            return Err(VerifyError::MalformedEnvelope("MessageId is empty, too long or has control characters"));
        }
        if msg.kind != "Notification" && msg.token.as_deref().is_none_or(str::is_empty) {
            return Err(VerifyError::MalformedEnvelope("no Token"));
        }
        let cert_url = certificate_url_for_topic(&msg.signing_cert_url, &msg.topic_arn)?;
        // Validate the subscribe URL before anything is fetched, too.
        let subscribe_url = match msg.kind.as_str() {
            "SubscriptionConfirmation" => Some(validate_subscribe_url(
                msg.subscribe_url.as_deref().ok_or(VerifyError::MalformedEnvelope("no SubscribeURL"))?,
            )?),
            _ => None,
        };
        let sent = parse_timestamp(&msg.timestamp)
            .ok_or(VerifyError::MalformedEnvelope("Timestamp is not an ISO 8601 UTC time"))?;
        if sent < now.saturating_sub(MAX_MESSAGE_AGE_SECS) {
            return Err(VerifyError::StaleTimestamp);
        }
        if sent > now.saturating_add(MAX_CLOCK_SKEW_SECS) {
            return Err(VerifyError::FutureTimestamp);
        }
        if !matches!(msg.signature_version.as_str(), "1" | "2") {
            return Err(VerifyError::MalformedEnvelope("unsupported SignatureVersion"));
        }
        let signature = decode_signature(&msg.signature)?;

        self.certs
            .verify_signature(&cert_url, now, &msg.signature_version, string_to_sign.as_bytes(), &signature)
            .await?;

        // Authenticated from here on.
        let event_id = checked_event_id(&msg.message_id)?;
        Ok(match subscribe_url {
            Some(subscribe_url) => Verified {
                event_id,
                event_type: Some(msg.kind.clone()),
                action: Action::ConfirmSubscription { subscribe_url },
                content: Content::Bytes,
            },
            None if msg.kind == "UnsubscribeConfirmation" => Verified {
                event_id,
                event_type: Some(msg.kind.clone()),
                action: Action::Unsubscribed,
                content: Content::Bytes,
            },
            None => Verified::record(event_id, Some(notification_type(&msg.message))),
        })
    }
}

/// Decodes `Signature`, which must be base64 of as many bytes as an
/// accepted RSA key size makes.
fn decode_signature(text: &str) -> Result<Vec<u8>, VerifyError> {
    let longest = SIGNATURE_LENGTHS.iter().max().map_or(0, |n| n.div_ceil(3) * 4);
    if text.len() > longest {
        return Err(VerifyError::MalformedEnvelope("signature is too long"));
    }
    let signature =
        STANDARD.decode(text.as_bytes()).map_err(|_| VerifyError::MalformedEnvelope("signature is not base64"))?;
    if !SIGNATURE_LENGTHS.contains(&signature.len()) {
        return Err(VerifyError::MalformedEnvelope("signature length does not match an RSA key size"));
    }
    Ok(signature)
}

/// Seconds since the epoch of an SNS `Timestamp` such as
/// `2026-03-06T19:55:38.903Z` (fraction optional, UTC `Z` required).
pub fn parse_timestamp(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let number = |from: usize, to: usize| -> Option<i64> {
        let digits = b.get(from..to)?;
        digits.iter().all(u8::is_ascii_digit).then(|| digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if b.last() != Some(&b'Z') || !separators.iter().all(|(i, c)| b.get(*i) == Some(c)) {
        return None;
    }
    let fraction = b.get(19..b.len() - 1)?;
    let fraction_ok = match fraction {
        [] => true,
        [b'.', digits @ ..] => (1..=9).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    let (year, month, day) = (number(0, 4)?, number(5, 7)?, number(8, 10)?);
    let (hour, minute, second) = (number(11, 13)?, number(14, 16)?, number(17, 19)?);
    let in_range = (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && hour < 24
        && minute < 60
        && second < 60;
    (fraction_ok && in_range).then(|| days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `secs` (Unix seconds) as an RFC 3339 UTC time, `YYYY-MM-DDTHH:MM:SSZ`
/// (the inverse of [`parse_timestamp`] to the second).
pub fn format_timestamp(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The date of a day since 1970-01-01 (the inverse of `days_from_civil`).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The SES type inside a notification (`notificationType` for identity
/// notifications, `eventType` for event publishing), else `Notification`.
fn notification_type(message: &str) -> String {
    serde_json::from_str::<serde_json::Value>(message)
        .ok()
        .and_then(|v| {
            let t = v.get("notificationType").or_else(|| v.get("eventType"))?.as_str()?;
            Some(format!("ses.{t}"))
        })
        .unwrap_or_else(|| "Notification".to_owned())
}

/// Amazon SNS (SES inside) in the provider registry.
pub struct Sns;

impl provider::Verifier for SnsVerifier {
    fn verify<'a>(&'a self, body: &'a [u8], headers: &'a HeaderMap, now_s: i64) -> Verifying<'a> {
        Box::pin(SnsVerifier::verify(self, body, headers, now_s))
    }

    /// Visits the `SubscribeURL` (validated by the verifier before this).
    fn confirm<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move { self.certs.getter().get(url).await.map(|_| ()).map_err(|e| e.to_string()) })
    }
}

impl Provider for Sns {
    fn name(&self) -> &'static str {
        "sns"
    }

    fn takes_secrets(&self) -> bool {
        false
    }

    /// A topic allow-list of well-formed ARNs, and no HMAC section.
    fn validate(&self, spec: &EndpointSpec) -> Result<(), String> {
        if spec.topic_arns.is_empty() {
            return Err("sns endpoints need topic_arns (the allow-list)".into());
        }
        if let Some(bad) = spec.topic_arns.iter().find(|t| !t.starts_with("arn:aws") || t.split(':').count() != 6) {
            return Err(format!("{bad:?} is not an SNS topic ARN"));
        }
        if spec.hmac.is_some() {
            return Err("the hmac section only applies to hmac endpoints, not sns".into());
        }
        Ok(())
    }

    fn verifier(
        &self,
        spec: &EndpointSpec,
        _: Vec<Secret>,
        cx: &BuildContext,
    ) -> Result<Box<dyn provider::Verifier>, String> {
        Ok(Box::new(SnsVerifier::new(spec.topic_arns.clone(), cx.certificates.clone())))
    }

    /// The event is the envelope's `Message` (JSON, or text as `{"message": …}`).
    fn decode(&self, stored_type: Option<&str>, payload: &[u8]) -> Result<(String, serde_json::Value), DecodeError> {
        let envelope: serde_json::Value =
            serde_json::from_slice(payload).map_err(|e| DecodeError(format!("payload is not JSON: {e}")))?;
        let message = envelope
            .get("Message")
            .and_then(|m| m.as_str())
            .ok_or_else(|| DecodeError("SNS envelope has no Message".into()))?;
        let body = serde_json::from_str(message).unwrap_or_else(|_| serde_json::json!({ "message": message }));
        crate::event::typed(stored_type, body)
    }

    fn sign(
        &self,
        _: &EndpointSpec,
        _: &Secret,
        _: &str,
        _: &str,
        _: i64,
        _: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        Err("sns endpoints are signed by AWS; they cannot be signed with a shared secret".into())
    }
}

#[cfg(test)]
mod tests;

/// Signing with a private key, for tests and local tools that act as SNS
/// with a test certificate. Production code never signs.
pub mod signing {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use rsa::PrivateKey;
    use rsa::pkcs1v15::SigningKey;
    use rsa::pkcs8::DecodePrivateKey;
    use rsa::signature::{SignatureEncoding, Signer};

    use super::SnsMessage;

    /// `unix_secs` as SNS writes a `Timestamp` (`2026-03-06T19:55:38.000Z`).
    pub fn timestamp(unix_secs: i64) -> String {
        let (days, secs) = (unix_secs.div_euclid(86_400), unix_secs.rem_euclid(86_400));
        let (year, month, day) = super::civil_from_days(days);
        format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.000Z", secs / 3600, secs / 60 % 60, secs % 60)
    }

    /// Fills in `Signature` for `msg` (SignatureVersion taken from the message).
    pub fn sign(msg: &mut SnsMessage, private_key_pem: &str) -> Result<(), String> {
        let key = PrivateKey::from_pkcs8_pem(private_key_pem).map_err(|e| e.to_string())?;
        let text = msg.string_to_sign().ok_or("unknown Type")?;
        let sig = match msg.signature_version.as_str() {
            "1" => SigningKey::<sha1::Sha1>::new(key).sign(text.as_bytes()).to_vec(),
            "2" => SigningKey::<sha2::Sha256>::new(key).sign(text.as_bytes()).to_vec(),
            _ => return Err("unsupported SignatureVersion".into()),
        };
        msg.signature = STANDARD.encode(sig);
        Ok(())
    }
}
