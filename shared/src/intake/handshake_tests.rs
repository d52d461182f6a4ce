//! Issue 25 through the intake on the memory world: every provider's
//! handshakes, as [`Provider::handshakes`] builds them (the same requests
//! `hookledger send --handshake` plays), get the answer the provider needs
//! and write nothing; forged ones are refused with nothing echoed; Asana's
//! secret is taken only inside an operator's window, once; and every
//! provider's recorded delivery gets its own success answer (the table
//! `docs/providers.md` shows).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::preset_tests::NoFetch;
use super::*;
use crate::adapters::memory::{MemLedger, MemQueue, MemSecretStore, World};
use crate::config::ProviderKind;
use crate::secret::Secret;
use crate::verify::certificates::CertificateCache;
use crate::verify::provider::{
    BuildContext, EndpointSpec, Handshake, HandshakeInput, Provider, SecretStore, Success, SuccessAnswer,
};

pub(super) const NOW: i64 = 1_800_000_000;
const SECRET: &str = "handshake-test-secret";
const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const DISCORD_PUBLIC: &str = "ea4a6c63e29c520abef5507b132ec5f9954776aebebe7b92421eea691446d22c";
const VERIFY_TOKEN: &str = "the-verify-token";

/// The secret an endpoint of `p` is configured with in these tests.
pub(super) fn secret_of(p: &dyn Provider) -> &'static str {
    match p.name() {
        "discord" => DISCORD_PUBLIC,
        "standard_webhooks" | "clerk" | "resend" => WHSEC,
        _ => SECRET,
    }
}

/// An endpoint spec for `p`, as an operator would write it (Asana's learns its secret).
pub(super) fn spec_of(p: &dyn Provider) -> Option<EndpointSpec> {
    let mut v = serde_json::json!({"provider": p.name()});
    if p.takes_secrets() && !p.learns_secret() {
        v["secrets"] = serde_json::json!(["env:A"]);
    }
    if p.takes_verify_token() {
        v["verify_token"] = "env:T".into();
    }
    if p.options().contains("public_url (required)") {
        v["public_url"] = "https://hooks.example.com/webhooks/ep".into();
    }
    if p.options().contains("hmac (required)") || p.name() == "sns" {
        return None;
    }
    Some(serde_json::from_value(v).unwrap_or_else(|e| panic!("{}: {e}", p.name())))
}

pub(super) type TestIntake = Intake<MemLedger, MemQueue>;

/// An intake with one endpoint `ep` of `p`, its secret `secret`, and the store it learns secrets into.
pub(super) fn intake(p: &'static dyn Provider, secret: &str, store: &MemSecretStore) -> (World, TestIntake) {
    let world = World::new(crate::clock::Ambient::fixed(NOW * 1000, 5)).with_shards(16);
    let spec = spec_of(p).unwrap();
    p.validate(&spec).unwrap_or_else(|e| panic!("{}: {e}", p.name()));
    let cx = BuildContext {
        certificates: Arc::new(CertificateCache::new(Arc::new(NoFetch))),
        verify_token: Some(Secret::new(VERIFY_TOKEN)),
        learned: Some((Arc::new(store.clone()) as Arc<dyn SecretStore>, "ep".into())),
    };
    let secrets = if spec.secrets.is_empty() { Vec::new() } else { vec![Secret::new(secret)] };
    let verifier = p.verifier(&spec, secrets, &cx).unwrap_or_else(|e| panic!("{}: {e}", p.name()));
    let endpoint = Endpoint {
        name: "ep".into(),
        tenant: "t1".into(),
        provider: ProviderKind::of(p),
        verifier,
        payload: Default::default(),
        erasable: false,
    };
    let intake = super::preset_tests::one_endpoint(&world, endpoint);
    (world, intake)
}

pub(super) fn headers(list: &[(String, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in list {
        h.append(HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    h
}

async fn play(intake: &TestIntake, h: &Handshake) -> Answer {
    request(intake, &h.method, &h.query, &h.headers, &h.body).await
}

/// A request to `ep` at `NOW`.
pub(super) async fn request(
    intake: &TestIntake,
    method: &Method,
    query: &str,
    list: &[(String, String)],
    body: &[u8],
) -> Answer {
    let hm = headers(list);
    let now = UNIX_EPOCH + Duration::from_secs(NOW as u64);
    intake.handle(IntakeRequest { endpoint: "ep", method, query, headers: &hm, body, now, request_id: "r" }).await
}

/// The HTTP answer's mismatch with what the handshake needs.
fn mismatch(h: &Handshake, a: &Answer) -> Option<String> {
    let (content_type, body) = a.body();
    let header = a.header.as_ref().map(|(_, v)| v.as_str());
    h.expect.mismatch(a.status, Some(content_type), &body, header)
}

fn handshakes_of(p: &dyn Provider, secret: Option<&str>, token: &str, nonce: &str) -> Vec<Handshake> {
    let spec = spec_of(p).unwrap();
    let secret = secret.map(Secret::new);
    let token = Secret::new(token);
    let input = HandshakeInput { spec: &spec, secret: secret.as_ref(), verify_token: Some(&token), nonce, now_s: NOW };
    p.handshakes(input).unwrap_or_else(|e| panic!("{}: {e}", p.name()))
}

/// Every provider's handshakes get the answer it needs, and nothing is written or sent.
#[tokio::test]
async fn every_providers_handshakes_get_the_answer_it_needs_and_write_nothing() {
    let mut played: Vec<(&str, &str)> = Vec::new();
    for p in crate::verify::registry::providers().filter(|p| spec_of(*p).is_some()) {
        let store = MemSecretStore::default();
        store.open_window("ep", NOW + 600).await.unwrap();
        let (world, intake) = intake(p, secret_of(p), &store);
        let signing = (!p.learns_secret()).then(|| secret_of(p));
        for h in handshakes_of(p, signing, VERIFY_TOKEN, "n0nce42") {
            let a = play(&intake, &h).await;
            assert_eq!(mismatch(&h, &a), None, "{} {}: {} {}", p.name(), h.name, a.code, a.detail);
            played.push((p.name(), h.name));
        }
        assert_eq!(world.state().table.writes(), 0, "{}: a handshake records nothing", p.name());
        assert!(world.queue().keys().is_empty(), "{}: nothing sent", p.name());
        assert_eq!(store.writes(), 1 + usize::from(p.learns_secret()), "{}: only Asana's secret is stored", p.name());
    }
    let providers: std::collections::BTreeSet<&str> = played.iter().map(|(p, _)| *p).collect();
    let expected = ["asana", "dropbox", "meta", "microsoft_graph", "slack", "twitch", "xero", "zoom"];
    assert_eq!(providers.into_iter().collect::<Vec<_>>(), expected, "{played:?}");
}

/// A handshake signed with another secret, or a GET check with another
/// verify token, is refused 401 and nothing is echoed.
#[tokio::test]
async fn a_forged_handshake_is_refused_and_nothing_echoed() {
    for p in crate::verify::registry::providers().filter(|p| spec_of(*p).is_some() && !p.learns_secret()) {
        let store = MemSecretStore::default();
        let (_, intake) = intake(p, secret_of(p), &store);
        for h in handshakes_of(p, Some("not-the-secret"), "not-the-token", "n0nce42") {
            let authenticated = h.method == Method::POST || p.takes_verify_token();
            if !authenticated || p.name() == "microsoft_graph" {
                continue; // Dropbox's GET and Graph's validation prove nothing: only plain values are echoed.
            }
            let a = play(&intake, &h).await;
            assert_eq!(a.status, 401, "{} {}: {} {}", p.name(), h.name, a.code, a.detail);
            assert!(a.raw.is_none() && a.header.is_none(), "{} {}: nothing echoed", p.name(), h.name);
            assert!(!a.body().1.contains("n0nce42"), "{} {}", p.name(), h.name);
        }
    }
}

/// Unauthenticated echoes (Dropbox's GET, Graph's validation) and signed
/// challenges alike refuse a value out of their pattern: 400, nothing echoed.
#[tokio::test]
async fn an_echo_out_of_pattern_is_refused() {
    let cases: [(&str, &str, &str); 4] = [
        ("dropbox", "<script>alert(1)</script>", "^[A-Za-z0-9._~-]{1,256}$"),
        ("slack", "a b", "^[A-Za-z0-9._~-]{1,256}$"),
        ("meta", "x\"y", "^[A-Za-z0-9._~-]{1,256}$"),
        ("microsoft_graph", "<b>x</b>", "letters, digits, spaces and ._~-:/+="),
    ];
    for (name, value, pattern) in cases {
        let p = ProviderKind::named(name).unwrap().provider();
        let store = MemSecretStore::default();
        let (world, intake) = intake(p, secret_of(p), &store);
        let hs = handshakes_of(p, Some(secret_of(p)), VERIFY_TOKEN, value);
        assert!(!hs.is_empty(), "{name}");
        for h in hs.iter().filter(|h| h.name != "app_rate_limited") {
            let a = play(&intake, h).await;
            assert_eq!(
                (a.status, a.code),
                (400, "malformed_payload"),
                "{name} {}: {value:?} is out of {pattern}",
                h.name
            );
            assert!(a.raw.is_none() && !a.body().1.contains(value), "{name}: nothing echoed");
        }
        assert_eq!(world.state().table.writes(), 0);
    }
}

/// Asana's secret: refused outside the window (nothing stored), stored
/// once inside it and answered with its header; a second offer does not
/// overwrite it; events are then verified with it.
#[tokio::test]
async fn asanas_secret_is_taken_inside_the_window_only_and_once() {
    let p = ProviderKind::named("asana").unwrap().provider();
    let store = MemSecretStore::default();
    let (_, intake) = intake(p, "", &store);
    let offer = |secret: &str| handshakes_of(p, None, "", secret).into_iter().next().unwrap();
    // No window.
    let a = play(&intake, &offer("first1")).await;
    assert_eq!((a.status, a.code, a.header.clone()), (403, "handshake_refused", None));
    // A window that has closed (each container trusts the window it read
    // for `asana::RELOAD_SECS`: a fresh one reads it).
    store.open_window("ep", NOW - 1).await.unwrap();
    let (_, intake) = self::intake(p, "", &store);
    assert_eq!(play(&intake, &offer("first1")).await.status, 403);
    assert_eq!(store.load("ep").await.unwrap(), None);
    // Open: stored, answered with the header.
    store.open_window("ep", NOW + 600).await.unwrap();
    let (world, intake) = self::intake(p, "", &store);
    let first = offer("first1");
    let a = play(&intake, &first).await;
    assert_eq!(mismatch(&first, &a), None, "{} {}", a.code, a.detail);
    assert_eq!(a.header, Some(("X-Hook-Secret", "first1".to_owned())));
    // Another offer, still inside the window: refused, the first kept.
    let a = play(&intake, &offer("second2")).await;
    assert_eq!((a.status, a.code, a.header.clone()), (403, "handshake_refused", None));
    assert_eq!(store.load("ep").await.unwrap().unwrap().expose(), b"first1");
    // Events signed with the stored secret are recorded; with the other, refused.
    let spec = spec_of(p).unwrap();
    for (secret, status) in [("second2", 401), ("first1", 202)] {
        let body = p.sample(&spec, "1201", "task.changed", NOW);
        let signed = p.sign(&spec, &Secret::new(secret), "", "", NOW, &body).unwrap();
        assert_eq!(request(&intake, &Method::POST, "", &signed, &body).await.status, status, "{secret}");
    }
    assert_eq!(world.queue().keys().len(), 1);
}

/// Every provider the tool can sign for: its sample delivery, recorded, is
/// answered as the provider declares it needs ([`Provider::success`], the
/// one table `docs/providers.md` is checked against).
/// The intake's answers to `p`'s sample delivery, signed as the tool signs
/// it: the first time (new), then again (a duplicate).
async fn answers_to_a_sample(p: &'static dyn Provider) -> (Answer, Answer) {
    let store = MemSecretStore::default();
    let (_, intake) = intake(p, secret_of(p), &store);
    if p.learns_secret() {
        store.store_once("ep", &Secret::new(SECRET)).await.unwrap();
    }
    let spec = spec_of(p).unwrap();
    let secret = Secret::new(secret_of(p));
    let id = p.event_id("0123456789abcdef0123456789abcdef");
    let body = p.seal(&spec, &secret, NOW, p.sample(&spec, &id, "demo.event", NOW)).unwrap();
    let mut list = vec![("content-type".to_owned(), p.content_type().to_owned())];
    list.extend(p.sign(&spec, &secret, &id, "demo.event", NOW, &body).unwrap());
    let new = request(&intake, &Method::POST, "", &list, &body).await;
    (new, request(&intake, &Method::POST, "", &list, &body).await)
}

/// The providers whose documentation completes a delivery only on 200
/// (docs/providers.md, "the provider on our answers"): a new event is
/// answered 200, not the intake's 202, and so is its duplicate.
#[tokio::test]
async fn the_providers_that_complete_only_on_200_get_200_for_a_new_event() {
    for name in ["mailgun", "linear", "lemonsqueezy", "coinbase_commerce", "postmark", "cashfree", "docusign"] {
        let p = ProviderKind::named(name).unwrap().provider();
        let (new, again) = answers_to_a_sample(p).await;
        assert_eq!((new.status, new.code), (200, "accepted"), "{name}: {}", new.detail);
        assert_eq!((again.status, again.code), (200, "duplicate"), "{name}: {}", again.detail);
    }
}

#[tokio::test]
async fn every_provider_gets_the_success_answer_it_needs() {
    let mut checked = 0;
    for p in crate::verify::registry::providers().filter(|p| spec_of(*p).is_some() && p.tool_signs()) {
        let (a, _) = answers_to_a_sample(p).await;
        let (content_type, text) = a.body();
        let want = match p.success(Some("demo.event")) {
            SuccessAnswer::Accepted => (202, "application/json", false),
            SuccessAnswer::Exactly(Success { status, body: None }) => (status, "application/json", false),
            SuccessAnswer::Exactly(Success { status, body: Some((content_type, body)) }) => {
                (status, content_type, body.is_empty())
            }
        };
        assert_eq!((a.status, content_type, text.is_empty()), want, "{}: {} {}", p.name(), a.code, a.detail);
        assert!(matches!(a.code, "accepted"), "{}: {}", p.name(), a.code);
        checked += 1;
    }
    assert!(checked >= 33, "{checked}");
}

/// Meta batches updates: a WhatsApp delivery's messages and statuses, and a
/// Messenger delivery's `messaging` entries, are each their own record; the
/// same updates regrouped into other deliveries are nothing new.
#[tokio::test]
async fn meta_deliveries_are_recorded_update_by_update_and_a_regrouped_retry_is_nothing_new() {
    let p = ProviderKind::named("meta").unwrap().provider();
    let store = MemSecretStore::default();
    let (world, intake) = intake(p, secret_of(p), &store);
    let spec = spec_of(p).unwrap();
    let send = |body: serde_json::Value| {
        let (intake, spec) = (&intake, &spec);
        async move {
            let body = body.to_string().into_bytes();
            let mut list = vec![("content-type".to_owned(), "application/json".to_owned())];
            list.extend(p.sign(spec, &Secret::new(secret_of(p)), "", "", NOW, &body).unwrap());
            request(intake, &Method::POST, "", &list, &body).await
        }
    };
    let message = |id: &str| serde_json::json!({"from": "16505551234", "id": id, "type": "text", "text": {"body": id}});
    let status = |id: &str, st: &str| serde_json::json!({"id": id, "status": st, "timestamp": "1800000000"});
    let whatsapp = |messages: Vec<serde_json::Value>, statuses: Vec<serde_json::Value>| {
        serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "102", "changes": [{"field": "messages",
            "value": {"messaging_product": "whatsapp", "metadata": {"phone_number_id": "106"},
                      "messages": messages, "statuses": statuses}}]}]})
    };
    let a = send(whatsapp(vec![message("wamid.A"), message("wamid.B")], vec![status("wamid.OUT", "delivered")])).await;
    assert_eq!((a.status, a.code), (200, "accepted"), "{}", a.detail);
    let recorded = |world: &World| world.queue().keys().len();
    assert_eq!(recorded(&world), 3, "two messages and a status: three records");
    // The processor's split of a batch claimed whole (over 25 updates) reads
    // the same identities.
    let body = whatsapp(vec![message("wamid.A"), message("wamid.B")], vec![status("wamid.OUT", "delivered")]);
    let split: Vec<String> =
        p.split(body.to_string().as_bytes()).unwrap().unwrap().into_iter().map(|e| e.event_id).collect();
    let mut queued: Vec<String> = world.queue().keys().iter().map(|k| k.as_str().to_owned()).collect();
    queued.sort();
    let mut want: Vec<String> = split.iter().map(|id| EventKey::new("meta", "ep", id).as_str().to_owned()).collect();
    want.sort();
    assert_eq!(queued, want);
    // Regrouped: the same updates in two other deliveries.
    let b = send(whatsapp(vec![message("wamid.B")], Vec::new())).await;
    let c = send(whatsapp(vec![message("wamid.A")], vec![status("wamid.OUT", "delivered")])).await;
    assert_eq!((b.code, c.code), ("duplicate", "duplicate"), "{} / {}", b.detail, c.detail);
    assert_eq!(recorded(&world), 3, "nothing new");
    // The same message's next status is a new fact.
    let d = send(whatsapp(Vec::new(), vec![status("wamid.OUT", "read")])).await;
    assert_eq!((d.code, recorded(&world)), ("accepted", 4));
    // Messenger: two messaging entries, two records.
    let entry = |mid: &str| serde_json::json!({"sender": {"id": "7"}, "recipient": {"id": "1"}, "timestamp": 1, "message": {"mid": mid, "text": mid}});
    let messenger = serde_json::json!({"object": "page", "entry": [{"id": "1", "time": 1, "messaging": [entry("m_1"), entry("m_2")]}]});
    let e = send(messenger).await;
    assert_eq!((e.code, recorded(&world)), ("accepted", 6), "{}", e.detail);
}

/// A HubSpot batch with one element that is no event: the others are
/// recorded, it is kept apart (parked by the processor), and the delivery
/// is answered 2xx; its retry is nothing new.
#[tokio::test]
async fn a_hubspot_batch_with_an_unparsable_element_records_the_others_and_keeps_it_apart() {
    let p = ProviderKind::named("hubspot").unwrap().provider();
    let store = MemSecretStore::default();
    let (world, intake) = intake(p, secret_of(p), &store);
    let spec = spec_of(p).unwrap();
    let body = br#"[{"eventId":1,"subscriptionId":7,"occurredAt":5,"subscriptionType":"contact.creation","attemptNumber":0},"not an event",{"eventId":2,"subscriptionId":7,"occurredAt":5,"subscriptionType":"contact.deletion","attemptNumber":0}]"#;
    let mut list = vec![("content-type".to_owned(), "application/json".to_owned())];
    list.extend(p.sign(&spec, &Secret::new(secret_of(p)), "", "", NOW, body).unwrap());
    let a = request(&intake, &Method::POST, "", &list, body).await;
    assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
    let kept = format!("{}{}", crate::verify::MALFORMED_ID_PREFIX, crate::identity::payload_hash(br#""not an event""#));
    let mut queued: Vec<String> = world.queue().keys().iter().map(|k| k.as_str().to_owned()).collect();
    queued.sort();
    let mut want: Vec<String> = ["7:1:5", "7:2:5", kept.as_str()]
        .iter()
        .map(|id| EventKey::new("hubspot", "ep", id).as_str().to_owned())
        .collect();
    want.sort();
    assert_eq!(queued, want);
    let again = request(&intake, &Method::POST, "", &list, body).await;
    assert_eq!((again.status, again.code), (200, "duplicate"), "{}", again.detail);
    assert_eq!(world.queue().keys().len(), 3);
}
