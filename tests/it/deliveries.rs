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
/// the entry's removal 1: at most 6, the bound the issue sets.
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
    let mut per_run = Vec::new();
    for (n, routed) in [(0, false), (1, true)] {
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
        capacity.scope(&format!("run{n}"));
        processor.process(&key, now_ms()).await.unwrap();
        if routed {
            let out = stack.sqs.receive_message().queue_url(&deliveries_url).send().await.unwrap();
            let messages = out.messages.unwrap_or_default();
            assert_eq!(messages.len(), 1, "the HTTPS delivery handed on");
            let message = hookledger::adapters::sqs::delivery_message(messages[0].body.as_deref().unwrap()).unwrap();
            dispatcher.take(&message, now_ms()).await.unwrap();
            assert_eq!(sink.ids().len(), 1, "delivered");
        }
        per_run.push(capacity.tallies()[&format!("run{n}")].wcu());
    }
    let per_delivery = per_run[1] - per_run[0];
    eprintln!("write units: {} without routes, {} with one HTTPS delivery: {per_delivery}", per_run[0], per_run[1]);
    assert!(per_delivery > 0.0 && per_delivery <= 6.0, "{per_delivery} write units per delivery");
}
