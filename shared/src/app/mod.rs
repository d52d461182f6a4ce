//! The reference application: one projection per event contract, on real
//! provider event shapes. Users write their own the same way and register
//! them in a [`Registry`].
//!
//! | events | projection | contract |
//! |---|---|---|
//! | Stripe `customer.subscription.*` | [`entitlement::Entitlements`] | change notification: fetch, guard by fetched version; notifies `subscription.changed` |
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

use std::sync::Arc;

use crate::projection::Registry;
use crate::projection::fetch::SubscriptionSource;

/// All reference projections. `subscriptions` is the provider API the
/// entitlement projection fetches from; `notify_topic` receives outbox
/// notifications (none are written when it is `None`).
pub fn reference_registry(
    subscriptions: Option<Arc<dyn SubscriptionSource>>,
    notify_topic: Option<String>,
) -> Registry {
    Registry::new()
        .register(entitlement::Entitlements { source: subscriptions, notify_topic })
        .register(seats::SeatAllowance)
        .register(email_status::EmailStatus)
        .register(account_ledger::AccountLedger)
        .register(inventory::Inventory)
}

/// Reads a required field of the event body, or a permanent error naming it.
pub(crate) fn field<'a>(
    body: &'a serde_json::Value,
    pointer: &str,
) -> Result<&'a serde_json::Value, crate::projection::ProjectionError> {
    body.pointer(pointer)
        .filter(|v| !v.is_null())
        .ok_or_else(|| crate::projection::ProjectionError::Permanent(format!("event has no {pointer}")))
}

pub(crate) fn str_field<'a>(
    body: &'a serde_json::Value,
    pointer: &str,
) -> Result<&'a str, crate::projection::ProjectionError> {
    field(body, pointer)?
        .as_str()
        .ok_or_else(|| crate::projection::ProjectionError::Permanent(format!("{pointer} is not a string")))
}

pub(crate) fn int_field(body: &serde_json::Value, pointer: &str) -> Result<i64, crate::projection::ProjectionError> {
    field(body, pointer)?
        .as_i64()
        .ok_or_else(|| crate::projection::ProjectionError::Permanent(format!("{pointer} is not an integer")))
}
