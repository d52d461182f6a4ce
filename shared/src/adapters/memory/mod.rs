//! Every port in memory, over one state behind one lock: the world the use
//! cases' unit tests and the contract suite (`crate::contract`) run on.
//!
//! The ledger is a table of items ([`table`]) whose writes are the very
//! expressions of `adapters::dynamodb::conditions`, evaluated here
//! ([`expr`]); each port method mirrors its DynamoDB adapter, including how
//! a write that failed its condition recognises its own earlier try. The
//! contract suite runs the same scenarios on this world and on the
//! DynamoDB, SQS and SNS adapters against the emulator: a divergence is a
//! failing test.
//!
//! | view | ports |
//! |---|---|
//! | [`MemLedger`] | `Ledger`, `WorkLedger`, `DueLedger`, `OperatorLedger`, `BackfillLedger` |
//! | [`MemOutbox`] | `OutboxStore` |
//! | [`MemQueue`] | `WorkQueue`, `Redelivery` (visibility, receive counts, a dead-letter queue) |
//! | [`MemPublisher`] | `Publisher` |
//! | [`MemKeys`] | `PayloadKeys` |
//! | [`MemSource`] | `BackfillSource` |
//! | [`MemSecretStore`] | `verify::provider::SecretStore` |
//!
//! Faults ([`Fault`]) are injected at any port call by name
//! (`ledger.claim`, `work.commit`, `queue.send`, ...): throttled before the
//! write, the acknowledgement lost once (the write lands, and the
//! adapter's retry meets it) or always, or the invocation dies before or
//! after the write (a panic, which [`crashed`] recognises). Random faults
//! are drawn from the world's `Entropy`; every time comes from its `Clock`.

mod audit;
pub mod expr;
mod keys;
mod ledger;
mod queue;
mod recorder;
mod secrets;
mod source;
pub mod table;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

pub use self::keys::MemKeys;
pub use self::ledger::{OutboxView, Value, set};
pub use self::queue::{MemQueue, Message};
pub use self::recorder::MemMetrics;
pub use self::secrets::MemSecretStore;
pub use self::source::{Answer, MemSource, MemSubscriptions};
use self::table::Table;
use crate::clock::Ambient;
use crate::ledger::PortError;

/// What happens at a port call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `Throttled`, nothing written.
    Throttle,
    /// The service answers a 5xx (`Unavailable`), nothing written.
    Unavailable,
    /// The service refuses the request itself (`ValidationException`:
    /// `Caller`), nothing written.
    Invalid,
    /// The write lands; its acknowledgement is lost and the adapter's own
    /// retry meets it (what that retry answers is the call's answer).
    LoseAckOnce,
    /// The write lands; every retry's acknowledgement is lost too: the call
    /// fails (`Unavailable`).
    LoseAckAlways,
    /// The invocation dies before the call.
    CrashBefore,
    /// The invocation dies after the write landed.
    CrashAfter,
}

/// Runs a memory port's future to its end at once: every port here
/// completes without waiting (for hooks, which run inside another call).
pub fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("a memory port waited"),
    }
}

/// The panic message of an injected crash.
pub const CRASH: &str = "hookledger memory world: injected crash";

/// Whether a task's panic was an injected crash.
pub fn crashed(err: tokio::task::JoinError) -> bool {
    err.try_into_panic().ok().is_some_and(|p| p.downcast_ref::<String>().is_some_and(|m| m.starts_with(CRASH)))
}

#[derive(Debug, Clone)]
struct Rule {
    call: String,
    /// Only calls on this item (an outbox id, an event key); `None`: any.
    target: Option<String>,
    /// Calls of this name to let through first.
    skip: u32,
    /// How many calls it hits (`None`: every one).
    times: Option<u32>,
    fault: Fault,
}

/// One message published (the destination's view).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The target's ARN (a topic, a queue, a bus).
    pub topic_arn: String,
    pub body: String,
    pub idempotency_key: String,
    pub group: String,
    /// Whether the publish succeeded (a failed one is kept as an attempt).
    pub ok: bool,
}

#[derive(Default)]
pub struct State {
    pub table: Table,
    /// The key store's table (`adapters::dynamodb::keys`'s items).
    pub keys: Table,
    /// The last activity window the world's containers marked.
    pub marked: Option<i64>,
    /// The payload bucket (`None`: not configured).
    pub bucket: Option<HashMap<String, Vec<u8>>>,
    pub queue: queue::QueueState,
    /// The delivery queue's messages (body, group, visible at), in order sent.
    pub deliveries: Vec<(String, String, i64)>,
    pub published: Vec<Published>,
    /// Targets that refuse every connection (an HTTPS destination that is down).
    pub refusing: BTreeSet<String>,
    /// Targets that answer after this long, on the world's clock (a slow partner).
    pub slow: HashMap<String, u64>,
    /// Targets that answer 429 to their next sends: (`Retry-After` in ms, how many more).
    pub throttling: HashMap<String, (Option<i64>, u32)>,
    /// Every send a target answered 2xx, with the world's time it was made.
    pub sends: Vec<(String, i64)>,
    rules: Vec<Rule>,
    /// Faults drawn at random: per thousand calls.
    random_per_mille: u32,
    /// Crashes (before or after the write) drawn at random: per thousand calls.
    random_crashes_per_mille: u32,
    /// Faults injected so far (rules and random draws, crashes included).
    pub injected: u64,
    /// Every port call, in order.
    pub calls: Vec<String>,
    /// The conditions.rs expressions evaluated (applied or refused).
    pub exercised: BTreeSet<&'static str>,
    /// Every commit the processor asked for, in order.
    pub commits: Vec<CommitCall>,
    /// Every op the processor wrote before a commit, in order.
    pub applied: Vec<AppliedCall>,
}

/// One `WorkLedger::apply` call as the ledger saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedCall {
    pub key: String,
    pub token: String,
    /// The op by the `pk` of its first write.
    pub op: String,
    /// Whether it was written (`false`: its condition failed).
    pub written: bool,
}

/// One `WorkLedger::commit` call as the ledger saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitCall {
    pub key: String,
    pub token: String,
    /// Each op by the `pk` of its first write (`""`: an op of outbox items only).
    pub ops: Vec<String>,
    pub outcome: String,
    pub subject: Option<String>,
    /// Whether the transaction committed.
    pub committed: bool,
}

/// The world: one state, one lock, the ambient clock and entropy.
#[derive(Clone)]
pub struct World {
    state: Arc<Mutex<State>>,
    ambient: Ambient,
    shards: u32,
    retention_days: u32,
    /// Index items per query page (DynamoDB: up to 1 MB of them).
    page_items: usize,
    hooks: Arc<Mutex<Vec<Hook>>>,
    hook_calls: Arc<Mutex<HashMap<String, usize>>>,
    /// Run before every port call, outside the lock (a scheduler's
    /// interleavings: another invocation runs between two calls).
    preempt: Arc<Mutex<Option<Preempt>>>,
}

/// A hook run before every port call with the call's name.
pub type Preempt = Arc<dyn Fn(&World, &str) + Send + Sync>;

impl World {
    /// A world on this clock and entropy (tests: `Ambient::fixed`).
    pub fn new(ambient: Ambient) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            ambient,
            shards: crate::policy::DEFAULT_INDEX_SHARDS,
            retention_days: crate::policy::DEFAULT_RETENTION_DAYS,
            page_items: 1_000,
            hooks: Arc::default(),
            hook_calls: Arc::default(),
            preempt: Arc::default(),
        }
    }

    /// The same state seen with another clock and entropy (a second
    /// invocation; with the same seed, one that draws the same tokens).
    pub fn with_ambient(&self, ambient: Ambient) -> Self {
        Self { ambient, ..self.clone() }
    }

    pub fn with_shards(mut self, shards: u32) -> Self {
        self.shards = shards.max(1);
        self
    }

    /// Index items per query page (a small page makes every reader page).
    pub fn with_page_items(mut self, n: usize) -> Self {
        self.page_items = n.max(1);
        self
    }

    /// Large payloads go to a bucket, as with `HOOKLEDGER_PAYLOAD_BUCKET`.
    pub fn with_payload_bucket(self) -> Self {
        self.state().bucket = Some(HashMap::new());
        self
    }

    pub fn ambient(&self) -> &Ambient {
        &self.ambient
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The state, for a test to arrange or look.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn ledger(&self) -> MemLedger {
        MemLedger(self.clone())
    }

    /// Where projections read on this world: its table, its shards, a
    /// retention of 30 days.
    pub fn projection_context(&self) -> crate::projection::ProjectionContext {
        crate::projection::ProjectionContext::new(std::sync::Arc::new(self.ledger()), self.shards, 30)
    }

    /// Stores `item` as it is (a test arranging state; no condition).
    pub fn seed(&self, item: &crate::item::Item) {
        self.state().table.insert(crate::adapters::dynamodb::item::item_to_sdk(item));
    }

    /// The item stored under `(pk, sk)`, as the domain reads it.
    pub fn item(&self, pk: &str, sk: &str) -> Option<crate::item::Item> {
        self.state().table.get(pk, sk).map(crate::adapters::dynamodb::item::item_from_sdk)
    }

    /// A projection's state item (`sk = "state"`).
    pub fn state_item(&self, pk: &str) -> Option<crate::item::Item> {
        self.item(pk, crate::projection::STATE_SK)
    }

    /// Writes `ops` as the processor does before its completion (without a
    /// record to complete): each op on its own, its writes all or nothing;
    /// `Err` names the ops whose conditions failed (the others are written).
    /// For unit tests of projections.
    pub fn apply(&self, ops: &[crate::projection::Op]) -> Result<(), Vec<usize>> {
        let now = self.ambient.now_ms();
        let mut failed = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let writes: Vec<table::Write> = op
                .writes
                .iter()
                .map(|w| {
                    let sdk = crate::adapters::dynamodb::item::transact("memory", w);
                    table::Write::from_sdk(&sdk).unwrap_or_else(|e| panic!("an op's write: {e}"))
                })
                .collect();
            match self.state().table.transact(&writes, None, now) {
                Ok(()) => {}
                Err(table::TransactError::Cancelled(_)) => failed.push(i),
                Err(e) => panic!("an invalid op: {e:?}"),
            }
        }
        if failed.is_empty() { Ok(()) } else { Err(failed) }
    }

    pub fn outbox(&self) -> MemOutbox {
        MemOutbox(self.clone())
    }

    /// The work queue; a message received `max_receives` times moves to the
    /// dead-letter queue.
    pub fn queue(&self) -> MemQueue {
        MemQueue::new(self.clone())
    }

    /// The delivery queue, as SQS's: messages with their group and delay.
    pub fn deliveries(&self) -> MemDeliveries {
        MemDeliveries(self.clone())
    }

    /// The key store of sealed payloads.
    pub fn keys(&self) -> MemKeys {
        MemKeys(self.clone())
    }

    pub fn publisher(&self) -> MemPublisher {
        MemPublisher(self.clone())
    }

    /// Injects `fault` at the calls named `call`, after `skip` good ones,
    /// `times` times (`None`: always).
    pub fn inject(&self, call: &str, skip: u32, times: Option<u32>, fault: Fault) {
        self.state().rules.push(Rule { call: call.to_owned(), target: None, skip, times, fault });
    }

    /// Injects `fault` at the calls named `call` on one item (an outbox id,
    /// an event key), `times` times (`None`: always).
    pub fn inject_on(&self, call: &str, target: &str, times: Option<u32>, fault: Fault) {
        let target = Some(target.to_owned());
        self.state().rules.push(Rule { call: call.to_owned(), target, skip: 0, times, fault });
    }

    /// Runs `f` at the `nth` call named `call` (0-based), before the call
    /// touches the state: another actor acting at that moment. `f` may use
    /// any port through [`ready`].
    pub fn during(&self, call: &str, nth: usize, f: impl FnOnce(&World) + Send + 'static) {
        let mut hooks = self.hooks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        hooks.push(Hook { call: call.to_owned(), target: None, nth, f: Some(Box::new(f)) });
    }

    /// [`World::during`] at the first call named `call` on one item.
    pub fn during_on(&self, call: &str, target: &str, f: impl FnOnce(&World) + Send + 'static) {
        let mut hooks = self.hooks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        hooks.push(Hook { call: call.to_owned(), target: Some(target.to_owned()), nth: 0, f: Some(Box::new(f)) });
    }

    /// Injects a random fault at this rate per thousand calls, drawn from the
    /// world's entropy (crashes excluded: a random crash is the caller's).
    pub fn random_faults(&self, per_mille: u32) {
        self.state().random_per_mille = per_mille;
    }

    /// Crashes the invocation at this rate per thousand calls, before or
    /// after the write (half each), drawn from the world's entropy.
    pub fn random_crashes(&self, per_mille: u32) {
        self.state().random_crashes_per_mille = per_mille;
    }

    /// Runs `f` before every port call from now on (`None`: no more).
    pub fn preempt(&self, f: Option<Preempt>) {
        *self.preempt.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = f;
    }

    pub fn clear_faults(&self) {
        let mut st = self.state();
        st.rules.clear();
        st.random_per_mille = 0;
        st.random_crashes_per_mille = 0;
    }

    /// The calls made so far, in order: `"<name> <item>"` (`"<name>"` for
    /// calls on no one item).
    pub fn calls(&self) -> Vec<String> {
        self.state().calls.clone()
    }

    /// Forgets the calls logged so far (a test's second act).
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// Moves the world's clock on by `d` (a manual clock, as
    /// `Ambient::fixed` gives, moves at once; the system clock would wait).
    pub fn advance(&self, d: std::time::Duration) {
        ready(self.ambient.clock.sleep(d));
    }

    /// The items of the calls named `name`, in order.
    pub fn calls_named(&self, name: &str) -> Vec<String> {
        let prefix = format!("{name} ");
        self.state()
            .calls
            .iter()
            .filter_map(|c| if c == name { Some(String::new()) } else { c.strip_prefix(&prefix).map(str::to_owned) })
            .collect()
    }

    /// The next `n` transactions are cancelled for contention
    /// (`TransactionConflict`), as DynamoDB does when another transaction
    /// holds an item.
    pub fn contend(&self, n: u32) {
        self.state().table.contend(n);
    }

    /// The table ignores `ClientRequestToken` (as the emulator does): a
    /// retried transaction is evaluated again.
    pub fn ignore_request_tokens(&self) {
        self.state().table.ignore_tokens();
    }

    fn fault_for(&self, st: &mut State, call: &str, target: &str) -> Option<Fault> {
        st.calls.push(if target.is_empty() { call.to_owned() } else { format!("{call} {target}") });
        let on = |r: &Rule| r.call == call && r.target.as_deref().is_none_or(|t| t == target);
        for r in st.rules.iter_mut().filter(|r| on(r)) {
            if r.skip > 0 {
                r.skip -= 1;
                continue;
            }
            match &mut r.times {
                Some(0) => continue,
                Some(n) => *n -= 1,
                None => {}
            }
            st.injected += 1;
            return Some(r.fault);
        }
        if st.random_per_mille > 0 && self.ambient.entropy.bits() % 1000 < u128::from(st.random_per_mille) {
            const KINDS: [Fault; 4] = [Fault::Throttle, Fault::Unavailable, Fault::LoseAckOnce, Fault::LoseAckAlways];
            st.injected += 1;
            return Some(KINDS[(self.ambient.entropy.bits() % 4) as usize]);
        }
        if st.random_crashes_per_mille > 0
            && self.ambient.entropy.bits() % 1000 < u128::from(st.random_crashes_per_mille)
        {
            st.injected += 1;
            return Some(if self.ambient.entropy.bits() % 2 == 0 { Fault::CrashBefore } else { Fault::CrashAfter });
        }
        None
    }

    /// Runs one port call under the lock, with its fault if one is due. `f`
    /// is the call as the adapter makes it, retry recognition included: a
    /// lost acknowledgement runs it again on the state it left.
    fn call<T>(&self, name: &str, f: impl Fn(&World, &mut State) -> Result<T, PortError>) -> Result<T, PortError> {
        self.call_on(name, "", f)
    }

    /// [`World::call`] on one item, for faults injected on it.
    fn call_on<T>(
        &self,
        name: &str,
        target: &str,
        f: impl Fn(&World, &mut State) -> Result<T, PortError>,
    ) -> Result<T, PortError> {
        self.run_hooks(name, target);
        let mut st = self.state();
        match self.fault_for(&mut st, name, target) {
            None => f(self, &mut st),
            Some(Fault::Throttle) => Err(PortError::Throttled { service: service(name) }),
            Some(Fault::Invalid) => Err(PortError::Caller {
                service: service(name),
                code: "ValidationException".into(),
                message: "the request is invalid (memory world)".into(),
            }),
            Some(Fault::Unavailable) => {
                Err(PortError::Unavailable { service: service(name), message: "InternalFailure (memory world)".into() })
            }
            Some(Fault::LoseAckOnce) => {
                let _ = f(self, &mut st);
                f(self, &mut st)
            }
            Some(Fault::LoseAckAlways) => {
                let _ = f(self, &mut st);
                let _ = f(self, &mut st);
                Err(PortError::Unavailable {
                    service: service(name),
                    message: "acknowledgement lost (memory world)".into(),
                })
            }
            Some(Fault::CrashBefore) => {
                drop(st);
                panic!("{CRASH} before {name}");
            }
            Some(Fault::CrashAfter) => {
                let _ = f(self, &mut st);
                drop(st);
                panic!("{CRASH} after {name}");
            }
        }
    }
}

impl World {
    fn run_hooks(&self, name: &str, target: &str) {
        let due: Vec<Act> = {
            let mut hooks = self.hooks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut counts = self.hook_calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut seen = |key: String| {
                let n = counts.entry(key).or_insert(0);
                *n += 1;
                *n - 1
            };
            let (nth, nth_on) = (seen(name.to_owned()), seen(format!("{name} {target}")));
            hooks
                .iter_mut()
                .filter(|h| {
                    h.call == name
                        && match &h.target {
                            None => h.nth == nth,
                            Some(t) => t == target && h.nth == nth_on,
                        }
                })
                .filter_map(|h| h.f.take())
                .collect()
        };
        for f in due {
            f(self);
        }
        let preempt = self.preempt.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Some(p) = preempt {
            p(self, name);
        }
    }
}

/// What another actor does at a call.
type Act = Box<dyn FnOnce(&World) + Send>;

struct Hook {
    call: String,
    target: Option<String>,
    nth: usize,
    f: Option<Act>,
}

fn service(call: &str) -> &'static str {
    match call.split('.').next() {
        Some("queue") => "sqs",
        Some("publisher") => "sns",
        Some("source") => "provider",
        _ => "dynamodb",
    }
}

/// The ledger ports on the world.
#[derive(Clone)]
pub struct MemLedger(pub World);

/// The outbox store on the world.
#[derive(Clone)]
pub struct MemOutbox(pub World);

/// The publisher on the world: every message published, in order.
#[derive(Clone)]
pub struct MemPublisher(pub World);

impl MemPublisher {
    /// Every publish attempt, in order, failed ones included.
    pub fn attempts(&self) -> Vec<Published> {
        self.0.state().published.clone()
    }

    /// The messages published.
    pub fn published(&self) -> Vec<Published> {
        self.attempts().into_iter().filter(|p| p.ok).collect()
    }

    /// Every publish from now on fails.
    pub fn fail_all(&self) {
        self.0.inject("publisher.publish", 0, None, Fault::Throttle);
    }

    /// Every publish to `target` fails as a refused connection does, until
    /// [`Self::restore`] (an HTTPS destination that is down).
    pub fn refuse(&self, target: &str) {
        self.0.state().refusing.insert(target.to_owned());
    }

    pub fn restore(&self, target: &str) {
        self.0.state().refusing.remove(target);
    }

    /// `target` answers (2xx) only after `ms` of the world's clock.
    pub fn slow(&self, target: &str, ms: u64) {
        self.0.state().slow.insert(target.to_owned(), ms);
    }

    /// `target`'s next `times` sends are answered 429 (with a
    /// `Retry-After` of `after_ms` when given).
    pub fn throttle(&self, target: &str, after_ms: Option<i64>, times: u32) {
        self.0.state().throttling.insert(target.to_owned(), (after_ms, times));
    }

    /// The world's time of each send `target` answered 2xx, in order.
    pub fn send_times(&self, target: &str) -> Vec<i64> {
        self.0.state().sends.iter().filter(|(t, _)| t == target).map(|(_, at)| *at).collect()
    }

    /// The `nth` publish (0-based) fails.
    pub fn fail_call(&self, nth: u32) {
        self.0.inject("publisher.publish", nth, Some(1), Fault::Throttle);
    }
}

impl crate::ports::Publisher for MemPublisher {
    async fn publish(&self, out: crate::ports::Publication<'_>) -> Result<(), crate::ports::PublishError> {
        let attempt = |ok| Published {
            topic_arn: out.target.to_owned(),
            body: out.body.to_owned(),
            idempotency_key: out.idempotency_key.to_owned(),
            group: out.group.to_owned(),
            ok,
        };
        let now = self.0.ambient.now_ms();
        // Ok(None): refused; Ok(Some(None)): sent; Ok(Some(Some(after))): a 429.
        let result = self.0.call_on("publisher.publish", out.idempotency_key, |_, st| {
            if st.refusing.contains(out.target) {
                st.published.push(attempt(false));
                return Ok(None);
            }
            if let Some((after, left)) = st.throttling.get_mut(out.target).filter(|(_, left)| *left > 0) {
                *left -= 1;
                let after = *after;
                st.published.push(attempt(false));
                return Ok(Some(Some(after)));
            }
            st.published.push(attempt(true));
            st.sends.push((out.target.to_owned(), now));
            Ok(Some(None))
        });
        if let Ok(Some(Some(after_ms))) = result {
            let message = format!("{}: answered 429", out.target);
            return Err(crate::ports::PublishError::Retry { message, after_ms, throttled: true });
        }
        let result = result.map(|r| r.is_some());
        let slow = self.0.state().slow.get(out.target).copied();
        if let Some(ms) = slow {
            self.0.ambient.clock.sleep(std::time::Duration::from_millis(ms)).await;
        }
        if let Ok(false) = result {
            return Err("connection refused".to_owned().into());
        }
        if result.is_err() {
            self.0.state().published.push(attempt(false));
        }
        result.map(|_| ()).map_err(|e| format!("sns: {e}").into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::EventKey;
    use crate::ledger::{Claim, NewEvent, SendLease, Status, Via};
    use crate::ports::{Ledger, WorkLedger};

    const NOW: i64 = 1_800_000_000_000;

    fn event(id: &str) -> NewEvent {
        NewEvent {
            key: EventKey::new("stripe", "ep", id),
            provider: "stripe".into(),
            endpoint: "ep".into(),
            tenant: "t".into(),
            event_id: id.into(),
            event_type: None,
            payload_hash: "h".into(),
            content_hash: "h".into(),
            received_at_ms: NOW,
            expires_at: 0,
            shard: 0,
            send: SendLease { token: format!("send-{id}"), until_ms: NOW + 10_000 },
            via: Via::Webhook,
            batch_hash: None,
            kept: None,
            notification: None,
        }
    }

    fn world() -> World {
        World::new(Ambient::fixed(NOW, 3)).with_shards(1)
    }

    /// Each fault does what its name says: nothing written, or the write
    /// landed and the caller told otherwise, or the invocation gone.
    #[tokio::test]
    async fn each_fault_writes_what_it_says_and_answers_what_it_says() {
        let w = world();
        let l = w.ledger();
        w.inject("ledger.claim", 0, Some(1), Fault::Throttle);
        assert!(matches!(l.claim(&event("a"), b"{}").await, Err(PortError::Throttled { .. })));
        assert!(l.item(&event("a").key).is_none(), "throttled: nothing written");
        w.inject("ledger.claim", 0, Some(1), Fault::LoseAckOnce);
        assert_eq!(l.claim(&event("a"), b"{}").await.unwrap(), Claim::New, "the retry meets its own write");
        w.inject("ledger.claim", 0, Some(1), Fault::LoseAckAlways);
        assert!(matches!(l.claim(&event("b"), b"{}").await, Err(PortError::Unavailable { .. })));
        assert!(l.item(&event("b").key).is_some(), "the write landed, the caller was told it failed");
        // A non-idempotent write retried after a lost acknowledgement counts twice, as DynamoDB's would.
        w.inject("ledger.note_duplicate", 0, Some(1), Fault::LoseAckOnce);
        l.note_duplicate(&event("a").key).await.unwrap();
        assert_eq!(l.field(&event("a").key, "duplicates").as_deref(), Some("2"));

        for (fault, lands) in [(Fault::CrashBefore, false), (Fault::CrashAfter, true)] {
            let w = world();
            w.inject("ledger.claim", 0, None, fault);
            let l = w.ledger();
            let died = tokio::spawn(async move { l.claim(&event("c"), b"{}").await }).await.unwrap_err();
            assert!(crashed(died), "{fault:?}");
            assert_eq!(w.ledger().item(&event("c").key).is_some(), lands, "{fault:?}");
        }
    }

    #[tokio::test]
    async fn faults_hit_their_item_after_their_skips_and_only_their_times() {
        let w = world();
        let l = w.ledger();
        for id in ["a", "b"] {
            l.claim(&event(id), b"{}").await.unwrap();
        }
        w.inject_on("work.lease", event("b").key.as_str(), Some(1), Fault::Unavailable);
        w.inject("work.lease", 1, Some(1), Fault::Throttle);
        assert!(l.lease(&event("a").key, "t", NOW, 1_000).await.is_ok(), "skipped");
        assert!(l.lease(&event("b").key, "t", NOW, 1_000).await.is_err(), "its item");
        assert!(matches!(l.lease(&event("a").key, "t", NOW, 1_000).await, Err(PortError::Throttled { .. })));
        assert!(l.lease(&event("a").key, "t", NOW, 1_000).await.is_ok(), "spent");
        let calls = w.calls_named("work.lease");
        assert_eq!(calls.len(), 4);
        assert_eq!(calls[1], event("b").key.as_str());
    }

    /// Random faults come from the world's entropy: a seed replays them.
    #[tokio::test]
    async fn random_faults_are_drawn_from_the_seed() {
        async fn run(seed: u64) -> Vec<bool> {
            let w = World::new(Ambient::fixed(NOW, seed));
            w.random_faults(300);
            let l = w.ledger();
            let mut out = Vec::new();
            for i in 0..40 {
                out.push(l.claim(&event(&format!("e{i}")), b"{}").await.is_ok());
            }
            out
        }
        let (a, b, c) = (run(1).await, run(1).await, run(2).await);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().any(|ok| !ok) && a.iter().any(|ok| *ok), "{a:?}");
    }

    #[tokio::test]
    async fn another_actor_acts_at_the_call_it_is_given() {
        let w = world();
        let l = w.ledger();
        l.claim(&event("a"), b"{}").await.unwrap();
        let k = event("a").key;
        let k2 = k.clone();
        w.during_on("work.lease", k.as_str(), move |w| {
            let got = ready(w.ledger().lease(&k2, "other", NOW, 30_000)).unwrap();
            assert!(matches!(got, crate::ledger::LeaseResult::Leased(_)));
        });
        let r = l.lease(&k, "mine", NOW, 30_000).await.unwrap();
        assert_eq!(r, crate::ledger::LeaseResult::Busy { until_ms: NOW + 30_000 }, "the other got there first");
        assert_eq!(l.record(&k).unwrap().status, Status::Processing);
    }

    #[tokio::test]
    async fn the_queue_moves_a_message_to_its_dead_letter_queue_after_its_receives() {
        let w = world();
        let q = w.queue().with_max_receives(2);
        crate::ports::WorkQueue::send(&q, &event("a").key, "t").await.unwrap();
        for _ in 0..2 {
            assert_eq!(q.receive(10).len(), 1);
            w.advance(std::time::Duration::from_secs(121));
        }
        assert!(q.receive(10).is_empty(), "received twice: moved");
        assert_eq!(q.dead_keys(), [event("a").key]);
    }
}

/// The delivery queue in memory (`deliveries` in the state): what the SQS
/// adapter sends, the same bodies (`adapters::sqs::delivery_body`), each
/// visible after its delay on the world's clock.
#[derive(Clone)]
pub struct MemDeliveries(World);

impl MemDeliveries {
    /// Takes the messages visible now, at most `max`, oldest first.
    pub fn receive(&self, max: usize) -> Vec<crate::ports::DeliveryMessage> {
        self.receive_grouped(max).into_iter().map(|(m, _)| m).collect()
    }

    /// [`Self::receive`], each message with its group.
    pub fn receive_grouped(&self, max: usize) -> Vec<(crate::ports::DeliveryMessage, String)> {
        let now = self.0.ambient.now_ms();
        let mut st = self.0.state();
        let mut out = Vec::new();
        let mut i = 0;
        while i < st.deliveries.len() && out.len() < max {
            if st.deliveries[i].2 <= now {
                let (body, group, _) = st.deliveries.remove(i);
                out.extend(crate::adapters::sqs::delivery_message(&body).map(|m| (m, group)));
            } else {
                i += 1;
            }
        }
        out
    }

    /// A message taken by an invocation that failed or crashed: visible
    /// again at `visible_at` (its visibility timeout), as SQS does.
    pub fn put_back(&self, message: &crate::ports::DeliveryMessage, group: &str, visible_at: i64) {
        let body = crate::adapters::sqs::delivery_body(message);
        self.0.state().deliveries.push((body, group.to_owned(), visible_at));
    }

    /// When the next message is visible.
    pub fn next_visible(&self) -> Option<i64> {
        self.0.state().deliveries.iter().map(|d| d.2).min()
    }

    /// Messages sent and not yet received.
    pub fn len(&self) -> usize {
        self.0.state().deliveries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl crate::ports::DeliveryQueue for MemDeliveries {
    fn hand_over<'a>(&'a self, messages: &'a [crate::ports::Handover]) -> crate::ports::HandedOver<'a> {
        Box::pin(async move {
            let now = self.0.ambient.now_ms();
            messages
                .iter()
                .map(|m| {
                    self.0.call_on("deliveries.send", &m.group, |_, st| {
                        let body = crate::adapters::sqs::delivery_body(&m.message);
                        st.deliveries.push((body, m.group.clone(), now + i64::from(m.delay_s) * 1000));
                        Ok(())
                    })
                })
                .collect()
        })
    }
}
