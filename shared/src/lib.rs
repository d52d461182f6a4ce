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
pub mod outbox;
pub mod processor;
pub mod projection;
pub mod secret;
pub mod seed001;
pub mod telemetry;
pub mod verify;
