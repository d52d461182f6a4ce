//! Operator transitions under faults: a transition whose acknowledgement is
//! lost is recognised by its own retry, not refused.

use hookledger::ops::OpsError;
use hookledger_it::faults::{Fault, Rule};

use crate::explore::{World, drain_processor, map_customer};
use crate::processor::pi_succeeded;
use crate::support::s;

/// A record PARKED for an unknown customer, then the customer mapped.
async fn parked(w: &mut World, id: &str) -> hookledger::identity::EventKey {
    let key = w.seed("stripe", "stripe-a", id, &pi_succeeded(id, "pi_op", Some("cus_late"), 300), true).await;
    drain_processor(w).await;
    assert_eq!(w.meta(&key).await.map(|m| s(&m, "status")).as_deref(), Some("PARKED"));
    map_customer(w, "cus_late", "acct_late").await;
    key
}

#[tokio::test]
async fn an_operator_replay_whose_ack_is_lost_is_done_not_refused() {
    let mut w = World::new(1).await;
    let key = parked(&mut w, "evt_op_ack").await;
    w.stack.drain_queue().await;
    // The transition and its audit entry: one transaction.
    w.plan.arm(Rule::new(Fault::LoseAck).on("dynamodb", "TransactWriteItems").containing("operator_token").nth(0));
    let replayed = w
        .plan
        .run(w.ops.replay(&key, &hookledger::audit::Caller::named("alice"), "customer mapped", w.now))
        .await
        .expect("no crash");
    assert_eq!(w.plan.injected().get("lost_ack"), Some(&1), "the fault fired");
    assert!(replayed.is_ok(), "our own transition, not an illegal one: {replayed:?}");
    assert_eq!(w.meta(&key).await.map(|m| s(&m, "status")).as_deref(), Some("RETRYABLE"));
    assert_eq!(w.stack.drain_queue().await.len(), 1, "queued once");
    use hookledger::ports::AuditLog;
    assert_eq!(w.stack.ledger().audit_of(&key).await.unwrap().len(), 1, "audited once");
}

#[tokio::test]
async fn a_second_operator_meets_the_first_ones_transition_and_is_refused() {
    let mut w = World::new(1).await;
    let key = parked(&mut w, "evt_op_twice").await;
    w.ops.resolve(&key, &hookledger::audit::Caller::named("alice"), "settled by hand", w.now).await.unwrap();
    let again = w.ops.resolve(&key, &hookledger::audit::Caller::named("bob"), "settled by hand", w.now).await;
    assert!(
        matches!(again, Err(OpsError::IllegalTransition { from: "PROCESSED", .. })),
        "another operator's transition is not ours: {again:?}"
    );
}
