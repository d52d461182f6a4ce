//! Meta's deliveries (WhatsApp, Messenger, Instagram), element by element.
//!
//! One delivery batches up to 1,000 updates: `entry[]`, each with either
//! `changes[]` (WhatsApp, Instagram and Page fields) or `messaging[]`
//! (Messenger and Instagram messaging). Meta gives a delivery no id and may
//! regroup updates on a retry, so each update is its own event, identified
//! by what identifies it across deliveries:
//!
//! | element | identity | type |
//! |---|---|---|
//! | `changes[].value.messages[]` | its `id` (`wamid…`) | `<object>.message` |
//! | `changes[].value.statuses[]` | its `id` and `status` (one message's `sent`, `delivered`, `read` are distinct facts) | `<object>.status` |
//! | `messaging[]` | `message.mid`, `postback.mid` or `reaction.mid`; else the SHA-256 of its bytes | `<object>.<message, postback, reaction, read, delivery, …>` |
//! | a change with neither messages nor statuses | the SHA-256 of its bytes | `<object>.<field>` |
//! | an entry with neither changes nor messaging | the SHA-256 of its bytes | `<object>` |
//!
//! Each event's payload is its element's exact bytes. A message or status
//! without its id is kept apart as a malformed element (parked); the same
//! update twice in one delivery is one event. A regrouped retry meets every
//! update as a duplicate.

use std::ops::Range;

use super::elements::text_at;
use super::{BatchEvent, Content, VerifyError, checked_event_id, json, malformed_element};
use crate::identity::payload_hash;

/// The byte ranges (in `body`) of the elements of the array at `at`.
fn array(body: &[u8], at: &Range<usize>) -> Result<Vec<Range<usize>>, VerifyError> {
    let mut out = Vec::new();
    let kind = json::scan(&body[at.clone()], |e| out.push(e.value.start + at.start..e.value.end + at.start))
        .map_err(|_| VerifyError::MalformedPayload("not JSON"))?;
    if kind != json::Kind::Array {
        return Err(VerifyError::MalformedPayload("a Meta list is not a JSON array"));
    }
    Ok(out)
}

/// Where `pointer` is in the element at `within` of `body` (in `body`).
fn member(body: &[u8], within: &Range<usize>, pointer: &'static str) -> Option<Range<usize>> {
    let [at] = json::pointers(&body[within.clone()], [Some(pointer)]);
    at.map(|r| r.start + within.start..r.end + within.start)
}

/// The string (or number) at `pointer` in the element at `within`.
fn text(body: &[u8], within: &Range<usize>, pointer: &str) -> Option<String> {
    text_at(&body[within.clone()], pointer).or_else(|| {
        let [at] = json::pointers(&body[within.clone()], [Some(pointer)]);
        let raw = std::str::from_utf8(&body[within.clone()][at?]).ok()?;
        raw.bytes().all(|b| b.is_ascii_digit()).then(|| raw.to_owned())
    })
}

struct Events<'a> {
    body: &'a [u8],
    object: String,
    out: Vec<BatchEvent>,
}

impl Events<'_> {
    fn push(&mut self, event_id: Option<String>, kind: &str, bytes: Range<usize>) {
        let event = match event_id.and_then(|id| checked_event_id(&id).ok()) {
            Some(event_id) => BatchEvent {
                event_id,
                event_type: Some(format!("{}.{kind}", self.object)),
                bytes,
                content: Content::Bytes,
            },
            None => malformed_element(self.body, bytes, "a Meta update without its id"),
        };
        // The same update twice in one delivery is one event.
        if !self.out.iter().any(|e| e.event_id == event.event_id) {
            self.out.push(event);
        }
    }

    fn hashed(&mut self, kind: &str, bytes: Range<usize>) {
        let id = payload_hash(&self.body[bytes.clone()]);
        self.push(Some(id), kind, bytes);
    }
}

/// Every update of a Meta delivery, as its own event.
pub(crate) fn split(body: &[u8]) -> Result<Vec<BatchEvent>, VerifyError> {
    let [object, entry] = json::pointers(body, [Some("/object"), Some("/entry")]);
    let object = object.and_then(|r| json::string_at(body, &r)).map(|o| o.into_owned()).unwrap_or_default();
    if object.is_empty() {
        return Err(VerifyError::MalformedPayload("a Meta delivery names no object"));
    }
    let entry = entry.ok_or(VerifyError::MalformedPayload("a Meta delivery has no entry list"))?;
    let mut events = Events { body, object, out: Vec::new() };
    for e in array(body, &entry)? {
        let changes = member(body, &e, "/changes");
        let messaging = member(body, &e, "/messaging");
        if changes.is_none() && messaging.is_none() {
            let object = events.object.clone();
            let id = payload_hash(&body[e.clone()]);
            events.out.push(BatchEvent { event_id: id, event_type: Some(object), bytes: e, content: Content::Bytes });
            continue;
        }
        if let Some(changes) = changes {
            for change in array(body, &changes)? {
                let before = events.out.len();
                let messages = member(body, &change, "/value/messages");
                let statuses = member(body, &change, "/value/statuses");
                if let Some(messages) = &messages {
                    for m in array(body, messages)? {
                        let id = text(body, &m, "/id");
                        events.push(id, "message", m);
                    }
                }
                if let Some(statuses) = &statuses {
                    for s in array(body, statuses)? {
                        let id =
                            text(body, &s, "/id").zip(text(body, &s, "/status")).map(|(i, st)| format!("{i}:{st}"));
                        events.push(id, "status", s);
                    }
                }
                // A change that names no message or status (or empty lists of
                // them): the change itself, by its bytes.
                if events.out.len() == before && !change_has_updates(body, messages.as_ref(), statuses.as_ref()) {
                    let field = text(body, &change, "/field").unwrap_or_else(|| "change".to_owned());
                    events.hashed(&field, change);
                }
            }
        }
        if let Some(messaging) = messaging {
            for m in array(body, &messaging)? {
                const KINDS: [&str; 7] = ["message", "postback", "reaction", "read", "delivery", "optin", "referral"];
                let kind = KINDS.iter().find(|k| member(body, &m, kind_pointer(k)).is_some()).unwrap_or(&"messaging");
                let mid = ["/message/mid", "/postback/mid", "/reaction/mid"].iter().find_map(|p| text(body, &m, p));
                match mid {
                    Some(mid) => events.push(Some(mid), kind, m),
                    None => events.hashed(kind, m),
                }
            }
        }
    }
    if events.out.is_empty() {
        return Err(VerifyError::MalformedPayload("the batch has no events"));
    }
    if events.out.len() > super::MAX_BATCH_EVENTS {
        return Err(VerifyError::MalformedPayload("the batch has more events than a delivery may carry"));
    }
    Ok(events.out)
}

/// Whether the lists a change names hold any element.
fn change_has_updates(body: &[u8], messages: Option<&Range<usize>>, statuses: Option<&Range<usize>>) -> bool {
    [messages, statuses].into_iter().flatten().any(|list| array(body, list).is_ok_and(|items| !items.is_empty()))
}

fn kind_pointer(kind: &str) -> &'static str {
    match kind {
        "message" => "/message",
        "postback" => "/postback",
        "reaction" => "/reaction",
        "read" => "/read",
        "delivery" => "/delivery",
        "optin" => "/optin",
        _ => "/referral",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(body: &str) -> Vec<(String, Option<String>)> {
        split(body.as_bytes()).unwrap().into_iter().map(|e| (e.event_id, e.event_type)).collect()
    }

    const TWO_MESSAGES_ONE_STATUS: &str = r#"{"object":"whatsapp_business_account","entry":[{"id":"102","changes":[{"value":{"messaging_product":"whatsapp","metadata":{"phone_number_id":"106"},"messages":[{"from":"1650","id":"wamid.A","type":"text","text":{"body":"hi"}},{"from":"1650","id":"wamid.B","type":"text","text":{"body":"there"}}],"statuses":[{"id":"wamid.OUT","status":"delivered","timestamp":"1"}]},"field":"messages"}]}]}"#;

    #[test]
    fn whatsapp_messages_and_statuses_are_each_their_own_event() {
        let t = |k: &str| Some(format!("whatsapp_business_account.{k}"));
        assert_eq!(
            ids(TWO_MESSAGES_ONE_STATUS),
            [
                ("wamid.A".to_owned(), t("message")),
                ("wamid.B".to_owned(), t("message")),
                ("wamid.OUT:delivered".to_owned(), t("status"))
            ]
        );
        // One message's statuses are distinct facts.
        let read = TWO_MESSAGES_ONE_STATUS.replace(r#""status":"delivered""#, r#""status":"read""#);
        assert_eq!(ids(&read)[2].0, "wamid.OUT:read");
        // Each event's payload is its element's exact bytes.
        let events = split(TWO_MESSAGES_ONE_STATUS.as_bytes()).unwrap();
        assert_eq!(
            &TWO_MESSAGES_ONE_STATUS.as_bytes()[events[1].bytes.clone()],
            br#"{"from":"1650","id":"wamid.B","type":"text","text":{"body":"there"}}"#
        );
    }

    #[test]
    fn messenger_entries_are_identified_by_their_mid_or_their_bytes() {
        let body = r#"{"object":"page","entry":[{"id":"1","time":1,"messaging":[{"sender":{"id":"7"},"recipient":{"id":"1"},"timestamp":1,"message":{"mid":"m_1","text":"a"}},{"sender":{"id":"7"},"recipient":{"id":"1"},"timestamp":2,"postback":{"mid":"m_2","payload":"P"}},{"sender":{"id":"7"},"recipient":{"id":"1"},"timestamp":3,"read":{"watermark":3}}]}]}"#;
        let got = ids(body);
        assert_eq!(got[0], ("m_1".to_owned(), Some("page.message".to_owned())));
        assert_eq!(got[1], ("m_2".to_owned(), Some("page.postback".to_owned())));
        assert_eq!(got[2].1.as_deref(), Some("page.read"));
        assert_eq!(got[2].0.len(), 64, "a read has no mid: the hash of its bytes");
    }

    #[test]
    fn a_change_without_messages_is_identified_by_its_bytes_and_a_message_without_an_id_is_kept_apart() {
        let body = r#"{"object":"instagram","entry":[{"id":"9","changes":[{"field":"comments","value":{"id":"c1","text":"x"}},{"field":"messages","value":{"messages":[{"from":"1","type":"text"}]}}]}]}"#;
        let got = ids(body);
        assert_eq!(got[0].1.as_deref(), Some("instagram.comments"));
        assert_eq!(got[0].0, payload_hash(br#"{"field":"comments","value":{"id":"c1","text":"x"}}"#));
        assert!(crate::verify::is_malformed_element(&got[1].0), "{got:?}");
        // A change whose lists are empty is still a fact: the change, by its bytes.
        let empty = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"messages":[],"statuses":[]}}]}]}"#;
        assert_eq!(
            ids(empty),
            [(
                payload_hash(br#"{"field":"messages","value":{"messages":[],"statuses":[]}}"#),
                Some("whatsapp_business_account.messages".to_owned())
            )]
        );
        for bad in ["{}", r#"{"object":"page"}"#, r#"{"object":"page","entry":[]}"#, r#"{"object":"page","entry":{}}"#]
        {
            assert!(matches!(split(bad.as_bytes()), Err(VerifyError::MalformedPayload(_))), "{bad}");
        }
    }
}
