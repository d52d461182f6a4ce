//! Test support shared by the integration tests in `it/` and the benchmarks:
//! fault injection in the AWS SDK's HTTP client, with a per-call trace, and a
//! model of the capacity units the requests would consume.

pub mod capacity;
pub mod faults;
pub mod iam;
