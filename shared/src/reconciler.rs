//! The reconciler: finds what the webhooks alone cannot finish, through the
//! sparse, sharded `due` index (never a scan), and hands it back to the same
//! pipeline.
//!
//! - `due#…`: RECEIVED records never sent or not picked up (due 60 s after
//!   receipt), PROCESSING records whose lease expired (due at expiry),
//!   RETRYABLE records whose retry is due → re-driven to SQS.
//! - `out#…`: outbox items still pending, or claimed by a dispatcher that
//!   died → published (same idempotency key).
//! - `ent#…`: entitlements whose last provider check is older than the drift
//!   interval → compared with Stripe; drift is repaired by a reconciliation
//!   event (`recon:<subscription>:<fetch version>`) through the processor.
//!
//! Each item is claimed before it is acted on with a conditional update of
//! its `due_at` (from the value read to the next look), so two runs at once
//! never both act on it, and a rerun finds nothing it already did. A run stops
//! at its item budget or deadline; what it did not reach stays due, so the
//! next run continues.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::adapters::dynamodb::{DUE_INDEX, DynamoLedger, attr, due_shard, due_shard_named, status_shard};
use crate::adapters::port_error;
use crate::app::entitlement::DRIFT_SHARD_PREFIX;
use crate::identity::{EventKey, payload_hash};
use crate::ledger::{Claim, Ledger, NewEvent, PortError, SendLease, Status, WorkQueue};
use crate::outbox::Dispatcher;
use crate::projection::fetch::{ProviderError, SubscriptionSource};
use crate::projection::{STATE_SK, get_n, get_s};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcilerSettings {
    /// Items acted on per run, at most.
    pub max_items: usize,
    /// When a re-driven record is looked at again if still not done.
    pub redrive_backoff_ms: i64,
    /// How old an entitlement's last provider check must be to check it again.
    pub drift_interval_ms: i64,
    /// Outbox items younger than this are left to their processor.
    pub outbox_grace_ms: i64,
    pub retention_days: u32,
}

impl Default for ReconcilerSettings {
    fn default() -> Self {
        Self {
            max_items: 500,
            redrive_backoff_ms: 300_000,
            drift_interval_ms: 3_600_000,
            outbox_grace_ms: 60_000,
            retention_days: 30,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Re-driven records by reason: never_sent, not_picked_up, lease_expired, retry_due.
    pub redriven: BTreeMap<String, u64>,
    pub outbox_republished: u64,
    pub drift_checked: u64,
    pub drift_found: u64,
    pub drift_repaired: u64,
    pub dead_letters: u64,
    pub parked: u64,
    /// Expired leases seen (each also counted in `redriven.lease_expired`).
    pub stuck_leases: u64,
    pub oldest_unprocessed_age_ms: Option<i64>,
    /// False when the run stopped at its budget or deadline.
    pub complete: bool,
}

pub struct Reconciler<Q> {
    ledger: DynamoLedger,
    queue: Q,
    dispatcher: Option<Dispatcher>,
    subscriptions: Option<Arc<dyn SubscriptionSource>>,
    settings: ReconcilerSettings,
}

impl<Q: WorkQueue> Reconciler<Q> {
    pub fn new(
        ledger: DynamoLedger,
        queue: Q,
        dispatcher: Option<Dispatcher>,
        subscriptions: Option<Arc<dyn SubscriptionSource>>,
        settings: ReconcilerSettings,
    ) -> Self {
        Self { ledger, queue, dispatcher, subscriptions, settings }
    }

    /// One bounded run. `deadline`: stop acting after this instant (the
    /// Lambda's remaining time minus a margin).
    pub async fn run(&self, now_ms: i64, deadline: Instant) -> Result<Summary, PortError> {
        let mut summary = Summary { complete: true, ..Default::default() };
        let mut budget = self.settings.max_items;
        let started = Instant::now();
        let result = async {
            self.redrive(now_ms, deadline, &mut budget, &mut summary).await?;
            self.outbox(now_ms, deadline, &mut budget, &mut summary).await?;
            self.drift(now_ms, deadline, &mut budget, &mut summary).await?;
            Ok::<_, PortError>(())
        }
        .await;
        match result {
            Ok(_) => {}
            Err(e) if matches!(e, PortError::Throttled { .. }) => {
                summary.complete = false;
                tracing::warn!(error = %e, "reconciler throttled; the next run continues");
            }
            Err(e) => return Err(e),
        }
        self.evidence(now_ms, &mut summary).await?;
        self.emit(&summary, started);
        Ok(summary)
    }

    fn out_of_time(&self, deadline: Instant, budget: usize, summary: &mut Summary) -> bool {
        if budget == 0 || Instant::now() >= deadline {
            summary.complete = false;
            return true;
        }
        false
    }

    /// Moves an item's `due_at` from `seen` to `next`; `false` if someone
    /// else did first. `extra_set` may use `:now`.
    async fn claim_due(
        &self,
        pk: &str,
        sk: &str,
        seen: i64,
        next: i64,
        now: i64,
        extra_set: &str,
    ) -> Result<bool, PortError> {
        let mut req = self
            .ledger
            .client()
            .update_item()
            .table_name(self.ledger.table())
            .key(attr::PK, AttributeValue::S(pk.to_owned()))
            .key(attr::SK, AttributeValue::S(sk.to_owned()))
            .update_expression(format!("SET due_at = :next{extra_set} ADD redrives :one"))
            .condition_expression("due_at = :seen")
            .expression_attribute_values(":next", AttributeValue::N(next.to_string()))
            .expression_attribute_values(":seen", AttributeValue::N(seen.to_string()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()));
        if extra_set.contains(":now") {
            req = req.expression_attribute_values(":now", AttributeValue::N(now.to_string()));
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(|se| se.is_conditional_check_failed_exception()) => Ok(false),
            Err(e) => Err(port_error("dynamodb", &e)),
        }
    }

    async fn due_page(
        &self,
        partition: &str,
        up_to: i64,
        limit: usize,
    ) -> Result<Vec<HashMap<String, AttributeValue>>, PortError> {
        let out = self
            .ledger
            .client()
            .query()
            .table_name(self.ledger.table())
            .index_name(DUE_INDEX)
            .key_condition_expression("due_shard = :s AND due_at <= :t")
            .expression_attribute_values(":s", AttributeValue::S(partition.to_owned()))
            .expression_attribute_values(":t", AttributeValue::N(up_to.to_string()))
            .limit(limit.clamp(1, 100) as i32)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(out.items.unwrap_or_default())
    }

    async fn redrive(
        &self,
        now_ms: i64,
        deadline: Instant,
        budget: &mut usize,
        summary: &mut Summary,
    ) -> Result<(), PortError> {
        // Start at a shard that moves with time, so a run cut short by its
        // budget does not always favour the first shards.
        let shards = self.ledger.shards();
        let first = ((now_ms / 60_000) as u64 % u64::from(shards)) as u32;
        for i in 0..shards {
            let shard = (first + i) % shards;
            loop {
                if self.out_of_time(deadline, *budget, summary) {
                    return Ok(());
                }
                let page = self.due_page(&due_shard(shard), now_ms, *budget).await?;
                if page.is_empty() {
                    break;
                }
                let mut acted = 0;
                for item in page {
                    if self.out_of_time(deadline, *budget, summary) {
                        return Ok(());
                    }
                    let (Some(pk), Some(seen)) = (get_s(&item, attr::PK), get_n(&item, attr::DUE_AT)) else { continue };
                    let Some(key) = EventKey::from_stored(pk) else { continue };
                    let status = get_s(&item, attr::STATUS).and_then(Status::parse);
                    let reason = match status {
                        Some(Status::Received) if !item.contains_key(attr::ENQUEUED_AT) => "never_sent",
                        Some(Status::Received) => "not_picked_up",
                        Some(Status::Processing) => "lease_expired",
                        Some(Status::Retryable) => "retry_due",
                        _ => continue,
                    };
                    let mark_sent = if reason == "never_sent" { ", enqueued_at = :now" } else { "" };
                    let next = now_ms + self.settings.redrive_backoff_ms;
                    if !self.claim_due(pk, crate::adapters::dynamodb::META_SK, seen, next, now_ms, mark_sent).await? {
                        continue;
                    }
                    *budget -= 1;
                    acted += 1;
                    self.queue.send(&key).await?;
                    if reason == "lease_expired" {
                        summary.stuck_leases += 1;
                    }
                    *summary.redriven.entry(reason.to_owned()).or_default() += 1;
                    tracing::info!(key = %key, reason, "re-driven");
                }
                if acted == 0 {
                    // Everything on this page was taken by a concurrent run; move on.
                    break;
                }
            }
        }
        Ok(())
    }

    async fn outbox(
        &self,
        now_ms: i64,
        deadline: Instant,
        budget: &mut usize,
        summary: &mut Summary,
    ) -> Result<(), PortError> {
        let Some(d) = &self.dispatcher else { return Ok(()) };
        if self.out_of_time(deadline, *budget, summary) {
            return Ok(());
        }
        let sent = d.sweep(self.ledger.shards(), now_ms, self.settings.outbox_grace_ms, *budget).await?;
        *budget -= sent.min(*budget);
        summary.outbox_republished += sent as u64;
        Ok(())
    }

    async fn drift(
        &self,
        now_ms: i64,
        deadline: Instant,
        budget: &mut usize,
        summary: &mut Summary,
    ) -> Result<(), PortError> {
        let Some(source) = &self.subscriptions else { return Ok(()) };
        for shard in 0..self.ledger.shards() {
            loop {
                if self.out_of_time(deadline, *budget, summary) {
                    return Ok(());
                }
                let partition = due_shard_named(DRIFT_SHARD_PREFIX, shard);
                // Strictly older than the interval: an item checked in this run
                // (due_at = now) is not checked again by it.
                let page = self.due_page(&partition, now_ms - self.settings.drift_interval_ms - 1, *budget).await?;
                if page.is_empty() {
                    break;
                }
                let mut acted = 0;
                for item in page {
                    if self.out_of_time(deadline, *budget, summary) {
                        return Ok(());
                    }
                    let (Some(pk), Some(seen)) = (get_s(&item, attr::PK), get_n(&item, attr::DUE_AT)) else { continue };
                    // Checked now: next look after another interval.
                    if !self.claim_due(pk, STATE_SK, seen, now_ms, now_ms, "").await? {
                        continue;
                    }
                    *budget -= 1;
                    acted += 1;
                    summary.drift_checked += 1;
                    if self.check_entitlement(&item, source.as_ref(), now_ms).await? {
                        summary.drift_found += 1;
                        summary.drift_repaired += 1;
                    }
                }
                if acted == 0 {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Compares one entitlement with Stripe; on drift, submits a
    /// reconciliation event through the normal pipeline. `Ok(true)`: drift.
    async fn check_entitlement(
        &self,
        item: &HashMap<String, AttributeValue>,
        source: &dyn SubscriptionSource,
        now_ms: i64,
    ) -> Result<bool, PortError> {
        let field = |k: &str| get_s(item, k).unwrap_or_default().to_owned();
        let (sub, customer, endpoint, tenant) =
            (field("subscription"), field("customer"), field("endpoint"), field("tenant"));
        if sub.is_empty() || endpoint.is_empty() {
            return Ok(false);
        }
        let fetched = match source.subscription(&sub).await {
            Ok(f) => f,
            Err(ProviderError::Unavailable(m) | ProviderError::Rejected(m)) => {
                tracing::warn!(subscription = %sub, error = %m, "drift check skipped: provider unavailable");
                return Ok(false);
            }
        };
        let (status, seats) = match &fetched.object {
            Some(s) => (s.status.clone(), s.seats),
            None => ("deleted".to_owned(), 0),
        };
        if get_s(item, "status") == Some(status.as_str()) && get_n(item, "seats") == Some(seats) {
            return Ok(false);
        }
        metrics::counter!("drift_found", "projection" => "entitlements").increment(1);
        tracing::warn!(subscription = %sub, local_status = get_s(item, "status").unwrap_or(""), provider_status = %status,
            local_seats = get_n(item, "seats").unwrap_or(-1), provider_seats = seats, "drift found; repairing through the pipeline");
        let event_id = format!("recon:{sub}:{}", fetched.version);
        let body = serde_json::json!({
            "id": event_id, "object": "event", "type": "customer.subscription.reconciled",
            "data": {"object": {"id": sub, "object": "subscription", "customer": customer}},
        })
        .to_string()
        .into_bytes();
        let key = EventKey::new("stripe", &endpoint, &event_id);
        let hash = payload_hash(&body);
        let expires_at = now_ms / 1000 + i64::from(self.settings.retention_days) * 86_400;
        let event = NewEvent {
            key: key.clone(),
            provider: "stripe".into(),
            endpoint,
            tenant,
            event_id,
            event_type: Some("customer.subscription.reconciled".into()),
            payload_hash: hash.clone(),
            content_hash: crate::identity::content_hash("stripe", &body),
            received_at_ms: now_ms,
            expires_at,
            shard: key.shard(self.ledger.shards()),
            send: SendLease {
                token: uuid::Uuid::new_v4().to_string(),
                until_ms: now_ms + crate::intake::SEND_LEASE_MS,
            },
        };
        if self.ledger.claim(&event).await? == Claim::New {
            self.ledger.store_payload(&key, &hash, &body, expires_at).await?;
            self.queue.send(&key).await?;
            self.ledger.mark_enqueued(&key, now_ms).await?;
            metrics::counter!("drift_repaired", "projection" => "entitlements").increment(1);
        }
        Ok(true)
    }

    /// Dead letters, parked records and the oldest unprocessed age, from the status index.
    async fn evidence(&self, now_ms: i64, summary: &mut Summary) -> Result<(), PortError> {
        let ops = crate::ops::Ops::new(self.ledger.clone(), NoQueue);
        summary.dead_letters = ops.count(Status::Dead).await?;
        summary.parked = ops.count(Status::Parked).await?;
        let mut oldest: Option<i64> = None;
        for status in [Status::Received, Status::Retryable, Status::Processing] {
            for shard in 0..self.ledger.shards() {
                let out = self
                    .ledger
                    .client()
                    .query()
                    .table_name(self.ledger.table())
                    .index_name(crate::adapters::dynamodb::STATUS_INDEX)
                    .key_condition_expression("st_shard = :p")
                    .expression_attribute_values(":p", AttributeValue::S(status_shard(status, shard)))
                    .scan_index_forward(true)
                    .limit(1)
                    .send()
                    .await
                    .map_err(|e| port_error("dynamodb", &e))?;
                if let Some(at) = out.items.unwrap_or_default().first().and_then(|i| get_n(i, attr::ST_AT)) {
                    oldest = Some(oldest.map_or(at, |o: i64| o.min(at)));
                }
            }
        }
        summary.oldest_unprocessed_age_ms = oldest.map(|o| (now_ms - o).max(0));
        Ok(())
    }

    fn emit(&self, s: &Summary, started: Instant) {
        for (reason, n) in &s.redriven {
            metrics::counter!("redriven", "reason" => reason.clone()).increment(*n);
        }
        metrics::counter!("outbox_republished").increment(s.outbox_republished);
        metrics::gauge!("dead_letters").set(s.dead_letters as f64);
        metrics::gauge!("parked").set(s.parked as f64);
        metrics::gauge!("stuck_leases").set(s.stuck_leases as f64);
        metrics::gauge!("drift_found_last_run").set(s.drift_found as f64);
        metrics::gauge!("oldest_unprocessed_age").set(s.oldest_unprocessed_age_ms.unwrap_or(0) as f64);
        metrics::histogram!("reconcile_duration").record(started.elapsed().as_secs_f64() * 1000.0);
        tracing::info!(summary = %serde_json::to_string(s).unwrap_or_default(), "reconciler run");
    }
}

/// The evidence queries never send.
struct NoQueue;

impl WorkQueue for NoQueue {
    async fn send(&self, _key: &EventKey) -> Result<(), PortError> {
        Err(PortError::Unavailable { service: "none", message: "read-only".into() })
    }
}
