//! Rate and concurrency limits per destination (`max_per_second`,
//! `max_in_flight` on a route's destination), enforced across every
//! dispatcher by one item per destination in the ledger (`dest#<name>`,
//! `sk = "rate"`, beside its circuit).
//!
//! ```text
//! rate:      next_at ──grant (one write)──▶ next_at + step     the grant is the old next_at (or now, when idle)
//!            a grant within 1 s: the dispatcher waits for it, then sends
//!            a grant further (≤ 15 min): the delivery waits on the delivery queue, claimed until then
//!            no grant within 15 min: the delivery waits on the queue and asks again then
//! throttled: a 429 or a Retry-After ──▶ next_at = now + Retry-After (1 s without one, at most 1 h),
//!            the step doubled (at most 16×) until 5 minutes after that
//! in flight: flights ∪ {until#token} (refused at max) ──send── flights ∖ {until#token}
//! ```
//!
//! Grants are at least one step (`1000 / max_per_second` ms, rounded up)
//! apart in the order the item takes them, whoever takes them and whatever
//! their clocks say, so no one-second window holds more grants than the
//! rate. A write whose acknowledgement is lost and is retried takes a
//! second slot: the first is wasted, never one too many. A dispatcher that
//! dies after its grant wastes that grant; one that dies in flight holds
//! its flight until its time is up ([`FLIGHT_MS`]), when the next refused
//! taker clears it. When the item cannot be read or written, the delivery
//! waits (a limit is a promise to the partner): it is never failed for it.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::ports::{CircuitStore, Rate, RateChange, RateWritten};

/// The furthest ahead a grant is taken (SQS's longest delay: the delivery
/// waits for it on the delivery queue).
pub const GRANT_AHEAD_MS: i64 = super::queue::MAX_DELAY_MS;
/// A grant at most this far ahead is waited for in the dispatcher (then
/// the send is at its grant, not up to a second later).
pub const WAIT_IN_PLACE_MS: i64 = 1_000;
/// A throttled destination's pause without a `Retry-After`.
pub const DEFAULT_PAUSE_MS: i64 = 1_000;
/// The longest pause a `Retry-After` sets.
pub const MAX_PAUSE_MS: i64 = 3_600_000;
/// How long after its pause a throttled destination's step stays longer.
pub const SLOW_FOR_MS: i64 = 300_000;
/// The most a throttled destination's step is lengthened.
pub const MAX_SLOW_FACTOR: u32 = 16;
/// A flight's time: a dispatcher that has not landed it by then died (the
/// claim's own lease: a send cannot outlive it).
pub const FLIGHT_MS: i64 = crate::message::DISPATCH_LEASE_MS;
/// A delivery that found every flight taken looks again this much later.
pub const NO_FLIGHT_RETRY_MS: i64 = 1_000;

/// What the rate limit says of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Its grant (`slot_ms`) is now or past: send.
    Now { slot_ms: i64 },
    /// Its grant is `slot_ms`, ahead: send then, not before.
    At { slot_ms: i64 },
    /// No grant within [`GRANT_AHEAD_MS`]: ask again at `retry_ms`.
    Later { retry_ms: i64 },
}

/// Every limited destination's rate item as this container last saw it.
/// `next_at` only ever grows, so a copy is a lower bound: a copy already
/// beyond the horizon answers [`Grant::Later`] without a write.
#[derive(Default)]
pub struct Limiter {
    known: Mutex<HashMap<String, Rate>>,
}

/// The step between grants in force: longer while the destination is slowed.
pub fn step_in_force(step_ms: i64, rate: &Rate, now_ms: i64) -> i64 {
    match rate.slow_until {
        Some(until) if until > now_ms => step_ms.saturating_mul(i64::from(rate.slow_factor.max(1))),
        _ => step_ms,
    }
}

impl Limiter {
    pub fn new() -> Self {
        Self::default()
    }

    fn known(&self, destination: &str) -> Rate {
        let known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        known.get(destination).cloned().unwrap_or_default()
    }

    fn remember(&self, destination: &str, rate: Rate) {
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let keep = known.get(destination).is_some_and(|k| k.next_at > rate.next_at);
        if !keep {
            known.insert(destination.to_owned(), rate);
        }
    }

    /// A grant for one send to `destination`, whose step is `step_ms`.
    pub async fn grant<S: CircuitStore>(&self, store: &S, destination: &str, step_ms: i64, now_ms: i64) -> Grant {
        let mut known = self.known(destination);
        let beyond = |next: i64| next - now_ms > GRANT_AHEAD_MS;
        if let Some(next) = known.next_at.filter(|n| beyond(*n)) {
            return Grant::Later { retry_ms: next - GRANT_AHEAD_MS };
        }
        let mut idle = known.next_at.is_none_or(|n| n <= now_ms);
        // Each refusal tells which form the next try takes: a few suffice.
        for _ in 0..4 {
            let step = step_in_force(step_ms, &known, now_ms);
            let change = if idle {
                RateChange::GrantNow { step_ms: step, now_ms }
            } else {
                RateChange::GrantNext { step_ms: step, horizon_ms: GRANT_AHEAD_MS, now_ms }
            };
            match store.change_rate(destination, change).await {
                Ok(RateWritten::Applied(rate)) => {
                    let slot = rate.next_at.unwrap_or(now_ms + step) - step;
                    self.remember(destination, rate);
                    metrics::counter!("delivery_granted", "destination" => destination.to_owned()).increment(1);
                    return if slot <= now_ms { Grant::Now { slot_ms: slot } } else { Grant::At { slot_ms: slot } };
                }
                Ok(RateWritten::Refused(met)) => {
                    let met = met.unwrap_or_default();
                    match met.next_at {
                        Some(next) if beyond(next) => {
                            self.remember(destination, met);
                            return Grant::Later { retry_ms: next - GRANT_AHEAD_MS };
                        }
                        Some(next) => idle = next <= now_ms,
                        None => idle = true,
                    }
                    self.remember(destination, met.clone());
                    known = met;
                }
                Err(e) => {
                    tracing::warn!(destination, error = %e, "rate limit unwritable; the delivery waits");
                    break;
                }
            }
        }
        Grant::Later { retry_ms: now_ms + WAIT_IN_PLACE_MS }
    }

    /// The destination throttled a send (a 429, or an answer with a
    /// `Retry-After` of `after_ms`): no grant before the pause is over, and
    /// the step twice as long as it was (at most [`MAX_SLOW_FACTOR`]×)
    /// until [`SLOW_FOR_MS`] after it.
    pub async fn throttled<S: CircuitStore>(&self, store: &S, destination: &str, after_ms: Option<i64>, now_ms: i64) {
        let known = self.known(destination);
        let was = if known.slow_until.is_some_and(|u| u > now_ms) { known.slow_factor.max(1) } else { 1 };
        let factor = (was * 2).min(MAX_SLOW_FACTOR);
        let resume_ms = now_ms + after_ms.unwrap_or(DEFAULT_PAUSE_MS).clamp(0, MAX_PAUSE_MS);
        let until_ms = resume_ms + SLOW_FOR_MS;
        let slow = RateChange::Slow { resume_ms, factor, until_ms, now_ms };
        let written = match store.change_rate(destination, slow).await {
            Ok(RateWritten::Refused(_)) => {
                store.change_rate(destination, RateChange::SlowKeep { factor, until_ms, now_ms }).await
            }
            other => other,
        };
        match written {
            Ok(RateWritten::Applied(rate)) => {
                tracing::warn!(destination, resume_ms, factor, "destination throttled us: its rate is lowered");
                metrics::counter!("delivery_throttled", "destination" => destination.to_owned()).increment(1);
                self.remember(destination, rate);
            }
            Ok(RateWritten::Refused(_)) => {}
            Err(e) => tracing::warn!(destination, error = %e, "throttling unrecorded; the next 429 records it"),
        }
    }

    /// One send in flight to `destination`, of at most `max`: the flight
    /// to land after the send, or `None` while `max` are in flight (or the
    /// item cannot be written: the delivery waits).
    pub async fn take_flight<S: CircuitStore>(
        &self,
        store: &S,
        destination: &str,
        max: u32,
        token: &str,
        now_ms: i64,
    ) -> Option<String> {
        let flight = format!("{:013}#{token}", now_ms + FLIGHT_MS);
        for _ in 0..2 {
            match store.change_rate(destination, RateChange::TakeFlight { flight: &flight, max }).await {
                Ok(RateWritten::Applied(_)) => return Some(flight),
                Ok(RateWritten::Refused(met)) => {
                    let flights = met.map(|m| m.flights).unwrap_or_default();
                    // Our own earlier take, its acknowledgement lost.
                    if flights.contains(&flight) {
                        return Some(flight);
                    }
                    let expired: Vec<String> = flights.into_iter().filter(|f| flight_until(f) < now_ms).collect();
                    if expired.is_empty() {
                        return None;
                    }
                    if let Err(e) = store.change_rate(destination, RateChange::Clean { expired: &expired }).await {
                        tracing::warn!(destination, error = %e, "expired flights not cleared");
                        return None;
                    }
                }
                Err(e) => {
                    tracing::warn!(destination, error = %e, "flight unwritable; the delivery waits");
                    return None;
                }
            }
        }
        None
    }

    /// A send landed: its flight out (a failure is logged: the flight's time runs out).
    pub async fn land<S: CircuitStore>(&self, store: &S, destination: &str, flight: &str) {
        if let Err(e) = store.change_rate(destination, RateChange::Land { flight }).await {
            tracing::warn!(destination, error = %e, "flight not landed; it clears when its time is up");
        }
    }
}

/// When a flight's time is up (`<until>#<token>`).
pub fn flight_until(flight: &str) -> i64 {
    flight.split('#').next().and_then(|u| u.parse().ok()).unwrap_or(0)
}
