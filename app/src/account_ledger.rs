//! Stripe payments into an account ledger: every payment and every refund is
//! one ledger entry keyed by its own Stripe id (the durable business
//! identity), applied once with its balance change in one transaction. A
//! `charge.refunded` event lists all refunds so far; each is applied once, so
//! later events for the same charge add only the new refunds.

use hookledger::projection::additive::{apply_many, apply_once};
use hookledger::projection::state::{required_n, required_s};
use hookledger::projection::{
    Decision, EventContext, Item, PlanFuture, Projection, ProjectionContext, ProjectionError, State, StateKey, get_n, s,
};

use super::{STRIPE, int_field, str_field, subjects};

pub struct AccountLedger;

pub fn entry_pk(tenant: &str, business_id: &str) -> String {
    format!("proj#ledger-entry#{tenant}#{business_id}")
}

pub fn balance_pk(tenant: &str, account: &str) -> String {
    format!("proj#balance#{tenant}#{account}")
}

/// One ledger entry (a payment or a refund), stored once by its business id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub account: String,
    pub kind: String,
    pub amount: i64,
}

impl State for Entry {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        Ok(Self {
            account: required_s(item, "account")?.to_owned(),
            kind: required_s(item, "kind")?.to_owned(),
            amount: required_n(item, "amount")?,
        })
    }
}

pub fn entry_key(tenant: &str, business_id: &str) -> StateKey<Entry> {
    StateKey::new(entry_pk(tenant, business_id))
}

/// An account's balance and the number of entries in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Balance {
    pub balance: i64,
    pub entries: i64,
}

impl State for Balance {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        Ok(Self { balance: get_n(item, "balance").unwrap_or(0), entries: get_n(item, "entries").unwrap_or(0) })
    }
}

pub fn balance_key(tenant: &str, account: &str) -> StateKey<Balance> {
    StateKey::new(balance_pk(tenant, account))
}

impl Projection for AccountLedger {
    fn name(&self) -> &'static str {
        "account_ledger"
    }

    fn handles(&self, provider: &str, event_type: &str) -> bool {
        provider == STRIPE && matches!(event_type, "payment_intent.succeeded" | "charge.refunded")
    }

    fn subject(&self, ev: &EventContext) -> Option<String> {
        ev.body["data"]["object"]["customer"].as_str().map(str::to_owned)
    }

    fn plan<'a>(&'a self, ev: &'a EventContext, cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let obj = &ev.body["data"]["object"];
            let Some(customer) = obj["customer"].as_str() else {
                return Ok(Decision::Park("payment has no customer".into()));
            };
            let Some(account) = subjects::account_for(cx, STRIPE, &ev.tenant, customer).await? else {
                return Ok(Decision::Park(format!("unknown stripe customer {customer}")));
            };
            let balance = balance_pk(&ev.tenant, &account);
            let entry = |kind: &str, id: &str| {
                Item::from([
                    ("account".to_owned(), s(&account)),
                    ("kind".to_owned(), s(kind)),
                    ("event_id".to_owned(), s(&ev.event_id)),
                    ("business_id".to_owned(), s(id)),
                ])
            };
            let mut ops = Vec::new();
            if ev.event_type == "payment_intent.succeeded" {
                let id = str_field(obj, "/id")?;
                let amount = int_field(obj, "/amount_received").or_else(|_| int_field(obj, "/amount"))?;
                ops.push(apply_once(&entry_pk(&ev.tenant, id), entry("payment", id), &balance, "balance", amount));
            } else {
                let refunds = obj["refunds"]["data"]
                    .as_array()
                    .ok_or_else(|| ProjectionError::Permanent("charge.refunded without refunds.data".into()))?;
                // One op for all refunds not yet in the ledger (one balance update).
                let mut missing = Vec::new();
                for r in refunds {
                    let id = str_field(r, "/id")?;
                    let amount = int_field(r, "/amount")?;
                    if !cx.exists(&entry_key(&ev.tenant, id)).await? {
                        missing.push((entry_pk(&ev.tenant, id), entry("refund", id), -amount));
                    }
                }
                if missing.is_empty() {
                    return Ok(Decision::Duplicate);
                }
                ops.push(apply_many(missing, &balance, "balance"));
            }
            Ok(Decision::Apply(ops))
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{Bench, event};

    fn payment(id: &str, customer: &str, amount: i64) -> EventContext {
        let body = json!({"type": "payment_intent.succeeded", "data": {"object": {"id": id, "customer": customer, "amount_received": amount}}});
        event(STRIPE, "payment_intent.succeeded", &format!("evt_{id}"), body)
    }

    fn refunded(evt: &str, refunds: &[(&str, i64)]) -> EventContext {
        let data: Vec<_> = refunds.iter().map(|(id, a)| json!({"id": id, "amount": a})).collect();
        let body = json!({"type": "charge.refunded", "data": {"object": {"id": "ch_1", "customer": "cus_1", "refunds": {"data": data}}}});
        event(STRIPE, "charge.refunded", evt, body)
    }

    #[tokio::test]
    async fn a_payment_is_entered_once_whatever_event_carries_it_again() {
        let b = Bench::new();
        b.map(STRIPE, "t1", "cus_1", "acct_1");
        assert!(b.project(&AccountLedger, &payment("pi_1", "cus_1", 1500)).await.1.is_empty());
        assert_eq!(b.project(&AccountLedger, &payment("pi_1", "cus_1", 1500)).await.1, [0], "already applied");
        let entry = b.read(&entry_key("t1", "pi_1")).await;
        assert_eq!(entry, Some(Entry { account: "acct_1".into(), kind: "payment".into(), amount: 1500 }));
        assert_eq!(b.read(&balance_key("t1", "acct_1")).await, Some(Balance { balance: 1500, entries: 1 }));
    }

    #[tokio::test]
    async fn refunds_already_entered_are_left_out_and_an_event_with_none_new_is_a_duplicate() {
        let b = Bench::new();
        b.map(STRIPE, "t1", "cus_1", "acct_1");
        assert!(b.project(&AccountLedger, &payment("pi_1", "cus_1", 1000)).await.1.is_empty());
        assert!(b.project(&AccountLedger, &refunded("evt_r1", &[("re_1", 100)])).await.1.is_empty());
        // Stripe's next charge.refunded lists every refund so far.
        assert!(b.project(&AccountLedger, &refunded("evt_r2", &[("re_1", 100), ("re_2", 250)])).await.1.is_empty());
        assert_eq!(b.read(&balance_key("t1", "acct_1")).await, Some(Balance { balance: 650, entries: 3 }));
        let (again, _) = b.project(&AccountLedger, &refunded("evt_r2", &[("re_1", 100), ("re_2", 250)])).await;
        assert!(matches!(again, Decision::Duplicate), "{again:?}");
    }

    #[tokio::test]
    async fn a_payment_of_an_unknown_or_missing_customer_is_parked() {
        let b = Bench::new();
        let (unknown, _) = b.project(&AccountLedger, &payment("pi_2", "cus_unknown", 10)).await;
        assert!(matches!(unknown, Decision::Park(ref r) if r.contains("cus_unknown")), "{unknown:?}");
        let body = json!({"data": {"object": {"id": "pi_3", "amount": 10}}});
        let (none, _) = b.project(&AccountLedger, &event(STRIPE, "payment_intent.succeeded", "evt_3", body)).await;
        assert!(matches!(none, Decision::Park(_)), "{none:?}");
        assert_eq!(b.read(&entry_key("t1", "pi_2")).await, None);
    }
}
