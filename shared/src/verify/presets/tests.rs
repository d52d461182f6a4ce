//! Every preset, as its provider sends: signed deliveries verify with the
//! right identity; a tampered body, a wrong secret and a stale timestamp
//! are refused; a retry (new timestamp and signature, retry counters
//! changed) is the same event with the same content.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::*;
use crate::verify::hashes::delivery_hashes;

const SECRET: &str = "preset-test-secret";
const NOW: i64 = 1_800_000_000;
const EVENT: &str = "0f8fad5bd9cb469fa16570867728950e";

pub(super) fn spec_of(name: &str) -> EndpointSpec {
    let p = PRESETS.iter().find(|p| p.name == name);
    let mut v = serde_json::json!({"provider": name, "secrets": ["env:A"]});
    if p.is_some_and(|p| p.public_url) {
        v["public_url"] = format!("https://hooks.example.com/webhooks/{name}").into();
    }
    if p.is_some_and(|p| p.takes_verify_token()) {
        v["verify_token"] = "env:T".into();
    }
    serde_json::from_value(v).unwrap()
}

fn verifier(p: &Preset, spec: &EndpointSpec, secret: &str) -> PresetVerifier {
    let inner = GenericHmacVerifier::new(p.config(spec).unwrap(), vec![Secret::new(secret)]).unwrap();
    let (batch, mask, replies) = preset_batch(p.name);
    let listed = PRESETS.iter().find(|x| x.name == p.name);
    let get = listed.and_then(|x| x.get.as_ref());
    let retype = listed.map_or(&[][..], |x| x.retype);
    PresetVerifier { inner, batch, mask, replies, retype, get, verify_token: Some(Secret::new("meta-verify-token")) }
}

fn header_map(pairs: &[(String, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    h
}

/// A delivery of `body` as the preset's provider sends it at `now`.
fn deliver(p: &Preset, spec: &EndpointSpec, body: Vec<u8>, now: i64) -> (Vec<u8>, HeaderMap) {
    let secret = Secret::new(SECRET);
    let body = p.seal(spec, &secret, now, body).unwrap();
    let headers = p.sign(spec, &secret, EVENT, "demo.event", now, &body).unwrap();
    (body, header_map(&headers))
}

fn check(v: &PresetVerifier, body: &[u8], headers: &HeaderMap, now: i64) -> Result<Verified, VerifyError> {
    v.verify_now(&Delivery { body, headers, method: &http::Method::POST, query: "" }, now)
}

/// The `(id, content hash)` of every event a verified delivery carries.
fn identities(p: &Preset, body: &[u8], v: &Verified) -> Vec<(String, String)> {
    match &v.action {
        Action::Batch(events) => {
            events.iter().map(|e| (e.event_id.clone(), p.content_hash(&body[e.bytes.clone()]))).collect()
        }
        _ => vec![(v.event_id.clone(), delivery_hashes(body, &v.content).1)],
    }
}

/// `body` with every masked value replaced, as the provider's retry at
/// `now` renders it (a masked timestamp is the retry's own).
fn retried(p: &Preset, body: &[u8], now: i64) -> Vec<u8> {
    let ts = p.section().timestamp_pointer;
    let mut edits: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
    for m in p.mask {
        let found: Vec<Range<usize>> = match &p.batch {
            Some(b) => split(body, b)
                .unwrap()
                .iter()
                .flat_map(|e| {
                    generic::mask_ranges(&body[e.bytes.clone()], &[*m])
                        .into_iter()
                        .map(move |r| r.start + e.bytes.start..r.end + e.bytes.start)
                })
                .collect(),
            None => generic::mask_ranges(body, &[*m]),
        };
        assert!(!found.is_empty(), "{}: the masked field {m} is in the sample", p.name);
        for r in found {
            let new: Vec<u8> = match body[r.start] {
                _ if ts.as_deref() == Some(*m) => (now * 1000).to_string().into_bytes(),
                b'"' => b"\"retried\"".to_vec(),
                b'[' => br#"[{"attempted_at":"2027-01-15T08:00:00Z","response_status_code":500}]"#.to_vec(),
                b'{' => br#"{"timestamp":"1","token":"retried-token","signature":""}"#.to_vec(),
                _ => b"7".to_vec(),
            };
            edits.push((r, new));
        }
    }
    edits.sort_by_key(|(r, _)| std::cmp::Reverse(r.start));
    let mut out = body.to_vec();
    for (r, new) in edits {
        out.splice(r, new);
    }
    out
}

#[test]
fn every_preset_section_is_valid_and_names_are_unique() {
    let mut names: Vec<&str> = PRESETS.iter().map(|p| p.name).chain(ALIASES.iter().map(|a| a.name)).collect();
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "two presets share a name");
    let issue_24 = "shopify twilio square razorpay paddle hubspot mailgun linear intercom calendly mux typeform \
        coinbase_commerce sentry lemonsqueezy box zendesk docusign vercel segment gitlab bitbucket jira cashfree \
        postmark clerk resend";
    for name in issue_24.split_whitespace() {
        assert!(names.contains(&name), "{name} is not a preset");
    }
    for p in PRESETS {
        p.validate(&spec_of(p.name)).unwrap_or_else(|e| panic!("{}: {e}", p.name));
        assert!(!p.summary.is_empty());
    }
}

#[test]
fn a_preset_takes_only_what_its_provider_needs() {
    let shopify = PRESETS.iter().find(|p| p.name == "shopify").unwrap();
    let mut spec = spec_of("shopify");
    spec.public_url = Some("https://hooks.example.com/x".into());
    assert!(shopify.validate(&spec).unwrap_err().contains("public_url is for providers that sign their URL"));
    let twilio = PRESETS.iter().find(|p| p.name == "twilio").unwrap();
    let mut spec = spec_of("twilio");
    spec.public_url = None;
    assert!(twilio.validate(&spec).unwrap_err().contains("needs its public_url"));
    let section: HmacSpec =
        serde_json::from_str(r#"{"signature_header": "x", "encoding": "hex", "id": "body_hash"}"#).unwrap();
    let mut spec = spec_of("shopify");
    spec.hmac = Some(section);
    assert!(shopify.validate(&spec).unwrap_err().contains("fixed: use provider hmac"));
    let mut spec = spec_of("clerk");
    spec.topic_arns = vec!["arn:aws:sns:eu-west-1:1:t".into()];
    assert!(ALIASES[0].validate(&spec).is_err());
}

#[test]
fn each_preset_verifies_its_own_deliveries_and_refuses_forgeries() {
    for p in PRESETS {
        let spec = spec_of(p.name);
        let config = p.config(&spec).unwrap();
        let v = verifier(p, &spec, SECRET);
        let (body, headers) = deliver(p, &spec, p.sample(&spec, EVENT, "demo.event", NOW), NOW);
        let ok = check(&v, &body, &headers, NOW).unwrap_or_else(|e| panic!("{}: {e}", p.name));
        let ids = identities(p, &body, &ok);
        assert!(!ids.is_empty() && ids.iter().all(|(id, _)| !id.is_empty()), "{}", p.name);

        // A wrong secret.
        let wrong = verifier(p, &spec, "not-the-secret");
        assert_eq!(check(&wrong, &body, &headers, NOW).unwrap_err(), VerifyError::SignatureMismatch, "{}", p.name);

        // One byte of the body changed: refused where the body is signed.
        let mut tampered = body.clone();
        let at = tampered.iter().rposition(u8::is_ascii_alphanumeric).unwrap();
        tampered[at] = if tampered[at] == b'1' { b'2' } else { b'1' };
        let verdict = check(&v, &tampered, &headers, NOW);
        if config.signs_body() {
            assert_eq!(verdict.unwrap_err(), VerifyError::SignatureMismatch, "{}: tampered body", p.name);
        } else {
            // Token and basic-auth senders authenticate the sender, not the
            // bytes; Mailgun signs its timestamp and token only (the docs say so).
            assert!(matches!(p.name, "gitlab" | "postmark" | "mailgun"), "{}", p.name);
        }

        // Stale and future timestamps, where the provider signs one.
        if config.timestamped() {
            let late = NOW + p.tolerance_secs + 1;
            assert_eq!(check(&v, &body, &headers, late).unwrap_err(), VerifyError::StaleTimestamp, "{}", p.name);
            let early = NOW - p.tolerance_secs - 1;
            assert_eq!(check(&v, &body, &headers, early).unwrap_err(), VerifyError::FutureTimestamp, "{}", p.name);
        }
    }
}

#[test]
fn mailguns_signed_token_and_timestamp_are_checked() {
    let p = PRESETS.iter().find(|p| p.name == "mailgun").unwrap();
    let spec = spec_of("mailgun");
    let v = verifier(p, &spec, SECRET);
    let (body, headers) = deliver(p, &spec, p.sample(&spec, EVENT, "delivered", NOW), NOW);
    assert_eq!(check(&v, &body, &headers, NOW).unwrap().event_id, EVENT);
    let text = String::from_utf8(body).unwrap();
    let token =
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["signature"]["token"].as_str().unwrap().to_owned();
    let forged = text.replace(&token, &token.replace('0', "1").replace('f', "e"));
    assert_ne!(forged, text);
    assert_eq!(check(&v, forged.as_bytes(), &headers, NOW).unwrap_err(), VerifyError::SignatureMismatch);
    let ts = text.replace(&format!("\"{NOW}\""), &format!("\"{}\"", NOW - 1));
    assert_eq!(check(&v, ts.as_bytes(), &headers, NOW).unwrap_err(), VerifyError::SignatureMismatch);
}

#[test]
fn a_retry_is_the_same_event_with_the_same_content() {
    for p in PRESETS {
        let spec = spec_of(p.name);
        let v = verifier(p, &spec, SECRET);
        let sample = p.sample(&spec, EVENT, "demo.event", NOW);
        let (body, headers) = deliver(p, &spec, sample, NOW);
        let first = check(&v, &body, &headers, NOW).unwrap();
        // The retry: counters re-rendered, a new timestamp and signature.
        let later = NOW + 90;
        let (again, headers2) = deliver(p, &spec, retried(p, &body, later), later);
        if !p.mask.is_empty() {
            assert_ne!(again, body, "{}: the retry differs in its counters", p.name);
        }
        if p.config(&spec).unwrap().timestamped() && p.mask.is_empty() {
            assert_ne!(headers2, headers, "{}: a new signature", p.name);
        }
        let second = check(&v, &again, &headers2, later).unwrap_or_else(|e| panic!("{}: {e}", p.name));
        assert_eq!(identities(p, &again, &second), identities(p, &body, &first), "{}", p.name);
    }
}

/// What the processor hands a projection: every preset's stored payload
/// decodes (a form as its parameters), with a type even where the provider
/// names none; nothing a preset records can go DEAD for want of one.
#[test]
fn every_presets_stored_payload_decodes_with_a_type() {
    for p in PRESETS {
        let spec = spec_of(p.name);
        let (body, headers) = deliver(p, &spec, p.sample(&spec, EVENT, "demo.event", NOW), NOW);
        let v = check(&verifier(p, &spec, SECRET), &body, &headers, NOW).unwrap();
        let stored: Vec<(Option<String>, Vec<u8>)> = match &v.action {
            Action::Batch(events) => {
                events.iter().map(|e| (e.event_type.clone(), body[e.bytes.clone()].to_vec())).collect()
            }
            _ => vec![(v.event_type.clone(), body.clone())],
        };
        for (ty, payload) in stored {
            let (got, json) = p.decode(ty.as_deref(), &payload).unwrap_or_else(|e| panic!("{}: {e}", p.name));
            assert!(!got.is_empty() && (json.is_object() || json.is_array()), "{}", p.name);
            assert_eq!(ty.is_none(), got == format!("{}.delivery", p.name), "{}: {got}", p.name);
        }
    }
    let twilio = PRESETS.iter().find(|p| p.name == "twilio").unwrap();
    let (_, json) = twilio.decode(None, b"MessageSid=SM1&MessageStatus=delivered&To=%2B1555").unwrap();
    assert_eq!((json["MessageSid"].as_str(), json["To"].as_str()), (Some("SM1"), Some("+1555")));
}

#[test]
fn stored_content_hashes_match_the_intakes() {
    // The processor's split and the backfill hash stored payloads by provider
    // name; the intake hashes what the verifier found. They agree.
    for p in PRESETS.iter().filter(|p| p.batch.is_none()) {
        let spec = spec_of(p.name);
        let (body, headers) = deliver(p, &spec, p.sample(&spec, EVENT, "demo.event", NOW), NOW);
        let v = check(&verifier(p, &spec, SECRET), &body, &headers, NOW).unwrap();
        assert_eq!(delivery_hashes(&body, &v.content).1, p.content_hash(&body), "{}", p.name);
        assert_eq!(crate::verify::registry::content_hash(p.name, &body), p.content_hash(&body), "{}", p.name);
    }
}

#[test]
fn hubspot_batches_are_split_into_their_events() {
    let p = PRESETS.iter().find(|p| p.name == "hubspot").unwrap();
    let body =
        br#"[{"eventId":1,"subscriptionId":7,"occurredAt":5,"subscriptionType":"contact.creation","attemptNumber":0},
        {"eventId":2,"subscriptionId":7,"occurredAt":5,"subscriptionType":"contact.deletion","attemptNumber":3}]"#;
    let events = p.split(body).unwrap().unwrap();
    let got: Vec<(&str, Option<&str>)> =
        events.iter().map(|e| (e.event_id.as_str(), e.event_type.as_deref())).collect();
    assert_eq!(got, [("7:1:5", Some("contact.creation")), ("7:2:5", Some("contact.deletion"))]);
    // An element without its id, or that is no event at all: kept apart
    // (its record parked), the others split as usual.
    let mixed =
        br#"[{"eventId":3,"subscriptionId":7,"occurredAt":5,"subscriptionType":"contact.creation"},42,{"eventId":1}]"#;
    let events = p.split(mixed).unwrap().unwrap();
    let got: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    let malformed = |b: &[u8]| format!("{}{}", crate::verify::MALFORMED_ID_PREFIX, crate::identity::payload_hash(b));
    assert_eq!(got, ["7:3:5".to_owned(), malformed(b"42"), malformed(br#"{"eventId":1}"#)]);
    assert_eq!(&mixed[events[1].bytes.clone()], b"42", "its bytes as they are");
    let bad: [&[u8]; 3] = [
        b"{}",
        b"[]",
        br#"[{"eventId":1,"subscriptionId":7,"occurredAt":5},{"eventId":1,"subscriptionId":7,"occurredAt":5}]"#,
    ];
    for b in bad {
        assert!(
            matches!(split(b, p.batch.as_ref().unwrap()), Err(VerifyError::MalformedPayload(_))),
            "{}",
            String::from_utf8_lossy(b)
        );
    }
}

#[test]
fn aliases_send_svix_headers_and_verify_as_standard_webhooks() {
    for a in ALIASES {
        let spec = spec_of(a.name);
        let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let body = a.sample(&spec, "msg_1", "user.created", NOW);
        let headers = a.sign(&spec, &secret, "msg_1", "user.created", NOW, &body).unwrap();
        assert!(headers.iter().all(|(k, _)| k.starts_with("svix-")), "{headers:?}");
        let v = standard::StandardWebhooksVerifier::new(vec![standard::decode_secret(&secret).unwrap()], 300);
        let ok = v.verify(&body, &header_map(&headers), NOW).unwrap();
        assert_eq!((ok.event_id.as_str(), ok.event_type.as_deref()), ("msg_1", Some("user.created")));
    }
}

#[test]
fn slacks_handshake_is_answered_only_when_signed_and_only_with_a_plain_value() {
    let p = PRESETS.iter().find(|p| p.name == "slack").unwrap();
    let spec = spec_of("slack");
    let v = verifier(p, &spec, SECRET);
    let handshake = |challenge: &str| {
        serde_json::json!({"token": "t", "challenge": challenge, "type": "url_verification"}).to_string().into_bytes()
    };
    let body = handshake("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P");
    let (body, headers) = deliver(p, &spec, body, NOW);
    let ok = check(&v, &body, &headers, NOW).unwrap();
    assert_eq!(
        ok.action,
        Action::Reply {
            content_type: "text/plain; charset=utf-8",
            body: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".into()
        }
    );
    // Forged: nothing is echoed.
    let forged = verifier(p, &spec, "not-the-secret");
    assert_eq!(check(&forged, &body, &headers, NOW).unwrap_err(), VerifyError::SignatureMismatch);
    assert_eq!(check(&v, &body, &headers, NOW + 301).unwrap_err(), VerifyError::StaleTimestamp);
    // Signed, but not a value to echo.
    for bad in ["<script>alert(1)</script>", "", &"a".repeat(257), "a b", "caf\u{e9}"] {
        let (body, headers) = deliver(p, &spec, handshake(bad), NOW);
        assert!(matches!(check(&v, &body, &headers, NOW), Err(VerifyError::MalformedPayload(_))), "{bad:?}");
    }
    // A notice without an identity: acknowledged.
    let notice =
        br#"{"token":"t","type":"app_rate_limited","team_id":"T1","minute_rate_limited":1518467820,"api_app_id":"A1"}"#;
    let (body, headers) = deliver(p, &spec, notice.to_vec(), NOW);
    assert_eq!(check(&v, &body, &headers, NOW).unwrap().action, Action::Acknowledge { what: "app_rate_limited" });
    // An event is an event.
    let (body, headers) = deliver(p, &spec, p.sample(&spec, EVENT, "app_mention", NOW), NOW);
    let event = check(&v, &body, &headers, NOW).unwrap();
    assert_eq!((event.action, event.event_id.as_str()), (Action::Record, format!("Ev{EVENT}").as_str()));
}

fn get(v: &PresetVerifier, query: &str) -> Result<Verified, VerifyError> {
    let headers = HeaderMap::new();
    v.verify_now(&Delivery { body: b"", headers: &headers, method: &http::Method::GET, query }, NOW)
}

fn echoed(r: Result<Verified, VerifyError>) -> Option<String> {
    match r.ok()?.action {
        Action::Reply { content_type: "text/plain; charset=utf-8", body } => Some(body),
        _ => None,
    }
}

#[test]
fn metas_get_check_echoes_only_with_the_verify_token_and_dropbox_only_plain_values() {
    let meta = PRESETS.iter().find(|p| p.name == "meta").unwrap();
    let v = verifier(meta, &spec_of("meta"), SECRET);
    let ok = "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=meta-verify-token";
    assert_eq!(echoed(get(&v, ok)).as_deref(), Some("1158201444"));
    assert_eq!(get(&v, &ok.replace("meta-verify-token", "guess")).unwrap_err(), VerifyError::SignatureMismatch);
    assert_eq!(get(&v, "hub.mode=subscribe&hub.challenge=1").unwrap_err(), VerifyError::MissingHeader("verify token"));
    let twice = format!("{ok}&hub.verify_token=meta-verify-token");
    assert!(get(&v, &twice).is_err(), "a parameter given twice is not read");
    assert!(matches!(get(&v, &ok.replace("subscribe", "unsubscribe")), Err(VerifyError::MalformedPayload(_))));
    assert!(matches!(get(&v, &ok.replace("1158201444", "%3Cscript%3E")), Err(VerifyError::MalformedPayload(_))));
    assert!(meta.takes_verify_token() && meta.methods().contains(&http::Method::GET));

    let dropbox = PRESETS.iter().find(|p| p.name == "dropbox").unwrap();
    let v = verifier(dropbox, &spec_of("dropbox"), SECRET);
    assert_eq!(echoed(get(&v, "challenge=Cw8hPz1Ai_W-0J.m~")).as_deref(), Some("Cw8hPz1Ai_W-0J.m~"));
    for bad in ["", "challenge=", "challenge=a%20b", "challenge=%3Cb%3E", "other=1"] {
        assert!(matches!(get(&v, bad), Err(VerifyError::MalformedPayload(_))), "{bad:?}");
    }
    assert!(!dropbox.takes_verify_token());

    // A POST-only preset has no GET check.
    let shopify = PRESETS.iter().find(|p| p.name == "shopify").unwrap();
    assert_eq!(shopify.methods(), &[http::Method::POST]);
}

#[test]
fn xeros_intent_to_receive_is_acknowledged_only_when_signed() {
    let p = PRESETS.iter().find(|p| p.name == "xero").unwrap();
    let spec = spec_of("xero");
    let v = verifier(p, &spec, SECRET);
    let itr = br#"{"events":[],"firstEventSequence":0,"lastEventSequence":0,"entropy":"KSOTLMBFNVNKQBMKXCOZ"}"#;
    let (body, headers) = deliver(p, &spec, itr.to_vec(), NOW);
    assert_eq!(check(&v, &body, &headers, NOW).unwrap().action, Action::Acknowledge { what: "an empty batch" });
    let forged = verifier(p, &spec, "not-the-key");
    assert_eq!(check(&forged, &body, &headers, NOW).unwrap_err(), VerifyError::SignatureMismatch);
    assert_eq!(p.success(None).exactly(), Some(Success { status: 200, body: Some(("text/plain; charset=utf-8", "")) }));
    // Events: each its own record.
    let (body, headers) = deliver(p, &spec, p.sample(&spec, EVENT, "UPDATE", NOW), NOW);
    let Action::Batch(events) = check(&v, &body, &headers, NOW).unwrap().action else { panic!("not a batch") };
    assert_eq!(events.len(), 1);
    assert!(events[0].event_id.starts_with("c2cc9b6e-9458-4c7d-93cc-f02b81b0594f:CONTACT:"), "{}", events[0].event_id);
}

mod proptests {
    use proptest::prelude::*;

    use super::*;

    fn preset() -> impl Strategy<Value = &'static Preset> {
        prop::sample::select(PRESETS.iter().collect::<Vec<_>>())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A one-byte change anywhere in a signed body, the signature or the
        /// timestamp: refused with a stable 4xx reason (or, where that byte
        /// is not signed, the same identity); never a panic.
        #[test]
        fn one_byte_mutations_are_refused_or_harmless(p in preset(), at in any::<prop::sample::Index>(), byte in any::<u8>(), which in 0..3usize) {
            let spec = spec_of(p.name);
            let v = verifier(p, &spec, SECRET);
            let (mut body, mut headers) = deliver(p, &spec, p.sample(&spec, EVENT, "demo.event", NOW), NOW);
            // The round trip first: what the preset signs, it accepts.
            prop_assert!(check(&v, &body, &headers, NOW).is_ok(), "{}: its own delivery", p.name);
            let (body0, headers0) = (body.clone(), headers.clone());
            let config = p.config(&spec).unwrap();
            let section = p.section();
            let guarded: Vec<String> = section.signature_header.iter().flat_map(|h| h.names()).map(str::to_ascii_lowercase)
                .chain(section.timestamp_header.as_deref().map(str::to_ascii_lowercase)).collect();
            let mut changed_header = None;
            match if headers.is_empty() { 0 } else { which } {
                0 => { let i = at.index(body.len()); body[i] = byte; }
                _ => {
                    let names: Vec<HeaderName> = headers.keys().cloned().collect();
                    let name = &names[at.index(names.len())];
                    let mut value = headers[name].as_bytes().to_vec();
                    let i = at.index(value.len().max(1));
                    if value.is_empty() { value.push(byte) } else { value[i] = byte };
                    match HeaderValue::from_bytes(&value) {
                        Ok(hv) => { headers.insert(name.clone(), hv); }
                        Err(_) => { headers.remove(name); }
                    }
                    changed_header = Some(name.as_str().to_owned());
                }
            }
            match check(&v, &body, &headers, NOW) {
                Ok(_) => {
                    // Accepted only where the changed byte is not authenticated.
                    // (Hex digits are read in either case: the same signature.)
                    let same_case_folded = headers.len() == headers0.len()
                        && headers.iter().all(|(k, v)| headers0.get(k).is_some_and(|v0| v0.as_bytes().eq_ignore_ascii_case(v.as_bytes())));
                    let unchanged = body == body0 && (headers == headers0 || (config.hex() && same_case_folded));
                    let unsigned = match &changed_header {
                        None => !config.signs_body(),
                        Some(h) => !guarded.contains(h),
                    };
                    prop_assert!(unchanged || unsigned, "{}: a mutation of {:?} was accepted", p.name, changed_header);
                }
                Err(e) => {
                    prop_assert!(!e.reason().is_empty());
                    prop_assert!(!matches!(e, VerifyError::CertificateUnavailable), "{}: {e}", p.name);
                }
            }
        }

        /// Random headers and bodies: no panic, and nothing accepted without the secret.
        #[test]
        fn random_deliveries_are_refused(p in preset(), body in prop::collection::vec(any::<u8>(), 0..300),
            values in prop::collection::vec("[ -~]{0,60}", 0..6)) {
            let spec = spec_of(p.name);
            let v = verifier(p, &spec, SECRET);
            let section = p.section();
            let mut headers = HeaderMap::new();
            let names: Vec<String> = section.signature_header.iter().flat_map(|h| h.names()).map(str::to_owned)
                .chain(section.timestamp_header.clone()).chain(["authorization".to_owned()]).collect();
            for (i, value) in values.iter().enumerate() {
                if let Ok(hv) = HeaderValue::from_str(value) {
                    headers.append(HeaderName::from_bytes(names[i % names.len()].to_ascii_lowercase().as_bytes()).unwrap(), hv);
                }
            }
            let verdict = check(&v, &body, &headers, NOW);
            prop_assert!(verdict.is_err(), "{}: accepted a random delivery", p.name);
        }
    }
}

#[test]
fn twitchs_revocation_is_recorded_under_its_own_type_and_its_message_id() {
    let p = PRESETS.iter().find(|p| p.name == "twitch").unwrap();
    let spec = spec_of("twitch");
    let v = verifier(p, &spec, SECRET);
    // As https://dev.twitch.tv/docs/eventsub/handling-webhook-events/#revoking-your-subscription shows it.
    let revocation = br#"{"subscription":{"id":"f1c2a387-161a-49f9-a165-0f21d7a4e1c4","status":"authorization_revoked","type":"channel.follow","version":"2","cost":1,"condition":{"broadcaster_user_id":"12826"},"transport":{"method":"webhook","callback":"https://example.com/webhooks/callback"},"created_at":"2019-11-16T10:11:12.634234626Z"}}"#;
    let (body, mut headers) = deliver(p, &spec, revocation.to_vec(), NOW);
    headers.insert("twitch-eventsub-message-type", HeaderValue::from_static("revocation"));
    headers.insert("twitch-eventsub-subscription-type", HeaderValue::from_static("channel.follow"));
    let ok = check(&v, &body, &headers, NOW).unwrap();
    assert_eq!(
        (ok.action, ok.event_id.as_str(), ok.event_type.as_deref()),
        (Action::Record, EVENT, Some("revocation")),
        "a revocation is recorded under its own type, identified by its message id"
    );
    // A notification of the same subscription: its own message id, its subscription's type.
    let other = "b0cbcbe0-3c4b-4a36-a7a5-6e1a2a4c0b6d";
    let body = p.seal(&spec, &Secret::new(SECRET), NOW, p.sample(&spec, other, "channel.follow", NOW)).unwrap();
    let signed = p.sign(&spec, &Secret::new(SECRET), other, "channel.follow", NOW, &body).unwrap();
    let headers = header_map(&signed);
    let ok = check(&v, &body, &headers, NOW).unwrap();
    assert_eq!((ok.event_id.as_str(), ok.event_type.as_deref()), (other, Some("channel.follow")));
    // Forged: refused like any message.
    let (body, mut headers) = deliver(p, &spec, revocation.to_vec(), NOW);
    headers.insert("twitch-eventsub-message-type", HeaderValue::from_static("revocation"));
    let forged = verifier(p, &spec, "not-the-secret");
    assert_eq!(check(&forged, &body, &headers, NOW).unwrap_err(), VerifyError::SignatureMismatch);
}
