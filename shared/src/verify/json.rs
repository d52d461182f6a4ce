//! A strict reader for the few fields read from a verified body (the event id
//! and type, the generic sender's JSON pointers, Stripe's `pending_webhooks`)
//! that builds no `serde_json::Value`: it skips what it does not need without
//! allocating, and only the values asked for are decoded.
//!
//! [`scan`] walks the whole document once and accepts exactly what
//! `serde_json::from_slice::<serde_json::Value>` accepts (so "malformed after
//! a valid signature" is decided as before), while reporting where the
//! entries of the top-level container are. The structure, whitespace, plain
//! strings, literals and plain integers are checked here; the rare tokens
//! whose rules are subtle (strings with escapes, numbers with a fraction or
//! an exponent, long integers) are handed to serde_json itself, so their
//! acceptance cannot drift from the parser used before. The body is checked
//! to be UTF-8 first (serde_json checks each string; outside strings only
//! ASCII is valid, so both agree).

use std::borrow::Cow;
use std::ops::Range;

/// serde_json's recursion limit: containers nested deeper than this are refused.
pub(crate) const MAX_DEPTH: usize = 127;

/// The body is not one well-formed JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotJson;

/// What the document is, at its top level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    Scalar,
}

/// Where an entry of the top-level container sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Key<'a> {
    /// An object member's name, unescaped.
    Name(Cow<'a, str>),
    /// An array element's position.
    Index(usize),
}

/// One entry of the top-level object or array, with the byte range of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    pub key: Key<'a>,
    pub value: Range<usize>,
}

/// Checks that `body` is one JSON value and calls `on_entry` for each member
/// of a top-level object (or element of a top-level array), in document
/// order; duplicate names are all reported (the last one is what a parser
/// into a map keeps).
pub(crate) fn scan<'a>(body: &'a [u8], mut on_entry: impl FnMut(Entry<'a>)) -> Result<Kind, NotJson> {
    let text = std::str::from_utf8(body).map_err(|_| NotJson)?;
    let b = body;
    let mut i = ws(b, 0);
    let kind = match at(b, i)? {
        open @ (b'{' | b'[') => {
            let object = open == b'{';
            let close = if object { b'}' } else { b']' };
            i = ws(b, i + 1);
            if at(b, i)? == close {
                i += 1;
            } else {
                let mut index = 0;
                loop {
                    let key = if object {
                        if at(b, i)? != b'"' {
                            return Err(NotJson);
                        }
                        let start = i;
                        i = string(b, i)?;
                        let raw = &text[start + 1..i - 1]; // both ends are ASCII quotes
                        let name = if raw.contains('\\') {
                            Cow::Owned(serde_json::from_slice::<String>(&b[start..i]).map_err(|_| NotJson)?)
                        } else {
                            Cow::Borrowed(raw)
                        };
                        i = ws(b, i);
                        if at(b, i)? != b':' {
                            return Err(NotJson);
                        }
                        i = ws(b, i + 1);
                        Key::Name(name)
                    } else {
                        Key::Index(index)
                    };
                    let start = i;
                    i = value(b, i, 1)?;
                    on_entry(Entry { key, value: start..i });
                    index += 1;
                    i = ws(b, i);
                    match at(b, i)? {
                        b',' => i = ws(b, i + 1),
                        c if c == close => {
                            i += 1;
                            break;
                        }
                        _ => return Err(NotJson),
                    }
                }
            }
            if object { Kind::Object } else { Kind::Array }
        }
        _ => {
            i = value(b, i, 0)?;
            Kind::Scalar
        }
    };
    if ws(b, i) == b.len() { Ok(kind) } else { Err(NotJson) }
}

/// The text of a JSON string value found by [`scan`] in `body`, unescaped;
/// `None` when the value is not a string.
pub(crate) fn string_at<'a>(body: &'a [u8], value: &Range<usize>) -> Option<Cow<'a, str>> {
    let token = body.get(value.clone())?;
    let inner = token.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.contains(&b'\\') {
        serde_json::from_slice::<String>(token).ok().map(Cow::Owned)
    } else {
        std::str::from_utf8(inner).ok().map(Cow::Borrowed)
    }
}

/// Resolves RFC 6901 pointers the way `serde_json::Value::pointer` does (the
/// last of duplicate names wins; array indexes have no sign and no leading
/// zero) and returns the byte range of the value each names: `None` for an
/// absent pointer, for nothing there, or for every pointer when the body is
/// not JSON. One pass over the body checks it and takes the first step of
/// every pointer; deeper steps look inside the value found.
pub(crate) fn pointers<const N: usize>(body: &[u8], pointers: [Option<&str>; N]) -> [Option<Range<usize>>; N] {
    let mut found: [Option<Range<usize>>; N] = std::array::from_fn(|_| None);
    if pointers.iter().all(Option::is_none) {
        return found;
    }
    let steps: [Option<Step<'_>>; N] = std::array::from_fn(|n| Step::of(pointers[n]?));
    let scanned = scan(body, |e| {
        for (n, step) in steps.iter().enumerate() {
            if let Some(Step::Path { first, .. }) = step {
                if matches_token(&e.key, first) {
                    found[n] = Some(e.value.clone());
                }
            }
        }
    });
    if scanned.is_err() {
        return std::array::from_fn(|_| None);
    }
    for (n, step) in steps.iter().enumerate() {
        found[n] = match step {
            None => None,
            Some(Step::Whole) => Some(trimmed(body, 0..body.len())),
            Some(Step::Path { rest: None, .. }) => found[n].take(),
            Some(Step::Path { rest: Some(rest), .. }) => found[n].take().and_then(|at| descend(body, at, rest)),
        };
    }
    found
}

/// [`pointers`] for a number of pointers known only at run time (an
/// endpoint's configured fields), with the same answers: one pass over the
/// body for all of them, and one pass over each nested value that several
/// share (`/event/id` and `/event/type` read the `event` object once).
pub(crate) fn pointers_many<S: AsRef<str>>(body: &[u8], pointers: &[S]) -> Vec<Option<Range<usize>>> {
    let mut found: Vec<Option<Range<usize>>> = vec![None; pointers.len()];
    // Each pointer's unescaped tokens (`None`: it names nothing).
    let tokens: Vec<Option<Vec<Cow<'_, str>>>> = pointers
        .iter()
        .map(|p| {
            let p = p.as_ref();
            if p.is_empty() {
                return Some(Vec::new());
            }
            Some(p.strip_prefix('/')?.split('/').map(unescape).collect())
        })
        .collect();
    if tokens.iter().all(Option::is_none) {
        return found;
    }
    let paths: Vec<usize> =
        (0..pointers.len()).filter(|&i| tokens[i].as_ref().is_some_and(|t| !t.is_empty())).collect();
    // The top-level pass also checks the whole body.
    if resolve(body, 0..body.len(), &tokens, &paths, 0, &mut found).is_err() {
        return vec![None; pointers.len()];
    }
    for (i, t) in tokens.iter().enumerate() {
        if t.as_ref().is_some_and(Vec::is_empty) {
            found[i] = Some(trimmed(body, 0..body.len()));
        }
    }
    found
}

/// Takes step `depth` of each pointer in `idx` inside the value at `at`, in
/// one pass over it, then goes on inside each value found, once per value.
fn resolve(
    body: &[u8],
    at: Range<usize>,
    tokens: &[Option<Vec<Cow<'_, str>>>],
    idx: &[usize],
    depth: usize,
    found: &mut [Option<Range<usize>>],
) -> Result<(), NotJson> {
    let mut child: Vec<Option<Range<usize>>> = vec![None; idx.len()];
    let base = at.start;
    scan(&body[at], |e| {
        for (j, &i) in idx.iter().enumerate() {
            if let Some(t) = &tokens[i] {
                if matches_token(&e.key, &t[depth]) {
                    // The last of duplicate names wins, as a parser into a map keeps it.
                    child[j] = Some(base + e.value.start..base + e.value.end);
                }
            }
        }
    })?;
    let mut deeper: Vec<(Range<usize>, Vec<usize>)> = Vec::new();
    for (j, &i) in idx.iter().enumerate() {
        let (Some(t), Some(range)) = (&tokens[i], child[j].take()) else { continue };
        if t.len() == depth + 1 {
            found[i] = Some(range);
        } else if let Some((_, group)) = deeper.iter_mut().find(|(r, _)| *r == range) {
            group.push(i);
        } else {
            deeper.push((range, vec![i]));
        }
    }
    for (range, group) in deeper {
        // A value inside a checked body is JSON: a scalar just has nothing inside.
        let _ = resolve(body, range, tokens, &group, depth + 1, found);
    }
    Ok(())
}

/// A pointer, split into its first step and the rest.
enum Step<'p> {
    /// The empty pointer: the whole document.
    Whole,
    Path {
        first: Cow<'p, str>,
        rest: Option<&'p str>,
    },
}

impl<'p> Step<'p> {
    /// `None` for a pointer that is neither empty nor starts with `/`: it names nothing.
    fn of(pointer: &'p str) -> Option<Self> {
        if pointer.is_empty() {
            return Some(Self::Whole);
        }
        let tokens = pointer.strip_prefix('/')?;
        let (first, rest) = match tokens.split_once('/') {
            Some((first, rest)) => (first, Some(rest)),
            None => (tokens, None),
        };
        Some(Self::Path { first: unescape(first), rest })
    }
}

/// Follows the remaining `/`-separated `tokens` from the value at `at`.
fn descend(body: &[u8], mut at: Range<usize>, tokens: &str) -> Option<Range<usize>> {
    for raw in tokens.split('/') {
        let token = unescape(raw);
        let mut next = None;
        scan(&body[at.clone()], |e| {
            if matches_token(&e.key, &token) {
                next = Some(e.value);
            }
        })
        .ok()?;
        let next = next?;
        at = at.start + next.start..at.start + next.end;
    }
    Some(at)
}

fn unescape(token: &str) -> Cow<'_, str> {
    if token.contains('~') { Cow::Owned(token.replace("~1", "/").replace("~0", "~")) } else { Cow::Borrowed(token) }
}

fn matches_token(key: &Key<'_>, token: &str) -> bool {
    match key {
        Key::Name(name) => name == token,
        Key::Index(i) => parse_index(token) == Some(*i),
    }
}

/// An array index as `serde_json::Value::pointer` reads it.
fn parse_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

fn trimmed(body: &[u8], mut r: Range<usize>) -> Range<usize> {
    while r.start < r.end && is_ws(body[r.start]) {
        r.start += 1;
    }
    while r.end > r.start && is_ws(body[r.end - 1]) {
        r.end -= 1;
    }
    r
}

const LOW: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

fn splat(b: u8) -> u64 {
    LOW * u64::from(b)
}

/// The high bit of each byte of `x` that equals `b`, exactly.
fn eq_bytes(x: u64, b: u8) -> u64 {
    let v = x ^ splat(b);
    !(((v & !HIGH) + !HIGH) | v) & HIGH
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\t' | b'\r')
}

/// The byte at `i`; running out of input is malformed.
#[inline(always)]
fn at(b: &[u8], i: usize) -> Result<u8, NotJson> {
    b.get(i).copied().ok_or(NotJson)
}

/// The first position at or after `i` that is not whitespace. Pretty-printed
/// bodies are mostly newlines and indentation: runs are skipped eight bytes
/// at a time.
#[inline(always)]
fn ws(b: &[u8], mut i: usize) -> usize {
    // No whitespace, or the one space after a colon: the common cases.
    match b.get(i) {
        Some(&c) if c > b' ' => return i,
        Some(b' ') if b.get(i + 1).is_some_and(|&c| c > b' ') => return i + 1,
        None => return i,
        _ => {}
    }
    while let Some(chunk) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let x = u64::from_le_bytes(*chunk);
        let other = !(eq_bytes(x, b' ') | eq_bytes(x, b'\n')) & HIGH;
        if other == 0 {
            i += 8;
            continue;
        }
        // The flag is the high bit of the first other byte: shift that byte down.
        let bit = other.trailing_zeros();
        i += (bit / 8) as usize;
        if !matches!((x >> (bit - 7)) as u8, b'\t' | b'\r') {
            return i;
        }
        i += 1;
    }
    while let Some(&c) = b.get(i) {
        if !is_ws(c) {
            break;
        }
        i += 1;
    }
    i
}

/// Skips the string whose opening quote is at `i`; returns the position after
/// its closing quote. A string with escapes is checked by serde_json itself
/// (escape rules, surrogate pairs).
#[inline(always)]
fn string(b: &[u8], start: usize) -> Result<usize, NotJson> {
    let mut i = start + 1;
    let mut escaped = false;
    loop {
        i = plain(b, i);
        match at(b, i)? {
            b'"' => break,
            // The escaped byte is skipped: an escaped quote does not end the string.
            b'\\' => {
                escaped = true;
                i += 2;
            }
            _ => return Err(NotJson), // a control character
        }
    }
    i += 1;
    if escaped {
        serde_json::from_slice::<String>(b.get(start..i).ok_or(NotJson)?).map_err(|_| NotJson)?;
    }
    Ok(i)
}

/// The first position at or after `i` holding a quote, a backslash or a
/// control character (or the end).
#[inline(always)]
fn plain(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let x = u64::from_le_bytes(*chunk);
        // Each term flags its first matching byte exactly (a flag above it
        // may be a borrow), so the lowest flag of the union is the first stop.
        let q = x ^ splat(b'"');
        let s = x ^ splat(b'\\');
        let stops = (q.wrapping_sub(LOW) & !q | s.wrapping_sub(LOW) & !s | x.wrapping_sub(splat(0x20)) & !x) & HIGH;
        if stops != 0 {
            return i + (stops.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        i += 1;
    }
    i
}

fn digits(b: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = b.get(i) {
        i += 1;
    }
    i
}

/// Skips the number starting at `i`.
#[inline(always)]
fn number(b: &[u8], start: usize) -> Result<usize, NotJson> {
    let mut i = start + usize::from(b[start] == b'-');
    match at(b, i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(b, i + 1),
        _ => return Err(NotJson),
    }
    let mut plain = i - start <= 18;
    if b.get(i) == Some(&b'.') {
        let end = digits(b, i + 1);
        if end == i + 1 {
            return Err(NotJson);
        }
        i = end;
        plain = false;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        let end = digits(b, i);
        if end == i {
            return Err(NotJson);
        }
        i = end;
        plain = false;
    }
    if !plain {
        // Fractions, exponents and long integers: serde_json decides (a
        // float that overflows is refused).
        serde_json::from_slice::<serde_json::Value>(&b[start..i]).map_err(|_| NotJson)?;
    }
    Ok(i)
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Result<usize, NotJson> {
    if b.get(i..i + word.len()) == Some(word) { Ok(i + word.len()) } else { Err(NotJson) }
}

/// `"name"`, the colon and the whitespace after it, starting at `i`.
#[inline(always)]
fn member_name(b: &[u8], i: usize) -> Result<usize, NotJson> {
    if at(b, i)? != b'"' {
        return Err(NotJson);
    }
    let i = ws(b, string(b, i)?);
    if at(b, i)? != b':' {
        return Err(NotJson);
    }
    Ok(ws(b, i + 1))
}

/// Skips the value starting at `i` (not whitespace), inside `depth` open
/// containers; returns the position after it.
fn value(b: &[u8], mut i: usize, depth: usize) -> Result<usize, NotJson> {
    // One bit per container opened here, innermost lowest: set for an object.
    let mut objects: u128 = 0;
    let mut open = 0usize;
    loop {
        // A value is expected at `i`.
        match at(b, i)? {
            b'"' => i = string(b, i)?,
            b'0'..=b'9' | b'-' => i = number(b, i)?,
            c @ (b'{' | b'[') => {
                if depth + open >= MAX_DEPTH {
                    return Err(NotJson);
                }
                let object = c == b'{';
                i = ws(b, i + 1);
                if at(b, i)? == c + 2 {
                    // `{}` or `[]`: the closing byte is two above the opening one.
                    i += 1;
                } else {
                    objects = (objects << 1) | u128::from(object);
                    open += 1;
                    if object {
                        i = member_name(b, i)?;
                    }
                    continue;
                }
            }
            b't' => i = literal(b, i, b"true")?,
            b'f' => i = literal(b, i, b"false")?,
            b'n' => i = literal(b, i, b"null")?,
            _ => return Err(NotJson),
        }
        // A value is complete: close what it completes.
        loop {
            if open == 0 {
                return Ok(i);
            }
            i = ws(b, i);
            let in_object = objects & 1 == 1;
            match at(b, i)? {
                b',' => {
                    i = ws(b, i + 1);
                    if in_object {
                        i = member_name(b, i)?;
                    }
                    break;
                }
                b'}' if in_object => {}
                b']' if !in_object => {}
                _ => return Err(NotJson),
            }
            i += 1;
            objects >>= 1;
            open -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn serde_accepts(b: &[u8]) -> bool {
        serde_json::from_slice::<Value>(b).is_ok()
    }

    fn assert_same_acceptance(b: &[u8]) {
        assert_eq!(scan(b, |_| {}).is_ok(), serde_accepts(b), "{:?}", String::from_utf8_lossy(b));
    }

    fn nested(open: &str, close: &str, depth: usize) -> Vec<u8> {
        format!("{}{}", open.repeat(depth), close.repeat(depth)).into_bytes()
    }

    #[test]
    fn accepts_exactly_what_serde_json_accepts() {
        let cases: &[&[u8]] = &[
            b"",
            b" ",
            b"{}",
            b"[]",
            b"{ }",
            b"[ ]",
            b" \t\r\n{}\n",
            b"null",
            b"true",
            b"false",
            b"nul",
            b"tru",
            b"nulll",
            b"True",
            b"0",
            b"-0",
            b"01",
            b"-01",
            b"-",
            b"--1",
            b"+1",
            b"1.",
            b".5",
            b"1.5",
            b"1e",
            b"1e+",
            b"1E-3",
            b"2e+10",
            b"1e400",
            b"-1e400",
            b"1e-400",
            b"0.0e0",
            b"1.7976931348623157e308",
            b"1.8e308",
            b"123456789012345678",
            b"1234567890123456789",
            b"18446744073709551616",
            b"-9223372036854775809",
            b"\"a\"",
            b"\"\"",
            b"\"",
            b"\"\\\"",
            b"\"\\\"\"",
            b"\"\\u0041\"",
            b"\"\\u004\"",
            b"\"\\u00zz\"",
            b"\"\\ud800\"",
            b"\"\\udc00\"",
            b"\"\\ud800\\udc00\"",
            b"\"\\ud800\\u0041\"",
            b"\"\\ud800\\n\"",
            b"\"\\ud800x\"",
            b"\"\\x\"",
            b"\"\\/\"",
            b"\"\\b\\f\\n\\r\\t\"",
            b"\"a\x01\"",
            b"\"\t\"",
            b"\"\x7f\"",
            b"\"\xff\"",
            b"\"\xc3\xa9\"",
            b"\"\xc3\"",
            b"\"\xe2\\u0041\"",
            b"\xff",
            b"{\"\xff\":1}",
            b"\xef\xbb\xbf{}",
            b"{\"a\":1,}",
            b"[1,]",
            b"[,1]",
            b"{,}",
            b"{\"a\" 1}",
            b"{\"a\"::1}",
            b"{1:1}",
            b"{a:1}",
            b"{\"a\":1 \"b\":2}",
            b"[1 2]",
            b"{\"a\":1}x",
            b"{\"a\":1} ",
            b"{}{}",
            b"[}",
            b"{]",
            b"[1}",
            b"{\"a\":[1,{\"b\":null}],\"c\":\"d\"}",
            b"{\"a\":1,\"a\":2}",
            b"[\"a\",]",
            b"{\"a\":}",
            b"{\"a\"}",
            b"[tru]",
            b"[true false]",
            b"{\"a\":-}",
            b"[1.e5]",
            b"[0x10]",
            b"[NaN]",
            b"[Infinity]",
            b"\x00",
            b"{} \x00",
            b"[\"\\u0000\"]",
            b"[1]\n\n",
            b"\n",
            b"[\n]",
            b"{\"\":\"\"}",
            b"\"\\uD83D\\uDE00\"",
            b"\"\\uDBFF\\uDFFF\"",
            b"\"\\uDBFF\\uDBFF\"",
            b"{\"a\\u0000\":1}",
            b"{\"a\":\"\\",
            b"\"\x1f\"",
            b"\"abcdefghij\x1fk\"",
            b"\"abcdefghijkl\\",
        ];
        for case in cases {
            assert_same_acceptance(case);
        }
    }

    #[test]
    fn eight_byte_steps_find_every_stop_at_every_offset() {
        // Strings: a stop (or a byte that must not stop) at each offset of
        // the eight-byte steps, after ASCII and after multi-byte UTF-8.
        for pad in ["", "é", "€", "😀", "a\\u00e9"] {
            for len in 0..20 {
                for special in ["\"", "\\\\", "\\n", "\x00", "\x1f", "\t", " ", "\x7f", "é", "\\\"", "\\u0041"] {
                    let doc = format!("[\"{pad}{}{special}{}\", 1]", "x".repeat(len), "y".repeat(len % 9));
                    assert_same_acceptance(doc.as_bytes());
                }
            }
        }
        // Whitespace runs of every length, with tabs, carriage returns and
        // control characters that are not whitespace at every position.
        for len in 0..20 {
            for odd in ["", "\t", "\r", "\x0b", "\x0c", "\x00", "\u{a0}"] {
                for at in 0..=len {
                    let run = format!("{}{odd}{}", " ".repeat(at), "\n".repeat(len - at));
                    let doc = format!("{{{run}\"a\"{run}:{run}[{run}1{run},{run}2{run}]{run}}}{run}");
                    assert_same_acceptance(doc.as_bytes());
                }
            }
        }
    }

    #[test]
    fn nesting_limit_is_serde_jsons() {
        for depth in [1, 2, 126, 127, 128, 129, 1_000] {
            for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
                let mut doc = nested(open, close, depth);
                if open == "[" {
                    assert_same_acceptance(&doc);
                } else {
                    // `{"a":{"a":...null}}`: the innermost needs a value.
                    doc = format!("{}null{}", open.repeat(depth), close.repeat(depth)).into_bytes();
                    assert_same_acceptance(&doc);
                }
            }
            // Mixed, inside a top-level object as an event would be.
            let doc = format!("{{\"id\":\"x\",\"data\":{}1{}}}", "[{\"a\":".repeat(depth), "}]".repeat(depth));
            assert_same_acceptance(doc.as_bytes());
        }
        assert_eq!(scan(&nested("[", "]", MAX_DEPTH), |_| {}), Ok(Kind::Array));
        assert_eq!(scan(&nested("[", "]", MAX_DEPTH + 1), |_| {}), Err(NotJson));
    }

    #[test]
    fn very_deep_nesting_is_refused_without_recursion() {
        let doc = nested("[", "]", 1_000_000);
        assert_eq!(scan(&doc, |_| {}), Err(NotJson));
        let open_only = vec![b'{'; 1_000_000];
        assert_eq!(scan(&open_only, |_| {}), Err(NotJson));
    }

    /// A small deterministic generator (xorshift) for differential tests.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len())]
        }
    }

    const WS: [&str; 6] = ["", "", " ", "\n  ", "\t", "\r\n"];
    const STRINGS: [&str; 10] = [
        "\"\"",
        "\"id\"",
        "\"type\"",
        "\"pending_webhooks\"",
        "\"a b\"",
        "\"\\\"q\\\"\"",
        "\"\\u00e9\\ud83d\\ude00\"",
        "\"é🎉\"",
        "\"pending\\u005fwebhooks\"",
        "\"x\\\\\"",
    ];
    const SCALARS: [&str; 12] =
        ["0", "-1", "42", "1.5", "-0.0", "1e3", "12345678901234567890", "true", "false", "null", "3", "7E-2"];

    fn value(rng: &mut Rng, depth: usize, out: &mut String) {
        let choice = if depth > 4 { rng.below(2) } else { rng.below(4) };
        match choice {
            0 => out.push_str(rng.pick(&SCALARS)),
            1 => out.push_str(rng.pick(&STRINGS)),
            2 => {
                out.push('[');
                for n in 0..rng.below(4) {
                    if n > 0 {
                        out.push(',');
                    }
                    out.push_str(rng.pick(&WS));
                    value(rng, depth + 1, out);
                    out.push_str(rng.pick(&WS));
                }
                out.push(']');
            }
            _ => object(rng, depth, out),
        }
    }

    fn object(rng: &mut Rng, depth: usize, out: &mut String) {
        out.push('{');
        for n in 0..rng.below(5) {
            if n > 0 {
                out.push(',');
            }
            out.push_str(rng.pick(&WS));
            out.push_str(rng.pick(&STRINGS));
            out.push_str(rng.pick(&WS));
            out.push(':');
            out.push_str(rng.pick(&WS));
            value(rng, depth + 1, out);
            out.push_str(rng.pick(&WS));
        }
        out.push('}');
    }

    fn mutate(rng: &mut Rng, doc: &[u8]) -> Vec<u8> {
        let mut d = doc.to_vec();
        const BYTES: &[u8] = b"{}[]:,\"\\ \n\t0-.eE+atfnu\x01\x7f\xff\xc3";
        for _ in 0..1 + rng.below(2) {
            let at = if d.is_empty() { 0 } else { rng.below(d.len()) };
            match rng.below(4) {
                0 if !d.is_empty() => {
                    d.remove(at);
                }
                1 => d.insert(at, BYTES[rng.below(BYTES.len())]),
                2 if !d.is_empty() => d[at] = BYTES[rng.below(BYTES.len())],
                _ => {
                    let end = (at + rng.below(8)).min(d.len());
                    let piece = d[at..end].to_vec();
                    d.splice(at..at, piece);
                }
            }
        }
        d
    }

    #[test]
    fn random_and_mutated_documents_are_judged_like_serde_json() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..4_000 {
            let mut doc = String::new();
            doc.push_str(rng.pick(&WS));
            if rng.below(4) == 0 {
                value(&mut rng, 0, &mut doc)
            } else {
                object(&mut rng, 0, &mut doc)
            }
            doc.push_str(rng.pick(&WS));
            assert!(scan(doc.as_bytes(), |_| {}).is_ok(), "{doc}");
            assert_same_acceptance(doc.as_bytes());
            for _ in 0..8 {
                assert_same_acceptance(&mutate(&mut rng, doc.as_bytes()));
            }
        }
    }

    /// The members `scan` reports, folded the way a map keeps them (last wins).
    fn members_by_scan(doc: &[u8]) -> serde_json::Map<String, Value> {
        let mut map = serde_json::Map::new();
        scan(doc, |e| {
            let Key::Name(name) = e.key else { panic!("object entries have names") };
            let value: Value = serde_json::from_slice(&doc[e.value]).expect("an entry's range is one value");
            map.insert(name.into_owned(), value);
        })
        .expect("valid");
        map
    }

    #[test]
    fn entries_are_the_members_a_parser_keeps() {
        let mut rng = Rng(42);
        for _ in 0..2_000 {
            let mut doc = String::new();
            object(&mut rng, 0, &mut doc);
            let Value::Object(expected) = serde_json::from_str::<Value>(&doc).expect("valid") else { unreachable!() };
            assert_eq!(members_by_scan(doc.as_bytes()), expected, "{doc}");
        }
        // Arrays report their elements by index.
        let doc = br#"[ 1, "two" ,{"three":3}]"#;
        let mut seen = Vec::new();
        assert_eq!(scan(doc, |e| seen.push((e.key, &doc[e.value]))), Ok(Kind::Array));
        assert_eq!(
            seen,
            vec![(Key::Index(0), &b"1"[..]), (Key::Index(1), &b"\"two\""[..]), (Key::Index(2), &br#"{"three":3}"#[..])]
        );
        assert_eq!(scan(b" 7 ", |_| panic!("a scalar has no entries")), Ok(Kind::Scalar));
    }

    #[test]
    fn string_values_are_unescaped_and_others_are_not_strings() {
        let doc = br#"{"a":"plain","b":"esc\"aped\u0041","c":12,"d":null,"e":["x"]}"#;
        let mut got = Vec::new();
        scan(doc, |e| got.push(string_at(doc, &e.value))).unwrap();
        assert_eq!(got, vec![Some(Cow::Borrowed("plain")), Some(Cow::Owned("esc\"apedA".into())), None, None, None]);
    }

    #[test]
    fn pointers_resolve_like_value_pointer() {
        let docs: &[&str] = &[
            r#"{"id":"evt_1","type":"a.b","data":{"object":{"id":"pi_1","n":12.50,"list":[10,{"x":"y"}]}}}"#,
            r#"{"a/b":1,"m~n":2,"":3,"arr":[0,1,2],"dup":{"k":1},"dup":{"j":2},"esc\u0061ped":4}"#,
            r#"[{"id":"first"},{"id":"second"}]"#,
            r#""just a string""#,
            r#"{"id":"x" , "type" : "t" } "#,
            "not json",
            r#"{"id":"x","trailing":"garbage"} x"#,
        ];
        let pointers = [
            "",
            "/",
            "/id",
            "/type",
            "/data/object/id",
            "/data/object/n",
            "/data/object/list/1/x",
            "/data/object/list/2",
            "/a~1b",
            "/m~0n",
            "/arr/0",
            "/arr/01",
            "/arr/+1",
            "/arr/-1",
            "/arr/3",
            "/dup/k",
            "/dup/j",
            "/escaped",
            "/0/id",
            "/1/id",
            "id",
            "/id/x",
            "/data//",
            "/missing/deeper",
        ];
        for doc in docs {
            let parsed = serde_json::from_str::<Value>(doc).ok();
            for a in pointers {
                for b in [None, Some("/type")] {
                    let [got_a, got_b] = super::pointers(doc.as_bytes(), [Some(a), b]);
                    let expect = |p: &str| parsed.as_ref().and_then(|v| v.pointer(p)).cloned();
                    let value_at = |r: Option<Range<usize>>| {
                        r.map(|r| serde_json::from_slice::<Value>(&doc.as_bytes()[r]).expect("one value"))
                    };
                    assert_eq!(value_at(got_a), expect(a), "{doc} {a}");
                    assert_eq!(value_at(got_b), b.and_then(expect), "{doc} {b:?}");
                }
            }
        }
        assert_eq!(super::pointers::<2>(b"{}", [None, None]), [None, None]);
    }

    /// What the verifiers read before: a full parse, then `/id` and `/type`.
    fn fields_by_full_parse(doc: &[u8]) -> Option<(Option<String>, Option<String>, Option<Value>)> {
        let v: Value = serde_json::from_slice(doc).ok()?;
        let text = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
        let pending = v.as_object().and_then(|m| m.get("pending_webhooks")).cloned();
        Some((text("/id"), text("/type"), pending))
    }

    fn fields_by_scan(doc: &[u8]) -> Option<(Option<String>, Option<String>, Option<Value>)> {
        let f = super::super::event_fields(doc).ok()?;
        let pending = f.pending_webhooks.last().map(|r| serde_json::from_slice(&doc[r.clone()]).expect("one value"));
        Some((f.id.map(Cow::into_owned), f.event_type.map(Cow::into_owned), pending))
    }

    #[test]
    fn event_fields_are_what_a_full_parse_reads() {
        let fixtures: [&[u8]; 4] = [
            include_bytes!("../../testdata/providers/stripe/events/charge.refunded.json"),
            include_bytes!("../../testdata/providers/stripe/events/customer.subscription.updated.json"),
            include_bytes!("../../testdata/providers/stripe/events/openapi-fixtures3-selected-resources.json"),
            include_bytes!("../../testdata/providers/stripe/events/payment_intent.succeeded.json"),
        ];
        let mut rng = Rng(7);
        for doc in fixtures {
            assert!(fields_by_scan(doc).is_some());
            assert_eq!(fields_by_scan(doc), fields_by_full_parse(doc));
            for _ in 0..200 {
                let m = mutate(&mut rng, doc);
                assert_eq!(fields_by_scan(&m), fields_by_full_parse(&m), "{}", String::from_utf8_lossy(&m));
            }
        }
        let adversarial: &[&[u8]] = &[
            br#"{"id":"evt_1","id":"evt_2","type":"a","type":"b"}"#,
            br#"{"id":"evt_1","id":2}"#,
            br#"{"i\u0064":"evt\u005f1","typ\u0065":"a\"b"}"#,
            br#"{"data":{"id":"nested","type":"nested"}}"#,
            br#"{"id":["evt_1"],"type":{"x":1}}"#,
            br#"[{"id":"evt_1"}]"#,
            br#""evt_1""#,
            br#"{"id":"evt_1","pending_webhooks":1,"data":{"pending_webhooks":2},"pending_webhooks":3}"#,
            b"{\"id\":\"evt_\xff\"}",
            b"{\"id\":\"evt_1\",\"x\":\"\xc3\"}",
            br#"{"id":"evt_1","x":"\ud800"}"#,
            br#"{"id":"evt_1","x":1e999}"#,
            br#"{"id":"evt_1"} {"id":"evt_2"}"#,
        ];
        for doc in adversarial {
            assert_eq!(fields_by_scan(doc), fields_by_full_parse(doc), "{}", String::from_utf8_lossy(doc));
        }
        for depth in [126, 127, 128] {
            let doc = format!("{{\"id\":\"evt_1\",\"data\":{}{}}}", "[".repeat(depth - 1), "]".repeat(depth - 1));
            assert_eq!(fields_by_scan(doc.as_bytes()), fields_by_full_parse(doc.as_bytes()), "{depth}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;
        use serde_json::Value;

        /// Any JSON value, with names drawn from a small set so that
        /// duplicates and pointer hits are common.
        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
                "\\PC{0,12}".prop_map(Value::String),
                prop::sample::select(vec!["id", "type", "a\"b", "é", "~0/"]).prop_map(|s| Value::String(s.into())),
            ];
            leaf.prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::vec(
                        (prop::sample::select(vec!["id", "type", "data", "0", "a/b", "m~n", "é"]), inner),
                        0..6
                    )
                    .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
                ]
            })
        }

        /// The document as text: compact, pretty, or with a duplicated
        /// member spliced in (a parser keeps the last).
        fn render(v: &Value, how: u8) -> Vec<u8> {
            match how {
                0 => serde_json::to_vec(v).unwrap(),
                1 => serde_json::to_vec_pretty(v).unwrap(),
                _ => {
                    let text = serde_json::to_string(v).unwrap();
                    match text.strip_prefix('{') {
                        Some(rest) if rest != "}" => format!("{{\"id\":\"first\" , {rest}").into_bytes(),
                        _ => text.into_bytes(),
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]

            /// On any document, and on it with one byte changed or cut short:
            /// `scan` accepts exactly what serde_json accepts, and `pointers`
            /// with `string_at` finds exactly what `Value::pointer` finds.
            #[test]
            fn the_reader_agrees_with_serde_json(
                v in value(),
                how in 0u8..3,
                mutate in prop::option::weighted(0.3, (any::<prop::sample::Index>(), any::<u8>())),
                cut in prop::option::weighted(0.1, any::<prop::sample::Index>()),
            ) {
                let mut doc = render(&v, how);
                if let Some((at, byte)) = mutate {
                    if !doc.is_empty() {
                        let i = at.index(doc.len());
                        doc[i] = byte;
                    }
                }
                if let Some(at) = cut {
                    doc.truncate(at.index(doc.len() + 1));
                }
                let parsed = serde_json::from_slice::<Value>(&doc);
                prop_assert_eq!(scan(&doc, |_| {}).is_ok(), parsed.is_ok());
                let ptrs = ["/id", "/type", "/data/id", "/0", "/data/0/type", "/a~1b", "/m~0n", ""];
                let found = pointers(&doc, ptrs.map(Some));
                prop_assert_eq!(pointers_many(&doc, &ptrs), found.to_vec(), "the run-time reader agrees");
                for (p, at) in ptrs.iter().zip(found) {
                    let expected = parsed.as_ref().ok().and_then(|v| v.pointer(p));
                    match (expected, at) {
                        (None, None) => {}
                        (Some(e), Some(range)) => {
                            let got: Value = serde_json::from_slice(&doc[range.clone()]).unwrap();
                            prop_assert_eq!(&got, e, "{}", p);
                            prop_assert_eq!(string_at(&doc, &range).map(|s| s.into_owned()), e.as_str().map(str::to_owned));
                        }
                        (e, got) => prop_assert!(false, "{p}: serde_json {e:?}, reader {got:?}"),
                    }
                }
            }
        }
    }
}
