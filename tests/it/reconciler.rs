//! The reconciler against the emulator: re-drives, concurrency, drift, bounds.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use hookledger::adapters::stripe::StripeApi;
use hookledger::app::account_ledger::balance_pk;
use hookledger::app::entitlement::entitlement_pk;
use hookledger::ledger::Ledger;
use hookledger::processor::Outcome;
use hookledger::projection::fetch::SubscriptionSource;
use hookledger::reconciler::ReconcilerSettings;
use hookledger::secret::Secret;

use crate::fake_provider::FakeStripe;
use crate::processor::{pi_succeeded, sub_updated};
use crate::support::{Stack, fast_settings, n, run_processor, s};

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// Past the intake's 60 s grace for RECEIVED records.
const AFTER_GRACE: i64 = 61_000;

#[tokio::test]
async fn a_never_sent_claim_is_processed_after_one_reconciler_run() {
    let stack = Stack::new().await;
    stack.map_customer("cus_n", "acct_n").await;
    // The intake claimed and stored it, SQS refused, the provider never retried.
    let key = stack
        .claim("stripe", "stripe-a", "evt_lost", None, &pi_succeeded("evt_lost", "pi_lost", Some("cus_n"), 42))
        .await;
    assert!(stack.drain_queue().await.is_empty());
    let r = stack.reconciler(ReconcilerSettings::default(), None);
    let early = r.run(now_ms(), later()).await.unwrap();
    assert!(early.redriven.is_empty(), "inside the grace period the intake may still be sending: {early:?}");
    let summary = r.run(now_ms() + AFTER_GRACE, later()).await.unwrap();
    assert_eq!(summary.redriven.get("never_sent"), Some(&1));
    assert!(summary.complete);
    run_processor(&stack, stack.app(fast_settings(), None), 3, Duration::from_secs(20)).await;
    assert_eq!(s(&stack.record(&key).await, "status"), "PROCESSED");
    assert_eq!(n(&stack.state(&balance_pk("t1", "acct_n")).await.unwrap(), "balance"), 42);
    // A rerun finds nothing to do.
    let again = r.run(now_ms() + AFTER_GRACE, later()).await.unwrap();
    assert!(again.redriven.is_empty(), "{again:?}");
}

#[tokio::test]
async fn expired_leases_and_due_retries_are_redriven_and_not_yet_due_ones_left_alone() {
    let stack = Stack::new().await;
    stack.map_customer("cus_e", "acct_e").await;
    let ledger = stack.ledger();
    let now = now_ms();
    // A worker took a 1 s lease and died.
    let crashed = stack
        .claim("stripe", "stripe-a", "evt_crashed_worker", None, &pi_succeeded("evt_cw", "pi_cw", Some("cus_e"), 5))
        .await;
    ledger.lease(&crashed, "dead-worker", now, 1_000).await.unwrap();
    // One retry due now, one due in an hour.
    let due =
        stack.claim("stripe", "stripe-a", "evt_due", None, &pi_succeeded("evt_due", "pi_due", Some("cus_e"), 7)).await;
    ledger.lease(&due, "w1", now, 30_000).await.unwrap();
    ledger.retry(&due, "w1", now + 500, "test", "transient").await.unwrap();
    let not_due = stack
        .claim("stripe", "stripe-a", "evt_not_due", None, &pi_succeeded("evt_nd", "pi_nd", Some("cus_e"), 9))
        .await;
    ledger.lease(&not_due, "w2", now, 30_000).await.unwrap();
    ledger.retry(&not_due, "w2", now + 3_600_000, "test", "transient").await.unwrap();
    // Mark the fresh RECEIVED copies as sent so only the three above are candidates.
    for k in [&crashed, &due, &not_due] {
        ledger.mark_enqueued(k, now).await.unwrap();
    }

    let summary = stack.reconciler(ReconcilerSettings::default(), None).run(now + 2_000, later()).await.unwrap();
    assert_eq!(summary.redriven.get("lease_expired"), Some(&1), "{summary:?}");
    assert_eq!(summary.redriven.get("retry_due"), Some(&1), "{summary:?}");
    assert_eq!(summary.stuck_leases, 1);
    let sent: Vec<String> = stack.drain_queue().await;
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().any(|b| b.contains("evt_crashed_worker")) && sent.iter().any(|b| b.contains("evt_due")));
    assert!(!sent.iter().any(|b| b.contains("evt_not_due")), "a record not yet due is left alone");
    assert_eq!(s(&stack.record(&not_due).await, "status"), "RETRYABLE");
    assert!(summary.oldest_unprocessed_age_ms.is_some_and(|a| a >= 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_runs_at_once_over_500_stuck_records_give_one_effect_each() {
    let stack = Stack::new().await;
    stack.map_customer("cus_500", "acct_500").await;
    let mut expected = 0;
    let t = Instant::now();
    for i in 0..500 {
        let amount = i + 1;
        expected += amount;
        stack
            .claim(
                "stripe",
                "stripe-a",
                &format!("evt_s{i}"),
                None,
                &pi_succeeded(&format!("evt_s{i}"), &format!("pi_s{i}"), Some("cus_500"), amount),
            )
            .await;
    }
    eprintln!("claims: {:?}", t.elapsed());
    let t0 = Instant::now();
    let settings = ReconcilerSettings { max_items: 1000, ..Default::default() };
    let (a, b) = (Arc::new(stack.reconciler(settings, None)), Arc::new(stack.reconciler(settings, None)));
    let at = now_ms() + AFTER_GRACE;
    let (ra, rb) = tokio::join!(a.run(at, later()), b.run(at, later()));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let total =
        ra.redriven.get("never_sent").copied().unwrap_or(0) + rb.redriven.get("never_sent").copied().unwrap_or(0);
    assert_eq!(total, 500, "each record re-driven by exactly one run: {ra:?} {rb:?}");
    eprintln!("reconcile runs: {:?}", t0.elapsed());

    let app = stack.app(fast_settings(), None);
    let stack = Arc::new(stack);
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (stack, app) = (stack.clone(), app.clone());
        workers.spawn(async move { run_processor(&stack, app, 5, Duration::from_secs(240)).await });
    }
    while let Some(r) = workers.join_next().await {
        r.unwrap();
    }
    eprintln!("processing: {:?}", t0.elapsed());
    let metas = stack.meta_items().await;
    assert_eq!(metas.iter().filter(|m| s(m, "status") == "PROCESSED").count(), 500);
    let balance = stack.state(&balance_pk("t1", "acct_500")).await.unwrap();
    assert_eq!((n(&balance, "balance"), n(&balance, "entries")), (expected, 500));
}

#[tokio::test]
async fn drift_is_detected_against_the_fake_provider_and_repaired_through_the_pipeline() {
    let stack = Stack::new().await;
    stack.map_customer("cus_d", "acct_d").await;
    let (fake, base) = FakeStripe::start().await;
    let source: Arc<dyn SubscriptionSource> = Arc::new(StripeApi::new(base, Secret::new("sk_test_fake")).unwrap());
    fake.set("sub_d", "cus_d", "active", 5);
    let key = stack.claim("stripe", "stripe-a", "evt_d", None, &sub_updated("evt_d", "sub_d", "cus_d")).await;
    let p = stack.processor(fast_settings(), Some(source.clone()), None);
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Applied);
    let settings = ReconcilerSettings { drift_interval_ms: 0, ..Default::default() };
    let r = stack.reconciler(settings, Some(source.clone()));
    let clean = r.run(now_ms() + 1, later()).await.unwrap();
    assert_eq!((clean.drift_checked, clean.drift_found), (1, 0));

    // Behind the system's back: the local projection is edited, and the provider moves on too.
    let pk = entitlement_pk("t1", "sub_d");
    stack
        .ddb
        .update_item()
        .table_name(&stack.table)
        .key("pk", AttributeValue::S(pk.clone()))
        .key("sk", AttributeValue::S("state".into()))
        .update_expression("SET seats = :s")
        .expression_attribute_values(":s", AttributeValue::N("99".into()))
        .send()
        .await
        .unwrap();
    fake.set("sub_d", "cus_d", "past_due", 5);

    let found = r.run(now_ms() + 2, later()).await.unwrap();
    assert_eq!((found.drift_checked, found.drift_found, found.drift_repaired), (1, 1, 1), "{found:?}");
    let repair: Vec<String> =
        stack.meta_items().await.iter().map(|m| s(m, "pk")).filter(|pk| pk.contains("#recon:sub_d:")).collect();
    assert_eq!(repair.len(), 1, "a reconciliation event identity: {repair:?}");
    run_processor(&stack, stack.app(fast_settings(), Some(source.clone())), 3, Duration::from_secs(20)).await;
    let ent = stack.state(&pk).await.unwrap();
    assert_eq!((s(&ent, "status").as_str(), n(&ent, "seats")), ("past_due", 5));

    let second = r.run(now_ms() + 3, later()).await.unwrap();
    assert_eq!((second.drift_checked, second.drift_found), (1, 0), "{second:?}");
    assert!(fake.requests.load(Ordering::SeqCst) >= 4);
}

#[tokio::test]
async fn a_run_over_its_bound_stops_cleanly_and_the_next_run_continues() {
    let stack = Stack::new().await;
    for i in 0..25 {
        stack.claim("standard_webhooks", "svix", &format!("msg_b{i}"), None, br#"{"type":"x"}"#).await;
    }
    let settings = ReconcilerSettings { max_items: 10, ..Default::default() };
    let r = stack.reconciler(settings, None);
    let at = now_ms() + AFTER_GRACE;
    let mut sent = Vec::new();
    for expected in [10, 10, 5] {
        let summary = r.run(at, later()).await.unwrap();
        let n = summary.redriven.get("never_sent").copied().unwrap_or(0);
        assert_eq!(n, expected, "{summary:?}");
        assert_eq!(summary.complete, expected < 10, "{summary:?}");
        sent.extend(stack.drain_queue().await);
    }
    sent.sort();
    sent.dedup();
    assert_eq!(sent.len(), 25, "every record re-driven once across the runs");
    let last = r.run(at, later()).await.unwrap();
    assert!(last.redriven.is_empty() && last.complete);
}

#[tokio::test]
async fn a_run_past_its_deadline_does_nothing_and_says_so() {
    let stack = Stack::new().await;
    stack.claim("standard_webhooks", "svix", "msg_deadline", None, b"{}").await;
    let summary = stack
        .reconciler(ReconcilerSettings::default(), None)
        .run(now_ms() + AFTER_GRACE, Instant::now())
        .await
        .unwrap();
    assert!(!summary.complete && summary.redriven.is_empty());
}
