//! Sealed payloads: erasure by destroying a key.
//!
//! An endpoint configured `"erasable": true` has each event's payload
//! sealed under a data key of its own (256 bits, drawn by the intake) before
//! anything stores or queues it: the record's copy, the payload item, the
//! bucket's object, the work queue's message and its dead-letter copy are
//! all the same sealed bytes. The data keys live in their own table, which
//! has no point-in-time recovery: `hookledger erase` overwrites an event's
//! key with a tombstone, and from then on every copy anywhere (a queue's, a
//! backup's) is ciphertext no one can read.
//!
//! The seal is AES-256-GCM over the payload (deflated first when that makes
//! it smaller), with the event's key as associated data, so a sealed payload
//! moved under another event's identity does not open. Its nonce is derived
//! from the key and the plaintext (HMAC-SHA256, the synthetic-IV pattern):
//! the same payload sealed twice under one key gives the same bytes, so a
//! retried claim stores and compares what the first one did, and two
//! different payloads under one key never share a nonce.

use std::io::{Read, Write};

use hmac::{Hmac, KeyInit, Mac};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use sha2::Sha256;

use crate::identity::EventKey;

/// What every sealed payload starts with: no JSON, XML or form body does
/// (a NUL byte first), and the version of the layout after it.
pub const MAGIC: &[u8; 8] = b"\0hlseal1";

const NONCE_BYTES: usize = 12;
const TAG_BYTES: usize = 16;
const RAW: u8 = 0;
const DEFLATED: u8 = 1;

/// The bytes a seal adds to a payload it cannot compress.
pub const OVERHEAD: usize = MAGIC.len() + 1 + NONCE_BYTES + TAG_BYTES;

/// One event's data key. Its bytes never leave this module but to the key
/// store, and are zeroed when it is dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct DataKey([u8; 32]);

impl DataKey {
    /// A fresh key from the operating system's generator.
    pub fn generate() -> Result<Self, Unsealable> {
        let mut bytes = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(|_| Unsealable)?;
        Ok(Self(bytes))
    }

    /// A key as the store keeps it (32 bytes).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(Self(bytes.try_into().ok()?))
    }

    /// Its bytes, for the key store only.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn aead(&self) -> LessSafeKey {
        #[allow(clippy::expect_used)] // 32 bytes is AES-256's key length.
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte key"))
    }
}

impl Drop for DataKey {
    fn drop(&mut self) {
        self.0 = [0; 32];
        // Kept: the zeroed bytes are observed, so the write is not elided.
        std::hint::black_box(&self.0);
    }
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

/// An event's data key as the key store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    Live(DataKey),
    /// Destroyed by an erasure: `at_ms`, by whom.
    Erased {
        at_ms: i64,
        by: String,
    },
    /// Never made (the event was not sealed), or expired with its record.
    Missing,
}

/// A seal could not be made (the generator failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsealable;

/// Why sealed bytes did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// The event's key was destroyed: it was erased.
    Erased,
    /// No key for the event (expired, or never made).
    NoKey,
    /// Not the bytes sealed for this event under this key.
    Corrupt,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Erased => "the event was erased (its data key is destroyed)",
            Self::NoKey => "the event's data key is gone",
            Self::Corrupt => "the sealed payload does not open under the event's key",
        })
    }
}

/// Whether `bytes` are a sealed payload.
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.len() >= OVERHEAD && bytes.starts_with(MAGIC)
}

fn nonce(key: &DataKey, event: &EventKey, plain: &[u8]) -> [u8; NONCE_BYTES] {
    #[allow(clippy::expect_used)] // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0).expect("any key length");
    mac.update(b"hookledger seal nonce\0");
    mac.update(event.as_str().as_bytes());
    mac.update(&[0]);
    mac.update(plain);
    let tag = mac.finalize().into_bytes();
    let mut out = [0u8; NONCE_BYTES];
    out.copy_from_slice(&tag[..NONCE_BYTES]);
    out
}

/// `payload` sealed under `key` for `event` (deterministic: the same
/// inputs give the same bytes).
pub fn seal(key: &DataKey, event: &EventKey, payload: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::DeflateEncoder::new(Vec::with_capacity(payload.len() / 2), flate2::Compression::new(6));
    let deflated = z.write_all(payload).and_then(|()| z.finish()).ok().filter(|c| c.len() < payload.len());
    let (flag, mut body) = match deflated {
        Some(c) => (DEFLATED, c),
        None => (RAW, payload.to_vec()),
    };
    let n = nonce(key, event, payload);
    let aad = aad(event, flag);
    #[allow(clippy::expect_used)] // Fails only past GCM's 64 GiB limit.
    key.aead()
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(n), Aad::from(&aad), &mut body)
        .expect("a payload under GCM's limit");
    let mut out = Vec::with_capacity(OVERHEAD + body.len());
    out.extend_from_slice(MAGIC);
    out.push(flag);
    out.extend_from_slice(&n);
    out.extend_from_slice(&body);
    out
}

fn aad(event: &EventKey, flag: u8) -> Vec<u8> {
    let mut aad = Vec::with_capacity(event.as_str().len() + 2);
    aad.extend_from_slice(event.as_str().as_bytes());
    aad.push(0);
    aad.push(flag);
    aad
}

/// The payload `sealed` holds, opened under `key` for `event`.
pub fn open(key: &DataKey, event: &EventKey, sealed: &[u8]) -> Result<Vec<u8>, Unreadable> {
    if !is_sealed(sealed) {
        return Err(Unreadable::Corrupt);
    }
    let flag = sealed[MAGIC.len()];
    let start = MAGIC.len() + 1;
    let n: [u8; NONCE_BYTES] = sealed[start..start + NONCE_BYTES].try_into().map_err(|_| Unreadable::Corrupt)?;
    let mut body = sealed[start + NONCE_BYTES..].to_vec();
    let plain = key
        .aead()
        .open_in_place(Nonce::assume_unique_for_key(n), Aad::from(&aad(event, flag)), &mut body)
        .map_err(|_| Unreadable::Corrupt)?;
    match flag {
        RAW => Ok(plain.to_vec()),
        DEFLATED => {
            let mut out = Vec::with_capacity(plain.len() * 3);
            flate2::read::DeflateDecoder::new(&plain[..]).read_to_end(&mut out).map_err(|_| Unreadable::Corrupt)?;
            Ok(out)
        }
        _ => Err(Unreadable::Corrupt),
    }
}

/// Opens `bytes` with the event's key as the store holds it; bytes that are
/// not sealed are returned as they are.
pub fn open_with(state: &KeyState, event: &EventKey, bytes: Vec<u8>) -> Result<Vec<u8>, Unreadable> {
    if !is_sealed(&bytes) {
        return Ok(bytes);
    }
    match state {
        KeyState::Live(key) => open(key, event, &bytes),
        KeyState::Erased { .. } => Err(Unreadable::Erased),
        KeyState::Missing => Err(Unreadable::NoKey),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str) -> EventKey {
        EventKey::new("stripe", "billing", id)
    }

    #[test]
    fn a_sealed_payload_opens_under_its_key_and_event_only() {
        let key = DataKey::generate().unwrap();
        let other = DataKey::generate().unwrap();
        assert_ne!(key, other, "each key is drawn anew");
        let body = br#"{"id":"evt_1","data":{"object":{"email":"marker@example.com","items":[1,1,1,1,1,1,1,1]}}}"#;
        let sealed = seal(&key, &event("evt_1"), body);
        assert!(is_sealed(&sealed));
        assert!(!sealed.windows(6).any(|w| w == b"marker"), "no plaintext in the seal");
        assert_eq!(open(&key, &event("evt_1"), &sealed).unwrap(), body.to_vec());
        assert_eq!(open(&other, &event("evt_1"), &sealed), Err(Unreadable::Corrupt), "another key");
        assert_eq!(open(&key, &event("evt_2"), &sealed), Err(Unreadable::Corrupt), "another event's identity");
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(open(&key, &event("evt_1"), &flipped), Err(Unreadable::Corrupt), "tampered");
    }

    #[test]
    fn sealing_is_deterministic_per_key_and_payload_and_never_reuses_a_nonce_across_payloads() {
        let key = DataKey::generate().unwrap();
        let e = event("evt_1");
        assert_eq!(seal(&key, &e, b"one"), seal(&key, &e, b"one"), "a retry stores the same bytes");
        let (a, b) = (seal(&key, &e, b"one"), seal(&key, &e, b"two"));
        let nonce = |s: &[u8]| s[MAGIC.len() + 1..MAGIC.len() + 1 + NONCE_BYTES].to_vec();
        assert_ne!(nonce(&a), nonce(&b));
    }

    #[test]
    fn raw_compressed_and_empty_payloads_round_trip() {
        let key = DataKey::generate().unwrap();
        let e = event("evt_1");
        let repetitive = vec![b'a'; 4096];
        for body in [&b""[..], &[0xff, 0x00, 0x80][..], &repetitive[..]] {
            assert_eq!(open(&key, &e, &seal(&key, &e, body)).unwrap(), body.to_vec());
        }
        assert!(seal(&key, &e, &repetitive).len() < 200, "deflated before sealing");
        assert_eq!(seal(&key, &e, b"xyz").len(), 3 + OVERHEAD);
    }

    #[test]
    fn unsealed_bytes_pass_and_a_destroyed_or_missing_key_opens_nothing() {
        let key = DataKey::generate().unwrap();
        let e = event("evt_1");
        let sealed = seal(&key, &e, b"{}");
        assert_eq!(open_with(&KeyState::Missing, &e, b"{}".to_vec()), Ok(b"{}".to_vec()), "not sealed");
        assert_eq!(open_with(&KeyState::Live(key), &e, sealed.clone()), Ok(b"{}".to_vec()));
        let erased = KeyState::Erased { at_ms: 1, by: "ops".into() };
        assert_eq!(open_with(&erased, &e, sealed.clone()), Err(Unreadable::Erased));
        assert_eq!(open_with(&KeyState::Missing, &e, sealed), Err(Unreadable::NoKey));
        assert!(!is_sealed(MAGIC), "the magic alone is no seal");
        assert_eq!(format!("{:?}", DataKey::generate().unwrap()), "DataKey(..)", "never printed");
    }
}
