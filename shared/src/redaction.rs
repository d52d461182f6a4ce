//! What an endpoint keeps of a verified payload: its payload policy
//! (`payload` in an endpoint's configuration).
//!
//! ```json
//! {"payload": {"policy": "keep"}}
//! {"payload": {"policy": "redact", "remove": ["/data/object/customer_email"],
//!              "mask": ["/data/object/billing_details/*/phone"]}}
//! {"payload": {"policy": "drop_after"}}
//! ```
//!
//! - `keep` (the default): the payload as the provider sent it, until the
//!   record's time to live.
//! - `redact`: after the signature is verified on the raw bytes and the
//!   identity read from them, and before anything is stored or queued, each
//!   value a `remove` pointer names is removed (an object's member with its
//!   key, an array's element) and each a `mask` pointer names is replaced by
//!   the string [`MASK`]. Pointers are JSON pointers (RFC 6901; `~0` is `~`,
//!   `~1` is `/`) whose segment `*` matches every member or element. Every
//!   other byte is kept as sent (whitespace, key order, numbers). A pointer
//!   that names nothing in a payload changes nothing. A payload that is not
//!   JSON cannot be redacted and is refused (422), never stored whole.
//! - `drop_after`: the payload kept until the event is processed and its
//!   deliveries are sent, then removed by the reconciler
//!   ([`crate::ledger::DROP_AFTER_GRACE_MS`] after the completion); the record
//!   and its evidence (hashes, status, history) kept until their time to live.
//!
//! What each gives up is in docs/privacy.md.

use std::ops::Range;

use serde::Deserialize;

/// What a masked value becomes.
pub const MASK: &str = "[redacted]";

/// The most pointers one endpoint's policy may list.
pub const MAX_POINTERS: usize = 64;

/// An endpoint's payload policy as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Configured")]
pub enum PayloadPolicy {
    #[default]
    Keep,
    Redact {
        remove: Vec<String>,
        mask: Vec<String>,
    },
    DropAfter,
}

/// The `payload` section as written: `remove` and `mask` only with `redact`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Configured {
    policy: String,
    remove: Option<Vec<String>>,
    mask: Option<Vec<String>>,
}

impl TryFrom<Configured> for PayloadPolicy {
    type Error = String;

    fn try_from(c: Configured) -> Result<Self, String> {
        let lists = c.remove.is_some() || c.mask.is_some();
        match c.policy.as_str() {
            "redact" => Ok(Self::Redact { remove: c.remove.unwrap_or_default(), mask: c.mask.unwrap_or_default() }),
            "keep" | "drop_after" if lists => {
                Err(format!("remove and mask apply to the redact policy only, not {}", c.policy))
            }
            "keep" => Ok(Self::Keep),
            "drop_after" => Ok(Self::DropAfter),
            other => Err(format!("unknown payload policy {other:?} (known: keep, redact, drop_after)")),
        }
    }
}

impl PayloadPolicy {
    /// Its name, as records and envelopes say it.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Keep => "keep",
            Self::Redact { .. } => "redact",
            Self::DropAfter => "drop_after",
        }
    }

    /// Whether the payload is removed once the event is done.
    pub fn drops_after(&self) -> bool {
        matches!(self, Self::DropAfter)
    }

    /// Checks the policy as configured: a `redact` policy lists at least one
    /// pointer and at most [`MAX_POINTERS`], each a valid JSON pointer to
    /// something below the document (not the document itself).
    pub fn validate(&self) -> Result<(), String> {
        let Self::Redact { remove, mask } = self else { return Ok(()) };
        let n = remove.len() + mask.len();
        if n == 0 {
            return Err("payload policy redact needs at least one pointer in remove or mask".into());
        }
        if n > MAX_POINTERS {
            return Err(format!("payload policy redact lists {n} pointers; at most {MAX_POINTERS}"));
        }
        for p in remove.iter().chain(mask) {
            parse_pointer(p).map_err(|e| format!("payload policy pointer {p:?}: {e}"))?;
        }
        Ok(())
    }

    /// What is stored and queued of `body` (already verified): `None` when
    /// the policy keeps it as it is.
    pub fn apply(&self, body: &[u8]) -> Result<Option<Vec<u8>>, Unredactable> {
        let Self::Redact { remove, mask } = self else { return Ok(None) };
        let remove: Vec<Vec<String>> = remove.iter().filter_map(|p| parse_pointer(p).ok()).collect();
        let mask: Vec<Vec<String>> = mask.iter().filter_map(|p| parse_pointer(p).ok()).collect();
        redact(body, &remove, &mask).map(Some)
    }
}

/// A payload a `redact` policy cannot read (not JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unredactable;

impl std::fmt::Display for Unredactable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the payload is not JSON and its endpoint's policy redacts it")
    }
}

/// A JSON pointer's segments, unescaped (`*` stays the wildcard).
pub fn parse_pointer(p: &str) -> Result<Vec<String>, String> {
    let Some(rest) = p.strip_prefix('/') else {
        return Err("must start with '/' (the whole document cannot be redacted)".into());
    };
    rest.split('/')
        .map(|s| {
            let mut out = String::with_capacity(s.len());
            let mut chars = s.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err("'~' must be followed by 0 or 1".to_string()),
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}

/// `body` with every value a `remove` pointer names removed and every value
/// a `mask` pointer names masked (a value both remove and mask name is
/// removed); every other byte as it was.
pub fn redact(body: &[u8], remove: &[Vec<String>], mask: &[Vec<String>]) -> Result<Vec<u8>, Unredactable> {
    // Validate first: the span walk below trusts the document's shape.
    serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(|_| Unredactable)?;
    let mut edits: Vec<(Range<usize>, &'static [u8])> = Vec::new();
    let mut p = Parser { b: body, i: 0 };
    p.ws();
    let root_paths: Vec<(&[String], bool)> =
        remove.iter().map(|s| (s.as_slice(), true)).chain(mask.iter().map(|s| (s.as_slice(), false))).collect();
    p.value(&root_paths, &mut edits).map_err(|_| Unredactable)?;
    // Edits never overlap: a removed or masked value's inside is not walked.
    edits.sort_by_key(|(r, _)| r.start);
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0;
    for (r, with) in edits {
        if r.start < at {
            continue;
        }
        out.extend_from_slice(&body[at..r.start]);
        out.extend_from_slice(with);
        at = r.end;
    }
    out.extend_from_slice(&body[at..]);
    Ok(out)
}

const MASKED: &[u8] = b"\"[redacted]\"";

/// A span walker over valid JSON: records the byte ranges to cut or mask.
struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

/// Pointers still to match below the current value: the remaining
/// segments, and whether a full match removes (else masks).
type Paths<'p> = [(&'p [String], bool)];

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), ()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(())
        }
    }

    /// Walks one value at `self.i`, recording edits for the pointers that
    /// end below it.
    fn value(&mut self, paths: &Paths<'_>, edits: &mut Vec<(Range<usize>, &'static [u8])>) -> Result<(), ()> {
        if paths.is_empty() {
            return self.skip();
        }
        match self.peek().ok_or(())? {
            b'{' => self.object(paths, edits),
            b'[' => self.array(paths, edits),
            b'"' => self.string().map(|_| ()),
            _ => {
                while self.i < self.b.len()
                    && !matches!(self.b[self.i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                {
                    self.i += 1;
                }
                Ok(())
            }
        }
    }

    /// Passes over one value no pointer reaches below: brackets counted,
    /// strings passed whole, nothing decoded.
    fn skip(&mut self) -> Result<(), ()> {
        let mut depth = 0usize;
        loop {
            match self.peek().ok_or(())? {
                b'"' => {
                    self.i += 1;
                    while let Some(c) = self.peek() {
                        match c {
                            b'\\' => self.i += 2,
                            b'"' => break,
                            _ => self.i += 1,
                        }
                    }
                    self.expect(b'"')?;
                }
                b'{' | b'[' => {
                    depth += 1;
                    self.i += 1;
                }
                b'}' | b']' if depth > 0 => {
                    depth -= 1;
                    self.i += 1;
                }
                // The end of the enclosing container, or a separator: this value ended.
                b'}' | b']' | b',' if depth == 0 => return Ok(()),
                b' ' | b'\t' | b'\n' | b'\r' if depth == 0 => return Ok(()),
                _ => self.i += 1,
            }
            if depth == 0 && matches!(self.b.get(self.i.wrapping_sub(1)), Some(b'"' | b'}' | b']')) {
                return Ok(());
            }
            if self.i >= self.b.len() {
                return if depth == 0 { Ok(()) } else { Err(()) };
            }
        }
    }

    /// A string's raw contents (escapes decoded for member names).
    fn string(&mut self) -> Result<String, ()> {
        self.expect(b'"')?;
        let start = self.i;
        while let Some(c) = self.peek() {
            match c {
                b'\\' => self.i += 2,
                b'"' => break,
                _ => self.i += 1,
            }
        }
        let raw = &self.b[start..self.i];
        self.expect(b'"')?;
        if !raw.contains(&b'\\') {
            return Ok(String::from_utf8_lossy(raw).into_owned());
        }
        // Decode through serde_json (escapes, surrogates); the document is valid.
        let quoted = &self.b[start - 1..self.i];
        serde_json::from_slice::<String>(quoted).or_else(|_| Ok(String::from_utf8_lossy(raw).into_owned()))
    }

    /// The pointers continuing below a member or element named `name`:
    /// those ending here (matched) and those going on.
    fn below<'p>(paths: &Paths<'p>, name: &str) -> (Option<bool>, Vec<(&'p [String], bool)>) {
        let mut ends: Option<bool> = None;
        let mut on = Vec::new();
        for (segs, remove) in paths {
            let Some((first, rest)) = segs.split_first() else { continue };
            if first != "*" && first != name {
                continue;
            }
            if rest.is_empty() {
                // Remove wins over mask.
                ends = Some(ends.unwrap_or(false) || *remove);
            } else {
                on.push((rest, *remove));
            }
        }
        (ends, on)
    }

    fn object(&mut self, paths: &Paths<'_>, edits: &mut Vec<(Range<usize>, &'static [u8])>) -> Result<(), ()> {
        self.expect(b'{')?;
        // Members as (start of key, end of value, end of the comma after it if any).
        let mut members: Vec<(usize, usize, Option<bool>)> = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            let key_start = self.i;
            let name = self.string()?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            let value_start = self.i;
            let (ends, on) = Self::below(paths, &name);
            if ends.is_some() {
                self.value(&[], edits)?;
            } else {
                self.value(&on, edits)?;
            }
            let value_end = self.i;
            if ends == Some(false) {
                edits.push((value_start..value_end, MASKED));
            }
            members.push((key_start, value_end, ends));
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    break;
                }
                _ => return Err(()),
            }
        }
        Self::cut(&members, edits);
        Ok(())
    }

    fn array(&mut self, paths: &Paths<'_>, edits: &mut Vec<(Range<usize>, &'static [u8])>) -> Result<(), ()> {
        self.expect(b'[')?;
        let mut elements: Vec<(usize, usize, Option<bool>)> = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        let mut n = 0usize;
        loop {
            self.ws();
            let start = self.i;
            let (ends, on) = Self::below(paths, &n.to_string());
            if ends.is_some() {
                self.value(&[], edits)?;
            } else {
                self.value(&on, edits)?;
            }
            let end = self.i;
            if ends == Some(false) {
                edits.push((start..end, MASKED));
            }
            elements.push((start, end, ends));
            n += 1;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    break;
                }
                _ => return Err(()),
            }
        }
        Self::cut(&elements, edits);
        Ok(())
    }

    /// The removals among a container's entries (`(start, end, ends)`, in
    /// order): each removed entry goes with the comma before it, or, for the
    /// first kept-less run at the start, with the comma after it, so what
    /// remains is valid JSON.
    fn cut(entries: &[(usize, usize, Option<bool>)], edits: &mut Vec<(Range<usize>, &'static [u8])>) {
        let kept: Vec<bool> = entries.iter().map(|e| e.2 != Some(true)).collect();
        if kept.iter().all(|k| *k) {
            return;
        }
        if kept.iter().all(|k| !*k) {
            // Everything removed: the container becomes empty.
            edits.push((entries[0].0..entries[entries.len() - 1].1, b""));
            return;
        }
        let first_kept = kept.iter().position(|k| *k).unwrap_or(0);
        // Removed entries before the first kept one: cut from the first
        // entry's start to the first kept entry's start (their commas with them).
        if first_kept > 0 {
            edits.push((entries[0].0..entries[first_kept].0, b""));
        }
        // Removed entries after it: each from the end of the entry before it.
        for j in first_kept + 1..entries.len() {
            if !kept[j] {
                edits.push((entries[j - 1].1..entries[j].1, b""));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptrs(ps: &[&str]) -> Vec<Vec<String>> {
        ps.iter().map(|p| parse_pointer(p).unwrap()).collect()
    }

    fn run(body: &str, remove: &[&str], mask: &[&str]) -> String {
        let out = redact(body.as_bytes(), &ptrs(remove), &ptrs(mask)).unwrap();
        let s = String::from_utf8(out).unwrap();
        serde_json::from_str::<serde_json::Value>(&s).unwrap_or_else(|e| panic!("not JSON: {s}: {e}"));
        s
    }

    #[test]
    fn a_removed_member_goes_with_its_key_and_comma_and_every_other_byte_stays() {
        let body = r#"{"id": "evt_1",  "email":"a@x.io" , "n": 1.10}"#;
        assert_eq!(run(body, &["/email"], &[]), r#"{"id": "evt_1" , "n": 1.10}"#);
        assert_eq!(run(body, &["/id"], &[]), r#"{"email":"a@x.io" , "n": 1.10}"#);
        assert_eq!(run(body, &["/n"], &[]), r#"{"id": "evt_1",  "email":"a@x.io"}"#);
        assert_eq!(run(body, &["/id", "/email", "/n"], &[]), r#"{}"#);
        assert_eq!(run(body, &["/id", "/n"], &[]), r#"{"email":"a@x.io"}"#);
    }

    #[test]
    fn a_masked_value_becomes_the_mask_string_whatever_its_type() {
        let body = r#"{"a":{"card":{"last4":"4242","exp":[1,2]}},"b":2}"#;
        assert_eq!(run(body, &[], &["/a/card"]), r#"{"a":{"card":"[redacted]"},"b":2}"#);
        assert_eq!(
            run(body, &[], &["/a/card/exp/1", "/b"]),
            r#"{"a":{"card":{"last4":"4242","exp":[1,"[redacted]"]}},"b":"[redacted]"}"#
        );
    }

    #[test]
    fn a_wildcard_matches_every_member_and_element() {
        let body = r#"{"items":[{"email":"a@x","q":1},{"email":"b@x","q":2},{"q":3}]}"#;
        assert_eq!(run(body, &["/items/*/email"], &[]), r#"{"items":[{"q":1},{"q":2},{"q":3}]}"#);
        assert_eq!(
            run(body, &[], &["/*/*/q"]),
            r#"{"items":[{"email":"a@x","q":"[redacted]"},{"email":"b@x","q":"[redacted]"},{"q":"[redacted]"}]}"#
        );
        assert_eq!(run(body, &["/items/0", "/items/2"], &[]), r#"{"items":[{"email":"b@x","q":2}]}"#);
        assert_eq!(run(body, &["/items/*"], &[]), r#"{"items":[]}"#);
    }

    #[test]
    fn escaped_names_match_and_remove_wins_over_mask() {
        let body = "{\"a/b\":1,\"t~x\":2,\"\\u0065mail\":\"e\"}";
        assert_eq!(run(body, &["/a~1b"], &["/t~0x"]), "{\"t~x\":\"[redacted]\",\"\\u0065mail\":\"e\"}");
        assert_eq!(run(body, &["/email"], &["/email"]), "{\"a/b\":1,\"t~x\":2}");
    }

    #[test]
    fn a_pointer_that_names_nothing_changes_nothing() {
        let body = "{\n  \"id\": \"evt\",\n  \"data\": {\"object\": {}}\n}";
        assert_eq!(run(body, &["/data/object/email", "/nope/deeper", "/id/0"], &["/data/list/3"]), body);
    }

    #[test]
    fn strings_with_quotes_brackets_and_escapes_are_walked_whole() {
        let body = r#"{"note":"a \"quoted\" } ] , value","secret":"s","tail":[true,null,-1e5]}"#;
        assert_eq!(run(body, &["/secret"], &[]), r#"{"note":"a \"quoted\" } ] , value","tail":[true,null,-1e5]}"#);
    }

    #[test]
    fn a_body_that_is_not_json_is_unredactable() {
        for body in ["not json", "{\"a\":", "", "a=1&b=2"] {
            assert_eq!(redact(body.as_bytes(), &ptrs(&["/a"]), &[]), Err(Unredactable), "{body}");
        }
    }

    #[test]
    fn a_policy_is_checked_as_configured() {
        let p: PayloadPolicy = serde_json::from_str(r#"{"policy":"redact","remove":["/a"]}"#).unwrap();
        assert!(p.validate().is_ok());
        let none: PayloadPolicy = serde_json::from_str(r#"{"policy":"redact"}"#).unwrap();
        assert!(none.validate().unwrap_err().contains("at least one pointer"));
        let root: PayloadPolicy = serde_json::from_str(r#"{"policy":"redact","mask":[""]}"#).unwrap();
        assert!(root.validate().unwrap_err().contains("must start with '/'"));
        let tilde: PayloadPolicy = serde_json::from_str(r#"{"policy":"redact","mask":["/a~2"]}"#).unwrap();
        assert!(tilde.validate().unwrap_err().contains("'~'"));
        let err = |json: &str| serde_json::from_str::<PayloadPolicy>(json).unwrap_err().to_string();
        assert!(err(r#"{"policy":"keep","remove":["/a"]}"#).contains("redact policy only"));
        assert!(err(r#"{"policy":"shred"}"#).contains("unknown payload policy \"shred\""));
        assert!(err(r#"{"policy":"redact","mask":["/a"],"extra":1}"#).contains("unknown field"));
        assert!(err(r#"{"remove":["/a"]}"#).contains("missing field `policy`"));
        let drop: PayloadPolicy = serde_json::from_str(r#"{"policy":"drop_after"}"#).unwrap();
        assert!(drop.drops_after());
        assert_eq!(drop.validate(), Ok(()));
        assert_eq!(PayloadPolicy::default().apply(b"x"), Ok(None));
    }

    /// The same redaction on a parsed document, every pointer read against
    /// the document as given: the reference the byte walker must agree with.
    fn reference(v: &mut serde_json::Value, paths: &[(&[String], bool)]) {
        use serde_json::Value;
        // For a member or element named `name`: removed, masked, or walked on with what continues.
        let fate = |name: &str| {
            let mut ends: Option<bool> = None;
            let mut on: Vec<(&[String], bool)> = Vec::new();
            for (segs, remove) in paths {
                let Some((first, rest)) = segs.split_first() else { continue };
                if first == "*" || first == name {
                    if rest.is_empty() {
                        ends = Some(ends.unwrap_or(false) || *remove);
                    } else {
                        on.push((rest, *remove));
                    }
                }
            }
            (ends, on)
        };
        match v {
            Value::Object(map) => {
                let names: Vec<String> = map.keys().cloned().collect();
                for name in names {
                    match fate(&name) {
                        (Some(true), _) => {
                            map.remove(&name);
                        }
                        (Some(false), _) => {
                            map.insert(name, Value::from(MASK));
                        }
                        (None, on) => reference(map.get_mut(&name).unwrap(), &on),
                    }
                }
            }
            Value::Array(items) => {
                let old = std::mem::take(items);
                for (i, mut item) in old.into_iter().enumerate() {
                    match fate(&i.to_string()) {
                        (Some(true), _) => {}
                        (Some(false), _) => items.push(Value::from(MASK)),
                        (None, on) => {
                            reference(&mut item, &on);
                            items.push(item);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn doc() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            (-1000i64..1000).prop_map(serde_json::Value::from),
            "[a-c\\\\\"{}\\[\\], ]{0,6}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 40, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[abc]", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Whatever the document, its spacing and the pointers, the bytes
        /// the walker leaves are JSON equal to the reference's result.
        #[test]
        fn the_walker_agrees_with_a_redaction_of_the_parsed_document(
            v in doc(),
            pretty in proptest::prelude::any::<bool>(),
            remove in proptest::collection::vec(proptest::collection::vec("[abc01*]", 1..4), 0..3),
            mask in proptest::collection::vec(proptest::collection::vec("[abc01*]", 1..4), 0..3),
        ) {
            let body = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap();
            let out = redact(&body, &remove, &mask).unwrap();
            let got: serde_json::Value = serde_json::from_slice(&out)
                .unwrap_or_else(|e| panic!("not JSON: {}: {e}", String::from_utf8_lossy(&out)));
            let mut want = v.clone();
            let paths: Vec<(&[String], bool)> =
                remove.iter().map(|p| (p.as_slice(), true)).chain(mask.iter().map(|p| (p.as_slice(), false))).collect();
            reference(&mut want, &paths);
            proptest::prop_assert_eq!(got, want, "{} -> {}", String::from_utf8_lossy(&body), String::from_utf8_lossy(&out));
        }
    }
}
