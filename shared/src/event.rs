//! Turns a stored payload back into the provider's event, for projections.
//! Runs only on payloads that were verified at intake.

/// Why a stored payload cannot be decoded (permanent: retrying cannot help).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// `(event type, JSON body)` of a stored JSON payload: the type stored with
/// the record, else the body's top-level `type`. What most providers'
/// payloads decode with (`verify::provider::Provider::decode`).
pub fn decode_json(stored_type: Option<&str>, payload: &[u8]) -> Result<(String, serde_json::Value), DecodeError> {
    let body = serde_json::from_slice::<serde_json::Value>(payload)
        .map_err(|e| DecodeError(format!("payload is not JSON: {e}")))?;
    typed(stored_type, body)
}

/// `(event type, body)`: the stored type, else the body's top-level `type`.
pub fn typed(stored_type: Option<&str>, body: serde_json::Value) -> Result<(String, serde_json::Value), DecodeError> {
    let ty = stored_type
        .map(str::to_owned)
        .or_else(|| body.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .ok_or_else(|| DecodeError("event has no type".into()))?;
    Ok((ty, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_type_wins_and_a_body_without_one_is_refused() {
        let (t, _) = decode_json(Some("a.b"), br#"{"type":"c.d"}"#).unwrap();
        assert_eq!(t, "a.b");
        let (t, _) = decode_json(None, br#"{"type":"c.d"}"#).unwrap();
        assert_eq!(t, "c.d");
        assert!(decode_json(None, br#"{"no":"type"}"#).is_err());
        assert!(decode_json(None, b"\xff").is_err());
    }
}
