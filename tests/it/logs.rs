//! Log capture: no secret, no signature and no raw payload reaches a log
//! line, a metric document or an HTTP error body (telemetry: "neither ever
//! carries a secret or a payload"). Every run of the fault exploration is
//! captured and searched on its own ([`RunCapture`], in
//! `explore::explore`: each flow clean and under every fault kind at every
//! call); this file's test adds a few chaos seeds and the intake's refusals.
//!
//! For the test's scope, the thread's default `tracing` subscriber is a JSON
//! fmt layer (as Lambda's `AWS_LAMBDA_LOG_FORMAT=JSON`) writing into a buffer
//! — Hookledger's own targets at TRACE, everything else at the runtime's
//! default INFO — and the thread's `metrics` recorder writes one EMF-shaped
//! document per recorded value. The flows run on a current-thread runtime, so
//! everything they do is captured. The checker is a function returning its
//! findings; `the_checker_reports_planted_leaks` proves it can fail.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use base64::prelude::*;
use hookledger::intake::IntakeRequest;
use hookledger::secret::Secret;
use hookledger::verify::{github, standard, stripe};
use http::{HeaderMap, HeaderValue, Method};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;

use crate::explore::World;
use crate::support::{GITHUB_SECRET, HMAC_SECRET, STRIPE_SECRET, SVIX_SECRET};

/// The Stripe API key the fake provider accepts (the explored world's).
const STRIPE_API_KEY: &str = "sk_test_fake";
/// Chaos seeds run under capture (the explored flows are captured by the exploration).
const CHAOS_SEEDS: std::ops::RangeInclusive<u64> = 1..=3;
/// Bytes of a payload that, found anywhere, count as the payload leaking.
const WINDOW: usize = 32;

/// A shared byte buffer the log layer writes into.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A `metrics` recorder writing one EMF document per recorded value.
#[derive(Clone, Default)]
pub(crate) struct MetricDocs(Arc<Mutex<Vec<String>>>);

impl MetricDocs {
    /// The documents recorded so far.
    pub(crate) fn docs(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

struct Handle {
    docs: MetricDocs,
    key: metrics::Key,
}

impl Handle {
    fn emit(&self, value: f64) {
        let dimensions: Vec<&str> = self.key.labels().map(metrics::Label::key).collect();
        let mut doc = serde_json::Map::new();
        doc.insert(
            "_aws".into(),
            serde_json::json!({
                "Timestamp": 0,
                "CloudWatchMetrics": [{
                    "Namespace": "Hookledger",
                    "Dimensions": [dimensions],
                    "Metrics": [{ "Name": self.key.name() }],
                }],
            }),
        );
        for label in self.key.labels() {
            doc.insert(label.key().into(), label.value().into());
        }
        doc.insert(self.key.name().into(), value.into());
        self.docs.0.lock().unwrap().push(serde_json::Value::Object(doc).to_string());
    }
}

impl metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.emit(value as f64);
    }

    fn absolute(&self, value: u64) {
        self.emit(value as f64);
    }
}

impl metrics::GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.emit(value);
    }

    fn decrement(&self, value: f64) {
        self.emit(-value);
    }

    fn set(&self, value: f64) {
        self.emit(value);
    }
}

impl metrics::HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.emit(value);
    }
}

impl MetricDocs {
    fn handle(&self, key: &metrics::Key) -> Arc<Handle> {
        Arc::new(Handle { docs: self.clone(), key: key.clone() })
    }
}

impl metrics::Recorder for MetricDocs {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}

    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}

    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.handle(key))
    }

    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.handle(key))
    }

    fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.handle(key))
    }
}

/// Where logs and metrics go while a test holds the default guards.
#[derive(Default)]
struct Capture {
    logs: Buffer,
    metrics: MetricDocs,
}

impl Capture {
    /// The JSON log subscriber, as the functions log in Lambda with
    /// `AWS_LAMBDA_LOG_FORMAT=JSON`, but with Hookledger's targets at TRACE.
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let buffer = self.logs.clone();
        let filter = Targets::new()
            .with_default(tracing::Level::INFO)
            .with_target("hookledger", tracing::Level::TRACE)
            .with_target("intake", tracing::Level::TRACE)
            .with_target("processor", tracing::Level::TRACE)
            .with_target("reconciler", tracing::Level::TRACE);
        tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || buffer.clone())
            .finish()
            .with(filter)
    }

    /// What was captured, with the answers the intake gave.
    fn captured(&self, answers: &[(u16, String)]) -> Captured {
        let logs = String::from_utf8_lossy(&self.logs.0.lock().unwrap()).lines().map(str::to_owned).collect();
        Captured { logs, metrics: self.metrics.0.lock().unwrap().clone(), answers: answers.to_vec() }
    }
}

/// Everything captured in one scope.
#[derive(Default)]
pub struct Captured {
    /// Log lines (JSON).
    pub logs: Vec<String>,
    /// Metric documents (EMF JSON).
    pub metrics: Vec<String>,
    /// The intake's answers: status and `Answer::body_json`.
    pub answers: Vec<(u16, String)>,
}

impl Captured {
    fn error_bodies(&self) -> usize {
        self.answers.iter().filter(|(status, _)| *status >= 300).count()
    }
}

/// A string that must appear nowhere, and what it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Needle {
    pub what: String,
    pub text: String,
}

/// Adds `text` as it is and as it reads inside a JSON string (log lines and
/// metric documents are JSON). Too short a string is not distinctive.
fn needle(out: &mut Vec<Needle>, what: impl Into<String>, text: &str) {
    if text.len() < 8 {
        return;
    }
    let what = what.into();
    let quoted = serde_json::to_string(text).unwrap();
    let escaped = &quoted[1..quoted.len() - 1];
    if escaped != text {
        out.push(Needle { what: format!("{what} (JSON-escaped)"), text: escaped.to_owned() });
    }
    out.push(Needle { what, text: text.to_owned() });
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The webhook signing secrets and the Stripe API key, with their encodings.
pub fn secret_needles() -> Vec<Needle> {
    let mut out = Vec::new();
    for (name, secret) in [
        ("STRIPE_SECRET", STRIPE_SECRET),
        ("SVIX_SECRET", SVIX_SECRET),
        ("GITHUB_SECRET", GITHUB_SECRET),
        ("HMAC_SECRET", HMAC_SECRET),
        ("Stripe API key", STRIPE_API_KEY),
    ] {
        needle(&mut out, name, secret);
        needle(&mut out, format!("{name} (hex)"), &hex(secret.as_bytes()));
        needle(&mut out, format!("{name} (base64)"), BASE64_STANDARD.encode(secret).trim_end_matches('='));
    }
    // The Standard Webhooks key is the base64 after `whsec_`.
    let b64 = SVIX_SECRET.trim_start_matches("whsec_");
    needle(&mut out, "SVIX_SECRET key (base64)", b64.trim_end_matches('='));
    let key = BASE64_STANDARD.decode(b64).unwrap();
    needle(&mut out, "SVIX_SECRET key (raw)", &String::from_utf8_lossy(&key));
    needle(&mut out, "SVIX_SECRET key (hex)", &hex(&key));
    needle(&mut out, "Stripe API key (bearer)", &format!("Bearer {STRIPE_API_KEY}"));
    out
}

/// Signature header values as sent, and each signature in them.
pub fn signature_needles(values: &[String]) -> Vec<Needle> {
    let mut out = Vec::new();
    for v in values {
        needle(&mut out, "signature header value", v);
        for part in v.split([',', '=', ' ']).filter(|p| p.len() >= 16) {
            needle(&mut out, "signature", part);
        }
    }
    out
}

/// Each payload whole, and `WINDOW`-byte pieces of it (its start and its
/// middle), so a truncated or partial payload is found too.
pub fn payload_needles(bodies: &[Vec<u8>]) -> Vec<Needle> {
    let mut out = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let text = String::from_utf8_lossy(body);
        needle(&mut out, format!("payload #{i}"), &text);
        if text.len() > WINDOW {
            for at in [0, text.len() / 2 - WINDOW / 2] {
                if let Some(piece) = text.get(at..at + WINDOW) {
                    needle(&mut out, format!("payload #{i} bytes {at}.."), piece);
                }
            }
        }
    }
    out
}

fn excerpt(text: &str) -> String {
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Every needle found in a log line, a metric document or an answer body.
pub fn findings(needles: &[Needle], captured: &Captured) -> Vec<String> {
    let needles: BTreeSet<&Needle> = needles.iter().collect();
    let sources = captured
        .logs
        .iter()
        .map(|l| ("log line".to_owned(), l))
        .chain(captured.metrics.iter().map(|m| ("metric document".to_owned(), m)))
        .chain(captured.answers.iter().map(|(status, body)| (format!("{status} answer body"), body)));
    let mut out = Vec::new();
    for (kind, text) in sources {
        for n in &needles {
            if n.text.len() <= text.len() && text.contains(&n.text) {
                out.push(format!("{} in a {kind}: {}", n.what, excerpt(text)));
            }
        }
    }
    out
}

/// One explored run under capture: the thread's log subscriber and metrics
/// recorder while it lives ([`RunCapture::leaks`] ends it). The exploration
/// searches each run for what that run sent: a small capture against a few
/// needles, however many runs there are.
pub struct RunCapture {
    capture: Capture,
    _logs: tracing::subscriber::DefaultGuard,
}

impl RunCapture {
    /// Starts capturing this thread's logs; its metrics are captured by
    /// [`RunCapture::run`].
    pub fn start() -> Self {
        let capture = Capture::default();
        let logs = tracing::subscriber::set_default(capture.subscriber());
        Self { capture, _logs: logs }
    }

    /// Runs `f` with this thread's metrics recorded into the capture.
    pub async fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let _metrics = metrics::set_default_local_recorder(&self.capture.metrics);
        f.await
    }

    /// What the run leaked of the secrets, its signatures and its payloads
    /// (`w`, the world it ran in), in its logs, metrics and answers.
    pub fn leaks(self, w: &World) -> Vec<String> {
        let mut sent = Sent::default();
        sent.signatures.extend(w.sent_signatures.iter().cloned());
        sent.bodies.extend(w.sent_bodies.iter().cloned());
        let captured = self.capture.captured(&w.answers);
        findings(&sent.needles(), &captured)
    }
}

/// What the flows sent and were answered.
#[derive(Default)]
struct Sent {
    signatures: Vec<String>,
    bodies: Vec<Vec<u8>>,
    answers: Vec<(u16, String)>,
}

impl Sent {
    fn absorb(&mut self, w: World) {
        self.signatures.extend(w.sent_signatures);
        for body in w.sent_bodies {
            if !self.bodies.contains(&body) {
                self.bodies.push(body);
            }
        }
        self.answers.extend(w.answers);
    }

    fn needles(&self) -> Vec<Needle> {
        let mut out = secret_needles();
        out.extend(signature_needles(&self.signatures));
        out.extend(payload_needles(&self.bodies));
        out
    }
}

fn stripe_headers(secret: &str, t: i64, body: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    let sig = stripe::sign(&Secret::new(secret), t, body);
    h.insert(stripe::SIGNATURE_HEADER, HeaderValue::from_str(&sig).unwrap());
    h
}

fn svix_headers(id: &str, t: i64, signed: &[u8]) -> HeaderMap {
    let key = standard::decode_secret(&Secret::new(SVIX_SECRET)).unwrap();
    let mut h = HeaderMap::new();
    h.insert("webhook-id", HeaderValue::from_str(id).unwrap());
    h.insert("webhook-timestamp", HeaderValue::from(t));
    h.insert("webhook-signature", HeaderValue::from_str(&standard::sign(&key, id, t, signed)).unwrap());
    h
}

fn github_headers(secret: &str, id: &str, body: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(github::SIGNATURE_HEADER, HeaderValue::from_str(&github::sign(&Secret::new(secret), body)).unwrap());
    h.insert(github::DELIVERY_HEADER, HeaderValue::from_str(id).unwrap());
    h.insert(github::EVENT_HEADER, HeaderValue::from_static("push"));
    h
}

/// A payload with a marker of its own.
fn probe_body(n: usize) -> Vec<u8> {
    serde_json::json!({
        "id": format!("evt_probe_{n}"),
        "object": "event",
        "type": "payment_intent.succeeded",
        "probe_marker": format!("PROBE-PAYLOAD-MARKER-{n}"),
        "data": {"object": {"id": "pi_probe", "object": "payment_intent", "customer": "cus_x", "amount": 1}},
    })
    .to_string()
    .into_bytes()
}

/// Deliveries the intake refuses (and two it takes), for its error bodies:
/// wrong secret, stale, malformed, signature of another body, unknown
/// endpoint, wrong method.
async fn probes(sent: &mut Sent) {
    let w = World::new(11).await;
    let now_s = w.now / 1000;
    let at = UNIX_EPOCH + Duration::from_millis(w.now as u64);
    let b = probe_body;
    let not_json = b"{not json PROBE-PAYLOAD-MARKER-3, signed".to_vec();
    let cases: Vec<(&str, Method, HeaderMap, Vec<u8>)> = vec![
        ("stripe-a", Method::POST, stripe_headers("whsec_someone_else", now_s, &b(1)), b(1)),
        ("stripe-a", Method::POST, stripe_headers(STRIPE_SECRET, now_s - 3_600, &b(2)), b(2)),
        ("stripe-a", Method::POST, stripe_headers(STRIPE_SECRET, now_s, &not_json), not_json.clone()),
        ("svix", Method::POST, svix_headers("msg_probe_4", now_s, &b(40)), b(4)),
        ("svix", Method::POST, svix_headers("msg_probe_5", now_s, &not_json), not_json),
        ("gh", Method::POST, github_headers("not-the-secret", "probe-6", &b(6)), b(6)),
        ("gh", Method::POST, github_headers(GITHUB_SECRET, "probe-7", &b(7)), b(7)),
        ("stripe-a", Method::POST, stripe_headers(STRIPE_SECRET, now_s, &b(8)), b(8)),
        ("nowhere", Method::POST, stripe_headers(STRIPE_SECRET, now_s, &b(9)), b(9)),
        ("stripe-a", Method::GET, stripe_headers(STRIPE_SECRET, now_s, &b(10)), b(10)),
    ];
    for (endpoint, method, headers, body) in cases {
        for name in [stripe::SIGNATURE_HEADER, "webhook-signature", github::SIGNATURE_HEADER] {
            if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                sent.signatures.push(v.to_owned());
            }
        }
        let req = IntakeRequest {
            query: "",
            endpoint,
            method: &method,
            headers: &headers,
            body: &body,
            now: at,
            request_id: "probe",
        };
        let answer = w.intake.handle(req).await;
        sent.answers.push((answer.status, answer.body_json()));
        sent.bodies.push(body);
    }
}

#[tokio::test]
async fn no_secret_signature_or_payload_in_logs_metrics_or_error_bodies() {
    let started = Instant::now();
    let capture = Capture::default();
    let _logs = tracing::subscriber::set_default(capture.subscriber());
    let _metrics = metrics::set_default_local_recorder(&capture.metrics);

    let mut sent = Sent::default();
    let mut chaos_events = 0;
    for seed in CHAOS_SEEDS {
        let (report, _, w) = crate::chaos::run_seed_world(seed).await;
        assert!(report.violations.is_empty(), "chaos seed {seed}: {:?}", report.violations);
        chaos_events += report.events;
        sent.absorb(w);
    }
    probes(&mut sent).await;

    let captured = capture.captured(&sent.answers);
    let needles = sent.needles();
    let found = findings(&needles, &captured);
    println!(
        "chaos seeds {CHAOS_SEEDS:?} ({chaos_events} events) and the probes; captured {} log lines, {} metric documents, {} answers ({} errors); \
         {} needles ({} signatures, {} payloads); {:.1} s",
        captured.logs.len(),
        captured.metrics.len(),
        captured.answers.len(),
        captured.error_bodies(),
        needles.len(),
        sent.signatures.len(),
        sent.bodies.len(),
        started.elapsed().as_secs_f64()
    );
    // The capture saw the flows: something in each channel.
    assert!(captured.logs.iter().any(|l| l.contains("\"intake\"")), "no intake log line captured");
    assert!(!captured.metrics.is_empty(), "no metric captured");
    assert!(captured.error_bodies() > 0, "no error body captured");
    assert!(!sent.signatures.is_empty() && !sent.bodies.is_empty());
    assert!(found.is_empty(), "{} leaks:\n{}", found.len(), found.join("\n"));
}

/// The checker finds what is planted in each channel: a secret and a
/// truncated payload in log lines, a signature at DEBUG in Hookledger's
/// target, a secret in a metric label, a secret in an error body.
#[tokio::test]
async fn the_checker_reports_planted_leaks() {
    let body = probe_body(99);
    let sig = stripe::sign(&Secret::new(STRIPE_SECRET), 1_700_000_000, &body);
    let capture = Capture::default();
    {
        let _logs = tracing::subscriber::set_default(capture.subscriber());
        let _metrics = metrics::set_default_local_recorder(&capture.metrics);
        tracing::info!(secret = STRIPE_SECRET, "planted");
        tracing::debug!(target: "hookledger::planted", signature = %sig, "planted");
        let text = String::from_utf8_lossy(&body).into_owned();
        tracing::warn!(error = %format!("bad payload: {}", &text[..40]), "planted");
        metrics::counter!("planted", "key" => STRIPE_API_KEY).increment(1);
    }
    let leaky_answer = (400, serde_json::json!({"code": "x", "detail": format!("bad {SVIX_SECRET}")}).to_string());
    let captured = capture.captured(&[leaky_answer]);
    let mut needles = secret_needles();
    needles.extend(signature_needles(std::slice::from_ref(&sig)));
    needles.extend(payload_needles(std::slice::from_ref(&body)));

    let found = findings(&needles, &captured);
    for expected in [
        "STRIPE_SECRET in a log line",
        "signature header value in a log line",
        "payload #0 bytes 0.. (JSON-escaped) in a log line",
        "Stripe API key in a metric document",
        "SVIX_SECRET in a 400 answer body",
    ] {
        assert!(found.iter().any(|f| f.starts_with(expected)), "not reported: {expected}\n{}", found.join("\n"));
    }

    // And nothing is reported where nothing leaked.
    let clean = Captured {
        logs: vec![r#"{"level":"INFO","fields":{"message":"intake","event_id":"evt_probe_99"}}"#.into()],
        metrics: vec![r#"{"received":1,"provider":"stripe"}"#.into()],
        answers: vec![(401, r#"{"code":"signature_mismatch","detail":"no signature matched"}"#.into())],
    };
    assert_eq!(findings(&needles, &clean), Vec::<String>::new());
}
