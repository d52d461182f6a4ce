//! Hookledger: effectively-once webhook outcomes on AWS.
//!
//! Layers, bottom to top; a module imports only from layers below its own
//! (and, inside a layer, only from the modules listed before it):
//!
//! 1. domain: `clock` (time and randomness as ports: the only module that
//!    reads the system's), `netguard` (the addresses HTTPS destinations may
//!    reach), `secret`, `identity`, `event`, `backoff`, `policy` (record
//!    policy: retention, index shards, redrive grace, send lease, index
//!    partition names), `ledger` (the record model, its state machine, the
//!    ports `Ledger` and `WorkQueue`, port errors), `message` (the outbox
//!    value `OutboxMessage` and its idempotency key);
//! 2. building blocks: `verify`, `projection`; then `config` (typed
//!    configuration and the processor and reconciler settings), `app` (the
//!    reference projections) and `seed001`;
//! 3. adapters: `adapters` (DynamoDB ledger, work records and outbox items,
//!    SQS, SNS, EventBridge, HTTPS destinations, Secrets/SSM, Stripe) and
//!    `telemetry` (the metrics collector);
//! 4. use cases: `admission` (one path by which the intake, the backfill
//!    and the drift repair record an event), `intake`, `backfill` (recovery from providers' event
//!    lists), `insight` (the operator's bounded figures), `ops`, `outbox`
//!    (the dispatcher); then `processor` and
//!    `reconciler`, which use the dispatcher. Use cases name ports, never
//!    an adapter (the layer test below forbids `crate::adapters` in them);
//! 5. `wiring`: the composition root, the one place that builds adapters
//!    and puts the use cases on them;
//! 6. the functions and the CLI (other crates), which start at `wiring`.

pub mod adapters;
pub mod admission;
pub mod app;
pub mod backfill;
pub mod backoff;
pub mod batch;
pub mod clock;
pub mod config;
#[cfg(any(test, feature = "testkit"))]
pub mod contract;
pub mod event;
pub mod identity;
pub mod insight;
pub mod intake;
pub mod ledger;
pub mod message;
pub mod netguard;
pub mod ops;
pub mod outbox;
pub mod policy;
pub mod ports;
pub mod processor;
pub mod projection;
pub mod reconciler;
pub mod routes;
pub mod secret;
pub mod seed001;
pub mod telemetry;
pub mod verify;
pub mod wiring;

#[cfg(test)]
mod readme {
    /// docs/extending.md's projection example is the code of `examples/custom_projection.rs`, which compiles.
    #[test]
    fn readme_projection_example_is_the_compiled_example() {
        let readme = include_str!("../../docs/extending.md");
        let example = include_str!("../examples/custom_projection.rs");
        let start = example.find("// --- begin readme ---\n").map(|i| i + "// --- begin readme ---\n".len()).unwrap();
        let end = example.find("// --- end readme ---").unwrap();
        assert!(
            readme.contains(&format!("```rust\n{}```", &example[start..end])),
            "docs/extending.md and examples/custom_projection.rs differ"
        );
    }
}

#[cfg(test)]
mod layers {
    /// The modules, lowest layer first (the map above). A module may name
    /// `crate::X` only for an X listed before it.
    const ORDER: [&str; 29] = [
        "clock",
        "netguard",
        "secret",
        "identity",
        "event",
        "backoff",
        "policy",
        "ledger",
        "message",
        "routes",
        "verify",
        "projection",
        "ports",
        "config",
        "app",
        "seed001",
        "adapters",
        "telemetry",
        "admission",
        "contract",
        "intake",
        "backfill",
        "insight",
        "ops",
        "outbox",
        "processor",
        "batch",
        "reconciler",
        "wiring",
    ];

    fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn no_module_imports_one_above_it_and_there_is_no_circle() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let rank = |m: &str| ORDER.iter().position(|o| *o == m);
        let mut files = Vec::new();
        sources(&root, &mut files);
        let mut upward = Vec::new();
        for file in files {
            let rel = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
            if rel == "lib.rs" {
                continue;
            }
            let from = rel.split(['/', '.']).next().unwrap().to_owned();
            let from_rank = rank(&from).unwrap_or_else(|| panic!("{rel}: module {from} is not on the layer map"));
            let text = std::fs::read_to_string(&file).unwrap();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("crate::") {
                    // `$crate::` in a macro names the crate's root, where exported macros live.
                    if line[..i].ends_with('$') {
                        continue;
                    }
                    let to: String =
                        line[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if to == from {
                        continue;
                    }
                    match rank(&to) {
                        Some(r) if r < from_rank => {}
                        _ => upward.push(format!("{rel} -> crate::{to}")),
                    }
                }
            }
        }
        upward.sort();
        upward.dedup();
        assert!(upward.is_empty(), "imports that run upward or sideways:\n{}", upward.join("\n"));
    }

    /// The use cases, which name ports and never an adapter.
    const USE_CASES: [&str; 9] =
        ["admission", "intake", "backfill", "insight", "ops", "outbox", "processor", "reconciler", "batch"];

    #[test]
    fn use_cases_name_no_adapter_and_only_the_wiring_builds_one() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        for name in USE_CASES {
            let text = std::fs::read_to_string(root.join(format!("{name}.rs"))).unwrap();
            for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with("//")) {
                if line.contains("adapters::") {
                    found.push(format!("{name}.rs:{}: {}", n + 1, line.trim()));
                }
            }
        }
        assert!(found.is_empty(), "use cases naming adapters:\n{}", found.join("\n"));
        // Outside the adapters themselves, only the composition root builds them.
        let built = [
            "DynamoLedger::new(",
            "SqsQueue::new(",
            "AwsPublisher::new(",
            "AwsSecretResolver::new(",
            "S3Payloads::from_config(",
        ];
        let mut files = Vec::new();
        sources(&root, &mut files);
        let mut outside = Vec::new();
        for file in files {
            let rel = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
            if rel.starts_with("adapters/") || rel == "wiring.rs" || rel == "lib.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let production = text.split("#[cfg(test)]").next().unwrap_or_default();
            for b in built.iter().filter(|b| production.contains(*b)) {
                outside.push(format!("{rel}: {b}"));
            }
        }
        assert!(outside.is_empty(), "adapters built outside the wiring:\n{}", outside.join("\n"));
    }

    /// Only `clock` reads the system's time and randomness.
    #[test]
    fn only_the_clock_reads_real_time_or_randomness() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &mut files);
        let reads = ["Instant::now()", "SystemTime::now()", "tokio::time::sleep", "Uuid::new_v4()"];
        let mut found = Vec::new();
        for file in files {
            let rel = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
            if rel == "clock.rs" || rel == "lib.rs" || rel.ends_with("/tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let production = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, line) in production.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with("//")) {
                for r in reads.iter().filter(|r| line.contains(*r)) {
                    found.push(format!("{rel}:{}: {r}", n + 1));
                }
            }
        }
        assert!(found.is_empty(), "time or randomness read outside clock.rs:\n{}", found.join("\n"));
    }
}
