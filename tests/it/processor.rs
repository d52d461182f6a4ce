//! The processor against the emulator: the processor-side rows of the failure
//! matrix (design §9), each its own test, plus seed 001's experiment on the
//! real storage path.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hookledger::adapters::stripe::StripeApi;
use hookledger::backoff::Backoff;
use hookledger::config::ProcessorSettings;
use hookledger::ledger::Exit;
use hookledger::outbox::DispatchFault;
use hookledger::ports::WorkLedger as _;
use hookledger::processor::{Outcome, ProcessorFault};
use hookledger::projection::fetch::SubscriptionSource;
use hookledger::projection::{EventContext, PlanFuture, Projection, ProjectionContext, ProjectionError, Registry};
use hookledger::secret::Secret;
use hookledger_app::account_ledger::{balance_pk, entry_pk};
use hookledger_app::email_status::email_pk;
use hookledger_app::entitlement::entitlement_pk;
use hookledger_app::inventory::inventory_pk;
use hookledger_app::seats::seats_pk;
use serde_json::json;

use crate::fake_provider::FakeStripe;
use crate::support::{self, Stack, fast_settings, n, now_s, s};

pub fn pi_succeeded(event_id: &str, pi: &str, customer: Option<&str>, amount: i64) -> Vec<u8> {
    json!({"id": event_id, "object": "event", "type": "payment_intent.succeeded",
        "data": {"object": {"id": pi, "object": "payment_intent", "customer": customer, "amount": amount, "amount_received": amount}}})
    .to_string()
    .into_bytes()
}

pub fn charge_refunded(event_id: &str, charge: &str, customer: &str, refunds: &[(&str, i64)]) -> Vec<u8> {
    let data: Vec<_> = refunds.iter().map(|(id, a)| json!({"id": id, "object": "refund", "amount": a})).collect();
    json!({"id": event_id, "object": "event", "type": "charge.refunded",
        "data": {"object": {"id": charge, "object": "charge", "customer": customer, "refunds": {"object": "list", "data": data}}}})
    .to_string()
    .into_bytes()
}

pub fn seats(account: &str, generation: i64, revision: i64, seats: i64) -> Vec<u8> {
    json!({"type": "seats.snapshot", "data": {"account": account, "generation": generation, "revision": revision, "seats": seats}})
        .to_string()
        .into_bytes()
}

pub fn ses(sns_message_id: &str, mail_id: &str, status: &str) -> Vec<u8> {
    let message = json!({"eventType": status, "mail": {"messageId": mail_id, "destination": ["someone@example.com"]}});
    json!({"Type": "Notification", "MessageId": sns_message_id, "Message": message.to_string()})
        .to_string()
        .into_bytes()
}

pub fn sub_updated(event_id: &str, sub: &str, customer: &str) -> Vec<u8> {
    json!({"id": event_id, "object": "event", "type": "customer.subscription.updated",
        "data": {"object": {"id": sub, "object": "subscription", "customer": customer, "status": "active", "quantity": 1}}})
    .to_string()
    .into_bytes()
}

pub fn inventory(sku: &str, seq: i64, delta: i64) -> Vec<u8> {
    json!({"type": "inventory.adjusted", "data": {"sku": sku, "seq": seq, "delta": delta}}).to_string().into_bytes()
}

fn now_ms() -> i64 {
    now_s() * 1000
}

async fn stripe_source() -> (Arc<FakeStripe>, Arc<dyn SubscriptionSource>) {
    let (fake, base) = FakeStripe::start().await;
    let api = StripeApi::new(base, Secret::new("sk_test_fake")).unwrap();
    (fake, Arc::new(api))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicate_deliveries_give_one_effect() {
    let stack = Stack::new().await;
    stack.map_customer("cus_1", "acct_1").await;
    let key = stack
        .claim("stripe", "stripe-a", "evt_pay1", None, &pi_succeeded("evt_pay1", "pi_1", Some("cus_1"), 500))
        .await;
    let p = Arc::new(stack.processor(fast_settings(), None, None));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (p, key) = (p.clone(), key.clone());
            tokio::spawn(async move { p.process(&key, now_ms()).await.unwrap().outcome })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Applied).count(), 1, "{outcomes:?}");
    assert!(
        outcomes.iter().all(|o| matches!(o, Outcome::Applied | Outcome::Busy | Outcome::AlreadyFinal)),
        "{outcomes:?}"
    );
    let balance = stack.state(&balance_pk("t1", "acct_1")).await.unwrap();
    assert_eq!((n(&balance, "balance"), n(&balance, "entries")), (500, 1));
}

#[tokio::test]
async fn processed_duplicate_is_acknowledged_without_reapplying() {
    let stack = Stack::new().await;
    stack.map_customer("cus_1", "acct_1").await;
    let p = stack.processor(fast_settings(), None, None);
    let key = stack
        .claim("stripe", "stripe-a", "evt_pay2", None, &pi_succeeded("evt_pay2", "pi_2", Some("cus_1"), 700))
        .await;
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Applied);
    let again = p.process(&key, now_ms()).await.unwrap();
    assert_eq!((again.outcome, again.retry_after_ms), (Outcome::AlreadyFinal, None));
    // A different event about the same payment (same business identity).
    let other = stack
        .claim("stripe", "stripe-a", "evt_pay2b", None, &pi_succeeded("evt_pay2b", "pi_2", Some("cus_1"), 700))
        .await;
    assert_eq!(p.process(&other, now_ms()).await.unwrap().outcome, Outcome::Duplicate);
    assert_eq!(n(&stack.state(&balance_pk("t1", "acct_1")).await.unwrap(), "balance"), 700);
    assert_eq!(s(&stack.record(&other).await, "outcome"), "duplicate");
}

#[tokio::test]
async fn failure_after_the_claim_leaves_the_event_retryable() {
    let stack = Stack::new().await;
    stack.map_customer("cus_9", "acct_9").await;
    let (fake, source) = stripe_source().await;
    fake.set("sub_9", "cus_9", "active", 4);
    fake.fail.store(true, Ordering::SeqCst);
    let p = stack.processor(fast_settings(), Some(source), None);
    let key = stack.claim("stripe", "stripe-a", "evt_sub9", None, &sub_updated("evt_sub9", "sub_9", "cus_9")).await;

    let first = p.process(&key, now_ms()).await.unwrap();
    assert_eq!(first.outcome, Outcome::Retrying);
    let delay = first.retry_after_ms.unwrap();
    let rec = stack.record(&key).await;
    assert_eq!((s(&rec, "status").as_str(), s(&rec, "error_code").as_str()), ("RETRYABLE", "unavailable"));
    assert!(n(&rec, "next_attempt_at") > now_ms() - 1000);
    assert!(stack.state(&entitlement_pk("t1", "sub_9")).await.is_none(), "nothing mutated");

    // Not due yet: left alone. Due, provider back: applied.
    assert_eq!(p.process(&key, n(&rec, "next_attempt_at") - 1).await.unwrap().outcome, Outcome::NotDue);
    fake.fail.store(false, Ordering::SeqCst);
    let later = p.process(&key, now_ms() + delay + 2_000).await.unwrap();
    assert_eq!(later.outcome, Outcome::Applied);
    let ent = stack.state(&entitlement_pk("t1", "sub_9")).await.unwrap();
    assert_eq!((s(&ent, "status").as_str(), n(&ent, "seats")), ("active", 4));
    assert_eq!(n(&stack.record(&key).await, "attempts"), 2);
}

/// An active entitlement is the revision guard: it never expires and stays
/// in the re-check partition. One of a canceled or deleted subscription
/// leaves the re-check partition at once (nothing left to drift) and
/// expires after the retention.
#[tokio::test]
async fn an_ended_subscriptions_entitlement_leaves_the_rechecks_and_expires_after_the_retention() {
    let stack = Stack::new().await;
    stack.map_customer("cus_e", "acct_e").await;
    let (fake, source) = stripe_source().await;
    let p = stack.processor(fast_settings(), Some(source), None);
    fake.set("sub_e", "cus_e", "active", 2);
    let key = stack.claim("stripe", "stripe-a", "evt_e1", None, &sub_updated("evt_e1", "sub_e", "cus_e")).await;
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Applied);
    let active = stack.state(&entitlement_pk("t1", "sub_e")).await.unwrap();
    assert!(active.contains_key("due_shard") && !active.contains_key("expires_at"), "{active:?}");

    fake.set("sub_e", "cus_e", "canceled", 0);
    let key = stack.claim("stripe", "stripe-a", "evt_e2", None, &sub_updated("evt_e2", "sub_e", "cus_e")).await;
    let at = now_ms();
    assert_eq!(p.process(&key, at).await.unwrap().outcome, Outcome::Applied);
    let ended = stack.state(&entitlement_pk("t1", "sub_e")).await.unwrap();
    assert_eq!(s(&ended, "status"), "canceled");
    assert!(!ended.contains_key("due_shard") && !ended.contains_key("due_at"), "left the re-checks: {ended:?}");
    let retention_s = i64::from(fast_settings().retention_days) * 86_400;
    let expires = n(&ended, "expires_at");
    assert!((at / 1000 + retention_s - 60..=at / 1000 + retention_s + 60).contains(&expires), "{expires}");
}

#[tokio::test]
async fn crash_after_domain_commit_before_acknowledgement_converges() {
    let stack = Stack::new().await;
    stack.map_customer("cus_c", "acct_c").await;
    let (fake, source) = stripe_source().await;
    fake.set("sub_c", "cus_c", "active", 3);
    let (topic, inbox) = stack.notify_topic().await;
    let mut crashing = stack.processor(fast_settings(), Some(source.clone()), Some(topic.clone()));
    crashing.fault = ProcessorFault::AfterCommit;
    let key = stack.claim("stripe", "stripe-a", "evt_crash", None, &sub_updated("evt_crash", "sub_c", "cus_c")).await;
    assert!(crashing.process(&key, now_ms()).await.is_err(), "the worker died after its commit");

    // The message comes back; a healthy worker sees the outcome is known.
    let healthy = stack.processor(fast_settings(), Some(source), Some(topic));
    assert_eq!(healthy.process(&key, now_ms()).await.unwrap().outcome, Outcome::AlreadyFinal);
    assert_eq!(s(&stack.record(&key).await, "status"), "PROCESSED");
    assert_eq!(n(&stack.state(&entitlement_pk("t1", "sub_c")).await.unwrap(), "seats"), 3);
    // The notification of the change went before the completion, under the
    // lease: sent once already; the sweep finds nothing to send.
    assert_eq!(stack.drain(&inbox).await.len(), 1);
    let sweeper =
        hookledger::wiring::dispatcher(stack.ddb.clone(), aws_sdk_sns::Client::new(&stack.aws), stack.table.clone());
    let lapsed = now_ms() + hookledger::message::DISPATCH_LEASE_MS + 1;
    assert_eq!(sweeper.sweep(16, lapsed, 0, 100).await.unwrap(), 0);
    assert!(stack.drain(&inbox).await.is_empty(), "once");
}

#[tokio::test]
async fn older_event_after_newer_state_does_not_regress() {
    let stack = Stack::new().await;
    let p = stack.processor(fast_settings(), None, None);
    let newer = stack.claim("standard_webhooks", "svix", "msg_r3", None, &seats("acct_s", 1, 3, 20)).await;
    let older = stack.claim("standard_webhooks", "svix", "msg_r1", None, &seats("acct_s", 1, 1, 10)).await;
    assert_eq!(p.process(&newer, now_ms()).await.unwrap().outcome, Outcome::Applied);
    assert_eq!(p.process(&older, now_ms()).await.unwrap().outcome, Outcome::Stale);
    let st = stack.state(&seats_pk("t1", "acct_s")).await.unwrap();
    assert_eq!((n(&st, "seats"), n(&st, "revision")), (20, 3));
    // A recreated object (next generation) restarts its revisions and is not suppressed.
    let reborn = stack.claim("standard_webhooks", "svix", "msg_g2r1", None, &seats("acct_s", 2, 1, 5)).await;
    assert_eq!(p.process(&reborn, now_ms()).await.unwrap().outcome, Outcome::Applied);
    assert_eq!(n(&stack.state(&seats_pk("t1", "acct_s")).await.unwrap(), "seats"), 5);

    // Status precedence: a late Delivery does not overwrite a Bounce.
    let bounce = stack.claim("sns", "ses", "sns-b", Some("ses.Bounce"), &ses("sns-b", "mail-1", "Bounce")).await;
    let delivery = stack.claim("sns", "ses", "sns-d", Some("ses.Delivery"), &ses("sns-d", "mail-1", "Delivery")).await;
    assert_eq!(p.process(&bounce, now_ms()).await.unwrap().outcome, Outcome::Applied);
    assert_eq!(p.process(&delivery, now_ms()).await.unwrap().outcome, Outcome::Stale);
    assert_eq!(s(&stack.state(&email_pk("t1", "mail-1")).await.unwrap(), "status"), "Bounce");
}

#[tokio::test]
async fn racing_fetches_cannot_regress_a_change_notification_projection() {
    let stack = Stack::new().await;
    stack.map_customer("cus_r", "acct_r").await;
    let (fake, source) = stripe_source().await;
    let p = stack.processor(fast_settings(), Some(source.clone()), None);
    // Worker A fetched the old state early; worker B fetched the new state later but commits first.
    fake.set("sub_r", "cus_r", "trialing", 1);
    let early = source.subscription("sub_r").await.unwrap();
    fake.set("sub_r", "cus_r", "active", 9);
    let key = stack.claim("stripe", "stripe-a", "evt_r2", None, &sub_updated("evt_r2", "sub_r", "cus_r")).await;
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Applied);
    // A's late write, with its earlier fetch version, is refused by the guard.
    let late = hookledger::projection::snapshot::replace_if_newer(
        &entitlement_pk("t1", "sub_r"),
        hookledger::projection::snapshot::Version { generation: 0, revision: early.version },
        hookledger::projection::Item::from([("status".to_owned(), hookledger::projection::s("trialing"))]),
    );
    let refused = hookledger::adapters::dynamodb::item::apply(&stack.ddb, &stack.table, &late.writes[0]).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("ConditionalCheckFailed")), "the guard refuses it");
    assert_eq!(s(&stack.state(&entitlement_pk("t1", "sub_r")).await.unwrap(), "status"), "active");
}

#[tokio::test]
async fn unknown_subject_is_parked_without_mutation() {
    let stack = Stack::new().await;
    let p = stack.processor(fast_settings(), None, None);
    let body = std::fs::read(support::testdata("providers/stripe/events/payment_intent.succeeded.json")).unwrap();
    let key = stack.claim("stripe", "stripe-a", "evt_fixture_pi", None, &body).await;
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Parked);
    let unmapped = stack
        .claim(
            "stripe",
            "stripe-a",
            "evt_unmapped",
            None,
            &pi_succeeded("evt_unmapped", "pi_u", Some("cus_nobody"), 100),
        )
        .await;
    assert_eq!(p.process(&unmapped, now_ms()).await.unwrap().outcome, Outcome::Parked);
    let rec = stack.record(&unmapped).await;
    assert_eq!(s(&rec, "status"), "PARKED");
    assert!(s(&rec, "park_reason").contains("cus_nobody"));
    assert!(!rec.contains_key("due_shard"), "parked records leave the re-drive index");
    assert!(stack.items().await.iter().all(|i| !s(i, "pk").starts_with("proj#")), "nothing mutated");
    assert_eq!(p.process(&unmapped, now_ms()).await.unwrap().outcome, Outcome::AlreadyFinal);
}

#[tokio::test]
async fn permanent_malformed_payload_goes_dead_without_retry() {
    let stack = Stack::new().await;
    let p = stack.processor(fast_settings(), None, None);
    let not_json = stack.claim("standard_webhooks", "svix", "msg_bin", None, &[0xff, 0x00, 0x80]).await;
    let r = p.process(&not_json, now_ms()).await.unwrap();
    assert_eq!((r.outcome, r.retry_after_ms), (Outcome::Dead, None));
    let rec = stack.record(&not_json).await;
    assert_eq!(
        (s(&rec, "status").as_str(), s(&rec, "dead_reason").as_str(), n(&rec, "attempts")),
        ("DEAD", "malformed_payload", 1)
    );
    let no_revision = json!({"type": "seats.snapshot", "data": {"account": "a", "seats": 3}}).to_string();
    let key = stack.claim("standard_webhooks", "svix", "msg_norev", None, no_revision.as_bytes()).await;
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Dead);
    assert_eq!(s(&stack.record(&key).await, "dead_reason"), "unsupported_event");
}

/// A projection whose business rule keeps failing with a retryable error of
/// its own: what the attempt budget is for.
pub struct RuleFails;

impl Projection for RuleFails {
    fn name(&self) -> &'static str {
        "rule_fails"
    }

    fn handles(&self, _provider: &str, event_type: &str) -> bool {
        event_type == "customer.subscription.updated"
    }

    fn plan<'a>(&'a self, _: &'a EventContext, _: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async { Err(ProjectionError::Transient("credit check refused: account on hold".into())) })
    }
}

/// The reference projections plus [`RuleFails`].
pub fn failing_rules(source: Option<Arc<dyn SubscriptionSource>>) -> Registry {
    hookledger_app::reference_registry(source, None).register(RuleFails)
}

#[tokio::test]
async fn exhausted_attempts_end_in_a_visible_dead_letter() {
    let stack = Stack::new().await;
    stack.map_customer("cus_x", "acct_x").await;
    let (fake, source) = stripe_source().await;
    let settings = ProcessorSettings { max_attempts: 3, ..fast_settings() };
    let p = hookledger::wiring::processor(stack.ledger(), failing_rules(Some(source)), None, settings);
    let key = stack.claim("stripe", "stripe-a", "evt_x", None, &sub_updated("evt_x", "sub_x", "cus_x")).await;
    let mut now = now_ms();
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let r = p.process(&key, now).await.unwrap();
        outcomes.push(r.outcome);
        now += r.retry_after_ms.unwrap_or(0) + 1;
    }
    assert_eq!(
        outcomes,
        [Outcome::Retrying, Outcome::Retrying, Outcome::Dead, Outcome::AlreadyFinal, Outcome::AlreadyFinal]
    );
    let rec = stack.record(&key).await;
    assert_eq!(
        (s(&rec, "status").as_str(), s(&rec, "dead_reason").as_str(), n(&rec, "attempts")),
        ("DEAD", "attempts_exhausted", 3)
    );
    assert_eq!(n(&rec, "failures"), 2, "the third failure dead-lettered it");
    assert!(s(&rec, "error_message").contains("account on hold"), "{rec:?}");
    assert_eq!(fake.requests.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_and_the_late_commit_is_fenced() {
    let stack = Stack::new().await;
    stack.map_customer("cus_l", "acct_l").await;
    let key = stack
        .claim("stripe", "stripe-a", "evt_lease", None, &pi_succeeded("evt_lease", "pi_l", Some("cus_l"), 250))
        .await;
    let ledger = stack.ledger();
    // Worker A leases for 1 ms and stalls.
    let t0 = now_ms();
    assert!(matches!(ledger.lease(&key, "worker-a", t0, 1).await.unwrap(), hookledger::ledger::LeaseResult::Leased(_)));
    // Worker B finds the lease expired, takes over and completes.
    let p = stack.processor(fast_settings(), None, None);
    assert_eq!(p.process(&key, t0 + 10).await.unwrap().outcome, Outcome::Applied);
    // A wakes up and tries to commit the same effect: the fence refuses it.
    let op = hookledger::projection::additive::apply_once(
        &entry_pk("t1", "pi_l_again"),
        Default::default(),
        &balance_pk("t1", "acct_l"),
        "balance",
        250,
    );
    let late = ledger.commit(&key, "worker-a", &[op], "applied", None, t0 + 20).await.unwrap();
    assert_eq!(late, hookledger::ledger::CommitResult::Fenced);
    assert!(!crate::support::retry(&ledger, &key, "worker-a", t0, "x", "y").await, "nor can it move the record");
    assert_eq!(n(&stack.state(&balance_pk("t1", "acct_l")).await.unwrap(), "balance"), 250);
    assert_eq!(n(&stack.record(&key).await, "attempts"), 2);
}

#[tokio::test]
async fn sequence_gaps_are_deferred_then_applied_in_order_or_parked_after_the_bound() {
    let stack = Stack::new().await;
    let p = stack.processor(fast_settings(), None, None);
    let s2 = stack.claim("standard_webhooks", "svix", "inv-2", None, &inventory("sku-1", 2, -3)).await;
    let s1 = stack.claim("standard_webhooks", "svix", "inv-1", None, &inventory("sku-1", 1, 10)).await;
    let deferred = p.process(&s2, now_ms()).await.unwrap();
    assert_eq!(deferred.outcome, Outcome::Retrying);
    assert_eq!(s(&stack.record(&s2).await, "error_code"), "gap");
    assert_eq!(p.process(&s1, now_ms()).await.unwrap().outcome, Outcome::Applied);
    assert_eq!(
        p.process(&s2, now_ms() + deferred.retry_after_ms.unwrap() + 1).await.unwrap().outcome,
        Outcome::Applied
    );
    let st = stack.state(&inventory_pk("t1", "sku-1")).await.unwrap();
    assert_eq!((n(&st, "on_hand"), n(&st, "last_seq")), (7, 2));
    // A repeat of seq 1 is ignored; a gap that never closes ends PARKED ("gap") at its time bound.
    let dup = stack.claim("standard_webhooks", "svix", "inv-1-again", None, &inventory("sku-1", 1, 10)).await;
    assert_eq!(p.process(&dup, now_ms()).await.unwrap().outcome, Outcome::Ignored);
    let orphan = stack.claim("standard_webhooks", "svix", "inv-9", None, &inventory("sku-1", 9, 1)).await;
    let mut now = now_ms();
    for _ in 0..5 {
        let r = p.process(&orphan, now).await.unwrap();
        assert_eq!(r.outcome, Outcome::Retrying);
        now += r.retry_after_ms.unwrap_or(0) + 1;
    }
    let r = p.process(&orphan, now + fast_settings().gap_bound_ms).await.unwrap();
    assert_eq!(r.outcome, Outcome::Parked);
    assert_eq!(s(&stack.record(&orphan).await, "park_reason"), "gap");
    assert_eq!(n(&stack.state(&inventory_pk("t1", "sku-1")).await.unwrap(), "on_hand"), 7);
}

#[tokio::test]
async fn refunds_listed_again_are_applied_once_each() {
    let stack = Stack::new().await;
    stack.map_customer("cus_f", "acct_f").await;
    let p = stack.processor(fast_settings(), None, None);
    let pay =
        stack.claim("stripe", "stripe-a", "evt_f0", None, &pi_succeeded("evt_f0", "pi_f", Some("cus_f"), 1000)).await;
    let r1 = stack
        .claim("stripe", "stripe-a", "evt_f1", None, &charge_refunded("evt_f1", "ch_f", "cus_f", &[("re_1", 100)]))
        .await;
    let r2 = stack
        .claim(
            "stripe",
            "stripe-a",
            "evt_f2",
            None,
            &charge_refunded("evt_f2", "ch_f", "cus_f", &[("re_1", 100), ("re_2", 250)]),
        )
        .await;
    for k in [&r2, &pay, &r1] {
        p.process(k, now_ms()).await.unwrap();
    }
    assert_eq!(s(&stack.record(&r1).await, "outcome"), "duplicate", "re_1 came with the later event already");
    let b = stack.state(&balance_pk("t1", "acct_f")).await.unwrap();
    assert_eq!((n(&b, "balance"), n(&b, "entries")), (650, 3));
}

#[tokio::test]
async fn outbox_crash_between_publish_and_mark_republishes_with_the_same_key() {
    let stack = Stack::new().await;
    stack.map_customer("cus_o", "acct_o").await;
    let (fake, source) = stripe_source().await;
    fake.set("sub_o", "cus_o", "active", 2);
    let (topic, inbox) = stack.notify_topic().await;
    let p = stack.processor(fast_settings(), Some(source), Some(topic));
    // A dispatcher that dies between publish and mark.
    let mut dying =
        hookledger::wiring::dispatcher(stack.ddb.clone(), aws_sdk_sns::Client::new(&stack.aws), stack.table.clone());
    dying.fault = DispatchFault::AfterPublishBeforeMark;
    let key = stack.claim("stripe", "stripe-a", "evt_o", None, &sub_updated("evt_o", "sub_o", "cus_o")).await;
    assert_eq!(p.process(&key, now_ms()).await.unwrap().outcome, Outcome::Applied);
    let first = stack.drain(&inbox).await;
    assert_eq!(first.len(), 1, "published once by the processor");

    // Re-open the item as a dispatcher crash would have left it, then sweep.
    let outbox_pk = stack.items().await.into_iter().map(|i| s(&i, "pk")).find(|pk| pk.starts_with("outbox#")).unwrap();
    stack
        .ddb
        .update_item()
        .table_name(&stack.table)
        .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(outbox_pk.clone()))
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("outbox".into()))
        .update_expression("SET #s = :p, due_shard = :d, due_at = :t")
        .expression_attribute_names("#s", "status")
        .expression_attribute_values(":p", aws_sdk_dynamodb::types::AttributeValue::S("PENDING".into()))
        .expression_attribute_values(":d", aws_sdk_dynamodb::types::AttributeValue::S("out#000".into()))
        .expression_attribute_values(":t", aws_sdk_dynamodb::types::AttributeValue::N("0".into()))
        .send()
        .await
        .unwrap();
    assert!(dying.dispatch(&outbox_pk, now_ms()).await.is_err(), "published, then died before marking");
    // Within the dispatch lease nobody republishes; after it, the sweeper does, with the same key.
    let sweeper =
        hookledger::wiring::dispatcher(stack.ddb.clone(), aws_sdk_sns::Client::new(&stack.aws), stack.table.clone());
    assert_eq!(sweeper.sweep(1, now_ms(), 0, 10).await.unwrap(), 0);
    assert_eq!(sweeper.sweep(1, now_ms() + hookledger::outbox::DISPATCH_LEASE_MS + 1, 0, 10).await.unwrap(), 1);
    let repeats = stack.drain(&inbox).await;
    assert_eq!(repeats.len(), 2, "the crashed publish and the sweeper's");
    let keys: Vec<String> = first
        .iter()
        .chain(repeats.iter())
        .map(|b| {
            serde_json::from_str::<serde_json::Value>(b).unwrap()["MessageAttributes"]["idempotency-key"]["Value"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "one idempotency key for every copy: {keys:?}");
    assert_eq!(keys[0], hookledger::projection::fetch::idempotency_key(key.as_str(), "subscription.changed"));
}

/// Seed 001 on the real path: every arrival order of the three revisions and
/// all 72 duplicate insertions, delivered through the ledger and processor,
/// end at the intended 20 seats.
#[tokio::test]
async fn seed_001_orders_and_duplicate_insertions_converge_through_the_processor() {
    use hookledger::seed001::{INTENDED, duplicate_extensions, permutations};
    let stack = Stack::new().await;
    let p = stack.processor(fast_settings(), None, None);
    let mut runs = 0;
    for (i, seq) in permutations().into_iter().chain(duplicate_extensions()).enumerate() {
        let account = format!("acct_seed_{i}");
        for e in &seq {
            let id = format!("{}-{i}", e.event_id);
            let key =
                stack.claim("standard_webhooks", "svix", &id, None, &seats(&account, 0, e.revision, e.seats)).await;
            let r = p.process(&key, now_ms()).await.unwrap();
            assert!(matches!(r.outcome, Outcome::Applied | Outcome::Stale | Outcome::AlreadyFinal), "{r:?}");
        }
        assert_eq!(n(&stack.state(&seats_pk("t1", &account)).await.unwrap(), "seats"), INTENDED, "{seq:?}");
        runs += 1;
    }
    assert_eq!(runs, 6 + 72);
}

// --- lost acknowledgements: a writer recognises its own token -------------

/// The SDK retries a request whose response was lost; the retry meets the
/// write it already made. Performing the same write twice with the same
/// token is exactly that retry.
#[tokio::test]
async fn a_lease_retried_after_its_lost_acknowledgement_is_still_ours() {
    use hookledger::ledger::LeaseResult;
    let stack = Stack::new().await;
    stack.map_customer("cus_ack", "acct_ack").await;
    let key = stack
        .claim("stripe", "stripe-a", "evt_ack", None, &pi_succeeded("evt_ack", "pi_ack", Some("cus_ack"), 5))
        .await;
    let ledger = stack.ledger();
    let t0 = now_ms();
    assert!(matches!(ledger.lease(&key, "tok-1", t0, 30_000).await.unwrap(), LeaseResult::Leased(_)));
    let again = ledger.lease(&key, "tok-1", t0, 30_000).await.unwrap();
    assert!(matches!(&again, LeaseResult::Leased(r) if r.attempts == 1), "our own lease, not Busy: {again:?}");
    assert_eq!(n(&stack.record(&key).await, "attempts"), 1, "no attempt burned");
    // A stranger still finds it busy.
    assert!(matches!(ledger.lease(&key, "tok-2", t0 + 1, 30_000).await.unwrap(), LeaseResult::Busy { .. }));
}

#[tokio::test]
async fn transitions_retried_after_their_lost_acknowledgement_are_not_fenced() {
    let stack = Stack::new().await;
    let ledger = stack.ledger();
    let t0 = now_ms();
    let keys = [
        stack.claim("standard_webhooks", "svix", "ack-retry", None, &inventory("sku-ack", 1, 1)).await,
        stack.claim("standard_webhooks", "svix", "ack-dead", None, &inventory("sku-ack", 2, 1)).await,
        stack.claim("standard_webhooks", "svix", "ack-park", None, &inventory("sku-ack", 3, 1)).await,
    ];
    for (i, key) in keys.iter().enumerate() {
        let tok = format!("tok-{i}");
        ledger.lease(key, &tok, t0, 30_000).await.unwrap();
        for round in 0..2 {
            let ok = match i {
                0 => {
                    let exit =
                        Exit::Retry { next_at_ms: t0 + 60_000, code: "projection", message: "boom", failure: false };
                    ledger.leave(key, &tok, &exit, t0).await.unwrap()
                }
                1 => ledger
                    .leave(key, &tok, &Exit::Dead { reason: "malformed_payload", message: "bad" }, t0)
                    .await
                    .unwrap(),
                _ => {
                    ledger.leave(key, &tok, &Exit::Park { reason: "unknown subject", subject: None }, t0).await.unwrap()
                }
            };
            assert!(ok, "{key}: round {round} must recognise its own transition");
        }
        // A stranger's token is still fenced.
        let exit = Exit::Retry { next_at_ms: t0, code: "x", message: "y", failure: false };
        assert!(!ledger.leave(key, "stranger", &exit, t0).await.unwrap());
    }
    let mut statuses = Vec::new();
    for k in &keys {
        statuses.push(s(&stack.record(k).await, "status"));
    }
    assert_eq!(statuses, ["RETRYABLE", "DEAD", "PARKED"]);
}

// --- sequence gaps: bounded by time, parked at the bound, woken when closed --

#[tokio::test]
async fn a_gap_is_bounded_by_time_not_attempts_and_parks_at_the_bound() {
    let stack = Stack::new().await;
    let p = stack.processor(fast_settings(), None, None);
    let orphan = stack.claim("standard_webhooks", "svix", "gap-3", None, &inventory("sku-gap", 3, 5)).await;
    let received = n(&stack.record(&orphan).await, "received_at");
    // Far more deferrals than max_attempts (5), all within the default 1-hour bound.
    let mut now = received;
    for i in 0..12 {
        let r = p.process(&orphan, now).await.unwrap();
        assert_eq!(r.outcome, Outcome::Retrying, "deferral {i}");
        now += r.retry_after_ms.unwrap() + 1;
    }
    let rec = stack.record(&orphan).await;
    assert_eq!((s(&rec, "status").as_str(), s(&rec, "error_code").as_str()), ("RETRYABLE", "gap"));
    // At the bound: PARKED with reason `gap`, not DEAD.
    let r = p.process(&orphan, received + 3_600_000 + 1).await.unwrap();
    assert_eq!((r.outcome, r.retry_after_ms), (Outcome::Parked, None));
    let rec = stack.record(&orphan).await;
    assert_eq!((s(&rec, "status").as_str(), s(&rec, "park_reason").as_str()), ("PARKED", "gap"));
    assert!(!rec.contains_key("due_shard"));

    // The predecessors arrive late: the parked waiter is revived and applies in order.
    let s1 = stack.claim("standard_webhooks", "svix", "gap-1", None, &inventory("sku-gap", 1, 10)).await;
    let s2 = stack.claim("standard_webhooks", "svix", "gap-2", None, &inventory("sku-gap", 2, 20)).await;
    let later = received + 4_000_000;
    assert_eq!(p.process(&s1, later).await.unwrap().outcome, Outcome::Applied);
    assert_eq!(p.process(&s2, later).await.unwrap().outcome, Outcome::Applied);
    let rec = stack.record(&orphan).await;
    assert_eq!(s(&rec, "status"), "RETRYABLE", "seq 2's commit re-drives the waiter for seq 3: {rec:?}");
    assert_eq!(p.process(&orphan, later + 1).await.unwrap().outcome, Outcome::Applied);
    let st = stack.state(&inventory_pk("t1", "sku-gap")).await.unwrap();
    assert_eq!((n(&st, "on_hand"), n(&st, "last_seq")), (35, 3));
}

#[tokio::test]
async fn a_closed_gap_makes_its_waiters_due_at_once() {
    let stack = Stack::new().await;
    // Long deferral delays: only the wake-up can make the waiters due soon.
    let settings = ProcessorSettings { backoff: Backoff { base_ms: 60_000, max_ms: 300_000 }, ..fast_settings() };
    let queue = hookledger::adapters::sqs::SqsQueue::new(stack.sqs.clone(), &stack.queue_url);
    let p = stack.processor(settings, None, None).with_queue(queue);
    let s3 = stack.claim("standard_webhooks", "svix", "wake-3", None, &inventory("sku-wake", 3, 3)).await;
    let s2 = stack.claim("standard_webhooks", "svix", "wake-2", None, &inventory("sku-wake", 2, 2)).await;
    let s1 = stack.claim("standard_webhooks", "svix", "wake-1", None, &inventory("sku-wake", 1, 1)).await;
    let t = now_ms();
    for k in [&s3, &s2] {
        let r = p.process(k, t).await.unwrap();
        assert_eq!(r.outcome, Outcome::Retrying);
        assert!(r.retry_after_ms.unwrap() >= 30_000);
    }
    assert_eq!(p.process(&s1, t + 10).await.unwrap().outcome, Outcome::Applied);
    assert!(n(&stack.record(&s2).await, "next_attempt_at") <= t + 10, "seq 1's commit made seq 2 due");
    assert_eq!(stack.drain_queue().await, [crate::sqs_handler::work(&s2)], "and queued it at once");
    assert_eq!(p.process(&s2, t + 20).await.unwrap().outcome, Outcome::Applied);
    assert!(n(&stack.record(&s3).await, "next_attempt_at") <= t + 20, "seq 2's commit made seq 3 due");
    assert_eq!(p.process(&s3, t + 30).await.unwrap().outcome, Outcome::Applied);
    let st = stack.state(&inventory_pk("t1", "sku-wake")).await.unwrap();
    assert_eq!((n(&st, "on_hand"), n(&st, "last_seq")), (6, 3));
}

// --- transient faults: bounded by time, not by the attempt budget ----------

#[tokio::test]
async fn transient_faults_do_not_spend_the_attempt_budget() {
    let stack = Stack::new().await;
    stack.map_customer("cus_t", "acct_t").await;
    let (fake, source) = stripe_source().await;
    fake.set("sub_t", "cus_t", "active", 7);
    let settings = ProcessorSettings { max_attempts: 3, ..fast_settings() };
    let p = stack.processor(settings, Some(source), None);
    let key = stack.claim("stripe", "stripe-a", "evt_t", None, &sub_updated("evt_t", "sub_t", "cus_t")).await;
    let ledger = stack.ledger();

    // The provider answers 503 six times (twice the budget).
    fake.fail.store(true, Ordering::SeqCst);
    let mut now = now_ms();
    for i in 0..6 {
        let r = p.process(&key, now).await.unwrap();
        assert_eq!(r.outcome, Outcome::Retrying, "outage {i}");
        now += r.retry_after_ms.unwrap() + 1;
    }
    // Four workers crash while holding the lease (it expires each time).
    for i in 0..4 {
        let leased = ledger.lease(&key, &format!("crashed-{i}"), now, 1).await.unwrap();
        assert!(matches!(leased, hookledger::ledger::LeaseResult::Leased(_)), "{leased:?}");
        now += 2;
    }
    let rec = stack.record(&key).await;
    assert_eq!(n(&rec, "attempts"), 10, "every lease is still counted as evidence");
    assert_ne!(s(&rec, "status"), "DEAD");

    // The provider is back: the event applies, it was never dead.
    fake.fail.store(false, Ordering::SeqCst);
    assert_eq!(p.process(&key, now).await.unwrap().outcome, Outcome::Applied);
    assert_eq!(n(&stack.state(&entitlement_pk("t1", "sub_t")).await.unwrap(), "seats"), 7);
}

#[tokio::test]
async fn transient_faults_are_bounded_by_time_since_receipt() {
    let stack = Stack::new().await;
    stack.map_customer("cus_tb", "acct_tb").await;
    let (fake, source) = stripe_source().await;
    fake.fail.store(true, Ordering::SeqCst);
    let p = stack.processor(fast_settings(), Some(source), None);
    let six_hours = 6 * 3_600_000;

    // A provider outage longer than the bound.
    let key = stack.claim("stripe", "stripe-a", "evt_tb", None, &sub_updated("evt_tb", "sub_tb", "cus_tb")).await;
    let received = n(&stack.record(&key).await, "received_at");
    assert_eq!(p.process(&key, received).await.unwrap().outcome, Outcome::Retrying);
    let r = p.process(&key, received + six_hours + 1).await.unwrap();
    assert_eq!(r.outcome, Outcome::Dead);
    let rec = stack.record(&key).await;
    assert_eq!((s(&rec, "status").as_str(), s(&rec, "dead_reason").as_str()), ("DEAD", "transient_exhausted"));

    // A record whose workers keep dying (expired leases) is bounded the same way.
    stack.map_customer("cus_ok2", "acct_ok2").await;
    let crashy = stack
        .claim("stripe", "stripe-a", "evt_crashy", None, &pi_succeeded("evt_crashy", "pi_cr", Some("cus_ok2"), 1))
        .await;
    stack.ledger().lease(&crashy, "crashed", received, 1).await.unwrap();
    assert_eq!(p.process(&crashy, received + six_hours + 1).await.unwrap().outcome, Outcome::Dead);
    assert_eq!(s(&stack.record(&crashy).await, "dead_reason"), "transient_exhausted");
}
