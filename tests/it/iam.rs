//! `infra/iam-actions.json`: the AWS operations each function makes, with
//! the kinds of resource they touch, recorded from the explored flows, the
//! scheduled backfills and the secret references each function resolves.
//! `infra/check_template.py` turns them into IAM actions and checks each
//! function's policy both ways (nothing missing, nothing unused).
//!
//! Every exploration run (faults included) and the backfill tests also
//! check that what they saw is listed ([`hookledger_it::iam::assert_listed`]).

use hookledger_it::iam::{self, Actions};
use serde_json::json;

use crate::explore::{FLOWS, run_flow};

/// A JSON-protocol request to the emulator (to arrange what the SDK
/// clients of this crate's dependencies do not cover: SSM and Secrets
/// Manager items).
pub(crate) async fn emulator(service: &str, target: &str, body: serde_json::Value) {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| panic!("AWS_ENDPOINT_URL"));
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0"
    );
    let answer = reqwest::Client::new()
        .post(endpoint)
        .header("x-amz-target", target)
        .header("content-type", "application/x-amz-json-1.1")
        .header("authorization", auth)
        .body(body.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{target}: {e}"));
    let status = answer.status();
    let text = answer.text().await.unwrap_or_default();
    assert!(status.is_success(), "{target}: {status} {text}");
}

/// Each function resolves a secret reference of each kind it may be given
/// (an SSM parameter, a Secrets Manager secret through SSM's reference path)
/// the way the composition root does.
async fn secret_references() -> Actions {
    let w = crate::explore::World::new(5).await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (param, secret) = (format!("/hookledger/it-{id}/key"), format!("hookledger/it-{id}/token"));
    emulator("ssm", "AmazonSSM.PutParameter", json!({"Name": param, "Value": "p", "Type": "SecureString"})).await;
    emulator("secretsmanager", "secretsmanager.CreateSecret", json!({"Name": secret, "SecretString": "s"})).await;
    let settings = hookledger::wiring::Settings::from_lookup(|_| None).unwrap_or_else(|e| panic!("{e}"));
    let wiring = hookledger::wiring::Wiring::new(w.cfg.clone(), settings);
    w.plan.reset_counts();
    for function in ["intake", "processor", "reconciler"] {
        w.plan.scope(function);
        let plain = wiring.secret(&format!("ssm:{param}")).await.unwrap_or_else(|e| panic!("{function}: {e}"));
        assert_eq!(plain.expose(), b"p");
        let managed = wiring.secret(&format!("ssm:/aws/reference/secretsmanager/{secret}")).await;
        assert_eq!(managed.unwrap_or_else(|e| panic!("{function}: {e}")).expose(), b"s");
    }
    let mut out = Actions::new();
    iam::observe(&w.plan.trace(), &mut out);
    out
}

/// The intake's handshake with a provider that hands its secret over
/// (Asana), through the store the composition root builds from
/// `HOOKLEDGER_HANDSHAKE_PATH`: the window read, the secret stored, and read
/// back by a container that does not hold it.
async fn handshake_secrets() -> Actions {
    use hookledger::verify::provider::{Delivery, HandshakeInput};
    let w = crate::explore::World::new(7).await;
    let path = format!("/hookledger/it-{}/handshake", uuid::Uuid::new_v4().simple());
    let settings =
        hookledger::wiring::Settings::from_lookup(|k| (k == "HOOKLEDGER_HANDSHAKE_PATH").then(|| path.clone()))
            .unwrap_or_else(|e| panic!("{e}"));
    let wiring = hookledger::wiring::Wiring::new(w.cfg.clone(), settings);
    let store = wiring.secret_store().unwrap_or_else(|| panic!("a store"));
    let now = crate::support::now_s();
    // The operator's `providers arm` (not a function's call: not recorded).
    store.open_window("asana-it", now + 600).await.unwrap_or_else(|e| panic!("{e}"));
    let asana = hookledger::config::ProviderKind::named("asana").unwrap_or_else(|| panic!("asana"));
    let spec: hookledger::config::EndpointSpec =
        serde_json::from_str(r#"{"provider": "asana"}"#).unwrap_or_else(|e| panic!("{e}"));
    let build = || {
        let certificates = std::sync::Arc::new(hookledger::verify::sns::CertificateCache::new(std::sync::Arc::new(
            hookledger::adapters::https::ReqwestGetter::new(hookledger::adapters::timeouts::Timeouts::INTAKE),
        )));
        let cx = hookledger::verify::provider::BuildContext {
            certificates,
            verify_token: None,
            learned: Some((store.clone(), "asana-it".to_owned())),
        };
        asana.verifier(&spec, Vec::new(), &cx).unwrap_or_else(|e| panic!("{e}"))
    };
    let input = HandshakeInput { spec: &spec, secret: None, verify_token: None, nonce: "itsecret01", now_s: now };
    let handshakes = asana.handshakes(input).unwrap_or_else(|e| panic!("{e}"));
    w.plan.reset_counts();
    w.plan.scope("intake");
    for (verifier, h) in [(build(), &handshakes[0]), (build(), &handshakes[1])] {
        let mut headers = http::HeaderMap::new();
        for (k, v) in &h.headers {
            headers.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
                http::HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}")),
            );
        }
        let d = Delivery { body: &h.body, headers: &headers, method: &h.method, query: &h.query };
        verifier.verify(d, now).await.unwrap_or_else(|e| panic!("{}: {e}", h.name));
    }
    let mut out = Actions::new();
    iam::observe(&w.plan.trace(), &mut out);
    assert!(out["intake"].contains_key("ssm:PutParameter"), "{out:?}");
    out
}

/// Routes (issue 26): the processor as deployed sends a commit's
/// deliveries to an SQS queue, an EventBridge bus and an SNS topic (named
/// `dest-…`); the reconciler's outbox sweep sends those a processor left
/// (it died after its commit), reading the event from the ledger.
async fn routed_deliveries() -> Actions {
    let w = crate::explore::World::new(8).await;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let queue = w.stack.sqs.create_queue().queue_name(format!("dest-{id}")).send().await;
    let queue_url = queue.unwrap_or_else(|e| panic!("{e:?}")).queue_url.unwrap_or_default();
    let queue_arn = format!("arn:aws:sqs:us-east-1:123456789012:dest-{id}");
    let events = aws_sdk_eventbridge::Client::new(&w.stack.aws);
    events.create_event_bus().name(format!("dest-{id}")).send().await.unwrap_or_else(|e| panic!("{e:?}"));
    let bus_arn = format!("arn:aws:events:us-east-1:123456789012:event-bus/dest-{id}");
    let sns = aws_sdk_sns::Client::new(&w.stack.aws);
    let topic = sns.create_topic().name(format!("dest-{id}")).send().await.unwrap_or_else(|e| panic!("{e:?}"));
    let topic_arn = topic.topic_arn.unwrap_or_default();
    let routes = json!({
        "destinations": {"queue": {"arn": queue_arn}, "bus": {"arn": bus_arn}, "topic": {"arn": topic_arn}},
        "routes": [{"to": ["queue", "bus", "topic"]}],
    })
    .to_string();
    let bucket = format!("dest-{id}");
    hookledger::adapters::s3::create_bucket(&aws_sdk_s3::Client::new(&w.stack.aws), &bucket)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (table, work) = (w.stack.table.clone(), w.stack.queue_url.clone());
    let settings = hookledger::wiring::Settings::from_lookup(move |k| match k {
        "HOOKLEDGER_TABLE" => Some(table.clone()),
        "HOOKLEDGER_QUEUE_URL" => Some(work.clone()),
        "HOOKLEDGER_ROUTES" => Some(routes.clone()),
        "HOOKLEDGER_PAYLOAD_BUCKET" => Some(bucket.clone()),
        _ => None,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let wiring = hookledger::wiring::Wiring::new(w.cfg.clone(), settings);
    let body = br#"{"id":"evt_routed","object":"event","type":"product.created","data":{"object":{"id":"prod_1"}}}"#;
    let sent = w.stack.claim("stripe", "stripe-a", "evt_routed", Some("product.created"), body).await;
    // Too large for a destination: delivered as a reference to the payload bucket.
    let large = format!(
        r#"{{"id":"evt_big","object":"event","type":"product.created","pad":"{}"}}"#,
        "x".repeat(hookledger::message::MAX_MESSAGE_BYTES)
    );
    let big = w.stack.claim("stripe", "stripe-a", "evt_big", Some("product.created"), large.as_bytes()).await;
    let left = w.stack.claim("stripe", "stripe-a", "evt_left", Some("product.created"), body).await;
    let now_ms = crate::support::now_s() * 1000;
    w.plan.reset_counts();
    w.plan.scope("processor");
    let processor = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
    processor.process(&sent, now_ms).await.unwrap_or_else(|e| panic!("{e}"));
    processor.process(&big, now_ms).await.unwrap_or_else(|e| panic!("{e}"));
    let mut dying = wiring.processor(crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
    dying.fault = hookledger::processor::ProcessorFault::AfterCommit;
    assert!(dying.process(&left, now_ms).await.is_err(), "it dies after its commit");
    w.plan.scope("reconciler");
    let dispatcher = wiring.dispatcher().unwrap_or_else(|e| panic!("{e}"));
    let later = now_ms + hookledger::message::DISPATCH_LEASE_MS + 1;
    let swept = dispatcher.sweep(hookledger::policy::DEFAULT_INDEX_SHARDS, later, 0, 100).await;
    assert_eq!(swept.unwrap_or_else(|e| panic!("{e}")), 3, "the sweep sends what the processor left");
    let drained = w.stack.drain(&queue_url).await;
    assert_eq!(drained.len(), 3, "one message per event on the queue");
    assert_eq!(drained.iter().filter(|m| m.contains("payload_ref")).count(), 1, "the large one by reference");
    let mut out = Actions::new();
    iam::observe(&w.plan.trace(), &mut out);
    for function in ["processor", "reconciler"] {
        for op in ["sqs:SendMessage", "events:PutEvents", "sns:Publish"] {
            assert!(out[function].get(op).is_some_and(|k| k.contains("destination")), "{function} {op}: {out:?}");
        }
    }
    out
}

/// The processor's Lambda handler as deployed (`handler::from_wiring`) on
/// a record another worker holds: the batch layer hides its message for
/// the rest of the lease (`ChangeMessageVisibility`), which the explored
/// flows (they call the use case, as the event source mapping would call
/// the handler) do not reach.
async fn processor_handler() -> Actions {
    use hookledger::ports::WorkLedger as _;
    use lambda_runtime::{Context, LambdaEvent};

    use crate::sqs_handler::{send_and_receive, sqs_event, work};
    let w = crate::explore::World::new(6).await;
    let body = crate::processor::pi_succeeded("evt_iam", "pi_iam", Some("cus_iam"), 10);
    let busy = w.stack.claim("stripe", "stripe-a", "evt_iam", None, &body).await;
    let now_ms = crate::support::now_s() * 1000;
    w.stack.ledger().lease(&busy, "other-worker", now_ms, 120_000).await.unwrap_or_else(|e| panic!("{e}"));
    let (table, queue, topic) = (w.stack.table.clone(), w.stack.queue_url.clone(), w.topic());
    let settings = hookledger::wiring::Settings::from_lookup(move |k| match k {
        "HOOKLEDGER_TABLE" => Some(table.clone()),
        "HOOKLEDGER_QUEUE_URL" => Some(queue.clone()),
        "HOOKLEDGER_NOTIFY_TOPIC_ARN" => Some(topic.clone()),
        _ => None,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let wiring = hookledger::wiring::Wiring::new(w.cfg.clone(), settings);
    let app =
        processor::handler::from_wiring(&wiring, crate::support::reference(&wiring)).unwrap_or_else(|e| panic!("{e}"));
    let received = send_and_receive(&w.stack, &[work(&busy)]).await;
    w.plan.reset_counts();
    w.plan.scope("processor");
    let event = LambdaEvent::new(sqs_event(&received), Context::default());
    let answer = processor::handler::handle(std::sync::Arc::new(app), event).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.batch_item_failures.len(), 1, "the busy record stays");
    let mut out = Actions::new();
    iam::observe(&w.plan.trace(), &mut out);
    assert!(out["processor"].contains_key("sqs:ChangeMessageVisibility"), "{out:?}");
    out
}

/// `n` hex digits that do not compress (a payload stored compressed stays
/// over the inline limit).
fn noise(n: usize) -> String {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x % 16) as u32, 16).unwrap_or('0')
        })
        .collect()
}

/// Two deliveries of one event over 2 KiB at once: DynamoDB cancels the
/// later claim's transaction (`TransactionConflict`), and the intake reads
/// the record the other one wrote (`GetItem`) to answer the duplicate 200,
/// never a 503.
async fn claim_conflict() -> Actions {
    use hookledger_it::faults::{Fault, Rule};
    let mut w = crate::explore::World::new(9).await;
    let body = format!(
        r#"{{"id":"evt_conflict","object":"event","type":"payment_intent.succeeded","created":1700000000,"data":{{"object":{{"id":"pi_conflict","object":"payment_intent","amount":10,"customer":"cus_x","metadata":{{"pad":"{}"}}}}}}}}"#,
        noise(8 * 1024)
    );
    let delivery = || crate::explore::Delivery {
        endpoint: "stripe-a",
        event_id: "evt_conflict".into(),
        body: body.clone().into_bytes(),
    };
    assert_eq!(w.deliver(delivery(), 0).await, Some(202), "the first delivery claims it");
    w.plan.reset_counts();
    w.plan.arm(Rule::new(Fault::TransactionConflict).on("dynamodb", "TransactWriteItems"));
    assert_eq!(w.deliver(delivery(), 0).await, Some(200), "the racing one is a duplicate, not a 503");
    w.plan.disarm();
    let mut out = Actions::new();
    iam::observe(&w.plan.trace(), &mut out);
    assert!(out["intake"].contains_key("dynamodb:GetItem"), "{out:?}");
    out
}

/// Everything the recorded runs saw.
async fn recorded() -> Actions {
    let mut all = Actions::new();
    let mut merge = |more: Actions| {
        for (function, ops) in more {
            for (op, kinds) in ops {
                all.entry(function.clone()).or_default().entry(op).or_default().extend(kinds);
            }
        }
    };
    for flow in FLOWS {
        // Boxed: each flow's future on the heap, not on the test thread's stack.
        let (_, w) = Box::pin(run_flow(flow, None, false)).await;
        merge(w.iam);
    }
    for w in [crate::backfill::large_github_backfill().await, crate::backfill::scheduled_stripe_backfill().await] {
        let mut seen = Actions::new();
        iam::observe(&w.plan.trace(), &mut seen);
        merge(seen);
    }
    merge(secret_references().await);
    merge(handshake_secrets().await);
    merge(routed_deliveries().await);
    merge(processor_handler().await);
    merge(claim_conflict().await);
    all
}

/// The committed file is exactly what the recorded runs see: an operation
/// the code starts making fails here (and its policy is then checked by
/// `scripts/check-template`); one it stops making fails too, so a grant
/// nothing uses shows up. To accept a change: `HOOKLEDGER_BLESS=1 cargo test
/// -p hookledger-it --test it iam::iam_actions_are_the_ones_the_code_makes`
/// (emulator running), then review the file's diff.
#[tokio::test]
async fn iam_actions_are_the_ones_the_code_makes() {
    let got = recorded().await;
    if std::env::var("HOOKLEDGER_BLESS").is_ok_and(|v| v == "1") {
        let text = serde_json::to_string_pretty(&got).unwrap_or_default();
        std::fs::write(iam::path(), text + "\n").unwrap_or_else(|e| panic!("{}: {e}", iam::path().display()));
        return;
    }
    let want = iam::committed();
    let missing = iam::missing(&got, want);
    let unused = iam::missing(want, &got);
    assert!(
        missing.is_empty() && unused.is_empty(),
        "infra/iam-actions.json is not what the code does (bless with HOOKLEDGER_BLESS=1 if intended)\n\
         made but not listed:\n{}\nlisted but not made:\n{}",
        missing.join("\n"),
        unused.join("\n")
    );
}
