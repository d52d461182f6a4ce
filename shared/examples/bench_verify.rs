//! Verifier cost per request, as JSON: `cargo run --release -p hookledger --example bench_verify`.
//!
//! Each verifier checks a valid signed request (and, where it matters, a
//! forged one) `ITERATIONS` times per round; the figure is the median over
//! `ROUNDS` rounds of the mean time per call. SNS is measured with the
//! certificate cached (the warm-container case) and with parsing the
//! certificate every call (cold start).

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use hookledger::secret::Secret;
use hookledger::verify::sns::{CertificateCache, FetchError, HttpsGet, SnsMessage, SnsVerifier, signing};
use hookledger::verify::{github, standard, stripe};
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

    let sv = stripe::StripeVerifier::new(vec![Secret::new("whsec_bench")], 300);
    let mut h = HeaderMap::new();
    h.insert(
        stripe::SIGNATURE_HEADER,
        HeaderValue::from_str(&stripe::sign(&Secret::new("whsec_bench"), now, &body)).unwrap(),
    );
    out.insert("stripe_valid_ns".into(), median_ns(|| assert!(sv.verify(&body, &h, now).is_ok())).into());
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
    out.insert("github_valid_ns".into(), median_ns(|| assert!(gv.verify(&body, &h).is_ok())).into());

    let key = Secret::new(b"standard-webhooks-key".to_vec());
    let wv = standard::StandardWebhooksVerifier::new(vec![key.clone()], 300);
    let mut h = HeaderMap::new();
    h.insert("webhook-id", HeaderValue::from_static("msg_bench"));
    h.insert("webhook-timestamp", HeaderValue::from_str(&now.to_string()).unwrap());
    h.insert("webhook-signature", HeaderValue::from_str(&standard::sign(&key, "msg_bench", now, &body)).unwrap());
    out.insert("standard_webhooks_valid_ns".into(), median_ns(|| assert!(wv.verify(&body, &h, now).is_ok())).into());

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
