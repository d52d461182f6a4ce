//! The delivery queue: deliveries sent apart from the processor, by the
//! dispatcher's own concurrency (the processor function's second event
//! source), each destination its own message group.
//!
//! ```text
//! processor commit ──Deliver{id, its claim}──▶ delivery queue ──▶ dispatcher: claim (ours), send, mark
//! a failed try      ──Deliver{id}, delayed (≤ 900 s)──▶ …        (further: the sweep, when due)
//! circuit open      ── the delivery waits in wait#<destination> (no message, no write per retry)
//! probe through     ──Drain{destination}──▶ dispatcher: 100 waiting → home partition, handed on,
//!                                            and the next Drain while the page was full
//! reconciler run    ──Drain{destination} for a destination back with deliveries waiting;
//!                     due items its sweep finds (their message lost) handed on in tens
//! ```
//!
//! Every hand-over is best effort: a delivery whose message is lost is due
//! in its home partition (or still waiting), where the reconciler finds it.
//! A message met twice is harmless: the claim keeps each delivery single.

use crate::ledger::PortError;
use crate::message::{Dispatched, Drains, OutboxItem};
use crate::ports::{CircuitStore, DeliveryMessage, Handover, OutboxStore, Publisher};

use super::{Dispatcher, destination_of};

/// Waiting deliveries moved and handed on per drain step.
pub const DRAIN_PAGE: usize = 100;
/// Waiting deliveries a drain step moves at once.
pub const UNWAITS_AT_ONCE: usize = 10;
/// The longest delay SQS gives a message (15 minutes): a retry due later is
/// left to the sweep.
pub const MAX_DELAY_MS: i64 = 900_000;
/// The message group of what the sweep hands on (it reads ids only).
pub const SWEEP_GROUP: &str = "sweep";
/// The message group of a projection's notification retried.
const NOTIFICATIONS_GROUP: &str = "notifications";

fn deliver(id: &str, token: Option<&str>, group: &str, delay_ms: i64) -> Handover {
    Handover {
        message: DeliveryMessage::Deliver { outbox: id.to_owned(), token: token.map(str::to_owned), at: None },
        group: group.to_owned(),
        delay_s: u32::try_from((delay_ms.clamp(0, MAX_DELAY_MS) + 999) / 1000).unwrap_or(900),
    }
}

impl<S: OutboxStore + CircuitStore, P: Publisher> Dispatcher<S, P> {
    /// Whether deliveries are handed to a delivery queue.
    pub fn queued(&self) -> bool {
        self.queue.is_some()
    }

    /// Sends what `messages` asks; the caller's hand-over is best effort, so
    /// failures are logged and counted, not returned.
    async fn hand(&self, messages: &[Handover]) -> usize {
        let Some(queue) = &self.queue else { return 0 };
        if messages.is_empty() {
            return 0;
        }
        let results = queue.hand_over(messages).await;
        let mut handed = 0;
        for (m, r) in messages.iter().zip(results) {
            match r {
                Ok(()) => handed += 1,
                Err(e) => {
                    metrics::counter!("delivery_handover_failed").increment(1);
                    tracing::warn!(message = ?m.message, error = %e, "delivery not handed on; the sweep finds it");
                }
            }
        }
        handed
    }

    /// A commit's deliveries, still claimed by the lease that committed them
    /// (`token`), handed to the queue: the processor does not wait for
    /// them. `false`: there is no queue (the caller sends them itself).
    pub async fn hand_over_committed(&self, items: &[OutboxItem], token: &str) -> bool {
        if self.queue.is_none() {
            return false;
        }
        let messages: Vec<Handover> = items
            .iter()
            .map(|i| deliver(&i.id, Some(token), destination_of(i).unwrap_or(NOTIFICATIONS_GROUP), 0))
            .collect();
        self.hand(&messages).await;
        true
    }

    /// Items the sweep found due (their message lost, or due past SQS's
    /// delay) handed to the queue in tens; how many were.
    pub async fn hand_over_ids(&self, ids: &[String]) -> usize {
        let messages: Vec<Handover> = ids.iter().map(|id| deliver(id, None, SWEEP_GROUP, 0)).collect();
        self.hand(&messages).await
    }

    /// A failed try's next one, as the queue's own delay when it is within
    /// SQS's 15 minutes; further away, the sweep takes it when it is due.
    pub(super) async fn retry_later(&self, item: &OutboxItem, delay_ms: i64) {
        if self.queue.is_some() && delay_ms <= MAX_DELAY_MS {
            let group = destination_of(item).unwrap_or(NOTIFICATIONS_GROUP);
            self.hand(&[deliver(&item.id, None, group, delay_ms)]).await;
        }
    }

    /// A claimed delivery its destination's limit holds back until
    /// `at_ms`: kept claimed until a lease past then (the sweep leaves it
    /// alone) and handed back to the queue to come back then, with its
    /// grant (`slot`) when it holds one. `false`: the claim lapsed (another
    /// dispatcher has it) or there is no queue.
    pub(super) async fn hold_until(
        &self,
        item: &OutboxItem,
        token: &str,
        at_ms: i64,
        slot: Option<i64>,
        now_ms: i64,
    ) -> Result<bool, PortError> {
        if self.queue.is_none() {
            return Ok(false);
        }
        let held = self.store.hold(&item.id, token, at_ms + crate::message::DISPATCH_LEASE_MS).await?;
        if held == crate::message::Held::Lapsed {
            return Ok(false);
        }
        // Back a little before its time (whole seconds, at least one): the
        // rest is waited in place.
        let delay_s = u32::try_from(((at_ms - now_ms) / 1000).clamp(1, MAX_DELAY_MS / 1000)).unwrap_or(900);
        let message = DeliveryMessage::Deliver { outbox: item.id.clone(), token: Some(token.to_owned()), at: slot };
        let group = destination_of(item).unwrap_or(NOTIFICATIONS_GROUP).to_owned();
        // Lost: the item is due when its hold is over, and the sweep finds it.
        self.hand(&[Handover { message, group, delay_s }]).await;
        Ok(true)
    }

    /// Asks the queue to drain `destination`'s waiting deliveries.
    pub(super) async fn start_drain(&self, destination: &str) -> bool {
        let drain = Handover {
            message: DeliveryMessage::Drain { destination: destination.to_owned() },
            group: destination.to_owned(),
            delay_s: 0,
        };
        self.hand(&[drain]).await == 1
    }

    /// One drain step: as many of `destination`'s waiting deliveries as its
    /// circuit lets go (a page of [`DRAIN_PAGE`] when closed, the probe's
    /// one when its open time is up, none while open), each moved back to
    /// its home partition (due now) and handed on; while the page was full
    /// the next step is handed on too. Returns the deliveries moved.
    pub async fn drain(&self, destination: &str, now_ms: i64) -> Result<Vec<String>, PortError> {
        let allowed = self.circuits.drainable(&self.store, destination, now_ms).await;
        if allowed == 0 {
            return Ok(Vec::new());
        }
        let page = self.store.waiting(destination, now_ms, allowed.min(DRAIN_PAGE)).await?;
        let mut moved = Vec::with_capacity(page.len());
        let mut failed = None;
        // Ten moves at a time: a page takes ten requests' time, not a hundred.
        for chunk in page.chunks(UNWAITS_AT_ONCE) {
            let moves = chunk.iter().map(|id| self.store.unwait(id, destination, now_ms));
            for (id, result) in chunk.iter().zip(futures::future::join_all(moves).await) {
                match result {
                    Ok(true) => moved.push(id.clone()),
                    Ok(false) => {}
                    // What moved is handed on; the rest still waits.
                    Err(e) => failed = Some(e),
                }
            }
            if failed.is_some() {
                break;
            }
        }
        let mut messages: Vec<Handover> = moved.iter().map(|id| deliver(id, None, destination, 0)).collect();
        if failed.is_none() && page.len() == DRAIN_PAGE && allowed == usize::MAX {
            messages.push(Handover {
                message: DeliveryMessage::Drain { destination: destination.to_owned() },
                group: destination.to_owned(),
                delay_s: 0,
            });
        }
        self.hand(&messages).await;
        if !moved.is_empty() {
            metrics::counter!("delivery_drained", "destination" => destination.to_owned())
                .increment(moved.len() as u64);
        }
        match failed {
            Some(e) if moved.is_empty() => Err(e),
            _ => Ok(moved),
        }
    }

    /// One message of the delivery queue, taken. `Err`: the ledger failed
    /// (the message comes back after its visibility timeout).
    pub async fn take(&self, message: &DeliveryMessage, now_ms: i64) -> Result<Option<Dispatched>, PortError> {
        match message {
            DeliveryMessage::Deliver { outbox, token, at } => {
                let token = token.clone().unwrap_or_else(|| self.ambient.token());
                self.dispatch_granted(outbox, &token, *at, now_ms).await.map(Some)
            }
            DeliveryMessage::Drain { destination } => self.drain(destination, now_ms).await.map(|_| None),
        }
    }

    /// For a reconciler run: each destination back (or due a probe) with
    /// deliveries waiting gets a drain, handed to the queue; without one,
    /// the run drains and sends them itself, at most `budget`.
    pub async fn drains(&self, now_ms: i64, budget: usize) -> Drains {
        let mut out = Drains::default();
        let mut left = budget;
        // Every destination's circuit in one read.
        self.circuits.prime(&self.store, &self.destinations, now_ms).await;
        for destination in self.destinations.iter() {
            if self.circuits.is_open(&self.store, destination, now_ms).await {
                out.open += 1;
            }
            if self.circuits.drainable(&self.store, destination, now_ms).await == 0 {
                continue;
            }
            match self.store.waiting(destination, now_ms, 1).await {
                Ok(w) if w.is_empty() => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(destination, error = %e, "waiting deliveries unreadable; the next run looks again");
                    continue;
                }
            }
            if self.queue.is_some() {
                if self.start_drain(destination).await {
                    out.started += 1;
                }
                continue;
            }
            while left > 0 {
                let moved = match self.drain(destination, now_ms).await {
                    Ok(moved) => moved,
                    Err(e) => {
                        tracing::warn!(destination, error = %e, "drain failed; the next run drains again");
                        break;
                    }
                };
                if moved.is_empty() {
                    break;
                }
                for id in moved {
                    // Past the budget, moved ones are due in their home partition: the sweep's.
                    if left == 0 {
                        break;
                    }
                    left -= 1;
                    match self.dispatch(&id, now_ms).await {
                        Ok(Dispatched::Published) => out.sent += 1,
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(outbox = %id, error = %e, "drained delivery not sent; the sweep retries")
                        }
                    }
                }
            }
        }
        out
    }
}
