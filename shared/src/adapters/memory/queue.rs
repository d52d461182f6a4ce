//! The work queue in memory, as an SQS standard queue with a redrive
//! policy: messages are the adapter's own bodies (`adapters::sqs`), a
//! received message is invisible for the visibility timeout, each receive
//! counts, and a message received more than `max_receives` times moves to
//! the dead-letter queue instead of being delivered.

use super::World;
use crate::adapters::sqs::{
    MAX_RECEIVE_COUNT, WORK_QUEUE_VISIBILITY_SECS, WorkMessage, message_body, received, work_message,
};
use crate::identity::EventKey;
use crate::ledger::PortError;
use crate::ports::{Outgoing, Received, Redelivery, WorkQueue};

/// One message on the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: String,
    pub body: String,
    pub visible_at_ms: i64,
    pub receives: u32,
    /// The receipt of its latest receive.
    pub receipt: Option<String>,
    /// Its `MessageGroupId` (the tenant).
    pub group: Option<String>,
}

#[derive(Debug, Default)]
pub struct QueueState {
    pub messages: Vec<Message>,
    pub dead: Vec<Message>,
    sent: u64,
}

/// The queue view of the world.
#[derive(Clone)]
pub struct MemQueue {
    world: World,
    visibility_ms: i64,
    max_receives: u32,
}

impl MemQueue {
    pub(super) fn new(world: World) -> Self {
        Self {
            world,
            visibility_ms: i64::from(WORK_QUEUE_VISIBILITY_SECS) * 1000,
            max_receives: MAX_RECEIVE_COUNT.unsigned_abs(),
        }
    }

    pub fn with_max_receives(mut self, n: u32) -> Self {
        self.max_receives = n.max(1);
        self
    }

    /// Every send from now on fails (the queue is down).
    pub fn fail_sends(&self) {
        self.world.inject("queue.send", 0, None, super::Fault::Unavailable);
    }

    /// The event keys sent, in order, whether received since or not.
    pub fn keys(&self) -> Vec<EventKey> {
        let st = self.world.state();
        st.queue.messages.iter().chain(&st.queue.dead).filter_map(|m| key_of(&m.body)).collect()
    }

    /// The event keys sent with the group (tenant) each was sent under, in order.
    pub fn groups(&self) -> Vec<(EventKey, Option<String>)> {
        let st = self.world.state();
        st.queue
            .messages
            .iter()
            .chain(&st.queue.dead)
            .filter_map(|m| Some((key_of(&m.body)?, m.group.clone())))
            .collect()
    }

    /// Every message body sent, waiting, in flight or dead, in order.
    pub fn bodies(&self) -> Vec<String> {
        let st = self.world.state();
        st.queue.messages.iter().chain(&st.queue.dead).map(|m| m.body.clone()).collect()
    }

    /// Messages waiting or in flight.
    pub fn len(&self) -> usize {
        self.world.state().queue.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys on the dead-letter queue.
    pub fn dead_keys(&self) -> Vec<EventKey> {
        self.world.state().queue.dead.iter().filter_map(|m| key_of(&m.body)).collect()
    }

    /// Receives up to `max` visible messages, as the processor's trigger
    /// hands them over (decoded by the SQS adapter's own `received`).
    pub fn receive(&self, max: usize) -> Vec<Received> {
        let now = self.world.ambient().clock.now_ms();
        let mut st = self.world.state();
        let mut out = Vec::new();
        let mut i = 0;
        while i < st.queue.messages.len() && out.len() < max {
            if st.queue.messages[i].visible_at_ms > now {
                i += 1;
                continue;
            }
            if st.queue.messages[i].receives >= self.max_receives {
                let m = st.queue.messages.remove(i);
                st.queue.dead.push(m);
                continue;
            }
            let receipt = format!("r-{}", self.world.ambient().entropy.token_simple());
            let m = &mut st.queue.messages[i];
            m.receives += 1;
            m.visible_at_ms = now + self.visibility_ms;
            m.receipt = Some(receipt.clone());
            let count = m.receives.to_string();
            out.push(received(m.id.clone(), Some(receipt), Some(&m.body), Some(&count), m.group.as_deref()));
            i += 1;
        }
        out
    }

    /// Puts a message body on the queue as it is (one that is not a work
    /// message, say).
    pub fn send_raw(&self, body: &str) {
        let now = self.world.ambient().clock.now_ms();
        let mut st = self.world.state();
        st.queue.sent += 1;
        let id = format!("m-{:06}", st.queue.sent);
        st.queue.messages.push(Message {
            id,
            body: body.to_owned(),
            visible_at_ms: now,
            receives: 0,
            receipt: None,
            group: None,
        });
    }

    /// Deletes a received message (the batch's success); a stale receipt
    /// deletes nothing.
    pub fn delete(&self, receipt: &str) -> bool {
        let mut st = self.world.state();
        let before = st.queue.messages.len();
        st.queue.messages.retain(|m| m.receipt.as_deref() != Some(receipt));
        st.queue.messages.len() != before
    }

    fn send_body(&self, message: &WorkMessage, tenant: &str) -> Result<(), PortError> {
        let body = message_body(message)?;
        let now = self.world.ambient().clock.now_ms();
        self.world.call_on("queue.send", &message.key, |_, st| {
            st.queue.sent += 1;
            let id = format!("m-{:06}", st.queue.sent);
            st.queue.messages.push(Message {
                id,
                body: body.clone(),
                visible_at_ms: now,
                receives: 0,
                receipt: None,
                group: crate::adapters::sqs::group(tenant),
            });
            Ok(())
        })
    }
}

fn key_of(body: &str) -> Option<EventKey> {
    serde_json::from_str::<WorkMessage>(body).ok().and_then(|m| EventKey::from_stored(&m.key))
}

/// Each message of a `send_all` is one `queue.send` call of the world, so a
/// fault injected on one key fails that entry alone, as `SendMessageBatch`
/// reports failures per entry.
impl WorkQueue for MemQueue {
    async fn send(&self, key: &EventKey, tenant: &str) -> Result<(), PortError> {
        self.send_body(&WorkMessage::new(key), tenant)
    }

    async fn send_with_payload(&self, key: &EventKey, tenant: &str, payload: &[u8]) -> Result<(), PortError> {
        self.send_body(&WorkMessage::with_payload(key, payload), tenant)
    }

    async fn send_all(&self, messages: &[Outgoing<'_>]) -> Vec<Result<(), PortError>> {
        messages.iter().map(|m| self.send_body(&work_message(m), m.tenant)).collect()
    }
}

impl Redelivery for MemQueue {
    async fn show_again(&self, receipt: &str, delay_ms: i64) -> Result<(), PortError> {
        let now = self.world.ambient().clock.now_ms();
        let delay = i64::from(crate::adapters::sqs::visibility_secs(delay_ms)) * 1000;
        self.world.call("queue.show_again", |_, st| {
            match st.queue.messages.iter_mut().find(|m| m.receipt.as_deref() == Some(receipt)) {
                Some(m) => {
                    m.visible_at_ms = now + delay;
                    Ok(())
                }
                None => Err(PortError::Unavailable { service: "sqs", message: "ReceiptHandleIsInvalid".into() }),
            }
        })
    }
}
