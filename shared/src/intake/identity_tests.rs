//! Issue 41 through the intake on the memory world: identity by the
//! provider's contract. A notification (Dropbox) repeated once its record
//! was leased or processed is its next generation, processed again; one
//! repeated while its record waits is a duplicate. A body of a provider
//! whose identity is an unsigned header (Shopify, GitHub) sent again under
//! another identity is a replay: answered 200, flagged on the record, never
//! recorded; a redelivery under the same identity is a plain duplicate.

use http::Method;

use super::handshake_tests::{NOW, TestIntake, intake, request, secret_of, spec_of};
use super::*;
use crate::adapters::memory::{Fault, MemSecretStore, World};
use crate::config::ProviderKind;
use crate::ledger::{CommitResult, LeaseResult, Status};
use crate::ports::WorkLedger;
use crate::secret::Secret;
use crate::verify::provider::Provider;

fn provider(name: &str) -> &'static dyn Provider {
    ProviderKind::named(name).unwrap_or_else(|| panic!("{name}")).provider()
}

/// The headers `p` signs `body` with, as event `id`.
fn signed(p: &dyn Provider, id: &str, body: &[u8]) -> Vec<(String, String)> {
    let spec = spec_of(p).unwrap();
    let mut list = vec![("content-type".to_owned(), p.content_type().to_owned())];
    list.extend(p.sign(&spec, &Secret::new(secret_of(p)), id, "demo.event", NOW, body).unwrap());
    list
}

async fn post(intake: &TestIntake, list: &[(String, String)], body: &[u8]) -> Answer {
    request(intake, &Method::POST, "", list, body).await
}

fn queued(world: &World) -> Vec<String> {
    world.queue().keys().iter().map(|k| k.as_str().to_owned()).collect()
}

const DROPBOX: &[u8] = br#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb-xxxxxx"]},"delta":{"users":[12345]}}"#;

#[tokio::test]
async fn a_dropbox_notification_repeated_after_its_record_was_leased_or_processed_is_its_next_generation() {
    let p = provider("dropbox");
    let (world, intake) = intake(p, secret_of(p), &MemSecretStore::default());
    let list = signed(p, "", DROPBOX);
    let first = EventKey::new("dropbox", "ep", &crate::identity::payload_hash(DROPBOX));
    let second = EventKey::new("dropbox", "ep", &format!("{}@g2", first.event_id()));
    let third = EventKey::new("dropbox", "ep", &format!("{}@g3", first.event_id()));

    let a = post(&intake, &list, DROPBOX).await;
    assert_eq!((a.status, a.code), (200, "accepted"), "{}", a.detail);
    // Repeated while the record waits (RECEIVED): its fetch is still to come.
    let a = post(&intake, &list, DROPBOX).await;
    assert_eq!((a.status, a.code), (200, "duplicate"), "{}", a.detail);
    assert_eq!(queued(&world), vec![first.as_str().to_owned()]);

    // Leased: its fetch may predate the change this repeat announces.
    let ledger = world.ledger();
    assert!(matches!(ledger.lease(&first, "worker", NOW * 1000, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    let a = post(&intake, &list, DROPBOX).await;
    assert_eq!((a.status, a.code), (200, "accepted"), "the next generation: {}", a.detail);
    assert_eq!(queued(&world), vec![first.as_str().to_owned(), second.as_str().to_owned()]);
    assert_eq!(ledger.field(&second, "generation").as_deref(), Some("2"));
    assert_eq!(ledger.field(&first, "latest_generation").as_deref(), Some("2"));

    // Generation 2 leased and completed, as the processor does it.
    assert!(matches!(ledger.lease(&second, "worker", NOW * 1000 + 1, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    let committed = ledger.commit(&second, "worker", &[], "ignored", None, NOW * 1000 + 2).await.unwrap();
    assert!(matches!(committed, CommitResult::Committed { .. }), "{committed:?}");
    assert_eq!(ledger.record(&second).unwrap().status, Status::Processed);
    // A repeat after it was processed: generation 3, processed once more.
    let a = post(&intake, &list, DROPBOX).await;
    assert_eq!((a.status, a.code), (200, "accepted"), "{}", a.detail);
    assert_eq!(queued(&world).last().map(String::as_str), Some(third.as_str()));
    // Its repeat while it waits coalesces: never more than one generation waiting.
    let a = post(&intake, &list, DROPBOX).await;
    assert_eq!((a.status, a.code), (200, "duplicate"), "{}", a.detail);
    assert_eq!(queued(&world).len(), 3);
}

/// A body of a provider that names no per-change field repeats for each
/// change: Graph's OneDrive notification is claimed by generation; one
/// that carries the resource's version (`@odata.etag`) is an event.
#[test]
fn graph_notifications_without_a_change_field_are_notifications() {
    let p = provider("microsoft_graph");
    assert!(p.notification(br#"{"subscriptionId":"s","changeType":"updated","resource":"drives/d/root"}"#));
    assert!(p.notification(br#"{"subscriptionId":"s","lifecycleEvent":"reauthorizationRequired"}"#));
    let etag = br#"{"changeType":"updated","resourceData":{"@odata.etag":"W/\"CQAAABYAAAD\"","id":"m"}}"#;
    assert!(!p.notification(etag));
    assert!(!p.notification(br#"{"changeType":"created","encryptedContent":{"data":"x"}}"#));
    assert!(provider("dropbox").notification(DROPBOX));
    assert!(!provider("stripe").notification(DROPBOX));
}

/// The same Shopify body under a new `X-Shopify-Event-Id` (a captured
/// delivery sent again: Shopify signs neither the id nor a time).
#[tokio::test]
async fn a_shopify_body_replayed_under_a_new_event_id_is_answered_200_flagged_and_not_applied() {
    let p = provider("shopify");
    let (world, intake) = intake(p, secret_of(p), &MemSecretStore::default());
    let spec = spec_of(p).unwrap();
    let body = p.sample(&spec, "1001", "orders/paid", NOW);
    let a = post(&intake, &signed(p, "1001", &body), &body).await;
    assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
    let replayed = post(&intake, &signed(p, "2002", &body), &body).await;
    assert_eq!((replayed.status, replayed.code), (200, "replay"), "{}", replayed.detail);
    let original = EventKey::new("shopify", "ep", "1001");
    assert_eq!(queued(&world), vec![original.as_str().to_owned()], "not recorded, not sent");
    assert!(world.ledger().record(&EventKey::new("shopify", "ep", "2002")).is_none());
    let ledger = world.ledger();
    assert_eq!(ledger.field(&original, "body_replays").as_deref(), Some("1"));
    assert_eq!(ledger.field(&original, "last_body_replay_id").as_deref(), Some("2002"));
    // Shopify's own retry (same id, same body) is a plain duplicate.
    let retry = post(&intake, &signed(p, "1001", &body), &body).await;
    assert_eq!((retry.status, retry.code), (200, "duplicate"), "{}", retry.detail);
    // Another body under a new id is a new event.
    let other = p.sample(&spec, "3003", "orders/paid", NOW + 1);
    let a = post(&intake, &signed(p, "3003", &other), &other).await;
    assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
}

#[tokio::test]
async fn a_github_redelivery_is_a_plain_duplicate_and_its_body_under_a_new_delivery_id_a_replay() {
    let p = provider("github");
    let (world, intake) = intake(p, secret_of(p), &MemSecretStore::default());
    let spec = spec_of(p).unwrap();
    let id = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let body = p.sample(&spec, id, "push", NOW);
    assert_eq!(post(&intake, &signed(p, id, &body), &body).await.code, "accepted");
    let redelivered = post(&intake, &signed(p, id, &body), &body).await;
    assert_eq!((redelivered.status, redelivered.code), (200, "duplicate"), "{}", redelivered.detail);
    let replayed = post(&intake, &signed(p, "0e3c6a5e-0000-4000-8000-000000000001", &body), &body).await;
    assert_eq!((replayed.status, replayed.code), (200, "replay"), "{}", replayed.detail);
    assert_eq!(queued(&world).len(), 1);
}

/// `body` signed as Shopify event `id`, delivered `secs` after `NOW`.
async fn at(intake: &TestIntake, p: &dyn Provider, body: &[u8], id: &str, secs: u64) -> Answer {
    let hm = super::handshake_tests::headers(&signed(p, id, body));
    let now = UNIX_EPOCH + std::time::Duration::from_secs(NOW as u64 + secs);
    intake
        .handle(IntakeRequest {
            endpoint: "ep",
            method: &Method::POST,
            query: "",
            headers: &hm,
            body,
            now,
            request_id: "r",
        })
        .await
}

/// A delivery that bound its body and failed (or died) before its claim
/// leaves a binding without a record: a second identity of that body waits
/// out a send lease (503: the first may be claiming right now), then takes
/// it over and is recorded; the first identity, arriving again, is then the
/// replay: one of the two is applied, never both, never neither.
#[tokio::test]
async fn a_binding_whose_holder_never_recorded_is_taken_over_once_a_send_lease_has_passed() {
    let p = provider("shopify");
    let (world, intake) = intake(p, secret_of(p), &MemSecretStore::default());
    let body = p.sample(&spec_of(p).unwrap(), "1001", "orders/paid", NOW);
    world.inject("ledger.claim", 0, Some(1), Fault::Unavailable);
    assert_eq!(at(&intake, p, &body, "1001", 0).await.status, 503, "bound, not claimed");
    let early = at(&intake, p, &body, "2002", 10).await;
    assert_eq!((early.status, early.code), (503, "unavailable"), "the first may be claiming: {}", early.detail);
    let late = at(&intake, p, &body, "2002", 40).await;
    assert_eq!((late.status, late.code), (202, "accepted"), "taken over: {}", late.detail);
    let back = at(&intake, p, &body, "1001", 50).await;
    assert_eq!((back.status, back.code), (200, "replay"), "{}", back.detail);
    assert_eq!(queued(&world), vec![EventKey::new("shopify", "ep", "2002").as_str().to_owned()]);
}

/// A Graph delivery of two notifications, one that names no change
/// (OneDrive's) and one that carries its message's version (Outlook's
/// `@odata.etag`), repeated once both records were leased: the first is
/// its next generation, the second a duplicate (its repeat is the same change).
#[tokio::test]
async fn a_graph_batch_repeated_once_leased_records_only_its_notifications_again() {
    let p = provider("microsoft_graph");
    let (world, intake) = intake(p, secret_of(p), &MemSecretStore::default());
    let spec = spec_of(p).unwrap();
    let onedrive =
        r#"{"subscriptionId":"s1","changeType":"updated","resource":"drives/d1/root","clientState":"{{s}}"}"#;
    let outlook = r#"{"subscriptionId":"s2","changeType":"updated","resource":"Users/u/Messages/m1","resourceData":{"@odata.etag":"W/\"CQAAABYAAAD\"","id":"m1"},"clientState":"{{s}}"}"#;
    let body = format!(r#"{{"value":[{onedrive},{outlook}]}}"#).replace("{{s}}", secret_of(p));
    let body = p.seal(&spec, &Secret::new(secret_of(p)), NOW, body.into_bytes()).unwrap();
    let list = signed(p, "", &body);
    let a = post(&intake, &list, &body).await;
    assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
    let first: Vec<EventKey> = world.queue().keys();
    assert_eq!(first.len(), 2);
    let ledger = world.ledger();
    for key in &first {
        assert!(matches!(ledger.lease(key, "worker", NOW * 1000, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    }
    let a = post(&intake, &list, &body).await;
    assert_eq!((a.status, a.code), (202, "accepted"), "{}", a.detail);
    let queued = queued(&world);
    assert_eq!(queued.len(), 3, "one generation more: {queued:?}");
    let generation = &queued[2];
    assert!(generation.ends_with("@g2"), "{generation}");
    let onedrive_key = first.iter().find(|k| generation.starts_with(k.as_str())).expect("the OneDrive notification's");
    assert_eq!(ledger.field(onedrive_key, "latest_generation").as_deref(), Some("2"));
}
