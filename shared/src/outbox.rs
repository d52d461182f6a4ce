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
mod tests {
    use std::collections::{BTreeMap, HashSet};
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::*;
    // The statuses as the DynamoDB adapter writes them.
    const PENDING: &str = "PENDING";
    const SENDING: &str = "SENDING";
    const SENT: &str = "SENT";
    const DEAD: &str = "DEAD";
    use crate::backoff::Backoff;
    use crate::message::OutboxItem;

    const NOW: i64 = 1_700_000_000_000;
    const GRACE: i64 = 60_000;
    const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:entitlements";

    // ------------------------------------------------------------ in-memory ports

    /// An outbox item as the table holds it (the attributes the conditions read).
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Stored {
        status: &'static str,
        idempotency_key: String,
        topic_arn: String,
        group: String,
        body: String,
        shard: u32,
        /// `due_at`; `None`: out of the `due` index (SENT, DEAD).
        due_at: Option<i64>,
        token: Option<String>,
        /// `dispatch_until`: when the current claim lapses.
        until: Option<i64>,
        attempts: u32,
        last_error: Option<String>,
        sent_at: Option<i64>,
        dead_at: Option<i64>,
    }

    impl Stored {
        /// A PENDING item as the processor's commit writes it, due at `due_at`.
        fn pending(key: &str, shard: u32, due_at: i64) -> Self {
            Self {
                status: PENDING,
                idempotency_key: key.to_owned(),
                topic_arn: TOPIC.to_owned(),
                group: format!("cus_{key}"),
                body: format!(r#"{{"subscription":"sub_{key}","status":"active"}}"#),
                shard,
                due_at: Some(due_at),
                token: None,
                until: None,
                attempts: 0,
                last_error: None,
                sent_at: None,
                dead_at: None,
            }
        }

        /// Claimed by another dispatcher until `until`, after `attempts` claims.
        fn sending(key: &str, shard: u32, until: i64, attempts: u32) -> Self {
            Self {
                status: SENDING,
                due_at: Some(until),
                token: Some("another-dispatcher".into()),
                until: Some(until),
                attempts,
                ..Self::pending(key, shard, until)
            }
        }
    }

    #[derive(Default)]
    struct Table {
        items: BTreeMap<String, Stored>,
        /// Items whose every write fails (throttling, say).
        failing: HashSet<String>,
    }

    /// The outbox items in memory, with the conditions of
    /// `adapters::dynamodb::conditions` (`outbox_claim`, `outbox_sent`,
    /// `outbox_back_off`, `outbox_dead`) and the refusal handling of
    /// `adapters::dynamodb::outbox` (a refused write that meets our token was ours).
    #[derive(Clone, Default)]
    struct MemOutbox(Arc<Mutex<Table>>);

    impl MemOutbox {
        fn table(&self) -> MutexGuard<'_, Table> {
            self.0.lock().unwrap()
        }

        fn put(&self, id: &str, item: Stored) {
            self.table().items.insert(id.to_owned(), item);
        }

        fn get(&self, id: &str) -> Stored {
            self.table().items.get(id).cloned().unwrap_or_else(|| panic!("no item {id}"))
        }

        fn fail_writes_of(&self, id: &str) {
            self.table().failing.insert(id.to_owned());
        }

        fn status(&self, id: &str) -> &'static str {
            self.get(id).status
        }

        /// `outbox_claim`, synchronously (also what another dispatcher does meanwhile).
        fn claim_now(&self, id: &str, token: &str, now_ms: i64, until_ms: i64) -> Result<OutboxClaim, PortError> {
            let mut table = self.table();
            if table.failing.contains(id) {
                return Err(PortError::Throttled { service: "dynamodb" });
            }
            let Some(item) = table.items.get_mut(id) else { return Ok(OutboxClaim::Skipped) };
            let claimable = match item.status {
                PENDING => item.due_at.is_none_or(|due| due <= now_ms),
                SENDING => item.until.is_some_and(|until| until < now_ms),
                _ => false,
            };
            if claimable {
                item.status = SENDING;
                item.token = Some(token.to_owned());
                item.until = Some(until_ms);
                item.due_at = Some(until_ms);
                item.attempts += 1;
                return Ok(OutboxClaim::Claimed(claimed(id, item)));
            }
            if item.status == SENDING && item.token.as_deref() == Some(token) {
                return Ok(OutboxClaim::Claimed(claimed(id, item)));
            }
            Ok(OutboxClaim::Skipped)
        }

        /// The fence of every write after the claim (`dispatch_fenced`).
        fn fenced(&self, id: &str, token: &str, write: impl FnOnce(&mut Stored)) -> Result<Held, PortError> {
            let mut table = self.table();
            if table.failing.contains(id) {
                return Err(PortError::Throttled { service: "dynamodb" });
            }
            match table.items.get_mut(id) {
                Some(item) if item.status == SENDING && item.token.as_deref() == Some(token) => {
                    item.until = None;
                    write(item);
                    Ok(Held::Yes)
                }
                // Our own retried write after a lost acknowledgement.
                Some(item) if item.token.as_deref() == Some(token) => Ok(Held::Yes),
                _ => Ok(Held::Lapsed),
            }
        }
    }

    fn claimed(id: &str, item: &Stored) -> OutboxItem {
        OutboxItem {
            id: id.to_owned(),
            idempotency_key: item.idempotency_key.clone(),
            topic_arn: item.topic_arn.clone(),
            group: item.group.clone(),
            body: item.body.clone(),
            attempts: item.attempts,
            shard: item.shard,
        }
    }

    impl OutboxStore for MemOutbox {
        async fn claim(&self, id: &str, token: &str, now_ms: i64, until_ms: i64) -> Result<OutboxClaim, PortError> {
            self.claim_now(id, token, now_ms, until_ms)
        }

        async fn mark_sent(&self, id: &str, token: &str, now_ms: i64) -> Result<Held, PortError> {
            self.fenced(id, token, |item| {
                item.status = SENT;
                item.sent_at = Some(now_ms);
                item.due_at = None;
            })
        }

        async fn back_off(
            &self,
            id: &str,
            token: &str,
            next_at_ms: i64,
            error: &str,
            _now_ms: i64,
        ) -> Result<Held, PortError> {
            self.fenced(id, token, |item| {
                item.status = PENDING;
                item.last_error = Some(error.to_owned());
                item.due_at = Some(next_at_ms);
            })
        }

        async fn dead(&self, id: &str, token: &str, shard: u32, error: &str, now_ms: i64) -> Result<Held, PortError> {
            self.fenced(id, token, |item| {
                item.status = DEAD;
                item.shard = shard;
                item.last_error = Some(error.to_owned());
                item.dead_at = Some(now_ms);
                item.due_at = None;
            })
        }

        async fn due(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
            let table = self.table();
            let mut due: Vec<(i64, &String)> = table
                .items
                .iter()
                .filter(|(_, item)| item.shard == shard)
                .filter_map(|(id, item)| item.due_at.filter(|at| *at <= up_to).map(|at| (at, id)))
                .collect();
            due.sort();
            Ok(due.into_iter().take(limit.clamp(1, 100)).map(|(_, id)| id.clone()).collect())
        }
    }

    /// One publish call as the publisher saw it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Call {
        topic_arn: String,
        body: String,
        idempotency_key: String,
        group: String,
        ok: bool,
    }

    type Meanwhile = Box<dyn FnMut(usize) + Send>;

    #[derive(Default)]
    struct Script {
        calls: Vec<Call>,
        /// Calls (0-based) that fail.
        failing: HashSet<usize>,
        fail_all: bool,
        /// Runs during call n (another dispatcher acting while we publish).
        meanwhile: Option<Meanwhile>,
    }

    /// A publisher that records every call and fails the chosen ones.
    #[derive(Clone, Default)]
    struct ScriptedPublisher(Arc<Mutex<Script>>);

    impl ScriptedPublisher {
        fn script(&self) -> MutexGuard<'_, Script> {
            self.0.lock().unwrap()
        }

        fn calls(&self) -> Vec<Call> {
            self.script().calls.clone()
        }

        fn published(&self) -> Vec<Call> {
            self.calls().into_iter().filter(|c| c.ok).collect()
        }

        fn fail_call(&self, n: usize) {
            self.script().failing.insert(n);
        }

        fn fail_all(&self) {
            self.script().fail_all = true;
        }

        fn meanwhile(&self, f: impl FnMut(usize) + Send + 'static) {
            self.script().meanwhile = Some(Box::new(f));
        }
    }

    impl Publisher for ScriptedPublisher {
        async fn publish(&self, topic_arn: &str, body: &str, idempotency_key: &str, group: &str) -> Result<(), String> {
            let mut script = self.script();
            let n = script.calls.len();
            let ok = !script.fail_all && !script.failing.contains(&n);
            script.calls.push(Call {
                topic_arn: topic_arn.to_owned(),
                body: body.to_owned(),
                idempotency_key: idempotency_key.to_owned(),
                group: group.to_owned(),
                ok,
            });
            if let Some(meanwhile) = script.meanwhile.as_mut() {
                meanwhile(n);
            }
            if ok { Ok(()) } else { Err(format!("sns: InternalError (call {n})")) }
        }
    }

    const POLICY: DispatchPolicy =
        DispatchPolicy { backoff: Backoff { base_ms: 1_000, max_ms: 60_000 }, max_attempts: 3 };

    fn dispatcher() -> (MemOutbox, ScriptedPublisher, Dispatcher<MemOutbox, ScriptedPublisher>) {
        let (store, publisher) = (MemOutbox::default(), ScriptedPublisher::default());
        let d = Dispatcher::with_ports(store.clone(), publisher.clone()).with_policy(POLICY);
        (store, publisher, d)
    }

    fn call_of(item: &Stored) -> Call {
        Call {
            topic_arn: item.topic_arn.clone(),
            body: item.body.clone(),
            idempotency_key: item.idempotency_key.clone(),
            group: item.group.clone(),
            ok: true,
        }
    }

    // ------------------------------------------------------------------- dispatch

    #[tokio::test]
    async fn a_due_item_is_published_once_with_its_key_topic_group_and_body_and_marked_sent() {
        let (store, publisher, d) = dispatcher();
        let item = Stored::pending("k1", 3, NOW);
        store.put("outbox#k1", item.clone());

        assert_eq!(d.dispatch("outbox#k1", NOW).await.unwrap(), Dispatched::Published);

        assert_eq!(publisher.calls(), vec![call_of(&item)]);
        let sent = store.get("outbox#k1");
        assert_eq!((sent.status, sent.attempts, sent.sent_at), (SENT, 1, Some(NOW)));
        assert_eq!((sent.due_at, sent.until), (None, None), "a SENT item leaves the due index: {sent:?}");
        // Any later dispatch (processor, sweeper) leaves it alone.
        assert_eq!(d.dispatch("outbox#k1", NOW + 10 * DISPATCH_LEASE_MS).await.unwrap(), Dispatched::Skipped);
        assert_eq!(publisher.calls().len(), 1);
    }

    #[tokio::test]
    async fn claimed_not_yet_due_sent_dead_and_unknown_items_are_skipped_without_publishing() {
        let (store, publisher, d) = dispatcher();
        let items = [
            // The claim lapses only once `dispatch_until < now`.
            ("outbox#live", Stored::sending("live", 0, NOW, 1)),
            ("outbox#later", Stored::pending("later", 0, NOW + 1)),
            (
                "outbox#sent",
                Stored { status: SENT, due_at: None, sent_at: Some(NOW - 5), ..Stored::pending("sent", 0, 0) },
            ),
            ("outbox#dead", Stored { status: DEAD, due_at: None, attempts: 3, ..Stored::pending("dead", 0, 0) }),
        ];
        for (id, item) in &items {
            store.put(id, item.clone());
        }
        for (id, item) in &items {
            assert_eq!(d.dispatch(id, NOW).await.unwrap(), Dispatched::Skipped, "{id}");
            assert_eq!(&store.get(id), item, "{id} unchanged");
        }
        assert_eq!(d.dispatch("outbox#nothing", NOW).await.unwrap(), Dispatched::Skipped);
        assert!(publisher.calls().is_empty(), "{:?}", publisher.calls());
    }

    #[tokio::test]
    async fn a_failed_publish_puts_the_item_back_due_after_half_to_all_of_the_backoff() {
        let (store, publisher, d) = dispatcher();
        publisher.fail_all();
        for i in 0..40 {
            let id = format!("outbox#k{i}");
            store.put(&id, Stored::pending(&format!("k{i}"), 0, NOW));
            match d.dispatch(&id, NOW).await.unwrap() {
                Dispatched::Retrying { attempts: 1, error } => assert!(error.starts_with("sns: "), "{error}"),
                other => panic!("{other:?}"),
            }
            let item = store.get(&id);
            assert_eq!(item.status, PENDING);
            assert_eq!(item.until, None);
            assert!(item.last_error.as_deref().is_some_and(|e| e.starts_with("sns: ")), "{item:?}");
            // Attempt 1 failed: base 1 s, jittered down to half at most.
            let delay = item.due_at.unwrap() - NOW;
            assert!((500..=1_000).contains(&delay), "{delay}");
            // Not taken again before it is due.
            assert_eq!(d.dispatch(&id, NOW + delay - 1).await.unwrap(), Dispatched::Skipped);
            // Attempt 2 fails too: 2 s, jittered.
            let at = NOW + delay;
            assert_eq!(
                d.dispatch(&id, at).await.unwrap(),
                Dispatched::Retrying { attempts: 2, error: format!("sns: InternalError (call {})", 2 * i + 1) }
            );
            let delay = store.get(&id).due_at.unwrap() - at;
            assert!((1_000..=2_000).contains(&delay), "{delay}");
        }
        assert_eq!(publisher.calls().len(), 80);
    }

    #[tokio::test]
    async fn the_failure_at_max_attempts_makes_the_item_dead() {
        let (store, publisher, d) = dispatcher();
        publisher.fail_all();
        store.put("outbox#k", Stored::pending("k", 5, NOW));
        let mut now = NOW;
        for attempt in 1..POLICY.max_attempts {
            assert!(
                matches!(d.dispatch("outbox#k", now).await.unwrap(), Dispatched::Retrying { attempts, .. } if attempts == attempt)
            );
            now = store.get("outbox#k").due_at.unwrap();
        }
        match d.dispatch("outbox#k", now).await.unwrap() {
            Dispatched::Dead { attempts: 3, error } => assert_eq!(error, "sns: InternalError (call 2)"),
            other => panic!("{other:?}"),
        }
        let item = store.get("outbox#k");
        assert_eq!((item.status, item.due_at, item.dead_at, item.shard), (DEAD, None, Some(now), 5));
        assert_eq!(d.dispatch("outbox#k", now + 100 * DISPATCH_LEASE_MS).await.unwrap(), Dispatched::Skipped);
        assert_eq!(publisher.calls().len(), 3);
    }

    #[tokio::test]
    async fn an_item_whose_dispatchers_kept_dying_goes_dead_without_publishing() {
        let (store, publisher, d) = dispatcher();
        // Claimed max_attempts times, no outcome recorded, the last claim lapsed.
        store.put("outbox#k", Stored::sending("k", 2, NOW - 1, POLICY.max_attempts));

        assert_eq!(
            d.dispatch("outbox#k", NOW).await.unwrap(),
            Dispatched::Dead { attempts: 4, error: "3 claims without an outcome".into() }
        );
        assert!(publisher.calls().is_empty());
        let item = store.get("outbox#k");
        assert_eq!((item.status, item.attempts, item.due_at), (DEAD, 4, None));
        assert_eq!(item.last_error.as_deref(), Some("3 claims without an outcome"));
    }

    #[tokio::test]
    async fn the_last_allowed_claim_still_publishes() {
        let (store, publisher, d) = dispatcher();
        store.put("outbox#k", Stored::sending("k", 2, NOW - 1, POLICY.max_attempts - 1));

        assert_eq!(d.dispatch("outbox#k", NOW).await.unwrap(), Dispatched::Published);
        assert_eq!(publisher.published().len(), 1);
        assert_eq!((store.status("outbox#k"), store.get("outbox#k").attempts), (SENT, POLICY.max_attempts));
    }

    #[tokio::test]
    async fn a_claim_that_lapsed_during_the_publish_still_reports_published_and_the_new_owner_republishes() {
        let (store, publisher, d) = dispatcher();
        let item = Stored::pending("k", 0, NOW);
        store.put("outbox#k", item.clone());
        // The publish stalls past the lease; another dispatcher claims the item meanwhile.
        let other = store.clone();
        let takeover = NOW + DISPATCH_LEASE_MS + 1;
        publisher.meanwhile(move |n| {
            if n == 0 {
                let met = other.claim_now("outbox#k", "other", takeover, takeover + DISPATCH_LEASE_MS).unwrap();
                assert!(matches!(met, OutboxClaim::Claimed(_)), "{met:?}");
            }
        });

        assert_eq!(d.dispatch("outbox#k", NOW).await.unwrap(), Dispatched::Published);
        let held = store.get("outbox#k");
        assert_eq!((held.status, held.token.as_deref(), held.attempts), (SENDING, Some("other"), 2));

        // The other owner died too; the next dispatch publishes again, with the same key.
        let later = takeover + DISPATCH_LEASE_MS + 1;
        assert_eq!(d.dispatch("outbox#k", later).await.unwrap(), Dispatched::Published);
        assert_eq!(publisher.calls(), vec![call_of(&item), call_of(&item)]);
        assert_eq!(store.status("outbox#k"), SENT);
    }

    #[tokio::test]
    async fn a_failure_recorded_after_the_claim_lapsed_leaves_the_item_to_its_new_owner() {
        let (store, publisher, d) = dispatcher();
        store.put("outbox#k", Stored::pending("k", 0, NOW));
        publisher.fail_all();
        let other = store.clone();
        publisher.meanwhile(move |_| {
            let at = NOW + DISPATCH_LEASE_MS + 1;
            other.claim_now("outbox#k", "other", at, at + DISPATCH_LEASE_MS).unwrap();
        });

        assert!(matches!(d.dispatch("outbox#k", NOW).await.unwrap(), Dispatched::Retrying { attempts: 1, .. }));
        let item = store.get("outbox#k");
        assert_eq!((item.status, item.token.as_deref(), item.last_error), (SENDING, Some("other"), None));
    }

    #[tokio::test]
    async fn a_crash_after_publish_leaves_the_item_sending_and_it_is_republished_with_the_same_key_once_the_claim_lapses()
     {
        let (store, publisher, healthy) = dispatcher();
        let item = Stored::pending("k", 1, NOW);
        store.put("outbox#k", item.clone());
        let mut crashing = healthy.clone();
        crashing.fault = DispatchFault::AfterPublishBeforeMark;

        assert!(crashing.dispatch("outbox#k", NOW).await.is_err());
        let held = store.get("outbox#k");
        assert_eq!(held.status, SENDING);
        // The claim's end is its next look in the due index.
        assert_eq!((held.until, held.due_at), (Some(NOW + DISPATCH_LEASE_MS), Some(NOW + DISPATCH_LEASE_MS)));

        // While the claim is live nobody else publishes.
        assert_eq!(healthy.dispatch("outbox#k", NOW + DISPATCH_LEASE_MS).await.unwrap(), Dispatched::Skipped);
        assert_eq!(publisher.calls().len(), 1);

        assert_eq!(healthy.dispatch("outbox#k", NOW + DISPATCH_LEASE_MS + 1).await.unwrap(), Dispatched::Published);
        assert_eq!(publisher.calls(), vec![call_of(&item), call_of(&item)]);
        let sent = store.get("outbox#k");
        assert_eq!((sent.status, sent.attempts), (SENT, 2));
    }

    // ---------------------------------------------------------------------- sweep

    #[tokio::test]
    async fn the_sweeper_republishes_an_item_whose_dispatcher_crashed() {
        let (store, publisher, healthy) = dispatcher();
        store.put("outbox#k", Stored::pending("k", 1, NOW));
        let mut crashing = healthy.clone();
        crashing.fault = DispatchFault::AfterPublishBeforeMark;
        assert!(crashing.dispatch("outbox#k", NOW).await.is_err());

        let lapse = NOW + DISPATCH_LEASE_MS;
        assert_eq!(healthy.sweep(2, lapse + GRACE - 1, GRACE, 10).await.unwrap(), 0, "claim live or within grace");
        assert_eq!(healthy.sweep(2, lapse + GRACE + 1, GRACE, 10).await.unwrap(), 1);
        let keys: Vec<String> = publisher.calls().into_iter().map(|c| c.idempotency_key).collect();
        assert_eq!(keys, ["k", "k"]);
        assert_eq!(store.status("outbox#k"), SENT);
    }

    #[tokio::test]
    async fn sweep_publishes_only_items_older_than_the_grace_across_its_shards() {
        let (store, publisher, d) = dispatcher();
        store.put("outbox#old0", Stored::pending("old0", 0, NOW - 5 * GRACE));
        store.put("outbox#young0", Stored::pending("young0", 0, NOW - GRACE + 1));
        store.put("outbox#edge1", Stored::pending("edge1", 1, NOW - GRACE));
        store.put("outbox#old2", Stored::pending("old2", 2, NOW - 2 * GRACE));
        store.put("outbox#beyond", Stored::pending("beyond", 3, NOW - 5 * GRACE));
        store.put("outbox#claimed", Stored::sending("claimed", 1, NOW + 1, 1));

        assert_eq!(d.sweep(3, NOW, GRACE, 100).await.unwrap(), 3);

        let mut keys: Vec<String> = publisher.calls().into_iter().map(|c| c.idempotency_key).collect();
        keys.sort();
        assert_eq!(keys, ["edge1", "old0", "old2"]);
        for (id, status) in [
            ("outbox#old0", SENT),
            ("outbox#edge1", SENT),
            ("outbox#old2", SENT),
            ("outbox#young0", PENDING),
            ("outbox#beyond", PENDING),
            ("outbox#claimed", SENDING),
        ] {
            assert_eq!(store.status(id), status, "{id}");
        }
    }

    #[tokio::test]
    async fn sweep_takes_the_oldest_first_and_stops_at_its_limit() {
        let (store, publisher, d) = dispatcher();
        store.put("outbox#a", Stored::pending("a", 0, NOW - 5 * GRACE));
        store.put("outbox#b", Stored::pending("b", 0, NOW - 3 * GRACE));
        store.put("outbox#c", Stored::pending("c", 0, NOW - 4 * GRACE));
        store.put("outbox#d", Stored::pending("d", 1, NOW - 9 * GRACE));

        assert_eq!(d.sweep(2, NOW, GRACE, 2).await.unwrap(), 2);
        let keys: Vec<String> = publisher.calls().into_iter().map(|c| c.idempotency_key).collect();
        assert_eq!(keys, ["a", "c"]);
        assert_eq!((store.status("outbox#b"), store.status("outbox#d")), (PENDING, PENDING));

        assert_eq!(d.sweep(2, NOW, GRACE, 2).await.unwrap(), 2);
        assert_eq!(publisher.calls().len(), 4);
        assert_eq!(d.sweep(2, NOW, GRACE, 2).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn one_items_store_or_publish_failure_does_not_stop_the_sweep() {
        let (store, publisher, d) = dispatcher();
        store.put("outbox#throttled", Stored::pending("throttled", 0, NOW - 3 * GRACE));
        store.put("outbox#refused", Stored::pending("refused", 0, NOW - 2 * GRACE));
        store.put("outbox#fine", Stored::pending("fine", 1, NOW - 2 * GRACE));
        store.fail_writes_of("outbox#throttled");
        publisher.fail_call(0);

        assert_eq!(d.sweep(2, NOW, GRACE, 10).await.unwrap(), 1);

        let calls: Vec<(String, bool)> = publisher.calls().into_iter().map(|c| (c.idempotency_key, c.ok)).collect();
        assert_eq!(calls, [("refused".to_owned(), false), ("fine".to_owned(), true)]);
        let throttled = store.get("outbox#throttled");
        assert_eq!((throttled.status, throttled.attempts), (PENDING, 0));
        let refused = store.get("outbox#refused");
        assert_eq!((refused.status, refused.attempts), (PENDING, 1));
        assert!(refused.due_at.unwrap() > NOW);
        assert_eq!(store.status("outbox#fine"), SENT);
    }

    #[test]
    fn the_default_policy_gives_up_after_hours_not_minutes() {
        let p = DispatchPolicy::default();
        let total: i64 = (1..p.max_attempts).map(|a| p.backoff.delay_ms(a, 1.0)).sum();
        assert!((2 * 3_600_000..=4 * 3_600_000).contains(&total), "{total}");
    }
}
