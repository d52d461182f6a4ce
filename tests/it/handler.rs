//! The Lambda handler end to end, from real API Gateway v2 request fixtures.

use base64::Engine;
use hookledger::secret::Secret;
use hookledger::verify::stripe;
use lambda_http::Body;
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
    lambda_http::request::from_str(&e.to_string()).unwrap()
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
