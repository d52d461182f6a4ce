//! The operator's figures cost the same at any volume: `stats` and
//! `failures` over 20 failed records beside 100 processed ones, then beside
//! 10,000, make the same AWS requests and read the same order of bytes
//! (the request recorder), and the metrics part reads what the functions'
//! EMF lines say (forwarded to the emulator's CloudWatch as the local stack
//! does).

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use hookledger::adapters::cloudwatch::CloudWatchMetrics;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::identity::EventKey;
use hookledger::insight::Insight;
use hookledger::ledger::{Exit, LeaseResult};
use hookledger::ports::{MetricWindow, WorkLedger};
use hookledger_it::faults::{self, FaultPlan};

use crate::support::{Stack, now_s, s};

fn now_ms() -> i64 {
    now_s() * 1000
}

async fn lease(ledger: &DynamoLedger, key: &EventKey, token: &str) {
    match ledger.lease(key, token, now_ms(), 60_000).await.unwrap() {
        LeaseResult::Leased(_) => {}
        other => panic!("lease {key}: {other:?}"),
    }
}

/// 20 failed records (10 DEAD, 10 PARKED, over 4 event types and 3
/// subjects) and one PROCESSED record, all through the adapter's own writes.
/// Returns the PROCESSED record's item.
async fn failed_and_one_processed(stack: &Stack) -> HashMap<String, AttributeValue> {
    let ledger = stack.ledger();
    for i in 0..20 {
        let ty = ["invoice.paid", "customer.subscription.updated", "charge.refunded", "invoice.payment_failed"][i % 4];
        let key = stack.claim("stripe", "stripe-a", &format!("evt_failed_{i}"), Some(ty), b"{}").await;
        lease(&ledger, &key, "w").await;
        let exit = if i % 2 == 0 {
            Exit::Dead { reason: "attempts_exhausted", message: "business rule refused it" }
        } else {
            Exit::Park { reason: "unmapped_subject", subject: Some(["cus_1", "cus_2", "cus_3"][i % 3]) }
        };
        assert!(ledger.leave(&key, "w", &exit, now_ms()).await.unwrap());
    }
    let done = stack.claim("stripe", "stripe-a", "evt_done", Some("invoice.paid"), b"{}").await;
    lease(&ledger, &done, "w").await;
    ledger.commit(&done, "w", &[], "applied", None, now_ms()).await.unwrap();
    let item = stack.record(&done).await;
    assert_eq!(s(&item, "status"), "PROCESSED");
    item
}

/// Copies of the PROCESSED record under new keys, 25 per request, until
/// the table holds `total` of them.
async fn processed_copies(stack: &Stack, item: &HashMap<String, AttributeValue>, from: usize, total: usize) {
    let requests: Vec<WriteRequest> = (from..total)
        .map(|i| {
            let mut copy = item.clone();
            let key = EventKey::new("stripe", "stripe-a", &format!("evt_copy_{i}"));
            copy.insert("pk".into(), AttributeValue::S(key.as_str().to_owned()));
            copy.insert("event_id".into(), AttributeValue::S(format!("evt_copy_{i}")));
            WriteRequest::builder().put_request(PutRequest::builder().set_item(Some(copy)).build().unwrap()).build()
        })
        .collect();
    stack.put_all(&requests).await;
}

/// A reconciler run late enough to pass every entry written so far (their
/// re-drive grace and the cursor's settle behind it).
async fn pass_the_finished(stack: &Stack) {
    let at = now_ms() + hookledger::policy::REDRIVE_GRACE_MS + hookledger::ledger::CURSOR_SETTLE_MS + 60_000;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let summary = stack.reconciler(hookledger::config::ReconcilerSettings::default(), None).run(at, deadline).await;
    assert!(summary.errors.is_empty() && summary.due_seen == 0, "{summary:?}");
}

/// The functions' EMF, as the intake and the processor print it.
pub(crate) fn emf(function: &str, at_ms: i64, dims: &[(&str, &str)], values: &[(&str, serde_json::Value)]) -> String {
    let mut doc = serde_json::json!({"_aws": {"Timestamp": at_ms, "CloudWatchMetrics": [{
        "Namespace": "NS",
        "Dimensions": [std::iter::once("function").chain(dims.iter().map(|d| d.0)).collect::<Vec<_>>()],
        "Metrics": values.iter().map(|(n, _)| serde_json::json!({"Name": n})).collect::<Vec<_>>(),
    }]}, "function": function});
    for (k, v) in dims {
        doc[*k] = serde_json::json!(v);
    }
    for (k, v) in values {
        doc[*k] = v.clone();
    }
    doc.to_string()
}

type Reading = (BTreeMap<String, u64>, u64);

/// `stats` then `failures` through the request recorder: requests per
/// operation and response bytes.
async fn read_figures(
    stack: &Stack,
    namespace: &str,
) -> (Reading, hookledger::insight::Stats, hookledger::insight::Failures) {
    let plan = FaultPlan::new(7);
    let cfg = faults::sdk_config(&plan).await;
    let ledger = DynamoLedger::new(faults::dynamodb_client(&cfg), &stack.table).with_shards(16);
    let metrics = CloudWatchMetrics::new(aws_sdk_cloudwatch::Client::new(&cfg), namespace);
    let insight = Insight::new(ledger, metrics);
    let now = now_ms();
    let window = MetricWindow { since_ms: now - 3_600_000, until_ms: now + 60_000, period_s: 300 };
    plan.reset_counts();
    let stats = insight.stats(&window, now).await.unwrap();
    let failures = insight.failures(&window, now).await.unwrap();
    let bytes = plan.response_bytes().values().sum();
    ((plan.request_counts(), bytes), stats, failures)
}

#[tokio::test]
async fn stats_and_failures_cost_the_same_beside_100_and_10000_processed_records() {
    let stack = Stack::new().await;
    let namespace = format!("it-{}", uuid::Uuid::new_v4().simple());
    let processed = failed_and_one_processed(&stack).await;
    processed_copies(&stack, &processed, 1, 100).await;

    // What the functions printed, forwarded as the local stack's bridge does.
    let cw = CloudWatchMetrics::new(aws_sdk_cloudwatch::Client::new(&stack.aws), &namespace);
    let at = now_ms() - 60_000;
    // The emulator matches a query's dimensions without its namespace: a
    // function name of this run's keeps reruns on one emulator apart.
    let (intake, processor) = (format!("intake-{namespace}"), format!("processor-{namespace}"));
    let (intake, processor) = (intake.as_str(), processor.as_str());
    let lines = [
        emf(intake, at, &[("provider", "stripe"), ("endpoint", "stripe-a")], &[("received", 21.into())]),
        emf(intake, at, &[("provider", "stripe"), ("endpoint", "stripe-a")], &[("duplicate", 7.into())]),
        emf(processor, at, &[("outcome", "applied"), ("provider", "stripe")], &[("processed", 1.into())]),
        emf(processor, at, &[("provider", "stripe")], &[("processing_duration", serde_json::json!([12.0, 30.0]))]),
        emf(
            processor,
            at,
            &[("provider", "stripe"), ("reason", "attempts_exhausted")],
            &[("dead_lettered", 10.into())],
        ),
    ];
    for line in &lines {
        let line = line.replace("\"NS\"", &format!("\"{namespace}\""));
        assert_eq!(cw.put_emf(&line).await.unwrap(), 1, "{line}");
    }

    // Finished records leave their due entries where they were; the
    // reconciler's run passes them, and the figures read after its places.
    pass_the_finished(&stack).await;
    let (small, stats, failures) = read_figures(&stack, &namespace).await;
    // The figures: metrics for throughput and latency, the sparse sets for now.
    assert_eq!((stats.received, stats.duplicates, stats.dead_lettered), (21, 7, 10));
    assert!((stats.duplicate_rate - 0.25).abs() < 1e-9, "{}", stats.duplicate_rate);
    assert_eq!(stats.processed.get("applied"), Some(&1));
    assert_eq!((stats.processing.mean_ms, stats.processing.max_ms), (Some(21.0), Some(30.0)));
    assert_eq!(
        (stats.now.by_status["DEAD"], stats.now.by_status["PARKED"], stats.now.by_status["RECEIVED"]),
        (10, 10, 0)
    );
    assert_eq!(failures.top_types.iter().map(|c| c.count).sum::<u64>(), 20);
    assert_eq!(failures.top_types.len(), 4);
    assert_eq!(failures.repeated_subjects.len(), 3, "{:?}", failures.repeated_subjects);
    assert_eq!(
        failures.reasons.iter().map(|c| (c.key.as_str(), c.count)).collect::<Vec<_>>(),
        [("attempts_exhausted", 10), ("unmapped_subject", 10)]
    );
    assert!(!stats.now.truncated);

    processed_copies(&stack, &processed, 100, 10_000).await;
    pass_the_finished(&stack).await;
    let (large, stats_after, failures_after) = read_figures(&stack, &namespace).await;
    assert_eq!(large.0, small.0, "the same AWS requests beside 100 and 10,000 processed records");
    let ratio = large.1 as f64 / small.1 as f64;
    assert!((0.8..1.25).contains(&ratio), "bytes read: {} then {} (ratio {ratio:.3})", small.1, large.1);
    assert_eq!(stats_after.now, stats.now);
    assert_eq!(failures_after.top_types, failures.top_types);
    println!(
        "insight cost: {} requests ({:?}), {} then {} response bytes (ratio {ratio:.3})",
        small.0.values().sum::<u64>(),
        small.0,
        small.1,
        large.1
    );
}

/// Issue 39.15: a reconciler run the CLI makes in its own process (`hookledger
/// reconcile`, the demo's drift check) writes its metrics as the reconciler
/// function's collector would (`function = reconciler`, `projection`): the
/// drift it repairs reaches `stats` through CloudWatch. Before, the run's
/// metrics went to no recorder and `stats` said 0. The namespace is the
/// process's (`HOOKLEDGER_METRICS_NAMESPACE`, default `Hookledger`), shared by
/// reruns on one emulator, so the figures are compared before and after.
#[tokio::test]
async fn a_reconciler_run_in_the_cli_writes_the_drift_it_repairs_for_stats() {
    let stack = Stack::new().await;
    let namespace = std::env::var("HOOKLEDGER_METRICS_NAMESPACE").unwrap_or_else(|_| "Hookledger".into());
    let metrics = || CloudWatchMetrics::new(aws_sdk_cloudwatch::Client::new(&stack.aws), &namespace);
    let ledger = || DynamoLedger::new(stack.ddb.clone(), &stack.table).with_shards(16);
    let window = || {
        let now = now_ms();
        MetricWindow { since_ms: now - 3_600_000, until_ms: now + 60_000, period_s: 300 }
    };
    let drift = || async {
        let stats = Insight::new(ledger(), metrics()).stats(&window(), now_ms()).await.unwrap();
        (stats.drift_found, stats.drift_repaired)
    };
    let before = drift().await;
    // What the reconciler's drift check emits for two repairs.
    let run = async {
        metrics::counter!("drift_found", "projection" => "entitlements").increment(2);
        metrics::counter!("drift_repaired", "projection" => "entitlements").increment(2);
    };
    hookledger_cli::reported::reconciler_run(&metrics(), run).await;
    let after = drift().await;
    assert_eq!((after.0 - before.0, after.1 - before.1), (2, 2), "before {before:?}, after {after:?}");
}
