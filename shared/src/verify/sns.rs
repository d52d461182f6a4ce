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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::HeaderMap;
use serde::Deserialize;
use url::Url;

pub use super::certificates::*;
use super::headers::header_values;
use super::provider::{self, BuildContext, Delivery, EndpointSpec, Identity, Provider, SuccessAnswer, Verifying};
use super::{Action, Content, Verified, VerifyError, checked_event_id};
use crate::event::DecodeError;
use crate::secret::Secret;

pub const MESSAGE_TYPE_HEADER: &str = "x-amz-sns-message-type";
/// Oldest `Timestamp` accepted. SNS stops retrying an HTTP/S delivery after at
/// most 3,600 s (a hard limit of its delivery policies); this allows twice that.
pub const MAX_MESSAGE_AGE_SECS: i64 = 2 * 3600;
/// How far a `Timestamp` may be ahead of our clock.
pub const MAX_CLOCK_SKEW_SECS: i64 = 300;

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
    fn verify<'a>(&'a self, d: Delivery<'a>, now_s: i64) -> Verifying<'a> {
        Box::pin(SnsVerifier::verify(self, d.body, d.headers, now_s))
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

    /// `MessageId` is in the signed string.
    fn identity(&self) -> Identity {
        Identity::SIGNED_EVENT
    }

    /// SNS retries only 5xx and no answer: 202, 200 are delivered.
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
    }

    fn summary(&self) -> &'static str {
        "AWS's RSA signature (v1 SHA-1, v2 SHA-256) with a validated SNS certificate; id MessageId; SES inside"
    }

    fn options(&self) -> String {
        "topic_arns (required)".into()
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
        if spec.hmac.is_some() || spec.public_url.is_some() {
            return Err("the hmac section and public_url do not apply to sns endpoints".into());
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
