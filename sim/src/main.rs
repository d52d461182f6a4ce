//! `simulate`: runs seeds of the deterministic simulation.
//!
//! ```text
//! simulate --seeds 1..100000 [--threads N] [--plant BUG] [--json]
//! simulate --seed N [--plant BUG] --trace      # replays one seed, step by step
//! simulate --bugs [--seeds 1..2000]            # each planted bug: seeds to first failure
//! ```
//! Exit status: 0 when every seed keeps the promise (or, with `--bugs`,
//! when every planted bug is caught), 1 otherwise, 2 for bad arguments.

use std::process::ExitCode;
use std::time::Instant;

use hookledger::planted::Bug;
use hookledger_sim::seeds::{self, replay_command};
use hookledger_sim::world::{Knobs, run_seed};

struct Args {
    seeds: std::ops::RangeInclusive<u64>,
    threads: usize,
    bug: Option<Bug>,
    trace: bool,
    json: bool,
    bugs: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        seeds: 1..=1000,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        bug: None,
        trace: false,
        json: false,
        bugs: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--seeds" | "--seed" => a.seeds = seeds::parse_range(&value()?)?,
            "--threads" => a.threads = value()?.parse().map_err(|_| "--threads takes a number".to_owned())?,
            "--plant" => {
                let name = value()?;
                let names: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
                a.bug =
                    Some(Bug::parse(&name).ok_or_else(|| format!("no bug {name:?} (one of {})", names.join(", ")))?);
            }
            "--trace" => a.trace = true,
            "--json" => a.json = true,
            "--bugs" => a.bugs = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("simulate: {e}");
            }
            eprintln!(
                "usage: simulate --seeds A..B [--threads N] [--plant BUG] [--json]\n       simulate --seed N [--plant BUG] --trace\n       simulate --bugs [--seeds A..B]"
            );
            return ExitCode::from(2);
        }
    };
    hookledger_sim::world::quiet_crashes();
    if a.trace {
        let seed = *a.seeds.start();
        let out = run_seed(seed, Knobs::default(), a.bug);
        for line in &out.trace {
            println!("{line}");
        }
        for v in &out.violations {
            println!("violation {v}");
        }
        println!("seed {seed}: {} violations", out.violations.len());
        return if out.violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    if a.bugs {
        return bugs(&a);
    }
    let started = Instant::now();
    let report = seeds::run(a.seeds.clone(), a.threads, Knobs::default(), a.bug, None);
    let secs = started.elapsed().as_secs_f64();
    for f in report.failures.iter().take(20) {
        let first = f.violations.first().map(ToString::to_string).unwrap_or_default();
        println!("seed {} failed: {first} (+{} more)", f.seed, f.violations.len().saturating_sub(1));
        println!("  replay: {}", f.replay(a.bug));
    }
    let fig = report.figures;
    let per_sec = fig.seeds as f64 / secs.max(1e-9);
    let kinds = |kind: &str| report.failures.iter().filter(|f| f.violations.iter().any(|v| v.kind == kind)).count();
    let summary = serde_json::json!({
        "seeds": fig.seeds, "threads": a.threads, "wall_seconds": (secs * 10.0).round() / 10.0,
        "seeds_per_second": per_sec.round(),
        "failed_seeds": report.failures.len(),
        "lost": kinds("lost"), "doubled": kinds("doubled"), "wrongly_dead": kinds("wrongly_dead"),
        "liveness": kinds("liveness"), "regressed": kinds("regressed"), "other": kinds("other"),
        "events": fig.events, "deliveries": fig.deliveries, "processor_invocations": fig.invocations,
        "reconciler_runs": fig.reconciler_runs, "interleavings": fig.interleavings,
        "faults_injected": fig.faults, "crashes": fig.crashes, "routed_deliveries": fig.routed_deliveries,
        "steps": fig.steps, "virtual_hours": fig.virtual_ms / 3_600_000,
        "planted": a.bug.map(|b| b.name()),
    });
    if a.json {
        println!("{summary}");
    } else {
        println!(
            "simulate: {} seeds in {secs:.1} s on {} threads ({per_sec:.0} seeds/s): {} failed; {} events, {} deliveries, {} faults injected ({} crashes), {} interleavings",
            fig.seeds,
            a.threads,
            report.failures.len(),
            fig.events,
            fig.deliveries,
            fig.faults,
            fig.crashes,
            fig.interleavings
        );
        println!("{summary}");
    }
    if report.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Each planted bug over the seeds until its first failure.
fn bugs(a: &Args) -> ExitCode {
    println!("| planted bug | seeds to first failure | what the checker said | replay |");
    println!("|---|---|---|---|");
    let mut all = true;
    for bug in Bug::ALL {
        let report = seeds::run(a.seeds.clone(), 1, Knobs::default(), Some(bug), Some(1));
        match report.failures.first() {
            Some(f) => {
                let first = f.violations.first().map(ToString::to_string).unwrap_or_default();
                let first: String = first.chars().take(90).collect();
                let n = f.seed - a.seeds.start() + 1;
                println!("| `{}` | {n} | {first} | `{}` |", bug.name(), replay_command(f.seed, Some(bug)));
            }
            None => {
                all = false;
                println!("| `{}` | not caught in {} seeds | | |", bug.name(), a.seeds.end() - a.seeds.start() + 1);
            }
        }
    }
    if all { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
