//! Durable event identity: provider + endpoint scope + the provider's stable id.
//!
//! The endpoint is the scope: it names one provider account (one tenant's
//! Stripe account, one GitHub app, one SNS topic set), so two tenants that
//! receive the same provider id get two records. A payload hash is stored
//! beside the key to detect "same id, different body", never used as the key.

use std::fmt;

use sha2::{Digest, Sha256};

/// The ledger key of one provider fact, e.g. `evt#stripe#billing-eu#evt_123`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKey(String);

impl EventKey {
    pub fn new(provider: &str, endpoint: &str, event_id: &str) -> Self {
        Self(format!("evt#{provider}#{endpoint}#{event_id}"))
    }

    /// Rebuilds a key read back from storage or a queue message.
    pub fn from_stored(raw: &str) -> Option<Self> {
        let mut parts = raw.splitn(4, '#');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("evt"), Some(p), Some(e), Some(id)) if !p.is_empty() && !e.is_empty() && !id.is_empty() => {
                Some(Self(raw.to_owned()))
            }
            _ => None,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The provider's identity inside the key (it may hold `#` itself).
    pub fn event_id(&self) -> &str {
        self.0.splitn(4, '#').nth(3).unwrap_or_default()
    }

    /// Which index shard this key belongs to (stable, spreads hot endpoints).
    pub fn shard(&self, shards: u32) -> u32 {
        shard_of(&self.0, shards)
    }
}

impl fmt::Display for EventKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stable shard number for any identifier.
pub fn shard_of(id: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(id.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % shards.max(1)
}

/// Lowercase hex SHA-256 of the raw body.
pub fn payload_hash(body: &[u8]) -> String {
    hex_digest("", &Sha256::digest(body))
}

/// `(payload hash, content hash)` of `body`: the SHA-256 of its bytes, and
/// `prefix` + the SHA-256 of its bytes with each of `masked` (ordered,
/// disjoint ranges) replaced by `0`, hashing the bytes before the first
/// range once.
pub fn masked_hashes(body: &[u8], masked: &[std::ops::Range<usize>], prefix: &str) -> (String, String) {
    let Some(first) = masked.first() else {
        let digest = Sha256::digest(body);
        return (hex_digest("", &digest), hex_digest(prefix, &digest));
    };
    let mut payload = Sha256::new();
    payload.update(&body[..first.start]);
    let mut content = payload.clone();
    payload.update(&body[first.start..]);
    let mut at = first.start;
    for r in masked {
        content.update(&body[at..r.start]);
        content.update(b"0");
        at = r.end;
    }
    content.update(&body[at..]);
    (hex_digest("", &payload.finalize()), hex_digest(prefix, &content.finalize()))
}

/// `prefix` followed by the lowercase hex of `digest`, in one allocation.
pub(crate) fn hex_digest(prefix: &str, digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(prefix.len() + 2 * digest.len());
    out.push_str(prefix);
    for &b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_scoped_by_provider_and_endpoint() {
        let a = EventKey::new("stripe", "tenant-a", "evt_1");
        let b = EventKey::new("stripe", "tenant-b", "evt_1");
        let c = EventKey::new("github", "tenant-a", "evt_1");
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.as_str(), "evt#stripe#tenant-a#evt_1");
    }

    #[test]
    fn stored_keys_round_trip_and_ids_may_contain_separators() {
        let k = EventKey::new("hmac", "quiltt", "a#b");
        assert_eq!(EventKey::from_stored(k.as_str()), Some(k.clone()));
        assert_eq!(k.event_id(), "a#b");
        assert_eq!(EventKey::from_stored("evt#stripe#x"), None);
        assert_eq!(EventKey::from_stored("foo#a#b#c"), None);
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        let k = EventKey::new("stripe", "e", "evt_1");
        assert_eq!(k.shard(16), k.shard(16));
        let spread: std::collections::HashSet<u32> =
            (0..200).map(|i| EventKey::new("stripe", "e", &format!("evt_{i}")).shard(16)).collect();
        assert!(spread.len() > 12 && spread.iter().all(|s| *s < 16));
    }

    #[test]
    fn payload_hash_is_sha256_hex() {
        assert_eq!(payload_hash(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
