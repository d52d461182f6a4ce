//! The Lambda handler end to end, from real API Gateway v2 request fixtures.

use base64::Engine;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::secret::Secret;
use hookledger::verify::stripe;
use lambda_http::{Body, Context, LambdaEvent};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::{STRIPE_SECRET, Stack, now_s};

const NO_AUTHORIZER: &str = include_str!("../fixtures/apigw/example-apigw-v2-request-no-authorizer.json");
const IAM: &str = include_str!("../fixtures/apigw/example-apigw-v2-request-iam.json");

/// An API Gateway v2 event for `POST /webhooks/{endpoint}` built on a real sample.
fn event(
    fixture: &str,
    method: &str,
    endpoint: &str,
    headers: Value,
    body: &[u8],
    base64: bool,
) -> lambda_http::Request {
    lambda_http::request::from_str(&event_json(fixture, method, endpoint, headers, body, base64).to_string()).unwrap()
}

/// The same event as API Gateway sends it to the function (JSON).
fn event_json(fixture: &str, method: &str, endpoint: &str, headers: Value, body: &[u8], base64: bool) -> Value {
    let mut e: Value = serde_json::from_str(fixture).unwrap();
    let path = format!("/webhooks/{endpoint}");
    e["routeKey"] = json!("POST /webhooks/{endpoint}");
    e["rawPath"] = json!(path);
    e["pathParameters"] = json!({ "endpoint": endpoint });
    e["requestContext"]["http"]["method"] = json!(method);
    e["requestContext"]["http"]["path"] = json!(path);
    e["requestContext"]["routeKey"] = json!("POST /webhooks/{endpoint}");
    let hs = e["headers"].as_object_mut().unwrap();
    hs.insert("content-type".into(), json!("application/json"));
    hs.insert("content-length".into(), json!(body.len().to_string()));
    for (k, v) in headers.as_object().unwrap() {
        hs.insert(k.clone(), v.clone());
    }
    if base64 {
        e["body"] = json!(base64::engine::general_purpose::STANDARD.encode(body));
        e["isBase64Encoded"] = json!(true);
    } else {
        e["body"] = json!(String::from_utf8(body.to_vec()).unwrap());
        e["isBase64Encoded"] = json!(false);
    }
    e
}

/// The function's service on a raw event: (status, body as JSON).
async fn serve(intake: &hookledger::intake::Intake<DynamoLedger, SqsQueue>, e: &Value) -> (i64, Value) {
    let raw = serde_json::value::RawValue::from_string(e.to_string()).unwrap();
    let resp = intake::handler::serve(intake, LambdaEvent::new(raw, Context::default())).await.unwrap();
    let body = match resp.body {
        Some(Body::Text(t)) => serde_json::from_str(&t).unwrap(),
        other => panic!("unexpected body {other:?}"),
    };
    assert_eq!(resp.headers["content-type"], "application/json");
    (resp.status_code, body)
}

fn body_json(resp: &lambda_http::Response<Body>) -> Value {
    match resp.body() {
        Body::Text(t) => serde_json::from_str(t).unwrap(),
        other => panic!("unexpected body {other:?}"),
    }
}

fn signed(id: &str) -> (Vec<u8>, String) {
    let body = json!({"id": id, "object": "event", "type": "invoice.paid", "data": {}}).to_string().into_bytes();
    let sig = stripe::sign(&Secret::new(STRIPE_SECRET), now_s(), &body);
    (body, sig)
}

#[tokio::test]
async fn signed_delivery_is_accepted_then_acknowledged_as_duplicate() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let (body, sig) = signed("evt_apigw");
    for (fixture, expected) in [(NO_AUTHORIZER, 202), (IAM, 200)] {
        let req = event(fixture, "POST", "stripe-a", json!({ "stripe-signature": sig }), &body, false);
        let resp = intake::handler::handle(&intake, req).await.unwrap();
        assert_eq!(resp.status(), expected);
        assert_eq!(resp.headers()["content-type"], "application/json");
    }
    assert_eq!(stack.drain_queue().await.len(), 1);
}

/// A sender that signs its URL (Twilio: the public URL with the query as
/// received, then the sorted form parameters, HMAC-SHA1): the query string
/// of the API Gateway event reaches the verifier.
#[tokio::test]
async fn the_query_string_reaches_a_verifier_that_signs_the_url() {
    use hmac::{KeyInit, Mac};
    let stack = Stack::new().await;
    let endpoints = stack
        .endpoints_from(
            r#"{"tw": {"provider": "hmac", "secrets": ["env:HMAC"], "public_url": "https://hooks.example.com/webhooks/tw",
            "hmac": {"signature_header": "x-twilio-signature", "encoding": "base64", "algorithm": "sha1",
                     "signed_content": "{url}{form_sorted}", "id": {"header": "i-twilio-idempotency-token"}}}}"#,
        )
        .await;
    let intake = hookledger::intake::Intake::new(
        endpoints,
        stack.settings(),
        stack.ledger(),
        SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
    );
    let body = b"CallSid=CA1&From=%2B1555&To=%2B1666";
    let signed = "https://hooks.example.com/webhooks/tw?x=1&y=2CallSidCA1From+1555To+1666";
    let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(crate::support::HMAC_SECRET.as_bytes()).unwrap();
    mac.update(signed.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    for (query, expected) in [("x=1&y=2", 202), ("x=1&y=3", 401), ("", 401)] {
        let mut e = event_json(
            NO_AUTHORIZER,
            "POST",
            "tw",
            json!({"x-twilio-signature": sig, "i-twilio-idempotency-token": "tok-1"}),
            body,
            false,
        );
        e["rawQueryString"] = json!(query);
        let req = lambda_http::request::from_str(&e.to_string()).unwrap();
        let resp = intake::handler::handle(&intake, req).await.unwrap();
        assert_eq!(resp.status(), expected, "query {query:?}: {:?}", body_json(&resp));
    }
}

/// Slack's handshake through the handler on the emulator: answered with
/// its challenge as text (nosniff), nothing written, nothing sent; forged,
/// it is refused and nothing is echoed.
#[tokio::test]
async fn slacks_handshake_is_answered_with_its_challenge_and_writes_nothing() {
    let stack = Stack::new().await;
    let intake = stack.intake_for(r#"{"sl": {"provider": "slack", "secrets": ["env:HMAC"]}}"#).await;
    let slack = hookledger::config::ProviderKind::named("slack").unwrap();
    let spec: hookledger::config::EndpointSpec =
        serde_json::from_value(json!({"provider": "slack", "secrets": ["env:HMAC"]})).unwrap();
    let challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P";
    let body = json!({"token": "t", "challenge": challenge, "type": "url_verification"}).to_string();
    for (secret, status) in [(crate::support::HMAC_SECRET, 200), ("not-the-secret", 401)] {
        let headers = slack.sign(&spec, &Secret::new(secret), "", "", now_s(), body.as_bytes()).unwrap();
        let headers: serde_json::Map<String, Value> = headers.into_iter().map(|(k, v)| (k, json!(v))).collect();
        let e = event_json(NO_AUTHORIZER, "POST", "sl", Value::Object(headers), body.as_bytes(), false);
        let req = lambda_http::request::from_str(&e.to_string()).unwrap();
        let resp = intake::handler::handle(&intake, req).await.unwrap();
        assert_eq!(resp.status(), status);
        assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
        let text = match resp.body() {
            Body::Text(t) => t.clone(),
            other => panic!("{other:?}"),
        };
        if status == 200 {
            assert_eq!(resp.headers()["content-type"], "text/plain; charset=utf-8");
            assert_eq!(text, challenge);
        } else {
            assert!(!text.contains(challenge), "a forged handshake is not echoed: {text}");
        }
    }
    assert!(stack.items().await.is_empty(), "a handshake writes nothing");
    assert!(stack.drain_queue().await.is_empty(), "a handshake sends nothing");
}

/// Meta's GET check through the handler: the challenge with the right
/// verify token, 401 with another; a GET to a POST-only provider is 405.
#[tokio::test]
async fn metas_get_check_is_answered_through_the_handler_and_other_providers_refuse_get() {
    let stack = Stack::new().await;
    let intake = stack
        .intake_for(
            r#"{"m": {"provider": "meta", "secrets": ["env:HMAC"], "verify_token": "env:HMAC"},
                "s": {"provider": "shopify", "secrets": ["env:HMAC"]}}"#,
        )
        .await;
    let token = crate::support::HMAC_SECRET;
    for (endpoint, query, status) in [
        ("m", format!("hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token={token}"), 200),
        ("m", "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=guess".to_owned(), 401),
        ("s", "challenge=1".to_owned(), 405),
    ] {
        let mut e = event_json(NO_AUTHORIZER, "GET", endpoint, json!({}), b"", false);
        e["rawQueryString"] = json!(query);
        let req = lambda_http::request::from_str(&e.to_string()).unwrap();
        let resp = intake::handler::handle(&intake, req).await.unwrap();
        assert_eq!(resp.status(), status, "{endpoint} {query}");
        let text = match resp.body() {
            Body::Text(t) => t.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(text == "1158201444", status == 200, "{endpoint}: {text}");
    }
    assert!(stack.items().await.is_empty(), "a GET check writes nothing");
}

#[tokio::test]
async fn base64_bodies_are_verified_on_the_decoded_raw_bytes() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let (body, sig) = signed("evt_b64");
    let req = event(NO_AUTHORIZER, "POST", "stripe-a", json!({ "stripe-signature": sig }), &body, true);
    let resp = intake::handler::handle(&intake, req).await.unwrap();
    assert_eq!(resp.status(), 202, "{:?}", body_json(&resp));
    let copies = crate::support::payload_copies(&stack.items().await);
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].1, body, "the decoded raw bytes are stored");
}

#[tokio::test]
async fn joined_signature_headers_from_api_gateway_still_verify() {
    // Stripe during a secret roll sends two v1 entries; a second Stripe-Signature
    // header would reach us joined with a comma by API Gateway.
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let (body, sig) = signed("evt_joined");
    let other = stripe::sign(&Secret::new("whsec_retired"), now_s(), &body);
    let joined = format!("{other},{sig}");
    let req = event(NO_AUTHORIZER, "POST", "stripe-a", json!({ "stripe-signature": joined }), &body, false);
    assert_eq!(intake::handler::handle(&intake, req).await.unwrap().status(), 202);
}

#[tokio::test]
async fn rejections_answer_by_retry_intent_with_code_and_detail() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let (body, sig) = signed("evt_rejects");
    let cases = [
        (
            event(NO_AUTHORIZER, "POST", "stripe-a", json!({ "stripe-signature": "t=1,v1=00" }), &body, false),
            401,
            "signature_mismatch",
        ),
        (
            event(NO_AUTHORIZER, "POST", "nope", json!({ "stripe-signature": sig }), &body, false),
            404,
            "unknown_endpoint",
        ),
        (event(NO_AUTHORIZER, "GET", "stripe-a", json!({}), b"", false), 405, "method_not_allowed"),
        (
            event(NO_AUTHORIZER, "POST", "stripe-a", json!({ "stripe-signature": sig }), &vec![b'x'; 20_000], false),
            413,
            "payload_too_large",
        ),
    ];
    for (req, status, code) in cases {
        let resp = intake::handler::handle(&intake, req).await.unwrap();
        let b = body_json(&resp);
        assert_eq!((resp.status().as_u16(), b["code"].as_str().unwrap()), (status, code), "{b}");
        assert!(b["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
    // Signed correctly but not an event: 400, nothing stored.
    let junk = b"[1,2,3]".to_vec();
    let junk_sig = stripe::sign(&Secret::new(STRIPE_SECRET), now_s(), &junk);
    let resp = intake::handler::handle(
        &intake,
        event(NO_AUTHORIZER, "POST", "stripe-a", json!({ "stripe-signature": junk_sig }), &junk, false),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(stack.items().await.is_empty());
    assert!(stack.drain_queue().await.is_empty());
}

#[tokio::test]
async fn the_raw_event_path_accepts_a_delivery_and_refuses_a_body_that_is_not_the_base64_it_claims() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let (body, sig) = signed("evt_raw");
    for (base64, expected) in [(true, 202), (false, 200)] {
        let e = event_json(NO_AUTHORIZER, "POST", "stripe-a", json!({ "stripe-signature": sig }), &body, base64);
        let (status, b) = serve(&intake, &e).await;
        assert_eq!(status, expected, "{b}");
    }
    // lambda_http's own conversion panics on this event (a 500, retried by
    // the sender for days); it is a 400 with a stable code.
    let mut e = event_json(NO_AUTHORIZER, "POST", "stripe-a", json!({ "stripe-signature": sig }), &body, true);
    e["body"] = json!("%%% not base64 %%%");
    assert!(intake::handler::body_not_base64(&e.to_string()));
    let raw = e.to_string();
    assert!(std::panic::catch_unwind(|| lambda_http::request::from_str(&raw)).is_err(), "lambda_http panics on it");
    let (status, b) = serve(&intake, &e).await;
    assert_eq!((status, b["code"].as_str()), (400, Some("body_not_base64")), "{b}");
    assert_eq!(stack.meta_items().await.len(), 1, "nothing recorded for the refused event");
}

/// An event that is not from API Gateway fails the invocation with a named
/// `errorType`, and its message quotes nothing of the event.
#[tokio::test]
async fn an_event_that_is_not_from_api_gateway_fails_as_hookledger_bad_event() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let raw = serde_json::value::RawValue::from_string(r#""whsec_planted""#.to_owned()).unwrap();
    let err = intake::handler::serve(&intake, LambdaEvent::new(raw, Context::default())).await.unwrap_err();
    let d: lambda_runtime::Diagnostic = err.into();
    assert_eq!(d.error_type, "Hookledger.BadEvent", "{}", d.error_message);
    assert!(!d.error_message.contains("whsec_planted"), "{}", d.error_message);
    assert!(stack.meta_items().await.is_empty());
}

/// Random API Gateway events (headers joined or split, bodies, base64 flags
/// true or false with valid or invalid base64, endpoints, methods) through
/// the function's raw-event service: no panic, and every refusal is a 4xx
/// with a stable code. 256 cases.
#[test]
fn random_api_gateway_events_are_answered_4xx_with_a_stable_code_never_a_panic() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (stack, intake) = rt.block_on(async {
        let stack = Stack::new().await;
        let intake = stack.intake().await;
        (stack, intake)
    });
    let header_names = prop::sample::select(vec![
        "stripe-signature",
        "x-hub-signature-256",
        "x-github-delivery",
        "x-github-event",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "x-amz-sns-message-type",
        "quiltt-signature",
        "quiltt-timestamp",
        "content-type",
    ]);
    let value = prop_oneof![
        "[ -~]{0,40}",
        "t=[0-9]{1,12},v1=[0-9a-f]{0,64}(,v1=[0-9a-f]{0,64})?",
        "v1,[A-Za-z0-9+/=]{0,60}( v1,[A-Za-z0-9+/=]{0,60})?",
        "sha256=[0-9a-f]{0,64}",
        Just("Notification".to_owned()),
    ];
    let endpoint = prop::sample::select(vec!["stripe-a", "gh", "svix", "ses", "quiltt", "nope", ""]);
    let method = prop::sample::select(vec!["POST", "POST", "POST", "GET", "PUT"]);
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        "\\{\"(id|type|Type|eventId)\": ?\"[a-z_.]{0,12}\"(, ?\"data\": ?\\{\\})?\\}".prop_map(String::into_bytes),
    ];
    // (flag, how the body is put in the event: 0 plain text, 1 valid base64, 2 invalid base64)
    let encoding = (any::<bool>(), 0u8..3);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 256, ..ProptestConfig::default() });
    runner
        .run(
            &(endpoint, method, prop::collection::vec((header_names, value), 0..6), body, encoding),
            |(endpoint, method, headers, body, (flag, how))| {
                let mut hs = serde_json::Map::new();
                for (k, v) in headers {
                    // A repeated header reaches the function joined with a comma.
                    let joined = match hs.get(k) {
                        Some(Value::String(old)) => format!("{old},{v}"),
                        _ => v,
                    };
                    hs.insert(k.to_owned(), json!(joined));
                }
                let mut e = event_json(NO_AUTHORIZER, method, endpoint, Value::Object(hs), b"", false);
                e["isBase64Encoded"] = json!(flag);
                e["body"] = match how {
                    0 => json!(String::from_utf8_lossy(&body)),
                    1 => json!(base64::engine::general_purpose::STANDARD.encode(&body)),
                    _ => json!(format!("{}%", base64::engine::general_purpose::STANDARD.encode(&body))),
                };
                let (status, b) = rt.block_on(serve(&intake, &e));
                prop_assert!((400..500).contains(&status), "{status} {b}");
                let code = b["code"].as_str().unwrap_or_default();
                prop_assert!(
                    !code.is_empty() && code.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                    "{b}"
                );
                Ok(())
            },
        )
        .unwrap();
    assert!(rt.block_on(stack.meta_items()).is_empty(), "no random event is recorded");
}
