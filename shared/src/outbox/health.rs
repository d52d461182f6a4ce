//! Each destination's health, read from the ledger (`hookledger deliveries
//! --destination D`, the console, and the reconciler's `delivery-health`
//! task, which writes it as metrics), and DEAD deliveries replayed by a
//! filter in bounded, resumable batches (`hookledger deliveries replay`).
//!
//! A census reads every shard's home partition (deliveries still to send,
//! due or held), the destination's waiting partition and every shard's DEAD
//! items, through the indexes (no scan), each partition at most `max`
//! items: its cost grows with the deliveries not yet sent, never with the
//! table.
//!
//! A replay run is named by its destination and reason ([`ReplayFilter::run`]):
//! each delivery it replays keeps the run's name, so the same command run
//! again after an interruption skips what the first run replayed, even a
//! delivery that has died again since.

use std::collections::BTreeMap;

use crate::ledger::PortError;
use crate::message::OutboxState;
use crate::ports::{CircuitStore, OutboxPartition, OutboxStore};
use crate::routes::Limits;

use super::Deliveries;
use super::limit::{flight_until, step_in_force};

/// The metrics the reconciler's `delivery-health` task writes.
pub const METRICS: &[&str] = &[
    "delivery_oldest_pending_age",
    "destination_oldest_pending_age",
    "destination_pending",
    "destination_waiting",
    "destination_dead",
];

/// The most recent answers shown per destination.
pub const ANSWERS_SHOWN: usize = 5;

/// One destination's health.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Health {
    pub destination: String,
    /// `closed`, `open` (until `open_until`) or `probing`.
    pub circuit: &'static str,
    pub open_until: Option<i64>,
    /// Failed sends in a row.
    pub failures: u32,
    /// The limit configured, per second, and the rate in force (lower while
    /// the destination throttles us), and until when it is lowered.
    pub limit_per_second: Option<f64>,
    pub rate_in_force: Option<f64>,
    pub slowed_until: Option<i64>,
    pub max_in_flight: Option<u32>,
    pub in_flight: usize,
    /// Still to send in their home partitions (due, backing off, or held for their grant).
    pub pending: usize,
    /// Waiting for the circuit to close.
    pub waiting: usize,
    pub dead: usize,
    /// When the oldest delivery still to send (pending or waiting) was committed, and its age.
    pub oldest_pending_at: Option<i64>,
    pub oldest_pending_age_ms: Option<i64>,
    /// The most recent failed answers (when, what), newest first.
    pub last_answers: Vec<(i64, String)>,
    /// A partition held more than the census reads: the counts are lower bounds.
    pub partial: bool,
}

/// Which DEAD deliveries a replay takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayFilter {
    pub destination: String,
    /// Died at or after / before (Unix ms).
    pub since: Option<i64>,
    pub until: Option<i64>,
    /// Why (kept on each item; part of the run's name).
    pub reason: String,
}

impl ReplayFilter {
    /// The run's name: the destination and the reason (not the window,
    /// which an age like `6h` moves between two runs), so the same command
    /// run again resumes it, and a delivery is replayed once per reason.
    pub fn run(&self) -> String {
        let text = format!("{}|{}", self.destination, self.reason);
        let digest = crate::identity::payload_hash(text.as_bytes());
        format!("replay-{}", &digest[..16])
    }

    /// Whether `d` is one this run replays: DEAD, to the destination, died
    /// within the window, and not replayed by this run already.
    pub fn takes(&self, d: &OutboxState) -> bool {
        let died = d.dead_at.unwrap_or(0);
        d.status == "DEAD"
            && d.destination.as_deref() == Some(self.destination.as_str())
            && self.since.is_none_or(|s| died >= s)
            && self.until.is_none_or(|u| died < u)
            && d.replay_run.as_deref() != Some(self.run().as_str())
    }
}

/// What a replay batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Replayed {
    pub replayed: usize,
    /// Matched but not DEAD any more when replayed (another operator, or sent).
    pub skipped: usize,
}

impl<S: OutboxStore> Deliveries<S> {
    /// The DEAD deliveries `filter` takes, oldest death first, at most `max`
    /// read per shard; `true` beside them when a shard held more.
    pub async fn matching(&self, filter: &ReplayFilter, max: usize) -> Result<(Vec<OutboxState>, bool), PortError> {
        let mut out = Vec::new();
        let mut partial = false;
        for shard in 0..self.shards {
            let (states, more) = self.store.states_in(OutboxPartition::Dead(shard), max).await?;
            partial |= more;
            out.extend(states.into_iter().filter(|d| filter.takes(d)));
        }
        out.sort_by_key(|d| (d.dead_at, d.id.clone()));
        Ok((out, partial))
    }

    /// Replays `batch` (of [`Self::matching`]) under `filter`'s run, ten at
    /// a time: each DEAD one due again now with the same key, audited on
    /// its item (who, why, the run); the sweep sends them at the
    /// destination's limits.
    pub async fn replay_batch(
        &self,
        filter: &ReplayFilter,
        batch: &[OutboxState],
        caller: &crate::audit::Caller,
        now_ms: i64,
    ) -> Result<Replayed, PortError> {
        let run = filter.run();
        let mut done = Replayed::default();
        for chunk in batch.chunks(10) {
            let replays = chunk.iter().map(|d| self.replay(d, &run, caller, &filter.reason, now_ms));
            for r in futures::future::join_all(replays).await {
                if r? {
                    done.replayed += 1;
                } else {
                    done.skipped += 1;
                }
            }
        }
        Ok(done)
    }
}

impl<S: OutboxStore + CircuitStore> Deliveries<S> {
    /// `destination`'s health as the ledger holds it now (each partition
    /// read up to `max` items).
    pub async fn health(
        &self,
        destination: &str,
        limits: Limits,
        now_ms: i64,
        max: usize,
    ) -> Result<Health, PortError> {
        let circuit = self.store.circuit(destination).await?.unwrap_or_default();
        let rate = self.store.rate(destination).await?.unwrap_or_default();
        let mut partial = false;
        let mut oldest: Option<i64> = None;
        let mut answers: BTreeMap<(i64, String), ()> = BTreeMap::new();
        let mut note = |d: &OutboxState, at: Option<i64>| {
            if let (Some(at), Some(e)) = (at, &d.last_error) {
                answers.insert((at, e.clone()), ());
            }
        };
        let older = |o: Option<i64>, c: Option<i64>| match (o, c) {
            (Some(o), Some(c)) => Some(o.min(c)),
            (o, c) => o.or(c),
        };
        let (waiting, more) = self.store.states_in(OutboxPartition::Waiting(destination), max).await?;
        partial |= more;
        for d in &waiting {
            oldest = older(oldest, d.created_at);
        }
        let (mut pending, mut dead) = (0, 0);
        for shard in 0..self.shards {
            let (home, more) = self.store.states_in(OutboxPartition::Home(shard), max).await?;
            partial |= more;
            for d in home.iter().filter(|d| d.destination.as_deref() == Some(destination)) {
                pending += 1;
                oldest = older(oldest, d.created_at);
                note(d, d.last_failed_at);
            }
            let (gone, more) = self.store.states_in(OutboxPartition::Dead(shard), max).await?;
            partial |= more;
            for d in gone.iter().filter(|d| d.destination.as_deref() == Some(destination)) {
                dead += 1;
                note(d, d.dead_at.or(d.last_failed_at));
            }
        }
        let circuit_state = match (circuit.open_until, circuit.probe_until) {
            (Some(_), Some(p)) if p > now_ms => "probing",
            (Some(_), _) => "open",
            (None, _) => "closed",
        };
        let in_force = limits.step_ms.map(|s| 1000.0 / step_in_force(s, &rate, now_ms) as f64);
        Ok(Health {
            destination: destination.to_owned(),
            circuit: circuit_state,
            open_until: circuit.open_until,
            failures: circuit.failures,
            limit_per_second: limits.per_second(),
            rate_in_force: in_force,
            slowed_until: rate.slow_until.filter(|u| *u > now_ms),
            max_in_flight: limits.in_flight,
            in_flight: rate.flights.iter().filter(|f| flight_until(f) >= now_ms).count(),
            pending,
            waiting: waiting.len(),
            dead,
            oldest_pending_at: oldest,
            oldest_pending_age_ms: oldest.map(|o| (now_ms - o).max(0)),
            last_answers: answers.into_keys().rev().take(ANSWERS_SHOWN).collect(),
            partial,
        })
    }
}

impl Health {
    /// Written as metrics, by destination: `destination_pending`,
    /// `destination_waiting`, `destination_dead`,
    /// `destination_oldest_pending_age` (ms).
    pub fn record(&self) {
        let d = self.destination.clone();
        metrics::gauge!("destination_pending", "destination" => d.clone()).set(self.pending as f64);
        metrics::gauge!("destination_waiting", "destination" => d.clone()).set(self.waiting as f64);
        metrics::gauge!("destination_dead", "destination" => d.clone()).set(self.dead as f64);
        let age = self.oldest_pending_age_ms.unwrap_or(0) as f64;
        metrics::gauge!("destination_oldest_pending_age", "destination" => d).set(age);
    }
}

/// The oldest pending delivery's age over every destination, in ms
/// (`delivery_oldest_pending_age`, what the alarm watches).
pub fn record_oldest(health: &[Health]) {
    let oldest = health.iter().filter_map(|h| h.oldest_pending_age_ms).max().unwrap_or(0);
    metrics::gauge!("delivery_oldest_pending_age").set(oldest as f64);
}
