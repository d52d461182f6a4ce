//! The projections' unit tests run on the memory world: its state store
//! answers the projections' reads, and their ops are committed as the
//! processor commits them (one transaction, each op's conditions checked),
//! so a guard that lets a repeat through is caught here, in milliseconds.

use std::sync::Arc;

use hookledger::adapters::memory::World;
use hookledger::clock::Ambient;
use hookledger::identity::EventKey;
use hookledger::projection::{
    Decision, EventContext, Item, Op, Projection, ProjectionContext, ProjectionError, State, StateKey,
};

pub const NOW: i64 = 1_800_000_000_000;

pub struct Bench {
    pub world: World,
    pub cx: ProjectionContext,
}

impl Bench {
    pub fn new() -> Self {
        let world = World::new(Ambient::fixed(NOW, 7)).with_shards(4);
        let cx = world.projection_context();
        Self { world, cx }
    }

    /// Plans `event` with `projection` on the world's state.
    pub async fn plan(&self, projection: &dyn Projection, event: &EventContext) -> Result<Decision, ProjectionError> {
        assert!(
            projection.handles(&event.provider, &event.event_type),
            "{} handles {}",
            projection.name(),
            event.event_type
        );
        projection.plan(event, &self.cx).await
    }

    /// Commits `ops` in one transaction; the ops whose conditions failed.
    pub fn commit(&self, ops: &[Op]) -> Vec<usize> {
        self.world.apply(ops).err().unwrap_or_default()
    }

    /// Plans and, when the decision is to apply, commits; the decision and
    /// the ops whose conditions failed.
    pub async fn project(&self, projection: &dyn Projection, event: &EventContext) -> (Decision, Vec<usize>) {
        let decision = self.plan(projection, event).await.unwrap_or_else(|e| panic!("{}: {e}", projection.name()));
        let failed = match &decision {
            Decision::Apply(ops) => self.commit(ops),
            _ => Vec::new(),
        };
        (decision, failed)
    }

    /// Reads a state through the state store, as a projection does.
    pub async fn read<S: State>(&self, key: &StateKey<S>) -> Option<S> {
        self.cx.read(key).await.unwrap_or_else(|e| panic!("{key:?}: {e}"))
    }

    /// The state item as stored (every attribute).
    pub fn item(&self, pk: &str) -> Option<Item> {
        self.world.state_item(pk)
    }

    /// Maps a provider subject to an account.
    pub fn map(&self, provider: &str, tenant: &str, subject: &str, account: &str) {
        let write = crate::subjects::mapping(provider, tenant, subject, account);
        assert!(self.commit(&[Op::new(vec![write], hookledger::projection::OnConflict::Stale)]).is_empty());
    }
}

/// A verified event as the processor hands it to projections.
pub fn event(provider: &str, event_type: &str, event_id: &str, body: serde_json::Value) -> EventContext {
    EventContext {
        key: EventKey::new(provider, "main", event_id),
        provider: provider.to_owned(),
        endpoint: "main".to_owned(),
        tenant: "t1".to_owned(),
        event_id: event_id.to_owned(),
        event_type: event_type.to_owned(),
        body,
        received_at_ms: NOW - 1_000,
        processing_at_ms: NOW,
    }
}

/// The ops of an `Apply` decision.
pub fn ops(decision: &Decision) -> &[Op] {
    match decision {
        Decision::Apply(ops) => ops,
        other => panic!("expected Apply, got {other:?}"),
    }
}

/// A subscriptions API in memory.
pub fn subscriptions() -> Arc<hookledger::adapters::memory::MemSubscriptions> {
    Arc::new(hookledger::adapters::memory::MemSubscriptions::default())
}
