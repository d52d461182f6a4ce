//! Integration tests live in `it/`; this crate has no library code.
