//! Turns a stored payload back into the provider's event, for projections.
//! Runs only on payloads that were verified at intake.

/// Why a stored payload cannot be decoded (permanent: retrying cannot help).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// `(event type, JSON body)` of a stored payload.
pub fn decode(
    provider: &str,
    stored_type: Option<&str>,
    payload: &[u8],
) -> Result<(String, serde_json::Value), DecodeError> {
    let json = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(bytes).map_err(|e| DecodeError(format!("payload is not JSON: {e}")))
    };
    let typed = |body: serde_json::Value| -> Result<(String, serde_json::Value), DecodeError> {
        let ty = stored_type
            .map(str::to_owned)
            .or_else(|| body.get("type").and_then(|t| t.as_str()).map(str::to_owned))
            .ok_or_else(|| DecodeError("event has no type".into()))?;
        Ok((ty, body))
    };
    match provider {
        "sns" => {
            let envelope = json(payload)?;
            let message = envelope
                .get("Message")
                .and_then(|m| m.as_str())
                .ok_or_else(|| DecodeError("SNS envelope has no Message".into()))?;
            let body = serde_json::from_str(message).unwrap_or_else(|_| serde_json::json!({ "message": message }));
            typed(body)
        }
        "github" => {
            // Form-encoded deliveries carry the JSON in `payload=`.
            let body = if payload.starts_with(b"payload=") {
                let decoded = url::form_urlencoded::parse(payload)
                    .find(|(k, _)| k == "payload")
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default();
                json(decoded.as_bytes())?
            } else {
                json(payload)?
            };
            typed(body)
        }
        _ => typed(json(payload)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_shapes_decode() {
        let (t, b) = decode("stripe", Some("invoice.paid"), br#"{"id":"evt_1","type":"invoice.paid"}"#).unwrap();
        assert_eq!((t.as_str(), b["id"].as_str()), ("invoice.paid", Some("evt_1")));
        let sns =
            serde_json::json!({"Type": "Notification", "Message": "{\"notificationType\":\"Bounce\"}"}).to_string();
        let (t, b) = decode("sns", Some("ses.Bounce"), sns.as_bytes()).unwrap();
        assert_eq!((t.as_str(), b["notificationType"].as_str()), ("ses.Bounce", Some("Bounce")));
        let (t, b) = decode("github", Some("push"), b"payload=%7B%22ref%22%3A%22refs%2Fheads%2Fmain%22%7D").unwrap();
        assert_eq!((t.as_str(), b["ref"].as_str()), ("push", Some("refs/heads/main")));
        let (t, _) = decode("standard_webhooks", None, br#"{"type":"seats.snapshot"}"#).unwrap();
        assert_eq!(t, "seats.snapshot");
    }

    #[test]
    fn undecodable_payloads_are_permanent_errors() {
        assert!(decode("stripe", None, b"\xff\xfe").is_err());
        assert!(decode("standard_webhooks", None, br#"{"no":"type"}"#).is_err());
        assert!(decode("sns", None, br#"{"Type":"Notification"}"#).is_err());
    }

    mod proptests {
        use proptest::prelude::*;

        use super::*;

        fn payload() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..200),
                r#"\{("(type|Message|id)":("[ -~]{0,10}"|[0-9]{1,3}|null|\{\}),?){0,3}\}"#.prop_map(String::into_bytes),
                "payload=[ -~]{0,40}".prop_map(String::into_bytes),
                any::<String>()
                    .prop_map(|m| serde_json::json!({"Type": "Notification", "Message": m}).to_string().into_bytes()),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any stored payload, for any provider: a type and a body, or
            /// the typed (permanent) decode error; never a panic.
            #[test]
            fn decoding_never_panics_and_errors_are_typed(
                provider in prop::sample::select(&["sns", "github", "stripe", "standard_webhooks", "hmac", "other"][..]),
                stored_type in prop::option::of("[a-z.]{0,10}"),
                payload in payload(),
            ) {
                match decode(provider, stored_type.as_deref(), &payload) {
                    Ok((ty, _)) => if let Some(t) = &stored_type { prop_assert_eq!(&ty, t) },
                    Err(DecodeError(why)) => prop_assert!(!why.is_empty()),
                }
            }
        }
    }
}
