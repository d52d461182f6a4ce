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
pub const DEFAULT_INDEX_SHARDS: u32 = 16;
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
