//! Asana webhooks: the secret is handed over at a handshake.
//!
//! Creating a webhook, Asana POSTs its target with `X-Hook-Secret` (no
//! body) and needs the same header back in a 200 or 204; every later
//! delivery is signed with that secret (`X-Hook-Signature`: hex
//! HMAC-SHA256 of the body). Whoever answers the handshake first owns the
//! endpoint, so the secret is taken only while an operator's window is
//! open (`hookledger providers arm asana --endpoint E --for 10m`), only
//! once, and stored as the endpoint's ([`SecretStore`]: an SSM
//! SecureString under its path), never overwritten. The answer is sent only
//! once the secret is stored: a store that cannot answer is a 503, and a
//! write whose acknowledgement was lost meets itself as the same secret.
//!
//! Deliveries are batches (`{"events": [...]}`); Asana gives an event no
//! id, so each is identified by the SHA-256 of its bytes (its retries repeat
//! them), its type `<resource_type>.<action>` (`task.changed`). A heartbeat
//! (an empty `events`, signed) is acknowledged, nothing recorded.
//!
//! The endpoint's configured `secrets`, if any, are accepted besides the
//! learned one (a webhook whose secret was kept elsewhere before). Every
//! read of the store is trusted for [`RELOAD_SECS`] and made again at most
//! that often per container: a handshake attempt (unauthenticated by
//! nature) outside a window costs no store read while the closed window is
//! known, so a flood of them costs one read per bound; a learned secret is
//! verified against the store again once its read is that old, so one
//! deleted from the store stops verifying within the bound (a store that
//! cannot be read keeps the secret held; it is tried again a bound later).

use std::sync::{Arc, Mutex};

use http::HeaderMap;

use super::elements::{elements, hashed_events, text_at};
use super::headers::single_header;
use super::provider::{
    BuildContext, Delivery, EndpointSpec, Handshake, HandshakeAnswer, HandshakeInput, Identity, Provider, SecretStore,
    Stored, SuccessAnswer, Verifier, Verifying, no_sections,
};
use super::{Action, BatchEvent, Content, Verified, VerifyError, echoable, hmac_sha256, mac_bytes, mac_matches};
use crate::identity::payload_hash;
use crate::secret::Secret;

pub const SECRET_HEADER: &str = "x-hook-secret";
pub const SIGNATURE_HEADER: &str = "x-hook-signature";
/// The header as the answer names it.
const SECRET_HEADER_ANSWER: &str = "X-Hook-Secret";

/// How long a container trusts what it read from the store (the window,
/// the secret), and so how often at most it reads it again.
pub const RELOAD_SECS: i64 = 10;

/// The secret this container learned or read, and when it last read the
/// store; the window it last read, and when.
#[derive(Default)]
struct Learned {
    secret: Option<Secret>,
    read_at_s: Option<i64>,
    window: Option<(Option<i64>, i64)>,
}

/// Whether what was read at `read_at_s` is still trusted at `now_s`.
fn fresh(read_at_s: i64, now_s: i64) -> bool {
    now_s - read_at_s < RELOAD_SECS
}

pub struct AsanaVerifier {
    configured: Vec<Secret>,
    store: Option<(Arc<dyn SecretStore>, String)>,
    learned: Mutex<Learned>,
}

impl AsanaVerifier {
    pub fn new(configured: Vec<Secret>, store: Option<(Arc<dyn SecretStore>, String)>) -> Self {
        Self { configured, store, learned: Mutex::new(Learned::default()) }
    }

    fn learned(&self) -> Option<Secret> {
        self.learned.lock().ok().and_then(|l| l.secret.clone())
    }

    /// What the store holds now (`None`: nothing, so a secret held before
    /// is forgotten), read at `now_s`.
    fn remember(&self, secret: Option<Secret>, now_s: i64) {
        if let Ok(mut l) = self.learned.lock() {
            l.secret = secret;
            l.read_at_s = Some(now_s);
        }
    }

    /// The window's end as last read, if that read is still trusted.
    fn known_window(&self, now_s: i64) -> Option<Option<i64>> {
        let l = self.learned.lock().ok()?;
        l.window.and_then(|(until, at)| fresh(at, now_s).then_some(until))
    }

    /// The handshake: the offered secret stored once, inside the window.
    async fn handshake(&self, offered: &str, now_s: i64) -> Result<Verified, VerifyError> {
        if !echoable(offered) {
            return Err(VerifyError::MalformedHeader(SECRET_HEADER));
        }
        let Some((store, endpoint)) = &self.store else {
            return Err(VerifyError::HandshakeRefused("this endpoint keeps no learned secrets"));
        };
        let until = match self.known_window(now_s) {
            Some(until) => until,
            None => {
                let until = store.window(endpoint).await.map_err(|e| {
                    tracing::warn!(error = %e, "handshake window could not be read");
                    VerifyError::Unavailable("the handshake window")
                })?;
                if let Ok(mut l) = self.learned.lock() {
                    l.window = Some((until, now_s));
                }
                until
            }
        };
        if until.is_none_or(|until| now_s > until) {
            return Err(VerifyError::HandshakeRefused("no handshake window is open for this endpoint"));
        }
        let secret = Secret::new(offered);
        match store.store_once(endpoint, &secret).await {
            Ok(Stored::New | Stored::Same) => {}
            Ok(Stored::Other) => {
                return Err(VerifyError::HandshakeRefused("a secret is already stored for this endpoint"));
            }
            Err(e) => {
                tracing::warn!(error = %e, "handshake secret could not be stored");
                return Err(VerifyError::Unavailable("the secret store"));
            }
        }
        self.remember(Some(secret), now_s);
        Ok(Verified {
            event_id: String::new(),
            event_type: Some("handshake".into()),
            action: Action::ReplyHeader { name: SECRET_HEADER_ANSWER, value: offered.to_owned() },
            content: Content::Bytes,
        })
    }

    fn signed_by(&self, extra: Option<&Secret>, body: &[u8], signature: &[u8]) -> bool {
        self.configured.iter().chain(extra).any(|s| mac_matches(&hmac_sha256(s.expose(), &[body]), signature))
    }

    async fn event(&self, body: &[u8], headers: &HeaderMap, now_s: i64) -> Result<Verified, VerifyError> {
        let text = single_header(headers, SIGNATURE_HEADER)?;
        let signature = hex::decode(text.trim()).map_err(|_| VerifyError::MalformedHeader(SIGNATURE_HEADER))?;
        let due = self.learned.lock().ok().is_none_or(|l| l.read_at_s.is_none_or(|t| !fresh(t, now_s)));
        let held = self.learned();
        let mut ok = self.signed_by(None, body, &signature);
        if !ok {
            match &self.store {
                // What was read within the bound is trusted as it is.
                Some(_) if !due => ok = self.signed_by(held.as_ref(), body, &signature),
                Some((store, endpoint)) => match store.load(endpoint).await {
                    Ok(stored) => {
                        ok = self.signed_by(stored.as_ref(), body, &signature);
                        self.remember(stored, now_s);
                    }
                    // The store cannot say: a secret held is kept (tried again a bound later).
                    Err(e) if held.is_some() => {
                        tracing::warn!(error = %e, "learned secret could not be read again; the one held is kept");
                        ok = self.signed_by(held.as_ref(), body, &signature);
                        self.remember(held, now_s);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "learned secret could not be read");
                        return Err(VerifyError::Unavailable("the secret store"));
                    }
                },
                None => {}
            }
        }
        if !ok {
            return Err(VerifyError::SignatureMismatch);
        }
        let ranges = elements(body, "/events")?;
        if ranges.is_empty() {
            return Ok(Verified {
                event_id: String::new(),
                event_type: None,
                action: Action::Acknowledge { what: "a heartbeat" },
                content: Content::Bytes,
            });
        }
        let events = hashed_events(body, &ranges, event_type)?;
        let first = events.first().map(|e| e.event_id.clone()).unwrap_or_default();
        Ok(Verified { action: Action::Batch(events), ..Verified::record(first, None) })
    }
}

/// `<resource_type>.<action>` of an event (`task.changed`), or its action alone.
fn event_type(bytes: &[u8]) -> Option<String> {
    let action = text_at(bytes, "/action")?;
    Some(match text_at(bytes, "/resource/resource_type") {
        Some(kind) => format!("{kind}.{action}"),
        None => action,
    })
}

impl Verifier for AsanaVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, now_s: i64) -> Verifying<'a> {
        Box::pin(async move {
            match super::header_values(d.headers, SECRET_HEADER)?.as_slice() {
                [] => self.event(d.body, d.headers, now_s).await,
                [offered] => self.handshake(offered.trim(), now_s).await,
                _ => Err(VerifyError::MalformedHeader(SECRET_HEADER)),
            }
        })
    }
}

/// Asana, as a provider.
pub struct Asana;

const SAMPLE: &str = r#"{"events":[{"user":{"gid":"1201004560000000","resource_type":"user"},"created_at":"{{rfc3339}}","action":"{{action}}","resource":{"gid":"{{id}}","resource_type":"{{kind}}","resource_subtype":"default_task"},"parent":null,"change":{"field":"assignee","action":"changed","new_value":{"gid":"1201004560000000","resource_type":"user"}}}]}"#;

impl Provider for Asana {
    fn name(&self) -> &'static str {
        "asana"
    }

    /// Each event is identified by its bytes, which carry its `created_at`.
    fn identity(&self) -> Identity {
        Identity::SIGNED_EVENT
    }

    /// Asana: 200 or 204 to its handshake (answered apart); events, a 2xx.
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
    }

    fn summary(&self) -> &'static str {
        "X-Hook-Signature: hex HMAC-SHA256 of the body with the secret Asana hands over at the handshake (X-Hook-Secret, stored once while an operator's window is open); events[] a batch, each event identified by its hash; an empty batch (heartbeat) acknowledged"
    }

    fn options(&self) -> String {
        String::new()
    }

    fn learns_secret(&self) -> bool {
        true
    }

    fn validate(&self, spec: &EndpointSpec) -> Result<(), String> {
        no_sections(self.name(), spec)?;
        if spec.tolerance_secs.is_some() {
            return Err("asana signs no timestamp: tolerance_secs does not apply".into());
        }
        Ok(())
    }

    fn verifier(&self, _: &EndpointSpec, secrets: Vec<Secret>, cx: &BuildContext) -> Result<Box<dyn Verifier>, String> {
        if secrets.is_empty() && cx.learned.is_none() {
            return Err("asana learns its secret at the handshake: set HOOKLEDGER_HANDSHAKE_PATH (where it is kept) or configure secrets".into());
        }
        Ok(Box::new(AsanaVerifier::new(secrets, cx.learned.clone())))
    }

    fn sample(&self, _: &EndpointSpec, event_id: &str, event_type: &str, now_s: i64) -> Vec<u8> {
        let (kind, action) = event_type.split_once('.').unwrap_or(("task", event_type));
        SAMPLE
            .replace("{{rfc3339}}", &super::sns::format_timestamp(now_s))
            .replace("{{action}}", action)
            .replace("{{kind}}", kind)
            .replace("{{id}}", event_id)
            .into_bytes()
    }

    fn event_id(&self, random_hex: &str) -> String {
        let digits: String = random_hex.chars().filter(char::is_ascii_hexdigit).take(12).collect();
        (u64::from_str_radix(&digits, 16).unwrap_or(0) % 1_000_000_000_000_000 + 1_200_000_000_000_000).to_string()
    }

    fn sign(
        &self,
        _: &EndpointSpec,
        secret: &Secret,
        _: &str,
        _: &str,
        _: i64,
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        Ok(vec![(SIGNATURE_HEADER.into(), hex::encode(mac_bytes(hmac_sha256(secret.expose(), &[body]))))])
    }

    fn split(&self, payload: &[u8]) -> Option<Result<Vec<BatchEvent>, VerifyError>> {
        Some(elements(payload, "/events").and_then(|r| hashed_events(payload, &r, event_type)))
    }

    fn content_hash(&self, body: &[u8]) -> String {
        payload_hash(body)
    }

    /// The handshake (the nonce offered as the secret), then a heartbeat
    /// signed with it.
    fn handshakes(&self, hs: HandshakeInput<'_>) -> Result<Vec<Handshake>, String> {
        let heartbeat = br#"{"events":[]}"#.to_vec();
        let signed = self.sign(hs.spec, &Secret::new(hs.nonce), "", "", hs.now_s, &heartbeat)?;
        let json = |h: Vec<(String, String)>| {
            let mut all = vec![("content-type".to_owned(), "application/json".to_owned())];
            all.extend(h);
            all
        };
        Ok(vec![
            Handshake {
                name: "X-Hook-Secret",
                method: http::Method::POST,
                query: String::new(),
                headers: json(vec![(SECRET_HEADER.into(), hs.nonce.into())]),
                body: Vec::new(),
                expect: HandshakeAnswer {
                    status: 200,
                    content_type: None,
                    body: String::new(),
                    header: Some((SECRET_HEADER_ANSWER, hs.nonce.into())),
                },
            },
            Handshake {
                name: "heartbeat",
                method: http::Method::POST,
                query: String::new(),
                headers: json(signed),
                body: heartbeat,
                expect: HandshakeAnswer { status: 200, content_type: None, body: String::new(), header: None },
            },
        ])
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use http::HeaderValue;

    use super::*;
    use crate::verify::provider::Storing;

    /// A store in a map, faults on demand.
    #[derive(Default)]
    struct Map {
        windows: Mutex<HashMap<String, i64>>,
        secrets: Mutex<HashMap<String, Vec<u8>>>,
        down: std::sync::atomic::AtomicBool,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl Map {
        fn reads(&self) -> usize {
            self.reads.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl SecretStore for Map {
        fn window(&self, endpoint: &str) -> Storing<'_, Option<i64>> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let r = if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                Err("down".to_owned())
            } else {
                Ok(self.windows.lock().unwrap().get(endpoint).copied())
            };
            Box::pin(async move { r })
        }
        fn open_window(&self, endpoint: &str, until_s: i64) -> Storing<'_, ()> {
            self.windows.lock().unwrap().insert(endpoint.to_owned(), until_s);
            Box::pin(async { Ok(()) })
        }
        fn store_once<'a>(&'a self, endpoint: &'a str, secret: &'a Secret) -> Storing<'a, Stored> {
            let mut all = self.secrets.lock().unwrap();
            let r = match all.get(endpoint) {
                Some(s) if s.as_slice() == secret.expose() => Stored::Same,
                Some(_) => Stored::Other,
                None => {
                    all.insert(endpoint.to_owned(), secret.expose().to_vec());
                    Stored::New
                }
            };
            Box::pin(async move { Ok(r) })
        }
        fn load(&self, endpoint: &str) -> Storing<'_, Option<Secret>> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let r = if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                Err("down".to_owned())
            } else {
                Ok(self.secrets.lock().unwrap().get(endpoint).map(|s| Secret::new(s.clone())))
            };
            Box::pin(async move { r })
        }
    }

    fn verifier(store: &Arc<Map>) -> AsanaVerifier {
        AsanaVerifier::new(Vec::new(), Some((store.clone() as Arc<dyn SecretStore>, "ep".into())))
    }

    async fn offer(v: &AsanaVerifier, secret: &str, now: i64) -> Result<Verified, VerifyError> {
        let mut h = HeaderMap::new();
        h.insert(SECRET_HEADER, HeaderValue::from_str(secret).unwrap());
        v.verify(Delivery { body: b"", headers: &h, method: &http::Method::POST, query: "" }, now).await
    }

    async fn event(v: &AsanaVerifier, secret: &str, body: &[u8], now: i64) -> Result<Verified, VerifyError> {
        signed_then_sent(v, secret, body, body, now).await
    }

    /// `signed` signed with `secret`, and `sent` delivered with that signature.
    async fn signed_then_sent(
        v: &AsanaVerifier,
        secret: &str,
        signed: &[u8],
        sent: &[u8],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let spec: EndpointSpec = serde_json::from_str(r#"{"provider":"asana"}"#).unwrap();
        let mut h = HeaderMap::new();
        for (k, val) in Asana.sign(&spec, &Secret::new(secret), "", "", now, signed).unwrap() {
            h.insert(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(&val).unwrap());
        }
        v.verify(Delivery { body: sent, headers: &h, method: &http::Method::POST, query: "" }, now).await
    }

    #[tokio::test]
    async fn a_secret_is_taken_only_inside_the_window_and_only_once() {
        let store = Arc::new(Map::default());
        let v = verifier(&store);
        assert_eq!(
            offer(&v, "s3cret-1", 100).await,
            Err(VerifyError::HandshakeRefused("no handshake window is open for this endpoint"))
        );
        store.open_window("ep", 700).await.unwrap();
        assert!(matches!(offer(&v, "s3cret-1", 701).await, Err(VerifyError::HandshakeRefused(_))), "closed after");
        assert!(store.secrets.lock().unwrap().is_empty(), "nothing stored outside the window");
        let ok = offer(&v, "s3cret-1", 650).await.unwrap();
        assert_eq!(ok.action, Action::ReplyHeader { name: "X-Hook-Secret", value: "s3cret-1".into() });
        // The same offer again (a lost answer's retry) is answered; another is refused, the first kept.
        assert!(offer(&v, "s3cret-1", 660).await.is_ok());
        assert_eq!(
            offer(&v, "s3cret-2", 660).await,
            Err(VerifyError::HandshakeRefused("a secret is already stored for this endpoint"))
        );
        assert_eq!(store.secrets.lock().unwrap()["ep"], b"s3cret-1");
        // Not a plain value, or the store down: nothing stored, nothing echoed.
        let other = Arc::new(Map::default());
        other.open_window("ep", 700).await.unwrap();
        assert!(matches!(offer(&verifier(&other), "a<b", 650).await, Err(VerifyError::MalformedHeader(_))));
        other.down.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(matches!(offer(&verifier(&other), "s3cret-1", 650).await, Err(VerifyError::Unavailable(_))));
        assert!(other.secrets.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn events_are_verified_with_the_learned_secret_read_again_at_most_every_ten_seconds() {
        let store = Arc::new(Map::default());
        let v = verifier(&store);
        let body = Asana.sample(&serde_json::from_str(r#"{"provider":"asana"}"#).unwrap(), "1201", "task.changed", 100);
        // No secret yet: refused (and the store read once).
        assert_eq!(event(&v, "s1", &body, 100).await, Err(VerifyError::SignatureMismatch));
        // Stored by another container: this one reads it only once RELOAD_SECS have passed.
        store.store_once("ep", &Secret::new("s1")).await.unwrap();
        assert_eq!(event(&v, "s1", &body, 105).await, Err(VerifyError::SignatureMismatch));
        let ok = event(&v, "s1", &body, 110).await.unwrap();
        let Action::Batch(events) = &ok.action else { panic!("{ok:?}") };
        assert_eq!(events[0].event_type.as_deref(), Some("task.changed"));
        assert_eq!(events[0].event_id, payload_hash(&body[events[0].bytes.clone()]));
        assert_eq!(event(&v, "wrong", &body, 111).await, Err(VerifyError::SignatureMismatch));
        let mut tampered = body.clone();
        tampered[20] ^= 1;
        assert_eq!(signed_then_sent(&v, "s1", &body, &tampered, 130).await, Err(VerifyError::SignatureMismatch));
        // A heartbeat is acknowledged.
        let hb = event(&v, "s1", br#"{"events":[]}"#, 112).await.unwrap();
        assert_eq!(hb.action, Action::Acknowledge { what: "a heartbeat" });
    }

    #[tokio::test]
    async fn handshakes_outside_a_window_read_the_store_once_a_bound_and_a_deleted_secret_stops_verifying_within_it() {
        let store = Arc::new(Map::default());
        let v = verifier(&store);
        // A flood of handshake attempts, no window open: one read per bound.
        for t in 100..100 + RELOAD_SECS {
            assert!(matches!(offer(&v, "probe", t).await, Err(VerifyError::HandshakeRefused(_))));
        }
        assert_eq!(store.reads(), 1, "outside a window, handshakes within the bound read nothing");
        assert!(matches!(offer(&v, "probe", 100 + RELOAD_SECS).await, Err(VerifyError::HandshakeRefused(_))));
        assert_eq!(store.reads(), 2);
        // The operator arms it: taken once the closed window read is older than the bound.
        store.open_window("ep", 1_000).await.unwrap();
        let at = 100 + 2 * RELOAD_SECS;
        assert!(offer(&v, "s1", at).await.is_ok());
        let body = Asana.sample(&serde_json::from_str(r#"{"provider":"asana"}"#).unwrap(), "1201", "task.changed", at);
        assert!(event(&v, "s1", &body, at + 1).await.is_ok());
        // Deleted from the store: verified with what was read until the bound, then not.
        store.secrets.lock().unwrap().clear();
        assert!(event(&v, "s1", &body, at + RELOAD_SECS - 1).await.is_ok(), "within the bound");
        assert_eq!(event(&v, "s1", &body, at + RELOAD_SECS).await, Err(VerifyError::SignatureMismatch));
        assert_eq!(event(&v, "s1", &body, at + RELOAD_SECS + 1).await, Err(VerifyError::SignatureMismatch));
        // The store down while a secret is held: kept, the store tried again a bound later.
        let kept = Arc::new(Map::default());
        kept.store_once("ep", &Secret::new("s2")).await.unwrap();
        let v = verifier(&kept);
        assert!(event(&v, "s2", &body, 0).await.is_ok());
        kept.down.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(event(&v, "s2", &body, RELOAD_SECS).await.is_ok(), "a store that cannot answer deletes nothing");
    }

    #[tokio::test]
    async fn configured_secrets_verify_without_a_store() {
        let v = AsanaVerifier::new(vec![Secret::new("kept")], None);
        let body = br#"{"events":[{"action":"added","resource":{"gid":"1","resource_type":"story"}}]}"#;
        let ok = event(&v, "kept", body, 1).await.unwrap();
        assert!(matches!(ok.action, Action::Batch(ref e) if e[0].event_type.as_deref() == Some("story.added")));
        assert!(matches!(offer(&v, "s", 1).await, Err(VerifyError::HandshakeRefused(_))));
        let cx = BuildContext::new(Arc::new(crate::verify::certificates::CertificateCache::new(Arc::new(NoFetch))));
        let spec: EndpointSpec = serde_json::from_str(r#"{"provider":"asana"}"#).unwrap();
        assert!(Asana.verifier(&spec, Vec::new(), &cx).is_err(), "no secret and nowhere to learn one");
    }

    proptest::proptest! {
        /// Random bodies and signatures with a secret held: never accepted, never a panic.
        #[test]
        fn random_deliveries_are_refused(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
                                         signature in "[0-9a-f]{0,80}") {
            let v = AsanaVerifier::new(vec![Secret::new("kept")], None);
            let mut h = HeaderMap::new();
            h.insert(SIGNATURE_HEADER, HeaderValue::from_str(&signature).unwrap());
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let r = rt.block_on(v.verify(Delivery { body: &body, headers: &h, method: &http::Method::POST, query: "" }, 1));
            proptest::prop_assert!(r.is_err(), "{:?}", r);
        }
    }

    struct NoFetch;
    impl crate::verify::certificates::HttpsGet for NoFetch {
        fn get<'a>(
            &'a self,
            _: &'a url::Url,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Vec<u8>, crate::verify::certificates::FetchError>> + Send + 'a>,
        > {
            Box::pin(async { Err(crate::verify::certificates::FetchError::Failed("offline".into())) })
        }
    }
}
