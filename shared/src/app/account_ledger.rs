//! Stripe payments into an account ledger: every payment and every refund is
//! one ledger entry keyed by its own Stripe id (the durable business
//! identity), applied once with its balance change in one transaction. A
//! `charge.refunded` event lists all refunds so far; each is applied once, so
//! later events for the same charge add only the new refunds.

use std::collections::HashMap;

use super::{int_field, str_field, subjects};
use crate::config::ProviderKind;
use crate::projection::additive::{apply_many, apply_once};
use crate::projection::{Decision, EventContext, PlanFuture, Projection, ProjectionContext, ProjectionError, s};

pub struct AccountLedger;

pub fn entry_pk(tenant: &str, business_id: &str) -> String {
    format!("proj#ledger-entry#{tenant}#{business_id}")
}

pub fn balance_pk(tenant: &str, account: &str) -> String {
    format!("proj#balance#{tenant}#{account}")
}

impl Projection for AccountLedger {
    fn name(&self) -> &'static str {
        "account_ledger"
    }

    fn handles(&self, provider: &str, event_type: &str) -> bool {
        provider == ProviderKind::STRIPE.as_str()
            && matches!(event_type, "payment_intent.succeeded" | "charge.refunded")
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
            let Some(account) = subjects::account_for(cx, ProviderKind::STRIPE.as_str(), &ev.tenant, customer).await?
            else {
                return Ok(Decision::Park(format!("unknown stripe customer {customer}")));
            };
            let balance = balance_pk(&ev.tenant, &account);
            let entry = |kind: &str, id: &str| {
                HashMap::from([
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
                ops.push(apply_once(
                    &cx.table,
                    &entry_pk(&ev.tenant, id),
                    entry("payment", id),
                    &balance,
                    "balance",
                    amount,
                ));
            } else {
                let refunds = obj["refunds"]["data"]
                    .as_array()
                    .ok_or_else(|| ProjectionError::Permanent("charge.refunded without refunds.data".into()))?;
                // One op for all refunds not yet in the ledger (one balance update).
                let mut missing = Vec::new();
                for r in refunds {
                    let id = str_field(r, "/id")?;
                    let amount = int_field(r, "/amount")?;
                    let pk = entry_pk(&ev.tenant, id);
                    if cx.read_state(&pk).await?.is_none() {
                        missing.push((pk, entry("refund", id), -amount));
                    }
                }
                if missing.is_empty() {
                    return Ok(Decision::Duplicate);
                }
                ops.push(apply_many(&cx.table, missing, &balance, "balance"));
            }
            Ok(Decision::Apply(ops))
        })
    }
}
