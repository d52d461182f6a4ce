//! The reconciler Lambda's handler, apart from `main.rs` so it can be tested.

pub mod backfills;
pub mod handler;
