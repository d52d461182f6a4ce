//! Every path that puts a key on the work queue sends it in its record's
//! tenant's group (SQS fair queues: `MessageGroupId`), read from the record,
//! never from the endpoint's name or configuration. Each test drains the
//! queue moto holds and compares the exact (key, group) pairs. Where the
//! path can meet a record claimed earlier, the record's tenant is one the
//! configuration would not give (`ENDPOINTS`: `stripe-a` is `tenant-a`,
//! `svix` and `gh` are themselves), so a tenant taken from the endpoint or
//! re-derived from the configuration fails the test.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hookledger::adapters::github::GithubDeliveries;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::adapters::stripe::StripeApi;
use hookledger::backfill::{Backfill, BackfillSettings, Mode, Target};
use hookledger::config::ReconcilerSettings;
use hookledger::identity::EventKey;
use hookledger::ledger::{CommitResult, LeaseResult};
use hookledger::ports::{Window, WorkLedger as _};
use hookledger::processor::Outcome;
use hookledger::projection::fetch::SubscriptionSource;
use hookledger::secret::Secret;
use hookledger::verify::{github, stripe};
use http::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use crate::fake_provider::{FakeGithub, FakeStripe, GITHUB_HOOK, GITHUB_TOKEN};
use crate::processor::{inventory, pi_succeeded, sub_updated};
use crate::support::{GITHUB_SECRET, STRIPE_SECRET, Stack, fast_settings, key_groups, now_s, s};

fn now_ms() -> i64 {
    SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// Past the intake's 60 s grace for RECEIVED records.
const AFTER_GRACE: i64 = 61_000;

/// The pairs expected on the queue, sorted as [`key_groups`] sorts them.
fn expected(pairs: &[(&EventKey, &str)]) -> Vec<(String, Option<String>)> {
    let mut out: Vec<_> = pairs.iter().map(|(k, t)| (k.as_str().to_owned(), Some((*t).to_owned()))).collect();
    out.sort();
    out
}

/// What the work queue holds now, as (key, group) pairs.
async fn queued(stack: &Stack) -> Vec<(String, Option<String>)> {
    key_groups(&stack.drain_queue_grouped().await)
}

fn stripe_event(id: &str) -> Vec<u8> {
    json!({"id": id, "object": "event", "type": "invoice.paid", "data": {"object": {"id": "in_1"}}})
        .to_string()
        .into_bytes()
}

fn stripe_headers(body: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    let signature = stripe::sign(&Secret::new(STRIPE_SECRET), now_s(), body);
    h.insert(stripe::SIGNATURE_HEADER, HeaderValue::from_str(&signature).unwrap());
    h
}

// --- intake ------------------------------------------------------------------

/// A new event's record is claimed for its endpoint's configured tenant, and
/// its message goes in that group (not the endpoint's name).
#[tokio::test]
async fn intake_a_new_event_is_queued_in_its_records_tenant() {
    let stack = Stack::new().await;
    let intake = stack.intake().await;
    let (a, b) = (stripe_event("evt_tn_a"), stripe_event("evt_tn_b"));
    assert_eq!(crate::intake::post(&intake, "stripe-a", &stripe_headers(&a), &a).await, 202);
    assert_eq!(crate::intake::post(&intake, "stripe-b", &stripe_headers(&b), &b).await, 202);
    let (ka, kb) = (EventKey::new("stripe", "stripe-a", "evt_tn_a"), EventKey::new("stripe", "stripe-b", "evt_tn_b"));
    assert_eq!(s(&stack.record(&ka).await, "tenant"), "tenant-a");
    assert_eq!(queued(&stack).await, expected(&[(&ka, "tenant-a"), (&kb, "tenant-b")]));
}

/// A duplicate delivery that hands over a record never sent sends it in the
/// tenant the record was claimed for (here not the endpoint's configured one).
#[tokio::test]
async fn intake_a_duplicate_handing_over_a_never_sent_record_queues_it_in_the_records_tenant() {
    let stack = Stack::new().await;
    let body = stripe_event("evt_tn_dup");
    // Claimed (payload durable) for tenant `acme`, never sent, its send lease lapsed.
    let key = stack.claim_in("acme", "stripe", "stripe-a", "evt_tn_dup", &body).await;
    let intake = stack.intake().await;
    assert_eq!(crate::intake::post(&intake, "stripe-a", &stripe_headers(&body), &body).await, 200);
    assert_eq!(queued(&stack).await, expected(&[(&key, "acme")]), "the retry hands the record over");
    assert_eq!(s(&stack.record(&key).await, "tenant"), "acme", "the record keeps its tenant");
}

/// A GitHub delivery GitHub lists but serves no payload for (parked by a
/// backfill).
fn unserved(n: usize, at_s: i64) -> Value {
    json!({"id": 100 + n, "guid": guid(n), "delivered_at": hookledger::verify::sns::signing::timestamp(at_s),
        "redelivery": false, "status_code": 503, "event": "push", "action": null, "payload": null})
}

fn push(n: usize) -> Value {
    json!({"ref": "refs/heads/main", "after": format!("{n:040x}"), "repository": {"full_name": "octo/app"}})
}

fn guid(n: usize) -> String {
    format!("7e0c1a52-0000-11f0-8000-{n:012x}")
}

/// A backfill of the `gh` endpoint whose tenant is `tenant` (as a schedule
/// read before the endpoint's configuration changed would have it): GitHub
/// lists `deliveries`.
async fn github_backfill(stack: &Stack, deliveries: Vec<Value>, tenant: &str) -> (Arc<FakeGithub>, String) {
    let (fake, base) = FakeGithub::start().await;
    *fake.deliveries.lock().unwrap() = deliveries;
    let b = Backfill::new(
        stack.ledger(),
        SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
        GithubDeliveries::new(&base, GITHUB_HOOK, Secret::new(GITHUB_TOKEN)).unwrap(),
        BackfillSettings::default(),
    );
    let target = Target {
        provider: "github".into(),
        endpoint: "gh".into(),
        tenant: tenant.into(),
        retention_days: 30,
        index_shards: 16,
        mode: Mode::Import,
        payload: Default::default(),
        erasable: false,
    };
    let window = Window { since_s: now_s() - 3 * 86_400, until_s: now_s() + 1, types: vec![] };
    let summary = b.run(&target, &window, false, now_ms(), Instant::now() + Duration::from_secs(20), |_| {}).await;
    assert_eq!((summary.parked, summary.complete), (1, true), "{summary:?}");
    (fake, base)
}

/// A webhook delivery that releases a record a backfill parked without its
/// payload sends it in the parked record's tenant (`octo-org`), not the one
/// its endpoint's configuration gives now (`gh`).
#[tokio::test]
async fn intake_a_delivery_releasing_a_parked_record_queues_it_in_the_records_tenant() {
    let stack = Stack::new().await;
    github_backfill(&stack, vec![unserved(1, now_s() - 60)], "octo-org").await;
    let key = EventKey::new("github", "gh", &guid(1));
    assert_eq!(s(&stack.record(&key).await, "status"), "PARKED");
    assert!(queued(&stack).await.is_empty(), "a parked record is not sent");

    let body = serde_json::to_vec(&push(1)).unwrap();
    let mut h = HeaderMap::new();
    h.insert(
        github::SIGNATURE_HEADER,
        HeaderValue::from_str(&github::sign(&Secret::new(GITHUB_SECRET), &body)).unwrap(),
    );
    h.insert(github::DELIVERY_HEADER, HeaderValue::from_str(&guid(1)).unwrap());
    h.insert(github::EVENT_HEADER, HeaderValue::from_static("push"));
    assert_eq!(crate::intake::post(&stack.intake().await, "gh", &h, &body).await, 202);
    let record = stack.record(&key).await;
    assert_eq!((s(&record, "status"), s(&record, "released_by")), ("RECEIVED".into(), "webhook".into()));
    assert_eq!(queued(&stack).await, expected(&[(&key, "octo-org")]));
}

// --- reconciler ----------------------------------------------------------------

/// `n` event ids of `endpoint` whose keys fall in index shard `shard` (of 16).
fn ids_in_shard(provider: &str, endpoint: &str, prefix: &str, n: usize, shard: u32) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|id| EventKey::new(provider, endpoint, id).shard(16) == shard)
        .take(n)
        .collect()
}

/// The records phase re-drives 15 never-sent records of three tenants, two
/// of them on the same endpoint, all in one shard: two `SendMessageBatch`
/// requests (10 and 5), each message in its own record's tenant.
#[tokio::test]
async fn reconciler_a_redrive_of_many_records_queues_each_in_its_records_tenant() {
    let stack = Stack::new().await;
    let mut want = Vec::new();
    for (tenant, provider, endpoint, prefix, n) in [
        ("acme", "stripe", "stripe-a", "evt_rd_acme_", 6),
        ("globex", "stripe", "stripe-a", "evt_rd_globex_", 5),
        ("t1", "standard_webhooks", "svix", "msg_rd_", 4),
    ] {
        for id in ids_in_shard(provider, endpoint, prefix, n, 5) {
            let key = stack.claim_in(tenant, provider, endpoint, &id, br#"{"type":"x"}"#).await;
            want.push((key, tenant));
        }
    }
    assert_eq!(want.len(), 15);
    // The reconciler's queue through a client that counts requests.
    let plan = hookledger_it::faults::FaultPlan::new(1);
    let cfg = hookledger_it::faults::sdk_config(&plan).await;
    let queue = SqsQueue::new(hookledger_it::faults::sqs_client(&cfg), &stack.queue_url);
    let dispatcher =
        hookledger::wiring::dispatcher(stack.ddb.clone(), aws_sdk_sns::Client::new(&stack.aws), stack.table.clone());
    let r = hookledger::reconciler::Reconciler::new(
        stack.ledger(),
        queue,
        Some(dispatcher),
        hookledger::projection::recheck::Rechecks::new(),
        ReconcilerSettings::default(),
    );
    let summary = r.run(now_ms() + AFTER_GRACE, later()).await;
    assert_eq!(summary.redriven.get("never_sent"), Some(&15), "{summary:?}");
    let requests = plan.request_counts();
    assert_eq!(
        (requests.get("sqs:SendMessageBatch"), requests.get("sqs:SendMessage")),
        (Some(&2), None),
        "10 a request, one shard: {requests:?}"
    );
    let want: Vec<(&EventKey, &str)> = want.iter().map(|(k, t)| (k, *t)).collect();
    assert_eq!(queued(&stack).await, expected(&want));
}

/// A record parked at the gap bound whose predecessor committed without
/// waking it (its processor died): the reconciler's look at its waiter
/// pointer wakes it and sends it in the record's tenant (`acme`; the
/// configuration gives `svix` for the endpoint).
#[tokio::test]
async fn reconciler_waking_a_parked_gap_waiter_queues_it_in_the_records_tenant() {
    let stack = Stack::new().await;
    let p = stack.processor(fast_settings(), None, None);
    let waiter = stack.claim_in("acme", "standard_webhooks", "svix", "gapw-2", &inventory("sku-tn", 2, 5)).await;
    let first = stack.claim_in("acme", "standard_webhooks", "svix", "gapw-1", &inventory("sku-tn", 1, 1)).await;
    let received = crate::support::n(&stack.record(&waiter).await, "received_at");
    // Deferred on the gap, then parked at its bound (counted from the first deferral).
    assert_eq!(p.process(&waiter, received).await.unwrap().outcome, Outcome::Retrying);
    let bound = received + fast_settings().gap_bound_ms + 1;
    assert_eq!(p.process(&waiter, bound).await.unwrap().outcome, Outcome::Parked);
    assert_eq!(s(&stack.record(&waiter).await, "park_reason"), "gap");

    // Seq 1 commits and its processor dies before waking the waiter.
    let ledger = stack.ledger();
    assert!(matches!(ledger.lease(&first, "tok-1", bound, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    let stream = hookledger_app::inventory::inventory_pk("acme", "sku-tn");
    let apply = hookledger::projection::sequence::apply_next(&stream, 1, "on_hand", 1, Default::default());
    let committed = ledger.commit(&first, "tok-1", &[apply], "applied", None, bound).await.unwrap();
    assert!(matches!(committed, CommitResult::Committed { .. }), "{committed:?}");
    assert_eq!(s(&stack.record(&waiter).await, "status"), "PARKED", "not woken by the commit");
    assert!(queued(&stack).await.is_empty());

    let summary = stack.reconciler(ReconcilerSettings::default(), None).run(bound + 1, later()).await;
    assert_eq!(summary.gaps_woken, 1, "{summary:?}");
    assert_eq!(s(&stack.record(&waiter).await, "status"), "RETRYABLE");
    assert_eq!(queued(&stack).await, expected(&[(&waiter, "acme")]));
}

/// A drift repair is a new record of the entitlement's tenant (`acme`, the
/// tenant of the event that built it), sent in that group; the configuration
/// would give `tenant-a` for `stripe-a`.
#[tokio::test]
async fn reconciler_a_drift_repair_is_queued_in_the_entitlements_tenant() {
    let stack = Stack::new().await;
    stack.map_customer_in("acme", "cus_tn", "acct_tn").await;
    let (fake, base) = FakeStripe::start().await;
    let source: Arc<dyn SubscriptionSource> = Arc::new(StripeApi::new(base, Secret::new("sk_test_fake")).unwrap());
    fake.set("sub_tn", "cus_tn", "active", 5);
    let key = stack
        .claim_in("acme", "stripe", "stripe-a", "evt_sub_tn", &sub_updated("evt_sub_tn", "sub_tn", "cus_tn"))
        .await;
    let p = stack.processor(fast_settings(), Some(source.clone()), None);
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Applied);
    assert!(stack.state(&hookledger_app::entitlement::entitlement_pk("acme", "sub_tn")).await.is_some());
    fake.set("sub_tn", "cus_tn", "past_due", 5);

    let settings = ReconcilerSettings { drift_interval_ms: 0, ..Default::default() };
    let at = now_ms() + hookledger::config::DEFAULT_DRIFT_INTERVAL_MS + 1;
    let summary = stack.reconciler(settings, Some(source)).run(at, later()).await;
    assert_eq!((summary.drift_found, summary.drift_repaired), (1, 1), "{summary:?}");
    let repair = stack.meta_items().await.into_iter().find(|m| s(m, "pk").contains("#recon:sub_tn:")).unwrap();
    let repair = EventKey::from_stored(&s(&repair, "pk")).unwrap();
    assert_eq!(queued(&stack).await, expected(&[(&repair, "acme")]));
}

// --- backfill ------------------------------------------------------------------

/// The reconciler function's scheduled Stripe backfill imports a page of 12
/// events: sent together (two `SendMessageBatch` requests), each in the
/// tenant its record was claimed for (`tenant-a`, from `HOOKLEDGER_ENDPOINTS`;
/// not the endpoint's name).
#[tokio::test]
async fn backfill_an_imported_page_is_queued_in_its_records_tenant() {
    let w = crate::explore::World::new(23).await;
    crate::explore::map_customer(&w, "cus_x", "acct_x").await;
    let now_s = w.now / 1000;
    let events: Vec<Value> = (0..12)
        .rev()
        .map(|i| {
            let id = format!("evt_tn_bf_{i}");
            let mut v: Value =
                serde_json::from_slice(&pi_succeeded(&id, &format!("pi_{i}"), Some("cus_x"), 100)).unwrap();
            v["created"] = json!(now_s - 600 + i * 10);
            v
        })
        .collect();
    *w.fake.events.lock().unwrap() = events;
    *w.fake.other_key.lock().unwrap() = Some(std::env::var("PATH").unwrap());
    let (table, queue, base) = (w.stack.table.clone(), w.stack.queue_url.clone(), w.fake_base());
    let settings = hookledger::wiring::Settings::from_lookup(move |k| match k {
        "HOOKLEDGER_TABLE" => Some(table.clone()),
        "HOOKLEDGER_QUEUE_URL" => Some(queue.clone()),
        "HOOKLEDGER_INDEX_SHARDS" => Some(crate::explore::SHARDS.to_string()),
        "HOOKLEDGER_ENDPOINTS" => Some(crate::support::ENDPOINTS.to_owned()),
        "HOOKLEDGER_BACKFILL" => {
            Some(r#"{"stripe-a": {"provider": "stripe", "lag_secs": 0, "lookback_secs": 3600}}"#.to_owned())
        }
        "HOOKLEDGER_STRIPE_API_KEY" => Some("env:PATH".to_owned()),
        "HOOKLEDGER_STRIPE_API_BASE" => Some(base.clone()),
        _ => None,
    })
    .unwrap();
    let backfills =
        reconciler::backfills::Backfills::new(hookledger::wiring::Wiring::new(w.cfg.clone(), settings)).unwrap();
    w.plan.reset_counts();
    let ran = backfills.run(w.now + 1_000, Instant::now() + Duration::from_secs(20)).await;
    let summary = ran[0].summary.clone().unwrap_or_else(|| panic!("{ran:?}"));
    assert_eq!((summary.recovered, summary.send_deferred, summary.complete), (12, 0, true), "{summary:?}");
    let requests = w.plan.request_counts();
    assert_eq!(
        (requests.get("sqs:SendMessageBatch"), requests.get("sqs:SendMessage")),
        (Some(&2), None),
        "one page, 10 a request: {requests:?}"
    );
    let keys: Vec<EventKey> = (0..12).map(|i| EventKey::new("stripe", "stripe-a", &format!("evt_tn_bf_{i}"))).collect();
    let want: Vec<(&EventKey, &str)> = keys.iter().map(|k| (k, "tenant-a")).collect();
    assert_eq!(queued(&w.stack).await, expected(&want));
}

/// `hookledger replay` of a record a backfill parked without its payload:
/// fetched again, released and sent in the parked record's tenant
/// (`octo-org`), not the endpoint's (`gh`).
#[tokio::test]
async fn backfill_an_operator_release_of_a_parked_event_is_queued_in_the_records_tenant() {
    let stack = Stack::new().await;
    let (fake, base) = github_backfill(&stack, vec![unserved(2, now_s() - 60)], "octo-org").await;
    let key = EventKey::new("github", "gh", &guid(2));
    assert!(queued(&stack).await.is_empty(), "a parked record is not sent");
    // GitHub serves it now.
    fake.deliveries.lock().unwrap()[0]["payload"] = push(2);
    *fake.other_token.lock().unwrap() = Some(std::env::var("PATH").unwrap());
    let (r, out) = stack
        .cli(&[
            "replay",
            key.as_str(),
            "--reason",
            "GitHub serves it now",
            "--operator",
            "alice",
            "--github-token",
            "env:PATH",
            "--github-api-base",
            &base,
        ])
        .await;
    r.unwrap_or_else(|e| panic!("{e}: {out}"));
    let record = stack.record(&key).await;
    assert_eq!((s(&record, "status"), s(&record, "released_by")), ("RECEIVED".into(), "operator alice".into()));
    assert_eq!(queued(&stack).await, expected(&[(&key, "octo-org")]));
}

// --- processor -----------------------------------------------------------------

/// Seq 1's commit wakes the record waiting on it and queues it at once, in
/// the woken record's tenant (`acme`; `svix` by the configuration).
#[tokio::test]
async fn processor_waking_the_successor_queues_it_in_its_records_tenant() {
    let stack = Stack::new().await;
    let settings = hookledger::config::ProcessorSettings {
        backoff: hookledger::backoff::Backoff { base_ms: 60_000, max_ms: 300_000 },
        ..fast_settings()
    };
    let queue = SqsQueue::new(stack.sqs.clone(), &stack.queue_url);
    let p = stack.processor(settings, None, None).with_queue(queue);
    let second = stack.claim_in("acme", "standard_webhooks", "svix", "wake-tn-2", &inventory("sku-tn-w", 2, 2)).await;
    let first = stack.claim_in("acme", "standard_webhooks", "svix", "wake-tn-1", &inventory("sku-tn-w", 1, 1)).await;
    let t = now_ms();
    assert_eq!(p.process(&second, t).await.unwrap().outcome, Outcome::Retrying);
    assert!(queued(&stack).await.is_empty());
    assert_eq!(p.process(&first, t + 10).await.unwrap().outcome, Outcome::Applied);
    assert_eq!(queued(&stack).await, expected(&[(&second, "acme")]), "queued at once, in its tenant");
}

// --- operator ------------------------------------------------------------------

/// `Ops::replay` of a PARKED record (unknown customer, then mapped) sends
/// it in the record's tenant (`acme`; `tenant-a` by the configuration).
#[tokio::test]
async fn ops_a_replay_is_queued_in_the_records_tenant() {
    let stack = Stack::new().await;
    let body = pi_succeeded("evt_tn_op", "pi_tn_op", Some("cus_tn_op"), 300);
    let key = stack.claim_in("acme", "stripe", "stripe-a", "evt_tn_op", &body).await;
    let p = stack.processor(fast_settings(), None, None);
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Parked);
    stack.map_customer_in("acme", "cus_tn_op", "acct_tn_op").await;
    let ops = hookledger::ops::Ops::new(stack.ledger(), SqsQueue::new(stack.sqs.clone(), &stack.queue_url));
    ops.replay(&key, &hookledger::audit::Caller::named("alice"), "customer mapped", now_ms()).await.unwrap();
    assert_eq!(s(&stack.record(&key).await, "status"), "RETRYABLE");
    assert_eq!(queued(&stack).await, expected(&[(&key, "acme")]));
}

/// `replay-sns` of the subscription's dead-letter queue: a notification SNS
/// gave up on is recorded for the endpoint's tenant (`mail-co`) and sent in
/// that group; one that had arrived, whose record (of tenant `legacy-co`)
/// was never sent, is handed over in the record's tenant.
#[tokio::test]
async fn intake_an_sns_dead_letter_replay_is_queued_in_the_records_tenant() {
    use hookledger_cli::replay_sns::{ReplayOptions, replay};

    let stack = Stack::new().await;
    let intake = stack
        .intake_for(&format!(
            r#"{{"ses-mail": {{"provider": "sns", "tenant": "mail-co", "topic_arns": ["{}"]}}}}"#,
            crate::support::SNS_TOPIC
        ))
        .await;
    let dlq = hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("{}-sns-dlq", &stack.table)).await.unwrap();
    let message = |mail: &str| json!({"eventType": "Delivery", "mail": {"messageId": mail}}).to_string();
    let lost = crate::chaos::sns_envelope("sns-tn-lost", &message("m-1"), now_s() - 60);
    let arrived = crate::chaos::sns_envelope("sns-tn-arrived", &message("m-2"), now_s() - 60);
    let arrived_key = stack.claim_in("legacy-co", "sns", "ses-mail", "sns-tn-arrived", &arrived).await;
    for body in [lost, arrived] {
        let body = String::from_utf8(body).unwrap();
        stack.sqs.send_message().queue_url(&dlq).message_body(body).send().await.unwrap();
    }
    let options = ReplayOptions {
        dlq_url: dlq,
        endpoint: "ses-mail".into(),
        max: 100,
        max_retry_secs: hookledger_cli::replay_sns::MAX_HTTPS_RETRY_SECS,
        sender_id: None,
    };
    let summary = replay(&intake, &stack.sqs, &options, SystemTime::now()).await.unwrap();
    assert_eq!((summary.read, summary.recorded, summary.duplicates, summary.refused), (2, 1, 1, 0), "{summary:?}");
    let lost_key = EventKey::new("sns", "ses-mail", "sns-tn-lost");
    assert_eq!(s(&stack.record(&lost_key).await, "tenant"), "mail-co");
    assert_eq!(queued(&stack).await, expected(&[(&lost_key, "mail-co"), (&arrived_key, "legacy-co")]));
}

// --- per-tenant metrics --------------------------------------------------------

/// The tenant-dimensioned documents of `name` recorded: their tenants.
fn tenant_docs(docs: &[String], name: &str) -> Vec<String> {
    let mut out: Vec<String> = docs
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|d| d.get(name).is_some())
        .filter_map(|d| d.get("tenant").and_then(Value::as_str).map(str::to_owned))
        .collect();
    out.sort();
    out
}

/// Issue 22.2: the metrics of their own (received at the intake; processed,
/// dead and receipt-to-completion at the processor) are written for the
/// tenants `TenantMetrics` lists and for no other.
#[tokio::test]
async fn tenant_metrics_are_written_for_the_listed_tenants_only() {
    use hookledger::telemetry::TenantMetrics;
    let stack = Stack::new().await;
    let listed = TenantMetrics::parse("tenant-a").unwrap();
    let intake = stack.intake().await.with_tenant_metrics(listed.clone());
    let p = stack.processor(fast_settings(), None, None).with_tenant_metrics(listed);
    let docs = crate::logs::MetricDocs::default();
    {
        let _metrics = metrics::set_default_local_recorder(&docs);
        for (endpoint, id) in [("stripe-a", "evt_tm_a"), ("stripe-b", "evt_tm_b")] {
            let body = stripe_event(id);
            assert_eq!(crate::intake::post(&intake, endpoint, &stripe_headers(&body), &body).await, 202);
            let key = EventKey::new("stripe", endpoint, id);
            let report = p.process(&key, now_ms()).await.unwrap();
            assert!(report.retry_after_ms.is_none(), "{endpoint}: {:?}", report.outcome);
        }
        // A duplicate is no new event.
        let again = stripe_event("evt_tm_a");
        assert_eq!(crate::intake::post(&intake, "stripe-a", &stripe_headers(&again), &again).await, 200);
    }
    let docs = docs.docs();
    assert_eq!(tenant_docs(&docs, "tenant_received"), ["tenant-a"]);
    assert_eq!(tenant_docs(&docs, "tenant_processed"), ["tenant-a"]);
    assert_eq!(tenant_docs(&docs, "tenant_queue_to_complete"), ["tenant-a"]);
    assert!(tenant_docs(&docs, "tenant_dead").is_empty());
    assert!(docs.iter().all(|d| !d.contains("tenant-b")), "nothing of an unlisted tenant");
    assert_eq!(docs.iter().filter(|d| d.contains("\"received\"")).count(), 2, "the usual metrics for both");
}
