//! Amazon SNS over HTTPS (and SES notifications carried inside it).
//!
//! Order of checks, each before anything more expensive or more trusting:
//! 1. the body parses as an SNS envelope of a known `Type`;
//! 2. its `TopicArn` is on the endpoint's allow-list;
//! 3. `SigningCertURL` is exactly `https://sns.<region>.amazonaws.com[.cn]/SimpleNotificationService-<hex>.pem`
//!    (no port, user-info, query or fragment) — checked before any fetch;
//! 4. the certificate (fetched once per warm container, then cached) is for
//!    SNS and valid now; its RSA key verifies `Signature` over the canonical
//!    string to sign (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA).
//!
//! Only then is `Message` looked at (for the SES event type).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::HeaderMap;
use rsa::PublicKey;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::pkcs8::DecodePublicKey;
use rsa::signature::Verifier;
use serde::Deserialize;
use url::Url;

use super::headers::header_values;
use super::{Action, Verified, VerifyError, checked_event_id};

pub const MESSAGE_TYPE_HEADER: &str = "x-amz-sns-message-type";
/// Certificates larger than this are not SNS signing certificates.
pub const MAX_CERTIFICATE_BYTES: usize = 16 * 1024;
const CACHE_CAPACITY: usize = 64;

/// Fetches an already validated HTTPS URL. Behind a trait so tests serve
/// certificates without network and count fetches.
pub trait HttpsGet: Send + Sync {
    fn get<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>>;
}

#[derive(Debug, thiserror::Error)]
#[error("fetch failed: {0}")]
pub struct FetchError(pub String);

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

/// `sns.<region>.amazonaws.com` or `sns.<region>.amazonaws.com.cn`, nothing else.
fn is_sns_host(host: &str) -> bool {
    let Some(rest) = host.strip_prefix("sns.") else {
        return false;
    };
    let region = rest.strip_suffix(".amazonaws.com").or_else(|| rest.strip_suffix(".amazonaws.com.cn"));
    region.is_some_and(is_region)
}

/// AWS region names: lowercase words joined by '-', ending in a number (us-gov-west-1).
fn is_region(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() >= 3
        && parts.last().is_some_and(|p| !p.is_empty() && p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit()))
        && parts[..parts.len() - 1].iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
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
    if !is_sns_host(host) {
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
    if !name.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric())) {
        return Err(VerifyError::CertificateUrl("path is not /SimpleNotificationService-<id>.pem"));
    }
    if url.as_str() != raw {
        return Err(VerifyError::CertificateUrl("URL is not in canonical form"));
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

/// Fetches and parses signing certificates, caching them for the life of a
/// warm container (keyed by the validated URL; bounded).
pub struct CertificateCache {
    getter: Arc<dyn HttpsGet>,
    keys: Mutex<HashMap<String, CachedKey>>,
}

impl CertificateCache {
    pub fn new(getter: Arc<dyn HttpsGet>) -> Self {
        Self { getter, keys: Mutex::new(HashMap::new()) }
    }

    pub fn getter(&self) -> &Arc<dyn HttpsGet> {
        &self.getter
    }

    async fn key_for(&self, url: &Url, now: i64) -> Result<Arc<PublicKey>, VerifyError> {
        let cached = self.keys.lock().unwrap_or_else(|e| e.into_inner()).get(url.as_str()).cloned();
        let entry = match cached {
            Some(entry) => entry,
            None => {
                let pem = self.getter.get(url).await.map_err(|e| {
                    tracing::warn!(error = %e, cert_url = %url, "SNS certificate fetch failed");
                    VerifyError::CertificateUnavailable
                })?;
                let entry = parse_certificate(&pem)?;
                let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
                if keys.len() >= CACHE_CAPACITY {
                    keys.clear();
                }
                keys.insert(url.as_str().to_owned(), entry.clone());
                entry
            }
        };
        if now < entry.not_before || now > entry.not_after {
            return Err(VerifyError::CertificateInvalid("certificate is not valid at this time"));
        }
        Ok(entry.key)
    }
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
    let names_sns =
        cert.subject().iter_common_name().filter_map(|cn| std::str::from_utf8(cn.as_slice()).ok()).any(|cn| {
            cn == "sns.amazonaws.com"
                || cn.strip_prefix("sns-signing.").is_some_and(|rest| {
                    rest.strip_suffix(".amazonaws.com")
                        .or_else(|| rest.strip_suffix(".amazonaws.com.cn"))
                        .is_some_and(is_region)
                })
        });
    if !names_sns {
        return Err(VerifyError::CertificateInvalid("certificate is not issued to SNS"));
    }
    let key = PublicKey::from_public_key_der(cert.public_key().raw)
        .map_err(|_| VerifyError::CertificateInvalid("certificate key is not RSA"))?;
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
        let string_to_sign = msg.string_to_sign().ok_or(VerifyError::MalformedEnvelope("unknown message Type"))?;
        if !self.topic_arns.contains(&msg.topic_arn) {
            return Err(VerifyError::TopicNotAllowed);
        }
        let cert_url = validate_certificate_url(&msg.signing_cert_url)?;
        // Validate the subscribe URL before anything is fetched, too.
        let subscribe_url = match msg.kind.as_str() {
            "SubscriptionConfirmation" => Some(validate_subscribe_url(
                msg.subscribe_url.as_deref().ok_or(VerifyError::MalformedEnvelope("no SubscribeURL"))?,
            )?),
            _ => None,
        };
        let signature = STANDARD
            .decode(msg.signature.as_bytes())
            .map_err(|_| VerifyError::MalformedEnvelope("signature is not base64"))?;
        if !matches!(msg.signature_version.as_str(), "1" | "2") {
            return Err(VerifyError::MalformedEnvelope("unsupported SignatureVersion"));
        }
        let key = self.certs.key_for(&cert_url, now).await?;
        if !signature_matches(&key, &msg.signature_version, string_to_sign.as_bytes(), &signature)? {
            return Err(VerifyError::SignatureMismatch);
        }

        // Authenticated from here on.
        let event_id = checked_event_id(&msg.message_id)?;
        Ok(match subscribe_url {
            Some(subscribe_url) => Verified {
                event_id,
                event_type: Some(msg.kind.clone()),
                action: Action::ConfirmSubscription { subscribe_url },
            },
            None if msg.kind == "UnsubscribeConfirmation" => {
                Verified { event_id, event_type: Some(msg.kind.clone()), action: Action::Unsubscribed }
            }
            None => Verified::record(event_id, Some(notification_type(&msg.message))),
        })
    }
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
