//! Routes on the emulator (issue 26): the processor as deployed
//! (`Wiring::processor`, `HOOKLEDGER_ROUTES`) delivers a verified event to
//! an SQS standard queue, an SQS FIFO queue, an EventBridge bus (a rule
//! forwards it to a queue) and an SNS topic (a queue subscribed), each once
//! with its stable key and the event as received; a second run of the same
//! record sends nothing more.

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use hookledger::message::idempotency_key;
use hookledger::routes::delivery_action;

use crate::support::{Stack, now_s};

const ACCOUNT: &str = "123456789012";

/// A queue (FIFO when its name ends in `.fifo`) and its ARN.
async fn queue(stack: &Stack, name: &str) -> (String, String) {
    let mut create = stack.sqs.create_queue().queue_name(name);
    if name.ends_with(".fifo") {
        create = create.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let url = create.send().await.unwrap_or_else(|e| panic!("{name}: {e:?}")).queue_url.unwrap_or_default();
    let attrs = stack
        .sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let arn = attrs.attributes.unwrap_or_default()[&QueueAttributeName::QueueArn].clone();
    (url, arn)
}

/// Every message on a queue: (body, its `idempotency-key` attribute, its group).
async fn received(stack: &Stack, url: &str) -> Vec<(String, Option<String>, Option<String>)> {
    let mut out = Vec::new();
    for _ in 0..5 {
        let answer = stack
            .sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        let messages = answer.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for m in messages {
            let key = m
                .message_attributes()
                .and_then(|a| a.get("idempotency-key"))
                .and_then(|v| v.string_value())
                .map(str::to_owned);
            let group = m.attributes().and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId)).cloned();
            out.push((m.body.clone().unwrap_or_default(), key, group));
            if let Some(r) = m.receipt_handle() {
                let _ = stack.sqs.delete_message().queue_url(url).receipt_handle(r).send().await;
            }
        }
    }
    out
}

/// The wiring of `stack` with these routes (and any other settings), its
/// clients on `aws`.
fn routed_wiring(
    stack: &Stack,
    aws: &aws_config::SdkConfig,
    routes: Option<&str>,
    extra: &[(&'static str, &str)],
) -> hookledger::wiring::Wiring {
    let mut vars: Vec<(&'static str, String)> =
        vec![("HOOKLEDGER_TABLE", stack.table.clone()), ("HOOKLEDGER_QUEUE_URL", stack.queue_url.clone())];
    vars.extend(routes.map(|r| ("HOOKLEDGER_ROUTES", r.to_owned())));
    vars.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let settings = hookledger::wiring::Settings::from_lookup(move |k| {
        vars.iter().find(|(name, _)| *name == k).map(|(_, v)| v.clone())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    hookledger::wiring::Wiring::new(aws.clone(), settings)
}

#[tokio::test]
async fn an_event_is_delivered_to_sqs_fifo_eventbridge_and_sns_once_each_with_its_key() {
    let stack = Stack::new().await;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (std_url, std_arn) = queue(&stack, &format!("routes-{id}")).await;
    let (fifo_url, fifo_arn) = queue(&stack, &format!("routes-{id}.fifo")).await;
    let (eb_url, eb_arn) = queue(&stack, &format!("routes-eb-{id}")).await;
    // An EventBridge bus whose rule forwards Hookledger's events to a queue.
    let events = aws_sdk_eventbridge::Client::new(&stack.aws);
    let bus = format!("routes-{id}");
    let bus_arn = events.create_event_bus().name(&bus).send().await.unwrap_or_else(|e| panic!("{e:?}")).event_bus_arn;
    let bus_arn = bus_arn.unwrap_or_else(|| format!("arn:aws:events:us-east-1:{ACCOUNT}:event-bus/{bus}"));
    events
        .put_rule()
        .name(format!("to-queue-{id}"))
        .event_bus_name(&bus)
        .event_pattern(r#"{"source": ["acme.billing"]}"#)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let target = aws_sdk_eventbridge::types::Target::builder().id("q").arn(&eb_arn).build().unwrap();
    events
        .put_targets()
        .rule(format!("to-queue-{id}"))
        .event_bus_name(&bus)
        .targets(target)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let (topic, inbox) = stack.notify_topic().await;

    let routes = serde_json::json!({
        "destinations": {
            "queue": {"arn": std_arn}, "fifo": {"arn": fifo_arn},
            "bus": {"arn": bus_arn, "source": "acme.billing"}, "topic": {"arn": topic},
        },
        "routes": [{"provider": "stripe", "type": "product.*", "to": ["queue", "fifo", "bus", "topic"]}],
    })
    .to_string();
    let wiring = routed_wiring(&stack, &stack.aws, Some(&routes), &[]);
    let processor = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));

    // An event no projection handles: PROCESSED `ignored`, and delivered.
    let body = br#"{"id":"evt_route_1","object":"event","type":"product.created","data":{"object":{"id":"prod_1"}}}"#;
    let key = stack.claim("stripe", "stripe-a", "evt_route_1", Some("product.created"), body).await;
    let report = processor.process(&key, now_s() * 1000).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.outcome, hookledger::processor::Outcome::Ignored);

    let expect_key = |name: &str| idempotency_key(key.as_str(), &delivery_action(name));
    let check = |envelope: &serde_json::Value, name: &str| {
        assert_eq!(envelope["idempotency_key"], expect_key(name).as_str(), "{name}");
        assert_eq!(envelope["event"], serde_json::from_slice::<serde_json::Value>(body).unwrap(), "{name}");
        assert_eq!(
            (envelope["provider"].as_str(), envelope["event_type"].as_str(), envelope["tenant"].as_str()),
            (Some("stripe"), Some("product.created"), Some("t1")),
            "{name}"
        );
    };
    for (url, name, group) in [(&std_url, "queue", "t1"), (&fifo_url, "fifo", "t1")] {
        let got = received(&stack, url).await;
        assert_eq!(got.len(), 1, "{name}: {got:?}");
        let (text, attr, g) = &got[0];
        check(&serde_json::from_str(text).unwrap(), name);
        assert_eq!(attr.as_deref(), Some(expect_key(name).as_str()), "{name}: the key as an attribute");
        assert_eq!(g.as_deref(), Some(group), "{name}: its group");
    }
    let got = received(&stack, &eb_url).await;
    assert_eq!(got.len(), 1, "eventbridge: {got:?}");
    let event: serde_json::Value = serde_json::from_str(&got[0].0).unwrap();
    assert_eq!(
        (event["source"].as_str(), event["detail-type"].as_str()),
        (Some("acme.billing"), Some("product.created"))
    );
    check(&event["detail"], "bus");
    let got = received(&stack, &inbox).await;
    assert_eq!(got.len(), 1, "sns: {got:?}");
    let note: serde_json::Value = serde_json::from_str(&got[0].0).unwrap();
    check(&serde_json::from_str(note["Message"].as_str().unwrap()).unwrap(), "topic");

    // The record is final: processing it again sends nothing more.
    let again = processor.process(&key, now_s() * 1000).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.outcome, hookledger::processor::Outcome::AlreadyFinal);
    for url in [&std_url, &fifo_url, &eb_url, &inbox] {
        assert!(received(&stack, url).await.is_empty(), "{url}: nothing more");
    }
}

/// A destination that fails for a day leaves its delivery DEAD; the
/// operator sees it (`hookledger deliveries`), replays it once the
/// destination is back (same key), and the sweep delivers it.
#[tokio::test]
async fn a_dead_delivery_is_listed_replayed_by_the_operator_and_then_delivered() {
    let stack = Stack::new().await;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let name = format!("routes-late-{id}");
    let arn = format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{name}");
    let routes = serde_json::json!({"destinations": {"late": {"arn": arn}}, "routes": [{"to": ["late"]}]}).to_string();
    let wiring = routed_wiring(&stack, &stack.aws, Some(&routes), &[("HOOKLEDGER_INDEX_SHARDS", "16")]);
    let processor = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
    let body = br#"{"id":"evt_late","object":"event","type":"product.created","data":{"object":{"id":"prod_2"}}}"#;
    let key = stack.claim("stripe", "stripe-a", "evt_late", Some("product.created"), body).await;
    let now = now_s() * 1000;
    processor.process(&key, now).await.unwrap_or_else(|e| panic!("{e}"));
    // The queue does not exist: the send fails, and keeps failing for a day.
    let dispatcher = wiring.dispatcher().unwrap_or_else(|e| panic!("{e}"));
    let outbox_id = hookledger::message::outbox_id(key.as_str(), &delivery_action("late"));
    let a_day = now + 24 * 3_600_000 + 60_000;
    let dead = dispatcher.dispatch(&outbox_id, a_day).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(dead, hookledger::outbox::Dispatched::Dead { .. }), "{dead:?}");

    let (ok, listed) =
        stack.cli(&["--routes", &routes, "deliveries", "--destination", "late", "--status", "dead"]).await;
    ok.unwrap_or_else(|e| panic!("{e}"));
    assert!(listed.contains("DEAD") && listed.contains(&expect_key(&key)), "{listed}");
    // The console shows the delivery on the event's page.
    let console = hookledger_cli::console::Console::new(
        stack.ledger(),
        hookledger::adapters::sqs::SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
        hookledger::adapters::cloudwatch::CloudWatchMetrics::new(
            aws_sdk_cloudwatch::Client::new(&stack.aws),
            "it-routes",
        ),
        vec![("stripe-a".to_owned(), "stripe".to_owned())],
        hookledger::audit::Caller::named("ana"),
    )
    .with_deliveries(
        wiring.deliveries().unwrap_or_else(|e| panic!("{e}")),
        vec![("late".to_owned(), hookledger::routes::Limits::default())],
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(console.serve(listener));
    let page = reqwest::get(format!("{base}/record?key={}", key.as_str().replace('#', "%23")))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .text()
        .await
        .unwrap_or_default();
    let deliveries = page.split("<h2>Deliveries</h2>").nth(1).unwrap_or_else(|| panic!("no deliveries on the page"));
    assert!(
        deliveries.contains("late") && deliveries.contains("DEAD") && deliveries.contains(&expect_key(&key)),
        "{deliveries}"
    );
    // The destination's health: the CLI and the console's page, and the
    // console's replay counted first (nothing replayed until confirmed).
    let (ok, health) = stack.cli(&["--routes", &routes, "deliveries", "--destination", "late"]).await;
    ok.unwrap_or_else(|e| panic!("{e}"));
    assert!(health.contains("dead          1") && health.contains("pending       0"), "{health}");
    assert!(health.contains("circuit       closed (2 failures") && health.contains("rate limit    none"), "{health}");
    // The reconciler's delivery-health task (its own schedule) reads the same.
    let app = reconciler::handler::from_wiring(&wiring, hookledger::projection::recheck::Rechecks::new())
        .unwrap_or_else(|e| panic!("{e}"));
    let event = lambda_runtime::LambdaEvent::new(
        serde_json::json!({"task": "delivery-health"}),
        lambda_runtime::Context::default(),
    );
    match reconciler::handler::handle(&app, event).await.unwrap_or_else(|e| panic!("{e}")) {
        reconciler::handler::Output::Health { health } => {
            assert_eq!(health.len(), 1);
            assert_eq!((health[0].destination.as_str(), health[0].dead, health[0].pending), ("late", 1, 0));
        }
        other => panic!("not the health task: {other:?}"),
    }
    let page = reqwest::get(format!("{base}/destinations")).await.unwrap().text().await.unwrap();
    let row = page.split("<td>late</td>").nth(1).unwrap_or_else(|| panic!("no row for late: {page}"));
    assert!(row.contains("id=\"count-late\""), "{row}");
    let at = page.find("name=csrf value=\"").unwrap() + "name=csrf value=\"".len();
    let token = &page[at..at + page[at..].find('"').unwrap()];
    let form = [("destination", "late"), ("reason", "queue created"), ("csrf", token)];
    let counted = reqwest::Client::new()
        .post(format!("{base}/destinations/replay"))
        .header("origin", &base)
        .form(&form)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(counted.contains("replay 1 DEAD deliveries to late"), "{counted}");
    let (ok, of_event) = stack.cli(&["--routes", &routes, "deliveries", "--event", key.as_str(), "--json"]).await;
    ok.unwrap_or_else(|e| panic!("{e}"));
    let rows: serde_json::Value = serde_json::from_str(&of_event).unwrap();
    assert_eq!(rows[0]["status"], "DEAD");

    // Back: the operator replays it, and the sweep sends it with its key.
    let (url, _) = queue(&stack, &name).await;
    let (ok, replayed) = stack
        .cli(&[
            "--routes",
            &routes,
            "deliveries",
            "replay",
            "--destination",
            "late",
            "--status",
            "dead",
            "--reason",
            "queue created",
        ])
        .await;
    ok.unwrap_or_else(|e| panic!("{e}"));
    assert!(replayed.contains("1 replayed"), "{replayed}");
    let sent = dispatcher.sweep(16, now_s() * 1000 + 2_000, 0, 100).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sent, 1);
    let got = received(&stack, &url).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1.as_deref(), Some(expect_key(&key).as_str()), "the same key");
    let (_, again) =
        stack.cli(&["--routes", &routes, "deliveries", "replay", "--event", key.as_str(), "--reason", "twice"]).await;
    assert!(again.contains("0 replayed, 1 not DEAD"), "{again}");
}

fn expect_key(key: &hookledger::identity::EventKey) -> String {
    idempotency_key(key.as_str(), &delivery_action("late"))
}

/// The Python consumer (`examples/consumers/python/`: Powertools'
/// idempotency on the envelope's key) over what a route delivered: three
/// events, one of them delivered twice, each batch handed to it twice: each
/// event applied once.
#[tokio::test]
async fn the_python_consumer_applies_each_delivered_event_once() {
    let stack = Stack::new().await;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (url, arn) = queue(&stack, &format!("routes-py-{id}")).await;
    let routes = serde_json::json!({"destinations": {"q": {"arn": arn}}, "routes": [{"to": ["q"]}]}).to_string();
    let wiring = routed_wiring(&stack, &stack.aws, Some(&routes), &[]);
    let processor = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
    let mut keys = Vec::new();
    for n in 1..=3 {
        let body = format!(
            r#"{{"id":"evt_py_{n}","object":"event","type":"product.created","data":{{"object":{{"id":"prod_{n}"}}}}}}"#
        );
        let key =
            stack.claim("stripe", "stripe-a", &format!("evt_py_{n}"), Some("product.created"), body.as_bytes()).await;
        processor.process(&key, now_s() * 1000).await.unwrap_or_else(|e| panic!("{e}"));
        keys.push(key);
    }
    // Each delivery was sent once; one message then arrives twice (an SQS
    // redelivery, or a retry after a lost acknowledgement: the same key).
    let item = wiring
        .deliveries()
        .unwrap_or_else(|e| panic!("{e}"))
        .of_event(&keys[0], &["q"])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(item[0].status, "SENT");
    let first = received(&stack, &url).await;
    assert_eq!(first.len(), 3);
    let mut bodies: Vec<String> = first.iter().map(|(body, _, _)| body.clone()).collect();
    bodies.push(first[0].0.clone());
    let applied = python_consumer(&bodies);
    assert_eq!(applied.len(), 3, "{applied:?}");
    for n in 1..=3 {
        assert_eq!(applied.get(&format!("stripe#evt_py_{n}")), Some(&1), "{applied:?}");
    }
}

/// Runs the Python consumer (`examples/consumers/python/run_against.py`)
/// over these SQS message bodies, each batch twice; what it applied, by
/// `provider#event_id`, and how many times.
pub fn python_consumer(bodies: &[String]) -> std::collections::BTreeMap<String, u64> {
    let messages: Vec<serde_json::Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| serde_json::json!({"messageId": format!("m{i}"), "body": body}))
        .collect();
    let file = std::env::temp_dir().join(format!("hookledger-consumer-{}.json", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, serde_json::to_vec(&messages).unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");
    let out = std::process::Command::new(&python)
        .arg(root.join("examples/consumers/python/run_against.py"))
        .arg(&file)
        .current_dir(root.join("examples/consumers/python"))
        .output()
        .unwrap_or_else(|e| panic!("{} (scripts/bootstrap installs it): {e}", python.display()));
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "the consumer failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    report["applied"].as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect()
}

/// Write units per delivery, by the capacity model (DynamoDB's billing of
/// each request's items): a 4 KiB seats snapshot processed with two routed
/// destinations against the same event without routes. A delivery refers
/// to its event, so its cost does not grow with the event: 5 write units
/// (its item in the transaction 2, its entry in the `due` index 1, its mark
/// 1, the entry's removal 1), the bound the issue sets.
#[tokio::test]
async fn a_delivery_costs_at_most_five_write_units_whatever_the_event_size() {
    use hookledger_it::capacity::Capacity;
    let stack = Stack::new().await;
    let capacity = Capacity::new(stack.ddb.clone(), &stack.table, &hookledger::adapters::dynamodb::table_definition());
    let measured =
        aws_config::from_env().http_client(capacity.client(hookledger_it::faults::emulator_http_client())).load().await;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (_, a) = queue(&stack, &format!("routes-wcu-a-{id}")).await;
    let (_, b) = queue(&stack, &format!("routes-wcu-b-{id}")).await;
    let routes = serde_json::json!({"destinations": {"a": {"arn": a}, "b": {"arn": b}},
        "routes": [{"type": "seats.*", "to": ["a", "b"]}]})
    .to_string();
    let mut per_run = Vec::new();
    for (n, routed) in [(0, false), (1, true)] {
        let wiring = routed_wiring(&stack, &measured, routed.then_some(routes.as_str()), &[]);
        let processor = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
        let body = crate::bench::seats_4k(&format!("acct_wcu_{id}_{n}"), 1);
        assert!(body.len() >= 4096);
        let key = stack
            .claim("standard_webhooks", "svix", &format!("seats-wcu-{id}-{n}"), Some("seats.snapshot"), &body)
            .await;
        capacity.scope(&format!("run{n}"));
        let report = processor.process(&key, now_s() * 1000).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(report.outcome, hookledger::processor::Outcome::Applied);
        per_run.push(capacity.tallies()[&format!("run{n}")].wcu());
    }
    let per_delivery = (per_run[1] - per_run[0]) / 2.0;
    println!(
        "write units: {} without routes, {} with two deliveries: {per_delivery} per delivery",
        per_run[0], per_run[1]
    );
    assert!(per_delivery > 0.0 && per_delivery <= 5.0, "{per_delivery} write units per delivery");
}

/// An HTTPS destination as deployed (`Wiring::processor`, its secret an
/// SSM parameter): the event is POSTed once, signed as Standard Webhooks
/// (`webhook-id` = the delivery's key) with both secrets of a rotation; the
/// official `standardwebhooks` libraries (Python and npm) verify it with
/// either secret alone and refuse it with another or tampered. A 422 answer
/// is DEAD at once with its status; a 410 (by default, for an hour) and a
/// 503 are retried.
#[tokio::test]
async fn an_https_delivery_is_signed_as_standard_webhooks_and_verified_by_the_official_libraries() {
    use crate::webhook_sink::{SECRET, Sink};
    let stack = Stack::new().await;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (sink, url) = Sink::start().await;
    let ssm = aws_sdk_ssm::Client::new(&stack.aws);
    let (old, new) = (format!("/hl-it/{id}/old"), format!("/hl-it/{id}/new"));
    let rotated = "whsec_dGhlIG5ldyBzZWNyZXQgb2YgYSByb3RhdGlvbg==";
    for (name, value) in [(&old, SECRET), (&new, rotated)] {
        let put = ssm.put_parameter().name(name).value(value).r#type(aws_sdk_ssm::types::ParameterType::SecureString);
        put.send().await.unwrap_or_else(|e| panic!("{e:?}"));
    }
    let routes = serde_json::json!({
        "destinations": {"hooks": {"url": url, "secrets": [format!("ssm:{old}"), format!("ssm:{new}")], "allow_private": true}},
        "routes": [{"to": ["hooks"]}],
    })
    .to_string();
    let wiring = routed_wiring(&stack, &stack.aws, Some(&routes), &[]);
    let processor = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
    let body = br#"{"id":"evt_https_1","object":"event","type":"product.created","data":{"object":{"id":"prod_h"}}}"#;
    let key = stack.claim("stripe", "stripe-a", "evt_https_1", Some("product.created"), body).await;
    processor.process(&key, now_s() * 1000).await.unwrap_or_else(|e| panic!("{e}"));
    let got = sink.received();
    assert_eq!(got.len(), 1, "{got:?}");
    let r = &got[0];
    let want = idempotency_key(key.as_str(), &delivery_action("hooks"));
    assert_eq!(r.headers.get("webhook-id"), Some(&want));
    assert_eq!(r.headers.get("content-type").map(String::as_str), Some("application/json"));
    assert_eq!(r.headers["webhook-signature"].split(' ').count(), 2, "one signature per secret");
    let envelope: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(envelope["event"], serde_json::from_slice::<serde_json::Value>(body).unwrap());
    assert_eq!(envelope["idempotency_key"], want.as_str());
    assert_eq!(sink.unverified(), 0);

    // The official libraries: each secret verifies alone; another secret or a changed byte is refused.
    let tampered = String::from_utf8_lossy(&r.body).replace("prod_h", "prod_x");
    for (secret, payload, ok) in [
        (SECRET, String::from_utf8_lossy(&r.body).into_owned(), true),
        (rotated, String::from_utf8_lossy(&r.body).into_owned(), true),
        ("whsec_b3RoZXIgc2VjcmV0IGVudGlyZWx5", String::from_utf8_lossy(&r.body).into_owned(), false),
        (SECRET, tampered, false),
    ] {
        let case = serde_json::json!({"secret": secret, "payload": payload, "headers": r.headers}).to_string();
        assert_eq!(official_verify("python", &case), ok, "python, {secret}");
        assert_eq!(official_verify("node", &case), ok, "node, {secret}");
    }

    // Answers: a 422 is DEAD at once with its status; a 410 and a 503 are retried.
    sink.status.store(422, std::sync::atomic::Ordering::SeqCst);
    let body = br#"{"id":"evt_https_2","object":"event","type":"product.created","data":{"object":{"id":"prod_g"}}}"#;
    let gone = stack.claim("stripe", "stripe-a", "evt_https_2", Some("product.created"), body).await;
    processor.process(&gone, now_s() * 1000).await.unwrap_or_else(|e| panic!("{e}"));
    let deliveries = wiring.deliveries().unwrap_or_else(|e| panic!("{e}"));
    let state = &deliveries.of_event(&gone, &["hooks"]).await.unwrap_or_else(|e| panic!("{e}"))[0];
    assert_eq!(state.status, "DEAD");
    assert!(state.last_error.as_deref().unwrap_or_default().contains("answered 422"), "{state:?}");
    sink.status.store(410, std::sync::atomic::Ordering::SeqCst);
    let body = br#"{"id":"evt_https_4","object":"event","type":"product.created","data":{"object":{"id":"prod_j"}}}"#;
    let moved = stack.claim("stripe", "stripe-a", "evt_https_4", Some("product.created"), body).await;
    processor.process(&moved, now_s() * 1000).await.unwrap_or_else(|e| panic!("{e}"));
    let state = &deliveries.of_event(&moved, &["hooks"]).await.unwrap_or_else(|e| panic!("{e}"))[0];
    assert_eq!((state.status.as_str(), state.attempts), ("PENDING", 1), "a brief 410 is retried: {state:?}");
    assert!(state.last_error.as_deref().unwrap_or_default().contains("answered 410"), "{state:?}");
    sink.status.store(503, std::sync::atomic::Ordering::SeqCst);
    let body = br#"{"id":"evt_https_3","object":"event","type":"product.created","data":{"object":{"id":"prod_i"}}}"#;
    let busy = stack.claim("stripe", "stripe-a", "evt_https_3", Some("product.created"), body).await;
    processor.process(&busy, now_s() * 1000).await.unwrap_or_else(|e| panic!("{e}"));
    let state = &deliveries.of_event(&busy, &["hooks"]).await.unwrap_or_else(|e| panic!("{e}"))[0];
    assert_eq!((state.status.as_str(), state.attempts), ("PENDING", 1), "{state:?}");
}

/// Verifies one delivery (`{"secret", "payload", "headers"}`) with the
/// official Standard Webhooks library of `runtime`: `python` (the
/// `standardwebhooks` package in the project's virtualenv) or `node` (the
/// npm package in the TypeScript consumer's dependencies).
fn official_verify(runtime: &str, case: &str) -> bool {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (program, script, dir) = match runtime {
        "python" => (
            root.join(".venv/bin/python"),
            "import json,sys\nfrom standardwebhooks.webhooks import Webhook\nc=json.loads(sys.stdin.read())\n\
             try:\n    Webhook(c['secret']).verify(c['payload'], c['headers'])\nexcept Exception as e:\n    print(e)\n    sys.exit(3)\n",
            root.clone(),
        ),
        _ => (
            std::path::PathBuf::from("node"),
            "const {Webhook}=require('standardwebhooks');let s='';process.stdin.on('data',d=>s+=d).on('end',()=>{\
             const c=JSON.parse(s);try{new Webhook(c.secret).verify(c.payload,c.headers)}catch(e){console.log(String(e));process.exit(3)}})",
            root.join("examples/consumers/typescript"),
        ),
    };
    let flag = if runtime == "python" { "-c" } else { "-e" };
    let mut child = std::process::Command::new(&program)
        .args([flag, script])
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} (scripts/bootstrap installs it): {e}", program.display()));
    use std::io::Write;
    child.stdin.take().unwrap().write_all(case.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    match out.status.code() {
        Some(0) => true,
        Some(3) => false,
        _ => panic!("{runtime} could not verify: {}", String::from_utf8_lossy(&out.stderr)),
    }
}
