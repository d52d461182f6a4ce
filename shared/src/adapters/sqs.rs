//! The work queue on SQS: one message per event key.

use aws_sdk_sqs::Client;
use serde::{Deserialize, Serialize};

use crate::identity::EventKey;
use crate::ledger::PortError;
use crate::ports::{Outgoing, Received, Redelivery, SEND_BATCH_MAX, WorkQueue};

/// The queue message body: the key, and the payload when it fits, so the
/// processor need not read the payload item (it checks the payload against
/// the record's hash; the payload item stays the durable copy). Messages
/// without a payload (re-drives, replays, wake-ups, large bodies, and those
/// of earlier releases) are read the same way.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkMessage {
    pub v: u32,
    pub key: String,
    /// The payload, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The payload in base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_b64: Option<String>,
}

/// The largest message the work queue is sent (SQS refuses more than
/// 256 KiB by default); a payload that would not fit travels by reference.
pub const MAX_MESSAGE_BYTES: usize = 240 * 1024;

impl WorkMessage {
    pub fn new(key: &EventKey) -> Self {
        Self { v: 1, key: key.as_str().to_owned(), body: None, body_b64: None }
    }

    /// The message carrying `payload` (UTF-8 as is, anything else in base64).
    pub fn with_payload(key: &EventKey, payload: &[u8]) -> Self {
        use base64::Engine;
        let mut m = Self::new(key);
        match std::str::from_utf8(payload) {
            Ok(text) => m.body = Some(text.to_owned()),
            Err(_) => m.body_b64 = Some(base64::engine::general_purpose::STANDARD.encode(payload)),
        }
        m
    }

    /// The payload the message carries, if any.
    pub fn payload(&self) -> Option<Vec<u8>> {
        use base64::Engine;
        match (&self.body, &self.body_b64) {
            (Some(text), _) => Some(text.as_bytes().to_vec()),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).ok(),
            (None, None) => None,
        }
    }
}

#[derive(Clone)]
pub struct SqsQueue {
    client: Client,
    queue_url: String,
}

impl SqsQueue {
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self { client, queue_url: queue_url.into() }
    }
}

/// The body sent for `message`: with its payload when that fits in
/// [`MAX_MESSAGE_BYTES`], else the key alone (the processor reads the
/// payload item).
pub fn message_body(message: &WorkMessage) -> Result<String, PortError> {
    let encode = |m: &WorkMessage| {
        serde_json::to_string(m).map_err(|e| PortError::Unavailable { service: "sqs", message: e.to_string() })
    };
    let body = encode(message)?;
    if body.len() <= MAX_MESSAGE_BYTES {
        return Ok(body);
    }
    encode(&WorkMessage { v: message.v, key: message.key.clone(), body: None, body_b64: None })
}

/// The work message for one outgoing send.
pub fn work_message(m: &Outgoing<'_>) -> WorkMessage {
    match m.payload {
        Some(p) => WorkMessage::with_payload(m.key, p),
        None => WorkMessage::new(m.key),
    }
}

/// The most `SendMessageBatch` requests of one `send_all` in flight at once.
pub const BATCHES_IN_FLIGHT: usize = 10;

/// Cuts `bodies` into the requests of a `SendMessageBatch`: at most
/// [`SEND_BATCH_MAX`] messages and [`MAX_MESSAGE_BYTES`] of bodies each (a
/// body alone is never larger). Returns index ranges, in order.
pub fn batches(bodies: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, &len) in bodies.iter().enumerate() {
        if i > start && (i - start == SEND_BATCH_MAX || bytes + len > MAX_MESSAGE_BYTES) {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    if start < bodies.len() {
        out.push(start..bodies.len());
    }
    out
}

/// The `MessageGroupId` a tenant's messages are sent with. A record without
/// a tenant (none is ever written so) is sent without one, as its own group,
/// rather than refused by SQS and taken for the caller's fault.
pub fn group(tenant: &str) -> Option<String> {
    (!tenant.is_empty()).then(|| tenant.to_owned())
}

impl SqsQueue {
    /// One `SendMessage`; `MessageGroupId` = the tenant (a fair queue).
    async fn send_message(&self, message: &WorkMessage, tenant: &str) -> Result<(), PortError> {
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(message_body(message)?)
            .set_message_group_id(group(tenant))
            .send()
            .await
            .map_err(|e| super::port_error("sqs", &e))?;
        Ok(())
    }

    /// One `SendMessageBatch` of `bodies` (with their tenants); one result
    /// each, in order.
    async fn send_batch(&self, bodies: &[(String, &str)]) -> Vec<Result<(), PortError>> {
        let entries: Vec<(&str, Option<String>, u32)> =
            bodies.iter().map(|(body, tenant)| (body.as_str(), group(tenant), 0)).collect();
        self.batch(&entries).await
    }

    /// One `SendMessageBatch` of (body, group, delay in seconds); one result
    /// each, in order.
    async fn batch(&self, bodies: &[(&str, Option<String>, u32)]) -> Vec<Result<(), PortError>> {
        use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
        let mut entries = Vec::with_capacity(bodies.len());
        for (i, (body, group, delay_s)) in bodies.iter().enumerate() {
            let entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(*body)
                .set_message_group_id(group.clone())
                .set_delay_seconds((*delay_s > 0).then(|| (*delay_s).min(900) as i32))
                .build()
                .map_err(|e| PortError::Unavailable { service: "sqs", message: e.to_string() });
            match entry {
                Ok(e) => entries.push(e),
                Err(e) => {
                    return bodies
                        .iter()
                        .map(|_| Err(PortError::Unavailable { service: "sqs", message: e.to_string() }))
                        .collect();
                }
            }
        }
        let out =
            match self.client.send_message_batch().queue_url(&self.queue_url).set_entries(Some(entries)).send().await {
                Ok(out) => out,
                Err(e) => return bodies.iter().map(|_| Err(super::port_error("sqs", &e))).collect(),
            };
        let mut results: Vec<Result<(), PortError>> = bodies
            .iter()
            .map(|_| Err(PortError::Unavailable { service: "sqs", message: "no result for the batch entry".into() }))
            .collect();
        for ok in out.successful {
            if let Some(r) = ok.id.parse::<usize>().ok().and_then(|i| results.get_mut(i)) {
                *r = Ok(());
            }
        }
        for failed in out.failed {
            let Some(r) = failed.id.parse::<usize>().ok().and_then(|i| results.get_mut(i)) else { continue };
            let message = failed.message.unwrap_or_default();
            *r = Err(if failed.sender_fault {
                PortError::Caller { service: "sqs", code: failed.code, message }
            } else {
                PortError::Unavailable { service: "sqs", message: format!("{}: {message}", failed.code) }
            });
        }
        results
    }
}

impl WorkQueue for SqsQueue {
    async fn send(&self, key: &EventKey, tenant: &str) -> Result<(), PortError> {
        self.send_message(&WorkMessage::new(key), tenant).await
    }

    async fn send_with_payload(&self, key: &EventKey, tenant: &str, payload: &[u8]) -> Result<(), PortError> {
        self.send_message(&WorkMessage::with_payload(key, payload), tenant).await
    }

    /// One `SendMessage` for a single message, else `SendMessageBatch`es.
    async fn send_all(&self, messages: &[Outgoing<'_>]) -> Vec<Result<(), PortError>> {
        if let [one] = messages {
            return vec![self.send_message(&work_message(one), one.tenant).await];
        }
        let mut bodies = Vec::with_capacity(messages.len());
        for m in messages {
            match message_body(&work_message(m)) {
                Ok(b) => bodies.push(Some((b, m.tenant))),
                Err(_) => bodies.push(None),
            }
        }
        let sendable: Vec<(usize, (String, &str))> =
            bodies.into_iter().enumerate().filter_map(|(i, b)| b.map(|b| (i, b))).collect();
        let mut by_index: Vec<Option<Result<(), PortError>>> = messages.iter().map(|_| None).collect();
        let lens: Vec<usize> = sendable.iter().map(|(_, (b, _))| b.len()).collect();
        // Up to BATCHES_IN_FLIGHT requests at once: one round trip for up to
        // 100 messages.
        let ranges = batches(&lens);
        let chunks: Vec<Vec<(String, &str)>> =
            ranges.iter().map(|range| sendable[range.clone()].iter().map(|(_, b)| b.clone()).collect()).collect();
        let mut answers = Vec::with_capacity(chunks.len());
        for wave in chunks.chunks(BATCHES_IN_FLIGHT) {
            answers.extend(futures::future::join_all(wave.iter().map(|chunk| self.send_batch(chunk))).await);
        }
        for (range, answer) in ranges.into_iter().zip(answers) {
            for (j, r) in range.zip(answer) {
                by_index[sendable[j].0] = Some(r);
            }
        }
        by_index
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(PortError::Unavailable { service: "sqs", message: "the message could not be encoded".into() })
                })
            })
            .collect()
    }
}

impl Redelivery for SqsQueue {
    /// One `ChangeMessageVisibility`, rounded up to whole seconds.
    async fn show_again(&self, receipt: &str, delay_ms: i64) -> Result<(), PortError> {
        self.client
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .visibility_timeout(visibility_secs(delay_ms))
            .send()
            .await
            .map_err(|e| super::port_error("sqs", &e))?;
        Ok(())
    }
}

/// SQS caps a message's visibility at 12 hours.
pub const MAX_VISIBILITY_SECS: i64 = 43_200;

/// The visibility timeout (whole seconds) that shows a message again after
/// `delay_ms`: rounded up, so it never comes back before it is due.
pub fn visibility_secs(delay_ms: i64) -> i32 {
    let delay_ms = delay_ms.max(0);
    let secs = delay_ms / 1000 + i64::from(delay_ms % 1000 != 0);
    secs.clamp(1, MAX_VISIBILITY_SECS) as i32
}

/// Whether this is the message's last receive before the queue moves it to
/// the dead-letter queue (`ApproximateReceiveCount`).
pub fn last_receive(receive_count: Option<&str>) -> bool {
    receive_count.and_then(|c| c.trim().parse::<i64>().ok()).is_some_and(|c| c >= i64::from(MAX_RECEIVE_COUNT))
}

/// A received SQS message as the processor's batch takes it.
pub fn received(
    message_id: String,
    receipt: Option<String>,
    body: Option<&str>,
    receive_count: Option<&str>,
    group: Option<&str>,
) -> Received {
    let work = body
        .and_then(|b| serde_json::from_str::<WorkMessage>(b).ok())
        .and_then(|m| EventKey::from_stored(&m.key).map(|k| (k, m.payload())));
    Received { message_id, receipt, work, last_receive: last_receive(receive_count), group: group.map(str::to_owned) }
}

/// The work queue's visibility timeout: at least 6 x the processor timeout (20 s).
pub const WORK_QUEUE_VISIBILITY_SECS: i32 = 120;
/// Receives before a work message moves to the dead-letter queue.
pub const MAX_RECEIVE_COUNT: i32 = 10;

/// Creates a standard queue (idempotent) and returns its URL.
/// The ARN of the queue at `url`.
pub async fn queue_arn(client: &Client, url: &str) -> Result<String, String> {
    let attrs = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| super::error_chain(&e))?;
    let arn = attrs.attributes.unwrap_or_default().remove(&aws_sdk_sqs::types::QueueAttributeName::QueueArn);
    arn.ok_or_else(|| "the queue has no ARN".to_owned())
}

pub async fn create_queue(client: &Client, name: &str) -> Result<String, String> {
    let out = client.create_queue().queue_name(name).send().await.map_err(|e| super::error_chain(&e))?;
    out.queue_url.ok_or_else(|| "CreateQueue returned no URL".to_owned())
}

/// The URLs of the work queue and its dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkQueues {
    pub work_url: String,
    pub dead_letter_url: String,
}

/// Creates the work queue as the SAM template defines it: visibility
/// [`WORK_QUEUE_VISIBILITY_SECS`], redrive to `<name>-dlq` after
/// [`MAX_RECEIVE_COUNT`] receives (idempotent).
pub async fn create_work_queues(client: &Client, name: &str) -> Result<WorkQueues, String> {
    use aws_sdk_sqs::types::QueueAttributeName;
    let dead_letter_url = create_queue(client, &format!("{name}-dlq")).await?;
    let attrs = client
        .get_queue_attributes()
        .queue_url(&dead_letter_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| super::error_chain(&e))?;
    let dlq_arn = attrs
        .attributes
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .ok_or("dead-letter queue has no ARN")?;
    let redrive =
        serde_json::json!({ "deadLetterTargetArn": dlq_arn, "maxReceiveCount": MAX_RECEIVE_COUNT }).to_string();
    let out = client
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::VisibilityTimeout, WORK_QUEUE_VISIBILITY_SECS.to_string())
        .attributes(QueueAttributeName::RedrivePolicy, redrive)
        .send()
        .await
        .map_err(|e| super::error_chain(&e))?;
    let work_url = out.queue_url.ok_or("CreateQueue returned no URL")?;
    Ok(WorkQueues { work_url, dead_letter_url })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The payload a message carries is the bytes it was made with,
        /// UTF-8 or not, also after a JSON round trip.
        #[test]
        fn payloads_round_trip_through_json(
            payload in prop_oneof![prop::collection::vec(any::<u8>(), 0..300), any::<String>().prop_map(String::into_bytes)],
            id in "[^\\x00]{1,20}",
        ) {
            let key = EventKey::new("stripe", "e", &id);
            let m = WorkMessage::with_payload(&key, &payload);
            prop_assert_eq!(m.payload(), Some(payload.clone()));
            let json = serde_json::to_string(&m).unwrap();
            let back: WorkMessage = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(&back, &m);
            prop_assert_eq!(back.payload(), Some(payload));
            prop_assert_eq!(EventKey::from_stored(&back.key), Some(key));
        }

        /// Garbage never panics; what parses yields a payload or none.
        #[test]
        fn garbage_never_panics(
            text in prop_oneof![
                any::<String>(),
                r#"\{"v":[0-9]{1,3},"key":"[a-z#]{0,12}"(,"body(_b64)?":("[ -~]{0,12}"|null|1))?\}"#,
            ],
        ) {
            if let Ok(m) = serde_json::from_str::<WorkMessage>(&text) {
                let _ = m.payload();
                let _ = EventKey::from_stored(&m.key);
            }
        }
    }
}

#[cfg(test)]
mod redelivery_tests {
    use super::*;

    #[test]
    fn batches_hold_ten_messages_and_never_more_than_a_message_of_bytes() {
        assert_eq!(batches(&[]), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(batches(&[10; 3]), vec![std::ops::Range { start: 0, end: 3 }]);
        assert_eq!(batches(&[10; 21]), [0..10, 10..20, 20..21]);
        let big = MAX_MESSAGE_BYTES / 2 + 1;
        assert_eq!(batches(&[big, big, big]), [0..1, 1..2, 2..3], "two halves and a byte do not fit one request");
        assert_eq!(batches(&[MAX_MESSAGE_BYTES, 1]), [0..1, 1..2]);
        assert_eq!(batches(&[MAX_MESSAGE_BYTES / 2, MAX_MESSAGE_BYTES / 2, 1]), [0..2, 2..3]);
    }

    #[test]
    fn visibility_delay_is_rounded_up_never_early() {
        assert_eq!(visibility_secs(1_000), 1);
        assert_eq!(visibility_secs(1_001), 2, "1.001 s must not come back after 1 s");
        assert_eq!(visibility_secs(1_999), 2);
        assert_eq!(visibility_secs(29_500), 30);
        assert_eq!(visibility_secs(0), 1, "at least one second");
        assert_eq!(visibility_secs(-5), 1);
        assert_eq!(visibility_secs(i64::MAX), MAX_VISIBILITY_SECS as i32, "capped at SQS's 12 hours");
    }

    #[test]
    fn only_the_receive_before_the_dead_letter_redrive_is_the_last() {
        assert!(!last_receive(Some("1")));
        assert!(!last_receive(Some("9")));
        assert!(last_receive(Some("10")));
        assert!(last_receive(Some("11")));
        assert!(!last_receive(None), "unknown: keep the message");
        assert!(!last_receive(Some("many")));
    }
}

/// The delivery queue on SQS (`HOOKLEDGER_DELIVERY_QUEUE_URL`): one message
/// per delivery (or drain step), `MessageGroupId` its destination (a fair
/// queue: one destination's backlog never delays another's), its retry's
/// backoff the message's own `DelaySeconds`.
#[derive(Clone)]
pub struct SqsDeliveries {
    queue: SqsQueue,
}

impl SqsDeliveries {
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self { queue: SqsQueue::new(client, queue_url) }
    }
}

/// A delivery queue message's body.
pub fn delivery_body(message: &crate::ports::DeliveryMessage) -> String {
    serde_json::to_string(message).unwrap_or_else(|e| unreachable!("a delivery message serialises: {e}"))
}

/// A delivery queue message read back (`None`: not one).
pub fn delivery_message(body: &str) -> Option<crate::ports::DeliveryMessage> {
    serde_json::from_str(body).ok()
}

impl crate::ports::DeliveryQueue for SqsDeliveries {
    fn hand_over<'a>(&'a self, messages: &'a [crate::ports::Handover]) -> crate::ports::HandedOver<'a> {
        Box::pin(async move {
            let bodies: Vec<String> = messages.iter().map(|m| delivery_body(&m.message)).collect();
            let mut out = Vec::with_capacity(messages.len());
            for (chunk, bodies) in messages.chunks(SEND_BATCH_MAX).zip(bodies.chunks(SEND_BATCH_MAX)) {
                let entries: Vec<(&str, Option<String>, u32)> = chunk
                    .iter()
                    .zip(bodies)
                    .map(|(m, b)| {
                        let group = crate::message::message_group_id(&m.group).into_owned();
                        (b.as_str(), (!group.is_empty()).then_some(group), m.delay_s)
                    })
                    .collect();
                out.extend(self.queue.batch(&entries).await);
            }
            out
        })
    }
}
