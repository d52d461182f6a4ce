//! **A model, not a measurement.** A discrete-time model of route deliveries
//! through the delivery queue while one HTTPS destination is down, at the
//! template's defaults, on a virtual clock: what an outage of 25 minutes or
//! 6 hours at 100 events/s costs, how long its drain takes once the partner
//! is back, and whether the healthy destinations notice.
//!
//! ```text
//! cargo run --release --locked -p hookledger-bench --bin outage_model -- [--rate N] [--minutes M ...] [--json]
//! ```
//!
//! What it takes from the code (so the model moves when the code does):
//! the circuit policy (`outbox::CircuitPolicy::default()`: 5 failures open
//! it for 60 s, one probe at a time), the drain page
//! (`outbox::DRAIN_PAGE`), the delivery bound
//! (`config::DEFAULT_DELIVERY_BOUND_MS`) and the longest message delay
//! (`outbox::MAX_DELAY_MS`). From the template: `DeliveryConcurrency` 20
//! dispatchers, `BatchSize` 10. The rules (module docs of `outbox::queue`):
//!
//! - Each event is routed to three HTTPS destinations (`down`, `b`, `c`);
//!   the processor hands the three deliveries to the delivery queue in one
//!   `SendMessageBatch`, each in its destination's message group.
//! - A dispatcher invocation takes up to 10 visible messages, quiet groups
//!   first (SQS fair queues: a group with a backlog is served after the
//!   others), and takes them at once; it lasts as long as its slowest message.
//! - A delivery to a healthy partner: claim, send (the partner's answer
//!   time), mark. To `down` while its circuit is closed: claim, a refused
//!   connection, back off (its retry a delayed message). While open: claim
//!   and a write that moves it to its destination's waiting partition; no
//!   message, no retry. Once the open time is up, the next delivery is the
//!   probe; through, the circuit closes and a drain step runs: 100 waiting
//!   deliveries moved home and handed on, and the next step handed on while
//!   the page was full.
//! - Times of the ledger's requests and of a refused connection are the
//!   assumptions printed with the figures, not measurements.

use serde_json::{Value, json};
use std::collections::VecDeque;

use hookledger::outbox::{CircuitPolicy, DRAIN_PAGE, MAX_DELAY_MS, UNWAITS_AT_ONCE};

const USAGE: &str = "usage: outage_model [--rate N] [--minutes M]... [--concurrency N] [--partner-ms MS] [--json]";
/// The model's step.
const STEP_MS: i64 = 100;
/// One ledger request (claim, mark, move), in-region (assumed).
const LEDGER_MS: i64 = 6;
/// A refused connection (the partner's host answers nothing: assumed fast).
const REFUSED_MS: i64 = 50;
/// A message's backoff after a failed try (the policy's first step, 30 s).
const FIRST_BACKOFF_MS: i64 = 30_000;
/// `BatchSize`.
const BATCH: usize = 10;
/// The reconciler's schedule (the template's default).
const RECONCILE_EVERY_MS: i64 = 300_000;
/// Destinations: 0 is down for the outage, 1 and 2 stay healthy.
const DOWN: usize = 0;
const DESTINATIONS: usize = 3;

#[derive(Clone, Debug)]
struct Params {
    rate: u64,
    outages_min: Vec<u64>,
    concurrency: usize,
    partner_ms: i64,
}

impl Default for Params {
    fn default() -> Self {
        Self { rate: 100, outages_min: vec![0, 25, 360], concurrency: 20, partner_ms: 200 }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Msg {
    Deliver { id: usize, dest: usize, visible_at: i64 },
    Drain { visible_at: i64 },
}

impl Msg {
    fn visible_at(&self) -> i64 {
        match self {
            Self::Deliver { visible_at, .. } | Self::Drain { visible_at } => *visible_at,
        }
    }
}

#[derive(Default, Clone, Debug)]
struct Sqs {
    sends: u64,
    receives: u64,
    deletes: u64,
}

struct Run {
    p: Params,
    outage_ms: i64,
    policy: CircuitPolicy,
    /// Messages by group (fair queues schedule by group).
    queue: [VecDeque<Msg>; DESTINATIONS],
    /// Deliveries to `down` waiting in the ledger, in order.
    waiting: VecDeque<usize>,
    created: Vec<i64>,
    failures: u32,
    open_until: Option<i64>,
    /// When each dispatcher slot is free again.
    slots: Vec<i64>,
    sent: Vec<[Option<i64>; DESTINATIONS]>,
    dead: u64,
    sqs: Sqs,
    sqs_in_outage: Sqs,
    writes_down: u64,
    waiting_peak: usize,
    recovered_at: Option<i64>,
}

fn percentile(mut v: Vec<i64>, p: f64) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

impl Run {
    fn new(p: &Params, outage_min: u64) -> Self {
        Self {
            p: p.clone(),
            outage_ms: outage_min as i64 * 60_000,
            policy: CircuitPolicy::default(),
            queue: Default::default(),
            waiting: VecDeque::new(),
            created: Vec::new(),
            failures: 0,
            open_until: None,
            slots: vec![0; p.concurrency],
            sent: Vec::new(),
            dead: 0,
            sqs: Sqs::default(),
            sqs_in_outage: Sqs::default(),
            writes_down: 0,
            waiting_peak: 0,
            recovered_at: None,
        }
    }

    fn down(&self, now: i64) -> bool {
        now < self.outage_ms
    }

    fn count(&mut self, now: i64, f: impl Fn(&mut Sqs)) {
        f(&mut self.sqs);
        if self.down(now) {
            f(&mut self.sqs_in_outage);
        }
    }

    /// Up to `BATCH` visible messages, quiet groups first (those without a
    /// backlog of more than a batch), then the others, oldest first in each.
    fn take(&mut self, now: i64) -> Vec<Msg> {
        let mut order: Vec<usize> = (0..DESTINATIONS).collect();
        order.sort_by_key(|g| self.queue[*g].iter().filter(|m| m.visible_at() <= now).count() > BATCH);
        let mut out = Vec::new();
        for g in order {
            while out.len() < BATCH {
                let Some(i) = self.queue[g].iter().position(|m| m.visible_at() <= now) else { break };
                out.extend(self.queue[g].remove(i));
            }
        }
        out
    }

    /// One message taken at `now`: how long it keeps its invocation.
    fn handle(&mut self, m: Msg, now: i64) -> i64 {
        match m {
            Msg::Deliver { id, dest, .. } if dest != DOWN => {
                self.sent[id][dest] = Some(now + 2 * LEDGER_MS + self.p.partner_ms);
                2 * LEDGER_MS + self.p.partner_ms
            }
            Msg::Deliver { id, .. } => self.deliver_down(id, now),
            Msg::Drain { .. } => {
                // As `Circuits::drainable`: a page while closed, the probe's one once its time is up.
                let allowed = match self.open_until {
                    None => DRAIN_PAGE,
                    Some(u) if u <= now => 1,
                    Some(_) => 0,
                };
                let page: Vec<usize> = (0..allowed).map_while(|_| self.waiting.pop_front()).collect();
                self.writes_down += page.len() as u64;
                let full = page.len() == DRAIN_PAGE;
                for id in &page {
                    self.queue[DOWN].push_back(Msg::Deliver { id: *id, dest: DOWN, visible_at: now });
                }
                let requests = page.len().div_ceil(BATCH) as u64 + u64::from(full);
                self.count(now, |s| s.sends += requests);
                if full {
                    self.queue[DOWN].push_back(Msg::Drain { visible_at: now });
                }
                // The page's query, its moves ten at a time, its hand-over.
                LEDGER_MS * (2 + page.len().div_ceil(UNWAITS_AT_ONCE) as i64)
            }
        }
    }

    fn deliver_down(&mut self, id: usize, now: i64) -> i64 {
        self.writes_down += 1; // the claim
        if now - self.created[id] >= hookledger::config::DEFAULT_DELIVERY_BOUND_MS {
            self.dead += 1;
            self.writes_down += 1;
            return 2 * LEDGER_MS;
        }
        let open = self.open_until.is_some_and(|u| u > now);
        if open {
            // Waits in the ledger: one write, no message.
            self.writes_down += 1;
            self.waiting.push_back(id);
            self.waiting_peak = self.waiting_peak.max(self.waiting.len());
            return 2 * LEDGER_MS;
        }
        let probe = self.open_until.is_some();
        if self.down(now) {
            self.writes_down += 1;
            if probe {
                // A failed probe: open again, its delivery waits.
                self.open_until = Some(now + self.policy.open_ms);
                self.waiting.push_back(id);
            } else {
                self.failures += 1;
                if self.failures >= self.policy.threshold {
                    self.open_until = Some(now + self.policy.open_ms);
                    self.failures = 0;
                }
                // Backs off; its retry is a delayed message.
                let visible_at = now + FIRST_BACKOFF_MS.min(MAX_DELAY_MS);
                self.queue[DOWN].push_back(Msg::Deliver { id, dest: DOWN, visible_at });
                self.count(now, |s| s.sends += 1);
            }
            return LEDGER_MS * 2 + REFUSED_MS;
        }
        // Through.
        self.writes_down += 1;
        self.sent[id][DOWN] = Some(now + 2 * LEDGER_MS + self.p.partner_ms);
        if probe {
            self.open_until = None;
            self.recovered_at.get_or_insert(now);
            self.queue[DOWN].push_back(Msg::Drain { visible_at: now });
            self.count(now, |s| s.sends += 1);
        }
        2 * LEDGER_MS + self.p.partner_ms
    }

    fn run(mut self) -> Value {
        let per_step = self.p.rate as f64 * STEP_MS as f64 / 1000.0;
        let arrivals_until = self.outage_ms + 30 * 60_000;
        let mut owed = 0.0;
        let mut now = 0;
        let horizon = arrivals_until + 48 * 3_600_000;
        while now < horizon {
            if now < arrivals_until {
                owed += per_step;
                while owed >= 1.0 {
                    owed -= 1.0;
                    let id = self.created.len();
                    self.created.push(now);
                    self.sent.push([None; DESTINATIONS]);
                    for dest in 0..DESTINATIONS {
                        self.queue[dest].push_back(Msg::Deliver { id, dest, visible_at: now });
                    }
                    // The processor's one SendMessageBatch for the event's three deliveries.
                    self.count(now, |s| s.sends += 1);
                }
            }
            // The reconciler's run (every 5 minutes): a destination back, or due
            // a probe, with deliveries waiting gets a drain step.
            if now % RECONCILE_EVERY_MS == 0 && !self.waiting.is_empty() && self.open_until.is_none_or(|u| u <= now) {
                self.queue[DOWN].push_back(Msg::Drain { visible_at: now });
                self.count(now, |s| s.sends += 1);
            }
            for slot in 0..self.slots.len() {
                if self.slots[slot] > now {
                    continue;
                }
                let batch = self.take(now);
                if batch.is_empty() {
                    continue;
                }
                self.count(now, |s| {
                    s.receives += 1;
                    s.deletes += 1;
                });
                let mut longest = 0;
                for m in batch {
                    longest = longest.max(self.handle(m, now));
                }
                self.slots[slot] = now + longest.max(1);
            }
            let done = now >= arrivals_until
                && self.waiting.is_empty()
                && self.queue.iter().all(VecDeque::is_empty)
                && self.slots.iter().all(|s| *s <= now);
            if done {
                break;
            }
            now += STEP_MS;
        }
        let delays = |dest: usize| -> Vec<i64> {
            self.sent.iter().zip(&self.created).filter_map(|(s, c)| s[dest].map(|t| t - c)).collect()
        };
        let healthy: Vec<i64> = delays(1).into_iter().chain(delays(2)).collect();
        let down_sent = delays(DOWN).len();
        // The backlog: deliveries made before the partner came back.
        let last_backlog = self
            .sent
            .iter()
            .zip(&self.created)
            .filter(|(_, c)| **c < self.outage_ms)
            .filter_map(|(s, _)| s[DOWN])
            .max()
            .unwrap_or(0);
        let drain_s = self.recovered_at.map(|r| (last_backlog - r) as f64 / 1000.0);
        let total = self.sqs.sends + self.sqs.receives + self.sqs.deletes;
        let per_event = (total as f64 / self.created.len().max(1) as f64 * 100.0).round() / 100.0;
        json!({
            "outage_minutes": self.outage_ms / 60_000,
            "events": self.created.len(),
            "delivered_to_down": down_sent,
            "dead": self.dead,
            "lost": self.created.len() - down_sent - self.dead as usize,
            "waiting_peak": self.waiting_peak,
            "drain_seconds_after_recovery": drain_s,
            "healthy_delay_ms": {"p50": percentile(healthy.clone(), 0.5), "p99": percentile(healthy, 0.99)},
            "down_delay_ms_p99": percentile(delays(DOWN), 0.99),
            "sqs_requests_during_outage": {"send": self.sqs_in_outage.sends, "receive": self.sqs_in_outage.receives,
                "delete": self.sqs_in_outage.deletes},
            "sqs_requests_total": {"send": self.sqs.sends, "receive": self.sqs.receives, "delete": self.sqs.deletes},
            "sqs_requests_per_event": per_event,
            "ledger_writes_per_down_delivery": (self.writes_down as f64 / self.created.len().max(1) as f64 * 100.0).round() / 100.0,
        })
    }
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<(Params, bool)>, String> {
    let mut p = Params::default();
    let mut json = false;
    let mut minutes = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--json" => json = true,
            "--help" | "-h" => return Ok(None),
            "--rate" => p.rate = value("--rate")?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--minutes" => minutes.push(value("--minutes")?.parse().map_err(|e| format!("--minutes: {e}"))?),
            "--concurrency" => {
                p.concurrency = value("--concurrency")?.parse().map_err(|e| format!("--concurrency: {e}"))?;
            }
            "--partner-ms" => {
                p.partner_ms = value("--partner-ms")?.parse().map_err(|e| format!("--partner-ms: {e}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !minutes.is_empty() {
        p.outages_min = minutes;
    }
    if p.rate == 0 || p.concurrency == 0 {
        return Err("--rate and --concurrency must be positive".into());
    }
    Ok(Some((p, json)))
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
    let runs: Vec<Value> = p.outages_min.iter().map(|m| Run::new(&p, *m).run()).collect();
    let assumptions = json!({
        "model": "a model, not a measurement",
        "rate_events_per_s": p.rate, "destinations": "3 HTTPS (one down, two healthy)",
        "delivery_concurrency": p.concurrency, "batch": BATCH, "partner_answer_ms": p.partner_ms,
        "ledger_request_ms": LEDGER_MS, "refused_connection_ms": REFUSED_MS,
        "circuit": {"threshold": CircuitPolicy::default().threshold, "open_ms": CircuitPolicy::default().open_ms},
        "drain_page": DRAIN_PAGE, "arrivals": "the outage, then 30 minutes more",
    });
    if json {
        println!("{}", json!({"assumptions": assumptions, "runs": runs}));
        return;
    }
    println!("outage model (a model, not a measurement): {assumptions}");
    let head = [
        "outage",
        "events",
        "DEAD",
        "lost",
        "peak waiting",
        "drain after recovery",
        "healthy p50/p99",
        "SQS requests/event",
        "SQS requests in outage",
        "writes/delivery to down",
    ];
    println!("{}", head.join(" | "));
    for r in &runs {
        let q = &r["sqs_requests_during_outage"];
        let in_outage =
            q["send"].as_u64().unwrap_or(0) + q["receive"].as_u64().unwrap_or(0) + q["delete"].as_u64().unwrap_or(0);
        let row = [
            format!("{} min", r["outage_minutes"]),
            r["events"].to_string(),
            r["dead"].to_string(),
            r["lost"].to_string(),
            r["waiting_peak"].to_string(),
            r["drain_seconds_after_recovery"].as_f64().map_or("-".to_owned(), |d| format!("{d:.0} s")),
            format!("{}/{} ms", r["healthy_delay_ms"]["p50"], r["healthy_delay_ms"]["p99"]),
            r["sqs_requests_per_event"].to_string(),
            in_outage.to_string(),
            r["ledger_writes_per_down_delivery"].to_string(),
        ];
        println!("{}", row.join(" | "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(minutes: u64) -> Value {
        let p = Params { rate: 20, outages_min: vec![minutes], ..Params::default() };
        Run::new(&p, minutes).run()
    }

    /// Without an outage nothing waits; with one, nothing is lost or DEAD,
    /// the waiting deliveries drain after recovery, and the healthy
    /// destinations' p99 does not move.
    #[test]
    fn an_outage_costs_no_delivery_and_leaves_the_healthy_destinations_alone() {
        let calm = small(0);
        let out = small(10);
        assert_eq!(
            (calm["dead"].as_u64(), calm["lost"].as_u64(), calm["waiting_peak"].as_u64()),
            (Some(0), Some(0), Some(0))
        );
        assert_eq!((out["dead"].as_u64(), out["lost"].as_u64()), (Some(0), Some(0)), "{out}");
        assert!(out["waiting_peak"].as_u64().unwrap_or(0) > 1_000, "{out}");
        assert!(out["drain_seconds_after_recovery"].as_f64().is_some(), "{out}");
        assert_eq!(out["healthy_delay_ms"]["p99"], calm["healthy_delay_ms"]["p99"], "{out} {calm}");
    }

    #[test]
    fn arguments_are_checked() {
        assert!(parse_args(["--rate".to_owned(), "x".to_owned()]).is_err());
        assert!(parse_args(["--what".to_owned()]).is_err());
        let (p, json) = parse_args(["--minutes".into(), "5".into(), "--json".into()]).unwrap().unwrap();
        assert_eq!((p.outages_min, json), (vec![5], true));
    }
}
