//! Hookledger: effectively-once webhook outcomes on AWS.
//!
//! The crate is layered: `verify`, `identity` and `ledger` are pure domain
//! code; `config` reads and validates the typed configuration once; `intake`
//! is the intake use case over two small ports (`ledger::Ledger`,
//! `queue::WorkQueue`); `adapters` implement those ports with the AWS SDK.

pub mod secret;
pub mod verify;
