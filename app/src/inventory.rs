//! Ordered deltas: `inventory.adjusted` events carry a per-SKU sequence
//! number and a delta. Each is applied exactly after its predecessor; a gap
//! is deferred until the missing delta arrives (woken by its commit), and
//! PARKED (`gap`) if it has not arrived within the gap bound.
//!
//! Event: `{"data": {"sku": "...", "seq": 3, "delta": -2}}`.

use hookledger::projection::sequence::{Position, SeqDecision, Stream, apply_next, decide, stream_key};
use hookledger::projection::{
    Decision, EventContext, Gap, Item, PlanFuture, Projection, ProjectionContext, StateKey, s,
};

use super::{int_field, str_field};

pub struct Inventory;

pub fn inventory_pk(tenant: &str, sku: &str) -> String {
    format!("proj#inventory#{tenant}#{sku}")
}

/// A SKU's stream of deltas (its last applied sequence number; the
/// quantity `on_hand` is on the same item).
pub fn inventory_key(tenant: &str, sku: &str) -> StateKey<Stream> {
    stream_key(inventory_pk(tenant, sku))
}

impl Projection for Inventory {
    fn name(&self) -> &'static str {
        "inventory"
    }

    fn handles(&self, _provider: &str, event_type: &str) -> bool {
        event_type == "inventory.adjusted"
    }

    fn subject(&self, ev: &EventContext) -> Option<String> {
        ev.body["data"]["sku"].as_str().map(str::to_owned)
    }

    fn plan<'a>(&'a self, ev: &'a EventContext, cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let d = &ev.body["data"];
            let sku = str_field(d, "/sku")?;
            let seq = int_field(d, "/seq")?;
            let delta = int_field(d, "/delta")?;
            let pk = inventory_pk(&ev.tenant, sku);
            let last = cx.read(&inventory_key(&ev.tenant, sku)).await?.and_then(|st| st.last_seq);
            Ok(match decide(last, seq) {
                SeqDecision::Apply => {
                    let extra = Item::from([("sku".to_owned(), s(sku))]);
                    Decision::Apply(vec![apply_next(&pk, seq, "on_hand", delta, extra)])
                }
                SeqDecision::Duplicate => Decision::Ignore("sequence already applied"),
                SeqDecision::Gap { expected } => Decision::Defer(Gap {
                    reason: format!("{sku}: waiting for seq {expected}, got {seq}"),
                    waiter: Some(Position { stream: pk, seq }),
                }),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use hookledger::projection::get_n;
    use serde_json::json;

    use super::*;
    use crate::testing::{Bench, event, ops};

    fn delta(seq: i64, d: i64) -> EventContext {
        let body = json!({"type": "inventory.adjusted", "data": {"sku": "sku-1", "seq": seq, "delta": d}});
        event("standard_webhooks", "inventory.adjusted", &format!("inv-{seq}"), body)
    }

    #[tokio::test]
    async fn deltas_apply_in_sequence_a_gap_waits_and_a_repeat_is_ignored() {
        let b = Bench::new();
        let key = inventory_key("t1", "sku-1");
        assert!(b.project(&Inventory, &delta(1, 10)).await.1.is_empty());
        let (gap, _) = b.project(&Inventory, &delta(3, -4)).await;
        let Decision::Defer(gap) = gap else { panic!("{gap:?}") };
        assert_eq!(gap.waiter, Some(Position { stream: inventory_pk("t1", "sku-1"), seq: 3 }), "waits for 2 at 3");
        let (repeat, _) = b.project(&Inventory, &delta(1, 10)).await;
        assert!(matches!(repeat, Decision::Ignore(_)), "{repeat:?}");
        let two = b.plan(&Inventory, &delta(2, 5)).await.unwrap();
        assert_eq!(ops(&two)[0].advances, Some(Position { stream: inventory_pk("t1", "sku-1"), seq: 2 }));
        assert!(b.commit(ops(&two)).is_empty());
        assert_eq!(b.commit(ops(&two)), [0], "planned on 1, the stream is at 2: replanned, not applied twice");
        assert!(b.project(&Inventory, &delta(3, -4)).await.1.is_empty());
        assert_eq!(b.read(&key).await.and_then(|s| s.last_seq), Some(3));
        assert_eq!(b.item(key.pk()).and_then(|i| get_n(&i, "on_hand")), Some(11));
    }
}
