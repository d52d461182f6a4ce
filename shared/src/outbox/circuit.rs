//! A circuit breaker per route destination (every kind), its state in one item per
//! destination (`dest#<name>`, [`CircuitStore`]) shared by every
//! dispatcher, each container keeping its own copy for at most
//! [`CircuitPolicy::read_every_ms`].
//!
//! ```text
//!   closed ──N failures in a row──▶ open(until) ──time up──▶ one probe ──through──▶ closed
//!                                        ▲                      │
//!                                        └──────failed──────────┘
//! ```
//!
//! The item is written only when the circuit changes and on failures: a
//! healthy destination costs one read per container per interval and no
//! write. While a destination's circuit is open its deliveries are not
//! sent: they wait (PENDING, due when it may be tried again) without
//! spending an attempt, and every other destination is untouched. Once the
//! open time is up, one dispatcher takes the probe (a conditional write),
//! and its delivery is the probe: through, the circuit closes and the
//! waiting deliveries go out as they come due; failed, it opens again.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::ledger::PortError;
use crate::ports::{Circuit, CircuitChange, CircuitStore};

/// When a destination's circuit opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitPolicy {
    /// Failed sends in a row that open it.
    pub threshold: u32,
    /// How long it stays open before a probe may go.
    pub open_ms: i64,
    /// How long a probe is out before another dispatcher may probe.
    pub probe_ms: i64,
    /// How long a container trusts its copy of a circuit.
    pub read_every_ms: i64,
}

impl Default for CircuitPolicy {
    fn default() -> Self {
        Self { threshold: 5, open_ms: 60_000, probe_ms: 30_000, read_every_ms: 10_000 }
    }
}

/// What a dispatcher may do with a delivery to a destination now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// The circuit is closed: send.
    Send,
    /// The circuit's open time is up and this dispatcher holds the probe
    /// (its token): send this one delivery.
    Probe(String),
    /// Open (or another dispatcher's probe is out): do not send before then.
    Wait { until_ms: i64 },
}

/// Every destination's circuit as this container knows it.
pub struct Circuits {
    policy: CircuitPolicy,
    known: Mutex<HashMap<String, (i64, Circuit)>>,
}

impl Circuits {
    pub fn new(policy: CircuitPolicy) -> Self {
        Self { policy, known: Mutex::new(HashMap::new()) }
    }

    pub fn policy(&self) -> CircuitPolicy {
        self.policy
    }

    fn cached(&self, destination: &str, now_ms: i64) -> Option<Circuit> {
        let known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        known
            .get(destination)
            .filter(|(read_at, _)| now_ms - read_at < self.policy.read_every_ms && now_ms >= *read_at)
            .map(|(_, c)| c.clone())
    }

    fn remember(&self, destination: &str, circuit: Circuit, now_ms: i64) {
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        known.insert(destination.to_owned(), (now_ms, circuit));
    }

    fn forget(&self, destination: &str) {
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        known.remove(destination);
    }

    /// This container's copy of `destination`'s circuit, read again when it
    /// is older than [`CircuitPolicy::read_every_ms`]; `None`: unreadable
    /// (logged; the caller lets its delivery go).
    async fn read<S: CircuitStore>(&self, store: &S, destination: &str, now_ms: i64) -> Option<Circuit> {
        if let Some(c) = self.cached(destination, now_ms) {
            return Some(c);
        }
        match store.circuit(destination).await {
            Ok(c) => {
                let c = c.unwrap_or_default();
                self.remember(destination, c.clone(), now_ms);
                Some(c)
            }
            Err(e) => {
                tracing::warn!(destination, error = %e, "circuit unreadable; its deliveries go");
                None
            }
        }
    }

    /// Whether a delivery to `destination` may go now. A circuit that
    /// cannot be read lets it go (the breaker protects the destination and
    /// the dispatchers' time; it never holds a delivery on its own failure).
    pub async fn gate<S: CircuitStore>(&self, store: &S, destination: &str, token: &str, now_ms: i64) -> Gate {
        let Some(circuit) = self.read(store, destination, now_ms).await else { return Gate::Send };
        let Some(open_until) = circuit.open_until else { return Gate::Send };
        if open_until > now_ms {
            return Gate::Wait { until_ms: open_until };
        }
        if let Some(probe_until) = circuit.probe_until.filter(|p| *p > now_ms) {
            return Gate::Wait { until_ms: probe_until };
        }
        let change = CircuitChange::Probe { token, until_ms: now_ms + self.policy.probe_ms, now_ms };
        match store.change_circuit(destination, change).await {
            Ok(Some(c)) => {
                self.remember(destination, c, now_ms);
                Gate::Probe(token.to_owned())
            }
            Ok(None) => {
                // Another dispatcher probes (or it opened again): look again next time.
                self.forget(destination);
                Gate::Wait { until_ms: now_ms + self.policy.probe_ms }
            }
            Err(e) => {
                tracing::warn!(destination, error = %e, "circuit probe unwritable; waiting");
                Gate::Wait { until_ms: now_ms + self.policy.probe_ms }
            }
        }
    }

    /// Reads the circuits of `destinations` this container does not hold a
    /// fresh copy of, together (one request); a failed read is only logged
    /// (each is read alone when asked).
    pub async fn prime<S: CircuitStore>(&self, store: &S, destinations: &[String], now_ms: i64) {
        let stale: Vec<String> = destinations.iter().filter(|d| self.cached(d, now_ms).is_none()).cloned().collect();
        if stale.is_empty() {
            return;
        }
        match store.circuits(&stale).await {
            Ok(circuits) => {
                for (d, c) in stale.iter().zip(circuits) {
                    self.remember(d, c.unwrap_or_default(), now_ms);
                }
            }
            Err(e) => tracing::warn!(error = %e, "circuits unreadable together; each is read alone"),
        }
    }

    /// Whether `destination`'s circuit is open (read as [`Self::drainable`] reads it).
    pub async fn is_open<S: CircuitStore>(&self, store: &S, destination: &str, now_ms: i64) -> bool {
        self.read(store, destination, now_ms).await.is_some_and(|c| c.open_until.is_some())
    }

    /// How many of `destination`'s waiting deliveries may be handed on now:
    /// all of them (`usize::MAX`) while its circuit is closed (or cannot be
    /// read), one (the probe's) once its open time is up, none while open
    /// or when it never opened (nothing can be waiting).
    /// Reads the item at most once per [`CircuitPolicy::read_every_ms`];
    /// takes no probe (the dispatcher that sends the delivery does).
    pub async fn drainable<S: CircuitStore>(&self, store: &S, destination: &str, now_ms: i64) -> usize {
        let Some(circuit) = self.read(store, destination, now_ms).await else { return usize::MAX };
        match circuit.open_until {
            // Never opened (neither opened nor closed by a probe): nothing ever waited for it.
            None if circuit.open_token.is_none() && circuit.close_token.is_none() => 0,
            None => usize::MAX,
            Some(until) if until > now_ms => 0,
            Some(_) if circuit.probe_until.is_some_and(|p| p > now_ms) => 0,
            Some(_) => 1,
        }
    }

    /// Records how a send through `gate` went: `healthy` (an answer, even a
    /// refusal: the destination is up) or not (no answer, a 5xx, 408, 429).
    /// Writes only on a change or a failure. A write that fails is logged:
    /// the next failure or success writes again. `true`: this send was the
    /// probe and closed the circuit (its waiting deliveries may drain).
    pub async fn record<S: CircuitStore>(
        &self,
        store: &S,
        destination: &str,
        gate: &Gate,
        healthy: bool,
        token: &str,
        now_ms: i64,
    ) -> bool {
        let known = self.cached(destination, now_ms).unwrap_or_default();
        let mut reopened = false;
        let result = if healthy {
            let probe = match gate {
                Gate::Probe(token) => Some(token.as_str()),
                _ => None,
            };
            if probe.is_none() && known.failures == 0 && known.open_until.is_none() {
                return false;
            }
            let closed = store.change_circuit(destination, CircuitChange::Close { now_ms, probe }).await;
            if probe.is_some() && matches!(closed, Ok(Some(_))) {
                reopened = true;
                tracing::info!(destination, "circuit closed: the probe got through");
                metrics::counter!("circuit_closed", "destination" => destination.to_owned()).increment(1);
            }
            closed
        } else if matches!(gate, Gate::Probe(_)) {
            self.open(store, destination, token, now_ms).await
        } else {
            match store.change_circuit(destination, CircuitChange::Failure { token, now_ms }).await {
                Ok(Some(c)) if c.failures >= self.policy.threshold && c.open_until.is_none_or(|u| u <= now_ms) => {
                    self.open(store, destination, token, now_ms).await
                }
                other => other,
            }
        };
        match result {
            Ok(Some(c)) => self.remember(destination, c, now_ms),
            Ok(None) => self.forget(destination),
            Err(e) => {
                tracing::warn!(destination, error = %e, "circuit unwritable");
                self.forget(destination);
            }
        }
        reopened
    }

    async fn open<S: CircuitStore>(
        &self,
        store: &S,
        destination: &str,
        token: &str,
        now_ms: i64,
    ) -> Result<Option<Circuit>, PortError> {
        let until_ms = now_ms + self.policy.open_ms;
        let opened = store.change_circuit(destination, CircuitChange::Open { token, until_ms, now_ms }).await?;
        if opened.is_some() {
            tracing::warn!(destination, until_ms, "circuit open: the destination fails; its deliveries wait");
            metrics::counter!("circuit_opened", "destination" => destination.to_owned()).increment(1);
        }
        Ok(opened)
    }
}
