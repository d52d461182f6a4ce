//! Activity marks and the last full sweep (docs/architecture.md "An idle
//! reconciler"): `pk = activity`, `sk = mark#<window start>` (one per
//! [`ACTIVITY_WINDOW_MS`], kept two days), `sk = sweep`, and where the
//! records phase has read each shard to, `sk = cursors`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use aws_sdk_dynamodb::types::AttributeValue;

use super::conditions as cond;
use super::{DynamoLedger, Item, Written, get_n};
use crate::adapters::port_error;
use crate::ledger::{ACTIVITY_WINDOW_MS, Attention, DueCursor, DueCursors, PortError, Sweep};
use crate::ports::Activity;

/// The partition of the marks and of the last sweep.
pub const ACTIVITY_PK: &str = "activity";
/// The last sweep's sort key.
pub const SWEEP_SK: &str = "sweep";
/// The sort key of the records phase's places ([`DueCursors`]).
pub const CURSORS_SK: &str = "cursors";
/// How long a mark is kept (seconds): far longer than any reader looks back.
const MARK_KEPT_S: i64 = 2 * 86_400;

/// The window `now_ms` falls in (its start).
pub fn window(now_ms: i64) -> i64 {
    now_ms.div_euclid(ACTIVITY_WINDOW_MS) * ACTIVITY_WINDOW_MS
}

/// A mark's sort key: its window's start, zero-padded, so marks sort by time.
pub fn mark_sk(window_ms: i64) -> String {
    format!("mark#{:013}", window_ms.max(0))
}

/// The last sort key a mark can have.
pub const MARK_LAST: &str = "mark#9999999999999";

/// The update that marks `now_ms`'s window.
pub fn mark(now_ms: i64) -> cond::Update {
    cond::activity_mark(now_ms, window(now_ms) / 1000 + MARK_KEPT_S)
}

/// The last window a container marked (`i64::MIN`: none yet), shared by
/// the clones of its ledger.
#[derive(Clone, Debug)]
pub struct Marked(Arc<AtomicI64>);

impl Default for Marked {
    fn default() -> Self {
        Self(Arc::new(AtomicI64::new(i64::MIN)))
    }
}

impl Marked {
    /// Whether `now_ms`'s window needs a mark from this container.
    pub fn needs(&self, now_ms: i64) -> bool {
        self.0.load(Ordering::Relaxed) != window(now_ms)
    }

    /// `now_ms`'s window is marked.
    pub fn done(&self, now_ms: i64) {
        self.0.store(window(now_ms), Ordering::Relaxed);
    }
}

/// The last sweep, from its item.
pub fn sweep_of(item: &Item) -> Option<Sweep> {
    Some(Sweep {
        at_ms: get_n(item, "swept_at")?,
        quiet: matches!(item.get("quiet"), Some(AttributeValue::Bool(true))),
        attention: Attention {
            dead_letters: get_n(item, "dead_letters").unwrap_or(0).max(0) as u64,
            parked: get_n(item, "parked").unwrap_or(0).max(0) as u64,
            outbox_dead: get_n(item, "outbox_dead").unwrap_or(0).max(0) as u64,
        },
    })
}

/// The records phase's places, from their item (a shard whose place is
/// malformed is read from its oldest entry).
pub fn cursors_of(item: &Item) -> DueCursors {
    let mut shards = std::collections::BTreeMap::new();
    if let Some(AttributeValue::M(places)) = item.get("places") {
        for (shard, place) in places {
            let (Ok(shard), AttributeValue::L(l)) = (shard.parse::<u32>(), place) else { continue };
            if let [AttributeValue::N(at), AttributeValue::S(pk), AttributeValue::S(sk)] = &l[..]
                && let Ok(at) = at.parse::<i64>()
            {
                shards.insert(shard, DueCursor { due_at_ms: at, pk: pk.clone(), sk: sk.clone() });
            }
        }
    }
    DueCursors { shards, rewound_at_ms: get_n(item, "rewound_at"), at_ms: get_n(item, "cursors_at").unwrap_or(0) }
}

impl Activity for DynamoLedger {
    async fn note_activity(&self, now_ms: i64) {
        if !self.marked.needs(now_ms) {
            return;
        }
        match self.conditional(ACTIVITY_PK, &mark_sk(window(now_ms)), mark(now_ms), false).await {
            // Refused: a later mark of this window is there already.
            Ok(Written::Applied(_) | Written::Refused(_)) => self.marked.done(now_ms),
            Err(e) => tracing::debug!(error = %e, "activity mark not written; the next note tries again"),
        }
    }
}

impl DynamoLedger {
    /// Whether a mark of a window at `since_ms` or later exists (one query,
    /// at most one item read).
    pub(crate) async fn marked_since(&self, since_ms: i64) -> Result<bool, PortError> {
        let page = self
            .client()
            .query()
            .table_name(self.table())
            .key_condition_expression("pk = :pk AND sk BETWEEN :from AND :to")
            .expression_attribute_values(":pk", AttributeValue::S(ACTIVITY_PK.into()))
            .expression_attribute_values(":from", AttributeValue::S(mark_sk(window(since_ms))))
            .expression_attribute_values(":to", AttributeValue::S(MARK_LAST.into()))
            .limit(1)
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(page.items.is_some_and(|i| !i.is_empty()))
    }

    pub(crate) async fn read_sweep(&self) -> Result<Option<Sweep>, PortError> {
        Ok(self.read_item(ACTIVITY_PK, SWEEP_SK).await?.as_ref().and_then(sweep_of))
    }

    pub(crate) async fn read_cursors(&self) -> Result<DueCursors, PortError> {
        Ok(self.read_item(ACTIVITY_PK, CURSORS_SK).await?.as_ref().map(cursors_of).unwrap_or_default())
    }

    pub(crate) async fn write_cursors(&self, cursors: &DueCursors) -> Result<(), PortError> {
        // Refused: a later run's are kept already.
        self.conditional(ACTIVITY_PK, CURSORS_SK, cond::due_cursors(cursors), false).await.map(|_| ())
    }

    pub(crate) async fn write_sweep(&self, sweep: &Sweep) -> Result<(), PortError> {
        // Refused: a later run's sweep is kept already.
        self.conditional(ACTIVITY_PK, SWEEP_SK, cond::sweep_record(sweep), false).await.map(|_| ())
    }
}
