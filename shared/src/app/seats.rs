//! Seed 001's model: a seat-allowance snapshot carrying an explicit
//! (generation, revision). Replace only if newer.
//!
//! Event (`seats.snapshot`): `{"data": {"account": "...", "generation": 1, "revision": 3, "seats": 20}}`.

use std::collections::HashMap;

use super::{int_field, str_field};
use crate::projection::snapshot::{Version, replace_if_newer};
use crate::projection::{Decision, EventContext, PlanFuture, Projection, ProjectionContext, n, s};

pub struct SeatAllowance;

pub fn seats_pk(tenant: &str, account: &str) -> String {
    format!("proj#seats#{tenant}#{account}")
}

impl Projection for SeatAllowance {
    fn name(&self) -> &'static str {
        "seat_allowance"
    }

    fn handles(&self, _provider: &str, event_type: &str) -> bool {
        event_type == "seats.snapshot"
    }

    fn subject(&self, ev: &EventContext) -> Option<String> {
        ev.body["data"]["account"].as_str().map(str::to_owned)
    }

    fn plan<'a>(&'a self, ev: &'a EventContext, cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let d = &ev.body["data"];
            let account = str_field(d, "/account")?;
            let version =
                Version { generation: int_field(d, "/generation").unwrap_or(0), revision: int_field(d, "/revision")? };
            let seats = int_field(d, "/seats")?;
            let attrs = HashMap::from([
                ("account".to_owned(), s(account)),
                ("seats".to_owned(), n(seats)),
                ("event_id".to_owned(), s(&ev.event_id)),
            ]);
            Ok(Decision::Apply(vec![replace_if_newer(&cx.table, &seats_pk(&ev.tenant, account), version, attrs)]))
        })
    }
}
