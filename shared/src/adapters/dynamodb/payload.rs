//! How a payload is stored: compressed (deflate) when that makes it smaller,
//! in the record itself when the record stays within one write unit
//! ([`inline`]), else beside it in its own item (`sk = payload#<hash>`),
//! written before the record. DynamoDB bills a write by the started KB of
//! the whole item, so a small record carrying a small compressed payload
//! costs one unit; a payload that took the record past 1 KB would make every
//! later write of it (lease, completion, each refused duplicate) pay for it.

use std::collections::HashMap;
use std::io::{Read, Write};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::attr;

/// Attribute naming the payload's encoding (`deflate`; absent: raw bytes).
pub const ENCODING: &str = "enc";
const DEFLATE: &str = "deflate";

/// A record carries its payload when record and payload fit in this many
/// bytes (one write unit) with room for what its life adds to it.
pub const INLINE_ITEM_BYTES: usize = 1024;

/// What a record gains over its life (its lease, then its completion:
/// owner token, times, outcome, subject), so that carrying its payload never
/// makes a later write of it cost a second unit.
pub const LIFE_BYTES: usize = 200;

/// Whether a record of `record` bytes carries a stored payload of `stored`
/// bytes (its attribute names included), or the payload goes beside it.
pub fn inline(record: usize, stored: usize) -> bool {
    record + stored + 16 + LIFE_BYTES <= INLINE_ITEM_BYTES
}

/// The largest stored payload a payload item holds (DynamoDB items stop at
/// 400 KB; room for the key and attributes). Larger ones go to S3 when a
/// payload bucket is configured, and are refused (413) otherwise.
pub const ITEM_PAYLOAD_BYTES: usize = 380 * 1024;

/// The stored form of a body: its bytes and encoding.
pub struct Stored {
    pub bytes: Vec<u8>,
    pub encoding: Option<&'static str>,
}

/// Compresses `body` when that saves space.
pub fn encode(body: &[u8]) -> Stored {
    let mut z = flate2::write::DeflateEncoder::new(Vec::with_capacity(body.len() / 2), flate2::Compression::new(6));
    let compressed = z.write_all(body).and_then(|()| z.finish()).ok();
    match compressed {
        Some(c) if c.len() < body.len() => Stored { bytes: c, encoding: Some(DEFLATE) },
        _ => Stored { bytes: body.to_vec(), encoding: None },
    }
}

/// Puts the stored body (and its encoding) on an item.
pub fn put(item: &mut HashMap<String, AttributeValue>, stored: Stored) {
    item.insert(attr::BODY.into(), AttributeValue::B(Blob::new(stored.bytes)));
    if let Some(enc) = stored.encoding {
        item.insert(ENCODING.into(), AttributeValue::S(enc.into()));
    }
}

/// The body an item carries, decoded (`None`: no body, or an encoding this
/// release does not know, or corrupt data).
pub fn body(item: &HashMap<String, AttributeValue>) -> Option<Vec<u8>> {
    let bytes = item.get(attr::BODY)?.as_b().ok()?.as_ref();
    decode(bytes, item.get(ENCODING).and_then(|v| v.as_s().ok()).map(String::as_str))
}

/// Stored bytes in `encoding`, decoded (`None`: an encoding this release
/// does not know, or corrupt data).
pub fn decode(bytes: &[u8], encoding: Option<&str>) -> Option<Vec<u8>> {
    match encoding {
        None => Some(bytes.to_vec()),
        Some(DEFLATE) => {
            let mut out = Vec::with_capacity(bytes.len() * 3);
            flate2::read::DeflateDecoder::new(bytes).read_to_end(&mut out).ok()?;
            Some(out)
        }
        Some(_) => None,
    }
}

/// An item's size by DynamoDB's rules (names and values; numbers about 1
/// byte per 2 digits plus 1).
pub fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) => s.len(),
            AttributeValue::N(n) => n.len().div_ceil(2) + 1,
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
            AttributeValue::L(l) => 3 + l.iter().map(|e| 1 + value(e)).sum::<usize>(),
            AttributeValue::M(m) => 3 + m.iter().map(|(k, e)| 1 + k.len() + value(e)).sum::<usize>(),
            _ => 0,
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_round_trip_compressed_or_raw() {
        let json = br#"{"type":"seats.snapshot","data":{"assignments":[{"role":"member"},{"role":"member"},{"role":"member"}]}}"#;
        for raw in [&json[..], b"", &[0xff, 0x00, 0x80][..]] {
            let mut item = HashMap::new();
            put(&mut item, encode(raw));
            assert_eq!(body(&item).as_deref(), Some(raw), "{raw:?}");
        }
        assert_eq!(encode(json).encoding, Some("deflate"), "repetitive JSON compresses");
        assert_eq!(encode(&[1, 2, 3]).encoding, None, "kept raw when compression does not help");
    }

    #[test]
    fn unknown_encodings_and_corrupt_data_are_not_a_body() {
        let mut item = HashMap::from([(attr::BODY.to_owned(), AttributeValue::B(Blob::new(vec![1, 2, 3])))]);
        item.insert(ENCODING.into(), AttributeValue::S("zstd".into()));
        assert_eq!(body(&item), None);
        item.insert(ENCODING.into(), AttributeValue::S(DEFLATE.into()));
        assert_eq!(body(&item), None);
    }

    mod proptests {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn stored_bodies_round_trip(
                raw in prop_oneof![
                    prop::collection::vec(any::<u8>(), 0..2048),
                    "(\\{\"a\":[0-9]{1,3}\\},?){0,60}".prop_map(String::into_bytes),
                ],
            ) {
                let stored = encode(&raw);
                let decoded = decode(&stored.bytes, stored.encoding);
                prop_assert_eq!(decoded.as_deref(), Some(&raw[..]));
                let mut item = HashMap::new();
                put(&mut item, encode(&raw));
                prop_assert_eq!(body(&item), Some(raw));
            }

            /// Corrupt stored bytes, under any encoding name, never panic.
            #[test]
            fn corrupt_stored_bytes_never_panic(
                bytes in prop::collection::vec(any::<u8>(), 0..512),
                encoding in prop_oneof![Just(None), Just(Some("deflate".to_owned())), any::<String>().prop_map(Some)],
                truncate in any::<prop::sample::Index>(),
            ) {
                let _ = decode(&bytes, encoding.as_deref());
                // A real compressed body, cut short.
                let long = [b'a'; 600];
                let stored = encode(&long);
                let _ = decode(&stored.bytes[..truncate.index(stored.bytes.len())], stored.encoding);
                let mut item = HashMap::from([(attr::BODY.to_owned(), AttributeValue::B(Blob::new(bytes)))]);
                if let Some(e) = encoding {
                    item.insert(ENCODING.into(), AttributeValue::S(e));
                }
                let _ = body(&item);
            }
        }
    }
}
