//! Many seeds over the cores: each thread takes the next seed until the
//! range is done; the figures are summed, the failing seeds kept in order.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hookledger::planted::Bug;

use crate::check::Violation;
use crate::world::{Figures, Knobs, run_seed};

/// A failing seed: its violations and the command that replays it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub violations: Vec<Violation>,
}

impl Failure {
    /// The one-line command that replays this seed exactly, with its trace.
    pub fn replay(&self, bug: Option<Bug>) -> String {
        replay_command(self.seed, bug)
    }
}

pub fn replay_command(seed: u64, bug: Option<Bug>) -> String {
    match bug {
        Some(b) => format!("scripts/simulate --seed {seed} --plant {} --trace", b.name()),
        None => format!("scripts/simulate --seed {seed} --trace"),
    }
}

/// What a run of seeds found.
#[derive(Debug, Default)]
pub struct Report {
    pub figures: Figures,
    /// Failing seeds, lowest first.
    pub failures: Vec<Failure>,
}

/// Runs `seeds` on `threads` threads (with `bug` planted on each); stops
/// early once `stop_after` seeds failed (`None`: never).
pub fn run(
    seeds: std::ops::RangeInclusive<u64>,
    threads: usize,
    knobs: Knobs,
    bug: Option<Bug>,
    stop_after: Option<usize>,
) -> Report {
    let next = AtomicU64::new(*seeds.start());
    let last = *seeds.end();
    let report = Mutex::new(Report::default());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed > last {
                        break;
                    }
                    let out = run_seed(seed, knobs, bug);
                    let mut r = report.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    r.figures.add(&out.figures);
                    if !out.violations.is_empty() {
                        r.failures.push(Failure { seed, violations: out.violations });
                        if stop_after.is_some_and(|n| r.failures.len() >= n) {
                            next.store(last + 1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    let mut r = report.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    r.failures.sort_by_key(|f| f.seed);
    r
}

/// Parses `A..B` or `A..=B` or `N` (inclusive).
pub fn parse_range(text: &str) -> Result<std::ops::RangeInclusive<u64>, String> {
    let bad = || format!("{text:?} is not a seed range (N, A..B)");
    match text.split_once("..") {
        Some((a, b)) => {
            let a: u64 = a.parse().map_err(|_| bad())?;
            let b: u64 = b.trim_start_matches('=').parse().map_err(|_| bad())?;
            if b < a {
                return Err(bad());
            }
            Ok(a..=b)
        }
        None => {
            let n: u64 = text.parse().map_err(|_| bad())?;
            Ok(n..=n)
        }
    }
}
