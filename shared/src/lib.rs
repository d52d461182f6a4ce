//! Hookledger: effectively-once webhook outcomes on AWS.
//!
//! Layers: `verify`, `identity` and `ledger` are pure domain code; `config`
//! reads and validates the typed configuration once; `intake` is the intake
//! use case over two small ports (`ledger::Ledger`, `ledger::WorkQueue`);
//! `adapters` implement the ports with the AWS SDK.

pub mod adapters;
pub mod app;
pub mod backoff;
pub mod config;
pub mod event;
pub mod identity;
pub mod intake;
pub mod ledger;
pub mod ops;
pub mod outbox;
pub mod processor;
pub mod projection;
pub mod reconciler;
pub mod secret;
pub mod seed001;
pub mod telemetry;
pub mod verify;

#[cfg(test)]
mod readme {
    /// The README's projection example is the code of `examples/custom_projection.rs`, which compiles.
    #[test]
    fn readme_projection_example_is_the_compiled_example() {
        let readme = include_str!("../../README.md");
        let example = include_str!("../examples/custom_projection.rs");
        let start = example.find("// --- begin readme ---\n").map(|i| i + "// --- begin readme ---\n".len()).unwrap();
        let end = example.find("// --- end readme ---").unwrap();
        assert!(
            readme.contains(&format!("```rust\n{}```", &example[start..end])),
            "README and examples/custom_projection.rs differ"
        );
    }
}
