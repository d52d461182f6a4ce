//! The reconciler against the emulator: re-drives, concurrency, drift, bounds.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::dynamodb::outbox::outbox_put;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::adapters::stripe::StripeApi;
use hookledger::config::ReconcilerSettings;
use hookledger::identity::EventKey;
use hookledger::ledger::PortError;
use hookledger::message::OutboxMessage;
use hookledger::outbox::DispatchPolicy;
use hookledger::ports::WorkLedger as _;
use hookledger::ports::{Ledger, WorkQueue};
use hookledger::processor::Outcome;
use hookledger::projection::fetch::SubscriptionSource;
use hookledger::reconciler::Reconciler;
use hookledger::secret::Secret;
use hookledger_app::account_ledger::balance_pk;
use hookledger_app::entitlement::entitlement_pk;

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
/// An entitlement's first drift check is due this long after its fetch.
const DRIFT_DUE: i64 = hookledger::config::DEFAULT_DRIFT_INTERVAL_MS + 1;

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
    let early = r.run(now_ms(), later()).await;
    assert!(early.redriven.is_empty(), "inside the grace period the intake may still be sending: {early:?}");
    let summary = r.run(now_ms() + AFTER_GRACE, later()).await;
    assert_eq!(summary.redriven.get("never_sent"), Some(&1));
    assert!(summary.complete);
    run_processor(&stack, stack.app(fast_settings(), None), 3, Duration::from_secs(20)).await;
    assert_eq!(s(&stack.record(&key).await, "status"), "PROCESSED");
    assert_eq!(n(&stack.state(&balance_pk("t1", "acct_n")).await.unwrap(), "balance"), 42);
    // A rerun finds nothing to do.
    let again = r.run(now_ms() + AFTER_GRACE, later()).await;
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
    crate::support::retry(&ledger, &due, "w1", now + 500, "test", "transient").await;
    let not_due = stack
        .claim("stripe", "stripe-a", "evt_not_due", None, &pi_succeeded("evt_nd", "pi_nd", Some("cus_e"), 9))
        .await;
    ledger.lease(&not_due, "w2", now, 30_000).await.unwrap();
    crate::support::retry(&ledger, &not_due, "w2", now + 3_600_000, "test", "transient").await;
    // A worker still busy with a long lease when the record's due time comes.
    let busy =
        stack.claim("stripe", "stripe-a", "evt_busy", None, &pi_succeeded("evt_busy", "pi_b", Some("cus_e"), 3)).await;
    ledger.lease(&busy, "w3", now, 600_000).await.unwrap();
    // Mark the fresh RECEIVED copies as sent so only the four above are candidates.
    for k in [&crashed, &due, &not_due, &busy] {
        ledger.mark_enqueued(k, now).await.unwrap();
    }

    // The lease does not move a record in the due index: a crashed worker's
    // record comes back at its own due time (receipt + the grace).
    let summary = stack.reconciler(ReconcilerSettings::default(), None).run(now + AFTER_GRACE, later()).await;
    assert_eq!(summary.redriven.get("lease_expired"), Some(&1), "{summary:?}");
    assert_eq!(summary.redriven.get("retry_due"), Some(&1), "{summary:?}");
    assert_eq!(summary.stuck_leases, 1);
    let sent: Vec<String> = stack.drain_queue().await;
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().any(|b| b.contains("evt_crashed_worker")) && sent.iter().any(|b| b.contains("evt_due")));
    assert!(!sent.iter().any(|b| b.contains("evt_not_due")), "a record not yet due is left alone");
    assert!(!sent.iter().any(|b| b.contains("evt_busy")), "a live lease is not re-driven");
    assert_eq!(n(&stack.record(&busy).await, "due_at"), now + 600_001, "it is looked at again when its lease ends");
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
    let clean = r.run(now_ms() + DRIFT_DUE, later()).await;
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

    let found = r.run(now_ms() + DRIFT_DUE + 1, later()).await;
    assert_eq!((found.drift_checked, found.drift_found, found.drift_repaired), (1, 1, 1), "{found:?}");
    let repair: Vec<String> =
        stack.meta_items().await.iter().map(|m| s(m, "pk")).filter(|pk| pk.contains("#recon:sub_d:")).collect();
    assert_eq!(repair.len(), 1, "a reconciliation event identity: {repair:?}");
    run_processor(&stack, stack.app(fast_settings(), Some(source.clone())), 3, Duration::from_secs(20)).await;
    let ent = stack.state(&pk).await.unwrap();
    assert_eq!((s(&ent, "status").as_str(), n(&ent, "seats")), ("past_due", 5));

    let second = r.run(now_ms() + DRIFT_DUE + 2, later()).await;
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
        let summary = r.run(at, later()).await;
        let n = summary.redriven.get("never_sent").copied().unwrap_or(0);
        assert_eq!(n, expected, "{summary:?}");
        assert_eq!(summary.complete, expected < 10, "{summary:?}");
        sent.extend(stack.drain_queue().await);
    }
    sent.sort();
    sent.dedup();
    assert_eq!(sent.len(), 25, "every record re-driven once across the runs");
    let last = r.run(at, later()).await;
    assert!(last.redriven.is_empty() && last.complete);
}

#[tokio::test]
async fn a_run_past_its_deadline_does_nothing_and_says_so() {
    let stack = Stack::new().await;
    stack.claim("standard_webhooks", "svix", "msg_deadline", None, b"{}").await;
    let summary =
        stack.reconciler(ReconcilerSettings::default(), None).run(now_ms() + AFTER_GRACE, Instant::now()).await;
    assert!(!summary.complete && summary.redriven.is_empty());
}

// --- Failure isolation and lost acknowledgements -------------------------

mod faults {
    //! A DynamoDB client that loses acknowledgements: the first `times`
    //! requests of one operation whose body contains a marker reach the
    //! emulator and commit, then their response is replaced by a 500, so the
    //! SDK retries the write against its own committed result.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use aws_sdk_dynamodb::config::interceptors::{
        BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
    };
    use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
    use aws_sdk_dynamodb::error::BoxError;

    #[derive(Debug, Clone)]
    pub struct LoseAck {
        operation: &'static str,
        marker: &'static str,
        remaining: Arc<AtomicU32>,
        armed: Arc<AtomicBool>,
        pub lost: Arc<AtomicU32>,
    }

    impl LoseAck {
        pub fn new(operation: &'static str, marker: &'static str, times: u32) -> Self {
            Self {
                operation,
                marker,
                remaining: Arc::new(AtomicU32::new(times)),
                armed: Arc::new(AtomicBool::new(false)),
                lost: Arc::new(AtomicU32::new(0)),
            }
        }

        pub fn client(&self, aws: &aws_config::SdkConfig) -> aws_sdk_dynamodb::Client {
            let conf = aws_sdk_dynamodb::config::Builder::from(aws).interceptor(self.clone()).build();
            aws_sdk_dynamodb::Client::from_conf(conf)
        }
    }

    impl Intercept for LoseAck {
        fn name(&self) -> &'static str {
            "LoseAck"
        }

        fn read_before_transmit(
            &self,
            ctx: &BeforeTransmitInterceptorContextRef<'_>,
            _rc: &RuntimeComponents,
            _cfg: &mut ConfigBag,
        ) -> Result<(), BoxError> {
            let req = ctx.request();
            let target = req.headers().get("x-amz-target").unwrap_or_default();
            let body = req.body().bytes().map(String::from_utf8_lossy).unwrap_or_default();
            if target.ends_with(&format!(".{}", self.operation))
                && body.contains(self.marker)
                && self.remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
            {
                self.armed.store(true, Ordering::SeqCst);
            }
            Ok(())
        }

        fn modify_before_deserialization(
            &self,
            ctx: &mut BeforeDeserializationInterceptorContextMut<'_>,
            _rc: &RuntimeComponents,
            _cfg: &mut ConfigBag,
        ) -> Result<(), BoxError> {
            if self.armed.swap(false, Ordering::SeqCst) {
                assert!(ctx.response().status().is_success(), "the write to lose must have committed");
                *ctx.response_mut().status_mut() = 500u16.try_into().unwrap();
                self.lost.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
    }
}

/// A work queue that refuses keys containing `refuse` (a non-throttling fault).
struct RefusingQueue {
    inner: SqsQueue,
    refuse: &'static str,
}

impl WorkQueue for RefusingQueue {
    async fn send(&self, key: &EventKey, tenant: &str) -> Result<(), PortError> {
        if key.as_str().contains(self.refuse) {
            return Err(PortError::Unavailable { service: "sqs", message: "injected: access denied".into() });
        }
        self.inner.send(key, tenant).await
    }
}

fn reconciler_with<Q: WorkQueue>(
    stack: &Stack,
    ddb: aws_sdk_dynamodb::Client,
    queue: Q,
    source: Option<Arc<dyn SubscriptionSource>>,
    settings: ReconcilerSettings,
) -> Reconciler<Q, DynamoLedger, hookledger::wiring::LiveDispatcher> {
    let dispatcher =
        hookledger::wiring::dispatcher(ddb.clone(), aws_sdk_sns::Client::new(&stack.aws), stack.table.clone());
    // The stack's shards (16), as its intake writes them.
    let rechecks = crate::support::rechecks(source);
    Reconciler::new(DynamoLedger::new(ddb, &stack.table).with_shards(16), queue, Some(dispatcher), rechecks, settings)
}

fn sqs_queue(stack: &Stack) -> SqsQueue {
    SqsQueue::new(stack.sqs.clone(), &stack.queue_url)
}

/// One run, its summary as JSON (fields by name).
async fn run_json<Q: WorkQueue>(
    r: &Reconciler<Q, DynamoLedger, hookledger::wiring::LiveDispatcher>,
    at: i64,
) -> serde_json::Value {
    serde_json::to_value(r.run(at, later()).await).unwrap()
}

/// Writes an outbox item as a processor commit would, due `at`.
async fn put_outbox(stack: &Stack, event: &str, topic: &str, at: i64) -> String {
    let key = EventKey::new("stripe", "stripe-a", event);
    let msg = OutboxMessage {
        topic_arn: topic.to_owned(),
        delivery: None,
        action: "subscription.changed".into(),
        group: "sub_x".into(),
        body: serde_json::json!({"event": event}),
    };
    // Committed a lease before `at` by a processor that died before it sent
    // it: its claim (the commit's) has lapsed at `at`, one attempt spent.
    let committed = at - hookledger::message::DISPATCH_LEASE_MS;
    let (pk, put) = outbox_put(&stack.table, &key, &msg, "a-dead-processor", committed, 16, true);
    stack.ddb.transact_write_items().transact_items(put).send().await.unwrap();
    pk
}

async fn outbox_item(stack: &Stack, pk: &str) -> std::collections::HashMap<String, AttributeValue> {
    stack
        .ddb
        .get_item()
        .table_name(&stack.table)
        .key("pk", AttributeValue::S(pk.into()))
        .key("sk", AttributeValue::S("outbox".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap()
}

/// An entitlement the drift phase will check (`interval 0`), its provider state
/// already moved on; returns the fake provider and the source.
async fn drifting_entitlement(
    stack: &Stack,
    sub: &str,
    customer: &str,
) -> (Arc<FakeStripe>, Arc<dyn SubscriptionSource>) {
    stack.map_customer(customer, &format!("acct_{customer}")).await;
    let (fake, base) = FakeStripe::start().await;
    let source: Arc<dyn SubscriptionSource> = Arc::new(StripeApi::new(base, Secret::new("sk_test_fake")).unwrap());
    fake.set(sub, customer, "active", 5);
    let event = format!("evt_{sub}");
    let key = stack.claim("stripe", "stripe-a", &event, None, &sub_updated(&event, sub, customer)).await;
    let p = stack.processor(fast_settings(), Some(source.clone()), None);
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Applied);
    fake.set(sub, customer, "past_due", 5);
    (fake, source)
}

const NO_TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:no-such-topic";

#[tokio::test]
async fn a_failing_outbox_publish_does_not_abort_the_run_and_every_phase_reports() {
    let stack = Stack::new().await;
    let (_fake, source) = drifting_entitlement(&stack, "sub_fo", "cus_fo").await;
    let now = now_ms();
    let bad = put_outbox(&stack, "evt_fo_bad", NO_TOPIC, now).await;
    let lost = stack.claim("standard_webhooks", "svix", "msg_fo_lost", None, b"{}").await;
    let settings = ReconcilerSettings { drift_interval_ms: 0, ..Default::default() };
    let r = reconciler_with(&stack, stack.ddb.clone(), sqs_queue(&stack), Some(source), settings);

    // Past the grace and the entitlement's first drift check.
    let at = now + DRIFT_DUE;
    let summary = run_json(&r, at).await;
    assert_eq!(summary["redriven"]["never_sent"], 1, "{summary}");
    assert_eq!(summary["errors"]["outbox"], 1, "the failure is counted: {summary}");
    assert_eq!((summary["drift_checked"].clone(), summary["drift_found"].clone()), (1.into(), 1.into()), "{summary}");
    assert!(summary["oldest_unprocessed_age_ms"].is_i64(), "evidence gathered: {summary}");
    assert!(stack.drain_queue().await.iter().any(|b| b.contains(lost.as_str())));
    // The failed item backs off: pending again, due later, the attempt counted.
    let item = outbox_item(&stack, &bad).await;
    assert_eq!(
        (s(&item, "status").as_str(), n(&item, "dispatch_attempts")),
        ("PENDING", 2),
        "the commit's and this one"
    );
    assert!(n(&item, "due_at") > at, "{item:?}");
    let again = run_json(&r, at).await;
    assert!(again["errors"].as_object().is_none_or(|e| e.is_empty()), "not retried before its backoff: {again}");
}

#[tokio::test]
async fn an_outbox_item_that_keeps_failing_goes_dead_out_of_the_due_index_and_is_counted() {
    let stack = Stack::new().await;
    let now = now_ms();
    let bad = put_outbox(&stack, "evt_dead_out", NO_TOPIC, now).await;
    let r = reconciler_with(&stack, stack.ddb.clone(), sqs_queue(&stack), None, ReconcilerSettings::default());
    let max = i64::from(DispatchPolicy::default().max_attempts);
    let mut last = serde_json::Value::Null;
    // A day apart: every backoff has passed. Each run makes one attempt
    // (the first was its dead processor's commit).
    for i in 2..=max {
        last = run_json(&r, now + i * 86_400_000).await;
        let item = outbox_item(&stack, &bad).await;
        let want = if i < max { "PENDING" } else { "DEAD" };
        assert_eq!((s(&item, "status").as_str(), n(&item, "dispatch_attempts")), (want, i), "run {i}: {last}");
        assert_eq!(last["errors"]["outbox"], 1, "run {i}: {last}");
    }
    assert_eq!(last["outbox_dead_lettered"], 1, "{last}");
    let item = outbox_item(&stack, &bad).await;
    assert_eq!(s(&item, "status"), "DEAD", "{item:?}");
    assert!(!item.contains_key("due_shard") && !item.contains_key("due_at"), "out of the due index: {item:?}");
    assert!(s(&item, "attn_shard").starts_with("attn#"), "findable in the attention index: {item:?}");
    assert!(!s(&item, "last_error").is_empty(), "{item:?}");
    assert_eq!(last["outbox_dead"], 1, "{last}");
    let after = run_json(&r, now + 30 * 86_400_000).await;
    assert_eq!((after["outbox_dead"].clone(), after["errors"].get("outbox").cloned()), (1.into(), None), "{after}");
}

#[tokio::test]
async fn a_redrive_whose_send_fails_does_not_mark_the_record_sent() {
    let stack = Stack::new().await;
    let key = stack.claim("standard_webhooks", "svix", "msg_rd_fail", None, b"{}").await;
    let refusing = RefusingQueue { inner: sqs_queue(&stack), refuse: "msg_rd_fail" };
    let at = now_ms() + AFTER_GRACE;
    let failed = run_json(&reconciler_with(&stack, stack.ddb.clone(), refusing, None, Default::default()), at).await;
    let record = stack.record(&key).await;
    assert!(!record.contains_key("enqueued_at"), "marked sent though the send failed: {record:?} (run: {failed})");
    assert_eq!(failed["errors"]["redrive"], 1);
    // It stays re-drivable: after the backoff a healthy run sends it, still as never sent.
    // (The backoff counts from when the run reached it: a minute later is past it.)
    let r = reconciler_with(&stack, stack.ddb.clone(), sqs_queue(&stack), None, ReconcilerSettings::default());
    let next = run_json(&r, at + ReconcilerSettings::default().redrive_backoff_ms + 60_000).await;
    assert_eq!(next["redriven"]["never_sent"], 1, "{next}");
    assert_eq!(stack.drain_queue().await.len(), 1);
    assert!(stack.record(&key).await.contains_key("enqueued_at"));
}

#[tokio::test]
async fn a_failing_send_for_one_record_does_not_abort_the_run() {
    let stack = Stack::new().await;
    let good = stack.claim("standard_webhooks", "svix", "msg_one_good", None, b"{}").await;
    let bad = stack.claim("standard_webhooks", "svix", "msg_one_bad", None, b"{}").await;
    let refusing = RefusingQueue { inner: sqs_queue(&stack), refuse: "msg_one_bad" };
    let r = reconciler_with(&stack, stack.ddb.clone(), refusing, None, ReconcilerSettings::default());
    let summary = run_json(&r, now_ms() + AFTER_GRACE).await;
    assert_eq!((summary["redriven"]["never_sent"].clone(), summary["errors"]["redrive"].clone()), (1.into(), 1.into()));
    let sent = stack.drain_queue().await;
    assert!(sent.len() == 1 && sent[0].contains(good.as_str()), "{sent:?}");
    assert!(!stack.record(&bad).await.contains_key("enqueued_at"));
}

#[tokio::test]
async fn a_lost_ack_on_the_redrive_claim_is_recognised_and_the_record_sent() {
    let stack = Stack::new().await;
    let key = stack.claim("standard_webhooks", "svix", "msg_claim_ack", None, b"{}").await;
    let lose = faults::LoseAck::new("UpdateItem", "redrives :one", 1);
    let r = reconciler_with(&stack, lose.client(&stack.aws), sqs_queue(&stack), None, ReconcilerSettings::default());
    let summary = run_json(&r, now_ms() + AFTER_GRACE).await;
    assert_eq!(lose.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(summary["redriven"]["never_sent"], 1, "{summary}");
    let sent = stack.drain_queue().await;
    assert!(sent.len() == 1 && sent[0].contains(key.as_str()), "{sent:?}");
}

#[tokio::test]
async fn a_lost_ack_on_the_outbox_claim_is_recognised_and_the_item_published_once() {
    let stack = Stack::new().await;
    let (topic, inbox) = stack.notify_topic().await;
    let now = now_ms();
    let pk = put_outbox(&stack, "evt_out_claim_ack", &topic, now).await;
    let lose = faults::LoseAck::new("UpdateItem", "dispatch_attempts :one", 1);
    let r = reconciler_with(&stack, lose.client(&stack.aws), sqs_queue(&stack), None, ReconcilerSettings::default());
    let summary = run_json(&r, now + AFTER_GRACE).await;
    assert_eq!(lose.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(summary["outbox_republished"], 1, "{summary}");
    assert_eq!(stack.drain(&inbox).await.len(), 1);
    assert_eq!(s(&outbox_item(&stack, &pk).await, "status"), "SENT");
}

#[tokio::test]
async fn a_lost_ack_on_the_outbox_mark_is_recognised_as_sent() {
    let stack = Stack::new().await;
    let (topic, inbox) = stack.notify_topic().await;
    let now = now_ms();
    let pk = put_outbox(&stack, "evt_out_mark_ack", &topic, now).await;
    let lose = faults::LoseAck::new("UpdateItem", "sent_at", 1);
    let r = reconciler_with(&stack, lose.client(&stack.aws), sqs_queue(&stack), None, ReconcilerSettings::default());
    let summary = run_json(&r, now + AFTER_GRACE).await;
    assert_eq!(lose.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(summary["outbox_republished"], 1, "{summary}");
    assert!(summary["errors"].as_object().is_none_or(|e| e.is_empty()), "{summary}");
    assert_eq!(stack.drain(&inbox).await.len(), 1);
    assert_eq!(s(&outbox_item(&stack, &pk).await, "status"), "SENT");
}

#[tokio::test]
async fn a_lost_ack_on_the_drift_repair_claim_still_stores_and_sends_the_repair() {
    let stack = Stack::new().await;
    let (_fake, source) = drifting_entitlement(&stack, "sub_la", "cus_la").await;
    let lose = faults::LoseAck::new("PutItem", "recon:sub_la:", 1);
    let settings = ReconcilerSettings { drift_interval_ms: 0, ..Default::default() };
    let r = reconciler_with(&stack, lose.client(&stack.aws), sqs_queue(&stack), Some(source.clone()), settings);
    let summary = run_json(&r, now_ms() + DRIFT_DUE).await;
    assert_eq!(lose.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(summary["drift_found"], 1, "{summary}");
    let repair = stack.meta_items().await.into_iter().find(|m| s(m, "pk").contains("#recon:sub_la:")).unwrap();
    assert_eq!(repair.get("payload_stored").and_then(|v| v.as_bool().ok()), Some(&true), "{repair:?}");
    let sent = stack.drain_queue().await;
    assert!(sent.len() == 1 && sent[0].contains("recon:sub_la:"), "the repair was handed to the queue: {sent:?}");
}

#[tokio::test]
async fn a_provider_outage_is_counted_and_the_drift_check_retried_after_the_backoff() {
    let stack = Stack::new().await;
    let (fake, source) = drifting_entitlement(&stack, "sub_po", "cus_po").await;
    let settings = ReconcilerSettings::default();
    let r = reconciler_with(&stack, stack.ddb.clone(), sqs_queue(&stack), Some(source), settings);
    fake.fail.store(true, Ordering::SeqCst);
    let t1 = now_ms() + settings.drift_interval_ms + 1_000;
    let down = run_json(&r, t1).await;
    assert_eq!((down["drift_checked"].clone(), down["errors"]["drift"].clone()), (1.into(), 1.into()), "{down}");
    fake.fail.store(false, Ordering::SeqCst);
    let soon = run_json(&r, t1 + 1_000).await;
    assert_eq!(soon["drift_checked"], 0, "not before the backoff: {soon}");
    // The backoff counts from when the run reached it (a claim is taken at
    // the clock's current time): a minute later is past it.
    let after = run_json(&r, t1 + settings.redrive_backoff_ms + 60_000).await;
    assert_eq!((after["drift_found"].clone(), after["errors"].get("drift").cloned()), (1.into(), None), "{after}");
    assert!(stack.drain_queue().await.iter().any(|b| b.contains("recon:sub_po:")));
}
