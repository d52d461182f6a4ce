//! Header access that copes with API Gateway's handling of repeated headers.
//!
//! API Gateway (HTTP API, payload v2) joins repeated headers into one value
//! separated by commas; other front ends keep them as separate values. The
//! verifiers read every value of a header and split lists themselves, so both
//! shapes verify the same way.

use http::HeaderMap;

use super::VerifyError;

/// All values of `name`, in order. Non-ASCII values are rejected: every
/// signature header we read is ASCII by specification.
pub fn header_values<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<Vec<&'a str>, VerifyError> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().map(str::trim).map_err(|_| VerifyError::MalformedHeader(name)))
        .collect()
}

/// Exactly one value of `name` (after trimming); repeated or missing is an error.
pub(crate) fn single_header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, VerifyError> {
    let values = header_values(headers, name)?;
    match values.as_slice() {
        [] => Err(VerifyError::MissingHeader(name)),
        [""] => Err(VerifyError::MissingHeader(name)),
        [one] if one.contains(',') => Err(VerifyError::MalformedHeader(name)),
        [one] => Ok(one),
        _ => Err(VerifyError::MalformedHeader(name)),
    }
}

/// The first present header among `names`, as a single value.
pub(crate) fn first_of<'a>(headers: &'a HeaderMap, names: &[&'static str]) -> Result<&'a str, VerifyError> {
    for name in names {
        if headers.contains_key(*name) {
            return single_header(headers, name);
        }
    }
    Err(VerifyError::MissingHeader(names[0]))
}

/// Every comma-separated item across all values of `name`, trimmed, empties dropped.
pub(crate) fn list_items<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<Vec<&'a str>, VerifyError> {
    let values = header_values(headers, name)?;
    if values.is_empty() {
        return Err(VerifyError::MissingHeader(name));
    }
    Ok(values.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|s| !s.is_empty()).collect())
}

/// Parses a decimal unix timestamp in seconds.
pub(crate) fn parse_unix_secs(raw: &str, name: &'static str) -> Result<i64, VerifyError> {
    if raw.is_empty() || raw.len() > 12 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::MalformedHeader(name));
    }
    raw.parse().map_err(|_| VerifyError::MalformedHeader(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn joined_and_split_values_give_the_same_items() {
        let mut joined = HeaderMap::new();
        joined.insert("x-sig", HeaderValue::from_static("a, b"));
        let mut split = HeaderMap::new();
        split.append("x-sig", HeaderValue::from_static("a"));
        split.append("x-sig", HeaderValue::from_static("b"));
        assert_eq!(list_items(&joined, "x-sig").unwrap(), list_items(&split, "x-sig").unwrap());
    }

    #[test]
    fn single_header_refuses_repeats_and_joined_repeats() {
        let mut h = HeaderMap::new();
        h.append("x-id", HeaderValue::from_static("a"));
        assert_eq!(single_header(&h, "x-id"), Ok("a"));
        h.append("x-id", HeaderValue::from_static("b"));
        assert_eq!(single_header(&h, "x-id"), Err(VerifyError::MalformedHeader("x-id")));
        let mut j = HeaderMap::new();
        j.insert("x-id", HeaderValue::from_static("a,b"));
        assert_eq!(single_header(&j, "x-id"), Err(VerifyError::MalformedHeader("x-id")));
        assert_eq!(single_header(&HeaderMap::new(), "x-id"), Err(VerifyError::MissingHeader("x-id")));
    }

    #[test]
    fn timestamps_must_be_plain_digits() {
        assert_eq!(parse_unix_secs("1533204620", "t"), Ok(1_533_204_620));
        for bad in ["", "-1", "1.5", "12a", " 1", "9999999999999"] {
            assert!(parse_unix_secs(bad, "t").is_err(), "{bad:?}");
        }
    }
}
