//! `hookledger audit` on the emulator against a fake Stripe: the provider's
//! list side by side with the ledger; missing, DEAD and doubled facts named
//! with their repairs; the exit status for cron; and reads that grow with
//! the list, not with the table. `hookledger replay` by filter beside it.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use hookledger::adapters::dynamodb::outbox::DynamoOutbox;
use hookledger::completeness::{Audit, Scope, listed};
use hookledger::ledger::Exit;
use hookledger::ports::{Window, WorkLedger};
use hookledger::routes::Routes;
use serde_json::{Value, json};

use crate::explore::{Delivery, SHARDS, World, drain_processor, map_customer};
use crate::processor::pi_succeeded;

fn api_event(i: usize, created: i64) -> Value {
    let mut v: Value =
        serde_json::from_slice(&pi_succeeded(&format!("evt_au_{i}"), &format!("pi_{i}"), Some("cus_x"), 100)).unwrap();
    v["created"] = json!(created);
    v["pending_webhooks"] = json!(0);
    v
}

fn webhook_of(v: &Value) -> Delivery {
    let mut w = v.clone();
    w["pending_webhooks"] = json!(1);
    Delivery {
        endpoint: "stripe-a",
        event_id: v["id"].as_str().unwrap().to_owned(),
        body: serde_json::to_vec(&w).unwrap(),
    }
}

fn cli(w: &World, command: &[&str], since: i64, until: i64, json: bool) -> Vec<String> {
    let mut args: Vec<String> =
        ["hookledger", "--table", &w.stack.table, "--queue-url", &w.stack.queue_url, "--shards"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
    args.push(SHARDS.to_string());
    if json {
        args.push("--json".into());
    }
    args.extend(command.iter().map(|s| (*s).to_owned()));
    if command[0] != "replay" {
        args.extend(
            [
                "--endpoint",
                "stripe-a",
                "--since",
                &since.to_string(),
                "--until",
                &until.to_string(),
                "--api-key",
                "env:PATH",
                "--api-base",
                &w.fake_base(),
                "--endpoints",
                crate::support::ENDPOINTS,
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
    }
    args
}

async fn audit(w: &World, since: i64, until: i64) -> (Value, bool) {
    let mut out = Vec::new();
    let failed = hookledger_cli::run(cli(w, &["audit"], since, until, true), &mut out).await.is_err();
    (serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out))), failed)
}

/// The fake Stripe's events list.
fn stripe_list(w: &World) -> hookledger::adapters::stripe::StripeEvents {
    let key = hookledger::secret::Secret::new("sk_test_fake");
    hookledger::adapters::stripe::StripeEvents::new(w.fake_base(), key, None).unwrap()
}

/// An audit of `stripe-a` over `window`.
fn scope_of<'a>(window: &Window, routes: &'a Routes, now_ms: i64) -> Scope<'a> {
    Scope {
        provider: "stripe",
        endpoint: "stripe-a",
        tenant: "tenant-a",
        since_s: window.since_s,
        until_s: window.until_s,
        routes,
        now_ms,
        types: Default::default(),
        repair_flags: String::new(),
    }
}

fn keys_of(report: &Value, list: &str) -> Vec<String> {
    let mut k: Vec<String> =
        report[list].as_array().unwrap().iter().map(|n| n["key"].as_str().unwrap().to_owned()).collect();
    k.sort();
    k
}

/// Issue 49: 50 events listed; 3 never reached the intake and 1 ended
/// DEAD: the audit names them with their repairs and fails; after
/// `backfill` and `replay --filter` (its dry run's count first) it passes.
/// A planted doubled fact fails it again.
#[tokio::test]
async fn the_audit_names_the_missing_and_the_dead_and_passes_once_they_are_repaired() {
    let mut w = World::new(49).await;
    map_customer(&w, "cus_x", "acct_x").await;
    let now_s = w.now / 1000;
    let events: Vec<Value> = (0..50).rev().map(|i| api_event(i, now_s - 900 + i as i64 * 10)).collect();
    *w.fake.events.lock().unwrap() = events.clone();
    *w.fake.other_key.lock().unwrap() = Some(std::env::var("PATH").unwrap());
    let (since, until) = (now_s - 3_600, now_s + 1);
    // A window beyond the identity retention is refused: its expired
    // records would be called missing.
    let mut out = Vec::new();
    let old = cli(&w, &["audit"], now_s - 40 * 86_400, until, false);
    let refused = hookledger_cli::run(old, &mut out).await.unwrap_err().to_string();
    assert!(refused.contains("beyond the identity retention"), "{refused}");
    let missed = ["evt_au_7", "evt_au_21", "evt_au_40"];
    for v in events.iter().filter(|v| !missed.contains(&v["id"].as_str().unwrap())) {
        assert_eq!(w.deliver(webhook_of(v), 0).await, Some(202));
    }
    // One dies: its processor gave up.
    let dead = hookledger::identity::EventKey::new("stripe", "stripe-a", "evt_au_3");
    let ledger = w.stack.ledger().with_shards(SHARDS);
    assert!(matches!(
        ledger.lease(&dead, "tok-dead", w.now, 30_000).await.unwrap(),
        hookledger::ledger::LeaseResult::Leased(_)
    ));
    assert!(
        ledger.leave(&dead, "tok-dead", &Exit::Dead { reason: "permanent", message: "gave up" }, w.now).await.unwrap()
    );
    drain_processor(&mut w).await;

    let (report, failed) = audit(&w, since, until).await;
    assert!(failed, "missing events fail the command: {report}");
    let want = |r: &Value, k: &str| r[k].as_u64().unwrap();
    assert_eq!(
        (want(&report, "listed"), want(&report, "recorded"), want(&report, "applied"), want(&report, "missing")),
        (50, 47, 46, 3),
        "{report}"
    );
    assert_eq!((want(&report, "dead"), want(&report, "doubled"), want(&report, "in_flight")), (1, 0, 0));
    let mut want_missing: Vec<String> = missed.iter().map(|id| format!("evt#stripe#stripe-a#{id}")).collect();
    want_missing.sort();
    assert_eq!(keys_of(&report, "missing_items"), want_missing);
    assert_eq!(keys_of(&report, "dead_items"), vec![dead.as_str().to_owned()]);
    assert!(
        report["missing_items"][0]["repair"].as_str().unwrap().starts_with("hookledger backfill --endpoint stripe-a")
    );
    assert!(report["dead_items"][0]["repair"].as_str().unwrap().starts_with("hookledger replay"));
    assert!(report["outcome_p50_ms"].as_i64().is_some());

    // Repair: backfill the window, replay the DEAD one by filter.
    let mut out = Vec::new();
    hookledger_cli::run(cli(&w, &["backfill"], since, until, false), &mut out).await.unwrap();
    let filter = ["replay", "--endpoint", "stripe-a", "--status", "dead", "--reason", "audit found it"];
    let mut out = Vec::new();
    hookledger_cli::run(cli(&w, &[&filter[..], &["--dry-run"]].concat(), since, until, true), &mut out).await.unwrap();
    let dry: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(dry["count"], 1, "{dry}");
    let mut out = Vec::new();
    hookledger_cli::run(cli(&w, &filter, since, until, true), &mut out).await.unwrap();
    let real: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!((real["replayed"].as_u64(), real["run"].clone()), (Some(1), dry["run"].clone()), "{real}");
    let mut out = Vec::new();
    hookledger_cli::run(cli(&w, &filter, since, until, true), &mut out).await.unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&out).unwrap()["replayed"], 0, "run again: nothing twice");
    // The CLI replayed on the system clock: the processor's is moved past it.
    w.now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 + 1_000;
    drain_processor(&mut w).await;

    let (report, failed) = audit(&w, since, until).await;
    assert!(!failed, "{report}");
    assert_eq!(
        (want(&report, "missing"), want(&report, "dead"), want(&report, "applied"), want(&report, "doubled")),
        (0, 0, 50, 0),
        "{report}"
    );

    // Planted: the body of a listed fact applied again under another identity.
    let planted = "evt#stripe#stripe-a#evt_au_planted";
    let s = |v: &str| AttributeValue::S(v.to_owned());
    w.stack
        .ddb
        .put_item()
        .table_name(&w.stack.table)
        .set_item(Some(HashMap::from([
            ("pk".to_owned(), s(planted)),
            ("sk".to_owned(), s("meta")),
            ("status".to_owned(), s("PROCESSED")),
            ("outcome".to_owned(), s("applied")),
        ])))
        .send()
        .await
        .unwrap();
    w.stack
        .ddb
        .update_item()
        .table_name(&w.stack.table)
        .key("pk", s("evt#stripe#stripe-a#evt_au_5"))
        .key("sk", s("meta"))
        .update_expression("SET last_body_replay_id = :o")
        .expression_attribute_values(":o", s("evt_au_planted"))
        .send()
        .await
        .unwrap();
    let (report, failed) = audit(&w, since, until).await;
    assert!(failed && want(&report, "doubled") == 1, "{report}");
    assert!(report["doubled_items"][0]["why"].as_str().unwrap().contains("evt_au_planted"), "{report}");
}

/// Issue 49: the audit reads the ledger by key: beside 100 or 10,000
/// unrelated records, the same requests for the same listed window.
#[tokio::test]
async fn the_audits_requests_grow_with_the_listed_events_not_with_the_table() {
    let w = World::new(50).await;
    let now_s = w.now / 1000;
    let events: Vec<Value> = (0..30).rev().map(|i| api_event(i, now_s - 900 + i as i64 * 10)).collect();
    *w.fake.events.lock().unwrap() = events;
    let source = stripe_list(&w);
    let window = Window { since_s: now_s - 3_600, until_s: now_s + 1, types: vec![] };
    let ledger = w.ledger.clone();
    let outbox = DynamoOutbox::on(ledger.clone());
    let routes = Routes::none();
    let scope = scope_of(&window, &routes, w.now);
    let mut written = 0;
    let mut counts = Vec::new();
    for total in [100, 10_000] {
        while written < total {
            let batch: Vec<WriteRequest> = (written..(written + 25).min(total))
                .map(|i| {
                    let item = HashMap::from([
                        ("pk".to_owned(), AttributeValue::S(format!("evt#stripe#stripe-b#evt_other_{i}"))),
                        ("sk".to_owned(), AttributeValue::S("meta".into())),
                        ("status".to_owned(), AttributeValue::S("PROCESSED".into())),
                    ]);
                    WriteRequest::builder()
                        .put_request(PutRequest::builder().set_item(Some(item)).build().unwrap())
                        .build()
                })
                .collect();
            written += batch.len();
            w.stack.ddb.batch_write_item().request_items(&w.stack.table, batch).send().await.unwrap();
        }
        w.plan.reset_counts();
        let (list, pages, partial) = listed(&source, &window, 10).await.unwrap();
        let report = Audit { ledger: &ledger, outbox: &outbox }.of_listed(&scope, &list, pages, partial).await.unwrap();
        assert_eq!((report.listed, report.missing), (30, 30));
        counts.push(w.plan.request_counts());
    }
    assert!(counts[0].values().sum::<u64>() > 0, "{counts:?}");
    assert_eq!(counts[0], counts[1], "requests beside 100 and 10,000 unrelated records");
}

/// Issue 49: a route whose destination is down shows its deliveries
/// pending (with the oldest's age), then delivered once it is back.
#[tokio::test]
async fn a_route_whose_destination_is_down_shows_pending_then_delivered() {
    use std::sync::atomic::Ordering;
    let mut w = World::new(51).await;
    w.create_routed_destinations().await;
    let now_s = w.now / 1000;
    let events: Vec<Value> = (0..3)
        .map(|i| {
            json!({"id": format!("evt_rt_{i}"), "object": "event", "type": "product.created", "created": now_s - 60 + i,
                   "data": {"object": {"id": format!("prod_{i}")}}, "pending_webhooks": 0})
        })
        .collect();
    *w.fake.events.lock().unwrap() = events.clone();
    for v in &events {
        let body = serde_json::to_vec(v).unwrap();
        w.seed("stripe", "stripe-a", v["id"].as_str().unwrap(), &body, true).await;
    }
    drain_processor(&mut w).await;
    // The HTTPS partner is down: its first attempts fail.
    w.sink.status.store(503, Ordering::SeqCst);
    w.poll_deliveries().await;
    for i in (0..w.delivering.len()).rev() {
        w.deliver_one(i).await;
    }
    let routes = crate::explore::routes_of(&w.stack, &w.sink_url);
    let source = stripe_list(&w);
    let window = Window { since_s: now_s - 3_600, until_s: now_s + 1, types: vec![] };
    let audit_now = |w: &World| {
        let ledger = w.stack.ledger().with_shards(SHARDS);
        let (routes, source, window) = (routes.clone(), &source, window.clone());
        let now = w.now;
        async move {
            let outbox = DynamoOutbox::on(ledger.clone());
            let scope = scope_of(&window, &routes, now + 30_000);
            let (list, pages, partial) = listed(source, &window, 10).await.unwrap();
            Audit { ledger: &ledger, outbox: &outbox }.of_listed(&scope, &list, pages, partial).await.unwrap()
        }
    };
    let down = audit_now(&w).await;
    assert_eq!((down.listed, down.recorded, down.missing), (3, 3, 0), "{down:?}");
    let hooks = &down.routes["hooks"];
    assert_eq!((hooks.pending, hooks.delivered, hooks.dead), (3, 0, 0), "{down:?}");
    assert!(hooks.oldest_pending_ms.is_some_and(|a| a >= 30_000), "{down:?}");
    // Back: the sweep and the dispatcher send them.
    w.sink.status.store(200, Ordering::SeqCst);
    w.converge().await;
    let back = audit_now(&w).await;
    let hooks = &back.routes["hooks"];
    assert_eq!((hooks.pending, hooks.delivered, hooks.dead, hooks.never_queued), (0, 3, 0, 0), "{back:?}");
    for name in ["queue", "bus", "topic"] {
        assert_eq!(back.routes[name].delivered, 3, "{name}: {back:?}");
    }
    assert!(!back.failed());
    // Planted: one delivery sent under another key than its (event, destination) one.
    let key = hookledger::identity::EventKey::new("stripe", "stripe-a", "evt_rt_1");
    let id = hookledger::message::outbox_id(key.as_str(), &hookledger::routes::delivery_action("hooks"));
    w.stack
        .ddb
        .update_item()
        .table_name(&w.stack.table)
        .key("pk", AttributeValue::S(id))
        .key("sk", AttributeValue::S("outbox".into()))
        .update_expression("SET idempotency_key = :k")
        .expression_attribute_values(":k", AttributeValue::S("another-key".into()))
        .send()
        .await
        .unwrap();
    let doubled = audit_now(&w).await;
    assert_eq!(doubled.doubled, 1, "{doubled:?}");
    assert!(doubled.failed() && doubled.doubled_items[0].why.as_deref().unwrap().contains("another-key"));
}
