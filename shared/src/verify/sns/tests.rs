#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

use super::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/providers/sns")
}

fn test_sns() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/test-sns")
}

/// Serves one fixed PEM for any URL and counts fetches.
struct ServeOne {
    pem: Vec<u8>,
    fetches: AtomicUsize,
}

impl ServeOne {
    fn new(pem: Vec<u8>) -> Arc<Self> {
        Arc::new(Self { pem, fetches: AtomicUsize::new(0) })
    }
}

impl HttpsGet for ServeOne {
    fn get<'a>(&'a self, _url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok(self.pem.clone()) })
    }
}

struct Unreachable;

impl HttpsGet for Unreachable {
    fn get<'a>(&'a self, _url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        Box::pin(async { Err(FetchError::Failed("connection refused".into())) })
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A minute after the message was sent (its certificate was valid then; the
/// fixtures' certificates have expired since).
fn sent_at(body: &[u8]) -> i64 {
    let msg: SnsMessage = serde_json::from_slice(body).unwrap();
    parse_timestamp(&msg.timestamp).unwrap() + 60
}

fn verifier(getter: Arc<dyn HttpsGet>, topic: &str) -> SnsVerifier {
    SnsVerifier::new(vec![topic.to_owned()], Arc::new(CertificateCache::new(getter)))
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
}

#[test]
fn every_genuine_aws_vector_verifies() {
    let mut count = 0;
    for dir in std::fs::read_dir(fixtures()).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&dir).unwrap() {
            let file = file.unwrap().path();
            if !file.to_string_lossy().ends_with(".vector.json") {
                continue;
            }
            let v: Value = serde_json::from_slice(&read(&file)).unwrap();
            let body = read(&dir.join(v["message_file"].as_str().unwrap()));
            let pem = read(&dir.join(v["cert_file"].as_str().unwrap()));
            let msg: SnsMessage = serde_json::from_slice(&body).unwrap();
            assert_eq!(msg.string_to_sign().unwrap(), v["string_to_sign"].as_str().unwrap(), "{}", file.display());
            // Every genuine message names the certificate of its topic's own region.
            certificate_url_for_topic(&msg.signing_cert_url, &msg.topic_arn)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));

            let getter = ServeOne::new(pem.clone());
            let got =
                block_on(verifier(getter.clone(), &msg.topic_arn).verify(&body, &HeaderMap::new(), sent_at(&body)));
            let got = got.unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(got.event_id, msg.message_id);
            assert_eq!(getter.fetches.load(Ordering::SeqCst), 1);
            count += 1;
        }
    }
    assert_eq!(count, 20, "expected all 20 genuine SNS vectors");
}

#[test]
fn negative_and_edge_vectors_match_their_expected_outcome() {
    let cases: Value = serde_json::from_slice(&read(&fixtures().join("negative-and-edge-vectors.json"))).unwrap();
    for case in cases["cases"].as_array().unwrap() {
        let what = case["description"].as_str().unwrap();
        let mut msg: Value =
            serde_json::from_slice(&read(&fixtures().join(case["base_message"].as_str().unwrap()))).unwrap();
        for k in case["remove_fields"].as_array().unwrap() {
            msg.as_object_mut().unwrap().remove(k.as_str().unwrap());
        }
        for (k, v) in case["set_fields"].as_object().unwrap() {
            msg[k] = v.clone();
        }
        let pem = read(&fixtures().join(case["verify_with_cert"].as_str().unwrap()));
        let expected = case["expected"]["signature_valid"].as_bool().unwrap();

        // The cryptographic expectation, straight from the vector.
        let parsed: SnsMessage = serde_json::from_value(msg.clone()).unwrap();
        let key = parse_certificate(&pem).unwrap().key;
        let sig = STANDARD.decode(&parsed.signature).unwrap();
        let valid =
            signature_matches(&key, &parsed.signature_version, parsed.string_to_sign().unwrap().as_bytes(), &sig)
                .unwrap();
        assert_eq!(valid, expected, "{what}");

        // The full verifier: a valid signature still needs a valid certificate URL.
        let getter = ServeOne::new(pem.clone());
        let body = serde_json::to_vec(&msg).unwrap();
        let got =
            block_on(verifier(getter.clone(), &parsed.topic_arn).verify(&body, &HeaderMap::new(), sent_at(&body)));
        let url_ok = certificate_url_for_topic(&parsed.signing_cert_url, &parsed.topic_arn).is_ok();
        assert_eq!(got.is_ok(), expected && url_ok, "{what}: {got:?}");
        if !url_ok {
            assert!(matches!(got, Err(VerifyError::CertificateUrl(_))), "{what}");
            assert_eq!(getter.fetches.load(Ordering::SeqCst), 0, "{what}: fetched before validating the URL");
        }
    }
}

#[test]
fn certificate_url_attacks_are_rejected_without_any_fetch() {
    let good = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-7506a1e35b36ef5a444dd1a8e7cc3ed8.pem";
    assert!(validate_certificate_url(good).is_ok());
    assert!(
        validate_certificate_url("https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem").is_ok()
    );
    assert!(
        validate_certificate_url("https://sns.us-gov-west-1.amazonaws.com/SimpleNotificationService-abc.pem").is_ok()
    );
    let attacks = [
        "http://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com:443/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com:8443/SimpleNotificationService-abc.pem",
        "https://user@sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://user:pw@sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com@evil.example/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com.evil.example/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.co/SimpleNotificationService-abc.pem",
        "https://sns-us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://evilsns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com./SimpleNotificationService-abc.pem",
        "https://SNS.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.evil.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://s3.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem?x=1",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem#frag",
        "https://sns.us-east-1.amazonaws.com/other/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.crt",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-../x.pem",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-%2e%2e.pem",
        "https://sns.us-east-1.amazonaws.com\\@evil.example/SimpleNotificationService-abc.pem",
        "https://169.254.169.254/SimpleNotificationService-abc.pem",
        "file:///etc/passwd",
        "",
    ];
    let body: Value =
        serde_json::from_slice(&read(&fixtures().join("2025-cert-7506a1e3/notification-no-subject.sv1.json"))).unwrap();
    for attack in attacks {
        assert!(validate_certificate_url(attack).is_err(), "accepted {attack}");
        let mut msg = body.clone();
        msg["SigningCertURL"] = Value::String(attack.to_owned());
        let getter = ServeOne::new(read(
            &fixtures().join("2025-cert-7506a1e3/SimpleNotificationService-7506a1e35b36ef5a444dd1a8e7cc3ed8.pem"),
        ));
        let topic = msg["TopicArn"].as_str().unwrap().to_owned();
        let got = block_on(verifier(getter.clone(), &topic).verify(
            &serde_json::to_vec(&msg).unwrap(),
            &HeaderMap::new(),
            1_780_000_000,
        ));
        assert!(matches!(got, Err(VerifyError::CertificateUrl(_))), "{attack}: {got:?}");
        assert_eq!(getter.fetches.load(Ordering::SeqCst), 0, "{attack}");
    }
}

#[test]
fn subscribe_urls_are_validated_like_certificate_urls() {
    assert!(validate_subscribe_url("https://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-west-2:1:t&Token=abc").is_ok());
    for bad in [
        "http://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription",
        "https://sns.us-west-2.amazonaws.com.evil.example/?Action=ConfirmSubscription",
        "https://sns.us-west-2.amazonaws.com:444/?Action=ConfirmSubscription",
        "https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe",
        "https://sns.us-west-2.amazonaws.com/x?Action=ConfirmSubscription",
    ] {
        assert!(validate_subscribe_url(bad).is_err(), "accepted {bad}");
    }
}

fn genuine(path: &str) -> (Vec<u8>, Vec<u8>) {
    let dir = fixtures().join(path);
    let pem = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "pem"))
        .unwrap();
    (read(&pem), dir.to_string_lossy().into_owned().into_bytes())
}

#[test]
fn topics_outside_the_allow_list_are_refused_before_any_fetch() {
    let (pem, _) = genuine("2025-cert-7506a1e3");
    let body = read(&fixtures().join("2025-cert-7506a1e3/notification-no-subject.sv1.json"));
    let getter = ServeOne::new(pem.clone());
    let got = block_on(verifier(getter.clone(), "arn:aws:sns:us-west-2:000000000000:other").verify(
        &body,
        &HeaderMap::new(),
        sent_at(&body),
    ));
    assert_eq!(got, Err(VerifyError::TopicNotAllowed));
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 0);
}

#[test]
fn subscription_confirmation_for_an_allowed_topic_asks_to_visit_the_url() {
    let (pem, _) = genuine("2025-cert-7506a1e3");
    let body = read(&fixtures().join("2025-cert-7506a1e3/subscription-confirmation.sv1.json"));
    let msg: SnsMessage = serde_json::from_slice(&body).unwrap();
    let got =
        block_on(verifier(ServeOne::new(pem.clone()), &msg.topic_arn).verify(&body, &HeaderMap::new(), sent_at(&body)))
            .unwrap();
    match got.action {
        Action::ConfirmSubscription { subscribe_url } => {
            assert_eq!(subscribe_url.as_str(), msg.subscribe_url.unwrap())
        }
        other => panic!("{other:?}"),
    }
    let unsub = read(&fixtures().join("2025-cert-7506a1e3/unsubscribe-confirmation.sv2.json"));
    let msg: SnsMessage = serde_json::from_slice(&unsub).unwrap();
    let got = block_on(verifier(ServeOne::new(pem.clone()), &msg.topic_arn).verify(
        &unsub,
        &HeaderMap::new(),
        sent_at(&unsub),
    ))
    .unwrap();
    assert_eq!(got.action, Action::Unsubscribed);
}

#[test]
fn ses_notifications_carry_their_type() {
    let (pem, _) = genuine("2021-cert-7ff53184");
    for (file, ty) in
        [("ses-bounce-notification.sv1.json", "ses.Bounce"), ("ses-complaint-event.sv1.json", "ses.Complaint")]
    {
        let body = read(&fixtures().join("2021-cert-7ff53184").join(file));
        let msg: SnsMessage = serde_json::from_slice(&body).unwrap();
        let got = block_on(verifier(ServeOne::new(pem.clone()), &msg.topic_arn).verify(
            &body,
            &HeaderMap::new(),
            sent_at(&body),
        ))
        .unwrap();
        assert_eq!(got.event_type.as_deref(), Some(ty));
        assert_eq!(got.action, Action::Record);
    }
}

#[test]
fn expired_certificates_and_fetch_failures_are_distinguished() {
    // A 2026 message whose URL serves the certificate that expired in 2022.
    let (expired_pem, _) = genuine("2021-cert-7ff53184");
    let body = read(&fixtures().join(FRESH_2025));
    let msg: SnsMessage = serde_json::from_slice(&body).unwrap();
    let expired =
        block_on(verifier(ServeOne::new(expired_pem), &msg.topic_arn).verify(&body, &HeaderMap::new(), sent_at(&body)));
    assert!(matches!(expired, Err(VerifyError::CertificateInvalid(_))), "{expired:?}");
    let down =
        block_on(verifier(Arc::new(Unreachable), &msg.topic_arn).verify(&body, &HeaderMap::new(), sent_at(&body)));
    assert_eq!(down, Err(VerifyError::CertificateUnavailable));
}

fn generated_message(kind: &str, version: &str, key_file: &str) -> SnsMessage {
    let mut msg = SnsMessage {
        kind: kind.to_owned(),
        message_id: "0f8b6a2e-test".to_owned(),
        topic_arn: "arn:aws:sns:eu-west-1:123456789012:ses-events".to_owned(),
        message: r#"{"notificationType":"Delivery","mail":{"messageId":"m-1"}}"#.to_owned(),
        timestamp: "2027-01-15T08:00:00.000Z".to_owned(),
        signature_version: version.to_owned(),
        signature: String::new(),
        signing_cert_url: "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0000test0000.pem".to_owned(),
        subject: None,
        token: None,
        subscribe_url: None,
    };
    let key = String::from_utf8(read(&test_sns().join(key_file))).unwrap();
    signing::sign(&mut msg, &key).unwrap();
    msg
}

#[test]
fn generated_test_certificate_round_trips_and_is_cached() {
    let pem = read(&test_sns().join("SimpleNotificationService-0000test0000.pem"));
    let getter = ServeOne::new(pem);
    let v = verifier(getter.clone(), "arn:aws:sns:eu-west-1:123456789012:ses-events");
    for version in ["1", "2"] {
        let msg = generated_message("Notification", version, "test-signing-key.pem");
        let got = block_on(v.verify(&serde_json::to_vec(&msg).unwrap(), &HeaderMap::new(), 1_800_000_000)).unwrap();
        assert_eq!(got.event_type.as_deref(), Some("ses.Delivery"));
    }
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 1, "certificate fetched once per warm container");
}

#[test]
fn certificates_not_issued_to_sns_are_refused() {
    let getter = ServeOne::new(read(&test_sns().join("wrong-cn-cert.pem")));
    let msg = generated_message("Notification", "2", "wrong-cn-key.pem");
    let got = block_on(verifier(getter, &msg.topic_arn).verify(
        &serde_json::to_vec(&msg).unwrap(),
        &HeaderMap::new(),
        1_800_000_000,
    ));
    assert!(matches!(got, Err(VerifyError::CertificateInvalid(_))), "{got:?}");
}

#[test]
fn declared_type_header_must_match_and_garbage_is_typed() {
    let pem = read(&test_sns().join("SimpleNotificationService-0000test0000.pem"));
    let msg = generated_message("Notification", "2", "test-signing-key.pem");
    let mut h = HeaderMap::new();
    h.insert(MESSAGE_TYPE_HEADER, http::HeaderValue::from_static("SubscriptionConfirmation"));
    let v = verifier(ServeOne::new(pem), &msg.topic_arn);
    assert!(matches!(
        block_on(v.verify(&serde_json::to_vec(&msg).unwrap(), &h, 1_800_000_000)),
        Err(VerifyError::MalformedEnvelope(_))
    ));
    assert!(matches!(block_on(v.verify(b"not json", &HeaderMap::new(), 0)), Err(VerifyError::MalformedEnvelope(_))));
    let mut odd = msg.clone();
    odd.kind = "Mystery".to_owned();
    assert!(matches!(
        block_on(v.verify(&serde_json::to_vec(&odd).unwrap(), &HeaderMap::new(), 0)),
        Err(VerifyError::MalformedEnvelope(_))
    ));
}

// ---------------------------------------------------------------------------
// Strangers: what an unauthenticated sender can make the verifier do.

const FRESH_2025: &str = "2025-cert-7506a1e3/notification-no-subject.sv1.json";
/// `Timestamp` of FRESH_2025 (2026-03-06T19:55:38.903Z), in seconds.
const FRESH_2025_SENT: i64 = 1_772_826_938;
const GENUINE_2025_URL: &str =
    "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-7506a1e35b36ef5a444dd1a8e7cc3ed8.pem";

fn pem_2025() -> Vec<u8> {
    read(&fixtures().join("2025-cert-7506a1e3/SimpleNotificationService-7506a1e35b36ef5a444dd1a8e7cc3ed8.pem"))
}

fn fresh_2025_with(field: &str, value: &str) -> (Value, String) {
    let mut msg: Value = serde_json::from_slice(&read(&fixtures().join(FRESH_2025))).unwrap();
    msg[field] = Value::String(value.to_owned());
    let topic = msg["TopicArn"].as_str().unwrap().to_owned();
    (msg, topic)
}

/// Behaves like the real SNS hosts: the genuine URL serves its certificate,
/// any other path is answered 404. Each answer takes `delay`; fetches are counted.
struct AwsLike {
    genuine: String,
    pem: Vec<u8>,
    delay: std::time::Duration,
    fetches: AtomicUsize,
}

impl AwsLike {
    fn new(genuine: &str, pem: Vec<u8>, delay_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            genuine: genuine.to_owned(),
            pem,
            delay: std::time::Duration::from_millis(delay_ms),
            fetches: AtomicUsize::new(0),
        })
    }
}

impl HttpsGet for AwsLike {
    fn get<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            if url.as_str() == self.genuine { Ok(self.pem.clone()) } else { Err(FetchError::Status(404)) }
        })
    }
}

#[test]
fn made_up_region_is_rejected_before_fetch() {
    for made_up in [
        "https://sns.aa-bbb-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.us-east-9.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.us-gov-central-1.amazonaws.com/SimpleNotificationService-abc.pem",
        // Real regions, wrong partition suffix.
        "https://sns.cn-north-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
        "https://sns.us-gov-west-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
    ] {
        assert!(validate_certificate_url(made_up).is_err(), "accepted {made_up}");
    }
    // A topic "in" the made-up region, so only the region list can refuse it.
    let (mut msg, _) =
        fresh_2025_with("SigningCertURL", "https://sns.aa-bbb-1.amazonaws.com/SimpleNotificationService-abc.pem");
    let topic = "arn:aws:sns:aa-bbb-1:131990247566:dongie-standard-topic";
    msg["TopicArn"] = Value::String(topic.to_owned());
    let getter = ServeOne::new(pem_2025());
    let got = block_on(verifier(getter.clone(), topic).verify(
        &serde_json::to_vec(&msg).unwrap(),
        &HeaderMap::new(),
        FRESH_2025_SENT + 60,
    ));
    assert!(matches!(got, Err(VerifyError::CertificateUrl(_))), "{got:?}");
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 0, "fetched a made-up region");
}

#[test]
fn certificate_region_must_match_the_topic_region() {
    // The genuine certificate, but served from another region than the topic's (us-west-2).
    let (msg, topic) = fresh_2025_with(
        "SigningCertURL",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-7506a1e35b36ef5a444dd1a8e7cc3ed8.pem",
    );
    let getter = ServeOne::new(pem_2025());
    let got = block_on(verifier(getter.clone(), &topic).verify(
        &serde_json::to_vec(&msg).unwrap(),
        &HeaderMap::new(),
        FRESH_2025_SENT + 60,
    ));
    assert!(matches!(got, Err(VerifyError::CertificateUrl(_))), "{got:?}");
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 0);
}

#[test]
fn garbage_signature_is_rejected_without_fetch() {
    for garbage in [
        String::new(),
        "not base64!!".to_owned(),
        "AAAA".to_owned(),
        STANDARD.encode([7u8; 255]),
        STANDARD.encode([7u8; 257]),
        STANDARD.encode([7u8; 4096]),
    ] {
        let (msg, topic) = fresh_2025_with("Signature", &garbage);
        let getter = ServeOne::new(pem_2025());
        let got = block_on(verifier(getter.clone(), &topic).verify(
            &serde_json::to_vec(&msg).unwrap(),
            &HeaderMap::new(),
            FRESH_2025_SENT + 60,
        ));
        assert!(matches!(got, Err(VerifyError::MalformedEnvelope(_))), "{} bytes: {got:?}", garbage.len());
        assert_eq!(getter.fetches.load(Ordering::SeqCst), 0, "{} bytes of signature caused a fetch", garbage.len());
    }
}

#[test]
fn stale_future_or_malformed_timestamps_are_rejected_without_fetch() {
    let body = read(&fixtures().join(FRESH_2025));
    let topic = serde_json::from_slice::<SnsMessage>(&body).unwrap().topic_arn;
    for (now, what) in [(FRESH_2025_SENT + 3 * 3600, "three hours old"), (FRESH_2025_SENT - 3600, "an hour ahead")] {
        let getter = ServeOne::new(pem_2025());
        let got = block_on(verifier(getter.clone(), &topic).verify(&body, &HeaderMap::new(), now));
        assert!(matches!(got, Err(VerifyError::StaleTimestamp | VerifyError::FutureTimestamp)), "{what}: {got:?}");
        assert_eq!(getter.fetches.load(Ordering::SeqCst), 0, "{what}");
    }
    for bad in ["2026-03-06 19:55:38", "yesterday", "2026-03-06T19:55:38.903+01:00", "2026-02-30T19:55:38.903Z"] {
        let (msg, topic) = fresh_2025_with("Timestamp", bad);
        let getter = ServeOne::new(pem_2025());
        let got = block_on(verifier(getter.clone(), &topic).verify(
            &serde_json::to_vec(&msg).unwrap(),
            &HeaderMap::new(),
            FRESH_2025_SENT + 60,
        ));
        assert!(matches!(got, Err(VerifyError::MalformedEnvelope(_))), "{bad}: {got:?}");
        assert_eq!(getter.fetches.load(Ordering::SeqCst), 0, "{bad}");
    }
}

#[test]
fn stranger_urls_cause_no_slow_fetch_storm() {
    // 40 distinct, well-formed URLs on the topic's real SNS host, none of
    // which exists; each answer from "AWS" takes 20 ms.
    let getter = AwsLike::new(GENUINE_2025_URL, pem_2025(), 20);
    let (_, topic) = fresh_2025_with("Type", "Notification");
    let v = verifier(getter.clone(), &topic);
    let started = std::time::Instant::now();
    let mut answers = Vec::new();
    for i in 0..40 {
        let url = format!("https://sns.us-west-2.amazonaws.com/SimpleNotificationService-{i:032x}.pem");
        let (msg, _) = fresh_2025_with("SigningCertURL", &url);
        answers.push(block_on(v.verify(&serde_json::to_vec(&msg).unwrap(), &HeaderMap::new(), FRESH_2025_SENT + 60)));
    }
    let fetches = getter.fetches.load(Ordering::SeqCst);
    assert!(fetches <= FETCH_BUDGET as usize, "{fetches} outbound fetches for 40 stranger URLs");
    assert!(started.elapsed() < std::time::Duration::from_millis(600), "took {:?}", started.elapsed());
    // What AWS answered 404 is a client error, never a 5xx.
    for a in &answers[..fetches] {
        assert!(matches!(a, Err(VerifyError::CertificateInvalid(_))), "{a:?}");
    }
    // Beyond the budget nothing is fetched; an unseen URL is answered 503
    // at once, so that a genuine message with a not yet cached certificate
    // is retried by SNS rather than dropped (SNS does not retry a 4xx).
    for a in &answers[fetches..] {
        assert_eq!(a, &Err(VerifyError::CertificateUnavailable));
    }
    // The same URLs again: remembered, still no fetch, still 4xx.
    for i in 0..fetches {
        let url = format!("https://sns.us-west-2.amazonaws.com/SimpleNotificationService-{i:032x}.pem");
        let (msg, _) = fresh_2025_with("SigningCertURL", &url);
        let got = block_on(v.verify(&serde_json::to_vec(&msg).unwrap(), &HeaderMap::new(), FRESH_2025_SENT + 90));
        assert!(matches!(got, Err(VerifyError::CertificateInvalid(_))), "{got:?}");
    }
    assert_eq!(getter.fetches.load(Ordering::SeqCst), fetches);
    // Once the window has turned, the genuine certificate is fetched and used.
    let body = read(&fixtures().join(FRESH_2025));
    block_on(v.verify(&body, &HeaderMap::new(), FRESH_2025_SENT + 60 + FETCH_WINDOW_SECS)).unwrap();
    assert_eq!(getter.fetches.load(Ordering::SeqCst), fetches + 1);
}

#[test]
fn failed_fetches_are_not_repeated_for_the_same_url() {
    let getter = AwsLike::new(GENUINE_2025_URL, pem_2025(), 0);
    let url = "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-00000000000000000000000000000bad.pem";
    let (msg, topic) = fresh_2025_with("SigningCertURL", url);
    let v = verifier(getter.clone(), &topic);
    for _ in 0..5 {
        let got = block_on(v.verify(&serde_json::to_vec(&msg).unwrap(), &HeaderMap::new(), FRESH_2025_SENT + 60));
        assert!(matches!(got, Err(VerifyError::CertificateInvalid(_))), "{got:?}");
    }
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 1, "refetched a URL that AWS already answered 404");

    // A transient failure (AWS unreachable) is answered 503, and is not refetched at once either.
    let (msg, topic) = fresh_2025_with("Type", "Notification");
    let counting = Arc::new(CountingUnreachable(AtomicUsize::new(0)));
    let v = verifier(counting.clone(), &topic);
    for _ in 0..5 {
        let got = block_on(v.verify(&serde_json::to_vec(&msg).unwrap(), &HeaderMap::new(), FRESH_2025_SENT + 60));
        assert_eq!(got, Err(VerifyError::CertificateUnavailable));
    }
    assert_eq!(counting.0.load(Ordering::SeqCst), 1);
}

struct CountingUnreachable(AtomicUsize);

impl HttpsGet for CountingUnreachable {
    fn get<'a>(&'a self, _url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(FetchError::Failed("connection refused".into())) })
    }
}

#[test]
fn hanging_certificate_host_is_cut_off_quickly() {
    let getter = AwsLike::new(GENUINE_2025_URL, pem_2025(), 10_000);
    let (msg, topic) = fresh_2025_with("Type", "Notification");
    let started = std::time::Instant::now();
    let got = block_on(verifier(getter, &topic).verify(
        &serde_json::to_vec(&msg).unwrap(),
        &HeaderMap::new(),
        FRESH_2025_SENT + 60,
    ));
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "took {:?}", started.elapsed());
    assert_eq!(got, Err(VerifyError::CertificateUnavailable));
}

#[test]
fn timed_out_fetches_are_not_retried_at_once() {
    let getter = AwsLike::new(GENUINE_2025_URL, pem_2025(), 10_000);
    let (msg, topic) = fresh_2025_with("Type", "Notification");
    let body = serde_json::to_vec(&msg).unwrap();
    let certs = CertificateCache::new(getter.clone()).with_fetch_timeout(std::time::Duration::from_millis(20));
    let v = SnsVerifier::new(vec![topic], Arc::new(certs));
    for now in [FRESH_2025_SENT + 60, FRESH_2025_SENT + 60 + UNAVAILABLE_TTL_SECS - 1] {
        assert_eq!(block_on(v.verify(&body, &HeaderMap::new(), now)), Err(VerifyError::CertificateUnavailable));
    }
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 1);
    let _ = block_on(v.verify(&body, &HeaderMap::new(), FRESH_2025_SENT + 60 + UNAVAILABLE_TTL_SECS));
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 2, "retried once the failure lapsed");
}

#[test]
fn concurrent_requests_for_one_url_share_one_fetch() {
    let getter = AwsLike::new(GENUINE_2025_URL, pem_2025(), 20);
    let body = read(&fixtures().join(FRESH_2025));
    let topic = serde_json::from_slice::<SnsMessage>(&body).unwrap().topic_arn;
    let v = verifier(getter.clone(), &topic);
    let h = HeaderMap::new();
    let (a, b, c) = block_on(async {
        tokio::join!(
            v.verify(&body, &h, FRESH_2025_SENT + 60),
            v.verify(&body, &h, FRESH_2025_SENT + 60),
            v.verify(&body, &h, FRESH_2025_SENT + 60)
        )
    });
    assert!(a.is_ok() && b.is_ok() && c.is_ok(), "{a:?} {b:?} {c:?}");
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 1);
}

#[test]
fn unverified_fetches_cannot_evict_verified_certificates() {
    const NOW: i64 = 1_800_000_000;
    let pem = read(&test_sns().join("SimpleNotificationService-0000test0000.pem"));
    // Serves the (genuine) test certificate at every URL, as if AWS had many.
    let getter = ServeOne::new(pem);
    let v = verifier(getter.clone(), "arn:aws:sns:eu-west-1:123456789012:ses-events");
    let genuine = serde_json::to_vec(&generated_message("Notification", "2", "test-signing-key.pem")).unwrap();
    block_on(v.verify(&genuine, &HeaderMap::new(), NOW)).unwrap();
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 1);

    // A stranger sends 200 messages naming distinct certificate URLs with
    // well-formed but wrong signatures, spread over ~25 minutes.
    let mut forged = generated_message("Notification", "2", "test-signing-key.pem");
    forged.signature = STANDARD.encode([1u8; 256]);
    for i in 0..200 {
        forged.signing_cert_url = format!("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-flood{i}.pem");
        let got = block_on(v.verify(&serde_json::to_vec(&forged).unwrap(), &HeaderMap::new(), NOW + i * 8));
        assert!(got.is_err());
    }
    let before = getter.fetches.load(Ordering::SeqCst);
    block_on(v.verify(&genuine, &HeaderMap::new(), NOW + 1600)).unwrap();
    assert_eq!(getter.fetches.load(Ordering::SeqCst), before, "the verified certificate was evicted");
}

#[test]
fn region_list_is_closed_and_partition_aware() {
    for (region, _) in REGIONS {
        let suffix = if region.starts_with("cn-") { "amazonaws.com.cn" } else { "amazonaws.com" };
        let url = format!("https://sns.{region}.{suffix}/SimpleNotificationService-abc.pem");
        assert!(validate_certificate_url(&url).is_ok(), "{url}");
    }
    assert_eq!(REGIONS.len(), 38);
    assert_eq!(topic_region("arn:aws:sns:eu-west-1:123456789012:t"), Some("eu-west-1"));
    assert_eq!(topic_region("arn:aws-us-gov:sns:us-gov-west-1:123456789012:t"), Some("us-gov-west-1"));
    assert_eq!(topic_region("arn:aws-cn:sns:cn-north-1:123456789012:t"), Some("cn-north-1"));
    for bad in [
        "arn:aws:sns:aa-bbb-1:123456789012:t",
        "arn:aws:sns:cn-north-1:123456789012:t",
        "arn:aws-cn:sns:us-east-1:123456789012:t",
        "arn:aws:sqs:eu-west-1:123456789012:t",
        "arn:aws:sns:eu-west-1::t",
        "arn:aws:sns:eu-west-1:123456789012",
    ] {
        assert_eq!(topic_region(bad), None, "{bad}");
    }
    let long_id = format!("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-{}.pem", "a".repeat(65));
    assert!(validate_certificate_url(&long_id).is_err());
}

#[test]
fn timestamps_parse_strictly_and_round_trip() {
    assert_eq!(parse_timestamp("2026-03-06T19:55:38.903Z"), Some(FRESH_2025_SENT));
    assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(parse_timestamp("2024-02-29T23:59:59.1Z"), Some(1_709_251_199));
    for t in [0, 951_782_400, 1_709_251_199, 1_800_000_000, 4_102_444_800] {
        assert_eq!(parse_timestamp(&signing::timestamp(t)), Some(t), "{t}");
    }
    assert_eq!(signing::timestamp(1_800_000_000), "2027-01-15T08:00:00.000Z");
    for bad in [
        "",
        "2026-03-06T19:55:38",
        "2026-03-06T19:55:38.Z",
        "2026-03-06T19:55:38.1234567890Z",
        "2026-03-06T24:00:00Z",
        "2025-02-29T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "+026-03-06T19:55:38Z",
        "2026-03-06t19:55:38Z",
        "2026-03-06T19:55:38.903z",
    ] {
        assert_eq!(parse_timestamp(bad), None, "{bad}");
    }
}

#[test]
fn freshness_window_edges() {
    let body = read(&fixtures().join(FRESH_2025));
    let topic = serde_json::from_slice::<SnsMessage>(&body).unwrap().topic_arn;
    let v = verifier(ServeOne::new(pem_2025()), &topic);
    let sent = FRESH_2025_SENT; // the fraction (.903) is ignored
    assert!(block_on(v.verify(&body, &HeaderMap::new(), sent + MAX_MESSAGE_AGE_SECS)).is_ok());
    assert!(block_on(v.verify(&body, &HeaderMap::new(), sent - MAX_CLOCK_SKEW_SECS)).is_ok());
    assert_eq!(
        block_on(v.verify(&body, &HeaderMap::new(), sent + MAX_MESSAGE_AGE_SECS + 1)),
        Err(VerifyError::StaleTimestamp)
    );
    assert_eq!(
        block_on(v.verify(&body, &HeaderMap::new(), sent - MAX_CLOCK_SKEW_SECS - 1)),
        Err(VerifyError::FutureTimestamp)
    );
}

#[test]
fn confirmations_without_token_are_rejected_without_fetch() {
    let mut msg: Value =
        serde_json::from_slice(&read(&fixtures().join("2025-cert-7506a1e3/subscription-confirmation.sv1.json")))
            .unwrap();
    msg.as_object_mut().unwrap().remove("Token");
    let topic = msg["TopicArn"].as_str().unwrap().to_owned();
    let getter = ServeOne::new(pem_2025());
    let got = block_on(verifier(getter.clone(), &topic).verify(
        &serde_json::to_vec(&msg).unwrap(),
        &HeaderMap::new(),
        FRESH_2025_SENT,
    ));
    assert!(matches!(got, Err(VerifyError::MalformedEnvelope(_))), "{got:?}");
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 0);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // RSA signing is slow in a debug build: fewer cases than the HMAC providers.
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// A message signed with the test certificate's key verifies (both
        /// signature versions, with or without a subject), its MessageId the
        /// identity and its SES type the event type; a changed Message,
        /// MessageId, Subject or signature byte is rejected.
        #[test]
        fn signed_messages_round_trip_and_mutations_are_rejected(
            id in "[a-f0-9-]{1,40}",
            status in prop::sample::select(vec!["Delivery", "Bounce", "Complaint", "Send"]),
            mail in "[a-zA-Z0-9]{1,20}",
            note in "\\PC{0,40}",
            subject in prop::option::of("[ -~]{1,30}"),
            version in prop::sample::select(vec!["1", "2"]),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let pem = read(&test_sns().join("SimpleNotificationService-0000test0000.pem"));
            let key = String::from_utf8(read(&test_sns().join("test-signing-key.pem"))).unwrap();
            let mut msg = generated_message("Notification", version, "test-signing-key.pem");
            msg.message_id = id.clone();
            msg.message = serde_json::json!({"eventType": status, "mail": {"messageId": mail}, "note": note}).to_string();
            msg.subject = subject.clone();
            signing::sign(&mut msg, &key).unwrap();
            let v = verifier(ServeOne::new(pem), &msg.topic_arn);
            let check = |m: &SnsMessage| block_on(v.verify(&serde_json::to_vec(m).unwrap(), &HeaderMap::new(), 1_800_000_000));
            let got = check(&msg).unwrap();
            prop_assert_eq!((got.event_id, got.event_type), (id, Some(format!("ses.{status}"))));

            let mut changed = msg.clone();
            changed.message.push(' ');
            prop_assert_eq!(check(&changed), Err(VerifyError::SignatureMismatch));
            let mut changed = msg.clone();
            changed.message_id.push('0');
            prop_assert_eq!(check(&changed), Err(VerifyError::SignatureMismatch));
            let mut changed = msg.clone();
            changed.subject = Some(format!("{}!", subject.unwrap_or_default()));
            prop_assert_eq!(check(&changed), Err(VerifyError::SignatureMismatch));
            let mut sig = base64::engine::general_purpose::STANDARD.decode(&msg.signature).unwrap();
            let i = at.index(sig.len());
            sig[i] ^= flip;
            let mut changed = msg.clone();
            changed.signature = base64::engine::general_purpose::STANDARD.encode(sig);
            prop_assert_eq!(check(&changed), Err(VerifyError::SignatureMismatch));
        }
    }
}
