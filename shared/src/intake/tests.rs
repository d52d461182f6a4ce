//! The intake's answers, and its port-level decisions on the memory world
//! (claim, duplicate, adoption, conflict and the send lease).

use super::*;

#[test]
fn answers_follow_retry_intent() {
    let cases: Vec<(Outcome, u16)> = vec![
        (Outcome::Accepted, 202),
        (Outcome::Duplicate { resent: false, conflict: false }, 200),
        (Outcome::Duplicate { resent: false, conflict: true }, 200),
        (Outcome::MethodNotAllowed, 405),
        (Outcome::UnknownEndpoint, 404),
        (Outcome::TooLarge { limit: 10 }, 413),
        (Outcome::Rejected(VerifyError::SignatureMismatch), 401),
        (Outcome::Rejected(VerifyError::StaleTimestamp), 401),
        (Outcome::Rejected(VerifyError::CertificateUrl("x")), 401),
        (Outcome::Rejected(VerifyError::TopicNotAllowed), 403),
        (Outcome::Rejected(VerifyError::MalformedPayload("x")), 400),
        (Outcome::Rejected(VerifyError::CertificateUnavailable), 503),
        (Outcome::Rejected(VerifyError::HandshakeRefused("x")), 403),
        (Outcome::Rejected(VerifyError::Unavailable("x")), 503),
        (Outcome::Unavailable { stage: "claim" }, 503),
    ];
    for (outcome, status) in cases {
        let a = outcome.answer();
        assert_eq!(a.status, status, "{outcome:?}");
        assert_eq!(a.retry_after.is_some(), status == 503, "{outcome:?}");
    }
}

/// Every code a rejection may answer with: the verifier's reasons and
/// `unavailable`. Clients and dashboards key on these; they never change.
const STABLE_CODES: [&str; 12] = [
    "missing_header",
    "malformed_header",
    "signature_mismatch",
    "stale_timestamp",
    "future_timestamp",
    "malformed_envelope",
    "certificate_url",
    "certificate_invalid",
    "unavailable",
    "topic_not_allowed",
    "malformed_payload",
    "handshake_refused",
];

/// The answer to a rejection: a 4xx with the error's stable code, or a
/// 503 (retry) only when the SNS certificate could not be fetched.
fn assert_rejection_answer(e: VerifyError) {
    let (shown, reason) = (format!("{e:?}"), e.reason());
    let unavailable = matches!(e, VerifyError::CertificateUnavailable | VerifyError::Unavailable(_));
    let a = Outcome::Rejected(e).answer();
    assert!(!a.code.is_empty(), "{shown}");
    assert!(STABLE_CODES.contains(&a.code), "{shown}: unstable code {}", a.code);
    if unavailable {
        assert_eq!((a.status, a.code, a.retry_after), (503, "unavailable", Some(RETRY_AFTER_SECS)));
    } else {
        assert!((400..500).contains(&a.status), "{shown} answered {}", a.status);
        assert_eq!(a.code, reason, "{shown}");
        assert_eq!(a.retry_after, None, "{shown}");
    }
    let body: serde_json::Value = serde_json::from_str(&a.body_json()).expect("the answer body is JSON");
    assert_eq!(body["code"], a.code);
}

mod proptests {
    use std::sync::Arc;

    use http::{HeaderName, HeaderValue};
    use proptest::prelude::*;

    use super::*;
    use crate::secret::Secret;
    use crate::verify::generic::{Encoding, GenericHmacConfig, GenericHmacVerifier, Source};
    use crate::verify::github::GithubVerifier;
    use crate::verify::sns::{CertificateCache, FetchError, HttpsGet, SnsVerifier};
    use crate::verify::standard::StandardWebhooksVerifier;
    use crate::verify::stripe::StripeVerifier;

    const DETAILS: [&str; 4] = ["", "x", "configured signature header", "stripe-signature"];

    /// Every variant of the verifier's error, with assorted details.
    fn any_verify_error() -> impl Strategy<Value = VerifyError> {
        let d = || prop::sample::select(&DETAILS[..]);
        prop_oneof![
            d().prop_map(VerifyError::MissingHeader),
            d().prop_map(VerifyError::MalformedHeader),
            Just(()).prop_map(|()| VerifyError::SignatureMismatch),
            Just(()).prop_map(|()| VerifyError::StaleTimestamp),
            Just(()).prop_map(|()| VerifyError::FutureTimestamp),
            d().prop_map(VerifyError::MalformedEnvelope),
            d().prop_map(VerifyError::CertificateUrl),
            d().prop_map(VerifyError::CertificateInvalid),
            Just(()).prop_map(|()| VerifyError::CertificateUnavailable),
            Just(()).prop_map(|()| VerifyError::TopicNotAllowed),
            d().prop_map(VerifyError::MalformedPayload),
            d().prop_map(VerifyError::HandshakeRefused),
            d().prop_map(VerifyError::Unavailable),
        ]
    }

    /// A compile-time reminder: a new variant must be added to
    /// `any_verify_error` above.
    #[allow(dead_code)]
    fn every_variant_is_generated(e: &VerifyError) {
        match e {
            VerifyError::MissingHeader(_)
            | VerifyError::MalformedHeader(_)
            | VerifyError::SignatureMismatch
            | VerifyError::StaleTimestamp
            | VerifyError::FutureTimestamp
            | VerifyError::MalformedEnvelope(_)
            | VerifyError::CertificateUrl(_)
            | VerifyError::CertificateInvalid(_)
            | VerifyError::CertificateUnavailable
            | VerifyError::TopicNotAllowed
            | VerifyError::MalformedPayload(_)
            | VerifyError::HandshakeRefused(_)
            | VerifyError::Unavailable(_) => {}
        }
    }

    /// No network: every certificate fetch fails at once.
    struct NoNetwork;

    impl HttpsGet for NoNetwork {
        fn get<'a>(
            &'a self,
            _url: &'a url::Url,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
            Box::pin(async { Err(FetchError::Failed("no network in tests".into())) })
        }
    }

    const HEADER_NAMES: [&str; 16] = [
        "stripe-signature",
        "x-hub-signature-256",
        "x-github-delivery",
        "x-github-event",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "svix-id",
        "svix-timestamp",
        "svix-signature",
        "x-sig",
        "x-ts",
        "x-id",
        "x-amz-sns-message-type",
        "content-type",
        "x-other",
    ];

    /// Header values as senders write them, plus noise.
    fn header_value() -> impl Strategy<Value = String> {
        prop_oneof![
            "t=[0-9]{1,12}(,v1=[0-9a-f]{0,64}){0,3}",
            "sha256=[0-9a-fA-F]{0,64}",
            "(v1,[A-Za-z0-9+/=]{0,44} ?){0,3}",
            "[0-9]{0,13}",
            "[ -~]{0,40}",
            "[a-zA-Z0-9_,= -]{0,20}",
        ]
    }

    /// Headers with repeated names kept as separate values or joined
    /// into one comma-separated value, as API Gateway does.
    fn headers() -> impl Strategy<Value = HeaderMap> {
        (
            prop::collection::vec(
                (prop::sample::select(&HEADER_NAMES[..]), prop::collection::vec(header_value(), 1..4)),
                0..6,
            ),
            any::<bool>(),
        )
            .prop_map(|(entries, join)| {
                let mut h = HeaderMap::new();
                for (name, values) in entries {
                    let name = HeaderName::from_static(name);
                    let values = if join { vec![values.join(",")] } else { values };
                    for v in values {
                        if let Ok(v) = HeaderValue::from_str(&v) {
                            h.append(name.clone(), v);
                        }
                    }
                }
                h
            })
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            r#"\{("(id|type|eventId|pending_webhooks|Type|MessageId)":("[a-z_0-9]{0,8}"|[0-9]{1,3}|null|\{\}|\[\]),?){0,4}\}?"#
                .prop_map(String::into_bytes),
        ]
    }

    fn generic(encoding: Encoding, timestamp: bool, id: Source) -> GenericHmacVerifier {
        let mut section = serde_json::json!({
            "signature_header": "x-sig",
            "prefix": if encoding == Encoding::Hex { "sha256=" } else { "" },
            "encoding": if encoding == Encoding::Hex { "hex" } else { "base64" },
            "signed_content": if timestamp { "{timestamp}.{body}" } else { "{body}" },
            "id": match &id { Source::Header(h) => serde_json::json!({"header": h}), Source::JsonPointer(p) => serde_json::json!({"json_pointer": p}), _ => unreachable!() },
            "type": {"json_pointer": "/type"},
        });
        if timestamp {
            section["timestamp_header"] = "x-ts".into();
        }
        let spec: crate::verify::provider::HmacSpec = serde_json::from_value(section).expect("a section");
        let config = GenericHmacConfig::from_spec(&spec, 300, None).expect("valid");
        GenericHmacVerifier::new(config, vec![Secret::new("s")]).expect("keys")
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime").block_on(f)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn every_rejection_answers_a_4xx_with_a_stable_code(e in any_verify_error()) {
            assert_rejection_answer(e);
        }

        /// Whatever a stranger sends, every verifier either accepts or
        /// rejects with an error that answers a 4xx (no certificate is
        /// reachable here, so SNS may also answer 503).
        #[test]
        fn every_verifier_rejection_of_random_requests_answers_a_4xx(
            body in body(),
            headers in headers(),
            now in prop_oneof![Just(1_700_000_000i64), any::<i64>()],
        ) {
            let secrets = || vec![Secret::new("s")];
            let sns = SnsVerifier::new(
                vec!["arn:aws:sns:us-east-1:123456789012:t".into()],
                Arc::new(CertificateCache::new(Arc::new(NoNetwork))),
            );
            let results = [
                StripeVerifier::new(secrets(), 300).verify(&body, &headers, now),
                GithubVerifier::new(secrets()).verify(&body, &headers),
                StandardWebhooksVerifier::new(secrets(), 300).verify(&body, &headers, now),
                generic(Encoding::Hex, true, Source::Header("x-id".into())).verify(&body, &headers, now),
                generic(Encoding::Base64, false, Source::JsonPointer("/eventId".into())).verify(&body, &headers, now),
                block_on(sns.verify(&body, &headers, now)),
            ];
            for result in results {
                if let Err(e) = result {
                    assert_rejection_answer(e);
                }
            }
        }
    }
}

#[test]
fn unavailable_answers_leak_nothing_internal() {
    let a = Outcome::Unavailable { stage: "claim" }.answer();
    assert!(!a.body_json().contains("claim"));
    let body: serde_json::Value = serde_json::from_str(&a.body_json()).unwrap();
    assert_eq!(body["code"], "unavailable");
}

/// The intake over the memory world's ledger and queue: every decision
/// between the verified request and its answer.
mod ports {
    use std::time::Duration;

    use hmac::{Hmac, KeyInit, Mac};
    use http::HeaderValue;
    use serde_json::json;
    use sha2::Sha256;

    use super::*;
    use crate::adapters::memory::{Fault, MemLedger, MemQueue, World};
    use crate::config::ProviderKind;
    use crate::ledger::SendLease;
    use crate::secret::Secret;
    use crate::verify::generic::{GenericHmacConfig, GenericHmacVerifier};

    const NOW_MS: i64 = 1_800_000_000_000;
    const SECRET: &str = "s3cret";

    struct Harness {
        world: World,
        intake: Intake<MemLedger, MemQueue>,
    }

    fn harness() -> Harness {
        harness_with(crate::redaction::PayloadPolicy::Keep)
    }

    fn harness_with(payload: crate::redaction::PayloadPolicy) -> Harness {
        let world = World::new(Ambient::fixed(NOW_MS, 5)).with_shards(16);
        let spec: crate::verify::provider::HmacSpec = serde_json::from_value(json!({
            "signature_header": "x-sig", "prefix": "sha256=", "encoding": "hex",
            "id": {"json_pointer": "/id"}, "type": {"json_pointer": "/type"}}))
        .expect("a section");
        let config = GenericHmacConfig::from_spec(&spec, 300, None).expect("valid");
        let verifier = GenericHmacVerifier::new(config, vec![Secret::new(SECRET)]).expect("keys");
        let endpoint = Endpoint {
            name: "ep".into(),
            tenant: "t1".into(),
            provider: ProviderKind::HMAC,
            verifier: Box::new(verifier),
            payload,
            erasable: false,
        };
        let settings = Settings {
            table_name: "memory".into(),
            queue_url: "memory".into(),
            max_body_bytes: 1024 * 1024,
            retention_days: 30,
            index_shards: 16,
            payload_bucket: None,
        };
        let quiltt = Endpoint {
            name: "q".into(),
            tenant: "t1".into(),
            provider: ProviderKind::QUILTT,
            verifier: Box::new(crate::verify::quiltt::QuilttVerifier::new(vec![Secret::new(SECRET)], 300)),
            payload: Default::default(),
            erasable: false,
        };
        let endpoints = BTreeMap::from([("ep".to_owned(), endpoint), ("q".to_owned(), quiltt)]);
        let intake =
            Intake::new(endpoints, settings, world.ledger(), world.queue()).with_ambient(world.ambient().clone());
        Harness { world, intake }
    }

    fn body(id: &str, v: u32) -> Vec<u8> {
        json!({"id": id, "type": "thing.changed", "v": v}).to_string().into_bytes()
    }

    impl Harness {
        /// A signed delivery of `body`, `after_ms` after the start.
        async fn deliver(&self, body: &[u8], after_ms: i64) -> Answer {
            let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
            mac.update(body);
            let mut headers = HeaderMap::new();
            let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
            headers.insert("x-sig", HeaderValue::from_str(&sig).unwrap());
            let now = UNIX_EPOCH + Duration::from_millis((NOW_MS + after_ms) as u64);
            let req = IntakeRequest {
                query: "",
                endpoint: "ep",
                method: &Method::POST,
                headers: &headers,
                body,
                now,
                request_id: "r",
            };
            self.intake.handle(req).await
        }

        fn key(&self, id: &str) -> EventKey {
            EventKey::new("hmac", "ep", id)
        }

        /// A Quiltt batch delivery of `body`, signed as Quiltt signs.
        async fn deliver_batch(&self, body: &[u8], after_ms: i64) -> Answer {
            let now_ms = NOW_MS + after_ms;
            let mut headers = HeaderMap::new();
            let sig = crate::verify::quiltt::sign(&Secret::new(SECRET), now_ms / 1000, body);
            headers.insert("quiltt-signature", HeaderValue::from_str(&sig).unwrap());
            headers.insert("quiltt-timestamp", HeaderValue::from(now_ms / 1000));
            let now = UNIX_EPOCH + Duration::from_millis(now_ms as u64);
            let req = IntakeRequest {
                query: "",
                endpoint: "q",
                method: &Method::POST,
                headers: &headers,
                body,
                now,
                request_id: "r",
            };
            self.intake.handle(req).await
        }

        fn quiltt_key(&self, id: &str) -> EventKey {
            EventKey::new("quiltt", "q", id)
        }

        fn field(&self, id: &str, name: &str) -> Option<String> {
            self.world.ledger().field(&self.key(id), name)
        }

        fn sent(&self) -> usize {
            self.world.queue().keys().len()
        }

        fn writes(&self) -> u64 {
            self.world.state().table.writes()
        }
    }

    #[tokio::test]
    async fn a_new_event_is_claimed_with_its_payload_and_queued_once() {
        let h = harness();
        let a = h.deliver(&body("e1", 1), 0).await;
        assert_eq!((a.status, a.code), (202, "accepted"));
        let calls: Vec<String> = h.world.calls().into_iter().map(|c| c.split(' ').next().unwrap().to_owned()).collect();
        // The first new event of an activity window notes it (once per
        // container and window); every other event: two round trips.
        assert_eq!(calls, ["activity.note", "ledger.claim", "queue.send"]);
        assert_eq!(h.field("e1", "status").as_deref(), Some("RECEIVED"));
        let (_, _, payload) =
            crate::adapters::memory::ready(crate::ports::OperatorLedger::show(&h.world.ledger(), &h.key("e1"), true))
                .unwrap()
                .unwrap();
        assert_eq!(payload, Some(body("e1", 1)), "the payload is durable with the claim");
        assert_eq!(h.world.queue().keys(), [h.key("e1")]);
        h.world.clear_calls();
        assert_eq!(h.deliver(&body("e2", 2), 0).await.status, 202);
        let calls: Vec<String> = h.world.calls().into_iter().map(|c| c.split(' ').next().unwrap().to_owned()).collect();
        assert_eq!(calls, ["ledger.claim", "queue.send"], "two round trips");
    }

    #[tokio::test]
    async fn a_redacting_endpoint_stores_and_queues_only_what_it_keeps_and_knows_its_retry() {
        let policy = serde_json::from_value(json!({
            "policy": "redact", "remove": ["/card"], "mask": ["/customer/email"]}))
        .unwrap();
        let h = harness_with(policy);
        let raw = br#"{"id": "e1", "type": "thing.changed", "card": "MARKER-4242",
            "customer": {"email": "MARKER@x.example", "plan": "pro"}, "v": 1}"#;
        let a = h.deliver(raw, 0).await;
        assert_eq!((a.status, a.code), (202, "accepted"));
        let expected = br#"{"id": "e1", "type": "thing.changed",
            "customer": {"email": "[redacted]", "plan": "pro"}, "v": 1}"#;
        let (_, _, payload) =
            crate::adapters::memory::ready(crate::ports::OperatorLedger::show(&h.world.ledger(), &h.key("e1"), true))
                .unwrap()
                .unwrap();
        assert_eq!(payload.as_deref(), Some(&expected[..]), "stored: the redacted bytes, every other byte kept");
        let bodies = h.world.queue().bodies();
        assert_eq!(bodies.len(), 1);
        assert!(!bodies.iter().any(|b| b.contains("MARKER")), "queued: no redacted value");
        assert_eq!(h.field("e1", "payload_policy").as_deref(), Some("redact"));
        assert_eq!(h.field("e1", "payload_hash"), Some(crate::identity::payload_hash(expected)));
        assert_eq!(h.field("e1", "verified_hash"), Some(crate::identity::payload_hash(raw)));
        // Its retry, the same bytes: a duplicate, nothing stored or sent again.
        let again = h.deliver(raw, 1_000).await;
        assert_eq!((again.status, again.code), (200, "duplicate"));
        assert_eq!(h.sent(), 1);
        // A policy that keeps everything: no mark on the record.
        let keep = harness();
        assert_eq!(keep.deliver(raw, 0).await.status, 202);
        assert_eq!(keep.field("e1", "payload_policy"), None);
        assert_eq!(keep.field("e1", "verified_hash"), None);
        assert!(keep.world.queue().bodies()[0].contains("MARKER"), "the control: keep queues the whole payload");
    }

    /// An erasable endpoint: what is stored and queued is sealed under the
    /// event's own key (no plaintext anywhere), its retry is a duplicate,
    /// the operator reads it opened; `erase` leaves a record in flight
    /// alone, then, finished, destroys its key, removes its copies and
    /// marks it; every copy left (the queue's) no longer opens, and a later
    /// delivery is a 200 duplicate that stores and queues nothing.
    #[tokio::test]
    async fn an_erasable_endpoint_seals_what_it_stores_and_queues_and_its_erasure_reaches_every_copy() {
        use crate::ports::{PayloadKeys, WorkLedger};
        let mut h = harness();
        let keys = std::sync::Arc::new(h.world.keys());
        h.intake.endpoints.get_mut("ep").unwrap().erasable = true;
        h.intake.keys = Some(keys.clone());
        let raw = br#"{"id": "e1", "type": "thing.changed", "email": "MARKER@x.example", "v": 1}"#;
        let a = h.deliver(raw, 0).await;
        assert_eq!((a.status, a.code), (202, "accepted"));
        let key = h.key("e1");
        // Every value of every item, and every queued message (dead letters too).
        let scan = |w: &World| -> Vec<Vec<u8>> {
            let mut out: Vec<Vec<u8>> = w
                .state()
                .table
                .items()
                .flat_map(|i| i.values())
                .filter_map(|v| {
                    v.as_b().ok().map(|b| b.as_ref().to_vec()).or_else(|| v.as_s().ok().map(|s| s.clone().into_bytes()))
                })
                .collect();
            out.extend(w.queue().bodies().into_iter().map(String::into_bytes));
            out
        };
        let has_marker = |bytes: &[u8]| bytes.windows(6).any(|w| w == b"MARKER");
        assert!(!scan(&h.world).iter().any(|b| has_marker(b)), "no plaintext stored or queued");
        assert_eq!(
            h.field("e1", "payload_hash"),
            Some(crate::identity::payload_hash(raw)),
            "the hash of what it seals"
        );
        let led = h.world.ledger();
        let (_, _, stored) = crate::ports::OperatorLedger::show(&led, &key, true).await.unwrap().unwrap();
        let opened = crate::ports::open_payload(Some(keys.as_ref()), &key, stored.unwrap()).await.unwrap();
        assert_eq!(opened.as_deref(), Ok(&raw[..]), "it opens under the event's key");
        let again = h.deliver(raw, 1_000).await;
        assert_eq!((again.status, again.code), (200, "duplicate"), "its retry seals the same bytes");
        assert_eq!(h.sent(), 1);

        // Erased once finished, as `hookledger erase` does it (`ops`): the
        // key destroyed, then the ledger's copies.
        assert!(matches!(
            led.lease(&key, "tok", NOW_MS + 3_000, 30_000).await.unwrap(),
            crate::ledger::LeaseResult::Leased(_)
        ));
        led.commit(&key, "tok", &[], "applied", Some("cus_1"), NOW_MS + 3_100).await.unwrap();
        keys.destroy(&key, "ops", NOW_MS + 4_000, 0).await.unwrap();
        let hash = h.field("e1", "payload_hash").unwrap();
        let entry = crate::audit::AuditEntry::new("", 0, "", "", &crate::audit::Caller::named("ops")).because("asked");
        let erased = crate::ports::OperatorLedger::erase(&led, &key, &hash, &entry, NOW_MS + 4_000).await.unwrap();
        assert_eq!(erased, crate::ledger::Erasure::Erased);
        assert!(h.field("e1", "erased_at").is_some() && h.field("e1", "body").is_none());
        for copy in scan(&h.world).into_iter().filter(|b| crate::sealing::is_sealed(b) || b.starts_with(b"{")) {
            let bytes = match serde_json::from_slice::<crate::adapters::sqs::WorkMessage>(&copy) {
                Ok(m) => m.payload().unwrap_or_default(),
                Err(_) => copy,
            };
            let opened = crate::ports::open_payload(Some(keys.as_ref()), &key, bytes.clone()).await.unwrap();
            assert!(opened.is_err() || !has_marker(&opened.unwrap()), "a copy still opens");
            assert!(!has_marker(&bytes));
        }
        let later = h.deliver(raw, 10_000).await;
        assert_eq!((later.status, later.code), (200, "duplicate"), "a later delivery is a duplicate");
        assert_eq!(h.sent(), 1, "and queues nothing");
        assert!(h.field("e1", "body").is_none(), "and stores nothing");
    }

    #[tokio::test]
    async fn a_redacting_endpoints_batch_is_redacted_event_by_event_even_when_large() {
        let policy: crate::redaction::PayloadPolicy =
            serde_json::from_value(json!({"policy": "redact", "remove": ["/record/email"]})).unwrap();
        let mut h = harness_with(policy.clone());
        // Quiltt's endpoint redacts too, and a batch of 3 counts as large here.
        let quiltt = h.intake.endpoints.get_mut("q").unwrap();
        quiltt.payload = policy;
        h.intake.set_large_batch_over(2);
        let events: Vec<serde_json::Value> = (1..=3)
            .map(|i| {
                json!({"id": format!("q{i}"), "type": "account.created", "at": "2027-01-15T08:00:00Z",
                       "profile": {"id": "p_demo"}, "record": {"email": format!("MARKER{i}"), "n": i}})
            })
            .collect();
        let body = serde_json::to_vec(&json!({"environment": {"id": "env_demo"}, "eventTypes": ["account.created"],
                                              "events": events}))
        .unwrap();
        let a = h.deliver_batch(&body, 0).await;
        assert_eq!(a.status, 202, "{a:?}");
        let bodies = h.world.queue().bodies();
        assert_eq!(bodies.len(), 3, "claimed event by event, never whole: {bodies:?}");
        assert!(!bodies.iter().any(|b| b.contains("MARKER")));
        for i in 1..=3 {
            let (_, _, payload) = crate::adapters::memory::ready(crate::ports::OperatorLedger::show(
                &h.world.ledger(),
                &h.quiltt_key(&format!("q{i}")),
                true,
            ))
            .unwrap()
            .unwrap();
            let stored = String::from_utf8(payload.unwrap()).unwrap();
            assert!(!stored.contains("MARKER") && stored.contains(&format!("\"n\":{i}")), "{stored}");
        }
    }

    #[test]
    fn an_unredactable_payload_is_refused_with_422_and_says_nothing_was_stored() {
        let a = Outcome::Unredactable.answer();
        assert_eq!((a.status, a.code), (422, "unredactable"));
        assert!(a.detail.contains("nothing was stored"));
    }

    #[tokio::test]
    async fn a_duplicate_of_a_sent_record_writes_nothing_and_sends_nothing() {
        let h = harness();
        h.deliver(&body("e1", 1), 0).await;
        h.world.ledger().edit(&h.key("e1"), |i| crate::adapters::memory::set(i, "enqueued_at", NOW_MS));
        let writes = h.writes();
        let a = h.deliver(&body("e1", 1), 1_000).await;
        assert_eq!((a.status, a.code), (200, "duplicate"));
        assert_eq!((h.writes(), h.sent()), (writes, 1), "one refused claim, no write, no send");
    }

    #[tokio::test]
    async fn a_duplicate_within_the_senders_lease_is_left_to_it_and_after_it_is_resent_once() {
        let h = harness();
        h.deliver(&body("e1", 1), 0).await;
        assert_eq!(h.sent(), 1);
        // The first delivery's lease is live: it sends; the duplicate does not.
        let a = h.deliver(&body("e1", 1), 1_000).await;
        assert_eq!((a.status, h.sent()), (200, 1));
        // The lease lapsed and nobody noted a send: the duplicate takes the
        // lease and hands the key over.
        let later = crate::policy::SEND_LEASE_MS + 1;
        let a = h.deliver(&body("e1", 1), later).await;
        assert_eq!((a.status, a.code, h.sent()), (200, "duplicate", 2));
        assert!(h.field("e1", "send_token").is_some());
        // Its lease is live now: the next duplicate leaves it alone.
        assert_eq!(h.deliver(&body("e1", 1), later + 1).await.status, 200);
        assert_eq!(h.sent(), 2);
    }

    #[tokio::test]
    async fn the_same_id_with_another_payload_is_a_conflict_that_keeps_the_first() {
        let h = harness();
        h.deliver(&body("e1", 1), 0).await;
        let a = h.deliver(&body("e1", 2), 1_000).await;
        assert_eq!((a.status, a.code), (200, "duplicate_conflict"));
        assert_eq!(h.field("e1", "conflicts").as_deref(), Some("1"));
        assert_eq!(h.field("e1", "last_conflict_hash"), Some(crate::identity::payload_hash(&body("e1", 2))));
        assert_eq!(h.field("e1", "payload_hash"), Some(crate::identity::payload_hash(&body("e1", 1))), "first kept");
    }

    #[tokio::test]
    async fn a_record_whose_payload_was_never_stored_adopts_the_deliverys() {
        for (label, second) in [("same bytes", body("e1", 1)), ("other bytes", body("e1", 2))] {
            let h = harness();
            // A record of an earlier release: claimed, its payload never stored.
            let first = body("e1", 1);
            let e = crate::ledger::NewEvent {
                key: h.key("e1"),
                provider: "hmac".into(),
                endpoint: "ep".into(),
                tenant: "t1".into(),
                event_id: "e1".into(),
                event_type: None,
                payload_hash: crate::identity::payload_hash(&first),
                content_hash: crate::identity::payload_hash(&first),
                received_at_ms: NOW_MS - 600_000,
                expires_at: NOW_MS / 1000 + 86_400,
                shard: 0,
                send: SendLease { token: "old".into(), until_ms: NOW_MS - 590_000 },
                via: crate::ledger::Via::Webhook,
                batch_hash: None,
                kept: None,
                notification: None,
            };
            h.world.ledger().arrange(&e, b"", |i| {
                i.remove("body");
                crate::adapters::memory::set(i, "content_hash", crate::adapters::memory::Value::Gone);
                crate::adapters::memory::set(i, "payload_stored", false);
            });
            let a = h.deliver(&second, 0).await;
            assert_eq!(a.status, 200, "{label}: {a:?}");
            assert_eq!(h.field("e1", "payload_stored").as_deref(), Some("true"), "{label}");
            assert_eq!(h.field("e1", "payload_hash"), Some(crate::identity::payload_hash(&second)), "{label}");
            let payload = crate::adapters::memory::ready(crate::ports::WorkLedger::payload(
                &h.world.ledger(),
                &h.key("e1"),
                &crate::identity::payload_hash(&second),
            ))
            .unwrap();
            assert_eq!(payload, Some(second.clone()), "{label}: ours is the payload");
            assert_eq!(h.sent(), 1, "{label}: the sender let go long ago: handed over");
        }
    }

    #[tokio::test]
    async fn a_claim_that_committed_with_its_acknowledgements_lost_gives_its_lease_back() {
        let h = harness();
        h.world.inject("ledger.claim", 0, Some(1), Fault::LoseAckAlways);
        let a = h.deliver(&body("e1", 1), 0).await;
        assert_eq!((a.status, a.retry_after), (503, Some(RETRY_AFTER_SECS)));
        assert_eq!(h.field("e1", "status").as_deref(), Some("RECEIVED"), "the claim landed");
        assert_eq!(h.field("e1", "send_lease_until"), None, "its lease given back");
        // The provider's retry finds the record, the lease free: it sends.
        let a = h.deliver(&body("e1", 1), 1_000).await;
        assert_eq!((a.status, a.code, h.sent()), (200, "duplicate", 1));
    }

    /// A claim the ledger refuses as invalid is still a 503: the sender
    /// keeps the event and retries (a 4xx would drop a genuine event); the
    /// refusal is counted apart (`intake_caller_error`).
    #[tokio::test]
    async fn a_claim_refused_as_invalid_is_still_a_503() {
        let h = harness();
        h.world.inject("ledger.claim", 0, Some(1), Fault::Invalid);
        let a = h.deliver(&body("e1", 1), 0).await;
        assert_eq!((a.status, a.retry_after, h.sent()), (503, Some(RETRY_AFTER_SECS), 0));
        assert_eq!(h.field("e1", "status"), None, "nothing written");
        assert_eq!(h.deliver(&body("e1", 1), 1_000).await.status, 202, "the retry is recorded");
    }

    #[tokio::test]
    async fn a_claim_whose_acknowledgement_was_lost_once_is_still_new() {
        let h = harness();
        h.world.inject("ledger.claim", 0, Some(1), Fault::LoseAckOnce);
        let a = h.deliver(&body("e1", 1), 0).await;
        assert_eq!((a.status, a.code, h.sent()), (202, "accepted", 1), "our own retried put, not a duplicate");
        // The large path: a transaction retried with its token.
        let big = json!({"id": "e2", "type": "t", "pad": (0..3_000).map(|i| (i * 7919 % 97) as u8 as char).collect::<String>()})
            .to_string()
            .into_bytes();
        h.world.inject("ledger.claim", 0, Some(1), Fault::LoseAckOnce);
        assert_eq!(h.deliver(&big, 0).await.status, 202);
    }

    #[tokio::test]
    async fn a_failed_send_gives_the_lease_back_so_the_retry_sends_at_once() {
        let h = harness();
        h.world.inject("queue.send", 0, Some(1), Fault::Unavailable);
        let a = h.deliver(&body("e1", 1), 0).await;
        assert_eq!(a.status, 503);
        assert_eq!(h.field("e1", "send_lease_until"), None);
        let a = h.deliver(&body("e1", 1), 1_000).await;
        assert_eq!((a.status, h.sent()), (200, 1), "resent by the retry, within the first lease's time");
    }

    #[tokio::test]
    async fn storage_faults_answer_503_and_store_nothing_half() {
        let h = harness();
        h.world.inject("ledger.claim", 0, Some(1), Fault::Throttle);
        let a = h.deliver(&body("e1", 1), 0).await;
        assert_eq!((a.status, a.code), (503, "unavailable"));
        assert!(h.world.ledger().keys().is_empty());
        assert_eq!(h.deliver(&body("e1", 1), 1).await.status, 202);
    }

    #[tokio::test]
    async fn a_delivery_releases_a_record_a_backfill_parked_without_its_payload() {
        let h = harness();
        let parked = crate::ledger::NewEvent {
            key: h.key("e1"),
            provider: "hmac".into(),
            endpoint: "ep".into(),
            tenant: "t1".into(),
            event_id: "e1".into(),
            event_type: None,
            payload_hash: crate::ledger::NO_PAYLOAD_HASH.into(),
            content_hash: String::new(),
            received_at_ms: NOW_MS - 1_000,
            expires_at: NOW_MS / 1000 + 86_400,
            shard: 0,
            send: SendLease { token: "backfill".into(), until_ms: NOW_MS - 1_000 },
            via: crate::ledger::Via::Backfill,
            batch_hash: None,
            kept: None,
            notification: None,
        };
        let u = crate::ports::UnfetchedEvent {
            reason: "backfill_unrecoverable:no_payload",
            detail: "listed without a payload",
            handle: None,
            origin: None,
            created_s: 1,
        };
        let l = h.world.ledger();
        assert_eq!(
            crate::adapters::memory::ready(crate::ports::BackfillLedger::park(&l, &parked, &u)).unwrap(),
            crate::ledger::Claim::New
        );
        let a = h.deliver(&body("e1", 1), 0).await;
        assert_eq!((a.status, a.code), (202, "accepted"));
        assert_eq!(h.field("e1", "status").as_deref(), Some("RECEIVED"));
        assert_eq!(h.field("e1", "released_by").as_deref(), Some("webhook"));
        assert_eq!(h.sent(), 1);
        // A second delivery is a duplicate.
        assert_eq!(h.deliver(&body("e1", 1), 1).await.code, "duplicate");
    }

    fn quiltt_batch(ids: &[&str]) -> Vec<u8> {
        let events: Vec<(&str, &str)> = ids.iter().map(|id| (*id, "account.created")).collect();
        crate::verify::quiltt::batch(&events, "2027-01-15T08:00:00Z")
    }

    /// Issue 23.3: each event of a batch is its own record, whose payload is
    /// the event's exact bytes in the batch; the claims come first, then one
    /// send of the new ones.
    #[tokio::test]
    async fn a_batch_is_one_record_per_event_each_with_its_own_bytes() {
        let h = harness();
        let body = quiltt_batch(&["evt_1", "evt_2", "evt_3"]);
        let a = h.deliver_batch(&body, 0).await;
        assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
        let calls: Vec<String> = h.world.calls().into_iter().map(|c| c.split(' ').next().unwrap().to_owned()).collect();
        let want = ["activity.note"].into_iter().chain(["ledger.claim"; 3]).chain(["queue.send"; 3]);
        assert_eq!(calls, want.collect::<Vec<_>>());
        let events = crate::verify::quiltt::events(&body).unwrap();
        for e in &events {
            let k = h.quiltt_key(&e.event_id);
            let (_, _, payload) =
                crate::adapters::memory::ready(crate::ports::OperatorLedger::show(&h.world.ledger(), &k, true))
                    .unwrap()
                    .unwrap();
            assert_eq!(payload.as_deref(), Some(&body[e.bytes.clone()]), "{k}: the event's own bytes");
            assert_eq!(
                h.world.ledger().field(&k, "payload_hash"),
                Some(crate::identity::payload_hash(&body[e.bytes.clone()]))
            );
            assert_eq!(h.world.ledger().field(&k, "event_type").as_deref(), Some("account.created"));
            assert_eq!(h.world.ledger().field(&k, "batch_hash"), Some(crate::identity::payload_hash(&body)), "{k}");
        }
        let mut sent = h.world.queue().keys();
        sent.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        assert_eq!(sent, ["evt_1", "evt_2", "evt_3"].map(|id| h.quiltt_key(id)));
    }

    #[tokio::test]
    async fn a_batch_again_is_a_duplicate_and_only_new_events_are_recorded() {
        let h = harness();
        let body = quiltt_batch(&["evt_1", "evt_2", "evt_3"]);
        assert_eq!(h.deliver_batch(&body, 0).await.status, 202);
        let a = h.deliver_batch(&body, 1_000).await;
        assert_eq!((a.status, a.code), (200, "duplicate"), "{}", a.detail);
        assert_eq!(h.sent(), 3, "nothing sent again");
        // One of them again, in a new batch beside a new one.
        let mixed = quiltt_batch(&["evt_2", "evt_4"]);
        let a = h.deliver_batch(&mixed, 2_000).await;
        assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
        assert!(a.detail.starts_with("1 events of the batch recorded"), "{}", a.detail);
        assert_eq!(h.sent(), 4);
        assert_eq!(h.world.ledger().field(&h.quiltt_key("evt_4"), "status").as_deref(), Some("RECEIVED"));
    }

    /// A claim that fails answers 503 for the whole delivery; the sender's
    /// retry meets the others as duplicates and records the one left.
    #[tokio::test]
    async fn a_batch_with_a_failed_claim_is_retried_whole_and_nothing_is_doubled() {
        let h = harness();
        let body = quiltt_batch(&["evt_1", "evt_2", "evt_3"]);
        let target = h.quiltt_key("evt_2");
        h.world.inject_on("ledger.claim", target.as_str(), Some(1), Fault::Unavailable);
        let a = h.deliver_batch(&body, 0).await;
        assert_eq!(a.status, 503);
        assert_eq!(h.sent(), 2, "the others are recorded and sent");
        // Within the others' send leases (after them, a duplicate of a record
        // the intake does not know to be sent hands it over again, which the
        // processor's lease absorbs, as for a single delivery).
        let a = h.deliver_batch(&body, 1_000).await;
        assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
        assert!(a.detail.starts_with("1 events of the batch recorded"), "{}", a.detail);
        let mut sent = h.world.queue().keys();
        sent.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        assert_eq!(sent, ["evt_1", "evt_2", "evt_3"].map(|id| h.quiltt_key(id)), "each once");
    }

    /// An authenticated batch with an element without an id: the valid
    /// events are recorded and queued as usual, the bad one is recorded
    /// under the hash of its bytes (kept as they are, for an operator; the
    /// processor parks it) and the delivery is answered 2xx, so the provider
    /// stops resending it; its retry meets every one as a duplicate.
    #[tokio::test]
    async fn a_batch_with_an_event_without_an_id_records_the_others_and_keeps_it_apart() {
        let h = harness();
        let body = br#"{"events":[{"id":"evt_1","type":"a"},{"type":"b","x":1},{"id":"evt_3","type":"c"}]}"#;
        let a = h.deliver_batch(body, 0).await;
        assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
        let bad = format!(
            "{}{}",
            crate::verify::MALFORMED_ID_PREFIX,
            crate::identity::payload_hash(br#"{"type":"b","x":1}"#)
        );
        for id in ["evt_1", bad.as_str(), "evt_3"] {
            let k = h.quiltt_key(id);
            assert_eq!(h.world.ledger().field(&k, "status").as_deref(), Some("RECEIVED"), "{id}");
        }
        let kept = h.world.ledger().record(&h.quiltt_key(&bad)).unwrap();
        let stored = match kept.payload {
            Some(p) => Some(p),
            None => crate::ports::WorkLedger::payload(&h.world.ledger(), &kept.key, &kept.payload_hash).await.unwrap(),
        };
        assert_eq!(stored.as_deref(), Some(&br#"{"type":"b","x":1}"#[..]), "the bad element's bytes are kept");
        assert_eq!(h.sent(), 3);
        let again = h.deliver_batch(body, 1_000).await;
        assert_eq!((again.status, again.code), (200, "duplicate"), "{}", again.detail);
        assert_eq!(h.sent(), 3);
        // An unauthenticated batch is still refused whole.
        let mut headers = HeaderMap::new();
        headers.insert("quiltt-signature", HeaderValue::from_static("bm90IGl0"));
        headers.insert("quiltt-timestamp", HeaderValue::from(NOW_MS / 1000));
        let forged = h
            .intake
            .handle(IntakeRequest {
                query: "",
                endpoint: "q",
                method: &Method::POST,
                headers: &headers,
                body: br#"{"events":[{"id":"evt_9","type":"a"},{"type":"b"}]}"#,
                now: UNIX_EPOCH + Duration::from_millis(NOW_MS as u64),
                request_id: "r",
            })
            .await;
        assert_eq!(forged.status, 401);
        assert_eq!(h.world.ledger().field(&h.quiltt_key("evt_9"), "status"), None);
    }
}
