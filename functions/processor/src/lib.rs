//! The processor Lambda's handler, apart from `main.rs` so it can be tested
//! with real SQS event fixtures.

pub mod handler;
