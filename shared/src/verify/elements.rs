//! Batches whose events carry no id of their own (Microsoft Graph's
//! `value`, Asana's `events`): the elements of a JSON array, each an event
//! identified by the SHA-256 of its bytes (the provider's retries repeat
//! them), its type read by the provider.

use std::ops::Range;

use super::{BatchEvent, Content, VerifyError, json, malformed_element, push_event};
use crate::identity::payload_hash;

/// The byte ranges of the elements of the array at `pointer` in `body`.
pub(crate) fn elements(body: &[u8], pointer: &'static str) -> Result<Vec<Range<usize>>, VerifyError> {
    let [at] = json::pointers(body, [Some(pointer)]);
    let at =
        at.ok_or(VerifyError::MalformedPayload("the delivery has no array of events where its provider puts them"))?;
    let mut out: Vec<Range<usize>> = Vec::new();
    let kind = json::scan(&body[at.clone()], |e| out.push(e.value.start + at.start..e.value.end + at.start))
        .map_err(|_| VerifyError::MalformedPayload("not JSON"))?;
    if kind != json::Kind::Array {
        return Err(VerifyError::MalformedPayload("the events are not a JSON array"));
    }
    if out.len() > super::MAX_BATCH_EVENTS {
        return Err(VerifyError::MalformedPayload("the batch has more events than a delivery may carry"));
    }
    Ok(out)
}

/// Each element as an event: its hash, the type `type_of` reads from its
/// bytes (`None`: a malformed element, parked) and its bytes. Two equal
/// elements refuse the delivery (one would hide the other).
pub(crate) fn hashed_events(
    body: &[u8],
    ranges: &[Range<usize>],
    type_of: impl Fn(&[u8]) -> Option<String>,
) -> Result<Vec<BatchEvent>, VerifyError> {
    let mut out: Vec<BatchEvent> = Vec::with_capacity(ranges.len());
    for range in ranges {
        let bytes = &body[range.clone()];
        // An element without its type is kept apart (parked); the others
        // are recorded as usual.
        let Some(event_type) = type_of(bytes) else {
            push_event(&mut out, malformed_element(body, range.clone(), "an event of the batch has no type"))?;
            continue;
        };
        let event_id = payload_hash(bytes);
        if out.iter().any(|e| e.event_id == event_id) {
            return Err(VerifyError::MalformedPayload("two events of the batch are the same"));
        }
        out.push(BatchEvent {
            event_id: event_id.clone(),
            event_type: Some(event_type),
            bytes: range.clone(),
            content: Content::Hashed { payload: event_id },
        });
    }
    Ok(out)
}

/// The string at `pointer` in a JSON value's bytes.
pub(crate) fn text_at(bytes: &[u8], pointer: &str) -> Option<String> {
    let [at] = json::pointers(bytes, [Some(pointer)]);
    json::string_at(bytes, &at?).map(std::borrow::Cow::into_owned)
}
