//! Hookledger: effectively-once webhook outcomes on AWS.
//!
//! Layers, bottom to top; a module imports only from layers below its own
//! (and, inside a layer, only from the modules listed before it):
//!
//! 1. domain: `secret`, `identity`, `event`, `backoff`, `policy` (record
//!    policy: retention, index shards, redrive grace, send lease, index
//!    partition names), `ledger` (the record model, its state machine, the
//!    ports `Ledger` and `WorkQueue`, port errors), `message` (the outbox
//!    value `OutboxMessage` and its idempotency key);
//! 2. building blocks: `verify`, `projection`; then `config` (typed
//!    configuration and the processor and reconciler settings), `app` (the
//!    reference projections) and `seed001`;
//! 3. adapters: `adapters` (DynamoDB ledger, work records and outbox items,
//!    SQS, Secrets/SSM, HTTPS, Stripe) and `telemetry` (the metrics collector);
//! 4. use cases: `intake`, `ops`, `outbox` (the dispatcher); then `processor`
//!    and `reconciler`, which use the dispatcher;
//! 5. the functions and the CLI (other crates).

pub mod adapters;
pub mod app;
pub mod backoff;
pub mod config;
pub mod event;
pub mod identity;
pub mod intake;
pub mod ledger;
pub mod message;
pub mod ops;
pub mod outbox;
pub mod policy;
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
