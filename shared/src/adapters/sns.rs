//! SNS as a destination: publishing is `adapters::destinations` (with SQS
//! queues and EventBridge buses); what subscribers read is named here.

/// The message attribute carrying the idempotency key (SNS and SQS
/// destinations): consumers de-duplicate on it.
pub const IDEMPOTENCY_ATTRIBUTE: &str = crate::message::IDEMPOTENCY_ATTRIBUTE;
