//! The one checker of the promise, for both worlds: the simulator's memory
//! world and the emulator's chaos seeds (`tests/it/chaos.rs`). Each world
//! says what its providers sent ([`Expected`]) and shows what it holds at the
//! end ([`Observed`]: the ledger's items as domain items, what each
//! destination received); [`check`] names every broken promise:
//! - `lost`: a fact acknowledged (or recorded) that did not end PROCESSED, a
//!   projection with fewer effects than its applied facts, a delivery or an
//!   outbox message owed and never received, a notification whose truth was
//!   not fetched after it;
//! - `doubled`: more effects than applied facts, a destination that received
//!   a key no delivery owes (one (event, destination) under two keys);
//! - `wrongly_dead`: a record or an outbox item DEAD (the worlds' faults are
//!   all transient: a later retry would have completed it);
//! - `regressed`: a guarded projection that went back ([`Watch`]);
//! - `other`: a PARKED record the scenario does not explain, a false
//!   conflict.
//!
//! Liveness (everything terminal within the bound after faults stop) is the
//! worlds' to measure: they report a `liveness` violation through
//! [`Violation::new`].

use std::collections::{BTreeMap, BTreeSet};

use hookledger::item::{Item, get_n, get_s};

/// What a provider's event means, for its projection's expected state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    /// One ledger entry of `amount` on the balance at `state`.
    Payment { state: String, amount: i64 },
    /// One delta of an ordered stream at `state` (`on_hand`, `last_seq`).
    Delta { state: String, delta: i64 },
    /// A snapshot: the newest applied revision wins at `state` (`seats`).
    Snapshot { state: String, revision: i64, seats: i64 },
    /// A status by precedence: the highest-ranked applied one at `state`.
    Status { state: String, status: String, rank: i64 },
    /// One count at `state` (`count`), guarded only by the commit's fence.
    Tally { state: String },
    /// A subscription whose entitled seats at `state` are the provider's.
    Subscription { state: String, seats: i64 },
    /// A notification answered 2xx at `at_ms`: the truth at `state` must be
    /// fetched (`fetched_at`) at or after it.
    Notification { state: String, at_ms: i64 },
    /// No projection: only routes and deliveries.
    Routed,
}

/// One event a provider sent, with its stored key (`evt#...`).
#[derive(Debug, Clone)]
pub struct Sent {
    pub key: String,
    pub fact: Fact,
}

/// What the world's providers sent and were answered.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    pub sent: Vec<Sent>,
    /// Stored keys answered 2xx (the provider will not send them again).
    pub acknowledged: BTreeSet<String>,
    /// Whether a PARKED record's reason is one the scenario explains.
    pub parked_ok: Option<fn(&str) -> bool>,
}

/// What the world holds at the end.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Every item of the ledger table.
    pub items: Vec<Item>,
    /// What each destination received: destination name (`""`: the outbox
    /// notifications' topic) → idempotency keys (repeats allowed).
    pub arrivals: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub kind: &'static str,
    pub what: String,
}

impl Violation {
    pub fn new(kind: &'static str, what: impl Into<String>) -> Self {
        Self { kind, what: what.into() }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.what)
    }
}

fn text(i: &Item, name: &str) -> String {
    get_s(i, name).unwrap_or_default().to_owned()
}

fn number(i: &Item, name: &str) -> i64 {
    get_n(i, name).unwrap_or(0)
}

fn records(observed: &Observed) -> BTreeMap<String, &Item> {
    observed.items.iter().filter(|i| text(i, "sk") == "meta").map(|i| (text(i, "pk"), i)).collect()
}

/// Every broken promise in a settled world: [`statuses`] and [`outcomes`].
pub fn check(expected: &Expected, observed: &Observed) -> Vec<Violation> {
    let mut out = statuses(expected, observed);
    out.extend(outcomes(expected, observed));
    out.sort();
    out.dedup();
    out
}

/// The statuses of a settled world, before the operator's runbook: nothing
/// DEAD, PARKED only as the scenario explains, no false conflict.
pub fn statuses(expected: &Expected, observed: &Observed) -> Vec<Violation> {
    let mut out = Vec::new();
    let records = records(observed);
    for (pk, r) in &records {
        match text(r, "status").as_str() {
            "DEAD" => out.push(Violation::new(
                "wrongly_dead",
                format!("{pk}: DEAD ({} {})", text(r, "dead_reason"), text(r, "error_message")),
            )),
            "PARKED" => {
                let why = text(r, "park_reason");
                if !expected.parked_ok.is_some_and(|ok| ok(&why)) {
                    out.push(Violation::new("other", format!("{pk}: PARKED ({why})")));
                }
            }
            _ => {}
        }
        if number(r, "conflicts") > 0 {
            out.push(Violation::new("other", format!("{pk}: {} false conflicts", number(r, "conflicts"))));
        }
    }
    for i in observed.items.iter().filter(|i| text(i, "sk") == "outbox" && text(i, "status") == "DEAD") {
        out.push(Violation::new("wrongly_dead", format!("{}: outbox item DEAD", text(i, "pk"))));
    }
    out.sort();
    out
}

/// The outcomes of a settled world after the runbook: everything owed
/// PROCESSED, each projection what its applied facts say, every delivery
/// and outbox message received under its own key and nothing else.
pub fn outcomes(expected: &Expected, observed: &Observed) -> Vec<Violation> {
    let mut out = Vec::new();
    let records = records(observed);
    let state: BTreeMap<String, &Item> =
        observed.items.iter().filter(|i| text(i, "sk") == "state").map(|i| (text(i, "pk"), i)).collect();
    let outbox: Vec<&Item> = observed.items.iter().filter(|i| text(i, "sk") == "outbox").collect();
    // Owed: everything acknowledged or recorded ends PROCESSED.
    let mut owed: BTreeSet<&str> = expected.acknowledged.iter().map(String::as_str).collect();
    owed.extend(records.keys().map(String::as_str));
    for key in owed {
        match records.get(key).map(|r| text(r, "status")) {
            None => out.push(Violation::new("lost", format!("{key}: acknowledged but no record"))),
            Some(st) if st == "PROCESSED" => {}
            Some(st) => out.push(Violation::new("lost", format!("{key}: ended {st}"))),
        }
    }
    // Projections: what their applied facts say.
    let applied: Vec<&Fact> = expected
        .sent
        .iter()
        .filter(|s| {
            records.get(&s.key).is_some_and(|r| text(r, "status") == "PROCESSED" && text(r, "outcome") != "resolved")
        })
        .map(|s| &s.fact)
        .collect();
    projections(&applied, expected, &state, &mut out);
    // The outbox: every item SENT, each destination got exactly the keys owed.
    for i in outbox.iter().filter(|i| text(i, "status") != "SENT") {
        out.push(Violation::new("lost", format!("{}: outbox item {}", text(i, "pk"), text(i, "status"))));
    }
    let mut destinations: BTreeSet<String> = observed.arrivals.keys().cloned().collect();
    destinations.extend(outbox.iter().map(|i| text(i, "destination")));
    for d in destinations {
        let owed: BTreeSet<String> =
            outbox.iter().filter(|i| text(i, "destination") == d).map(|i| text(i, "idempotency_key")).collect();
        let got: BTreeSet<String> = observed.arrivals.get(&d).into_iter().flatten().cloned().collect();
        let name = if d.is_empty() { "the notifications' topic".to_owned() } else { format!("destination {d}") };
        for k in owed.difference(&got) {
            out.push(Violation::new("lost", format!("{k} never reached {name}")));
        }
        for k in got.difference(&owed) {
            out.push(Violation::new("doubled", format!("{name} got {k}, which no delivery owes")));
        }
    }
    out.sort();
    out.dedup();
    out
}

fn projections(applied: &[&Fact], expected: &Expected, state: &BTreeMap<String, &Item>, out: &mut Vec<Violation>) {
    let get = |pk: &str, name: &str| state.get(pk).map(|i| number(i, name));
    let mut pks: BTreeMap<&str, Vec<&Fact>> = BTreeMap::new();
    for f in applied {
        let pk = match f {
            Fact::Payment { state, .. }
            | Fact::Delta { state, .. }
            | Fact::Snapshot { state, .. }
            | Fact::Status { state, .. }
            | Fact::Tally { state }
            | Fact::Subscription { state, .. } => state.as_str(),
            Fact::Notification { .. } | Fact::Routed => continue,
        };
        pks.entry(pk).or_default().push(f);
    }
    fn count(out: &mut Vec<Violation>, what: String, got: i64, want: i64) {
        if got < want {
            out.push(Violation::new("lost", format!("{what}: {got}, expected {want}")));
        } else if got > want {
            out.push(Violation::new("doubled", format!("{what}: {got}, expected {want}")));
        }
    }
    for (pk, facts) in &pks {
        match facts[0] {
            Fact::Payment { .. } => {
                let want: i64 =
                    facts.iter().map(|f| if let Fact::Payment { amount, .. } = f { *amount } else { 0 }).sum();
                count(out, format!("{pk} entries"), get(pk, "entries").unwrap_or(0), facts.len() as i64);
                count(out, format!("{pk} balance"), get(pk, "balance").unwrap_or(0), want);
            }
            Fact::Delta { .. } => {
                let want: i64 = facts.iter().map(|f| if let Fact::Delta { delta, .. } = f { *delta } else { 0 }).sum();
                count(out, format!("{pk} deltas applied"), get(pk, "last_seq").unwrap_or(0), facts.len() as i64);
                count(out, format!("{pk} on hand"), get(pk, "on_hand").unwrap_or(0), want);
            }
            Fact::Tally { .. } => count(out, format!("{pk} count"), get(pk, "count").unwrap_or(0), facts.len() as i64),
            Fact::Snapshot { .. } => {
                let newest = facts
                    .iter()
                    .filter_map(|f| {
                        if let Fact::Snapshot { revision, seats, .. } = f { Some((*revision, *seats)) } else { None }
                    })
                    .max();
                let got = (get(pk, "revision").unwrap_or(0), get(pk, "seats").unwrap_or(0));
                if Some(got) != newest {
                    out.push(Violation::new(
                        "regressed",
                        format!("{pk}: revision/seats {got:?}, newest applied {newest:?}"),
                    ));
                }
            }
            Fact::Status { .. } => {
                let best = facts
                    .iter()
                    .filter_map(|f| {
                        if let Fact::Status { rank, status, .. } = f { Some((*rank, status.as_str())) } else { None }
                    })
                    .max();
                let got = state.get(*pk).map(|i| text(i, "status")).unwrap_or_default();
                if Some(got.as_str()) != best.map(|(_, s)| s) {
                    out.push(Violation::new("lost", format!("{pk}: status {got:?}, expected {best:?}")));
                }
            }
            Fact::Subscription { seats, .. } => {
                count(out, format!("{pk} entitled seats"), get(pk, "seats").unwrap_or(0), *seats);
            }
            Fact::Notification { .. } | Fact::Routed => {}
        }
    }
    // Notifications: the truth fetched after the last one answered 2xx.
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    for s in &expected.sent {
        if let Fact::Notification { state, at_ms } = &s.fact {
            let at = last.entry(state.as_str()).or_insert(*at_ms);
            *at = (*at).max(*at_ms);
        }
    }
    for (pk, at) in last {
        let fetched = get(pk, "fetched_at");
        if fetched.is_none_or(|f| f < at) {
            out.push(Violation::new(
                "lost",
                format!("{pk}: a notification answered at {at} never fetched the truth (last fetch {fetched:?})"),
            ));
        }
    }
}

/// Guarded projections never go back: the watched attributes of each state
/// item, seen after every step, only move forward.
#[derive(Debug, Default)]
pub struct Watch {
    seen: BTreeMap<(String, &'static str), i64>,
}

impl Watch {
    /// Looks at `item`'s `attrs` (each must not decrease); a regression is
    /// returned.
    pub fn see(&mut self, pk: &str, item: Option<&Item>, attrs: &[&'static str]) -> Option<Violation> {
        let item = item?;
        for attr in attrs {
            let Some(now) = get_n(item, attr) else { continue };
            let was = self.seen.entry((pk.to_owned(), attr)).or_insert(now);
            if now < *was {
                return Some(Violation::new("regressed", format!("{pk}: {attr} went from {was} to {now}")));
            }
            *was = now;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookledger::item::{n, s};

    fn item(pairs: &[(&str, hookledger::item::Value)]) -> Item {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    fn record(pk: &str, status: &str) -> Item {
        item(&[("pk", s(pk)), ("sk", s("meta")), ("status", s(status)), ("outcome", s("applied"))])
    }

    #[test]
    fn it_names_a_lost_a_doubled_a_dead_and_a_regressed_outcome() {
        let expected = Expected {
            sent: vec![
                Sent { key: "a".into(), fact: Fact::Tally { state: "t".into() } },
                Sent { key: "b".into(), fact: Fact::Tally { state: "t".into() } },
                Sent { key: "c".into(), fact: Fact::Snapshot { state: "s".into(), revision: 2, seats: 5 } },
                Sent { key: "d".into(), fact: Fact::Snapshot { state: "s".into(), revision: 1, seats: 3 } },
            ],
            acknowledged: ["a", "b", "c", "d", "e"].into_iter().map(str::to_owned).collect(),
            parked_ok: None,
        };
        let mut observed = Observed {
            items: vec![
                record("a", "PROCESSED"),
                record("b", "PROCESSED"),
                record("c", "PROCESSED"),
                record("d", "PROCESSED"),
                record("e", "PROCESSED"),
                item(&[("pk", s("t")), ("sk", s("state")), ("count", n(2))]),
                item(&[("pk", s("s")), ("sk", s("state")), ("revision", n(2)), ("seats", n(5))]),
            ],
            arrivals: BTreeMap::new(),
        };
        assert_eq!(check(&expected, &observed), []);
        observed.items[5] = item(&[("pk", s("t")), ("sk", s("state")), ("count", n(3))]);
        observed.items[6] = item(&[("pk", s("s")), ("sk", s("state")), ("revision", n(1)), ("seats", n(3))]);
        observed.items[4] = record("e", "DEAD");
        let kinds: Vec<&str> = check(&expected, &observed).iter().map(|v| v.kind).collect();
        assert_eq!(kinds, ["doubled", "lost", "regressed", "wrongly_dead"]);
    }

    #[test]
    fn deliveries_are_owed_by_their_items_and_only_by_them() {
        let out = |st: &str, key: &str| {
            item(&[
                ("pk", s(key)),
                ("sk", s("outbox")),
                ("status", s(st)),
                ("destination", s("q")),
                ("idempotency_key", s(key)),
            ])
        };
        let expected = Expected::default();
        let observed = Observed {
            items: vec![out("SENT", "k1"), out("SENT", "k2")],
            arrivals: BTreeMap::from([("q".to_owned(), vec!["k1".to_owned(), "k1".to_owned(), "k3".to_owned()])]),
        };
        let got: Vec<String> = check(&expected, &observed).iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            ["doubled: destination q got k3, which no delivery owes", "lost: k2 never reached destination q"]
        );
    }

    #[test]
    fn a_notification_needs_a_fetch_after_its_answer() {
        let expected = Expected {
            sent: vec![Sent { key: "n".into(), fact: Fact::Notification { state: "f".into(), at_ms: 100 } }],
            ..Expected::default()
        };
        let fetched = |at| Observed {
            items: vec![item(&[("pk", s("f")), ("sk", s("state")), ("fetched_at", n(at))])],
            arrivals: BTreeMap::new(),
        };
        assert_eq!(check(&expected, &fetched(100)), []);
        assert_eq!(check(&expected, &fetched(99))[0].kind, "lost");
    }

    #[test]
    fn a_watched_attribute_may_not_go_back() {
        let mut w = Watch::default();
        let at = |r| item(&[("revision", n(r))]);
        assert!(w.see("s", Some(&at(1)), &["revision"]).is_none());
        assert!(w.see("s", Some(&at(3)), &["revision"]).is_none());
        assert_eq!(w.see("s", Some(&at(2)), &["revision"]).unwrap().kind, "regressed");
    }
}
