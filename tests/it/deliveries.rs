//! Deliveries at volume on the emulator, scaled down: events routed to
//! three HTTPS destinations (healthy, failing for a while, slow) through the
//! delivery queue, the processor and the dispatcher as deployed (the
//! processor hands HTTPS deliveries on; the dispatcher takes the queue; the
//! reconciler's drains), on the wall clock.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hookledger::adapters::dynamodb::outbox::DynamoOutbox;
use hookledger::backoff::Backoff;
use hookledger::config::DispatchPolicy;
use hookledger::identity::{EventKey, payload_hash};
use hookledger::ledger::{Claim, NewEvent, SendLease};
use hookledger::outbox::{CircuitPolicy, Dispatcher};
use hookledger::ports::{DeliveryMessage, Ledger};

use crate::support::{Stack, fast_settings};
use crate::webhook_sink::Sink;

/// Events in the test command; three deliveries each. The scaled-down run
/// of about 2,000 deliveries: `HOOKLEDGER_DELIVERY_EVENTS=670` (docs/routes.md).
const EVENTS: usize = 100;
const SHARDS: u32 = 16;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// About 2,000 deliveries: `failing` answers 503 until the delivery queue
/// has nothing visible left (everything else was taken), `slow` answers in
/// 150 ms. Every healthy delivery arrives before `failing` recovers; then
/// every waiting delivery drains: 0 lost, 0 DEAD, one key per (event,
/// destination), each signed.
#[tokio::test]
async fn two_thousand_deliveries_hold_with_one_destination_failing_and_one_slow() {
    let events: usize = std::env::var("HOOKLEDGER_DELIVERY_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(EVENTS);
    let stack = Stack::new().await;
    let (healthy, healthy_url) = Sink::start().await;
    let (failing, failing_url) = Sink::start().await;
    let (slow, slow_url) = Sink::start().await;
    failing.status.store(503, Ordering::SeqCst);
    slow.delay_ms.store(150, Ordering::SeqCst);
    let dest = |url: &str| serde_json::json!({"url": url, "secrets": ["env:SINK"], "allow_private": true});
    let routes = serde_json::json!({
        "destinations": {"healthy": dest(&healthy_url), "failing": dest(&failing_url), "slow": dest(&slow_url)},
        "routes": [{"to": ["healthy", "failing", "slow"]}],
    });
    let routes = Arc::new(hookledger::routes::Routes::parse(&routes.to_string()).unwrap());
    let deliveries_url =
        hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("deliveries-{}", &stack.table[3..]))
            .await
            .unwrap();
    let ledger = stack.ledger().with_shards(SHARDS);
    let dispatcher = Dispatcher::with_ports(
        DynamoOutbox::on(ledger.clone()),
        hookledger::adapters::destinations::AwsPublisher::new(&stack.aws)
            .with_https(hookledger::adapters::webhooks::HttpsSender::new(routes.clone(), Sink::secrets())),
    )
    .with_payloads(Arc::new(ledger.clone()))
    .with_queue(Arc::new(hookledger::adapters::sqs::SqsDeliveries::new(stack.sqs.clone(), &deliveries_url)))
    .with_destinations(vec!["healthy".into(), "failing".into(), "slow".into()])
    // Seconds instead of minutes, so the test runs on the wall clock.
    .with_circuit_policy(CircuitPolicy { threshold: 5, open_ms: 1_000, probe_ms: 1_000, read_every_ms: 200 })
    .with_policy(DispatchPolicy { backoff: Backoff { base_ms: 500, max_ms: 1_000 }, ..DispatchPolicy::default() });
    let processor = hookledger::wiring::processor(
        ledger.clone(),
        hookledger::projection::Registry::new(),
        Some(dispatcher.clone()),
        fast_settings(),
    )
    .with_routes(routes);

    // Recorded as the intake records them, then processed (eight at once).
    let mut keys = Vec::new();
    for i in 0..events {
        let id = format!("evt_{i:04}");
        let body = format!(r#"{{"id":"{id}","type":"order.paid"}}"#).into_bytes();
        let key = EventKey::new("acme", "main", &id);
        let event = NewEvent {
            key: key.clone(),
            provider: "acme".into(),
            endpoint: "main".into(),
            tenant: "t1".into(),
            event_id: id.clone(),
            event_type: Some("order.paid".into()),
            payload_hash: payload_hash(&body),
            content_hash: payload_hash(&body),
            received_at_ms: now_ms(),
            expires_at: now_ms() / 1000 + 86_400,
            shard: key.shard(SHARDS),
            send: SendLease { token: "seed".into(), until_ms: now_ms() },
            via: hookledger::ledger::Via::Webhook,
            batch_hash: None,
            kept: None,
            notification: None,
        };
        assert_eq!(ledger.claim(&event, &body).await.unwrap(), Claim::New);
        keys.push(key);
    }
    let started = Instant::now();
    let processed = futures::stream::iter(keys.iter().map(|k| processor.process(k, now_ms())))
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    assert!(processed.iter().all(Result::is_ok), "every event processed");
    let processing = started.elapsed();

    // The dispatcher takes the queue; once nothing is visible, the failing
    // destination recovers; the reconciler's drains run every second.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut recovered_at = None;
    let mut last_drains = Instant::now();
    loop {
        assert!(Instant::now() < deadline, "not drained in time");
        let out = stack
            .sqs
            .receive_message()
            .queue_url(&deliveries_url)
            .max_number_of_messages(10)
            .visibility_timeout(30)
            .send()
            .await
            .unwrap();
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() && recovered_at.is_none() {
            failing.status.store(0, Ordering::SeqCst);
            recovered_at = Some(Instant::now());
        }
        let takes = messages.into_iter().map(|m| {
            let d = &dispatcher;
            let sqs = &stack.sqs;
            let url = &deliveries_url;
            async move {
                let message: DeliveryMessage =
                    hookledger::adapters::sqs::delivery_message(m.body.as_deref().unwrap_or_default()).unwrap();
                if d.take(&message, now_ms()).await.is_ok() {
                    sqs.delete_message().queue_url(url).receipt_handle(m.receipt_handle.unwrap()).send().await.unwrap();
                }
            }
        });
        futures::future::join_all(takes).await;
        if recovered_at.is_some() && last_drains.elapsed() >= Duration::from_secs(1) {
            dispatcher.drains(now_ms(), 1_000).await;
            last_drains = Instant::now();
            let all = [&healthy, &failing, &slow].iter().all(|s| s.ids().len() >= events);
            if all {
                break;
            }
        }
    }
    let recovered_at = recovered_at.unwrap();

    let want = |destination: &str| -> BTreeSet<String> {
        let action = hookledger::routes::delivery_action(destination);
        keys.iter().map(|k| hookledger::message::idempotency_key(k.as_str(), &action)).collect()
    };
    for (name, sink) in [("healthy", &healthy), ("failing", &failing), ("slow", &slow)] {
        let got: BTreeSet<String> = sink.ids().into_keys().collect();
        assert_eq!(got, want(name), "{name}: every delivery, each under its one key");
        assert_eq!(sink.unverified(), 0, "{name}: every request signed");
    }
    let healthy_last = healthy.received().iter().map(|r| r.at).max().unwrap();
    assert!(healthy_last < recovered_at, "every healthy delivery arrived before the failing destination recovered");
    let mut outbox = Vec::new();
    let mut start = None;
    loop {
        let page = stack
            .ddb
            .scan()
            .table_name(&stack.table)
            .filter_expression("sk = :o")
            .expression_attribute_values(":o", aws_sdk_dynamodb::types::AttributeValue::S("outbox".into()))
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        outbox.extend(page.items.unwrap_or_default());
        start = page.last_evaluated_key;
        if start.is_none() {
            break;
        }
    }
    assert_eq!(outbox.len(), 3 * events);
    assert!(outbox.iter().all(|i| crate::support::s(i, "status") == "SENT"), "0 DEAD, 0 pending");
    let waited = outbox.iter().filter(|i| i.contains_key("deferred_at")).count();
    assert!(waited > events / 2, "most of the failing destination's deliveries waited in the ledger ({waited})");
    eprintln!(
        "{events} events, {} deliveries: {} attempts at the failing destination, {waited} waited in the ledger; \
         processed in {:.1} s, delivered and drained in {:.1} s more",
        3 * events,
        failing.received().len(),
        processing.as_secs_f64(),
        (started.elapsed() - processing).as_secs_f64()
    );
}

use futures::StreamExt;

/// Write units per HTTPS delivery through the delivery queue, by the
/// capacity model (DynamoDB's billing of each request's items): a 4 KiB
/// event processed and delivered to one HTTPS destination, against the same
/// event without routes. The delivery refers to its event, so its cost does
/// not grow with it: its item in the commit's transaction 2, its `due` index
/// entry 1, the dispatcher's claim (met as its commit's own) 1, its mark 1,
/// the entry's removal 1: at most 6, the bound the issue sets. A limited
/// destination's delivery adds its grant and its flight's take and landing
/// (1 each, the rate item being small); one whose grant is ahead adds the
/// hold (its item and its `due` entry moved: 3) and its claim met again
/// when it comes back (1), and a refused grant when the container's copy
/// of the rate item guessed the destination idle (1).
#[tokio::test]
async fn an_https_delivery_through_the_queue_costs_at_most_six_write_units_whatever_the_event_size() {
    use hookledger_it::capacity::Capacity;
    let stack = Stack::new().await;
    let capacity = Capacity::new(stack.ddb.clone(), &stack.table, &hookledger::adapters::dynamodb::table_definition());
    let measured =
        aws_config::from_env().http_client(capacity.client(hookledger_it::faults::emulator_http_client())).load().await;
    let (sink, sink_url) = Sink::start().await;
    let routes = serde_json::json!({
        "destinations": {"hooks": {"url": sink_url, "secrets": ["env:SINK"], "allow_private": true}},
        "routes": [{"type": "seats.*", "to": ["hooks"]}],
    });
    let routes = Arc::new(hookledger::routes::Routes::parse(&routes.to_string()).unwrap());
    let deliveries_url =
        hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("deliveries-wcu-{}", &stack.table[3..]))
            .await
            .unwrap();
    let ledger =
        hookledger::adapters::dynamodb::DynamoLedger::new(aws_sdk_dynamodb::Client::new(&measured), &stack.table)
            .with_shards(fast_settings().index_shards);
    let dispatcher = Dispatcher::with_ports(
        DynamoOutbox::on(ledger.clone()),
        hookledger::adapters::destinations::AwsPublisher::new(&measured)
            .with_https(hookledger::adapters::webhooks::HttpsSender::new(routes.clone(), Sink::secrets())),
    )
    .with_payloads(Arc::new(ledger.clone()))
    .with_queue(Arc::new(hookledger::adapters::sqs::SqsDeliveries::new(stack.sqs.clone(), &deliveries_url)))
    .with_destinations(vec!["hooks".into()]);
    // The same destination limited (5 a second, 4 in flight), taken by a
    // new container each time (its copy of the rate item empty: it guesses
    // the destination idle).
    let limited = || {
        dispatcher
            .clone()
            .with_limits([("hooks".to_owned(), hookledger::routes::Limits { step_ms: Some(204), in_flight: Some(4) })])
    };
    let store = DynamoOutbox::on(stack.ledger());
    let mut per_run = Vec::new();
    // 0: no routes; 1: one HTTPS delivery; 2: limited, granted at once;
    // 3: limited, its grant 2 s ahead (it waits on the queue, claimed).
    for n in 0..4 {
        let routed = n > 0;
        let d = if n >= 2 { limited() } else { dispatcher.clone() };
        let mut processor = hookledger::wiring::processor(
            ledger.clone(),
            hookledger::projection::Registry::new(),
            Some(dispatcher.clone()),
            fast_settings(),
        );
        if routed {
            processor = processor.with_routes(routes.clone());
        }
        let body = crate::bench::seats_4k(&format!("acct_wcu_{n}"), 1);
        assert!(body.len() >= 4096);
        let key =
            stack.claim("standard_webhooks", "svix", &format!("seats-wcu-{n}"), Some("seats.snapshot"), &body).await;
        if n == 3 {
            // Another dispatcher's grants reach 2 s ahead (outside the measure).
            let ahead = hookledger::ports::RateChange::Slow {
                resume_ms: now_ms() + 2_000,
                factor: 1,
                until_ms: now_ms(),
                now_ms: now_ms(),
            };
            hookledger::ports::CircuitStore::change_rate(&store, "hooks", ahead).await.unwrap();
        }
        capacity.scope(&format!("run{n}"));
        processor.process(&key, now_ms()).await.unwrap();
        let mut sent = false;
        while routed && !sent {
            let out = stack.sqs.receive_message().queue_url(&deliveries_url).wait_time_seconds(2).send().await.unwrap();
            for m in out.messages.unwrap_or_default() {
                let message = hookledger::adapters::sqs::delivery_message(m.body.as_deref().unwrap()).unwrap();
                let answer = d.take(&message, now_ms()).await.unwrap();
                sent = matches!(answer, Some(hookledger::outbox::Dispatched::Published));
                let receipt = m.receipt_handle.unwrap();
                stack.sqs.delete_message().queue_url(&deliveries_url).receipt_handle(receipt).send().await.unwrap();
            }
        }
        if routed {
            assert_eq!(sink.ids().len(), n, "delivered");
        }
        per_run.push(capacity.tallies()[&format!("run{n}")].wcu());
    }
    let per_delivery = per_run[1] - per_run[0];
    let (limited_now, limited_ahead) = (per_run[2] - per_run[0], per_run[3] - per_run[0]);
    eprintln!(
        "write units: {} without routes, {} with one HTTPS delivery: {per_delivery}; limited: {limited_now} \
         (granted at once), {limited_ahead} (its grant 2 s ahead)",
        per_run[0], per_run[1]
    );
    assert!(per_delivery > 0.0 && per_delivery <= 6.0, "{per_delivery} write units per delivery");
    // A grant and a flight taken and landed: three small writes more.
    assert!(limited_now <= per_delivery + 3.0, "{limited_now} write units per limited delivery");
    // And, waiting for its grant: the grant refused once (the new
    // container guessed the destination idle: 1), the hold (its item, and
    // its `due` entry moved: 3), the claim met again when it is back (1).
    assert!(limited_ahead <= per_delivery + 8.0, "{limited_ahead} write units per paced delivery");
}

/// The most of `at` (ms, any order) in any one-second window `[t, t + 1000)`.
fn most_in_a_second(at: &[i64]) -> usize {
    let mut at = at.to_vec();
    at.sort_unstable();
    let (mut most, mut start) = (0, 0);
    for end in 0..at.len() {
        while at[end] - at[start] >= 1000 {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// `count` events routed to `sink_url` as destination `name` (with
/// `limits` merged into its spec), processed; their keys, the routes, and
/// the dispatcher (handing HTTPS deliveries to `queue_url` when given).
async fn routed(
    stack: &Stack,
    name: &str,
    sink_url: &str,
    limits: serde_json::Value,
    count: usize,
    queue_url: Option<&str>,
) -> (Vec<EventKey>, String, Dispatcher<DynamoOutbox, hookledger::adapters::destinations::AwsPublisher>) {
    let mut spec = serde_json::json!({"url": sink_url, "secrets": ["env:SINK"], "allow_private": true});
    spec.as_object_mut().unwrap().extend(limits.as_object().unwrap().clone());
    let routes_json = serde_json::json!({"destinations": {name: spec}, "routes": [{"to": [name]}]}).to_string();
    let routes = Arc::new(hookledger::routes::Routes::parse(&routes_json).unwrap());
    let ledger = stack.ledger().with_shards(fast_settings().index_shards);
    let mut dispatcher = Dispatcher::with_ports(
        DynamoOutbox::on(ledger.clone()),
        hookledger::adapters::destinations::AwsPublisher::new(&stack.aws)
            .with_https(hookledger::adapters::webhooks::HttpsSender::new(routes.clone(), Sink::secrets())),
    )
    .with_payloads(Arc::new(ledger.clone()))
    .with_destinations(vec![name.to_owned()])
    .with_limits(routes.destinations().iter().map(|d| (d.name.clone(), d.limits)));
    if let Some(url) = queue_url {
        dispatcher =
            dispatcher.with_queue(Arc::new(hookledger::adapters::sqs::SqsDeliveries::new(stack.sqs.clone(), url)));
    }
    let processor =
        hookledger::wiring::processor(ledger, hookledger::projection::Registry::new(), Some(dispatcher.clone()), {
            fast_settings()
        })
        .with_routes(routes);
    let mut keys = Vec::new();
    for i in 0..count {
        let id = format!("{name}_{i:04}");
        let body = format!(r#"{{"id":"{id}","type":"order.paid"}}"#).into_bytes();
        keys.push(stack.claim("standard_webhooks", "svix", &id, Some("order.paid"), &body).await);
    }
    let processed = futures::stream::iter(keys.iter().map(|k| processor.process(k, now_ms())))
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    assert!(processed.iter().all(Result::is_ok), "every event processed");
    (keys, routes_json, dispatcher)
}

/// A destination limited to 5 a second, 200 deliveries on the delivery
/// queue, four dispatchers (four limiters) taking it at once on the wall
/// clock: the grants recorded on the deliveries never put more than 5 in
/// any one-second window, and the destination's average rate over the
/// drain is at most 5 a second (grants 2 % further apart than the limit:
/// the drain takes about 40.6 s). Each dispatcher takes one message at a
/// time (four takes at once, the destination's four flights), and a message
/// stays invisible longer than the test may run: the emulator answers one
/// DynamoDB request at a time and is shared with the exploration, so more
/// takes at once queued there for seconds, and a take that outlived its 30 s
/// claim was taken over and sent again (at least once, as the contract says;
/// this test counts each delivery once, and with two takes per dispatcher it
/// once saw a delivery twice under the exploration's load).
#[tokio::test]
async fn a_destination_limited_to_five_a_second_drains_two_hundred_deliveries_at_five_a_second() {
    const N: usize = 200;
    let stack = Stack::new().await;
    let (sink, sink_url) = Sink::start().await;
    let queue_url =
        hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("limited-{}", &stack.table[3..])).await.unwrap();
    let limits = serde_json::json!({"max_per_second": 5, "max_in_flight": 4});
    let (keys, _, first) = routed(&stack, "limited", &sink_url, limits, N, Some(&queue_url)).await;
    // Three more containers: each its own copy of the rate item.
    let mut dispatchers = vec![first.clone()];
    for _ in 0..3 {
        let d = first.clone().with_limits([(
            "limited".to_owned(),
            hookledger::routes::Limits { step_ms: Some(204), in_flight: Some(4) },
        )]);
        dispatchers.push(d);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let consumers = dispatchers.into_iter().map(|d| {
        let (sqs, url, sink) = (stack.sqs.clone(), queue_url.clone(), sink.clone());
        async move {
            while sink.ids().len() < N {
                assert!(Instant::now() < deadline, "not drained in time: {} of {N}", sink.ids().len());
                let out = sqs
                    .receive_message()
                    .queue_url(&url)
                    .max_number_of_messages(1)
                    .wait_time_seconds(1)
                    .visibility_timeout(300)
                    .send()
                    .await
                    .unwrap();
                let takes = out.messages.unwrap_or_default().into_iter().map(|m| {
                    let (d, sqs, url) = (&d, &sqs, &url);
                    async move {
                        let message = hookledger::adapters::sqs::delivery_message(m.body.as_deref().unwrap()).unwrap();
                        if d.take(&message, now_ms()).await.is_ok() {
                            let receipt = m.receipt_handle.unwrap();
                            sqs.delete_message().queue_url(url).receipt_handle(receipt).send().await.unwrap();
                        }
                    }
                });
                futures::future::join_all(takes).await;
            }
        }
    });
    futures::future::join_all(consumers).await;
    let ids = sink.ids();
    assert_eq!(ids.len(), N, "every delivery");
    assert!(ids.values().all(|n| *n == 1), "each once");
    let store = DynamoOutbox::on(stack.ledger().with_shards(fast_settings().index_shards));
    let action = hookledger::routes::delivery_action("limited");
    let mut grants = Vec::new();
    for k in &keys {
        let id = hookledger::message::outbox_id(k.as_str(), &action);
        let state = hookledger::ports::OutboxStore::state(&store, &id).await.unwrap().unwrap();
        assert_eq!(state.status, "SENT");
        grants.push(state.granted_at.expect("sent under a grant"));
    }
    assert!(most_in_a_second(&grants) <= 5, "grants: {} in one second", most_in_a_second(&grants));
    let arrivals: Vec<Instant> = sink.received().iter().map(|r| r.at).collect();
    let span = *arrivals.iter().max().unwrap() - *arrivals.iter().min().unwrap();
    let rate = (N - 1) as f64 / span.as_secs_f64();
    eprintln!("{N} deliveries at 5/s: drained over {:.1} s, {rate:.2}/s on average", span.as_secs_f64());
    assert!(rate <= 5.0, "the consumer's average rate {rate:.2}/s");
}

/// DEAD deliveries replayed by a filter: the dry run's count is what the
/// real run replays; a run interrupted after its first batch and run again
/// replays the rest, never one twice, even one that died again meanwhile;
/// each replay is audited on its item (who, why, the run); over the limit
/// without `--yes` nothing is replayed.
#[tokio::test]
async fn dead_deliveries_are_replayed_by_a_filter_counted_first_resumable_and_audited() {
    const N: usize = 30;
    let stack = Stack::new().await;
    let (sink, sink_url) = Sink::start().await;
    sink.status.store(400, Ordering::SeqCst);
    let (keys, routes, dispatcher) = routed(&stack, "strict", &sink_url, serde_json::json!({}), N, None).await;
    let cli = |extra: &[&str]| {
        let mut args: Vec<String> = ["hookledger", "--table", &stack.table, "--queue-url", &stack.queue_url]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        args.extend(["--shards".into(), fast_settings().index_shards.to_string(), "--routes".into(), routes.clone()]);
        args.extend(["deliveries", "replay", "--destination", "strict", "--status", "DEAD"].map(str::to_owned));
        args.extend(["--reason", "partner fixed its schema", "--operator", "ops-1"].map(str::to_owned));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let run = |extra: &'static [&'static str]| {
        let args = cli(extra);
        async move {
            let mut out = Vec::new();
            let result = hookledger_cli::run(args, &mut out).await;
            (result, String::from_utf8(out).unwrap())
        }
    };
    let (ok, dry) = run(&["--dry-run"]).await;
    ok.unwrap();
    assert!(dry.starts_with(&format!("{N} DEAD deliveries to strict would be replayed")), "{dry}");
    let (refused, _) = run(&["--max-without-yes", "20"]).await;
    assert!(format!("{:?}", refused.unwrap_err()).contains("--yes"), "over the limit: asks for --yes");

    // The first run: its first batch of 10, then interrupted.
    let deliveries = hookledger::outbox::Deliveries::new(
        DynamoOutbox::on(stack.ledger().with_shards(fast_settings().index_shards)),
        fast_settings().index_shards,
    );
    let filter = hookledger::outbox::health::ReplayFilter {
        destination: "strict".into(),
        since: None,
        until: None,
        reason: "partner fixed its schema".into(),
    };
    let (matched, partial) = deliveries.matching(&filter, 10_000).await.unwrap();
    assert_eq!((matched.len(), partial), (N, false));
    let first = deliveries
        .replay_batch(&filter, &matched[..10], &hookledger::audit::Caller::named("ops-1"), now_ms())
        .await
        .unwrap();
    assert_eq!(first.replayed, 10);
    // Those ten are sent again, and die again (the partner still refuses).
    for d in &matched[..10] {
        let got = dispatcher.dispatch(&d.id, now_ms()).await.unwrap();
        assert!(matches!(got, hookledger::outbox::Dispatched::Dead { .. }), "{got:?}");
    }
    let (ok, dry) = run(&["--dry-run"]).await;
    ok.unwrap();
    assert!(dry.starts_with(&format!("{} DEAD deliveries", N - 10)), "the run's own are not taken again: {dry}");
    let (ok, real) = run(&["--yes", "--batch", "7"]).await;
    ok.unwrap();
    assert!(real.starts_with(&format!("{} replayed, 0 not DEAD", N - 10)), "{real}");
    let (ok, again) = run(&["--yes"]).await;
    ok.unwrap();
    assert!(again.starts_with("0 replayed"), "nothing twice: {again}");
    let action = hookledger::routes::delivery_action("strict");
    for (i, k) in keys.iter().enumerate() {
        let id = hookledger::message::outbox_id(k.as_str(), &action);
        let item = stack.get_item(&id, "outbox").await.expect("the delivery");
        assert_eq!(crate::support::s(&item, "replayed_by"), "ops-1", "{i}");
        assert_eq!(crate::support::s(&item, "replay_reason"), "partner fixed its schema");
        assert_eq!(crate::support::s(&item, "revive_token"), filter.run(), "the run that replayed it");
        // The first batch died again; the rest wait for the sweep.
        let replayed_first = matched[..10].iter().any(|d| d.id == id);
        assert_eq!(crate::support::s(&item, "status"), if replayed_first { "DEAD" } else { "PENDING" }, "{i}");
    }
    // One audit entry per delivery replayed, none for the rerun that found
    // nothing; each listed by its event's record too.
    let log = stack.audit_log().await;
    assert_eq!(log.len(), N, "{log:?}");
    assert!(log.iter().all(|e| e["verb"] == "deliveries-replay" && e["reason"] == "partner fixed its schema"));
    let targets: std::collections::BTreeSet<&str> = log.iter().map(|e| e["target"].as_str().unwrap()).collect();
    assert_eq!(targets.len(), N, "one entry per delivery");
    let (ok, by_record) = stack.cli(&["audit-log", "--record", keys[0].as_str(), "--json"]).await;
    ok.unwrap();
    assert!(by_record.contains("deliveries-replay"), "{by_record}");
}
