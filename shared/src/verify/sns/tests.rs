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
        Box::pin(async { Err(FetchError("connection refused".into())) })
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A moment inside the certificate's validity (the fixtures are expired).
fn inside_validity(pem: &[u8]) -> i64 {
    parse_certificate(pem).unwrap().not_before + 86_400
}

fn verifier(getter: Arc<dyn HttpsGet>, topic: &str) -> SnsVerifier {
    SnsVerifier::new(vec![topic.to_owned()], Arc::new(CertificateCache::new(getter)))
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
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

            let getter = ServeOne::new(pem.clone());
            let got = block_on(verifier(getter.clone(), &msg.topic_arn).verify(
                &body,
                &HeaderMap::new(),
                inside_validity(&pem),
            ));
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
        let got = block_on(verifier(getter.clone(), &parsed.topic_arn).verify(
            &body,
            &HeaderMap::new(),
            inside_validity(&pem),
        ));
        let url_ok = validate_certificate_url(&parsed.signing_cert_url).is_ok();
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
        inside_validity(&pem),
    ));
    assert_eq!(got, Err(VerifyError::TopicNotAllowed));
    assert_eq!(getter.fetches.load(Ordering::SeqCst), 0);
}

#[test]
fn subscription_confirmation_for_an_allowed_topic_asks_to_visit_the_url() {
    let (pem, _) = genuine("2025-cert-7506a1e3");
    let body = read(&fixtures().join("2025-cert-7506a1e3/subscription-confirmation.sv1.json"));
    let msg: SnsMessage = serde_json::from_slice(&body).unwrap();
    let got = block_on(verifier(ServeOne::new(pem.clone()), &msg.topic_arn).verify(
        &body,
        &HeaderMap::new(),
        inside_validity(&pem),
    ))
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
        inside_validity(&pem),
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
            inside_validity(&pem),
        ))
        .unwrap();
        assert_eq!(got.event_type.as_deref(), Some(ty));
        assert_eq!(got.action, Action::Record);
    }
}

#[test]
fn expired_certificates_and_fetch_failures_are_distinguished() {
    let (pem, _) = genuine("2021-cert-7ff53184");
    let body = read(&fixtures().join("2021-cert-7ff53184/notification-no-subject.sv2.json"));
    let msg: SnsMessage = serde_json::from_slice(&body).unwrap();
    let expired =
        block_on(verifier(ServeOne::new(pem.clone()), &msg.topic_arn).verify(&body, &HeaderMap::new(), 1_800_000_000));
    assert!(matches!(expired, Err(VerifyError::CertificateInvalid(_))), "{expired:?}");
    let down =
        block_on(verifier(Arc::new(Unreachable), &msg.topic_arn).verify(&body, &HeaderMap::new(), 1_800_000_000));
    assert_eq!(down, Err(VerifyError::CertificateUnavailable));
}

fn generated_message(kind: &str, version: &str, key_file: &str) -> SnsMessage {
    let mut msg = SnsMessage {
        kind: kind.to_owned(),
        message_id: "0f8b6a2e-test".to_owned(),
        topic_arn: "arn:aws:sns:eu-west-1:123456789012:ses-events".to_owned(),
        message: r#"{"notificationType":"Delivery","mail":{"messageId":"m-1"}}"#.to_owned(),
        timestamp: "2026-11-29T12:00:00.000Z".to_owned(),
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
