//! The simulator in the test command: a thousand seeds keep the
//! promise, a seed is the same run every time, and every planted bug is
//! caught, its failing seed replayed by the command it prints.

use hookledger::planted::Bug;
use hookledger_sim::seeds;
use hookledger_sim::world::{Knobs, run_seed};

/// Seeds in the test command (all 100,000: `scripts/simulate`).
const QUICK: u64 = 1_000;

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[test]
fn a_thousand_seeds_keep_the_promise() {
    hookledger_sim::world::quiet_crashes();
    let report = seeds::run(1..=QUICK, threads(), Knobs::default(), None, None);
    let failures: Vec<String> = report
        .failures
        .iter()
        .take(5)
        .map(|f| format!("seed {}: {:?}\n  replay: {}", f.seed, f.violations, f.replay(None)))
        .collect();
    assert!(failures.is_empty(), "{} failing seeds:\n{}", report.failures.len(), failures.join("\n"));
    let f = report.figures;
    assert_eq!(f.seeds, QUICK);
    // The seeds did what they say: faults, crashes, interleavings, routes.
    assert!(f.faults > f.seeds && f.crashes > 0 && f.interleavings > 0, "{f:?}");
    assert!(f.routed_deliveries > 0 && f.deliveries > f.events, "{f:?}");
    println!("simulated: {f:?}");
}

#[test]
fn a_seed_run_twice_gives_the_same_trace() {
    hookledger_sim::world::quiet_crashes();
    for seed in [3, 41] {
        let a = run_seed(seed, Knobs::default(), None);
        let b = run_seed(seed, Knobs::default(), None);
        assert!(a.trace.len() > 20, "seed {seed}: {} steps", a.trace.len());
        assert_eq!(a.trace.join("\n"), b.trace.join("\n"), "seed {seed}");
        assert_eq!(a.violations, b.violations);
    }
    // Another seed, another schedule.
    assert_ne!(run_seed(3, Knobs::default(), None).trace, run_seed(4, Knobs::default(), None).trace);
}

/// Each planted bug fails a seed within the first few hundred, and that
/// seed's printed command replays it: the same violations, every time.
#[test]
fn every_planted_bug_is_caught_and_its_seed_replays_with_its_command() {
    hookledger_sim::world::quiet_crashes();
    for bug in Bug::ALL {
        let report = seeds::run(1..=400, 1, Knobs::default(), Some(bug), Some(1));
        let Some(first) = report.failures.first() else { panic!("{}: not caught in 400 seeds", bug.name()) };
        let command = first.replay(Some(bug));
        let args: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(args[..2], ["scripts/simulate", "--seed"], "{command}");
        let seed: u64 = args[2].parse().unwrap();
        let planted = Bug::parse(args[4]);
        assert_eq!((seed, planted), (first.seed, Some(bug)), "{command}");
        let again = run_seed(seed, Knobs::default(), planted);
        assert_eq!(again.violations, first.violations, "{command}");
        // Without the bug, the same seed keeps the promise.
        assert!(run_seed(seed, Knobs::default(), None).violations.is_empty(), "{command} without the bug");
    }
}

/// The binary itself: the printed command, run, replays the failure and
/// exits 1; the same seed without the bug exits 0.
#[test]
fn the_printed_command_runs() {
    let bin = env!("CARGO_BIN_EXE_simulate");
    let report = seeds::run(1..=400, 1, Knobs::default(), Some(Bug::NoRevisionGuard), Some(1));
    let command = report.failures[0].replay(Some(Bug::NoRevisionGuard));
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let out = std::process::Command::new(bin).args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("violation regressed"), "{text}");
    let clean: Vec<&str> = args.iter().copied().filter(|a| *a != "--plant" && *a != "no-revision-guard").collect();
    let out = std::process::Command::new(bin).args(&clean).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}
