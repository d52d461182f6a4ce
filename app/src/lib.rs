//! The reference application: one projection per event contract, on real
//! provider event shapes, and one re-check. It is a crate of its own over
//! Hookledger's projection API and domain, registered by the functions'
//! `main.rs`; a team's own application is written and registered the same
//! way (docs/extending.md), without editing Hookledger.
//!
//! | events | projection | contract |
//! |---|---|---|
//! | Stripe `customer.subscription.*` | [`entitlement::Entitlements`] | change notification: fetch, guard by fetched version; notifies `subscription.changed`; re-checked by [`entitlement::EntitlementDrift`] |
//! | Standard Webhooks `seats.snapshot` | [`seats::SeatAllowance`] | snapshot + (generation, revision) — seed 001's model |
//! | SES via SNS `ses.Send/Delivery/Bounce/Complaint…` | [`email_status::EmailStatus`] | status precedence |
//! | Stripe `payment_intent.succeeded`, `charge.refunded` | [`account_ledger::AccountLedger`] | additive, once per payment / refund id |
//! | Standard Webhooks `inventory.adjusted` | [`inventory::Inventory`] | ordered deltas with sequence numbers |

pub mod account_ledger;
pub mod email_status;
pub mod entitlement;
pub mod inventory;
pub mod seats;
pub mod subjects;
#[cfg(test)]
mod testing;

use std::sync::Arc;

use hookledger::projection::fetch::SubscriptionSource;
use hookledger::projection::{ProjectionError, Registry};

/// The providers the reference projections read, by their names in the
/// endpoints configuration.
pub const STRIPE: &str = "stripe";
pub const SNS: &str = "sns";

/// All reference projections and the entitlement re-check. `subscriptions`
/// is the provider API the entitlements are fetched from and re-checked
/// against (no re-check without it); `notify_topic` receives outbox
/// notifications (none are written when it is `None`).
pub fn reference_registry(
    subscriptions: Option<Arc<dyn SubscriptionSource>>,
    notify_topic: Option<String>,
) -> Registry {
    let registry = Registry::new()
        .register(entitlement::Entitlements { source: subscriptions.clone(), notify_topic })
        .register(seats::SeatAllowance)
        .register(email_status::EmailStatus)
        .register(account_ledger::AccountLedger)
        .register(inventory::Inventory);
    match subscriptions {
        Some(source) => registry.recheck(entitlement::EntitlementDrift { source }),
        None => registry,
    }
}

/// Reads a required field of the event body, or a permanent error naming it.
pub(crate) fn field<'a>(body: &'a serde_json::Value, pointer: &str) -> Result<&'a serde_json::Value, ProjectionError> {
    body.pointer(pointer)
        .filter(|v| !v.is_null())
        .ok_or_else(|| ProjectionError::Permanent(format!("event has no {pointer}")))
}

pub(crate) fn str_field<'a>(body: &'a serde_json::Value, pointer: &str) -> Result<&'a str, ProjectionError> {
    field(body, pointer)?.as_str().ok_or_else(|| ProjectionError::Permanent(format!("{pointer} is not a string")))
}

pub(crate) fn int_field(body: &serde_json::Value, pointer: &str) -> Result<i64, ProjectionError> {
    field(body, pointer)?.as_i64().ok_or_else(|| ProjectionError::Permanent(format!("{pointer} is not an integer")))
}
