//! Hookledger: effectively-once webhook outcomes on AWS.
//!
//! The layers, bottom to top; a module imports only from layers below its
//! own and, inside a layer, from the modules listed before it (the map is
//! `layers::LAYERS`; this list and docs/architecture.md are checked
//! against it):
//!
//! <!-- layers:begin -->
//! 1. domain: `planted`, `clock`, `netguard`, `secret`, `item`, `identity`, `event`, `backoff`, `policy`, `ledger`, `message`, `routes`, `audit`, `redaction`, `sealing`
//! 2. building blocks: `verify`, `projection`, `ports`, `config`, `seed001`
//! 3. adapters: `adapters`, `telemetry`
//! 4. use cases: `admission`, `contract`, `intake`, `backfill`, `insight`, `ops`, `completeness`, `outbox`, `processor`, `batch`, `reconciler`
//! 5. composition root: `wiring`
//! <!-- layers:end -->
//!
//! Above them, in other crates: the functions and the CLI, which start at
//! `wiring`, and the applications (the reference app, `hookledger-app`),
//! which use only the domain and `projection`, and which the functions'
//! `main.rs` register. What each module is: docs/architecture.md ("Layers").
//!
//! The rules the `layers` tests keep (each an "Architecture Invariant" in
//! docs/architecture.md): no import runs upward; use cases (and their
//! submodules) name ports, never an adapter, and only `wiring` builds one;
//! only `clock` reads the system's time and randomness; no AWS SDK outside
//! `adapters/` and `wiring.rs`; the library names no application.

pub mod adapters;
pub mod admission;
pub mod audit;
pub mod backfill;
pub mod backoff;
pub mod batch;
pub mod clock;
pub mod completeness;
pub mod config;
#[cfg(any(test, feature = "testkit"))]
pub mod contract;
pub mod event;
pub mod identity;
pub mod insight;
pub mod intake;
pub mod item;
pub mod ledger;
pub mod message;
pub mod netguard;
pub mod ops;
pub mod outbox;
pub mod planted;
pub mod policy;
pub mod ports;
pub mod processor;
pub mod projection;
pub mod reconciler;
pub mod redaction;
pub mod routes;
pub mod sealing;
pub mod secret;
pub mod seed001;
pub mod telemetry;
pub mod verify;
pub mod wiring;

#[cfg(test)]
mod layers {
    /// The layer map, lowest layer first: each layer's modules in their
    /// order. A module may name `crate::X` only for an X listed before it.
    const LAYERS: [(&str, &[&str]); 5] = [
        (
            "domain",
            &[
                "planted",
                "clock",
                "netguard",
                "secret",
                "item",
                "identity",
                "event",
                "backoff",
                "policy",
                "ledger",
                "message",
                "routes",
                "audit",
                "redaction",
                "sealing",
            ],
        ),
        ("building blocks", &["verify", "projection", "ports", "config", "seed001"]),
        ("adapters", &["adapters", "telemetry"]),
        (
            "use cases",
            &[
                "admission",
                "contract",
                "intake",
                "backfill",
                "insight",
                "ops",
                "completeness",
                "outbox",
                "processor",
                "batch",
                "reconciler",
            ],
        ),
        ("composition root", &["wiring"]),
    ];

    /// Every module, lowest first (the map, flattened).
    fn order() -> Vec<&'static str> {
        LAYERS.iter().flat_map(|(_, modules)| modules.iter().copied()).collect()
    }

    /// The map as the docs show it.
    fn rendered() -> String {
        let mut out = String::new();
        for (i, (layer, modules)) in LAYERS.iter().enumerate() {
            let names: Vec<String> = modules.iter().map(|m| format!("`{m}`")).collect();
            out.push_str(&format!("{}. {layer}: {}\n", i + 1, names.join(", ")));
        }
        out
    }

    /// The block between the layer markers of a text, each line stripped of `prefix`.
    fn block(text: &str, prefix: &str) -> Option<String> {
        let lines: Vec<&str> = text.lines().map(|l| l.strip_prefix(prefix).unwrap_or(l).trim_end()).collect();
        let start = lines.iter().position(|l| l.trim() == "<!-- layers:begin -->")?;
        let end = lines.iter().position(|l| l.trim() == "<!-- layers:end -->")?;
        Some(lines[start + 1..end].iter().map(|l| format!("{l}\n")).collect())
    }

    fn root() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

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

    /// Every source file but this one, by its path under `src/`.
    fn files() -> Vec<(String, String)> {
        let mut paths = Vec::new();
        sources(&root(), &mut paths);
        let mut out: Vec<(String, String)> = paths
            .into_iter()
            .map(|p| {
                let rel = p.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/");
                (rel, std::fs::read_to_string(&p).unwrap())
            })
            .filter(|(rel, _)| rel != "lib.rs")
            .collect();
        out.sort();
        out
    }

    fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
        text.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with("//")).map(|(n, l)| (n + 1, l))
    }

    /// Architecture Invariant: the map in `lib.rs` and in
    /// docs/architecture.md is this test's, and every module is on it.
    #[test]
    fn the_layer_map_in_the_docs_is_the_one_the_tests_keep() {
        let want = rendered();
        let lib = std::fs::read_to_string(root().join("lib.rs")).unwrap();
        assert_eq!(block(&lib, "//! ").as_deref(), Some(want.as_str()), "lib.rs's map is out of date; it is:\n{want}");
        let doc = std::fs::read_to_string(root().join("../../docs/architecture.md")).unwrap();
        assert_eq!(
            block(&doc, "").as_deref(),
            Some(want.as_str()),
            "docs/architecture.md's map is out of date; it is:\n{want}"
        );
        let declared: Vec<&str> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod ").or_else(|| l.strip_prefix("mod ")))
            .map(|l| l.trim_end_matches(';').trim())
            .filter(|m| !["layers"].contains(m) && !m.ends_with('{'))
            .collect();
        let order = order();
        let off: Vec<&&str> = declared.iter().filter(|m| !order.contains(m)).collect();
        assert!(off.is_empty(), "modules not on the map: {off:?}");
        let gone: Vec<&&str> = order.iter().filter(|m| !declared.contains(m)).collect();
        assert!(gone.is_empty(), "on the map but not modules: {gone:?}");
    }

    /// The imports of `files` that run upward or sideways on the map.
    fn upward(files: &[(String, String)]) -> Vec<String> {
        let order = order();
        let rank = |m: &str| order.iter().position(|o| *o == m);
        let mut found = Vec::new();
        for (rel, text) in files {
            let from = rel.split(['/', '.']).next().unwrap().to_owned();
            let Some(from_rank) = rank(&from) else {
                found.push(format!("{rel}: module {from} is not on the layer map"));
                continue;
            };
            for (_, line) in code_lines(text) {
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
                        _ => found.push(format!("{rel} -> crate::{to}")),
                    }
                }
            }
        }
        found.sort();
        found.dedup();
        found
    }

    /// Architecture Invariant: no module imports one above it (so there is no circle).
    #[test]
    fn no_module_imports_one_above_it_and_there_is_no_circle() {
        let found = upward(&files());
        assert!(found.is_empty(), "imports that run upward or sideways:\n{}", found.join("\n"));
    }

    /// The use cases, which name ports and never an adapter.
    const USE_CASES: [&str; 10] = [
        "admission",
        "intake",
        "backfill",
        "insight",
        "ops",
        "completeness",
        "outbox",
        "processor",
        "reconciler",
        "batch",
    ];

    /// Lines of use-case sources (submodules and their tests included) that name an adapter.
    fn naming_adapters(files: &[(String, String)]) -> Vec<String> {
        let mut found = Vec::new();
        for (rel, text) in files {
            let module = rel.split(['/', '.']).next().unwrap_or_default();
            if !USE_CASES.contains(&module) {
                continue;
            }
            // A use case's unit tests run on the memory world, an adapter
            // they may name; its production code may not.
            if rel.ends_with("tests.rs") {
                continue;
            }
            let production = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, line) in code_lines(production) {
                if line.contains("adapters::") {
                    found.push(format!("{rel}:{n}: {}", line.trim()));
                }
            }
        }
        found
    }

    /// Architecture Invariant: use cases, submodules included, name ports,
    /// never an adapter; only the wiring builds adapters.
    #[test]
    fn use_cases_name_no_adapter_and_only_the_wiring_builds_one() {
        let files = files();
        let found = naming_adapters(&files);
        assert!(found.is_empty(), "use cases naming adapters:\n{}", found.join("\n"));
        // Outside the adapters themselves, only the composition root builds them.
        let built = [
            "DynamoLedger::new(",
            "SqsQueue::new(",
            "AwsPublisher::new(",
            "AwsSecretResolver::new(",
            "S3Payloads::from_config(",
        ];
        let mut outside = Vec::new();
        for (rel, text) in &files {
            if rel.starts_with("adapters/") || rel == "wiring.rs" {
                continue;
            }
            let production = text.split("#[cfg(test)]").next().unwrap_or_default();
            for b in built.iter().filter(|b| production.contains(*b)) {
                outside.push(format!("{rel}: {b}"));
            }
        }
        assert!(outside.is_empty(), "adapters built outside the wiring:\n{}", outside.join("\n"));
    }

    /// Lines naming an AWS SDK crate outside the adapters and the wiring
    /// (tests included: a test that needs the SDK is the adapters' test).
    fn naming_the_sdk(files: &[(String, String)]) -> Vec<String> {
        let sdk = concat!("aws", "_sdk_");
        let mut found = Vec::new();
        for (rel, text) in files {
            if rel.starts_with("adapters/") || rel == "wiring.rs" {
                continue;
            }
            for (n, line) in code_lines(text) {
                if line.contains(sdk) {
                    found.push(format!("{rel}:{n}: {}", line.trim()));
                }
            }
        }
        found
    }

    /// Architecture Invariant: no AWS SDK outside `adapters/` and `wiring.rs`.
    #[test]
    fn no_aws_sdk_outside_the_adapters_and_the_wiring() {
        let found = naming_the_sdk(&files());
        assert!(found.is_empty(), "the AWS SDK named outside the adapters:\n{}", found.join("\n"));
    }

    /// Lines naming the reference application: its crate, its modules'
    /// paths, its state keys.
    fn naming_the_app(files: &[(String, String)]) -> Vec<String> {
        let names = [
            concat!("hookledger", "_app"),
            concat!("hookledger", "-app"),
            concat!("app", "::"),
            concat!("entitlement", "::"),
            concat!("account_ledger", "::"),
            concat!("email_status", "::"),
            concat!("inventory", "::"),
            concat!("seats", "::"),
            concat!("subjects", "::"),
            concat!("proj#", "entitlement"),
            concat!("proj#", "seats"),
            concat!("proj#", "balance"),
            concat!("proj#", "inventory"),
            concat!("subject", "#"),
        ];
        let mut found = Vec::new();
        for (rel, text) in files {
            for (n, line) in code_lines(text) {
                for name in names.iter().filter(|name| line.contains(*name)) {
                    found.push(format!("{rel}:{n}: {name}"));
                }
            }
        }
        found
    }

    /// Architecture Invariant: the library names no application (the
    /// reference app is a crate above it, registered by the functions).
    #[test]
    fn the_library_names_no_application() {
        let found = naming_the_app(&files());
        assert!(found.is_empty(), "the library names the application:\n{}", found.join("\n"));
        let manifest = std::fs::read_to_string(root().join("../Cargo.toml")).unwrap();
        assert!(!manifest.contains(concat!("hookledger", "-app")), "the library depends on the application");
    }

    /// Each rule fails on a planted violation of it.
    #[test]
    fn each_rule_catches_a_planted_violation() {
        let planted = |rel: &str, text: &str| vec![(rel.to_owned(), text.to_owned())];
        let sdk = concat!("use aws", "_sdk_dynamodb::types::AttributeValue;\n");
        assert_eq!(naming_the_sdk(&planted("projection/snapshot.rs", sdk)).len(), 1, "the SDK in projection/");
        assert_eq!(naming_the_sdk(&planted("processor/tests.rs", sdk)).len(), 1, "the SDK in a test module");
        assert!(naming_the_sdk(&planted("adapters/dynamodb/item.rs", sdk)).is_empty(), "the adapters may");
        let app = concat!("use hookledger", "_app::entitlement::entitlement_pk;\n");
        assert!(!naming_the_app(&planted("reconciler.rs", app)).is_empty(), "the library naming the app");
        let sub = "use crate::adapters::dynamodb::DynamoLedger;\n";
        assert_eq!(naming_adapters(&planted("outbox/circuit.rs", sub)).len(), 1, "a use case's submodule");
        assert_eq!(upward(&planted("projection/mod.rs", "use crate::wiring::Wiring;\n")).len(), 1, "upward");
        assert_eq!(upward(&planted("nowhere.rs", "")).len(), 1, "a module off the map");
        let mut stale = rendered();
        stale.push_str("6. somewhere: `else`\n");
        let doc = format!("<!-- layers:begin -->\n{stale}<!-- layers:end -->\n");
        assert_ne!(block(&doc, "").as_deref(), Some(rendered().as_str()), "a map out of date");
    }

    /// Architecture Invariant: only `clock` reads the system's time and randomness.
    #[test]
    fn only_the_clock_reads_real_time_or_randomness() {
        let reads = ["Instant::now()", "SystemTime::now()", "tokio::time::sleep", "Uuid::new_v4()"];
        let mut found = Vec::new();
        for (rel, text) in files() {
            if rel == "clock.rs" || rel.ends_with("/tests.rs") {
                continue;
            }
            let production = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, line) in code_lines(production) {
                for r in reads.iter().filter(|r| line.contains(*r)) {
                    found.push(format!("{rel}:{n}: {r}"));
                }
            }
        }
        assert!(found.is_empty(), "time or randomness read outside clock.rs:\n{}", found.join("\n"));
    }
}
