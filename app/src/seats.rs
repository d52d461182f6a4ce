//! Seed 001's model: a seat-allowance snapshot carrying an explicit
//! (generation, revision). Replace only if newer.
//!
//! Event (`seats.snapshot`): `{"data": {"account": "...", "generation": 1, "revision": 3, "seats": 20}}`.

use hookledger::projection::snapshot::{Version, replace_if_newer};
use hookledger::projection::state::required_n;
use hookledger::projection::{
    Decision, EventContext, Item, PlanFuture, Projection, ProjectionContext, ProjectionError, State, StateKey, n, s,
};

use super::{int_field, str_field};

pub struct SeatAllowance;

pub fn seats_pk(tenant: &str, account: &str) -> String {
    format!("proj#seats#{tenant}#{account}")
}

/// An account's seat allowance as stored, with the version it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seats {
    pub seats: i64,
    pub version: Version,
}

impl State for Seats {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        let version = Version { generation: required_n(item, "generation")?, revision: required_n(item, "revision")? };
        Ok(Self { seats: required_n(item, "seats")?, version })
    }
}

pub fn seats_key(tenant: &str, account: &str) -> StateKey<Seats> {
    StateKey::new(seats_pk(tenant, account))
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

    fn plan<'a>(&'a self, ev: &'a EventContext, _cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let d = &ev.body["data"];
            let account = str_field(d, "/account")?;
            let version =
                Version { generation: int_field(d, "/generation").unwrap_or(0), revision: int_field(d, "/revision")? };
            let seats = int_field(d, "/seats")?;
            let attrs = Item::from([
                ("account".to_owned(), s(account)),
                ("seats".to_owned(), n(seats)),
                ("event_id".to_owned(), s(&ev.event_id)),
            ]);
            Ok(Decision::Apply(vec![replace_if_newer(&seats_pk(&ev.tenant, account), version, attrs)]))
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{Bench, event};

    fn snapshot(id: &str, generation: i64, revision: i64, seats: i64) -> EventContext {
        let body = json!({"type": "seats.snapshot", "data": {"account": "acct_1", "generation": generation, "revision": revision, "seats": seats}});
        event("standard_webhooks", "seats.snapshot", id, body)
    }

    #[tokio::test]
    async fn a_newer_snapshot_replaces_an_older_one_is_stale_and_a_new_generation_restarts_the_revisions() {
        let b = Bench::new();
        let key = seats_key("t1", "acct_1");
        assert_eq!(b.project(&SeatAllowance, &snapshot("e1", 1, 4, 10)).await.1, Vec::<usize>::new());
        assert_eq!(b.project(&SeatAllowance, &snapshot("e0", 1, 3, 7)).await.1, [0], "older: stale");
        assert_eq!(b.project(&SeatAllowance, &snapshot("e1", 1, 4, 10)).await.1, [0], "the same: a repeat");
        assert_eq!(b.read(&key).await.map(|s| s.seats), Some(10));
        assert_eq!(b.project(&SeatAllowance, &snapshot("e2", 2, 1, 3)).await.1, Vec::<usize>::new());
        assert_eq!(b.read(&key).await, Some(Seats { seats: 3, version: Version { generation: 2, revision: 1 } }));
    }

    #[tokio::test]
    async fn a_snapshot_without_a_revision_is_refused_as_permanent() {
        let b = Bench::new();
        let body = json!({"data": {"account": "acct_1", "seats": 3}});
        let refused = b.plan(&SeatAllowance, &event("standard_webhooks", "seats.snapshot", "e", body)).await;
        assert!(matches!(refused, Err(ProjectionError::Permanent(_))), "{refused:?}");
    }
}
