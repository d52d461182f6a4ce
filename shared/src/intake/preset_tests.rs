//! Issue 24: every preset's vectors (`shared/testdata/providers/<name>/`,
//! written by `scripts/provider-vectors` and named in each folder's MANIFEST)
//! through the intake on the memory world: each delivery is accepted (202)
//! and its redelivery is a duplicate (200); the provider's retry of the same
//! event is a duplicate with no conflict; a tampered body, a wrong secret
//! and a stale timestamp are refused (401); and what our `sign` produced for
//! the provider's own verifier is what it produces today.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use super::*;
use crate::adapters::memory::World;
use crate::config::ProviderKind;
use crate::secret::Secret;
use crate::verify::certificates::{CertificateCache, FetchError, HttpsGet};
use crate::verify::presets::{ALIASES, PRESETS};
use crate::verify::provider::{BuildContext, EndpointSpec};

#[derive(Debug, Deserialize)]
struct Expect {
    id: String,
    #[serde(rename = "type")]
    event_type: Option<String>,
}

/// The answer to a message that is not an event (a handshake, a notice).
#[derive(Debug, Deserialize)]
struct ExpectAnswer {
    status: u16,
    code: String,
    /// The answer's body, as text (`text/plain`)…
    #[serde(default)]
    text: Option<String>,
    /// …or as JSON (`application/json`).
    #[serde(default)]
    json: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct SignedByUs {
    event_id: String,
    #[serde(rename = "type")]
    event_type: String,
}

#[derive(Debug, Deserialize)]
struct Vector {
    preset: String,
    what: String,
    secrets: Vec<String>,
    public_url: Option<String>,
    now: i64,
    query: String,
    headers: Vec<(String, String)>,
    body_base64: String,
    expect: Vec<Expect>,
    #[serde(default)]
    same_event_as: Option<String>,
    #[serde(default)]
    signed_by_us: Option<SignedByUs>,
    #[serde(default)]
    accepted_by: Vec<String>,
    #[serde(default)]
    answer: Option<ExpectAnswer>,
    /// A secret of the right form that is not the endpoint's (Discord: another public key).
    #[serde(default)]
    wrong_secret: Option<String>,
    /// The endpoint's verify token (a provider that checks it with a GET).
    #[serde(default)]
    verify_token: Option<String>,
    #[serde(default = "post")]
    method: String,
}

fn post() -> String {
    "POST".into()
}

impl Vector {
    fn body(&self) -> Vec<u8> {
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &self.body_base64).unwrap()
    }

    fn header_map(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in &self.headers {
            h.append(
                HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn spec(&self) -> EndpointSpec {
        let mut v = serde_json::json!({"provider": self.preset, "secrets": ["env:V"]});
        if let Some(u) = &self.public_url {
            v["public_url"] = u.clone().into();
        }
        if self.verify_token.is_some() {
            v["verify_token"] = "env:T".into();
        }
        serde_json::from_value(v).unwrap()
    }
}

pub(super) struct NoFetch;
impl HttpsGet for NoFetch {
    fn get<'a>(
        &'a self,
        _: &'a url::Url,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        Box::pin(async { Err(FetchError::Failed("no network in tests".into())) })
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/providers")
}

/// The presets, and the providers with modules of their own whose vectors
/// `scripts/provider-vectors` writes the same way (Discord, Microsoft Graph, Asana).
fn preset_names() -> Vec<&'static str> {
    PRESETS
        .iter()
        .map(|p| p.name)
        .chain(ALIASES.iter().map(|a| a.name))
        .chain(["discord", "microsoft_graph", "asana"])
        .collect()
}

fn vectors(name: &str) -> Vec<(String, Vector)> {
    let mut out: Vec<(String, Vector)> = std::fs::read_dir(root().join(name))
        .unwrap_or_else(|e| panic!("{name}: no vectors ({e}); run scripts/provider-vectors"))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".json"))
        .map(|f| {
            let text = std::fs::read_to_string(root().join(name).join(&f)).unwrap();
            let v: Vector = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}/{f}: {e}"));
            (f, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// An intake with one endpoint, `ep`, of the vector's preset and `secret`.
fn intake_for(
    v: &Vector,
    secret: &str,
) -> (World, Intake<crate::adapters::memory::MemLedger, crate::adapters::memory::MemQueue>) {
    let world = World::new(crate::clock::Ambient::fixed(v.now * 1000, 5)).with_shards(16);
    let provider = ProviderKind::named(&v.preset).unwrap_or_else(|| panic!("{} is not registered", v.preset));
    let spec = v.spec();
    provider.validate(&spec).unwrap();
    let cx = BuildContext {
        certificates: Arc::new(CertificateCache::new(Arc::new(NoFetch))),
        verify_token: v.verify_token.as_deref().map(Secret::new),
        learned: None,
    };
    let verifier = provider.verifier(&spec, vec![Secret::new(secret)], &cx).unwrap();
    let intake = one_endpoint(
        &world,
        Endpoint {
            name: "ep".into(),
            tenant: "t1".into(),
            provider,
            verifier,
            payload: Default::default(),
            erasable: false,
        },
    );
    (world, intake)
}

/// An intake on `world` with `endpoint` alone (named `ep`), bodies up to 1 MiB.
pub(super) fn one_endpoint(
    world: &World,
    endpoint: Endpoint,
) -> Intake<crate::adapters::memory::MemLedger, crate::adapters::memory::MemQueue> {
    let settings = Settings {
        table_name: "memory".into(),
        queue_url: "memory".into(),
        max_body_bytes: 1024 * 1024,
        retention_days: 30,
        index_shards: 16,
        payload_bucket: None,
    };
    Intake::new(BTreeMap::from([("ep".to_owned(), endpoint)]), settings, world.ledger(), world.queue())
        .with_ambient(world.ambient().clone())
}

async fn deliver(
    intake: &Intake<crate::adapters::memory::MemLedger, crate::adapters::memory::MemQueue>,
    v: &Vector,
    body: &[u8],
    headers: &HeaderMap,
    now: i64,
) -> Answer {
    let method = Method::from_bytes(v.method.as_bytes()).unwrap();
    let req = IntakeRequest {
        query: &v.query,
        endpoint: "ep",
        method: &method,
        headers,
        body,
        now: UNIX_EPOCH + Duration::from_secs(now as u64),
        request_id: "r",
    };
    intake.handle(req).await
}

/// `v` sent with another query string.
async fn deliver_query(
    intake: &Intake<crate::adapters::memory::MemLedger, crate::adapters::memory::MemQueue>,
    v: &Vector,
    query: &str,
) -> Answer {
    let method = Method::from_bytes(v.method.as_bytes()).unwrap();
    let (body, headers) = (v.body(), v.header_map());
    let req = IntakeRequest {
        query,
        endpoint: "ep",
        method: &method,
        headers: &headers,
        body: &body,
        now: UNIX_EPOCH + Duration::from_secs(v.now as u64),
        request_id: "r",
    };
    intake.handle(req).await
}

/// A method its provider does not use is answered 405 before anything is read.
#[tokio::test]
async fn a_method_the_provider_does_not_use_is_405() {
    for (file, v) in vectors("shopify").into_iter().filter(|(f, _)| f == "independent.json") {
        let (world, intake) = intake_for(&v, &v.secrets[0]);
        let get = Vector { method: "GET".into(), ..v };
        let a = deliver(&intake, &get, &get.body(), &get.header_map(), get.now).await;
        assert_eq!((a.status, a.code), (405, "method_not_allowed"), "{file}");
        assert_eq!(world.state().table.writes(), 0);
    }
}

#[test]
fn every_preset_has_its_vectors_named_in_its_manifest() {
    for name in preset_names() {
        let dir = root().join(name);
        let manifest = std::fs::read_to_string(dir.join("MANIFEST"))
            .unwrap_or_else(|e| panic!("{name}: no MANIFEST ({e}); run scripts/provider-vectors"));
        let mut listed: Vec<&str> = Vec::new();
        for line in manifest.lines().filter(|l| !l.trim().is_empty()) {
            let (file, source) = line.split_once("  ").unwrap_or_else(|| panic!("{name}/MANIFEST: {line:?}"));
            assert!(source.trim().len() > 10, "{name}/MANIFEST: {file} names no source");
            listed.push(file);
        }
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| f != "MANIFEST")
            .collect();
        files.sort();
        listed.sort_unstable();
        assert_eq!(listed, files, "{name}: the MANIFEST names every file, once");
        let tool_signs = ProviderKind::named(name).unwrap().tool_signs();
        for required in ["independent.json", "retry.json"].into_iter().chain(tool_signs.then_some("ours.json")) {
            assert!(files.iter().any(|f| f == required), "{name}: no {required}");
        }
        if !tool_signs {
            continue;
        }
        // Where the provider publishes a verifier, our sign was checked by it.
        let ours = vectors(name).into_iter().find(|(f, _)| f == "ours.json").unwrap().1;
        let line = manifest.lines().find(|l| l.starts_with("ours.json")).unwrap();
        for by in &ours.accepted_by {
            assert!(line.contains(by.as_str()), "{name}: {by} missing from the MANIFEST");
            assert!(by.contains('@'), "{name}: {by} names no package@version");
        }
    }
}

#[tokio::test]
async fn every_vector_is_accepted_once_and_forgeries_are_refused() {
    for name in preset_names() {
        let provider = ProviderKind::named(name).unwrap();
        let config = PRESETS.iter().find(|p| p.name == name).map(|p| p.config(&vectors(name)[0].1.spec()).unwrap());
        // Standard Webhooks aliases and Discord sign their timestamps and bodies;
        // Graph signs neither (a clientState), Asana its body without a timestamp.
        let (signs_body, timestamped) = match (&config, name) {
            (Some(c), _) => (c.signs_body(), c.timestamped()),
            (None, "microsoft_graph") => (false, false),
            (None, "asana") => (true, false),
            (None, _) => (true, true),
        };
        let tolerance = PRESETS.iter().find(|p| p.name == name).map_or(300, |p| p.tolerance_secs);
        for (file, v) in vectors(name) {
            let what = format!("{name}/{file}");
            let secret = v.secrets[0].clone();
            let (world, intake) = intake_for(&v, &secret);
            let (body, headers) = (v.body(), v.header_map());
            let a = deliver(&intake, &v, &body, &headers, v.now).await;
            if let Some(expected) = &v.answer {
                // A handshake or a notice: its answer, and nothing written or sent.
                assert_eq!((a.status, a.code), (expected.status, expected.code.as_str()), "{what}: {}", a.detail);
                match (&expected.json, &a.raw) {
                    (Some(json), Some(("application/json", body))) => {
                        assert_eq!(&serde_json::from_str::<serde_json::Value>(body).unwrap(), json, "{what}")
                    }
                    (Some(_), other) => panic!("{what}: answered {other:?}, not JSON"),
                    (None, raw) => assert_eq!(raw.as_ref().map(|(_, b)| b.clone()), expected.text, "{what}"),
                }
                if expected.text.is_some() {
                    assert_eq!(a.raw.as_ref().map(|(t, _)| *t), Some("text/plain; charset=utf-8"), "{what}");
                }
                assert_eq!(world.state().table.writes(), 0, "{what}: nothing recorded");
                assert!(world.queue().keys().is_empty(), "{what}: nothing sent");
            } else {
                let status = provider
                    .success(v.expect.first().and_then(|e| e.event_type.as_deref()))
                    .exactly()
                    .map_or(202, |s| s.status);
                assert_eq!((a.status, a.code), (status, "accepted"), "{what}: {}", a.detail);
                if let Some(body) = provider
                    .success(v.expect.first().and_then(|e| e.event_type.as_deref()))
                    .exactly()
                    .and_then(|s| s.body)
                {
                    assert_eq!(
                        a.raw.as_ref().map(|(t, b)| (*t, b.as_str())),
                        Some(body),
                        "{what}: the provider's own answer"
                    );
                }
            }
            for e in &v.expect {
                let key = crate::identity::EventKey::new(name, "ep", &e.id);
                assert_eq!(world.ledger().field(&key, "status").as_deref(), Some("RECEIVED"), "{what}: {key}");
                assert_eq!(world.ledger().field(&key, "event_type"), e.event_type.clone(), "{what}: type of {key}");
            }
            assert_eq!(world.queue().keys().len(), v.expect.len(), "{what}: one message per event");
            if v.answer.is_none() {
                let again = deliver(&intake, &v, &body, &headers, v.now + 1).await;
                assert_eq!((again.status, again.code), (200, "duplicate"), "{what}: {}", again.detail);
            }
            if v.method == "GET" || v.what == "query" {
                // A GET check proves the verify token (where the provider has one), no secret;
                // Graph's validation proves nothing (only a plain token is echoed).
                if v.verify_token.is_some() {
                    let forged = v.query.replace(v.verify_token.as_deref().unwrap(), "not-the-token");
                    let (_, fresh) = intake_for(&v, &secret);
                    let a = deliver_query(&fresh, &v, &forged).await;
                    assert_eq!((a.status, a.raw), (401, None), "{what}: a wrong verify token");
                }
                continue;
            }

            // A wrong secret.
            let wrong_secret = match &v.wrong_secret {
                Some(w) => w.as_str(),
                None if secret.starts_with("whsec_") => "whsec_bm90LXRoZS1zZWNyZXQ=",
                None => "not-the-secret",
            };
            let (_, wrong) = intake_for(&v, wrong_secret);
            let a = deliver(&wrong, &v, &body, &headers, v.now).await;
            assert_eq!((a.status, a.raw), (401, None), "{what}: wrong secret: {}", a.code);
            // One byte of the body changed.
            let mut tampered = body.clone();
            let at = tampered.iter().rposition(u8::is_ascii_alphanumeric).unwrap();
            tampered[at] = if tampered[at] == b'1' { b'2' } else { b'1' };
            let (_, fresh) = intake_for(&v, &secret);
            let a = deliver(&fresh, &v, &tampered, &headers, v.now).await;
            if signs_body {
                assert_eq!((a.status, a.code), (401, "signature_mismatch"), "{what}: tampered body");
            } else {
                assert!(matches!(name, "gitlab" | "postmark" | "mailgun" | "microsoft_graph"), "{what}: {}", a.status);
            }
            // Stale, where a timestamp is signed.
            if timestamped {
                let a = deliver(&fresh, &v, &body, &headers, v.now + tolerance + 1).await;
                assert_eq!((a.status, a.code), (401, "stale_timestamp"), "{what}: stale");
            }

            // What our sign produced for the provider's verifier, it produces today.
            if let Some(us) = &v.signed_by_us {
                let spec = v.spec();
                let s = Secret::new(secret.as_str());
                let resealed = provider.seal(&spec, &s, v.now, body.clone()).unwrap();
                assert_eq!(resealed, body, "{what}: our seal changed");
                let mut signed = provider.sign(&spec, &s, &us.event_id, &us.event_type, v.now, &body).unwrap();
                signed.push(("content-type".into(), provider.content_type().into()));
                let norm = |h: &[(String, String)]| {
                    let mut h: Vec<(String, String)> =
                        h.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.clone())).collect();
                    h.sort();
                    h
                };
                assert_eq!(
                    norm(&signed),
                    norm(&v.headers),
                    "{what}: our sign changed since the provider's verifier accepted it"
                );
            }
            assert!(v.what.len() > 2);
        }
    }
}

/// The provider's retry of an event (a new timestamp and signature, retry
/// counters changed) is the recorded event: a duplicate, no conflict.
#[tokio::test]
async fn a_providers_retry_is_the_same_event_with_no_conflict() {
    for name in preset_names() {
        let all = vectors(name);
        for (file, retry) in all.iter().filter(|(_, v)| v.same_event_as.is_some()) {
            let first = &all.iter().find(|(f, _)| Some(f) == retry.same_event_as.as_ref()).unwrap().1;
            let secret = first.secrets[0].clone();
            let (world, intake) = intake_for(first, &secret);
            let a = deliver(&intake, first, &first.body(), &first.header_map(), first.now).await;
            let provider = ProviderKind::named(name).unwrap();
            assert_eq!(
                a.status,
                provider
                    .success(first.expect.first().and_then(|e| e.event_type.as_deref()))
                    .exactly()
                    .map_or(202, |s| s.status),
                "{name}: {}",
                a.detail
            );
            assert_eq!(a.code, "accepted", "{name}: {}", a.detail);
            let ids: Vec<&str> = retry.expect.iter().map(|e| e.id.as_str()).collect();
            let first_ids: Vec<&str> = first.expect.iter().map(|e| e.id.as_str()).collect();
            assert_eq!(ids, first_ids, "{name}/{file}: the same events");
            let body = retry.body();
            let a = deliver(&intake, retry, &body, &retry.header_map(), retry.now).await;
            assert_eq!((a.status, a.code), (200, "duplicate"), "{name}/{file}: {}", a.detail);
            // For a batch the answer does not say; the stored content hashes do.
            let events = match provider.split(&body) {
                Some(events) => events.unwrap().into_iter().map(|e| (e.event_id, body[e.bytes].to_vec())).collect(),
                None => vec![(retry.expect[0].id.clone(), body.clone())],
            };
            for (id, bytes) in events {
                let key = crate::identity::EventKey::new(name, "ep", &id);
                let stored = world.ledger().field(&key, "content_hash").unwrap();
                assert!(
                    crate::verify::registry::same_content(&stored, &provider.content_hash(&bytes), name, &bytes),
                    "{name}/{file}: {key}: the retry's content differs from the recorded"
                );
            }
            // (A record still unprocessed may be handed over again: the same key.)
            let mut sent = world.queue().keys();
            sent.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            sent.dedup();
            assert_eq!(sent.len(), retry.expect.len(), "{name}: no other event sent");
        }
    }
}
