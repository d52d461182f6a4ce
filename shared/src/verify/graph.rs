//! Microsoft Graph change notifications (webhooks).
//!
//! Graph signs nothing. A subscription names a `clientState`, a secret of
//! the subscriber's that Graph puts in every notification: each
//! notification of a delivery must carry one of the endpoint's secrets
//! (compared in constant time), or the whole delivery is refused. A
//! delivery is a batch (`{"value": [...]}`); each notification is an event
//! of its own, identified by the SHA-256 of its bytes (Graph gives a
//! notification no id; its retries repeat the same bytes), its type its
//! `changeType` (`created`, `updated`, `deleted`) or, for a lifecycle
//! notification, its `lifecycleEvent`. An empty batch is acknowledged. A
//! notification that carries no per-change field (`resourceData.@odata.etag`,
//! `encryptedContent`) repeats its bytes for every later change of its
//! resource: it is claimed by generation (`Provider::notification`).
//!
//! Creating a subscription, Graph POSTs `?validationToken=…` (no body) and
//! needs the token back, decoded, as `text/plain` within 10 s. The request
//! is unauthenticated, so only a token of [`graph_echoable`] characters is
//! echoed: Graph's tokens are sentences ("Validation: Testing client
//! application reachability for subscription Request-Id: …"), with spaces
//! and colons that the stricter pattern of the other echoes refuses.
//! Rich notifications (`encryptedContent`, with `validationTokens` JWTs)
//! are not supported: their notifications are recorded as they are,
//! authenticated by `clientState` alone.

use std::ops::Range;

use super::elements::{elements, hashed_events, text_at};
use super::generic::same_secret;
use super::provider::{
    BuildContext, Contract, Delivery, EndpointSpec, Handshake, HandshakeAnswer, HandshakeInput, Identity, Provider,
    Replay, SuccessAnswer, Verifier, Verifying, no_sections, ready,
};
use super::{Action, BatchEvent, Content, Verified, VerifyError, json};
use crate::identity::payload_hash;
use crate::secret::Secret;

/// The query parameter of Graph's validation request.
pub const VALIDATION_PARAM: &str = "validationToken";

/// The longest validation token echoed.
pub const MAX_TOKEN_LEN: usize = 512;

/// Whether Graph's validation token may be echoed: 1 to [`MAX_TOKEN_LEN`]
/// letters, digits, spaces and `._~-:/+=` (no markup, quotes, `&` or
/// control characters); sent as `text/plain` with `nosniff`.
pub fn graph_echoable(v: &str) -> bool {
    (1..=MAX_TOKEN_LEN).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b" ._~-:/+=".contains(&b))
}

pub struct GraphVerifier {
    client_states: Vec<Secret>,
}

impl GraphVerifier {
    pub fn new(client_states: Vec<Secret>) -> Self {
        Self { client_states }
    }

    pub fn verify(&self, d: &Delivery<'_>) -> Result<Verified, VerifyError> {
        let tokens: Vec<String> = url::form_urlencoded::parse(d.query.as_bytes())
            .filter(|(k, _)| k == VALIDATION_PARAM)
            .map(|(_, v)| v.into_owned())
            .collect();
        match tokens.as_slice() {
            [] => {}
            [token] => return validation(token),
            _ => return Err(VerifyError::MalformedPayload("more than one validationToken")),
        }
        let events = notifications(d.body)?;
        // Every notification must carry one of the endpoint's client states.
        for (range, state) in &events {
            let state = state.as_ref().and_then(|r| json::string_at(&d.body[range.clone()], r));
            let Some(state) = state else { return Err(VerifyError::SignatureMismatch) };
            if !self.client_states.iter().any(|s| same_secret(s.expose(), state.as_bytes())) {
                return Err(VerifyError::SignatureMismatch);
            }
        }
        if events.is_empty() {
            return Ok(Verified {
                event_id: String::new(),
                event_type: None,
                action: Action::Acknowledge { what: "an empty batch" },
                content: Content::Bytes,
            });
        }
        let batch = identify(d.body, &events)?;
        let first = batch.first().map(|e| e.event_id.clone()).unwrap_or_default();
        Ok(Verified { action: Action::Batch(batch), ..Verified::record(first, None) })
    }
}

/// Graph's validation request: its token echoed, if it is one to echo.
fn validation(token: &str) -> Result<Verified, VerifyError> {
    if !graph_echoable(token) {
        return Err(VerifyError::MalformedPayload("the validation token is not a value to echo"));
    }
    Ok(Verified {
        event_id: String::new(),
        event_type: Some("validation".into()),
        action: Action::Reply { content_type: "text/plain; charset=utf-8", body: token.to_owned() },
        content: Content::Bytes,
    })
}

/// Each notification's bytes, and where its `clientState` is in them.
type Notifications = Vec<(Range<usize>, Option<Range<usize>>)>;

fn notifications(body: &[u8]) -> Result<Notifications, VerifyError> {
    Ok(elements(body, "/value")?
        .into_iter()
        .map(|r| {
            let [state] = json::pointers(&body[r.clone()], [Some("/clientState")]);
            (r, state)
        })
        .collect())
}

/// The events of an authenticated delivery: each notification's hash, type
/// (its `lifecycleEvent`, else its `changeType`) and bytes.
fn identify(body: &[u8], events: &Notifications) -> Result<Vec<BatchEvent>, VerifyError> {
    let ranges: Vec<Range<usize>> = events.iter().map(|(r, _)| r.clone()).collect();
    hashed_events(body, &ranges, |b| text_at(b, "/lifecycleEvent").or_else(|| text_at(b, "/changeType")))
}

impl Verifier for GraphVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, _now_s: i64) -> Verifying<'a> {
        ready(GraphVerifier::verify(self, &d))
    }
}

/// Microsoft Graph, as a provider.
pub struct MicrosoftGraph;

const SAMPLE: &str = r##"{"value":[{"subscriptionId":"7f105c7d-2dc5-4530-97cd-4e7ae6534c07","subscriptionExpirationDateTime":"2026-12-05T11:00:00.0000000Z","changeType":"{{type}}","resource":"Users/{{id}}/Messages/AAMkADFhMWM5","resourceData":{"@odata.type":"#Microsoft.Graph.Message","@odata.id":"Users/{{id}}/Messages/AAMkADFhMWM5","@odata.etag":"W/\"CQAAABYAAADkrWGo7bouTKlsgTZMr9KOAAAUWRHf\"","id":"AAMkADFhMWM5"},"clientState":"","tenantId":"84bd8158-6d4d-4958-8b9f-9d6445542f95"}]}"##;

impl Provider for MicrosoftGraph {
    fn name(&self) -> &'static str {
        "microsoft_graph"
    }

    /// A notification names what changed, with no id; one that carries
    /// the resource's version (`resourceData.@odata.etag`, Outlook's change
    /// key) or its encrypted state (`encryptedContent`, a rich notification)
    /// is one change's; any other (OneDrive's, Teams', a lifecycle event)
    /// repeats its bytes for each later change: a notification.
    fn identity(&self) -> Identity {
        Identity { contract: Contract::PerElement, replay: Replay::Signed }
    }

    fn notification(&self, event: &[u8]) -> bool {
        let [etag, state] = json::pointers(event, [Some("/resourceData/@odata.etag"), Some("/encryptedContent")]);
        etag.is_none() && state.is_none()
    }

    fn repeats(&self) -> bool {
        true
    }

    /// Graph wants a 2xx within 3 s (202 Accepted is what its documentation shows).
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
    }

    fn summary(&self) -> &'static str {
        "no signature: each notification's clientState equals one of the endpoint's secrets (constant time); value[] a batch, each notification identified by its hash; ?validationToken= echoed as text"
    }

    fn options(&self) -> String {
        String::new()
    }

    fn validate(&self, spec: &EndpointSpec) -> Result<(), String> {
        no_sections(self.name(), spec)?;
        if spec.tolerance_secs.is_some() {
            return Err("microsoft_graph signs no timestamp: tolerance_secs does not apply".into());
        }
        Ok(())
    }

    fn verifier(&self, _: &EndpointSpec, secrets: Vec<Secret>, _: &BuildContext) -> Result<Box<dyn Verifier>, String> {
        Ok(Box::new(GraphVerifier::new(secrets)))
    }

    fn sample(&self, _: &EndpointSpec, event_id: &str, event_type: &str, _now_s: i64) -> Vec<u8> {
        SAMPLE.replace("{{id}}", event_id).replace("{{type}}", event_type).into_bytes()
    }

    /// Graph puts the client state in each notification: every empty one is filled.
    fn seal(&self, _: &EndpointSpec, secret: &Secret, _now_s: i64, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let state = std::str::from_utf8(secret.expose()).map_err(|_| "the client state is not text".to_owned())?;
        let quoted = serde_json::to_string(state).map_err(|e| e.to_string())?;
        let text = String::from_utf8(body).map_err(|_| "the body is not text".to_owned())?;
        Ok(text.replace(r#""clientState":"""#, &format!(r#""clientState":{quoted}"#)).into_bytes())
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
        Ok(Vec::new())
    }

    fn split(&self, payload: &[u8]) -> Option<Result<Vec<BatchEvent>, VerifyError>> {
        Some(notifications(payload).and_then(|n| identify(payload, &n)))
    }

    fn content_hash(&self, body: &[u8]) -> String {
        payload_hash(body)
    }

    fn handshakes(&self, hs: HandshakeInput<'_>) -> Result<Vec<Handshake>, String> {
        let token =
            format!("Validation: Testing client application reachability for subscription Request-Id: {}", hs.nonce);
        let query: String =
            url::form_urlencoded::Serializer::new(String::new()).append_pair(VALIDATION_PARAM, &token).finish();
        Ok(vec![Handshake {
            name: "validationToken",
            method: http::Method::POST,
            query,
            headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
            body: Vec::new(),
            expect: HandshakeAnswer {
                status: 200,
                content_type: Some("text/plain; charset=utf-8"),
                body: token,
                header: None,
            },
        }])
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn deliver(v: &GraphVerifier, query: &str, body: &[u8]) -> Result<Verified, VerifyError> {
        let headers = HeaderMap::new();
        v.verify(&Delivery { body, headers: &headers, method: &http::Method::POST, query })
    }

    fn verifier() -> GraphVerifier {
        GraphVerifier::new(vec![Secret::new("old-state"), Secret::new("client-state-1")])
    }

    fn body(states: &[&str]) -> Vec<u8> {
        let items: Vec<String> = states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                format!(r#"{{"subscriptionId":"s1","changeType":"updated","resource":"Users/u/Messages/m{i}","clientState":"{s}"}}"#)
            })
            .collect();
        format!(r#"{{"value":[{}]}}"#, items.join(",")).into_bytes()
    }

    #[test]
    fn the_validation_token_is_echoed_decoded_as_graph_sends_it() {
        let q = "validationToken=Validation%3A+Testing+client+application+reachability+for+subscription+Request-Id%3A+522a8e7e-096a-494c-aaf1-ac0dcfca45b7";
        let v = deliver(&verifier(), q, b"").unwrap();
        assert_eq!(
            v.action,
            Action::Reply {
                content_type: "text/plain; charset=utf-8",
                body: "Validation: Testing client application reachability for subscription Request-Id: 522a8e7e-096a-494c-aaf1-ac0dcfca45b7".into()
            }
        );
    }

    #[test]
    fn a_token_with_markup_or_twice_is_not_echoed() {
        for q in [
            "validationToken=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
            "validationToken=a%26b",
            "validationToken=",
            "validationToken=a&validationToken=b",
            "validationToken=a%0Ab",
        ] {
            assert!(matches!(deliver(&verifier(), q, b""), Err(VerifyError::MalformedPayload(_))), "{q}");
        }
        assert!(!graph_echoable(&"a".repeat(MAX_TOKEN_LEN + 1)));
    }

    #[test]
    fn each_notification_must_carry_a_client_state_of_the_endpoint() {
        let v = deliver(&verifier(), "", &body(&["client-state-1", "old-state"])).unwrap();
        let Action::Batch(events) = &v.action else { panic!("{v:?}") };
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].event_type.as_deref(), Some("updated"));
        assert_eq!(events[0].event_id.len(), 64);
        assert_ne!(events[0].event_id, events[1].event_id);
        for states in [&["client-state-1", "forged"][..], &["client-state-2"], &["CLIENT-STATE-1"]] {
            assert_eq!(deliver(&verifier(), "", &body(states)), Err(VerifyError::SignatureMismatch), "{states:?}");
        }
        let no_state = br#"{"value":[{"subscriptionId":"s1","changeType":"created"}]}"#;
        assert_eq!(deliver(&verifier(), "", no_state), Err(VerifyError::SignatureMismatch));
    }

    #[test]
    fn an_empty_batch_is_acknowledged_and_malformed_ones_refused() {
        let v = deliver(&verifier(), "", br#"{"value":[]}"#).unwrap();
        assert_eq!(v.action, Action::Acknowledge { what: "an empty batch" });
        for bad in [&b"not json"[..], br#"{"value":{}}"#, br#"{"other":[]}"#, b"[]"] {
            assert!(matches!(deliver(&verifier(), "", bad), Err(VerifyError::MalformedPayload(_))), "{bad:?}");
        }
        let lifecycle = br#"{"value":[{"subscriptionId":"s1","lifecycleEvent":"reauthorizationRequired","clientState":"old-state"}]}"#;
        let v = deliver(&verifier(), "", lifecycle).unwrap();
        let Action::Batch(events) = &v.action else { panic!("{v:?}") };
        assert_eq!(events[0].event_type.as_deref(), Some("reauthorizationRequired"));
    }

    proptest::proptest! {
        /// Random bodies and queries: never an event, never a panic; an echo
        /// only of a value within Graph's pattern.
        #[test]
        fn random_deliveries_record_nothing(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
                                            query in "[ -~]{0,80}") {
            match deliver(&verifier(), &query, &body) {
                Ok(Verified { action: Action::Reply { body: echoed, .. }, .. }) => proptest::prop_assert!(graph_echoable(&echoed)),
                Ok(v) => proptest::prop_assert!(matches!(v.action, Action::Acknowledge { .. }), "{:?}", v),
                Err(_) => {}
            }
        }
    }

    #[test]
    fn the_tool_fills_the_client_state_of_its_sample() {
        let spec: EndpointSpec = serde_json::from_str(r#"{"provider":"microsoft_graph","secrets":["env:A"]}"#).unwrap();
        let body = MicrosoftGraph.sample(&spec, "u1", "created", 0);
        let sealed = MicrosoftGraph.seal(&spec, &Secret::new("client-state-1"), 0, body).unwrap();
        let v = deliver(&verifier(), "", &sealed).unwrap();
        assert!(matches!(v.action, Action::Batch(ref e) if e.len() == 1));
        assert_eq!(MicrosoftGraph.split(&sealed).unwrap().unwrap()[0].event_id, v.event_id);
    }
}
