//! Discord interactions: `X-Signature-Ed25519` (hex), an Ed25519 signature
//! of `X-Signature-Timestamp` + body by Discord's key; the endpoint's
//! "secrets" are the application's public keys (hex, from its settings; not
//! secret, but configured the same way, several during a change). A PING
//! (`type` 1) is answered `{"type":1}` and recorded nowhere; any other
//! interaction is recorded under its `id`, and answered as Discord needs
//! within its 3 s: deferred (`{"type":5}` for a command or a modal,
//! `{"type":6}` for a component), or no choices for an autocomplete.

use ed25519_dalek::{Signature, VerifyingKey};
use http::HeaderMap;

use super::headers::{parse_unix_secs, single_header};
use super::provider::{
    BuildContext, Delivery, EndpointSpec, Identity, Provider, Success, SuccessAnswer, Verifier, Verifying, no_sections,
    ready,
};
use super::{Action, Content, Verified, VerifyError, check_timestamp, checked_event_id, json};
use crate::secret::Secret;

pub const SIGNATURE_HEADER: &str = "x-signature-ed25519";
pub const TIMESTAMP_HEADER: &str = "x-signature-timestamp";

/// Seconds a signed timestamp may be from now, by default.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

/// The interaction types, as Discord numbers them.
const TYPES: [(i64, &str); 5] = [
    (1, "ping"),
    (2, "application_command"),
    (3, "message_component"),
    (4, "application_command_autocomplete"),
    (5, "modal_submit"),
];

pub struct DiscordVerifier {
    keys: Vec<VerifyingKey>,
    tolerance_secs: i64,
}

/// An application public key from its hex text.
pub fn public_key(secret: &Secret) -> Result<VerifyingKey, &'static str> {
    let text = std::str::from_utf8(secret.expose()).map_err(|_| "not text")?.trim();
    let bytes: [u8; 32] =
        hex::decode(text).ok().and_then(|b| b.try_into().ok()).ok_or("not a 32-byte public key in hex")?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| "not an Ed25519 public key")
}

impl DiscordVerifier {
    pub fn new(keys: Vec<VerifyingKey>, tolerance_secs: i64) -> Self {
        Self { keys, tolerance_secs }
    }

    pub fn verify(&self, body: &[u8], headers: &HeaderMap, now: i64) -> Result<Verified, VerifyError> {
        let signature = single_header(headers, SIGNATURE_HEADER)?;
        let timestamp_text = single_header(headers, TIMESTAMP_HEADER)?;
        let bytes: [u8; 64] = hex::decode(signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(VerifyError::MalformedHeader(SIGNATURE_HEADER))?;
        let signature = Signature::from_bytes(&bytes);
        let mut message = Vec::with_capacity(timestamp_text.len() + body.len());
        message.extend_from_slice(timestamp_text.as_bytes());
        message.extend_from_slice(body);
        // Strict verification: no malleable or small-order signatures.
        if !self.keys.iter().any(|k| k.verify_strict(&message, &signature).is_ok()) {
            return Err(VerifyError::SignatureMismatch);
        }
        check_timestamp(parse_unix_secs(timestamp_text, TIMESTAMP_HEADER)?, now, self.tolerance_secs)?;
        // Authenticated: its type and id.
        let [kind, id] = json::pointers(body, [Some("/type"), Some("/id")]);
        let kind = kind
            .and_then(|r| body.get(r).and_then(|t| std::str::from_utf8(t).ok()).and_then(|t| t.parse::<i64>().ok()))
            .ok_or(VerifyError::MalformedPayload("the interaction has no type"))?;
        let name = TYPES.iter().find(|(n, _)| *n == kind).map_or("interaction", |(_, name)| name);
        if kind == 1 {
            return Ok(Verified {
                event_id: String::new(),
                event_type: Some(name.to_owned()),
                action: Action::Reply { content_type: "application/json", body: r#"{"type":1}"#.to_owned() },
                content: Content::Bytes,
            });
        }
        let id = id
            .and_then(|r| json::string_at(body, &r))
            .ok_or(VerifyError::MalformedPayload("the interaction has no id"))?;
        Ok(Verified::record(checked_event_id(&id)?, Some(name.to_owned())))
    }
}

impl Verifier for DiscordVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, now_s: i64) -> Verifying<'a> {
        ready(DiscordVerifier::verify(self, d.body, d.headers, now_s))
    }
}

/// Discord in the provider registry.
pub struct Discord;

impl Provider for Discord {
    fn name(&self) -> &'static str {
        "discord"
    }

    fn summary(&self) -> &'static str {
        "X-Signature-Ed25519: Ed25519 of X-Signature-Timestamp + body by Discord (the secrets are the application's public keys); PING answered {\"type\":1}; id the interaction's id"
    }

    fn validate(&self, spec: &EndpointSpec) -> Result<(), String> {
        no_sections(self.name(), spec)
    }

    fn verifier(
        &self,
        spec: &EndpointSpec,
        secrets: Vec<Secret>,
        _: &BuildContext,
    ) -> Result<Box<dyn Verifier>, String> {
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(i, s)| public_key(s).map_err(|why| format!("secret {}: {why}", i + 1)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(DiscordVerifier::new(keys, spec.tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS))))
    }

    /// The interaction's `id` is in the signed body.
    fn identity(&self) -> Identity {
        Identity::SIGNED_EVENT
    }

    /// Discord needs an interaction answered within 3 s: deferred.
    fn success(&self, event_type: Option<&str>) -> SuccessAnswer {
        let body = match event_type {
            Some("message_component") => r#"{"type":6}"#,
            Some("application_command_autocomplete") => r#"{"type":8,"data":{"choices":[]}}"#,
            _ => r#"{"type":5}"#,
        };
        SuccessAnswer::Exactly(Success { status: 200, body: Some(("application/json", body)) })
    }

    fn tool_signs(&self) -> bool {
        false
    }

    fn sample(&self, _: &EndpointSpec, event_id: &str, event_type: &str, _: i64) -> Vec<u8> {
        serde_json::json!({"type": 2, "id": event_id, "application_id": "11", "token": "interaction-token",
            "data": {"id": "12", "name": event_type, "type": 1}, "version": 1})
        .to_string()
        .into_bytes()
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
        Err("Discord signs with its private key; the endpoint holds only the public key, so the tool cannot sign"
            .into())
    }
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::{Signer, SigningKey};
    use http::HeaderValue;

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[7u8; 32])
    }

    fn verifier() -> DiscordVerifier {
        DiscordVerifier::new(vec![key().verifying_key()], 300)
    }

    fn signed(body: &[u8], ts: i64, by: &SigningKey) -> HeaderMap {
        let mut message = ts.to_string().into_bytes();
        message.extend_from_slice(body);
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(&hex::encode(by.sign(&message).to_bytes())).unwrap());
        h.insert(TIMESTAMP_HEADER, HeaderValue::from(ts));
        h
    }

    #[test]
    fn a_ping_is_answered_and_an_interaction_recorded() {
        let ping = br#"{"id":"1","type":1,"application_id":"11","version":1}"#;
        let got = verifier().verify(ping, &signed(ping, NOW, &key()), NOW).unwrap();
        assert_eq!(got.action, Action::Reply { content_type: "application/json", body: r#"{"type":1}"#.into() });
        let command = br#"{"id":"1234567890","type":2,"data":{"name":"hello"}}"#;
        let got = verifier().verify(command, &signed(command, NOW, &key()), NOW).unwrap();
        assert_eq!((got.event_id.as_str(), got.event_type.as_deref()), ("1234567890", Some("application_command")));
        assert_eq!(Discord.success(Some("message_component")).exactly().unwrap().body.unwrap().1, r#"{"type":6}"#);
    }

    #[test]
    fn forgeries_stale_and_malformed_are_refused() {
        let ping = br#"{"id":"1","type":1}"#;
        let other = SigningKey::from_bytes(&[9u8; 32]);
        assert_eq!(
            verifier().verify(ping, &signed(ping, NOW, &other), NOW).unwrap_err(),
            VerifyError::SignatureMismatch
        );
        let h = signed(ping, NOW, &key());
        assert_eq!(verifier().verify(br#"{"id":"1","type":2}"#, &h, NOW).unwrap_err(), VerifyError::SignatureMismatch);
        assert_eq!(verifier().verify(ping, &h, NOW + 301).unwrap_err(), VerifyError::StaleTimestamp);
        let mut bad = h.clone();
        bad.insert(SIGNATURE_HEADER, HeaderValue::from_static("zz"));
        assert_eq!(verifier().verify(ping, &bad, NOW).unwrap_err(), VerifyError::MalformedHeader(SIGNATURE_HEADER));
        let no_type = br#"{"id":"1"}"#;
        let got = verifier().verify(no_type, &signed(no_type, NOW, &key()), NOW);
        assert!(matches!(got, Err(VerifyError::MalformedPayload(_))), "{got:?}");
        assert!(public_key(&Secret::new("00")).is_err());
        assert!(public_key(&Secret::new(hex::encode(key().verifying_key().to_bytes()))).is_ok());
    }
}
