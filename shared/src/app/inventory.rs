//! Ordered deltas: `inventory.adjusted` events carry a per-SKU sequence
//! number and a delta. Each is applied exactly after its predecessor; a gap
//! is deferred until the missing delta arrives (woken by its commit), and
//! PARKED (`gap`) if it has not arrived within the gap bound.
//!
//! Event: `{"data": {"sku": "...", "seq": 3, "delta": -2}}`.

use std::collections::HashMap;

use super::{int_field, str_field};
use crate::projection::sequence::{Position, SeqDecision, apply_next, decide};
use crate::projection::{Decision, EventContext, Gap, PlanFuture, Projection, ProjectionContext, get_n, s};

pub struct Inventory;

pub fn inventory_pk(tenant: &str, sku: &str) -> String {
    format!("proj#inventory#{tenant}#{sku}")
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
            let last = cx.read_state(&pk).await?.and_then(|i| get_n(&i, "last_seq"));
            Ok(match decide(last, seq) {
                SeqDecision::Apply => {
                    let extra = HashMap::from([("sku".to_owned(), s(sku))]);
                    Decision::Apply(vec![apply_next(&cx.table, &pk, seq, "on_hand", delta, extra)])
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
