//! The reconciler's sweep under volume, against the emulator: a re-check
//! backlog or a provider outage never keeps a 2xx'd record from being
//! re-driven, a record backlog never starves the outbox and the re-checks,
//! and the oldest open record is measured even while its retry is not due.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::dynamodb::outbox::outbox_put;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::adapters::stripe::StripeApi;
use hookledger::config::{ProcessorSettings, ReconcilerSettings};
use hookledger::identity::{EventKey, payload_hash, shard_of};
use hookledger::ledger::{NewEvent, SendLease, Via};
use hookledger::message::OutboxMessage;
use hookledger::ports::Ledger;
use hookledger::processor::Outcome;
use hookledger::projection::fetch::SubscriptionSource;
use hookledger::reconciler::{Reconciler, Summary};
use hookledger::secret::Secret;

use crate::fake_provider::FakeStripe;
use crate::processor::{pi_succeeded, sub_updated};
use crate::support::{Stack, fast_settings};

const SHARDS: u32 = 4;
const HOUR: i64 = 3_600_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn ledger(stack: &Stack) -> DynamoLedger {
    DynamoLedger::new(stack.ddb.clone(), &stack.table).with_shards(SHARDS)
}

fn reconciler(
    stack: &Stack,
    max_items: usize,
    source: Option<Arc<dyn SubscriptionSource>>,
) -> hookledger::wiring::LiveReconciler {
    let dispatcher =
        hookledger::wiring::dispatcher(stack.ddb.clone(), aws_sdk_sns::Client::new(&stack.aws), stack.table.clone());
    let settings = ReconcilerSettings { max_items, ..ReconcilerSettings::default() };
    Reconciler::new(
        ledger(stack),
        SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
        Some(dispatcher),
        crate::support::rechecks(source),
        settings,
    )
}

async fn run(r: &hookledger::wiring::LiveReconciler, at: i64) -> Summary {
    r.run(at, Instant::now() + Duration::from_secs(120)).await
}

/// Ids of `prefix` whose identity (or subscription) falls in `shard`.
fn ids(prefix: &str, shard: u32, n: usize, of: impl Fn(&str) -> u32) -> Vec<String> {
    (0..).map(|i| format!("{prefix}_{shard}_{i}")).filter(|id| of(id) == shard).take(n).collect()
}

fn key_shard(id: &str) -> u32 {
    EventKey::new("stripe", "stripe-a", id).shard(SHARDS)
}

/// A record the intake claimed and stored at `received_at`, never sent.
async fn claimed(stack: &Stack, id: &str, received_at: i64) -> EventKey {
    let key = EventKey::new("stripe", "stripe-a", id);
    let body = pi_succeeded(id, &format!("pi_{id}"), Some("cus_s"), 100);
    let hash = payload_hash(&body);
    let event = NewEvent {
        key: key.clone(),
        provider: "stripe".into(),
        endpoint: "stripe-a".into(),
        tenant: "t1".into(),
        event_id: id.into(),
        event_type: Some("payment_intent.succeeded".into()),
        payload_hash: hash.clone(),
        content_hash: hash,
        received_at_ms: received_at,
        expires_at: received_at / 1000 + 86_400,
        shard: key.shard(SHARDS),
        send: SendLease { token: "intake".into(), until_ms: received_at },
        via: Via::Webhook,
        batch_hash: None,
        kept: None,
        notification: None,
    };
    let ledger = ledger(stack);
    ledger.claim(&event, &body).await.unwrap();
    // Never sent: the send lease given back, as the intake does when its send fails.
    ledger.release_send_lease(&key, &event.send).await.unwrap();
    key
}

fn processor_settings() -> ProcessorSettings {
    ProcessorSettings { index_shards: SHARDS, ..fast_settings() }
}

/// `per_shard` entitlements in every shard, written by the processor from
/// subscription events (their first check is due an hour after the fetch).
async fn entitlements(stack: &Stack, per_shard: usize) -> (Arc<FakeStripe>, Arc<dyn SubscriptionSource>) {
    stack.map_customer("cus_s", "acct_s").await;
    let (fake, base) = FakeStripe::start().await;
    let source: Arc<dyn SubscriptionSource> = Arc::new(StripeApi::new(base, Secret::new("sk_test_fake")).unwrap());
    let dispatcher =
        hookledger::wiring::dispatcher(stack.ddb.clone(), aws_sdk_sns::Client::new(&stack.aws), stack.table.clone());
    let p = hookledger::wiring::processor(
        ledger(stack),
        hookledger_app::reference_registry(Some(source.clone()), None),
        Some(dispatcher),
        processor_settings(),
    );
    for shard in 0..SHARDS {
        for sub in ids("sub", shard, per_shard, |s| shard_of(s, SHARDS)) {
            fake.set(&sub, "cus_s", "active", 1);
            let event = format!("evt_{sub}");
            let key = stack.claim("stripe", "stripe-b", &event, None, &sub_updated(&event, &sub, "cus_s")).await;
            assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Applied, "{sub}");
        }
    }
    (fake, source)
}

#[tokio::test]
async fn a_drift_backlog_never_keeps_a_record_from_being_redriven() {
    // 4 shards, budget 10, 40 overdue entitlements per shard due before a
    // never-sent record in each shard; the provider answering, then failing.
    let stack = Stack::new().await;
    let (fake, source) = entitlements(&stack, 40).await;
    let due_checks = now_ms() + HOUR + 1_000;
    for provider_down in [false, true] {
        fake.fail.store(provider_down, Ordering::SeqCst);
        let at = due_checks + if provider_down { 2 * HOUR } else { 0 } + 300_000;
        let mut keys = Vec::new();
        for shard in 0..SHARDS {
            let id = &ids(if provider_down { "evt_down" } else { "evt_up" }, shard, 1, key_shard)[0];
            keys.push(claimed(&stack, id, at - 120_000).await);
        }
        let r = reconciler(&stack, 10, Some(source.clone()));
        let first = run(&r, at).await;
        let sent: std::collections::BTreeSet<String> = stack.drain_queue().await.into_iter().collect();
        for k in &keys {
            assert!(
                sent.iter().any(|m| m.contains(k.as_str())),
                "provider down {provider_down}: {k} not re-driven: {first:?}"
            );
        }
        assert_eq!(first.redriven.get("never_sent"), Some(&4), "provider down {provider_down}: {first:?}");
        assert!(first.drift_checked >= 1, "the re-checks still act: {first:?}");
    }
}

#[tokio::test]
async fn a_record_backlog_leaves_the_outbox_and_the_rechecks_their_shares() {
    let stack = Stack::new().await;
    let (_fake, source) = entitlements(&stack, 3).await;
    let at = now_ms() + HOUR + 60_000;
    for shard in 0..SHARDS {
        for id in ids("evt_bl", shard, 100, key_shard) {
            claimed(&stack, &id, at - 600_000).await;
        }
    }
    let (topic, inbox) = stack.notify_topic().await;
    for i in 0..12 {
        let msg = OutboxMessage {
            topic_arn: topic.clone(),
            delivery: None,
            action: "subscription.changed".into(),
            group: format!("sub_{i}"),
            body: serde_json::json!({"n": i}),
        };
        let key = EventKey::new("stripe", "stripe-a", &format!("evt_out_{i}"));
        let (_, put) = outbox_put(&stack.table, &key, &msg, "", at - 120_000, SHARDS, true);
        stack.ddb.transact_write_items().transact_items(put).send().await.unwrap();
    }
    let r = reconciler(&stack, 10, Some(source));
    for n in 0..3 {
        let summary = run(&r, at + n).await;
        assert!(summary.redriven.values().sum::<u64>() >= 1, "run {n}: {summary:?}");
        assert!(summary.outbox_republished >= 1, "run {n}: the outbox acts: {summary:?}");
        assert!(summary.drift_checked >= 1, "run {n}: the re-checks act: {summary:?}");
    }
    assert!(!stack.drain(&inbox).await.is_empty());
}

#[tokio::test]
async fn the_oldest_open_record_is_measured_when_its_retry_is_not_yet_due() {
    // A RETRYABLE record received 2 h ago whose retry is due just after
    // now, then just before, and so on; a younger record due before it in
    // the same shard: every run reports at least 2 h.
    let stack = Stack::new().await;
    let start = now_ms();
    let old = claimed(&stack, &ids("evt_old", 1, 1, key_shard)[0], start - 2 * HOUR).await;
    let young = claimed(&stack, &ids("evt_young", 1, 1, key_shard)[0], start - 90_000).await;
    let retry = |key: &EventKey, due: i64| {
        stack
            .ddb
            .update_item()
            .table_name(&stack.table)
            .key("pk", AttributeValue::S(key.as_str().to_owned()))
            .key("sk", AttributeValue::S("meta".into()))
            .update_expression("SET #st = :r, due_at = :d, next_attempt_at = :d, enqueued_at = :e, attempts = :one")
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":r", AttributeValue::S("RETRYABLE".into()))
            .expression_attribute_values(":d", AttributeValue::N(due.to_string()))
            .expression_attribute_values(":e", AttributeValue::N((start - HOUR).to_string()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
    };
    let r = reconciler(&stack, 500, None);
    for n in 0..4_i64 {
        let now = start + n * 1_000;
        retry(&young, now - 10_000).await.unwrap();
        retry(&old, if n % 2 == 0 { now + 500 } else { now - 500 }).await.unwrap();
        let summary = run(&r, now).await;
        let age = summary.oldest_unprocessed_age_ms.unwrap_or(0);
        assert!(age >= 2 * HOUR, "run {n}: oldest {age} ms: {summary:?}");
    }
}

/// A throttled `BatchGetItem` (every key left unprocessed): the read asks
/// again after a backoff with jitter, and gives up as unavailable once its
/// budget is spent, never in a tight loop; a throttle that passes costs one
/// more request.
#[tokio::test]
async fn unprocessed_keys_are_asked_for_again_after_a_backoff_within_a_bounded_budget() {
    use hookledger::adapters::dynamodb::due::{BATCH_READ_BACKOFF_MS, BATCH_READ_BUDGET_MS};
    use hookledger::clock::{Ambient, ManualClock, SeededEntropy};
    use hookledger::ledger::DuePartition;
    use hookledger::ports::DueLedger;
    use hookledger_it::faults::{Fault, FaultPlan, Rule, sdk_config};

    let stack = Stack::new().await;
    let key =
        stack.claim("stripe", "stripe-a", "evt_throttled", None, &pi_succeeded("evt_throttled", "pi_t", None, 1)).await;
    let plan = FaultPlan::new(11);
    let cfg = sdk_config(&plan).await;
    let clock = Arc::new(ManualClock::at(crate::support::now_s() * 1000));
    let ambient = Ambient { clock: clock.clone(), entropy: Arc::new(SeededEntropy::new(11)) };
    let ledger = DynamoLedger::new(hookledger_it::faults::dynamodb_client(&cfg), &stack.table)
        .with_shards(16)
        .with_ambient(ambient.clone());
    let shard = key.shard(16);
    let far = crate::support::now_s() * 1000 + HOUR;
    let batch_gets = || plan.trace().iter().filter(|c| c.operation == "BatchGetItem").count();

    // Throttled on every request: a bounded number of them, the budget's time slept between.
    plan.arm(Rule::new(Fault::Unprocessed).on("dynamodb", "BatchGetItem").every_attempt());
    let started = ambient.instant();
    let read =
        tokio::time::timeout(Duration::from_secs(10), ledger.due(DuePartition::Records, shard, far, 10, None)).await;
    let refused = read.expect("the read ends").expect_err("throttled throughout: unavailable");
    assert!(refused.to_string().contains("unprocessed"), "{refused}");
    let (tries, slept) = (batch_gets(), ambient.instant() - started);
    assert!((2..=40).contains(&tries), "{tries} requests");
    assert!(slept <= Duration::from_millis(BATCH_READ_BUDGET_MS), "slept {slept:?}");
    assert!(slept >= Duration::from_millis(BATCH_READ_BACKOFF_MS / 2), "backed off between tries: {slept:?}");

    // Throttled once: asked again, found.
    plan.disarm();
    let before = batch_gets();
    plan.arm(Rule::new(Fault::Unprocessed).on("dynamodb", "BatchGetItem").nth(0));
    let page = ledger.due(DuePartition::Records, shard, far, 10, None).await.unwrap();
    assert_eq!(page.items.len(), 1, "the record is found once asked again");
    assert_eq!(batch_gets() - before, 2);
}
