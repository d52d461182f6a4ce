//! **A model, not a measurement.** A small discrete-event simulation of the
//! work queue feeding the processor: what Amazon SQS fair queues (standard
//! queues, July 2025) change for quiet tenants when one tenant bursts. The
//! local emulator does not schedule fairly, so this model stands in for it.
//!
//! ```text
//! cargo run --release --locked -p hookledger-bench --bin fair_queue_model -- [--seed N] [--json] ...
//! ```
//!
//! Rules modelled, from "How Amazon SQS fair queues work"
//! (<https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues-detailed.html>,
//! overview: <https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues.html>):
//!
//! - A tenant is a `MessageGroupId`; a message without one is its own tenant.
//! - In-flight rule: a tenant has more than 10 % of the queue's in-flight
//!   messages and at least 30 of its own in flight.
//! - Processing-time rule: the tenant's share of recent consumer processing
//!   time exceeds 10 %. "Recent" is not specified; the model uses the
//!   processing time of the messages completed in the last 60 s.
//! - Either rule marks the tenant noisy. It stays noisy until its backlog (its
//!   messages not yet deleted, visible or in flight) is empty or it has sent
//!   nothing for 5 minutes. The model reports how many tenants it marks as the
//!   `ApproximateNumberOfNoisyGroups` metric would (the count of noisy groups).
//! - Delivery: quiet tenants' messages first; among noisy tenants the one with
//!   the fewest messages in flight first; within a tenant oldest first. Without
//!   group ids the queue delivers oldest first (a standard queue promises no
//!   order; approximately FIFO is assumed).
//!
//! Consumer: the processor's event source mapping (`infra/template.yaml`):
//! `MaximumConcurrency` (`ProcessorMaxConcurrency`, default 10) concurrent
//! invocations, `BatchSize` 10, `MaximumBatchingWindowInSeconds` 1. So at most
//! concurrency × batch (100) messages are in flight. An idle invocation slot
//! starts a batch when `BatchSize` messages are visible, or 1 s after the later
//! of the oldest visible message's arrival and the slot becoming idle. A batch
//! of n messages takes `batch_ms + message_ms × n` (assumed 40 + 15 ms: the
//! processor's 2 to 4 sequential DynamoDB requests per event, docs/measurements.md,
//! at a few ms each in-region; not measured), then its messages are deleted.
//! Every other assumption is printed by `assumptions`.

use serde_json::{Value, json};
use std::collections::VecDeque;

const US_PER_MS: u64 = 1_000;
const US_PER_S: u64 = 1_000_000;
/// `MaximumBatchingWindowInSeconds: 1`.
const BATCH_WINDOW_US: u64 = US_PER_S;
/// The noisy tenant's burst is sent evenly over this long from t = 0.
const BURST_SPREAD_US: u64 = US_PER_S;
/// The processing-time rule's "recent": completions in the last 60 s.
const TIME_WINDOW_US: u64 = 60 * US_PER_S;
/// A noisy tenant that has sent nothing for 5 minutes is quiet again.
const QUIET_AFTER_US: u64 = 300 * US_PER_S;
/// Rule durations and the noisy-group count are sampled this often.
const SAMPLE_US: u64 = 100 * US_PER_MS;
const NOISY_MIN_IN_FLIGHT: usize = 30;
/// Tenant 0 is the bursting tenant; 1..=quiet_tenants are the quiet ones.
const NOISY: usize = 0;

const USAGE: &str = "usage: fair_queue_model [--seed N] [--concurrency N] [--batch N] [--burst N] \
[--quiet-tenants N] [--quiet-rate R] [--seconds S] [--batch-ms MS] [--message-ms MS] [--json]";

#[derive(Clone, Debug, PartialEq)]
struct Params {
    seed: u64,
    concurrency: usize,
    batch: usize,
    burst: usize,
    quiet_tenants: usize,
    quiet_rate: f64,
    seconds: u64,
    batch_ms: u64,
    message_ms: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            seed: 1,
            concurrency: 10,
            batch: 10,
            burst: 10_000,
            quiet_tenants: 9,
            quiet_rate: 10.0,
            seconds: 120,
            batch_ms: 40,
            message_ms: 15,
        }
    }
}

/// Parses the flags; `Ok(None)` for `--help`.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<(Params, bool)>, String> {
    let mut p = Params::default();
    let mut json = false;
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        if flag == "--json" {
            json = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |_| format!("{flag}: not a valid number: {value}");
        match flag.as_str() {
            "--seed" => p.seed = value.parse().map_err(bad)?,
            "--concurrency" => p.concurrency = value.parse().map_err(bad)?,
            "--batch" => p.batch = value.parse().map_err(bad)?,
            "--burst" => p.burst = value.parse().map_err(bad)?,
            "--quiet-tenants" => p.quiet_tenants = value.parse().map_err(bad)?,
            "--quiet-rate" => p.quiet_rate = value.parse().map_err(|_| format!("{flag}: not a number: {value}"))?,
            "--seconds" => p.seconds = value.parse().map_err(bad)?,
            "--batch-ms" => p.batch_ms = value.parse().map_err(bad)?,
            "--message-ms" => p.message_ms = value.parse().map_err(bad)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if p.concurrency == 0 || p.batch == 0 || !(p.quiet_rate >= 0.0 && p.quiet_rate.is_finite()) {
        return Err("--concurrency and --batch must be at least 1, --quiet-rate finite and >= 0".into());
    }
    Ok(Some((p, json)))
}

/// splitmix64: a tiny seeded PRNG, enough for Poisson arrivals.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// An exponential inter-arrival time, in µs, for `rate` events per second.
    fn exp_us(&mut self, rate: f64) -> u64 {
        (-self.unit().ln() / rate * US_PER_S as f64).round() as u64
    }
}

#[derive(Clone, Copy, Debug)]
struct Msg {
    id: usize,
    tenant: usize,
    sent: u64,
}

/// The burst (evenly over 1 s) and the quiet tenants' Poisson streams, by send time.
fn workload(p: &Params) -> Vec<Msg> {
    let mut sends: Vec<(u64, usize)> =
        (0..p.burst).map(|i| (i as u64 * BURST_SPREAD_US / p.burst as u64, NOISY)).collect();
    let mut rng = Rng(p.seed);
    let end = p.seconds * US_PER_S;
    for tenant in 1..=p.quiet_tenants {
        let mut t = if p.quiet_rate > 0.0 { rng.exp_us(p.quiet_rate) } else { end };
        while t < end {
            sends.push((t, tenant));
            t += rng.exp_us(p.quiet_rate);
        }
    }
    sends.sort_unstable();
    sends.into_iter().enumerate().map(|(id, (sent, tenant))| Msg { id, tenant, sent }).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    NoGroups,
    Fair,
}

/// The in-flight rule: more than 10 % of the queue's in-flight messages and at least 30.
fn in_flight_rule(tenant: usize, total: usize) -> bool {
    tenant >= NOISY_MIN_IN_FLIGHT && tenant * 10 > total
}

/// The processing-time rule: more than 10 % of recent processing time.
fn time_rule(tenant_us: u64, total_us: u64) -> bool {
    tenant_us * 10 > total_us
}

/// Processing time of the messages completed in the last [`TIME_WINDOW_US`], per tenant.
struct TimeWindow {
    entries: VecDeque<(u64, usize, u64)>,
    per_tenant: Vec<u64>,
    total: u64,
}

impl TimeWindow {
    fn add(&mut self, at: u64, tenant: usize, us: u64) {
        self.entries.push_back((at, tenant, us));
        self.per_tenant[tenant] += us;
        self.total += us;
    }

    fn expire(&mut self, now: u64) {
        while let Some(&(at, tenant, us)) = self.entries.front() {
            if at + TIME_WINDOW_US > now {
                break;
            }
            self.entries.pop_front();
            self.per_tenant[tenant] -= us;
            self.total -= us;
        }
    }

    fn fires(&self, tenant: usize) -> bool {
        time_rule(self.per_tenant[tenant], self.total)
    }
}

/// How long a condition held (in samples) and when it first did.
#[derive(Clone, Copy, Debug, Default)]
struct Fired {
    samples: u64,
    first: Option<u64>,
}

impl Fired {
    fn sample(&mut self, on: bool, now: u64) {
        if on {
            self.samples += 1;
            self.first.get_or_insert(now);
        }
    }

    fn seconds(&self) -> f64 {
        (self.samples * SAMPLE_US) as f64 / US_PER_S as f64
    }

    fn json(&self) -> Value {
        json!({"seconds": self.seconds(), "first_at_s": self.first.map(|t| t as f64 / US_PER_S as f64)})
    }
}

/// What one run observed.
#[derive(Debug, Default)]
struct Observed {
    quiet_us: Vec<u64>,
    noisy_us: Vec<u64>,
    completions: Vec<u32>,
    noisy_drain_us: u64,
    max_in_flight: usize,
    noisy_peak_in_flight: usize,
    noisy_peak_in_flight_share: f64,
    noisy_peak_time_share: f64,
    in_flight_rule: Fired,
    time_rule: Fired,
    marked: Fired,
    max_noisy_groups: usize,
    max_noisy_groups_burst: usize,
    quiet_ever_noisy: Vec<bool>,
}

struct Batch {
    end: u64,
    msgs: Vec<Msg>,
}

struct Sim<'p> {
    p: &'p Params,
    mode: Mode,
    visible: Vec<VecDeque<Msg>>,
    n_visible: usize,
    in_flight: Vec<usize>,
    n_in_flight: usize,
    idle_since: Vec<u64>,
    running: Vec<Batch>,
    window: TimeWindow,
    noisy: Vec<bool>,
    last_send: Vec<u64>,
    obs: Observed,
}

impl<'p> Sim<'p> {
    fn new(p: &'p Params, mode: Mode, messages: usize) -> Self {
        let tenants = p.quiet_tenants + 1;
        Sim {
            p,
            mode,
            visible: vec![VecDeque::new(); tenants],
            n_visible: 0,
            in_flight: vec![0; tenants],
            n_in_flight: 0,
            idle_since: vec![0; p.concurrency],
            running: Vec::new(),
            window: TimeWindow { entries: VecDeque::new(), per_tenant: vec![0; tenants], total: 0 },
            noisy: vec![false; tenants],
            last_send: vec![0; tenants],
            obs: Observed {
                completions: vec![0; messages],
                quiet_ever_noisy: vec![false; tenants],
                ..Observed::default()
            },
        }
    }

    fn arrive(&mut self, m: Msg) {
        self.visible[m.tenant].push_back(m);
        self.n_visible += 1;
        self.last_send[m.tenant] = m.sent;
    }

    fn backlog(&self, tenant: usize) -> bool {
        !self.visible[tenant].is_empty() || self.in_flight[tenant] > 0
    }

    /// When an idle slot's batching window closes, if one is open.
    fn window_deadline(&self) -> Option<u64> {
        let oldest = self.visible.iter().filter_map(|q| q.front()).map(|m| m.sent).min()?;
        let idle = self.idle_since.iter().copied().min()?;
        Some(oldest.max(idle) + BATCH_WINDOW_US)
    }

    fn next_completion(&self) -> Option<u64> {
        self.running.iter().map(|b| b.end).min()
    }

    fn refresh_noisy(&mut self, now: u64) {
        self.window.expire(now);
        for t in 0..self.noisy.len() {
            let rule = in_flight_rule(self.in_flight[t], self.n_in_flight) || self.window.fires(t);
            let recent = now.saturating_sub(self.last_send[t]) < QUIET_AFTER_US;
            self.noisy[t] = (self.noisy[t] || rule) && self.backlog(t) && recent;
        }
    }

    /// The tenant whose head message is delivered next.
    fn pick_tenant(&self) -> Option<usize> {
        let key = |t: usize| {
            let head = self.visible[t].front().map_or(u64::MAX, |m| m.sent);
            match self.mode {
                Mode::Fair if self.noisy[t] => (true, self.in_flight[t], head, t),
                _ => (false, 0, head, t),
            }
        };
        (0..self.visible.len()).filter(|&t| !self.visible[t].is_empty()).min_by_key(|&t| key(t))
    }

    /// Starts batches while an idle slot's batch is full or its window has closed.
    fn dispatch(&mut self, now: u64) {
        while self.n_visible > 0 && !self.idle_since.is_empty() {
            let window_closed = self.window_deadline().is_some_and(|d| d <= now);
            if self.n_visible < self.p.batch && !window_closed {
                return;
            }
            self.start_batch(now);
        }
    }

    fn start_batch(&mut self, now: u64) {
        if let Some(slot) = (0..self.idle_since.len()).min_by_key(|&i| self.idle_since[i]) {
            self.idle_since.swap_remove(slot);
        }
        if self.mode == Mode::Fair {
            self.refresh_noisy(now);
        }
        let mut msgs = Vec::with_capacity(self.p.batch);
        while msgs.len() < self.p.batch {
            let Some(m) = self.pick_tenant().and_then(|t| self.visible[t].pop_front()) else { break };
            self.n_visible -= 1;
            self.in_flight[m.tenant] += 1;
            self.n_in_flight += 1;
            msgs.push(m);
        }
        let o = &mut self.obs;
        o.max_in_flight = o.max_in_flight.max(self.n_in_flight);
        o.noisy_peak_in_flight = o.noisy_peak_in_flight.max(self.in_flight[NOISY]);
        let share = self.in_flight[NOISY] as f64 / self.n_in_flight.max(1) as f64;
        o.noisy_peak_in_flight_share = o.noisy_peak_in_flight_share.max(share);
        let end = now + batch_duration_us(self.p, msgs.len());
        self.running.push(Batch { end, msgs });
    }

    /// Completes (deletes) every batch due by `now`.
    fn complete_due(&mut self, now: u64) {
        while let Some(i) = (0..self.running.len()).find(|&i| self.running[i].end <= now) {
            let batch = self.running.swap_remove(i);
            let per_message = batch_duration_us(self.p, batch.msgs.len()) / batch.msgs.len() as u64;
            for m in batch.msgs {
                self.in_flight[m.tenant] -= 1;
                self.n_in_flight -= 1;
                self.obs.completions[m.id] += 1;
                self.window.add(batch.end, m.tenant, per_message);
                let latency = batch.end - m.sent;
                if m.tenant == NOISY {
                    self.obs.noisy_us.push(latency);
                    self.obs.noisy_drain_us = self.obs.noisy_drain_us.max(batch.end);
                } else {
                    self.obs.quiet_us.push(latency);
                }
            }
            self.idle_since.push(batch.end);
        }
    }

    /// Records the rules' state for the noisy tenant and the count of noisy groups.
    fn sample(&mut self, now: u64) {
        self.window.expire(now);
        if self.mode == Mode::Fair {
            self.refresh_noisy(now);
        }
        let time_share = self.window.per_tenant[NOISY] as f64 / self.window.total.max(1) as f64;
        let in_flight = in_flight_rule(self.in_flight[NOISY], self.n_in_flight);
        let time = self.window.fires(NOISY);
        let noisy_backlog = self.backlog(NOISY);
        let o = &mut self.obs;
        o.noisy_peak_time_share = o.noisy_peak_time_share.max(time_share);
        o.in_flight_rule.sample(in_flight, now);
        o.time_rule.sample(time, now);
        o.marked.sample(self.noisy[NOISY], now);
        let groups = self.noisy.iter().filter(|&&n| n).count();
        o.max_noisy_groups = o.max_noisy_groups.max(groups);
        if noisy_backlog {
            o.max_noisy_groups_burst = o.max_noisy_groups_burst.max(groups);
        }
        for (ever, &now_noisy) in o.quiet_ever_noisy.iter_mut().zip(&self.noisy).skip(1) {
            *ever |= now_noisy;
        }
    }
}

fn batch_duration_us(p: &Params, n: usize) -> u64 {
    (p.batch_ms + p.message_ms * n as u64) * US_PER_MS
}

/// Runs the model until every message is deleted.
fn simulate(p: &Params, mode: Mode) -> Observed {
    let msgs = workload(p);
    let mut sim = Sim::new(p, mode, msgs.len());
    let (mut next, mut next_sample) = (0, 0);
    loop {
        let arrival = msgs.get(next).map(|m| m.sent);
        let Some(now) = [arrival, sim.next_completion(), sim.window_deadline()].into_iter().flatten().min() else {
            break;
        };
        while next_sample <= now {
            sim.sample(next_sample);
            next_sample += SAMPLE_US;
        }
        sim.complete_due(now);
        while let Some(&m) = msgs.get(next).filter(|m| m.sent == now) {
            sim.arrive(m);
            next += 1;
            sim.dispatch(now);
        }
        sim.dispatch(now);
    }
    sim.obs
}

/// Nearest-rank percentile, in ms.
fn percentile_ms(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    sorted_us[rank - 1] as f64 / US_PER_MS as f64
}

#[derive(Debug)]
struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
}

fn latency(mut us: Vec<u64>) -> Latency {
    us.sort_unstable();
    Latency { p50: percentile_ms(&us, 0.50), p99: percentile_ms(&us, 0.99), max: percentile_ms(&us, 1.0) }
}

/// One mode's figures.
#[derive(Debug)]
struct Summary {
    mode: Mode,
    quiet: Latency,
    noisy: Latency,
    obs: Observed,
}

impl Summary {
    fn run(p: &Params, mode: Mode) -> Self {
        let obs = simulate(p, mode);
        Summary { mode, quiet: latency(obs.quiet_us.clone()), noisy: latency(obs.noisy_us.clone()), obs }
    }

    /// What SQS would report: nothing is noisy when it cannot see tenants.
    fn reported_groups(&self) -> (usize, usize) {
        match self.mode {
            Mode::NoGroups => (0, 0),
            Mode::Fair => (self.obs.max_noisy_groups_burst, self.obs.max_noisy_groups),
        }
    }

    fn json(&self) -> Value {
        let o = &self.obs;
        let (burst_groups, run_groups) = self.reported_groups();
        json!({
            "quiet_ms": {"p50": self.quiet.p50, "p99": self.quiet.p99, "max": self.quiet.max, "count": o.quiet_us.len()},
            "noisy_ms": {"p50": self.noisy.p50, "p99": self.noisy.p99, "max": self.noisy.max, "count": o.noisy_us.len()},
            "noisy_drain_s": o.noisy_drain_us as f64 / US_PER_S as f64,
            "rules_evaluated_on_real_tenants": self.mode == Mode::NoGroups,
            "in_flight_rule": o.in_flight_rule.json(),
            "processing_time_rule": o.time_rule.json(),
            "noisy_tenant_marked_noisy": o.marked.json(),
            "max_noisy_groups_during_burst": burst_groups,
            "max_noisy_groups": run_groups,
            "quiet_tenants_ever_noisy": o.quiet_ever_noisy.iter().filter(|&&n| n).count(),
            "noisy_peak_in_flight": o.noisy_peak_in_flight,
            "noisy_peak_in_flight_share": o.noisy_peak_in_flight_share,
            "noisy_peak_processing_time_share": o.noisy_peak_time_share,
            "max_in_flight": o.max_in_flight,
        })
    }
}

struct Report {
    p: Params,
    without: Summary,
    fair: Summary,
}

impl Report {
    fn run(p: &Params) -> Self {
        Report { p: p.clone(), without: Summary::run(p, Mode::NoGroups), fair: Summary::run(p, Mode::Fair) }
    }

    fn cap(&self) -> usize {
        self.p.concurrency * self.p.batch
    }

    /// "Do the template's defaults let the thresholds fire?", from the fair run.
    fn thresholds_answer(&self) -> String {
        let o = &self.fair.obs;
        let settings =
            if (self.p.concurrency, self.p.batch) == (10, 10) { "the template's defaults" } else { "these settings" };
        let in_flight = if self.cap() < NOISY_MIN_IN_FLIGHT {
            format!("no: the in-flight cap {} is below 30, so the in-flight rule can never fire", self.cap())
        } else {
            format!(
                "{}: the noisy tenant peaked at {} in flight ({:.0} % of in-flight) against >= 30 and > 10 %",
                yes_no(o.in_flight_rule.samples > 0),
                o.noisy_peak_in_flight,
                o.noisy_peak_in_flight_share * 100.0
            )
        };
        format!(
            "Do {settings} (MaximumConcurrency {} x BatchSize {} = in-flight cap {}) let the thresholds fire? \
in-flight rule {in_flight}; processing-time rule {}: peak share {:.0} % against > 10 %.",
            self.p.concurrency,
            self.p.batch,
            self.cap(),
            yes_no(o.time_rule.samples > 0),
            o.noisy_peak_time_share * 100.0
        )
    }

    fn json(&self) -> Value {
        let p = &self.p;
        json!({
            "model": "fair_queue_model (a model, not a measurement)",
            "params": {"seed": p.seed, "concurrency": p.concurrency, "batch": p.batch, "in_flight_cap": self.cap(),
                "burst": p.burst, "quiet_tenants": p.quiet_tenants, "quiet_rate": p.quiet_rate, "seconds": p.seconds,
                "batch_ms": p.batch_ms, "message_ms": p.message_ms},
            "without_group_ids": self.without.json(),
            "fair_queue": self.fair.json(),
            "in_flight_rule_fires_with_these_settings": self.fair.obs.in_flight_rule.samples > 0,
            "processing_time_rule_fires_with_these_settings": self.fair.obs.time_rule.samples > 0,
            "thresholds_answer": self.thresholds_answer(),
            "assumptions": assumptions(p),
        })
    }

    fn table(&self) -> String {
        let rows: Vec<(&str, String, String)> = vec![
            ("quiet tenants p50 / p99 / max (ms)", lat3(&self.without.quiet), lat3(&self.fair.quiet)),
            ("noisy tenant p50 / p99 (ms)", lat2(&self.without.noisy), lat2(&self.fair.noisy)),
            ("noisy tenant drain time (s)", drain(&self.without), drain(&self.fair)),
            (
                "in-flight rule fired (noisy tenant)",
                fired(&self.without, |o| o.in_flight_rule),
                fired(&self.fair, |o| o.in_flight_rule),
            ),
            (
                "processing-time rule fired (noisy tenant)",
                fired(&self.without, |o| o.time_rule),
                fired(&self.fair, |o| o.time_rule),
            ),
            ("noisy tenant marked noisy", "n/a (no groups)".into(), fired(&self.fair, |o| o.marked)),
            ("max ApproximateNumberOfNoisyGroups (burst / run)", groups(&self.without), groups(&self.fair)),
            ("quiet tenants ever marked noisy", "0".into(), quiet_noisy(&self.fair, self.p.quiet_tenants)),
            ("noisy tenant peak in flight (share)", peak(&self.without), peak(&self.fair)),
            (
                "peak in flight, all tenants / cap",
                format!("{} / {}", self.without.obs.max_in_flight, self.cap()),
                format!("{} / {}", self.fair.obs.max_in_flight, self.cap()),
            ),
        ];
        let mut out = format!(
            "Hookledger fair-queue model (a model, not a measurement), seed {}\n\n{:<50} {:<28} {}\n",
            self.p.seed, "", "without group ids", "with group ids (fair queue)"
        );
        for (name, a, b) in rows {
            out.push_str(&format!("{name:<50} {a:<28} {b}\n"));
        }
        out.push_str("(shadow) = the rule evaluated on the real tenants; without group ids SQS sees each message as its own tenant and flags nothing.\n\n");
        out.push_str(&self.thresholds_answer());
        out.push_str("\n\nAssumptions:\n");
        for a in assumptions(&self.p) {
            out.push_str(&format!("- {a}\n"));
        }
        out
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn lat3(l: &Latency) -> String {
    format!("{:.0} / {:.0} / {:.0}", l.p50, l.p99, l.max)
}

fn lat2(l: &Latency) -> String {
    format!("{:.0} / {:.0}", l.p50, l.p99)
}

fn drain(s: &Summary) -> String {
    format!("{:.1}", s.obs.noisy_drain_us as f64 / US_PER_S as f64)
}

fn fired(s: &Summary, which: impl Fn(&Observed) -> Fired) -> String {
    let f = which(&s.obs);
    let shadow = if s.mode == Mode::NoGroups { " (shadow)" } else { "" };
    match f.first {
        None => format!("no{shadow}"),
        Some(t) => format!("{:.1} s from {:.1} s{shadow}", f.seconds(), t as f64 / US_PER_S as f64),
    }
}

fn groups(s: &Summary) -> String {
    let (burst, run) = s.reported_groups();
    format!("{burst} / {run}")
}

fn quiet_noisy(s: &Summary, of: usize) -> String {
    format!("{} of {of}", s.obs.quiet_ever_noisy.iter().filter(|&&n| n).count())
}

fn peak(s: &Summary) -> String {
    format!("{} ({:.0} %)", s.obs.noisy_peak_in_flight, s.obs.noisy_peak_in_flight_share * 100.0)
}

/// Every assumption the figures rest on.
fn assumptions(p: &Params) -> Vec<String> {
    vec![
        "A model of the documented rules (docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues-detailed.html), not of the service's implementation; AWS calls its thresholds approximate.".into(),
        format!("Workload: tenant 0 sends {} events evenly over the first 1 s; {} quiet tenants each send Poisson arrivals at {} events/s for {} s (seed {}). The run lasts until every message is deleted.", p.burst, p.quiet_tenants, p.quiet_rate, p.seconds, p.seed),
        format!("Consumer: {} concurrent invocations (MaximumConcurrency), batches of up to {} (BatchSize), in-flight cap {}; all pollers ready at t = 0 (the event source mapping's ramp-up is ignored); no cold starts, failures, retries or visibility timeouts.", p.concurrency, p.batch, p.concurrency * p.batch),
        "Batching window (1 s): an idle slot starts a batch when BatchSize messages are visible, or 1 s after the later of the oldest visible message's send and the slot becoming idle. Messages count as in flight from the batch's start (the real poller holds them in flight while it gathers them).".into(),
        format!("Processing: a batch of n takes {} ms + {} ms x n (assumed: the processor's 2 to 4 sequential DynamoDB requests per event, not measured), then all its messages are deleted; each message is charged an equal share of its batch's time.", p.batch_ms, p.message_ms),
        "Latency: from the send to SQS (the intake's receipt; the intake's own time is not modelled) to the batch's completion. A batch that never fills waits the whole 1 s window (the run's last few messages), so the maximum includes up to 1 s of batching window in both modes.".into(),
        "Without group ids: oldest first (a standard queue promises no order; approximately FIFO is assumed); every message is its own tenant, so nothing is flagged. The rule rows for that mode evaluate the rules on the real tenants, as if SQS could see them (shadow).".into(),
        "With group ids: in-flight rule = more than 10 % of in-flight messages and at least 30; processing-time rule = more than 10 % of the processing time of messages completed in the last 60 s. Noisy from either rule until the tenant's backlog (visible or in flight) is empty or it sent nothing for 5 min. Quiet tenants first, then noisy ones by fewest in flight, oldest first within a tenant; noisy status is refreshed at every receive.".into(),
        format!("With {} equal quiet tenants each has about 1/{} of the processing time; above 10 % (fewer than 10 tenants) the processing-time rule as documented marks them noisy too once the burst has left the 60 s window, which changes nothing while no backlog exists.", p.quiet_tenants, p.quiet_tenants.max(1)),
        "Rule durations and ApproximateNumberOfNoisyGroups (the count of tenants marked noisy) are sampled every 100 ms; the burst figure is the maximum while tenant 0 still had a backlog.".into(),
    ]
}

fn main() {
    let (p, json) = match parse_args(std::env::args().skip(1)) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let report = Report::run(&p);
    if json {
        println!("{}", report.json());
    } else {
        print!("{}", report.table());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut Params)) -> Params {
        let mut p = Params { seconds: 60, ..Params::default() };
        f(&mut p);
        p
    }

    #[test]
    fn fairness_cuts_the_quiet_tenants_p99() {
        let p = params(|_| {});
        let (without, fair) = (Summary::run(&p, Mode::NoGroups), Summary::run(&p, Mode::Fair));
        assert!(without.quiet.p99 > 5_000.0, "without fairness quiet messages wait behind the burst: {without:?}");
        assert!(fair.quiet.p99 * 10.0 < without.quiet.p99, "{} vs {}", fair.quiet.p99, without.quiet.p99);
        assert!(fair.quiet.max < 1_500.0, "{:?}", fair.quiet);
        assert!(fair.obs.marked.samples > 0 && fair.obs.in_flight_rule.samples > 0);
    }

    #[test]
    fn without_a_burst_both_modes_give_the_same_latencies() {
        let p = params(|p| p.burst = 0);
        let (mut a, mut b) = (simulate(&p, Mode::NoGroups).quiet_us, simulate(&p, Mode::Fair).quiet_us);
        assert!(!a.is_empty());
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }

    #[test]
    fn in_flight_never_exceeds_the_cap() {
        for (concurrency, batch) in [(10, 10), (2, 10), (5, 3), (20, 10)] {
            let p = params(|p| (p.concurrency, p.batch) = (concurrency, batch));
            for mode in [Mode::NoGroups, Mode::Fair] {
                let o = simulate(&p, mode);
                assert_eq!(o.max_in_flight, concurrency * batch, "the burst fills every slot, never more");
            }
        }
    }

    #[test]
    fn every_event_completes_exactly_once() {
        let p = params(|p| p.burst = 3_001);
        let sent = workload(&p).len();
        for mode in [Mode::NoGroups, Mode::Fair] {
            let o = simulate(&p, mode);
            assert_eq!(o.completions.len(), sent);
            assert!(o.completions.iter().all(|&c| c == 1));
            assert_eq!(o.quiet_us.len() + o.noisy_us.len(), sent);
            assert_eq!(o.noisy_us.len(), 3_001);
        }
    }

    #[test]
    fn below_30_in_flight_a_tenant_is_never_noisy_by_the_in_flight_rule() {
        assert!(!in_flight_rule(29, 29));
        assert!(in_flight_rule(30, 100));
        assert!(!in_flight_rule(30, 300), "exactly 10 % is not more than 10 %");
        assert!(in_flight_rule(31, 300));
        // MaximumConcurrency 2 x BatchSize 10: at most 20 in flight.
        let p = params(|p| p.concurrency = 2);
        for mode in [Mode::NoGroups, Mode::Fair] {
            let o = simulate(&p, mode);
            assert_eq!(o.in_flight_rule.samples, 0);
            assert!(o.time_rule.samples > 0, "the processing-time rule still fires");
        }
    }

    #[test]
    fn a_seed_gives_the_same_figures() {
        let p = params(|p| p.burst = 2_000);
        assert_eq!(Report::run(&p).json(), Report::run(&p).json());
        let other = params(|p| (p.burst, p.seed) = (2_000, 2));
        assert_ne!(simulate(&p, Mode::Fair).quiet_us, simulate(&other, Mode::Fair).quiet_us);
    }

    #[test]
    fn the_time_window_forgets_after_60_s() {
        let mut w = TimeWindow { entries: VecDeque::new(), per_tenant: vec![0; 2], total: 0 };
        w.add(0, 0, 100);
        w.add(30 * US_PER_S, 1, 100);
        assert!(w.fires(0) && w.fires(1));
        w.expire(TIME_WINDOW_US);
        assert_eq!((w.per_tenant[0], w.total), (0, 100));
        assert!(!w.fires(0));
    }

    #[test]
    fn flags_parse() {
        let args = ["--seed", "7", "--concurrency", "2", "--json"].map(String::from);
        let (p, json) = parse_args(args).unwrap().unwrap();
        assert_eq!((p.seed, p.concurrency, p.batch, json), (7, 2, 10, true));
        assert!(parse_args(["--bogus".to_string()]).is_err());
        assert!(parse_args(["--batch", "0"].map(String::from)).is_err());
        assert!(parse_args(["--help".to_string()]).unwrap().is_none());
    }
}
