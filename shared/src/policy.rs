//! Record policy: how long identities are kept, how the indexes are
//! sharded, when a record becomes due for the reconciler and how long a
//! delivery may hold the right to enqueue. Plain values, shared by the use
//! cases, the adapters and the configuration that may override them.

/// Providers retry for up to ~3 days (Stripe, Standard Webhooks); keep ids far longer.
pub const DEFAULT_RETENTION_DAYS: u32 = 30;
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
