//! Record policy: how long identities are kept, how the indexes are
//! sharded, when a record becomes due for the reconciler and how long a
//! delivery may hold the right to enqueue. Plain values, shared by the use
//! cases, the adapters and the configuration that may override them.

/// Providers retry for up to ~3 days (Stripe, Standard Webhooks); keep ids far longer.
pub const DEFAULT_RETENTION_DAYS: u32 = 30;

/// When an item written at `now_ms` expires (DynamoDB TTL, Unix seconds):
/// `retention_days` later. Every item with a TTL gets it from here.
pub fn expires_at(now_ms: i64, retention_days: u32) -> i64 {
    now_ms.div_euclid(1000) + i64::from(retention_days) * 86_400
}
/// Shards of the `due` and `attention` indexes (`HOOKLEDGER_INDEX_SHARDS`).
/// Each partition kind's key takes its writes in order of a growing sort key,
/// at most 1,000 write units/s per key; 80 keeps every key at or below 500 at
/// 10,000 events/s of the reference app's busiest kind, the subscription's
/// outbox (4 index writes per event: 4 × 10,000 ÷ 80; the pipeline bench's
/// `index_capacity`, docs/measurements.md). An idle reconciler run costs 4
/// queries per shard. Raised freely, never lowered (`adapters::dynamodb::shards`).
pub const DEFAULT_INDEX_SHARDS: u32 = 80;
/// A RECEIVED record becomes due for the reconciler this long after receipt
/// (never sent, or sent but not picked up): well past the send lease.
pub const REDRIVE_GRACE_MS: i64 = 60_000;
/// How long one delivery may hold the right to enqueue a record. Longer than
/// the intake's worst-case store + send time; a crashed holder's lease lapses.
pub const SEND_LEASE_MS: i64 = 15_000;

/// Index partition names: `due#007` for ledger records, `out#007` for outbox items.
pub fn due_shard_named(prefix: &str, shard: u32) -> String {
    format!("{prefix}#{shard:03}")
}
