//! The intake's known defects under faults, one named test each: a claim
//! that loses its acknowledgement, and every path that could answer 2xx
//! without a durable payload.

use hookledger::identity::EventKey;
use hookledger_it::faults::{Fault, Rule};

use crate::explore::{Delivery, World};
use crate::processor::pi_succeeded;
use crate::support::s;

fn payment(id: &str, body: Vec<u8>) -> Delivery {
    Delivery { endpoint: "stripe-a", event_id: id.into(), body }
}

async fn mapped_world() -> World {
    let w = World::new(1).await;
    crate::support::map_subject(&w.stack.ddb, &w.stack.table, "stripe", "tenant-a", "cus_x", "acct_x").await.unwrap();
    w
}

/// The claim of a small payload: the PutItem that writes the record (with its send token and the payload).
fn claim_rule(fault: Fault) -> Rule {
    Rule::new(fault).on("dynamodb", "PutItem").containing("send_token").nth(0)
}

/// Stored payload copies (in a record, or in a payload item).
async fn payload_items(w: &World) -> usize {
    crate::support::payload_copies(&w.stack.items().await).len()
}

async fn status(w: &World, key: &EventKey) -> String {
    w.meta(key).await.map(|m| s(&m, "status")).unwrap_or_default()
}

#[tokio::test]
async fn a_claim_retried_after_a_lost_ack_is_recognised_as_its_own() {
    let mut w = mapped_world().await;
    let d = payment("evt_lost_ack", pi_succeeded("evt_lost_ack", "pi_1", Some("cus_x"), 500));
    w.plan.arm(claim_rule(Fault::LoseAck));
    let answer = w.deliver(d.clone(), 0).await;
    assert_eq!(w.plan.injected().get("lost_ack"), Some(&1), "the fault fired");
    assert_eq!(answer, Some(202), "a new event, not a duplicate");
    assert_eq!(payload_items(&w).await, 1, "payload stored");
    assert_eq!(w.stack.drain_queue().await.len(), 1, "key enqueued");
    assert!(w.violations.is_empty(), "{:?}", w.violations);
}

#[tokio::test]
async fn a_claim_that_loses_every_ack_answers_503_and_the_retry_within_the_lease_sends() {
    let mut w = mapped_world().await;
    let d = payment("evt_all_lost", pi_succeeded("evt_all_lost", "pi_2", Some("cus_x"), 500));
    w.plan.arm(claim_rule(Fault::LoseAck).every_attempt());
    assert_eq!(w.deliver(d.clone(), 0).await, Some(503));
    w.plan.disarm();
    // The provider retries well within the 15 s send lease.
    w.now += 5_000;
    assert_eq!(w.deliver(d.clone(), 1).await, Some(200));
    assert_eq!(payload_items(&w).await, 1, "the retry stored the payload");
    assert_eq!(w.stack.drain_queue().await.len(), 1, "and sent the key at once");
    assert!(w.violations.is_empty(), "{:?}", w.violations);
}

#[tokio::test]
async fn a_duplicate_meeting_a_dead_deliverys_live_lease_makes_the_payload_durable_first() {
    let mut w = mapped_world().await;
    let d = payment("evt_dead_holder", pi_succeeded("evt_dead_holder", "pi_3", Some("cus_x"), 500));
    // The first delivery's Lambda dies right after its claim committed.
    w.plan.arm(claim_rule(Fault::CrashAfter));
    assert_eq!(w.deliver(d.clone(), 0).await, None, "crashed");
    w.plan.disarm();
    w.now += 3_000;
    let answer = w.deliver(d.clone(), 1).await;
    assert_eq!(answer, Some(200));
    assert!(w.violations.is_empty(), "2xx without a durable payload: {:?}", w.violations);
    // The reconciler re-drives it once the lease and grace have passed.
    w.converge().await;
    assert_eq!(status(&w, &d.key()).await, "PROCESSED");
}

#[tokio::test]
async fn a_duplicate_of_a_record_the_reconciler_redrove_stores_the_missing_payload() {
    let mut w = mapped_world().await;
    let d = payment("evt_redriven", pi_succeeded("evt_redriven", "pi_4", Some("cus_x"), 500));
    w.plan.arm(claim_rule(Fault::CrashAfter));
    assert_eq!(w.deliver(d.clone(), 0).await, None, "crashed after the claim");
    w.plan.disarm();
    // The reconciler finds the never-sent record and re-drives it (no payload yet).
    w.now += 61_000;
    assert!(w.reconcile().await);
    w.now += 1_000;
    assert_eq!(w.deliver(d.clone(), 1).await, Some(200));
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    assert_eq!(payload_items(&w).await, 1, "the duplicate made good the payload");
    w.converge().await;
    assert_eq!(status(&w, &d.key()).await, "PROCESSED");
    w.check(&[]).await;
    assert!(w.violations.is_empty(), "{:?}", w.violations);
}

#[tokio::test]
async fn a_duplicate_with_other_bytes_makes_good_a_missing_payload_and_flags_a_real_conflict() {
    let mut w = mapped_world().await;
    let first = payment("evt_conflict", pi_succeeded("evt_conflict", "pi_5", Some("cus_x"), 500));
    let other = payment("evt_conflict", pi_succeeded("evt_conflict", "pi_5", Some("cus_x"), 900));
    w.plan.arm(claim_rule(Fault::CrashAfter));
    assert_eq!(w.deliver(first, 0).await, None);
    w.plan.disarm();
    w.now += 20_000; // the dead delivery's send lease has lapsed
    assert_eq!(w.deliver(other.clone(), 1).await, Some(200));
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    let meta = w.meta(&other.key()).await.unwrap();
    assert_eq!(crate::support::n(&meta, "conflicts"), 1, "a real conflict is flagged");
    assert_eq!(crate::support::n(&meta, "duplicates"), 1, "and the duplicate counted once");
    assert_eq!(w.stack.drain_queue().await.len(), 1, "the never-sent record was sent");
}

#[tokio::test]
async fn a_stripe_retry_that_differs_only_in_pending_webhooks_is_no_conflict() {
    let mut w = mapped_world().await;
    let render = |pending: i64| {
        let mut v: serde_json::Value =
            serde_json::from_slice(&pi_succeeded("evt_pw", "pi_6", Some("cus_x"), 500)).unwrap();
        v["pending_webhooks"] = serde_json::json!(pending);
        v.to_string().into_bytes()
    };
    w.plan.arm(claim_rule(Fault::CrashAfter));
    assert_eq!(w.deliver(payment("evt_pw", render(2)), 0).await, None);
    w.plan.disarm();
    w.now += 20_000;
    let retry = payment("evt_pw", render(1));
    assert_eq!(w.deliver(retry.clone(), 1).await, Some(200));
    let meta = w.meta(&retry.key()).await.unwrap();
    assert_eq!(crate::support::n(&meta, "conflicts"), 0, "same fact, not a conflict");
    assert_eq!(payload_items(&w).await, 1);
    assert_eq!(w.stack.drain_queue().await.len(), 1);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
}

/// The processor's fenced commit loses its acknowledgement; the SDK retries
/// it. Real DynamoDB (token honoured) answers the retry as a success; the
/// emulator (token ignored) executes it again and it fails its fence against
/// our own completion, which the processor must recognise as ours.
#[tokio::test]
async fn a_commit_retried_after_a_lost_ack_is_ours_whether_or_not_the_token_is_honoured() {
    use hookledger::processor::Outcome;
    for honour in [true, false] {
        let mut w = mapped_world().await;
        w.plan.honour_transaction_tokens(honour);
        crate::support::map_subject(&w.stack.ddb, &w.stack.table, "stripe", "t1", "cus_x", "acct_x").await.unwrap();
        let body = pi_succeeded("evt_commit", "pi_c", Some("cus_x"), 500);
        let key = w.seed("stripe", "stripe-a", "evt_commit", &body, false).await;
        w.plan.arm(Rule::new(Fault::LoseAck).on("dynamodb", "TransactWriteItems").nth(0));
        let report = w.processor.process(&key, w.now).await.unwrap();
        assert_eq!(w.plan.injected().get("lost_ack"), Some(&1));
        assert_eq!(report.outcome, Outcome::Applied, "token honoured: {honour}");
        let attempts = w.plan.trace().iter().filter(|c| c.operation == "TransactWriteItems").count();
        assert_eq!(attempts, 2, "the SDK retried the commit");
        let b = w.state(&hookledger_app::account_ledger::balance_pk("t1", "acct_x")).await.unwrap();
        assert_eq!((crate::support::n(&b, "balance"), crate::support::n(&b, "entries")), (500, 1));
    }
}
