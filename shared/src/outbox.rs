//! Effectively-once side effects outside DynamoDB: the transactional outbox.
//!
//! A projection's notification is written as an outbox item in the same
//! transaction as its state change and the completion marker, already
//! claimed by the lease that commits it (so its processor publishes and
//! marks it without a claim of its own); any other dispatcher (the sweep,
//! once that claim lapses) claims the item (conditional update), publishes to SNS with a stable
//! idempotency key derived from the event identity (message attribute always;
//! FIFO deduplication id when the topic is FIFO), and marks it sent. A crash
//! between publish and mark leaves the item claimed; once that claim lapses
//! the item is published again — with the same key, so consumers (and FIFO
//! topics) drop the repeat.
//!
//! ```text
//! PENDING(due_at) ──claim(token)──▶ SENDING(token, due_at = lease end) ──mark(token)──▶ SENT
//!    ▲                                │        │
//!    └── publish failed: backoff ◀────┘        └── attempts exhausted ──▶ DEAD (OUTBOX_DEAD# partition)
//!        (due_at = now + delay)     lease lapsed (dispatcher died): claimable again
//! ```
//!
//! Every write carries the dispatcher's token, and a write whose condition
//! fails looks at the item it met: when that item carries our own token, the
//! write was ours and committed (the SDK retried it after a lost
//! acknowledgement), and the dispatcher continues as the owner. The writes
//! are the [`OutboxStore`] port's (DynamoDB: `adapters::dynamodb::outbox`,
//! expressions in `adapters::dynamodb::conditions`); the publish is the
//! [`Publisher`]'s (`adapters::destinations`). Every route destination (an
//! SQS queue, an SNS topic, an EventBridge bus, an HTTPS endpoint) has a
//! circuit breaker ([`circuit`]): while it is open, its deliveries wait
//! (`defer`) without spending attempts, and a failing destination costs the
//! others nothing.

use std::sync::Arc;

use crate::clock::Ambient;
pub use crate::config::DispatchPolicy;
use crate::identity::EventKey;
use crate::ledger::PortError;
pub use crate::message::Dispatched;
use crate::message::{Held, MAX_COUNTED_BYTES, OutboxClaim, OutboxItem, envelope, message_group_id};
use crate::ports::{
    CircuitStore, DeliveryQueue, Dispatch, EventPayload, EventPayloads, OutboxStore, Publication, PublishError,
    Publisher,
};

pub mod circuit;
pub mod health;
pub mod limit;
mod queue;
pub use crate::message::Drains;
pub use circuit::{CircuitPolicy, Circuits, Gate};
pub use limit::{Grant, Limiter};
pub use queue::{DRAIN_PAGE, MAX_DELAY_MS, SWEEP_GROUP, UNWAITS_AT_ONCE};

pub use crate::message::DISPATCH_LEASE_MS;

/// Where a crash is injected in tests ("die between publish and mark").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DispatchFault {
    #[default]
    None,
    AfterPublishBeforeMark,
}

/// Claims, publishes and marks outbox items (see the module docs).
#[derive(Clone)]
pub struct Dispatcher<S, P> {
    store: S,
    publisher: P,
    policy: DispatchPolicy,
    ambient: Ambient,
    /// Where a route's delivery reads its event's payload from.
    payloads: Option<Arc<dyn EventPayloads>>,
    /// The data keys of sealed payloads ([`crate::sealing`]).
    keys: Option<Arc<dyn crate::ports::PayloadKeys>>,
    /// Route destinations' circuits as this container knows them.
    circuits: Arc<Circuits>,
    /// Where deliveries go to be sent apart (`HOOKLEDGER_DELIVERY_QUEUE_URL`);
    /// without it they are sent where they are met.
    queue: Option<Arc<dyn DeliveryQueue>>,
    /// The routes' destinations, by name (whose waiting deliveries drain).
    destinations: Arc<Vec<String>>,
    /// Destinations' limits, by name (those that have any).
    limits: Arc<std::collections::HashMap<String, crate::routes::Limits>>,
    /// Limited destinations' rate items as this container knows them.
    limiter: Arc<Limiter>,
    /// A grant at most this far ahead is waited for here; further, on the queue.
    wait_in_place_ms: i64,
    pub fault: DispatchFault,
}

/// The route destination an item goes to (its circuit's name); `None`: a
/// projection's notification (no route, no circuit).
fn destination_of(item: &OutboxItem) -> Option<&str> {
    item.delivery.as_ref().map(|d| d.destination.as_str())
}

/// Why a message could not be built: retry later, or never.
enum Unsendable {
    Retry(String),
    Never(String),
}

impl<S: OutboxStore + CircuitStore, P: Publisher> Dispatcher<S, P> {
    /// The outbox store it writes.
    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn with_ports(store: S, publisher: P) -> Self {
        Self {
            store,
            publisher,
            policy: DispatchPolicy::default(),
            ambient: Ambient::system(),
            payloads: None,
            keys: None,
            circuits: Arc::new(Circuits::new(CircuitPolicy::default())),
            queue: None,
            destinations: Arc::new(Vec::new()),
            limits: Arc::new(std::collections::HashMap::new()),
            limiter: Arc::new(Limiter::new()),
            wait_in_place_ms: limit::WAIT_IN_PLACE_MS,
            fault: DispatchFault::None,
        }
    }

    /// Waits for a grant at most `ms` ahead in place (default
    /// [`limit::WAIT_IN_PLACE_MS`]); a grant further ahead waits on the queue.
    pub fn with_wait_in_place(mut self, ms: i64) -> Self {
        self.wait_in_place_ms = ms.max(0);
        self
    }

    /// Destinations' rate and concurrency limits (`max_per_second`,
    /// `max_in_flight`), by name, with a limiter of its own (a clone made
    /// before keeps the one it had: another container's).
    pub fn with_limits(mut self, limits: impl IntoIterator<Item = (String, crate::routes::Limits)>) -> Self {
        self.limits = Arc::new(limits.into_iter().filter(|(_, l)| l.any()).collect());
        self.limiter = Arc::new(Limiter::new());
        self
    }

    /// Hands deliveries to `queue` (the delivery queue) to be sent apart.
    pub fn with_queue(mut self, queue: Arc<dyn DeliveryQueue>) -> Self {
        self.queue = Some(queue);
        self
    }

    /// The routes' destinations (their waiting deliveries drain when they are back).
    pub fn with_destinations(mut self, destinations: Vec<String>) -> Self {
        self.destinations = Arc::new(destinations);
        self
    }

    /// HTTPS destinations' circuits open and probe by `policy`.
    pub fn with_circuit_policy(mut self, policy: CircuitPolicy) -> Self {
        self.circuits = Arc::new(Circuits::new(policy));
        self
    }

    /// Reads the events of route deliveries from `payloads` (the ledger).
    pub fn with_payloads(mut self, payloads: Arc<dyn EventPayloads>) -> Self {
        self.payloads = Some(payloads);
        self
    }

    /// Opens sealed payloads with the data keys in `keys`.
    pub fn with_keys(mut self, keys: Arc<dyn crate::ports::PayloadKeys>) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Draws its claim tokens and backoff jitter from `ambient`.
    pub fn with_ambient(mut self, ambient: Ambient) -> Self {
        self.ambient = ambient;
        self
    }

    pub fn with_policy(mut self, policy: DispatchPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Claims, publishes and marks one outbox item. A failed publish puts the
    /// item back with a backoff (or DEAD when its attempts are exhausted) and
    /// is reported as `Retrying`/`Dead`, not as an error; `Err` means the
    /// ledger itself failed (the item stays as it was, or claimed until its
    /// lease lapses).
    pub async fn dispatch(&self, id: &str, now_ms: i64) -> Result<Dispatched, PortError> {
        self.dispatch_as(id, &self.ambient.token(), now_ms).await
    }

    /// [`Self::dispatch`] under `token`: a fresh one, or the claim its
    /// committing processor wrote a delivery under (the claim is met as
    /// ours, and continued).
    pub async fn dispatch_as(&self, id: &str, token: &str, now_ms: i64) -> Result<Dispatched, PortError> {
        self.dispatch_granted(id, token, None, now_ms).await
    }

    /// [`Self::dispatch_as`] of a delivery that holds its rate limit's
    /// grant (`slot`) already: it is sent at it, without another.
    pub async fn dispatch_granted(
        &self,
        id: &str,
        token: &str,
        slot: Option<i64>,
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        let token = token.to_owned();
        let item = match self.store.claim(id, &token, now_ms, now_ms + DISPATCH_LEASE_MS).await? {
            OutboxClaim::Claimed(item) => item,
            OutboxClaim::Skipped => return Ok(Dispatched::Skipped),
        };
        if item.delivery.is_none() && item.attempts > self.policy.max_attempts {
            // Dispatchers kept dying before they could record an outcome.
            let error = format!("{} claims without an outcome", item.attempts - 1);
            return self.failed(&item, &token, error, false, now_ms).await;
        }
        self.send(&item, &token, None, slot, now_ms).await
    }

    /// Sends and marks an item this dispatcher holds under `token`: a
    /// route's delivery its processor committed already claimed (two
    /// requests: the send, the mark), with the event's payload in hand.
    pub async fn dispatch_committed(
        &self,
        item: &OutboxItem,
        token: &str,
        payload: &[u8],
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        self.send(item, token, Some(payload), None, now_ms).await
    }

    /// The message of `item`: a notification's body, or a route's envelope
    /// with its event (`payload` when the caller holds it, else read); an
    /// envelope over the destination's limit refers to the payload in the
    /// payload bucket instead (`payload_ref`), never truncated.
    async fn message(&self, item: &OutboxItem, payload: Option<&[u8]>) -> Result<String, Unsendable> {
        let Some(d) = &item.delivery else { return Ok(item.body.clone()) };
        let payloads = self.payloads.as_ref();
        let key = EventKey::from_stored(&item.event_key)
            .ok_or_else(|| Unsendable::Never(format!("{} is not an event key", item.event_key)))?;
        let read;
        let payload = match payload {
            Some(p) => Some(p),
            None => {
                let payloads = payloads.ok_or_else(|| Unsendable::Retry("no payload reader".into()))?;
                match payloads.event_payload(&key, &d.payload_hash).await {
                    Ok(EventPayload::Bytes(bytes)) => {
                        // A sealed payload opens under its event's key; an
                        // erased event's never will.
                        read = match crate::ports::open_payload(self.keys.as_deref(), &key, bytes).await {
                            Ok(Ok(plain)) => plain,
                            Ok(Err(crate::sealing::Unreadable::Erased)) => {
                                return Err(Unsendable::Never("the event was erased".into()));
                            }
                            Ok(Err(e)) => return Err(Unsendable::Retry(e.to_string())),
                            Err(e) => return Err(Unsendable::Retry(format!("reading the data key: {e}"))),
                        };
                        Some(&read[..])
                    }
                    // In the bucket already: too large for any destination.
                    // A sealed one is not handed by reference: the
                    // destination could not open the object.
                    Ok(EventPayload::TooLarge) => match &self.keys {
                        Some(keys) => match keys.key_of(&key).await {
                            Ok(crate::sealing::KeyState::Missing) => None,
                            Ok(_) => {
                                return Err(Unsendable::Never(
                                    "a sealed payload over an item's size is not handed by reference (the destination could not open it)"
                                        .into(),
                                ));
                            }
                            Err(e) => return Err(Unsendable::Retry(format!("reading the data key: {e}"))),
                        },
                        None => None,
                    },
                    Ok(EventPayload::Gone) => return Err(Unsendable::Never("the event is gone (expired?)".into())),
                    Err(e) => return Err(Unsendable::Retry(format!("reading the event: {e}"))),
                }
            }
        };
        if let Some(p) = payload {
            let message = envelope(&item.body, p);
            // What the destination counts: the body and its attributes or entry fields.
            let counted = crate::routes::counted_bytes(
                &item.topic_arn,
                message.len(),
                &item.idempotency_key,
                Some(&d.source),
                Some(&d.detail_type),
            );
            if counted <= MAX_COUNTED_BYTES {
                return Ok(message);
            }
        }
        let too_large = || {
            Unsendable::Never(format!(
                "the envelope is over what the destination takes ({MAX_COUNTED_BYTES} bytes counted) and there is no payload bucket to refer to"
            ))
        };
        let payloads = payloads.ok_or_else(too_large)?;
        let reference = payloads
            .payload_ref(&key, &d.payload_hash, payload)
            .await
            .map_err(|e| Unsendable::Retry(format!("storing the payload for its reference: {e}")))?
            .ok_or_else(too_large)?;
        let reference = serde_json::to_value(&reference).map_err(|e| Unsendable::Never(e.to_string()))?;
        Ok(crate::message::envelope_with_ref(&item.body, &reference))
    }

    /// Builds, publishes and marks a claimed item.
    async fn send(
        &self,
        item: &OutboxItem,
        token: &str,
        payload: Option<&[u8]>,
        slot: Option<i64>,
        mut now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        let id = item.id.as_str();
        // A failure, a wait or a pause moves its due entry.
        self.store.note_activity(now_ms).await;
        // A destination whose circuit is open is not tried: its delivery
        // waits without spending an attempt.
        let destination = destination_of(item);
        let gate = match destination {
            Some(destination) => self.circuits.gate(&self.store, destination, token, now_ms).await,
            None => Gate::Send,
        };
        if let Gate::Wait { until_ms } = gate {
            return self.wait(item, token, until_ms, now_ms).await;
        }
        // Its destination's limits: a delivery over one waits for its turn.
        let limits = destination.and_then(|d| self.limits.get(d)).copied().unwrap_or_default();
        let mut granted_at = None;
        if let (Some(d), Some(step_ms)) = (destination, limits.step_ms) {
            let grant = match slot {
                Some(at) if at <= now_ms => Grant::Now { slot_ms: at },
                Some(at) => Grant::At { slot_ms: at },
                None => self.limiter.grant(&self.store, d, step_ms, now_ms).await,
            };
            match grant {
                Grant::Now { slot_ms } => granted_at = Some(slot_ms),
                Grant::At { slot_ms } if slot_ms - now_ms <= self.wait_in_place_ms => {
                    // Within a second: waited here, so the send is at its grant.
                    let wait = u64::try_from(slot_ms - now_ms).unwrap_or(0);
                    self.ambient.clock.sleep(std::time::Duration::from_millis(wait)).await;
                    now_ms = self.ambient.now_ms().max(slot_ms);
                    granted_at = Some(slot_ms);
                }
                Grant::At { slot_ms } => return self.pace(item, token, slot_ms, Some(slot_ms), now_ms).await,
                Grant::Later { retry_ms } => return self.pace(item, token, retry_ms, None, now_ms).await,
            }
        }
        let flight = match (destination, limits.in_flight) {
            (Some(d), Some(max)) => match self.limiter.take_flight(&self.store, d, max, token, now_ms).await {
                Some(flight) => Some(flight),
                None => {
                    let retry_ms = now_ms + limit::NO_FLIGHT_RETRY_MS;
                    return self.pace(item, token, retry_ms, granted_at, now_ms).await;
                }
            },
            _ => None,
        };
        let body = match self.message(item, payload).await {
            Ok(body) => body,
            Err(Unsendable::Retry(error)) => return self.failed(item, token, error, false, now_ms).await,
            Err(Unsendable::Never(error)) => return self.failed(item, token, error, true, now_ms).await,
        };
        // A group SQS and SNS take (a subject that is not: hashed, the same always).
        let group = message_group_id(&item.group);
        let idempotency_key = if item.attempts > 1 && crate::planted::is(crate::planted::Bug::NewDeliveryKeyOnRetry) {
            format!("{}-{}", item.idempotency_key, item.attempts)
        } else {
            item.idempotency_key.clone()
        };
        let out = Publication {
            target: &item.topic_arn,
            body: &body,
            idempotency_key: &idempotency_key,
            group: &group,
            source: item.delivery.as_ref().map(|d| d.source.as_str()),
            detail_type: item.delivery.as_ref().map(|d| d.detail_type.as_str()),
            destination: item.delivery.as_ref().map(|d| d.destination.as_str()),
            now_ms,
        };
        let sent = self.publisher.publish(out).await;
        if let (Some(d), Some(flight)) = (destination, &flight) {
            self.limiter.land(&self.store, d, flight).await;
        }
        if let (Some(d), Some(_), Err(PublishError::Retry { throttled: true, after_ms, .. })) =
            (destination, limits.step_ms, &sent)
        {
            // The partner asks us to slow down: its rate is lowered for a while.
            self.limiter.throttled(&self.store, d, *after_ms, now_ms).await;
        }
        if let Some(destination) = destination {
            // An answer, even a refusal, says the destination is up.
            let healthy = !matches!(sent, Err(PublishError::Retry { .. }));
            let closed =
                self.circuits.record(&self.store, destination, &gate, healthy, &self.ambient.token(), now_ms).await;
            if closed {
                // Back: its waiting deliveries drain through the queue now.
                self.start_drain(destination).await;
            }
        }
        match sent {
            Ok(()) => {}
            Err(PublishError::Permanent(error)) => return self.failed(item, token, error, true, now_ms).await,
            Err(PublishError::Refused { message, retry_for_ms }) => {
                // Retried while the delivery is younger than the bound, then DEAD.
                if now_ms - item.created_at_ms >= retry_for_ms {
                    let error = format!("{message} (refused past its {} s retry bound)", retry_for_ms / 1000);
                    return self.failed(item, token, error, true, now_ms).await;
                }
                return self.failed(item, token, message, false, now_ms).await;
            }
            // A failed probe: the circuit opens again and its delivery
            // waits with the others (it drains with them, not an hour later).
            Err(PublishError::Retry { .. }) if matches!(gate, Gate::Probe(_)) => {
                return self.wait(item, token, now_ms + self.circuits.policy().open_ms, now_ms).await;
            }
            Err(PublishError::Retry { message, after_ms, .. }) => {
                return self.failed_after(item, token, message, after_ms, now_ms).await;
            }
        }
        metrics::counter!("outbox_published").increment(1);
        if let Some(d) = &item.delivery {
            metrics::counter!("delivered", "destination" => d.destination.clone()).increment(1);
            metrics::histogram!("delivery_latency", "destination" => d.destination.clone())
                .record((now_ms - d.received_at_ms).max(0) as f64);
            if item.attempts > 1 {
                metrics::counter!("delivery_retried", "destination" => d.destination.clone()).increment(1);
            }
        }

        if self.fault == DispatchFault::AfterPublishBeforeMark {
            return Err(PortError::Unavailable {
                service: "injected",
                message: "crash after publish, before mark".into(),
            });
        }
        if self.store.mark_sent(id, token, granted_at, now_ms).await? == Held::Lapsed {
            tracing::warn!(outbox = %id,
                "published after the dispatch lease lapsed; the new owner republishes with the same key");
        }
        Ok(Dispatched::Published)
    }

    /// Not sent, its destination's circuit open: PENDING in its
    /// destination's waiting partition, the attempt given back, until the
    /// destination is back ([`Self::drain`]); DEAD once the delivery's bound
    /// has passed.
    async fn wait(&self, item: &OutboxItem, token: &str, until_ms: i64, now_ms: i64) -> Result<Dispatched, PortError> {
        if now_ms - item.created_at_ms >= self.policy.delivery_bound_ms {
            let error = "the destination's circuit stayed open past the delivery's bound".to_owned();
            return self.failed(item, token, error, true, now_ms).await;
        }
        let destination = destination_of(item).unwrap_or_default();
        let why = "waiting: the destination's circuit is open";
        let held = self.store.defer(&item.id, token, destination, item.shard, why, now_ms).await?;
        if held == Held::Lapsed {
            tracing::warn!(outbox = %item.id, "dispatch lease lapsed before the wait was recorded");
        }
        if let Some(d) = &item.delivery {
            metrics::counter!("delivery_waiting", "destination" => d.destination.clone()).increment(1);
        }
        Ok(Dispatched::Waiting { until_ms })
    }

    /// Not sent yet: its destination's limit lets it go at `at_ms` (with
    /// the grant `slot` it holds, if any). It waits on the delivery queue,
    /// claimed until then, no attempt spent; without a queue, PENDING due
    /// then (the sweep's). DEAD once the delivery's bound has passed.
    async fn pace(
        &self,
        item: &OutboxItem,
        token: &str,
        at_ms: i64,
        slot: Option<i64>,
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        if now_ms - item.created_at_ms >= self.policy.delivery_bound_ms {
            let error = "its destination's limit held it past the delivery's bound".to_owned();
            return self.failed(item, token, error, true, now_ms).await;
        }
        let destination = destination_of(item).unwrap_or_default().to_owned();
        if !self.hold_until(item, token, at_ms, slot, now_ms).await? {
            if self.queue.is_some() {
                // The claim lapsed: the dispatcher that holds it now sends it.
                tracing::warn!(outbox = %item.id, "dispatch lease lapsed before the delivery was paced");
                return Ok(Dispatched::Skipped);
            }
            let why = "waiting: its destination's limit";
            if self.store.back_off(&item.id, token, at_ms, why, now_ms).await? == Held::Lapsed {
                tracing::warn!(outbox = %item.id, "dispatch lease lapsed before the delivery was paced");
            }
        }
        metrics::counter!("delivery_paced", "destination" => destination).increment(1);
        Ok(Dispatched::Paced { until_ms: at_ms, granted: slot.is_some() })
    }

    /// A failed attempt whose answer asked for a pause (`Retry-After`): the
    /// next try no sooner than that (at most an hour), else as [`Self::failed`].
    async fn failed_after(
        &self,
        item: &OutboxItem,
        token: &str,
        error: String,
        after_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        self.record_failure(item, token, error, false, after_ms.map(|a| a.clamp(0, 3_600_000)), now_ms).await
    }

    async fn failed(
        &self,
        item: &OutboxItem,
        token: &str,
        error: String,
        permanent: bool,
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        self.record_failure(item, token, error, permanent, None, now_ms).await
    }

    /// Records a failed attempt: PENDING again after a backoff, or DEAD when
    /// the attempts are exhausted (a route's delivery: when it has been
    /// retried for [`DispatchPolicy::delivery_bound_ms`]), or at once when
    /// no retry can help (`permanent`).
    async fn record_failure(
        &self,
        item: &OutboxItem,
        token: &str,
        error: String,
        permanent: bool,
        at_least_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        let (id, shard, attempts) = (item.id.as_str(), item.shard, item.attempts);
        let dead = permanent
            || match &item.delivery {
                Some(_) => now_ms - item.created_at_ms >= self.policy.delivery_bound_ms,
                None => attempts >= self.policy.max_attempts,
            };
        let mut next_at_ms = now_ms;
        let held = if dead {
            self.store.dead(id, token, shard, &error, now_ms).await?
        } else {
            let delay = self.policy.backoff.delay_ms(attempts, self.ambient.jitter()).max(at_least_ms.unwrap_or(0));
            next_at_ms = now_ms + delay;
            self.store.back_off(id, token, next_at_ms, &error, now_ms).await?
        };
        if !dead && held == Held::Yes {
            // Its next try is the queue's own delay (further away: the sweep's).
            self.retry_later(item, next_at_ms - now_ms).await;
        }
        if held == Held::Lapsed {
            tracing::warn!(outbox = %id, "dispatch lease lapsed before the failure was recorded");
        }
        metrics::counter!("outbox_failed").increment(1);
        if let Some(d) = &item.delivery {
            let name = if dead { "delivery_dead" } else { "delivery_failed" };
            metrics::counter!(name, "destination" => d.destination.clone()).increment(1);
        }
        if dead {
            metrics::counter!("outbox_dead_lettered").increment(1);
            tracing::error!(outbox = %id, attempts, error = %error, "outbox item is DEAD: attempts exhausted");
            Ok(Dispatched::Dead { attempts, error })
        } else {
            tracing::warn!(outbox = %id, attempts, error = %error, "outbox publish failed; retrying after a backoff");
            Ok(Dispatched::Retrying { attempts, error, next_at_ms })
        }
    }

    /// Drains the waiting deliveries of destinations back, then publishes
    /// outbox items that are still pending (or whose dispatcher died) from
    /// the `due` index shards `out#000..`, oldest first, at most `limit`. Items younger than `grace_ms` are left to their processor.
    /// One item's or one shard's failure does not stop the others (it is
    /// rescheduled or logged); returns how many were published, or the first
    /// error when a query failed and nothing was published.
    pub async fn sweep(&self, shards: u32, now_ms: i64, grace_ms: i64, limit: usize) -> Result<usize, PortError> {
        // Destinations back first: their waiting deliveries drain.
        let mut published = self.drains(now_ms, limit).await.sent as usize;
        let mut failed = None;
        for shard in 0..shards {
            // One shard's failed query does not stop the others.
            let due = match self.store.due(shard, now_ms - grace_ms, limit).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(shard, error = %e, "outbox due query failed");
                    failed.get_or_insert(e);
                    continue;
                }
            };
            for id in due {
                if published >= limit {
                    return Ok(published);
                }
                match self.dispatch(&id, now_ms).await {
                    Ok(Dispatched::Published) => published += 1,
                    Ok(_) => {}
                    Err(e) => tracing::warn!(outbox = %id, error = %e, "outbox dispatch failed"),
                }
            }
        }
        match failed {
            // Nothing could be looked at or sent: say so.
            Some(e) if published == 0 => Err(e),
            _ => Ok(published),
        }
    }
}

/// What an operator sees and does with routes' deliveries (`hookledger deliveries`).
pub struct Deliveries<S> {
    store: S,
    shards: u32,
}

impl<S: OutboxStore> Deliveries<S> {
    pub fn new(store: S, shards: u32) -> Self {
        Self { store, shards }
    }

    /// The event's delivery to each of these destinations (those it has).
    pub async fn of_event(
        &self,
        key: &EventKey,
        destinations: &[&str],
    ) -> Result<Vec<crate::message::OutboxState>, PortError> {
        let mut out = Vec::new();
        for d in destinations {
            let id = crate::message::outbox_id(key.as_str(), &crate::routes::delivery_action(d));
            if let Some(state) = self.store.state(&id).await? {
                out.push(state);
            }
        }
        Ok(out)
    }

    /// The DEAD deliveries to `destination` (at most `limit` per shard).
    pub async fn dead_of(
        &self,
        destination: &str,
        limit: usize,
    ) -> Result<Vec<crate::message::OutboxState>, PortError> {
        let mut out = Vec::new();
        for shard in 0..self.shards {
            for id in self.store.dead_items(shard, limit).await? {
                if let Some(state) = self.store.state(&id).await? {
                    if state.destination.as_deref() == Some(destination) {
                        out.push(state);
                    }
                }
            }
        }
        Ok(out)
    }

    /// A DEAD delivery, due again now with the same key (the sweep sends
    /// it), who and why on the item and in the audit log, in one write.
    /// `run` names the replaying command: a rerun of it does not replay (or
    /// audit) again what it replayed. `Ok(false)`: it is not DEAD.
    pub async fn replay(
        &self,
        delivery: &crate::message::OutboxState,
        run: &str,
        caller: &crate::audit::Caller,
        reason: &str,
        now_ms: i64,
    ) -> Result<bool, PortError> {
        let key = EventKey::from_stored(&delivery.event_key);
        let shard = key.as_ref().map_or(0, |k| k.shard(self.shards));
        let mut entry =
            crate::audit::AuditEntry::new("", now_ms, crate::audit::verb::DELIVERY_REPLAY, &delivery.id, caller)
                .because(reason);
        if let Some(k) = &key {
            entry = entry.on_record(k);
        }
        self.store.note_activity(now_ms).await;
        let replayed = self.store.revive(&delivery.id, run, shard, &entry).await?;
        if replayed {
            tracing::info!(outbox = %delivery.id, operator = %caller.operator, "delivery replayed");
            metrics::counter!("delivery_replayed", "destination" => delivery.destination.clone().unwrap_or_default())
                .increment(1);
        }
        Ok(replayed)
    }
}

impl<S: OutboxStore + CircuitStore, P: Publisher> Dispatch for Dispatcher<S, P> {
    async fn dispatch(&self, id: &str, now_ms: i64) -> Result<Dispatched, PortError> {
        Dispatcher::dispatch(self, id, now_ms).await
    }

    async fn dispatch_committed(
        &self,
        item: &OutboxItem,
        token: &str,
        payload: &[u8],
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        Dispatcher::dispatch_committed(self, item, token, payload, now_ms).await
    }

    async fn due(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
        self.store.due(shard, up_to, limit).await
    }

    fn queued(&self) -> bool {
        Dispatcher::queued(self)
    }

    fn destinations(&self) -> Vec<String> {
        self.destinations.as_ref().clone()
    }

    async fn hand_over_committed(&self, items: &[OutboxItem], token: &str) -> bool {
        Dispatcher::hand_over_committed(self, items, token).await
    }

    async fn hand_over_ids(&self, ids: &[String]) -> usize {
        Dispatcher::hand_over_ids(self, ids).await
    }

    async fn drains(&self, now_ms: i64, budget: usize) -> Drains {
        Dispatcher::drains(self, now_ms, budget).await
    }
}

#[cfg(test)]
mod tests;
