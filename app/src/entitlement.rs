//! Stripe subscriptions → entitlements, by the change-notification contract.
//! Stripe event timestamps are seconds and shared by distinct events, so they
//! are not revisions: on any `customer.subscription.*` event we fetch the
//! subscription as Stripe has it now and replace the entitlement only if this
//! fetch is newer than the one already applied. When the entitlement changes,
//! a `subscription.changed` notification goes out through the outbox.
//!
//! [`EntitlementDrift`] is its re-check: the reconciler hands it each live
//! entitlement once its interval has passed, and it compares the entitlement
//! with the subscription Stripe has now; drift is repaired by a
//! `customer.subscription.reconciled` event whose id
//! (`recon:<subscription>:<drift instance>`) is fixed by the entitlement's
//! source event and Stripe's answer.

use std::sync::Arc;

use hookledger::identity::payload_hash;
use hookledger::message::OutboxMessage;
use hookledger::projection::fetch::{ProviderError, SubscriptionSource};
use hookledger::projection::recheck::{CheckFuture, DEFAULT_INTERVAL_MS, Recheck, Repair, Verdict};
use hookledger::projection::snapshot::{Version, replace_if_newer};
use hookledger::projection::{
    Decision, EventContext, Item, PlanFuture, Projection, ProjectionContext, ProjectionError, State, StateKey, get_n,
    get_s, n, s,
};

use super::{STRIPE, str_field, subjects};

pub struct Entitlements {
    pub source: Option<Arc<dyn SubscriptionSource>>,
    pub notify_topic: Option<String>,
}

/// Subscription statuses after which nothing changes any more (`deleted`:
/// Stripe no longer knows it).
pub const ENDED: [&str; 3] = ["canceled", "incomplete_expired", "deleted"];

/// The partition key prefix of entitlements (what [`EntitlementDrift`] re-checks).
pub const PREFIX: &str = "proj#entitlement#";

pub fn entitlement_pk(tenant: &str, subscription: &str) -> String {
    format!("{PREFIX}{tenant}#{subscription}")
}

/// An entitlement as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entitlement {
    pub subscription: String,
    pub customer: String,
    pub account: String,
    pub status: String,
    pub seats: i64,
    /// The provider event the entitlement came from.
    pub event_id: String,
    pub endpoint: String,
    pub tenant: String,
}

impl State for Entitlement {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        let opt = |k: &str| get_s(item, k).unwrap_or_default().to_owned();
        Ok(Self {
            subscription: opt("subscription"),
            customer: opt("customer"),
            account: opt("account"),
            status: opt("status"),
            seats: get_n(item, "seats").unwrap_or(0),
            event_id: opt("event_id"),
            endpoint: opt("endpoint"),
            tenant: opt("tenant"),
        })
    }
}

pub fn entitlement_key(tenant: &str, subscription: &str) -> StateKey<Entitlement> {
    StateKey::new(entitlement_pk(tenant, subscription))
}

impl Projection for Entitlements {
    fn name(&self) -> &'static str {
        "entitlements"
    }

    fn handles(&self, provider: &str, event_type: &str) -> bool {
        provider == STRIPE && event_type.starts_with("customer.subscription.")
    }

    fn subject(&self, ev: &EventContext) -> Option<String> {
        ev.body["data"]["object"]["id"].as_str().map(str::to_owned)
    }

    fn plan<'a>(&'a self, ev: &'a EventContext, cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let obj = &ev.body["data"]["object"];
            let sub_id = str_field(obj, "/id")?;
            let customer = str_field(obj, "/customer")?;
            let Some(account) = subjects::account_for(cx, STRIPE, &ev.tenant, customer).await? else {
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
            // The reconciler re-checks this item once it is due (the fetch
            // time plus the default interval, then the reconciler's own
            // interval after each check). An ended subscription has nothing
            // left to drift: it leaves the re-checks and expires after the
            // retention. A live one never expires: it is the revision guard.
            let ended = ENDED.contains(&status.as_str());
            let mut attrs = Item::from([
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
                attrs.insert(
                    "expires_at".to_owned(),
                    n(hookledger::policy::expires_at(fetched.version, cx.retention_days)),
                );
            } else {
                attrs.extend(cx.recheck_at(sub_id, fetched.version + DEFAULT_INTERVAL_MS));
            }
            let pk = entitlement_pk(&ev.tenant, sub_id);
            let mut op = replace_if_newer(&pk, Version { generation: 0, revision: fetched.version }, attrs);
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

/// The entitlements' re-check against Stripe.
pub struct EntitlementDrift {
    pub source: Arc<dyn SubscriptionSource>,
}

impl Recheck for EntitlementDrift {
    fn name(&self) -> &'static str {
        "entitlements"
    }

    fn prefix(&self) -> &'static str {
        PREFIX
    }

    fn check<'a>(&'a self, item: &'a Item, _now_ms: i64) -> CheckFuture<'a> {
        Box::pin(async move {
            let local = Entitlement::decode(item)?;
            // Nothing to fetch, or nowhere to repair it through.
            if local.subscription.is_empty() || local.endpoint.is_empty() {
                return Ok(Verdict::Same);
            }
            let sub = &local.subscription;
            let fetched =
                self.source.subscription(sub).await.map_err(|e| ProjectionError::Unavailable(format!("{sub}: {e}")))?;
            let (status, seats) = match &fetched.object {
                Some(s) => (s.status.clone(), s.seats),
                None => ("deleted".to_owned(), 0),
            };
            if local.status == status && local.seats == seats {
                return Ok(Verdict::Same);
            }
            // One identity per drift instance (the local state's source event
            // and the provider's answer): a check retried after a lost
            // acknowledgement or a crash meets its own repair record.
            let instance = payload_hash(format!("{}|{status}|{seats}", local.event_id).as_bytes());
            let event_id = format!("recon:{sub}:{}", &instance[..16]);
            let body = serde_json::json!({
                "id": event_id, "object": "event", "type": "customer.subscription.reconciled",
                "data": {"object": {"id": sub, "object": "subscription", "customer": local.customer}},
            });
            Ok(Verdict::Drift(Repair {
                provider: STRIPE.to_owned(),
                endpoint: local.endpoint.clone(),
                tenant: local.tenant.clone(),
                event_id,
                event_type: "customer.subscription.reconciled".to_owned(),
                body: body.to_string().into_bytes(),
                detail: format!("{sub}: local {} / {}, provider {status} / {seats}", local.status, local.seats),
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use hookledger::adapters::memory::{Answer, MemSubscriptions};
    use serde_json::json;

    use super::*;
    use crate::testing::{Bench, NOW, event, ops, subscriptions};

    fn updated(id: &str) -> EventContext {
        let body = json!({"type": "customer.subscription.updated", "data": {"object": {"id": "sub_1", "customer": "cus_1", "quantity": 1}}});
        event(STRIPE, "customer.subscription.updated", id, body)
    }

    fn projection(source: &Arc<MemSubscriptions>) -> Entitlements {
        Entitlements { source: Some(source.clone()), notify_topic: Some("arn:aws:sns:us-east-1:1:subs".into()) }
    }

    #[tokio::test]
    async fn the_entitlement_is_what_stripe_has_now_notified_once_and_due_for_its_recheck() {
        let (b, api) = (Bench::new(), subscriptions());
        b.map(STRIPE, "t1", "cus_1", "acct_1");
        api.answer("sub_1", Answer::Is("active".into(), 5));
        let decision = b.plan(&projection(&api), &updated("evt_1")).await.unwrap();
        let [op] = ops(&decision) else { panic!("{decision:?}") };
        assert_eq!(op.outbox.len(), 1, "subscription.changed goes out with the commit");
        assert!(b.commit(ops(&decision)).is_empty());
        let stored = b.read(&entitlement_key("t1", "sub_1")).await.expect("stored");
        assert_eq!((stored.status.as_str(), stored.seats, stored.account.as_str()), ("active", 5, "acct_1"));
        let item = b.item(&entitlement_pk("t1", "sub_1")).unwrap();
        assert_eq!(
            get_n(&item, "due_at"),
            Some(1 + DEFAULT_INTERVAL_MS),
            "fetched at version 1, due an interval later"
        );
        assert!(get_s(&item, "due_shard").is_some_and(|s| s.starts_with("chk#")), "{item:?}");
        assert_eq!(b.project(&projection(&api), &updated("evt_2")).await.1, [0], "the same fetch: stale");
    }

    #[tokio::test]
    async fn an_ended_subscription_leaves_the_rechecks_and_expires() {
        let (b, api) = (Bench::new(), subscriptions());
        b.map(STRIPE, "t1", "cus_1", "acct_1");
        api.answer("sub_1", Answer::Gone);
        assert!(b.project(&projection(&api), &updated("evt_1")).await.1.is_empty());
        let item = b.item(&entitlement_pk("t1", "sub_1")).unwrap();
        assert_eq!(get_s(&item, "status"), Some("deleted"));
        assert!(get_n(&item, "expires_at").is_some() && !item.contains_key("due_shard"), "{item:?}");
    }

    #[tokio::test]
    async fn an_unknown_customer_parks_and_stripe_down_is_unavailable() {
        let (b, api) = (Bench::new(), subscriptions());
        let (parked, _) = b.project(&projection(&api), &updated("evt_1")).await;
        assert!(matches!(parked, Decision::Park(_)), "{parked:?}");
        b.map(STRIPE, "t1", "cus_1", "acct_1");
        api.answer("sub_1", Answer::Down);
        let down = b.plan(&projection(&api), &updated("evt_1")).await;
        assert!(matches!(down, Err(ProjectionError::Unavailable(_))), "{down:?}");
    }

    /// The re-check: the same as Stripe is the same; a drift is repaired by
    /// one identity per drift instance (asked twice, the same event; another
    /// answer, another event); Stripe down is unavailable (checked again soon).
    #[tokio::test]
    async fn the_recheck_finds_drift_by_one_identity_per_instance() {
        let (b, api) = (Bench::new(), subscriptions());
        b.map(STRIPE, "t1", "cus_1", "acct_1");
        api.answer("sub_1", Answer::Is("active".into(), 5));
        assert!(b.project(&projection(&api), &updated("evt_1")).await.1.is_empty());
        let item = b.item(&entitlement_pk("t1", "sub_1")).unwrap();
        let drift = EntitlementDrift { source: api.clone() };
        let registry = crate::reference_registry(Some(api.clone()), None);
        assert_eq!(registry.rechecks().of(&entitlement_pk("t1", "sub_1")).map(|r| r.name()), Some("entitlements"));
        assert_eq!(drift.check(&item, NOW).await.unwrap(), Verdict::Same);

        api.answer("sub_1", Answer::Is("active".into(), 8));
        let Verdict::Drift(first) = drift.check(&item, NOW).await.unwrap() else { panic!("drift") };
        assert_eq!((first.provider.as_str(), first.endpoint.as_str(), first.tenant.as_str()), (STRIPE, "main", "t1"));
        assert!(first.event_id.starts_with("recon:sub_1:"), "{}", first.event_id);
        assert_eq!(first.event_type, "customer.subscription.reconciled");
        let Verdict::Drift(again) = drift.check(&item, NOW + 1).await.unwrap() else { panic!("drift") };
        assert_eq!(again.event_id, first.event_id, "the same drift instance");
        api.answer("sub_1", Answer::Is("past_due".into(), 8));
        let Verdict::Drift(other) = drift.check(&item, NOW).await.unwrap() else { panic!("drift") };
        assert_ne!(other.event_id, first.event_id, "another drift instance");
        api.answer("sub_1", Answer::Down);
        assert!(matches!(drift.check(&item, NOW).await, Err(ProjectionError::Unavailable(_))));
        let repaired: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
        assert_eq!(repaired["data"]["object"]["id"], "sub_1", "the repair names the subscription to fetch");
    }
}
