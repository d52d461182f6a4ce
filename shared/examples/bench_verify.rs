//! Verifier cost per request, as JSON: `cargo run --release -p hookledger --example bench_verify`.
//!
//! Each verifier checks a valid signed request (and, where it matters, a
//! forged one) `ITERATIONS` times per round; the figure is the median over
//! `ROUNDS` rounds of the mean time per call. SNS is measured with the
//! certificate cached (the warm-container case) and with parsing the
//! certificate every call (cold start).
//!
//! The `*_verify_identify_ns` figures are the whole per-request path the
//! intake runs for a valid delivery before its first AWS call: the verifier
//! (signature, timestamp, event identity and type) and
//! [`hookledger::intake::new_event`] (ledger key, payload and content hashes,
//! index shard, send lease), one active secret.

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use hookledger::config::{Endpoint, ProviderKind, Settings, settings_from};
use hookledger::intake::new_event;
use hookledger::secret::Secret;
use hookledger::verify::Action;
use hookledger::verify::generic::{GenericHmacConfig, GenericHmacVerifier};
use hookledger::verify::provider::{BuildContext, Delivery, EndpointSpec, Provider, Verifier};
use hookledger::verify::sns::{CertificateCache, FetchError, HttpsGet, SnsMessage, SnsVerifier, signing};
use hookledger::verify::{Verified, VerifyError, github, standard, stripe};
use http::{HeaderMap, HeaderValue};

const ROUNDS: usize = 7;

/// Calls per round (`BENCH_ITERATIONS`, default 2000).
fn iterations() -> u32 {
    std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
}

fn median_ns(mut f: impl FnMut()) -> f64 {
    let n = iterations();
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

/// Verification followed by what the intake computes before its first AWS call.
fn verify_identify(
    endpoint: &Endpoint,
    settings: &Settings,
    body: &[u8],
    verify: impl Fn() -> Result<Verified, VerifyError>,
) -> f64 {
    let now = std::time::SystemTime::now();
    median_ns(|| {
        let verified = verify().unwrap();
        std::hint::black_box(new_event(endpoint, settings, &verified, body, now, uuid::Uuid::new_v4().to_string()));
    })
}

fn endpoint(provider: ProviderKind, verifier: Box<dyn Verifier>) -> Endpoint {
    Endpoint {
        name: "bench".into(),
        tenant: "bench".into(),
        provider,
        verifier,
        payload: Default::default(),
        erasable: false,
    }
}

/// A body in the preset's shape (its `hookledger send` sample), padded to `len` bytes.
fn preset_body(p: &dyn Provider, spec: &EndpointSpec, len: usize, now: i64) -> Vec<u8> {
    let sample = String::from_utf8(p.sample(spec, "0f8fad5bd9cb469fa16570867728950e", "bench.event", now)).unwrap();
    let pad = "x".repeat(len.saturating_sub(sample.len() + 12));
    let padded = if let Some(head) = sample.strip_suffix("}]") {
        format!("{head},\"note\":\"{pad}\"}}]")
    } else if let Some(head) = sample.strip_suffix('}') {
        format!("{head},\"note\":\"{pad}\"}}")
    } else {
        format!("{sample}&Note={pad}")
    };
    padded.into_bytes()
}

/// Every preset's verify + identify for a body of `len` bytes in its shape.
fn presets(settings: &Settings, len: usize, now: i64) -> serde_json::Map<String, serde_json::Value> {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let cx = BuildContext::new(Arc::new(CertificateCache::new(Arc::new(Pem(Vec::new())))));
    let mut out = serde_json::Map::new();
    for p in hookledger::verify::registry::providers()
        .filter(|p| p.options() != "hmac (required), public_url, tolerance_secs")
    {
        let is_preset = hookledger::verify::presets::PRESETS.iter().any(|x| x.name == p.name())
            || hookledger::verify::presets::ALIASES.iter().any(|x| x.name == p.name());
        if !is_preset {
            continue;
        }
        let mut spec = serde_json::json!({"provider": p.name(), "secrets": ["env:A"]});
        if p.options().contains("public_url") {
            spec["public_url"] = "https://hooks.example.com/webhooks/bench".into();
        }
        let spec: EndpointSpec = serde_json::from_value(spec).unwrap();
        let secret = Secret::new(if p.name() == "clerk" || p.name() == "resend" {
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        } else {
            "preset-bench"
        });
        let body = p.seal(&spec, &secret, now, preset_body(p, &spec, len, now)).unwrap();
        let mut h = HeaderMap::new();
        for (k, v) in p.sign(&spec, &secret, "0f8fad5bd9cb469fa16570867728950e", "bench.event", now, &body).unwrap() {
            h.append(
                http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).unwrap(),
                HeaderValue::from_str(&v).unwrap(),
            );
        }
        let v = p.verifier(&spec, vec![secret.clone()], &cx).unwrap();
        let kind = ProviderKind::named(p.name()).unwrap();
        let ep = endpoint(kind, p.verifier(&spec, vec![secret], &cx).unwrap());
        let post = http::Method::POST;
        let d = Delivery { body: &body, headers: &h, method: &post, query: "" };
        let stamp = std::time::SystemTime::now();
        let ns = median_ns(|| {
            let verified = rt.block_on(v.verify(d, now)).unwrap();
            match &verified.action {
                Action::Batch(events) => {
                    for e in events {
                        let bytes = &body[e.bytes.clone()];
                        let one = Verified {
                            content: e.content.clone(),
                            ..Verified::record(e.event_id.clone(), e.event_type.clone())
                        };
                        std::hint::black_box(new_event(
                            &ep,
                            settings,
                            &one,
                            bytes,
                            stamp,
                            uuid::Uuid::new_v4().to_string(),
                        ));
                    }
                }
                _ => {
                    std::hint::black_box(new_event(
                        &ep,
                        settings,
                        &verified,
                        &body,
                        stamp,
                        uuid::Uuid::new_v4().to_string(),
                    ));
                }
            }
        });
        out.insert(p.name().into(), ns.into());
    }
    out
}

struct Pem(Vec<u8>);

impl HttpsGet for Pem {
    fn get<'a>(&'a self, _url: &'a url::Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        Box::pin(async move { Ok(self.0.clone()) })
    }
}

fn main() {
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/providers/stripe/events/customer.subscription.updated.json"
    ))
    .expect("fixture");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64;
    let mut out = serde_json::Map::new();
    out.insert("body_bytes".into(), body.len().into());
    let settings = settings_from(|name| match name {
        "HOOKLEDGER_TABLE" => Some("bench".into()),
        "HOOKLEDGER_QUEUE_URL" => Some("https://sqs.invalid/bench".into()),
        _ => None,
    })
    .unwrap();

    let sv = stripe::StripeVerifier::new(vec![Secret::new("whsec_bench")], 300);
    let mut h = HeaderMap::new();
    h.insert(
        stripe::SIGNATURE_HEADER,
        HeaderValue::from_str(&stripe::sign(&Secret::new("whsec_bench"), now, &body)).unwrap(),
    );
    out.insert("stripe_valid_ns".into(), median_ns(|| assert!(sv.verify(&body, &h, now).is_ok())).into());
    let ep = endpoint(ProviderKind::STRIPE, Box::new(sv.clone()));
    out.insert(
        "stripe_verify_identify_ns".into(),
        verify_identify(&ep, &settings, &body, || sv.verify(&body, &h, now)).into(),
    );
    // The `redact` payload policy on the same body, after verification:
    // three pointers (a member, a map, a field of every item).
    let policy: hookledger::redaction::PayloadPolicy = serde_json::from_value(serde_json::json!({
        "policy": "redact", "remove": ["/data/object/default_payment_method", "/data/object/metadata"],
        "mask": ["/data/object/items/data/*/price/id"]}))
    .unwrap();
    out.insert(
        "stripe_redact_ns".into(),
        median_ns(|| {
            std::hint::black_box(policy.apply(&body).unwrap());
        })
        .into(),
    );
    let mut forged = HeaderMap::new();
    forged.insert(
        stripe::SIGNATURE_HEADER,
        HeaderValue::from_str(&stripe::sign(&Secret::new("other"), now, &body)).unwrap(),
    );
    out.insert("stripe_forged_ns".into(), median_ns(|| assert!(sv.verify(&body, &forged, now).is_err())).into());

    let gv = github::GithubVerifier::new(vec![Secret::new("gh")]);
    let mut h = HeaderMap::new();
    h.insert(github::SIGNATURE_HEADER, HeaderValue::from_str(&github::sign(&Secret::new("gh"), &body)).unwrap());
    h.insert(github::DELIVERY_HEADER, HeaderValue::from_static("72d3162e-cc78-11e3-81ab-4c9367dc0958"));
    h.insert(github::EVENT_HEADER, HeaderValue::from_static("customer.subscription.updated"));
    out.insert("github_valid_ns".into(), median_ns(|| assert!(gv.verify(&body, &h).is_ok())).into());
    let ep = endpoint(ProviderKind::GITHUB, Box::new(gv.clone()));
    out.insert(
        "github_verify_identify_ns".into(),
        verify_identify(&ep, &settings, &body, || gv.verify(&body, &h)).into(),
    );

    let key = Secret::new(b"standard-webhooks-key".to_vec());
    let wv = standard::StandardWebhooksVerifier::new(vec![key.clone()], 300);
    let mut h = HeaderMap::new();
    h.insert("webhook-id", HeaderValue::from_static("msg_bench"));
    h.insert("webhook-timestamp", HeaderValue::from_str(&now.to_string()).unwrap());
    h.insert("webhook-signature", HeaderValue::from_str(&standard::sign(&key, "msg_bench", now, &body)).unwrap());
    out.insert("standard_webhooks_valid_ns".into(), median_ns(|| assert!(wv.verify(&body, &h, now).is_ok())).into());
    let ep = endpoint(ProviderKind::STANDARD_WEBHOOKS, Box::new(wv.clone()));
    out.insert(
        "standard_webhooks_verify_identify_ns".into(),
        verify_identify(&ep, &settings, &body, || wv.verify(&body, &h, now)).into(),
    );

    // Generic HMAC with a signed timestamp and the identity read from the body.
    let spec: hookledger::verify::provider::HmacSpec = serde_json::from_value(serde_json::json!({
        "signature_header": "x-bench-signature", "prefix": "sha256=", "encoding": "hex",
        "timestamp_header": "x-bench-timestamp", "signed_content": "{timestamp}.{body}",
        "id": {"json_pointer": "/id"}, "type": {"json_pointer": "/type"}}))
    .unwrap();
    let config = GenericHmacConfig::from_spec(&spec, 300, None).unwrap();
    let secret = Secret::new("hmac-bench");
    let mut h = HeaderMap::new();
    h.insert(
        "x-bench-signature",
        HeaderValue::from_str(&hookledger::verify::generic::sign(&config, &secret, now, &body)).unwrap(),
    );
    h.insert("x-bench-timestamp", HeaderValue::from_str(&now.to_string()).unwrap());
    let hv = GenericHmacVerifier::new(config, vec![secret]).unwrap();
    out.insert("hmac_valid_ns".into(), median_ns(|| assert!(hv.verify(&body, &h, now).is_ok())).into());
    let ep = endpoint(ProviderKind::HMAC, Box::new(hv.clone()));
    out.insert(
        "hmac_verify_identify_ns".into(),
        verify_identify(&ep, &settings, &body, || hv.verify(&body, &h, now)).into(),
    );

    // The generic verifier's other algorithms, a `t=…,v1=…` list, and
    // Twilio's form canonicalisation (a 4.7 KB form body, the URL signed).
    let generic_cases = [
        (
            "hmac_sha1_verify_identify_ns",
            serde_json::json!({"signature_header": "x-s", "encoding": "hex", "algorithm": "sha1", "id": {"json_pointer": "/id"}}),
        ),
        (
            "hmac_sha512_verify_identify_ns",
            serde_json::json!({"signature_header": "x-s", "encoding": "hex", "algorithm": "sha512", "id": {"json_pointer": "/id"}}),
        ),
        (
            "hmac_list_verify_identify_ns",
            serde_json::json!({"signature_header": "x-s", "encoding": "hex", "list": {"signature": "v1", "timestamp": "t"}, "signed_content": "{timestamp}.{body}", "id": {"json_pointer": "/id"}}),
        ),
    ];
    for (name, section) in generic_cases {
        let spec: hookledger::verify::provider::HmacSpec = serde_json::from_value(section).unwrap();
        let config = GenericHmacConfig::from_spec(&spec, 300, None).unwrap();
        let secret = Secret::new("hmac-bench");
        let mut h = HeaderMap::new();
        for (k, v) in hookledger::verify::generic::sign_headers(&config, &secret, now, &body, &[]).unwrap() {
            h.insert(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(&v).unwrap());
        }
        let v = GenericHmacVerifier::new(config, vec![secret]).unwrap();
        let ep = endpoint(ProviderKind::HMAC, Box::new(v.clone()));
        out.insert(name.into(), verify_identify(&ep, &settings, &body, || v.verify(&body, &h, now)).into());
    }
    let form: String = (0..body.len() / 24).map(|i| format!("Param{i:04}=value%2B{i:08}&")).collect();
    let form = form.trim_end_matches('&').as_bytes().to_vec();
    let spec: hookledger::verify::provider::HmacSpec = serde_json::from_value(serde_json::json!({
        "signature_header": "x-twilio-signature", "encoding": "base64", "algorithm": "sha1",
        "signed_content": "{url}{form_sorted}", "id": "body_hash"}))
    .unwrap();
    let config = GenericHmacConfig::from_spec(&spec, 300, Some("https://hooks.example.com/webhooks/tw")).unwrap();
    let secret = Secret::new("twilio-bench");
    let mut h = HeaderMap::new();
    for (k, v) in hookledger::verify::generic::sign_headers(&config, &secret, now, &form, &[]).unwrap() {
        h.insert(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(&v).unwrap());
    }
    let tv = GenericHmacVerifier::new(config, vec![secret]).unwrap();
    let ep = endpoint(ProviderKind::HMAC, Box::new(tv.clone()));
    out.insert("twilio_form_bytes".into(), form.len().into());
    out.insert(
        "twilio_form_sorted_verify_identify_ns".into(),
        verify_identify(&ep, &settings, &form, || tv.verify(&form, &h, now)).into(),
    );

    out.insert("presets_verify_identify_ns".into(), presets(&settings, body.len(), now).into());

    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/test-sns");
    let pem = std::fs::read(format!("{dir}/SimpleNotificationService-0000test0000.pem")).expect("test cert");
    let key_pem = std::fs::read_to_string(format!("{dir}/test-signing-key.pem")).expect("test key");
    let mut msg = SnsMessage {
        kind: "Notification".into(),
        message_id: "bench".into(),
        topic_arn: "arn:aws:sns:eu-west-1:123456789012:bench".into(),
        message: String::from_utf8_lossy(&body).into_owned(),
        timestamp: signing::timestamp(now),
        signature_version: "2".into(),
        signature: String::new(),
        signing_cert_url: "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0000test0000.pem".into(),
        subject: None,
        token: None,
        subscribe_url: None,
    };
    signing::sign(&mut msg, &key_pem).expect("sign");
    let sns_body = serde_json::to_vec(&msg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let warm =
        SnsVerifier::new(vec![msg.topic_arn.clone()], Arc::new(CertificateCache::new(Arc::new(Pem(pem.clone())))));
    let empty = HeaderMap::new();
    out.insert(
        "sns_v2_cached_cert_ns".into(),
        median_ns(|| assert!(rt.block_on(warm.verify(&sns_body, &empty, now)).is_ok())).into(),
    );
    out.insert(
        "sns_v2_cold_cert_ns".into(),
        median_ns(|| {
            let cold = SnsVerifier::new(
                vec![msg.topic_arn.clone()],
                Arc::new(CertificateCache::new(Arc::new(Pem(pem.clone())))),
            );
            assert!(rt.block_on(cold.verify(&sns_body, &empty, now)).is_ok());
        })
        .into(),
    );
    out.insert("iterations_per_round".into(), iterations().into());
    out.insert("rounds".into(), ROUNDS.into());
    println!("{}", serde_json::Value::Object(out));
}
