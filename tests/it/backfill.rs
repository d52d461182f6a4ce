//! Backfill from the Stripe events API (a fake Stripe server) into the ledger
//! on the emulator, through the same identity and claim as the webhooks.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::adapters::stripe::StripeEvents;
use hookledger::backfill::{Backfill, BackfillSettings, Summary, Target};
use hookledger::backoff::Backoff;
use hookledger::ports::Window;
use hookledger::secret::Secret;
use hookledger_app::account_ledger::balance_pk;
use serde_json::{Value, json};

use crate::explore::{Delivery, SHARDS, World, drain_processor, map_customer};
use crate::processor::pi_succeeded;
use crate::support::{n, s as text};

/// A payment event as Stripe's API renders it (`pending_webhooks` as of now).
fn api_event(i: usize, created: i64) -> Value {
    let mut v: Value = serde_json::from_slice(&pi_succeeded(
        &format!("evt_bf_{i}"),
        &format!("pi_{i}"),
        Some("cus_x"),
        100 * (i as i64 + 1),
    ))
    .unwrap();
    v["created"] = json!(created);
    v["pending_webhooks"] = json!(0);
    v
}

/// The same event as its webhook carried it: other bytes (another member
/// order, `pending_webhooks` then 1).
fn webhook_of(v: &Value) -> Delivery {
    let mut w = v.clone();
    w["pending_webhooks"] = json!(1);
    let body = serde_json::to_vec_pretty(&w).unwrap();
    Delivery { endpoint: "stripe-a", event_id: v["id"].as_str().unwrap().to_owned(), body }
}

struct Setup {
    w: World,
    events: Vec<Value>,
    window: Window,
}

/// A world with `count` payment events at Stripe (newest first), created
/// over the last minutes.
async fn setup(count: usize) -> Setup {
    let w = World::new(11).await;
    map_customer(&w, "cus_x", "acct_x").await;
    let now_s = w.now / 1000;
    let events: Vec<Value> = (0..count).rev().map(|i| api_event(i, now_s - 600 + i as i64 * 10)).collect();
    *w.fake.events.lock().unwrap() = events.clone();
    let window = Window { since_s: now_s - 3_600, until_s: now_s, types: vec![] };
    Setup { w, events, window }
}

fn backfill(w: &World, account: Option<&str>, max_pages: u32) -> Backfill<DynamoLedger, SqsQueue, StripeEvents> {
    let source = StripeEvents::new(w.fake_base(), Secret::new("sk_test_fake"), account.map(str::to_owned)).unwrap();
    Backfill::new(
        w.stack.ledger().with_shards(SHARDS),
        SqsQueue::new(w.stack.sqs.clone(), &w.stack.queue_url),
        source,
        BackfillSettings {
            max_pages,
            max_waits: 3,
            backoff: Backoff { base_ms: 20, max_ms: 100 },
            ..BackfillSettings::default()
        },
    )
}

fn target() -> Target {
    Target {
        provider: "stripe".into(),
        endpoint: "stripe-a".into(),
        tenant: "tenant-a".into(),
        retention_days: 30,
        index_shards: SHARDS,
        mode: hookledger::backfill::Mode::Import,
        payload: Default::default(),
        erasable: false,
    }
}

async fn run(b: &Backfill<DynamoLedger, SqsQueue, StripeEvents>, w: &World, window: &Window, dry: bool) -> Summary {
    b.run(&target(), window, dry, w.now, Instant::now() + Duration::from_secs(20), |_| {}).await
}

async fn balance(w: &World) -> (i64, i64) {
    w.state(&balance_pk("tenant-a", "acct_x")).await.map_or((0, 0), |b| (n(&b, "balance"), n(&b, "entries")))
}

#[tokio::test]
async fn missed_events_are_recovered_exactly_once_and_delivered_ones_not_applied_again() {
    let Setup { mut w, events, window } = setup(6).await;
    // The intake saw two of them.
    for v in &events[..2] {
        assert_eq!(w.deliver(webhook_of(v), 0).await, Some(202));
    }
    drain_processor(&mut w).await;
    let want: i64 = events.iter().map(|v| v["data"]["object"]["amount"].as_i64().unwrap()).sum();

    let b = backfill(&w, None, 10);
    let s = run(&b, &w, &window, false).await;
    assert_eq!((s.seen, s.already_recorded, s.recovered, s.failed, s.complete), (6, 2, 4, 0, true), "{s:?}");
    drain_processor(&mut w).await;
    assert_eq!(balance(&w).await, (want, 6), "every payment applied once");

    // The same window again: done. A wider one: everything already recorded.
    assert_eq!(run(&b, &w, &window, false).await.seen, 0);
    let wider = Window { since_s: window.since_s - 60, ..window.clone() };
    let s = run(&b, &w, &wider, false).await;
    assert_eq!((s.seen, s.already_recorded, s.recovered), (6, 6, 0));
    drain_processor(&mut w).await;
    assert_eq!(balance(&w).await, (want, 6), "nothing applied again");
    let records = w.stack.meta_items().await;
    assert_eq!(records.iter().filter(|r| text(r, "via") == "backfill").count(), 4);
    assert_eq!(records.iter().filter(|r| text(r, "via") == "webhook").count(), 2);
}

#[tokio::test]
async fn a_backfilled_event_and_its_late_webhook_are_one_record_without_a_conflict() {
    let Setup { mut w, events, window } = setup(1).await;
    let s = run(&backfill(&w, None, 10), &w, &window, false).await;
    assert_eq!(s.recovered, 1);
    // The webhook arrives late, with other bytes: a duplicate, not a conflict.
    assert_eq!(w.deliver(webhook_of(&events[0]), 0).await, Some(200));
    let records = w.stack.meta_items().await;
    assert_eq!(records.len(), 1);
    assert_eq!((text(&records[0], "via"), n(&records[0], "conflicts")), ("backfill".to_owned(), 0));
    drain_processor(&mut w).await;
    assert_eq!(balance(&w).await, (100, 1));
    // Two signed webhooks with different content are still a conflict.
    let first = pi_succeeded("evt_other", "pi_o", Some("cus_x"), 7);
    let changed = pi_succeeded("evt_other", "pi_o", Some("cus_x"), 8);
    for (body, status) in [(first, 202), (changed, 200)] {
        let d = Delivery { endpoint: "stripe-a", event_id: "evt_other".into(), body };
        assert_eq!(w.deliver(d, 0).await, Some(status));
    }
    let flagged = w.stack.meta_items().await.into_iter().find(|r| text(r, "event_id") == "evt_other").unwrap();
    assert_eq!(n(&flagged, "conflicts"), 1);
}

#[tokio::test]
async fn an_interrupted_run_resumes_from_its_cursor() {
    let Setup { w, window, .. } = setup(7).await;
    w.fake.page_cap.store(3, Ordering::SeqCst);
    let b = backfill(&w, None, 1);
    let first = run(&b, &w, &window, false).await;
    assert_eq!((first.recovered, first.complete), (3, false));
    let before = w.fake.requests.load(Ordering::SeqCst);
    let second = run(&b, &w, &window, false).await;
    let third = run(&b, &w, &window, false).await;
    assert_eq!((second.recovered, second.already_recorded), (3, 0), "resumed after the first page");
    assert_eq!((third.recovered, third.complete), (1, true));
    assert_eq!(w.fake.requests.load(Ordering::SeqCst) - before, 2, "one page per run");
    assert_eq!(w.stack.meta_items().await.len(), 7);
}

#[tokio::test]
async fn a_429_is_honoured_with_and_without_retry_after_and_a_no_retry_ends_the_run() {
    let Setup { w, window, .. } = setup(2).await;
    *w.fake.rate_limits.lock().unwrap() = vec![vec![("Retry-After", "1".into())], vec![]];
    let started = Instant::now();
    let s = run(&backfill(&w, Some("acct_connected"), 10), &w, &window, false).await;
    assert_eq!((s.rate_limit_waits, s.recovered, s.complete), (2, 2, true), "{s:?}");
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After: 1 was waited out");
    let accounts = w.fake.accounts.lock().unwrap().clone();
    assert!(accounts.iter().all(|a| a.as_deref() == Some("acct_connected")), "{accounts:?}");

    let Setup { w, window, .. } = setup(2).await;
    *w.fake.rate_limits.lock().unwrap() = vec![vec![("Stripe-Should-Retry", "false".into())]];
    let s = run(&backfill(&w, None, 10), &w, &window, false).await;
    assert_eq!((s.rate_limit_waits, s.recovered, s.complete), (0, 0, false));
    // The next run resumes and recovers them.
    let s = run(&backfill(&w, None, 10), &w, &window, false).await;
    assert_eq!((s.recovered, s.complete), (2, true));
}

#[tokio::test]
async fn the_dry_run_reports_what_the_real_run_recovers_and_writes_nothing() {
    let Setup { mut w, events, window } = setup(5).await;
    assert_eq!(w.deliver(webhook_of(&events[3]), 0).await, Some(202));
    let items = w.stack.items().await.len();
    let b = backfill(&w, None, 10);
    let dry = run(&b, &w, &window, true).await;
    assert_eq!(w.stack.items().await.len(), items, "a dry run writes nothing");
    let real = run(&b, &w, &window, false).await;
    assert_eq!((dry.seen, dry.already_recorded, dry.recovered), (real.seen, real.already_recorded, real.recovered));
    assert_eq!(real.recovered, 4);
}

/// `hookledger backfill`: the dry run's report, then the run's, match; the
/// second run of the window finds it complete.
#[tokio::test]
async fn the_cli_backfills_a_window_and_its_dry_run_says_the_same() {
    let Setup { mut w, events, window } = setup(4).await;
    assert_eq!(w.deliver(webhook_of(&events[0]), 0).await, Some(202));
    // The key is read by reference from the environment, never from the
    // command line; PATH is set in every test process, so the fake accepts
    // its value as the key.
    *w.fake.other_key.lock().unwrap() = Some(std::env::var("PATH").unwrap());
    let cli = |dry: bool| {
        let mut args = vec![
            "hookledger".to_owned(),
            "--table".into(),
            w.stack.table.clone(),
            "--queue-url".into(),
            w.stack.queue_url.clone(),
            "--shards".into(),
            SHARDS.to_string(),
            "backfill".into(),
            "--endpoint".into(),
            "stripe-a".into(),
            "--since".into(),
            window.since_s.to_string(),
            "--until".into(),
            window.until_s.to_string(),
            "--api-key".into(),
            "env:PATH".into(),
            "--api-base".into(),
            w.fake_base(),
            "--endpoints".into(),
            crate::support::ENDPOINTS.into(),
        ];
        if dry {
            args.push("--dry-run".into());
        }
        args
    };
    let mut out = Vec::new();
    hookledger_cli::run(cli(true), &mut out).await.unwrap();
    let dry = String::from_utf8(out).unwrap();
    let mut out = Vec::new();
    hookledger_cli::run(cli(false), &mut out).await.unwrap();
    let real = String::from_utf8(out).unwrap();
    assert!(
        dry.contains("(dry run: nothing written)") && dry.contains("seen 4, already recorded 1, would recover 3"),
        "{dry}"
    );
    assert!(real.contains("seen 4, already recorded 1, recovered 3") && real.contains("window complete"), "{real}");
    // The run is in the operator audit log (the dry run wrote nothing, and is not).
    let log = w.stack.audit_log().await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!((log[0]["verb"].as_str(), log[0]["target"].as_str()), (Some("backfill"), Some("endpoint stripe-a")));
    assert!(log[0]["result"].as_str().unwrap().starts_with("done: {"), "{log:?}");
    drain_processor(&mut w).await;
    assert_eq!(balance(&w).await.1, 4);
    for (endpoint, extra, why) in [
        ("svix", None, "keeps no list"),
        ("stripe-a", Some("--redeliver"), "Stripe cannot redeliver"),
        ("gh", None, "GitHub needs --github-hook"),
    ] {
        let shards = SHARDS.to_string();
        let mut args = vec![
            "hookledger",
            "--table",
            &w.stack.table,
            "--queue-url",
            &w.stack.queue_url,
            "--shards",
            &shards,
            "backfill",
        ];
        args.extend([
            "--endpoint",
            endpoint,
            "--since",
            "1h",
            "--api-key",
            "env:PATH",
            "--endpoints",
            crate::support::ENDPOINTS,
        ]);
        args.extend(extra);
        let err = hookledger_cli::run(args, &mut Vec::new()).await.unwrap_err();
        assert!(err.to_string().contains(why), "{endpoint}: {err}");
    }
}

mod github {
    use super::*;
    use crate::fake_provider::{FakeGithub, GITHUB_HOOK, GITHUB_TOKEN};
    use crate::support::GITHUB_SECRET;
    use hookledger::adapters::github::GithubDeliveries;
    use hookledger::backfill::Mode;
    use hookledger::intake::IntakeRequest;
    use hookledger::verify::github as gh;
    use hookledger_it::faults::{Fault, Rule};
    use http::{HeaderMap, HeaderValue, Method};

    fn push(n: usize) -> Value {
        json!({"ref": "refs/heads/main", "after": format!("{n:040x}"), "repository": {"full_name": "octo/app"}})
    }

    fn guid(n: usize) -> String {
        format!("0b989ba4-242f-11e5-81e1-{n:012x}")
    }

    /// Delivers a push as GitHub signs it; returns the intake's status.
    async fn deliver(w: &mut World, n: usize, body: &[u8]) -> u16 {
        let mut h = HeaderMap::new();
        h.insert(gh::SIGNATURE_HEADER, HeaderValue::from_str(&gh::sign(&Secret::new(GITHUB_SECRET), body)).unwrap());
        h.insert(gh::DELIVERY_HEADER, HeaderValue::from_str(&guid(n)).unwrap());
        h.insert(gh::EVENT_HEADER, HeaderValue::from_static("push"));
        let req = IntakeRequest {
            query: "",
            endpoint: "gh",
            method: &Method::POST,
            headers: &h,
            body,
            now: std::time::UNIX_EPOCH + Duration::from_millis(w.now as u64),
            request_id: "it",
        };
        w.intake.handle(req).await.status
    }

    /// GitHub's record of a delivery (newest first in the fake's list).
    fn listed(n: usize, at_s: i64, status: u16) -> Value {
        json!({"id": 100 + n, "guid": guid(n), "delivered_at": hookledger::verify::sns::signing::timestamp(at_s),
            "redelivery": false, "status_code": status, "event": "push", "action": null, "payload": push(n)})
    }

    async fn setup() -> (World, std::sync::Arc<FakeGithub>, String, Window) {
        let w = World::new(13).await;
        let (fake, base) = FakeGithub::start().await;
        let now_s = w.now / 1000;
        let window = Window { since_s: now_s - 3 * 86_400, until_s: now_s + 1, types: vec![] };
        (w, fake, base, window)
    }

    fn backfill(w: &World, base: &str) -> Backfill<DynamoLedger, SqsQueue, GithubDeliveries> {
        Backfill::new(
            w.stack.ledger().with_shards(SHARDS),
            SqsQueue::new(w.stack.sqs.clone(), &w.stack.queue_url),
            GithubDeliveries::new(base, GITHUB_HOOK, Secret::new(GITHUB_TOKEN)).unwrap(),
            BackfillSettings {
                max_pages: 10,
                max_waits: 3,
                backoff: Backoff { base_ms: 20, max_ms: 100 },
                ..BackfillSettings::default()
            },
        )
    }

    fn target(mode: Mode) -> Target {
        Target {
            provider: "github".into(),
            endpoint: "gh".into(),
            tenant: "gh".into(),
            retention_days: 30,
            index_shards: SHARDS,
            mode,
            payload: Default::default(),
            erasable: false,
        }
    }

    #[tokio::test]
    async fn a_delivery_the_intake_answered_503_is_recovered_by_the_next_backfill() {
        let (mut w, fake, base, window) = setup().await;
        let now_s = w.now / 1000;
        // Delivery 1 is recorded; delivery 2 meets a DynamoDB outage: 503,
        // and GitHub never retries by itself.
        assert_eq!(deliver(&mut w, 1, &serde_json::to_vec(&push(1)).unwrap()).await, 202);
        w.plan.arm(Rule::new(Fault::Throttle).on("dynamodb", "PutItem").every_attempt());
        assert_eq!(deliver(&mut w, 2, &serde_json::to_vec(&push(2)).unwrap()).await, 503);
        w.plan.disarm();
        *fake.deliveries.lock().unwrap() = vec![listed(2, now_s - 60, 503), listed(1, now_s - 120, 202)];
        fake.per_page.store(1, Ordering::SeqCst);

        let b = backfill(&w, &base);
        let s =
            b.run(&target(Mode::Import), &window, false, w.now, Instant::now() + Duration::from_secs(20), |_| {}).await;
        assert_eq!((s.seen, s.already_recorded, s.recovered, s.pages, s.complete), (2, 1, 1, 2, true), "{s:?}");
        drain_processor(&mut w).await;
        let records = w.stack.meta_items().await;
        let recovered = records.iter().find(|r| text(r, "event_id") == guid(2)).unwrap();
        assert_eq!(
            (text(recovered, "via"), text(recovered, "status"), text(recovered, "event_type")),
            ("backfill".to_owned(), "PROCESSED".to_owned(), "push".to_owned())
        );
        // One payload fetch: only the missing delivery's.
        assert_eq!(fake.requests.load(Ordering::SeqCst), 3, "2 list pages + 1 payload");
    }

    #[tokio::test]
    async fn redelivery_mode_asks_github_and_the_redelivery_comes_through_the_intake() {
        let (mut w, fake, base, window) = setup().await;
        let now_s = w.now / 1000;
        *fake.deliveries.lock().unwrap() = vec![listed(3, now_s - 60, 502)];
        let b = backfill(&w, &base);
        let s = b
            .run(&target(Mode::Redeliver), &window, false, w.now, Instant::now() + Duration::from_secs(20), |_| {})
            .await;
        assert_eq!((s.redeliveries_requested, s.recovered), (1, 0), "{s:?}");
        assert_eq!(*fake.redelivered.lock().unwrap(), [103]);
        // GitHub redelivers the original bytes, signed, with the same guid.
        assert_eq!(deliver(&mut w, 3, &serde_json::to_vec(&push(3)).unwrap()).await, 202);
        let key = hookledger::identity::EventKey::new("github", "gh", &guid(3));
        let items: Vec<_> = w.stack.items().await.into_iter().filter(|i| text(i, "pk") == key.as_str()).collect();
        assert!(items.iter().any(|i| text(i, "sk").starts_with("hist#") && text(i, "kind") == "redelivery_requested"));
        assert_eq!(text(items.iter().find(|i| text(i, "sk") == "meta").unwrap(), "via"), "webhook");
        // Asked again later: it is recorded now, nothing is asked.
        let again = Window { since_s: window.since_s + 1, ..window };
        let s = b
            .run(&target(Mode::Redeliver), &again, false, w.now, Instant::now() + Duration::from_secs(20), |_| {})
            .await;
        assert_eq!((s.already_recorded, s.redeliveries_requested), (1, 0));
    }

    #[tokio::test]
    async fn githubs_rate_limits_are_waited_out() {
        let (w, fake, base, window) = setup().await;
        let now_s = w.now / 1000;
        *fake.deliveries.lock().unwrap() = vec![listed(4, now_s - 60, 500)];
        let reset =
            (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 1).to_string();
        *fake.limits.lock().unwrap() = vec![
            ("403 Forbidden", vec![("X-RateLimit-Remaining", "0".into()), ("X-RateLimit-Reset", reset)]),
            ("429 Too Many Requests", vec![("Retry-After", "0".into())]),
        ];
        let s = backfill(&w, &base)
            .run(&target(Mode::Import), &window, false, w.now, Instant::now() + Duration::from_secs(20), |_| {})
            .await;
        assert_eq!((s.rate_limit_waits, s.recovered, s.complete), (2, 1, true), "{s:?}");
    }

    /// A delivery GitHub lists but serves no payload for.
    fn unserved(n: usize, at_s: i64) -> Value {
        let mut d = listed(n, at_s, 503);
        d["payload"] = Value::Null;
        d
    }

    /// Serves the payload of delivery `n` from now on.
    fn serve(fake: &FakeGithub, n: usize) {
        let mut deliveries = fake.deliveries.lock().unwrap();
        let d = deliveries.iter_mut().find(|d| d["guid"] == guid(n)).unwrap();
        d["payload"] = push(n);
    }

    async fn run_import(w: &World, base: &str, window: &Window) -> Summary {
        backfill(w, base)
            .run(&target(Mode::Import), window, false, w.now, Instant::now() + Duration::from_secs(20), |_| {})
            .await
    }

    type Item = std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>;

    fn stored(meta: &Item) -> bool {
        meta.get("payload_stored").and_then(|v| v.as_bool().ok()).copied().unwrap_or(false)
    }

    /// Issue 18.3: a delivery whose payload GitHub does not serve no longer
    /// stalls the window: it is parked under its identity (visible in `list`
    /// and `failures`), the window completes. A plain replay is refused;
    /// `hookledger replay` fetches it again — still nothing: it stays parked;
    /// served now: the record gets its payload, becomes RECEIVED, is queued
    /// and processed.
    #[tokio::test]
    async fn a_delivery_github_serves_no_payload_for_is_parked_and_replay_fetches_and_releases_it() {
        let (mut w, fake, base, window) = setup().await;
        let now_s = w.now / 1000;
        *fake.deliveries.lock().unwrap() = vec![unserved(5, now_s - 60), listed(6, now_s - 120, 503)];
        let s = run_import(&w, &base, &window).await;
        assert_eq!((s.seen, s.recovered, s.parked, s.failed, s.complete), (2, 1, 1, 0, true), "{s:?}");
        let key = hookledger::identity::EventKey::new("github", "gh", &guid(5));

        // Visible: `list --status parked`, `show`, `failures`.
        let filter = hookledger::ops::ListFilter {
            statuses: vec![hookledger::ledger::Status::Parked],
            limit: 10,
            ..Default::default()
        };
        let (rows, _) = w.ops.list(&filter).await.unwrap();
        let row = rows.iter().find(|r| r["pk"] == key.as_str()).unwrap_or_else(|| panic!("not listed: {rows:?}"));
        assert_eq!(row["park_reason"], "backfill_unrecoverable:no_payload");
        let (record, _, _) = w.ops.show(&key, false).await.unwrap();
        assert_eq!((record["payload_stored"].as_bool(), record["via"].as_str()), (Some(false), Some("backfill")));
        assert_eq!(
            (record["backfill_origin"].as_str(), record["backfill_handle"].as_str()),
            (Some(GITHUB_HOOK), Some("105"))
        );
        let insight = hookledger::insight::Insight::new(
            w.stack.ledger().with_shards(SHARDS),
            hookledger::adapters::cloudwatch::CloudWatchMetrics::new(
                aws_sdk_cloudwatch::Client::new(&w.stack.aws),
                "hookledger-it-backfill",
            ),
        );
        let metric_window =
            hookledger::ports::MetricWindow { since_ms: w.now - 3_600_000, until_ms: w.now + 60_000, period_s: 300 };
        let failures = insight.failures(&metric_window, w.now).await.unwrap();
        assert!(
            failures.reasons.iter().any(|c| c.key == "backfill_unrecoverable:no_payload" && c.count == 1),
            "{:?}",
            failures.reasons
        );

        // A replay that cannot fetch it (ops, the console) is refused, and says what to do.
        let err = w.ops.replay(&key, &hookledger::audit::Caller::named("alice"), "try", w.now).await.unwrap_err();
        assert!(err.needs_its_source() && err.to_string().contains("hookledger replay"), "{err}");

        *fake.other_token.lock().unwrap() = Some(std::env::var("PATH").unwrap());
        let (table, queue_url) = (w.stack.table.clone(), w.stack.queue_url.clone());
        let cli = |reason: &str| {
            vec![
                "hookledger".to_owned(),
                "--table".into(),
                table.clone(),
                "--queue-url".into(),
                queue_url.clone(),
                "--shards".into(),
                SHARDS.to_string(),
                "replay".into(),
                key.as_str().to_owned(),
                "--reason".into(),
                reason.into(),
                "--operator".into(),
                "alice".into(),
                "--github-token".into(),
                "env:PATH".into(),
                "--github-api-base".into(),
                base.clone(),
            ]
        };
        // Parked under a policy other than keep, without the endpoints' configuration to
        // say how: refused before anything is fetched (a body is never stored whole by mistake).
        let mark = |update: &'static str| {
            let (ddb, table, key) = (w.stack.ddb.clone(), w.stack.table.clone(), key.clone());
            async move {
                let item = ddb.update_item().table_name(&table).update_expression(update);
                let item = item
                    .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(key.as_str().to_owned()))
                    .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("meta".into()));
                let item = if update.starts_with("SET") {
                    item.expression_attribute_values(":p", aws_sdk_dynamodb::types::AttributeValue::S("redact".into()))
                } else {
                    item
                };
                item.send().await.unwrap_or_else(|e| panic!("{e:?}"));
            }
        };
        mark("SET payload_policy = :p").await;
        let err = hookledger_cli::run(cli("redacted?"), &mut Vec::new()).await.unwrap_err();
        assert!(err.to_string().contains("redact policy: run with HOOKLEDGER_ENDPOINTS"), "{err}");
        assert_eq!(text(&w.meta(&key).await.unwrap(), "status"), "PARKED");
        mark("REMOVE payload_policy").await;
        // GitHub still serves nothing: it stays parked, and the operator is told why.
        let err = hookledger_cli::run(cli("served yet?"), &mut Vec::new()).await.unwrap_err();
        assert!(err.to_string().contains("no_payload"), "{err}");
        assert_eq!(text(&w.meta(&key).await.unwrap(), "status"), "PARKED");

        serve(&fake, 5);
        let mut out = Vec::new();
        hookledger_cli::run(cli("GitHub serves it now"), &mut out).await.unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("replayed"), "{out}");
        let meta = w.meta(&key).await.unwrap();
        assert_eq!(
            (text(&meta, "status"), stored(&meta), text(&meta, "via"), text(&meta, "released_by")),
            ("RECEIVED".to_owned(), true, "backfill".to_owned(), "operator alice".to_owned())
        );
        assert!(
            !meta.contains_key("park_reason") && !meta.contains_key("attn_shard") && meta.contains_key("due_shard")
        );
        w.check_durable(&key).await;
        assert!(w.violations.is_empty(), "{:?}", w.violations);
        let (_, history, payload) = w.ops.show(&key, true).await.unwrap();
        assert_eq!(payload.as_deref(), Some(serde_json::to_vec(&push(5)).unwrap().as_slice()));
        assert!(history.iter().any(|h| h["kind"] == "replay"), "{history:?}");
        // It was sent: the processor takes it from the queue.
        drain_processor(&mut w).await;
        assert_eq!(text(&w.meta(&key).await.unwrap(), "status"), "PROCESSED");
        // Replayed again: nothing awaits its payload any more.
        let err = hookledger_cli::run(cli("again"), &mut Vec::new()).await.unwrap_err();
        assert!(err.to_string().contains("PROCESSED"), "{err}");
        // Each release fetched from the provider is audited with its outcome
        // (the refused replay of a PROCESSED record writes nothing).
        let log = w.stack.audit_log().await;
        let listed: Vec<(&str, &str)> =
            log.iter().map(|e| (e["verb"].as_str().unwrap(), e["reason"].as_str().unwrap())).collect();
        let want = [("release", "redacted?"), ("release", "served yet?"), ("release", "GitHub serves it now")];
        assert_eq!(listed, want, "{log:?}");
        assert!(log[0]["result"].as_str().unwrap().contains("redact policy"), "{log:?}");
        assert!(log[1]["result"].as_str().unwrap().starts_with("failed: "), "{log:?}");
        assert!(log[2]["result"].as_str().unwrap().starts_with("done: "), "{log:?}");
        assert_eq!(log[2]["record"].as_str(), Some(key.as_str()));
    }

    /// Issue 18.3: a webhook delivery of an identity a backfill parked
    /// without its payload supplies the payload and releases the record:
    /// 202, RECEIVED with the payload stored, queued and processed; the
    /// intake's requests in this case are the body's binding (GitHub's
    /// delivery id is not signed), the failed claim, the release and the
    /// send. A later redelivery is a plain duplicate.
    #[tokio::test]
    async fn a_webhook_delivery_releases_a_record_a_backfill_parked_without_its_payload() {
        let (mut w, fake, base, window) = setup().await;
        let now_s = w.now / 1000;
        *fake.deliveries.lock().unwrap() = vec![unserved(7, now_s - 60)];
        // The backfill on clients that count: the window's progress, a look (is it
        // recorded?), the parked claim (one put), the next progress.
        let cfg = hookledger_it::faults::sdk_config(&w.plan).await;
        let counted =
            DynamoLedger::new(hookledger_it::faults::dynamodb_client(&cfg), &w.stack.table).with_shards(SHARDS);
        let b = Backfill::new(
            counted,
            SqsQueue::new(w.stack.sqs.clone(), &w.stack.queue_url),
            GithubDeliveries::new(&base, GITHUB_HOOK, Secret::new(GITHUB_TOKEN)).unwrap(),
            BackfillSettings::default(),
        );
        w.plan.reset_counts();
        let deadline = Instant::now() + Duration::from_secs(20);
        assert_eq!(b.run(&target(Mode::Import), &window, false, w.now, deadline, |_| {}).await.parked, 1);
        let requests: Vec<String> = w.plan.operations().iter().map(|(_, svc, op)| format!("{svc}:{op}")).collect();
        let want = ["dynamodb:GetItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:PutItem"];
        assert_eq!(requests, want, "progress, look, park, progress");
        let key = hookledger::identity::EventKey::new("github", "gh", &guid(7));

        w.warm().await;
        w.plan.reset_counts();
        let body = serde_json::to_vec(&push(7)).unwrap();
        assert_eq!(deliver(&mut w, 7, &body).await, 202);
        let requests: Vec<String> = w.plan.operations().iter().map(|(_, svc, op)| format!("{svc}:{op}")).collect();
        assert_eq!(
            requests,
            ["dynamodb:UpdateItem", "dynamodb:PutItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "sqs:SendMessage"],
            "binding, claim, the payload beside the record (a push would take the parked record past 1 KB), release, send"
        );
        let meta = w.meta(&key).await.unwrap();
        assert_eq!(
            (text(&meta, "status"), stored(&meta), text(&meta, "via"), text(&meta, "released_by")),
            ("RECEIVED".to_owned(), true, "webhook".to_owned(), "webhook".to_owned())
        );
        assert_eq!(hookledger::adapters::dynamodb::payload::body(&meta), None, "beside the record, not in it");
        w.check_durable(&key).await;
        assert!(w.violations.is_empty(), "{:?}", w.violations);
        drain_processor(&mut w).await;
        assert_eq!(text(&w.meta(&key).await.unwrap(), "status"), "PROCESSED");
        assert_eq!(deliver(&mut w, 7, &body).await, 200, "a redelivery is a duplicate");
    }

    /// Each write recognises its own retry: the parked claim whose
    /// acknowledgement is lost meets its own PARKED record (parked, not
    /// "already recorded"), and so does the release the intake makes.
    #[tokio::test]
    async fn a_lost_acknowledgement_of_the_park_or_the_release_is_recognised_as_ours() {
        let (mut w, fake, base, window) = setup().await;
        let now_s = w.now / 1000;
        *fake.deliveries.lock().unwrap() = vec![unserved(9, now_s - 60)];
        let cfg = hookledger_it::faults::sdk_config(&w.plan).await;
        let faulty =
            DynamoLedger::new(hookledger_it::faults::dynamodb_client(&cfg), &w.stack.table).with_shards(SHARDS);
        let b = Backfill::new(
            faulty,
            SqsQueue::new(w.stack.sqs.clone(), &w.stack.queue_url),
            GithubDeliveries::new(&base, GITHUB_HOOK, Secret::new(GITHUB_TOKEN)).unwrap(),
            BackfillSettings::default(),
        );
        w.plan.arm(Rule::new(Fault::LoseAck).on("dynamodb", "PutItem").containing("backfill_unrecoverable"));
        let deadline = Instant::now() + Duration::from_secs(20);
        let s = b.run(&target(Mode::Import), &window, false, w.now, deadline, |_| {}).await;
        w.plan.disarm();
        assert_eq!((s.parked, s.already_recorded, s.complete), (1, 0, true), "{s:?}");
        assert_eq!(w.plan.injected().values().sum::<u64>(), 1, "the fault hit");

        w.plan.arm(Rule::new(Fault::LoseAck).on("dynamodb", "UpdateItem").containing("released_by"));
        let body = serde_json::to_vec(&push(9)).unwrap();
        assert_eq!(deliver(&mut w, 9, &body).await, 202);
        w.plan.disarm();
        assert_eq!(w.plan.injected().values().sum::<u64>(), 2, "the fault hit the release");
        let key = hookledger::identity::EventKey::new("github", "gh", &guid(9));
        assert_eq!(text(&w.meta(&key).await.unwrap(), "status"), "RECEIVED");
        drain_processor(&mut w).await;
        assert_eq!(text(&w.meta(&key).await.unwrap(), "status"), "PROCESSED");
    }
}

/// Issue 18.3: the reconciler's scheduled backfill stores a body too large
/// for an item in the payload bucket (`HOOKLEDGER_PAYLOAD_BUCKET`), as the
/// intake does, and parks one over `HOOKLEDGER_MAX_BACKFILL_BODY_BYTES`
/// (`too_large`) while the window completes; the run's gauges count it.
#[tokio::test]
async fn a_large_backfilled_body_goes_to_s3_and_one_over_the_bound_is_parked() {
    let w = large_github_backfill().await;
    hookledger_it::iam::assert_listed(&w.plan);
}

/// The scenario of [`a_large_backfilled_body_goes_to_s3_and_one_over_the_bound_is_parked`]
/// (also one of the runs `infra/iam-actions.json` is recorded from).
pub async fn large_github_backfill() -> World {
    use crate::fake_provider::{FakeGithub, GITHUB_HOOK};
    let mut w = World::new(17).await;
    let (fake, base) = FakeGithub::start().await;
    *fake.other_token.lock().unwrap() = Some(std::env::var("PATH").unwrap());
    let now_s = w.now / 1000;
    // Hex compresses to about half: ~1 MB of it is larger, stored, than an item takes.
    let hex = |len: usize, seed: &str| {
        let mut out = String::with_capacity(len + 64);
        let mut h = hookledger::identity::payload_hash(seed.as_bytes());
        while out.len() < len {
            h = hookledger::identity::payload_hash(h.as_bytes());
            out.push_str(&h);
        }
        out
    };
    let delivery = |n: u64, blob: String| {
        json!({"id": n, "guid": format!("00000000-0000-0000-0000-{n:012}"), "event": "push", "status_code": 503,
            "delivered_at": hookledger::verify::sns::signing::timestamp(now_s - 60),
            "payload": {"ref": "refs/heads/main", "after": format!("{n:040x}"), "blob": blob}})
    };
    *fake.deliveries.lock().unwrap() = vec![delivery(1, hex(1_000_000, "large")), delivery(2, hex(2_000_000, "huge"))];
    // The world's processor reads large payloads from its bucket.
    let bucket = format!("explore-{}", &w.stack.table[3..]);
    let in_env = bucket.clone();
    let env = move |k: &str| match k {
        "HOOKLEDGER_BACKFILL" => Some(format!(
            r#"{{"gh": {{"provider": "github", "hook": "{GITHUB_HOOK}", "lag_secs": 0, "lookback_secs": 3600}}}}"#
        )),
        "HOOKLEDGER_GITHUB_TOKEN" => Some("env:PATH".to_owned()),
        "HOOKLEDGER_GITHUB_API_BASE" => Some(base.clone()),
        "HOOKLEDGER_PAYLOAD_BUCKET" => Some(in_env.clone()),
        "HOOKLEDGER_MAX_BACKFILL_BODY_BYTES" => Some("1500000".to_owned()),
        _ => None,
    };
    let backfills = scheduled(&w, env).unwrap();
    w.plan.scope("reconciler");
    let ran = backfills.run(w.now + 1_000, Instant::now() + Duration::from_secs(30)).await;
    let s = ran[0].summary.clone().unwrap_or_else(|| panic!("{ran:?}"));
    assert_eq!((s.recovered, s.parked, s.failed, s.complete), (1, 1, 0, true), "{s:?}");
    assert_eq!(reconciler::backfills::gauges(&ran), (1, 0), "backfill_failed_last_run, backfill_overdue_windows");
    let large = hookledger::identity::EventKey::new("github", "gh", "00000000-0000-0000-0000-000000000001");
    let meta = w.meta(&large).await.unwrap();
    assert_eq!(text(&meta, "payload_in"), "s3");
    let s3 = hookledger::adapters::s3::S3Payloads::from_config(&w.stack.aws, bucket);
    let stored = s3.get(&large, &text(&meta, "payload_hash")).await.unwrap().expect("in the bucket");
    assert!(stored.len() > 1_000_000);
    let huge = hookledger::identity::EventKey::new("github", "gh", "00000000-0000-0000-0000-000000000002");
    assert_eq!(text(&w.meta(&huge).await.unwrap(), "park_reason"), "backfill_unrecoverable:too_large");
    drain_processor(&mut w).await;
    assert_eq!(text(&w.meta(&large).await.unwrap(), "status"), "PROCESSED");
    w
}

/// The reconciler function's scheduled backfill: the due window is read,
/// the high-water mark moves to its end, and the next run re-reads only the
/// overlap (everything already recorded).
#[tokio::test]
async fn the_reconcilers_scheduled_backfill_recovers_and_moves_its_mark() {
    let w = scheduled_stripe_backfill().await;
    hookledger_it::iam::assert_listed(&w.plan);
}

/// The scenario of [`the_reconcilers_scheduled_backfill_recovers_and_moves_its_mark`]
/// (also one of the runs `infra/iam-actions.json` is recorded from).
pub async fn scheduled_stripe_backfill() -> World {
    let Setup { mut w, events, .. } = setup(3).await;
    assert_eq!(w.deliver(webhook_of(&events[1]), 0).await, Some(202));
    *w.fake.other_key.lock().unwrap() = Some(std::env::var("PATH").unwrap());
    let base = w.fake_base();
    let env = move |k: &str| {
        match k {
        "HOOKLEDGER_BACKFILL" => Some(
            r#"{"stripe-a": {"provider": "stripe", "tenant": "tenant-a", "lag_secs": 0, "lookback_secs": 3600, "audit_window_secs": 3600}}"#
                .to_owned(),
        ),
        "HOOKLEDGER_STRIPE_API_KEY" => Some("env:PATH".to_owned()),
        "HOOKLEDGER_STRIPE_API_BASE" => Some(base.clone()),
        _ => None,
    }
    };
    let backfills = scheduled(&w, env).unwrap();
    let now_ms = w.now + 1_000;
    w.plan.scope("reconciler");
    let ran = backfills.run(now_ms, Instant::now() + Duration::from_secs(20)).await;
    let s = ran[0].summary.clone().unwrap();
    assert_eq!((s.seen, s.already_recorded, s.recovered, s.complete), (3, 1, 2, true), "{ran:?}");
    // The scheduled audit after it: all three listed and recorded (two in flight).
    let audited = ran[0].audit.as_ref().expect("audited");
    assert_eq!(
        (audited.listed, audited.missing, audited.doubled, audited.error.as_deref()),
        (3, 0, 0, None),
        "{ran:?}"
    );
    let kept = hookledger::ports::BackfillLedger::last_audit(&w.stack.ledger(), "stripe-a").await.unwrap().unwrap();
    let kept: hookledger::completeness::Report = serde_json::from_str(&kept).unwrap();
    assert_eq!((kept.listed, kept.recorded, kept.provider_truth), (3, 3, true));
    let state = w
        .stack
        .items()
        .await
        .into_iter()
        .find(|i| text(i, "pk") == "backfill#stripe-a" && text(i, "sk") == "schedule")
        .unwrap();
    assert_eq!(n(&state, "high_water"), now_ms / 1000);
    drain_processor(&mut w).await;
    assert_eq!(balance(&w).await.1, 3);
    w.plan.scope("reconciler");
    let again = backfills.run(now_ms + 60_000, Instant::now() + Duration::from_secs(20)).await;
    let s = again[0].summary.clone().unwrap();
    assert_eq!((s.seen, s.already_recorded, s.recovered), (3, 3, 0), "the overlap is re-read, nothing recovered twice");
    // A schedule whose secret is not configured is refused at init.
    let missing = scheduled(&w, |k: &str| {
        (k == "HOOKLEDGER_BACKFILL").then(|| r#"{"gh": {"provider": "github", "hook": "app/hook"}}"#.to_owned())
    });
    assert!(missing.err().unwrap().to_string().contains("HOOKLEDGER_GITHUB_TOKEN"));
    w
}

/// The reconciler function's scheduled backfills on the world's table and
/// queue, the rest of their settings from `env`, as the function wires them.
fn scheduled(
    w: &World,
    env: impl Fn(&str) -> Option<String>,
) -> Result<reconciler::backfills::Backfills, hookledger::config::ConfigError> {
    let (table, queue) = (w.stack.table.clone(), w.stack.queue_url.clone());
    let settings = hookledger::wiring::Settings::from_lookup(move |k| match k {
        "HOOKLEDGER_TABLE" => Some(table.clone()),
        "HOOKLEDGER_QUEUE_URL" => Some(queue.clone()),
        "HOOKLEDGER_INDEX_SHARDS" => Some(SHARDS.to_string()),
        // The endpoints the world's intake serves (their tenants; no secret is resolved).
        "HOOKLEDGER_ENDPOINTS" => {
            Some(env("HOOKLEDGER_ENDPOINTS").unwrap_or_else(|| crate::support::ENDPOINTS.to_owned()))
        }
        other => env(other),
    })?;
    // The code under test's clients: through the world's fault plan (and its trace).
    reconciler::backfills::Backfills::new(hookledger::wiring::Wiring::new(w.cfg.clone(), settings))
}

/// SNS keeps nothing to list; what it could not deliver lands in the
/// subscription's dead-letter queue, and `replay-sns` sends it through the
/// intake's verification, as of when SNS sent it, within the queue's bounds.
mod sns_dead_letters {
    use std::collections::{BTreeMap, HashMap};
    use std::time::{SystemTime, UNIX_EPOCH};

    use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
    use hookledger::intake::{DeadLetter, DeadLetterQueue, DeadLetterRefusal, Intake};
    use hookledger_cli::replay_sns::{ReplayOptions, replay};

    use super::*;
    use crate::support::{Stack, now_s};

    fn message(status: &str, mail: &str) -> String {
        json!({"eventType": status, "mail": {"messageId": mail}}).to_string()
    }

    async fn dead_letter_queue(stack: &Stack) -> String {
        hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("{}-sns-dlq", &stack.table)).await.unwrap()
    }

    async fn put(stack: &Stack, dlq: &str, body: Vec<u8>) {
        let body = String::from_utf8(body).unwrap();
        stack.sqs.send_message().queue_url(dlq).message_body(body).send().await.unwrap();
    }

    /// Messages received and not deleted (invisible until their visibility lapses).
    async fn in_flight(stack: &Stack, dlq: &str) -> String {
        let out = stack
            .sqs
            .get_queue_attributes()
            .queue_url(dlq)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        out.attributes.unwrap_or_default().values().next().cloned().unwrap_or_default()
    }

    /// The options `replay-sns` runs with by default, on `dlq` and the `endpoint`.
    fn options(dlq: &str, endpoint: &str) -> ReplayOptions {
        ReplayOptions {
            dlq_url: dlq.to_owned(),
            endpoint: endpoint.to_owned(),
            max: 100,
            max_retry_secs: hookledger_cli::replay_sns::MAX_HTTPS_RETRY_SECS,
            sender_id: None,
        }
    }

    fn reasons<const N: usize>(counts: [(&'static str, usize); N]) -> BTreeMap<&'static str, usize> {
        BTreeMap::from(counts)
    }

    fn ids(items: &[HashMap<String, aws_sdk_dynamodb::types::AttributeValue>]) -> Vec<String> {
        items.iter().map(|r| text(r, "event_id")).collect()
    }

    #[tokio::test]
    async fn the_dead_letter_queue_is_replayed_through_the_intake_and_only_taken_messages_leave_it() {
        let stack = Stack::new().await;
        let intake = stack.intake().await;
        let dlq = dead_letter_queue(&stack).await;
        // The queue stamps each message as sent now: SNS gave up on `lost`
        // after retrying for half an hour; the replay runs five hours later.
        let half_an_hour_ago = now_s() - 1_800;
        let replay_at = SystemTime::now() + Duration::from_secs(5 * 3_600);
        let lost = crate::chaos::sns_envelope("sns-lost", &message("Delivery", "m-1"), half_an_hour_ago);
        // The normal path refuses a message this old (replay protection).
        let mut h = http::HeaderMap::new();
        h.insert("x-amz-sns-message-type", http::HeaderValue::from_static("Notification"));
        let req = |body, now| hookledger::intake::IntakeRequest {
            query: "",
            endpoint: "ses",
            method: &http::Method::POST,
            headers: &h,
            body,
            now,
            request_id: "it",
        };
        assert_eq!(intake.handle(req(&lost, replay_at)).await.status, 401);
        // One SNS gave up on, one that arrived after all, one forged, one
        // queued three hours after SNS sent it (longer than SNS retries),
        // one not SNS at all.
        let arrived = crate::chaos::sns_envelope("sns-arrived", &message("Bounce", "m-2"), now_s() - 60);
        assert_eq!(intake.handle(req(&arrived, SystemTime::now())).await.status, 202);
        let mut forged: Value = serde_json::from_slice(&crate::chaos::sns_envelope(
            "sns-forged",
            &message("Delivery", "m-3"),
            half_an_hour_ago,
        ))
        .unwrap();
        forged["Message"] = json!(message("Complaint", "m-3"));
        let late = crate::chaos::sns_envelope("sns-late", &message("Delivery", "m-4"), now_s() - 3 * 3_600);
        for body in [lost.clone(), arrived, serde_json::to_vec(&forged).unwrap(), late, b"not an SNS message".to_vec()]
        {
            put(&stack, &dlq, body).await;
        }
        let s = replay(&intake, &stack.sqs, &options(&dlq, "ses"), replay_at).await.unwrap();
        assert_eq!((s.read, s.recorded, s.duplicates, s.refused, s.failed), (5, 1, 1, 3, 0), "{s:?}");
        assert_eq!(
            s.refused_by_reason,
            reasons([("malformed", 1), ("sent_outside_retry_window", 1), ("unverified", 1)]),
            "{s:?}"
        );
        let ids = ids(&stack.meta_items().await);
        assert!(ids.contains(&"sns-lost".to_owned()), "{ids:?}");
        assert!(!ids.contains(&"sns-forged".to_owned()) && !ids.contains(&"sns-late".to_owned()), "{ids:?}");
        // The refused ones stay in the queue for a person to look at.
        assert_eq!(in_flight(&stack, &dlq).await, "3", "the three refused messages are still in the queue");
        // Not an SNS endpoint: refused before reading anything.
        let queue = DeadLetterQueue { max_retry_secs: 3_600, retention_secs: 4 * 86_400 };
        let letter = DeadLetter { envelope: &lost, sent_s: now_s() };
        let refused = intake.replay_sns_dead_letter("stripe-a", &queue, &letter, SystemTime::now()).await;
        assert_eq!(refused, Err(DeadLetterRefusal::NotAnSnsEndpoint));
    }

    #[tokio::test]
    async fn a_pinned_sender_id_refuses_what_any_other_sender_queued() {
        let stack = Stack::new().await;
        let intake = stack.intake().await;
        let dlq = dead_letter_queue(&stack).await;
        let queued = |id: &str| crate::chaos::sns_envelope(id, &message("Delivery", id), now_s() - 600);
        put(&stack, &dlq, queued("sns-from-elsewhere")).await;
        // The SenderId the queue recorded for whoever sent to it here.
        let peek = stack
            .sqs
            .receive_message()
            .queue_url(&dlq)
            .visibility_timeout(0)
            .message_system_attribute_names(MessageSystemAttributeName::SenderId)
            .send()
            .await
            .unwrap();
        let attributes = peek.messages.unwrap_or_default().remove(0).attributes.unwrap_or_default();
        let sender = attributes[&MessageSystemAttributeName::SenderId].clone();
        let pinned = |sender_id: &str| ReplayOptions { sender_id: Some(sender_id.to_owned()), ..options(&dlq, "ses") };

        let s = replay(&intake, &stack.sqs, &pinned("AIDAANOTHERSENDER0000"), SystemTime::now()).await.unwrap();
        assert_eq!((s.read, s.recorded, s.refused), (1, 0, 1), "{s:?}");
        assert_eq!(s.refused_by_reason, reasons([("sender_not_allowed", 1)]));
        assert_eq!(in_flight(&stack, &dlq).await, "1", "the refused message is still in the queue");

        put(&stack, &dlq, queued("sns-from-the-pinned-sender")).await;
        let s = replay(&intake, &stack.sqs, &pinned(&sender), SystemTime::now()).await.unwrap();
        assert_eq!((s.read, s.recorded, s.refused), (1, 1, 0), "{s:?}");
        let ids = ids(&stack.meta_items().await);
        assert_eq!(ids, ["sns-from-the-pinned-sender"]);
    }

    /// The topic of the genuine SNS messages in the fixtures (signed by AWS in
    /// March 2026, under a certificate valid then).
    const GENUINE_TOPIC: &str = "arn:aws:sns:us-west-2:131990247566:dongie-standard-topic";

    fn genuine(file: &str) -> String {
        std::fs::read_to_string(crate::support::testdata(&format!("providers/sns/2025-cert-7506a1e3/{file}"))).unwrap()
    }

    /// Serves the fixtures' genuine AWS certificate for its URL and answers
    /// anything else (a subscription confirmation) with an empty success;
    /// records every URL fetched.
    #[derive(Default)]
    struct GenuineCertificates {
        fetched: std::sync::Mutex<Vec<String>>,
    }

    impl hookledger::verify::sns::HttpsGet for GenuineCertificates {
        fn get<'a>(
            &'a self,
            url: &'a url::Url,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Vec<u8>, hookledger::verify::sns::FetchError>> + Send + 'a>,
        > {
            self.fetched.lock().unwrap().push(url.to_string());
            Box::pin(async move {
                Ok(match url.path().strip_prefix('/') {
                    Some(pem) if pem.ends_with(".pem") => genuine(pem).into_bytes(),
                    _ => b"<ConfirmSubscriptionResponse/>".to_vec(),
                })
            })
        }
    }

    /// An intake whose endpoint `sns-genuine` allows the fixtures' topic.
    async fn genuine_intake(
        stack: &Stack,
        certs: std::sync::Arc<GenuineCertificates>,
    ) -> Intake<DynamoLedger, SqsQueue> {
        let spec = format!(r#"{{"sns-genuine": {{"provider": "sns", "topic_arns": ["{GENUINE_TOPIC}"]}}}}"#);
        let cache = std::sync::Arc::new(hookledger::verify::sns::CertificateCache::new(certs));
        let endpoints = hookledger::config::build_endpoints(
            hookledger::config::parse_endpoints(&spec).unwrap(),
            &hookledger::config::EnvSecrets,
            cache,
            None,
        )
        .await
        .unwrap();
        let queue = SqsQueue::new(stack.sqs.clone(), &stack.queue_url);
        Intake::new(endpoints, stack.settings(), stack.ledger(), queue)
    }

    #[tokio::test]
    async fn a_genuine_sns_message_months_old_is_refused_and_stays_in_the_queue() {
        let stack = Stack::new().await;
        let certs = std::sync::Arc::new(GenuineCertificates::default());
        let intake = genuine_intake(&stack, certs.clone()).await;
        let dlq = dead_letter_queue(&stack).await;
        let notification = genuine("notification-no-subject.sv1.json");
        let envelope: Value = serde_json::from_str(&notification).unwrap();
        let sent_s = hookledger::verify::sns::parse_timestamp(envelope["Timestamp"].as_str().unwrap()).unwrap();
        assert!(now_s() - sent_s > 60 * 86_400, "the fixture is more than sixty days old");
        // Anyone who may send to the queue can put captures of genuine messages on it.
        for body in [
            notification.clone(),
            genuine("subscription-confirmation.sv1.json"),
            genuine("unsubscribe-confirmation.sv2.json"),
        ] {
            put(&stack, &dlq, body.into_bytes()).await;
        }
        let s = replay(&intake, &stack.sqs, &options(&dlq, "sns-genuine"), SystemTime::now()).await.unwrap();
        assert_eq!((s.read, s.recorded, s.duplicates, s.refused, s.failed), (3, 0, 0, 3, 0), "{s:?}");
        assert_eq!(s.refused_by_reason, reasons([("not_a_notification", 2), ("too_old", 1)]), "{s:?}");
        assert!(stack.meta_items().await.is_empty(), "nothing is recorded");
        assert!(certs.fetched.lock().unwrap().is_empty(), "nothing is fetched: no subscription is confirmed");
        assert_eq!(in_flight(&stack, &dlq).await, "3", "the refused messages are still in the queue");

        // Within its bounds (queued a minute after SNS sent it, replayed an
        // hour after), the same message verifies and is recorded: what
        // refused it above is its age, not its signature.
        let queue = DeadLetterQueue { max_retry_secs: 3_600, retention_secs: 14 * 86_400 };
        let letter = DeadLetter { envelope: notification.as_bytes(), sent_s: sent_s + 60 };
        let at = UNIX_EPOCH + Duration::from_secs((sent_s + 3_600) as u64);
        let answer = intake.replay_sns_dead_letter("sns-genuine", &queue, &letter, at).await.unwrap();
        assert_eq!(answer.status, 202, "{answer:?}");
        assert_eq!(ids(&stack.meta_items().await), [envelope["MessageId"].as_str().unwrap()]);
    }
}
