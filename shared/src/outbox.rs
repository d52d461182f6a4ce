//! Effectively-once side effects outside DynamoDB: the transactional outbox.
//!
//! A projection's notification is written as an outbox item in the same
//! transaction as its state change and the completion marker. A dispatcher
//! then claims the item (conditional update), publishes to SNS with a stable
//! idempotency key derived from the event identity (message attribute always;
//! FIFO deduplication id when the topic is FIFO), and marks it sent. A crash
//! between publish and mark leaves the item claimed; once that claim lapses
//! the item is published again — with the same key, so consumers (and FIFO
//! topics) drop the repeat.
//!
//! ```text
//! PENDING(due_at) ──claim(token)──▶ SENDING(token, due_at = lease end) ──mark(token)──▶ SENT
//!    ▲                                │        │
//!    └── publish failed: backoff ◀────┘        └── attempts exhausted ──▶ DEAD (OUTBOX_DEAD# partition)
//!        (due_at = now + delay)     lease lapsed (dispatcher died): claimable again
//! ```
//!
//! Every write carries the dispatcher's token, and a write whose condition
//! fails looks at the item it met: when that item carries our own token, the
//! write was ours and committed (the SDK retried it after a lost
//! acknowledgement), and the dispatcher continues as the owner. The writes
//! are the [`OutboxStore`] port's (DynamoDB: `adapters::dynamodb::outbox`,
//! expressions in `adapters::dynamodb::conditions`); the publish is the
//! [`Publisher`]'s (SNS: `adapters::sns`).

use crate::clock::Ambient;
pub use crate::config::DispatchPolicy;
use crate::ledger::PortError;
pub use crate::message::Dispatched;
use crate::message::{Held, OutboxClaim};
use crate::ports::{Dispatch, OutboxStore, Publisher};

/// How long a dispatcher may hold an outbox item between claim and mark.
pub const DISPATCH_LEASE_MS: i64 = 30_000;

/// Where a crash is injected in tests ("die between publish and mark").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DispatchFault {
    #[default]
    None,
    AfterPublishBeforeMark,
}

/// Claims, publishes and marks outbox items (see the module docs).
#[derive(Clone)]
pub struct Dispatcher<S, P> {
    store: S,
    publisher: P,
    policy: DispatchPolicy,
    ambient: Ambient,
    pub fault: DispatchFault,
}

impl<S: OutboxStore, P: Publisher> Dispatcher<S, P> {
    pub fn with_ports(store: S, publisher: P) -> Self {
        Self {
            store,
            publisher,
            policy: DispatchPolicy::default(),
            ambient: Ambient::system(),
            fault: DispatchFault::None,
        }
    }

    /// Draws its claim tokens and backoff jitter from `ambient`.
    pub fn with_ambient(mut self, ambient: Ambient) -> Self {
        self.ambient = ambient;
        self
    }

    pub fn with_policy(mut self, policy: DispatchPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Claims, publishes and marks one outbox item. A failed publish puts the
    /// item back with a backoff (or DEAD when its attempts are exhausted) and
    /// is reported as `Retrying`/`Dead`, not as an error; `Err` means the
    /// ledger itself failed (the item stays as it was, or claimed until its
    /// lease lapses).
    pub async fn dispatch(&self, id: &str, now_ms: i64) -> Result<Dispatched, PortError> {
        let token = self.ambient.token();
        let item = match self.store.claim(id, &token, now_ms, now_ms + DISPATCH_LEASE_MS).await? {
            OutboxClaim::Claimed(item) => item,
            OutboxClaim::Skipped => return Ok(Dispatched::Skipped),
        };
        if item.attempts > self.policy.max_attempts {
            // Dispatchers kept dying before they could record an outcome.
            let error = format!("{} claims without an outcome", item.attempts - 1);
            return self.failed(id, item.shard, &token, item.attempts, error, now_ms).await;
        }
        if let Err(error) =
            self.publisher.publish(&item.topic_arn, &item.body, &item.idempotency_key, &item.group).await
        {
            return self.failed(id, item.shard, &token, item.attempts, error, now_ms).await;
        }
        metrics::counter!("outbox_published").increment(1);

        if self.fault == DispatchFault::AfterPublishBeforeMark {
            return Err(PortError::Unavailable {
                service: "injected",
                message: "crash after publish, before mark".into(),
            });
        }
        if self.store.mark_sent(id, &token, now_ms).await? == Held::Lapsed {
            tracing::warn!(outbox = %id,
                "published after the dispatch lease lapsed; the new owner republishes with the same key");
        }
        Ok(Dispatched::Published)
    }

    /// Records a failed attempt: PENDING again after a backoff, or DEAD when
    /// the attempts are exhausted.
    async fn failed(
        &self,
        id: &str,
        shard: u32,
        token: &str,
        attempts: u32,
        error: String,
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        let dead = attempts >= self.policy.max_attempts;
        let held = if dead {
            self.store.dead(id, token, shard, &error, now_ms).await?
        } else {
            let delay = self.policy.backoff.delay_ms(attempts, self.ambient.jitter());
            self.store.back_off(id, token, now_ms + delay, &error, now_ms).await?
        };
        if held == Held::Lapsed {
            tracing::warn!(outbox = %id, "dispatch lease lapsed before the failure was recorded");
        }
        metrics::counter!("outbox_failed").increment(1);
        if dead {
            metrics::counter!("outbox_dead_lettered").increment(1);
            tracing::error!(outbox = %id, attempts, error = %error, "outbox item is DEAD: attempts exhausted");
            Ok(Dispatched::Dead { attempts, error })
        } else {
            tracing::warn!(outbox = %id, attempts, error = %error, "outbox publish failed; retrying after a backoff");
            Ok(Dispatched::Retrying { attempts, error })
        }
    }

    /// Publishes outbox items that are still pending (or whose dispatcher
    /// died) from the `due` index shards `out#000..`, oldest first, at most
    /// `limit`. Items younger than `grace_ms` are left to their processor.
    /// One item's or one shard's failure does not stop the others (it is
    /// rescheduled or logged); returns how many were published, or the first
    /// error when a query failed and nothing was published.
    pub async fn sweep(&self, shards: u32, now_ms: i64, grace_ms: i64, limit: usize) -> Result<usize, PortError> {
        let mut published = 0;
        let mut failed = None;
        for shard in 0..shards {
            // One shard's failed query does not stop the others.
            let due = match self.store.due(shard, now_ms - grace_ms, limit).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(shard, error = %e, "outbox due query failed");
                    failed.get_or_insert(e);
                    continue;
                }
            };
            for id in due {
                if published >= limit {
                    return Ok(published);
                }
                match self.dispatch(&id, now_ms).await {
                    Ok(Dispatched::Published) => published += 1,
                    Ok(_) => {}
                    Err(e) => tracing::warn!(outbox = %id, error = %e, "outbox dispatch failed"),
                }
            }
        }
        match failed {
            // Nothing could be looked at or sent: say so.
            Some(e) if published == 0 => Err(e),
            _ => Ok(published),
        }
    }
}

impl<S: OutboxStore, P: Publisher> Dispatch for Dispatcher<S, P> {
    async fn dispatch(&self, id: &str, now_ms: i64) -> Result<Dispatched, PortError> {
        Dispatcher::dispatch(self, id, now_ms).await
    }

    async fn due(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
        self.store.due(shard, up_to, limit).await
    }
}

#[cfg(test)]
mod tests;
