//! The intake Lambda's handler, kept apart from `main.rs` so it can be tested
//! with real API Gateway v2 request fixtures.

pub mod handler;
