//! Stripe subscriptions → entitlements, by the change-notification contract.
//! Stripe event timestamps are seconds and shared by distinct events, so they
//! are not revisions: on any `customer.subscription.*` event we fetch the
//! subscription as Stripe has it now and replace the entitlement only if this
//! fetch is newer than the one already applied. When the entitlement changes,
//! a `subscription.changed` notification goes out through the outbox.

use std::collections::HashMap;
use std::sync::Arc;

use super::{str_field, subjects};
use crate::config::DEFAULT_DRIFT_INTERVAL_MS;
use crate::config::ProviderKind;
use crate::identity::shard_of;
use crate::ledger::DuePartition;
use crate::message::OutboxMessage;
use crate::policy::due_shard_named;
use crate::projection::fetch::{ProviderError, SubscriptionSource};
use crate::projection::snapshot::{Version, replace_if_newer};
use crate::projection::{Decision, EventContext, PlanFuture, Projection, ProjectionContext, ProjectionError, n, s};

pub struct Entitlements {
    pub source: Option<Arc<dyn SubscriptionSource>>,
    pub notify_topic: Option<String>,
}

/// Due-index partition prefix of entitlements in the oldest releases, before
/// they shared `due#NNN` with the records (read by `hookledger migrate`,
/// which moves both layouts to today's `chk#NNN`).
pub const LEGACY_DRIFT_SHARD_PREFIX: &str = "ent";

/// Subscription statuses after which nothing changes any more (`deleted`:
/// Stripe no longer knows it).
pub const ENDED: [&str; 3] = ["canceled", "incomplete_expired", "deleted"];

pub fn entitlement_pk(tenant: &str, subscription: &str) -> String {
    format!("proj#entitlement#{tenant}#{subscription}")
}

impl Projection for Entitlements {
    fn name(&self) -> &'static str {
        "entitlements"
    }

    fn handles(&self, provider: &str, event_type: &str) -> bool {
        provider == ProviderKind::STRIPE.as_str() && event_type.starts_with("customer.subscription.")
    }

    fn subject(&self, ev: &EventContext) -> Option<String> {
        ev.body["data"]["object"]["id"].as_str().map(str::to_owned)
    }

    fn plan<'a>(&'a self, ev: &'a EventContext, cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let obj = &ev.body["data"]["object"];
            let sub_id = str_field(obj, "/id")?;
            let customer = str_field(obj, "/customer")?;
            let Some(account) = subjects::account_for(cx, ProviderKind::STRIPE.as_str(), &ev.tenant, customer).await?
            else {
                return Ok(Decision::Park(format!("unknown stripe customer {customer}")));
            };
            let source = self
                .source
                .as_ref()
                .ok_or_else(|| ProjectionError::Permanent("no subscription source configured".into()))?;
            let fetched = source.subscription(sub_id).await.map_err(|e| match e {
                ProviderError::Unavailable(m) => ProjectionError::Unavailable(m),
                ProviderError::Rejected(m) => ProjectionError::Permanent(m),
            })?;
            let (status, seats) = match &fetched.object {
                Some(sub) => (sub.status.clone(), sub.seats),
                None => ("deleted".to_owned(), 0),
            };
            // The reconciler compares this item with Stripe once it is due
            // (the `due` index's re-check partitions `chk#NNN`; `due_at` is the next
            // check: the fetch time plus the default drift interval, then the
            // reconciler's own interval after each check). An ended
            // subscription has nothing left to drift: it leaves the
            // re-checks and expires after the retention. A live one never
            // expires: it is the revision guard.
            let ended = ENDED.contains(&status.as_str());
            let mut attrs = HashMap::from([
                ("account".to_owned(), s(&account)),
                ("subscription".to_owned(), s(sub_id)),
                ("customer".to_owned(), s(customer)),
                ("status".to_owned(), s(&status)),
                ("seats".to_owned(), n(seats)),
                ("event_id".to_owned(), s(&ev.event_id)),
                ("endpoint".to_owned(), s(&ev.endpoint)),
                ("tenant".to_owned(), s(&ev.tenant)),
            ]);
            if ended {
                attrs.insert("expires_at".to_owned(), n(crate::policy::expires_at(fetched.version, cx.retention_days)));
            } else {
                let shard = due_shard_named(DuePartition::Checks.prefix(), shard_of(sub_id, cx.shards));
                attrs.insert("due_shard".to_owned(), s(shard));
                attrs.insert("due_at".to_owned(), n(fetched.version + DEFAULT_DRIFT_INTERVAL_MS));
            }
            let pk = entitlement_pk(&ev.tenant, sub_id);
            let mut op = replace_if_newer(&cx.table, &pk, Version { generation: 0, revision: fetched.version }, attrs);
            if let Some(topic) = &self.notify_topic {
                op = op.notify(OutboxMessage {
                    topic_arn: topic.clone(),
                    delivery: None,
                    action: "subscription.changed".into(),
                    group: sub_id.to_owned(),
                    body: serde_json::json!({
                        "type": "subscription.changed", "tenant": ev.tenant, "account": account,
                        "subscription": sub_id, "status": status, "seats": seats, "source_event": ev.event_id,
                    }),
                });
            }
            Ok(Decision::Apply(vec![op]))
        })
    }
}
