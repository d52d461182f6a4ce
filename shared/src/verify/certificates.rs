//! SNS signing certificates: the URLs they may come from (validated
//! before anything is fetched), the bounded, single-flight cache of their
//! keys with negative caching, and the RSA signature check. Used by the SNS
//! verifier (`verify::sns`, which re-exports these names).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rsa::PublicKey;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::pkcs8::DecodePublicKey;
use rsa::signature::Verifier;
use rsa::traits::PublicKeyParts;
use url::Url;

use super::VerifyError;

/// Certificates larger than this are not SNS signing certificates.
pub const MAX_CERTIFICATE_BYTES: usize = 16 * 1024;

/// Signature lengths in bytes of the RSA key sizes accepted for signing
/// certificates (2048, 3072, 4096 bits; SNS uses 2048).
pub(crate) const SIGNATURE_LENGTHS: [usize; 3] = [256, 384, 512];
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
pub(crate) enum Partition {
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
pub(crate) const REGIONS: &[(&str, Partition)] = &[
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
pub(crate) struct CachedKey {
    pub(crate) key: Arc<PublicKey>,
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
    pub(crate) async fn verify_signature(
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
pub(crate) fn parse_certificate(pem_bytes: &[u8]) -> Result<CachedKey, VerifyError> {
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
