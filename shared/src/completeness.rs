//! The audit of provider truth: for one endpoint and a window, what the
//! provider lists (Stripe's events, a GitHub hook's deliveries) side by
//! side with what the ledger holds and what every route delivered.
//!
//! The provider's list is read page by page ([`BackfillSource`], the
//! backfill's readers); each listed identity is read from the ledger by key
//! (one batched read per hundred identities: no index, no scan), and so are
//! the delivery items of the routes each recorded event matches. So the
//! audit's requests grow with the window's listed events, never with the
//! table. What it reports:
//!
//! - listed, recorded, applied, ignored (settled without applying: stale,
//!   duplicate, ignored, resolved), PARKED, DEAD, in flight;
//! - **missing**: listed, never recorded (repair: `hookledger backfill`);
//! - **doubled**: one listed fact held twice: its body recorded again under
//!   another identity and both applied, or a delivery to a destination
//!   under another key than its (event, destination) key. Must be 0;
//! - per route: delivered, pending (and the oldest), DEAD, and applied
//!   events the route matches with no delivery at all;
//! - the time from receipt to outcome (p50, p99).
//!
//! An endpoint whose provider keeps no list is audited from the attention
//! index (its DEAD and PARKED records received in the window) and its
//! routes' delivery items; the report says that completeness cannot be
//! proven without the provider's list.

use std::collections::{BTreeMap, BTreeSet};

use crate::identity::EventKey;
use crate::ledger::{PortError, Row, Status};
use crate::ports::{BackfillSource, OperatorLedger, OutboxStore, RowFilter, SourceError, Window};
use crate::routes::Routes;

/// At most this many identities of each list (missing, DEAD, PARKED,
/// doubled) are kept in a report; the counts are always whole.
pub const LISTED_ITEMS: usize = 200;
/// The most delivery items read from one partition without a list.
pub const CENSUS_READS: usize = 10_000;
/// The most pages of the provider's list one audit reads.
pub const DEFAULT_MAX_PAGES: u32 = 500;

/// What is audited.
#[derive(Debug, Clone)]
pub struct Scope<'a> {
    pub provider: &'a str,
    pub endpoint: &'a str,
    pub tenant: &'a str,
    /// Created (listed) or received (no list) at or after, unix seconds.
    pub since_s: i64,
    /// Before, unix seconds.
    pub until_s: i64,
    pub routes: &'a Routes,
    pub now_ms: i64,
    /// Event types the provider listed, by event key (a record without its
    /// own type is routed by it).
    pub types: BTreeMap<String, String>,
    /// What a repair's `backfill` needs besides the window to read the
    /// same list (` --github-hook repos/o/r/hooks/1`, ` --account acct_1`).
    pub repair_flags: String,
}

/// One identity the report names, and what repairs it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Named {
    pub key: String,
    pub event_type: Option<String>,
    /// Why it is listed (a dead reason, a park reason, what is doubled).
    pub why: Option<String>,
    /// The command that repairs it, when there is one.
    pub repair: Option<String>,
}

/// One route's deliveries of the audited events.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RouteTally {
    pub delivered: u64,
    pub pending: u64,
    pub dead: u64,
    /// Applied events the route matches with no delivery item.
    pub never_queued: u64,
    /// How long the oldest pending one has waited, in ms.
    pub oldest_pending_ms: Option<i64>,
}

/// The audit of one endpoint's window.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub endpoint: String,
    pub provider: String,
    pub since: i64,
    pub until: i64,
    pub at_ms: i64,
    /// Whether the provider's own list was read: without it, completeness
    /// cannot be proven and `listed` and `missing` are not known.
    pub provider_truth: bool,
    pub listed: u64,
    pub recorded: u64,
    pub applied: u64,
    pub ignored: u64,
    pub parked: u64,
    pub dead: u64,
    pub in_flight: u64,
    pub missing: u64,
    pub doubled: u64,
    /// Settled outcomes other than applied, by outcome.
    pub outcomes: BTreeMap<String, u64>,
    pub routes: BTreeMap<String, RouteTally>,
    /// Receipt to outcome of the finished events, in ms.
    pub outcome_p50_ms: Option<i64>,
    pub outcome_p99_ms: Option<i64>,
    pub missing_items: Vec<Named>,
    pub dead_items: Vec<Named>,
    pub parked_items: Vec<Named>,
    pub doubled_items: Vec<Named>,
    /// DEAD deliveries (at most [`LISTED_ITEMS`]).
    pub dead_deliveries: Vec<Named>,
    /// Said when the report is not the whole truth.
    pub notes: Vec<String>,
    /// Requests: the provider's pages read.
    pub pages: u32,
}

impl Report {
    /// Whether anything is missing or doubled (the command exits non-zero).
    pub fn failed(&self) -> bool {
        self.missing > 0 || self.doubled > 0
    }

    /// The report without its lists (what the scheduled audit keeps per
    /// endpoint, with the first 20 of each list).
    pub fn summary(&self) -> Self {
        let mut s = self.clone();
        for list in
            [&mut s.missing_items, &mut s.dead_items, &mut s.parked_items, &mut s.doubled_items, &mut s.dead_deliveries]
        {
            list.truncate(20);
        }
        s
    }
}

/// Why an audit could not finish.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("the provider's list could not be read: {0}")]
    Source(String),
    #[error(transparent)]
    Storage(#[from] PortError),
}

fn text<'a>(row: &'a Row, k: &str) -> Option<&'a str> {
    row.get(k).and_then(serde_json::Value::as_str)
}

fn num(row: &Row, k: &str) -> Option<i64> {
    row.get(k).and_then(serde_json::Value::as_i64)
}

fn push(list: &mut Vec<Named>, named: Named) {
    if list.len() < LISTED_ITEMS {
        list.push(named);
    }
}

fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[at])
}

/// A DEAD delivery as the report names it, with its replay.
fn dead_delivery(event_key: &str, destination: &str, error: Option<&str>) -> Named {
    Named {
        key: event_key.to_owned(),
        event_type: None,
        why: Some(format!("to {destination}: {}", error.unwrap_or("dead"))),
        repair: Some(format!(
            "hookledger deliveries replay --event '{event_key}' --destination {destination} --reason 'audit: DEAD'"
        )),
    }
}

fn replay_command(key: &str) -> String {
    format!("hookledger replay '{key}' --reason 'audit: DEAD'")
}

/// Reads the provider's list for the window: the identities, once each
/// (GitHub lists a delivery and its redeliveries under one id), with their
/// types, and the pages read. Unavailable or rate-limited pages are retried
/// by the caller's next run; the audit fails rather than report a partial
/// list as complete.
pub async fn listed<S: BackfillSource>(
    source: &S,
    window: &Window,
    max_pages: u32,
) -> Result<(BTreeMap<String, (Option<String>, i64)>, u32, bool), AuditError> {
    listed_until(source, window, max_pages, || false).await
}

/// [`listed`], stopping (partial) once `past()` says the caller's time is
/// up (the reconciler's invocation).
pub async fn listed_until<S: BackfillSource>(
    source: &S,
    window: &Window,
    max_pages: u32,
    past: impl Fn() -> bool,
) -> Result<(BTreeMap<String, (Option<String>, i64)>, u32, bool), AuditError> {
    let mut out = BTreeMap::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        if pages >= max_pages || (pages > 0 && past()) {
            return Ok((out, pages, true));
        }
        let page = source.page(window, cursor.as_deref()).await.map_err(|e| AuditError::Source(source_error(&e)))?;
        pages += 1;
        for e in page.events {
            if (window.since_s..window.until_s).contains(&e.created_s) {
                out.entry(e.event_id).or_insert((e.event_type, e.created_s));
            }
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok((out, pages, false)),
        }
    }
}

fn source_error(e: &SourceError) -> String {
    match e {
        SourceError::RateLimited { retry_after_s, .. } => {
            format!("rate limited (retry after {}s)", retry_after_s.map_or("?".into(), |s| s.to_string()))
        }
        SourceError::Unavailable(m) | SourceError::Rejected(m) => m.clone(),
        other => format!("{other:?}"),
    }
}

/// The audit itself, over the ledger and the delivery items.
pub struct Audit<'a, L, O> {
    pub ledger: &'a L,
    pub outbox: &'a O,
}

impl<L: OperatorLedger, O: OutboxStore> Audit<'_, L, O> {
    /// Audits what the provider listed (`listed`: event id → type, created).
    pub async fn of_listed(
        &self,
        scope: &Scope<'_>,
        listed: &BTreeMap<String, (Option<String>, i64)>,
        pages: u32,
        partial: bool,
    ) -> Result<Report, AuditError> {
        let mut scope = scope.clone();
        scope.types = listed
            .iter()
            .filter_map(|(id, (t, _))| {
                Some((EventKey::new(scope.provider, scope.endpoint, id).as_str().to_owned(), t.clone()?))
            })
            .collect();
        let scope = &scope;
        let mut report = self.empty(scope, true);
        report.pages = pages;
        report.listed = listed.len() as u64;
        if partial {
            report.notes.push(format!(
                "the provider's list was not read to its end ({pages} pages: the page limit, or the run's time): \
                 only those events were audited (narrow the window)"
            ));
        }
        let keys: Vec<EventKey> = listed.keys().map(|id| EventKey::new(scope.provider, scope.endpoint, id)).collect();
        let records = self.ledger.records(&keys).await?;
        let by_key: BTreeMap<&str, &Row> = records.iter().filter_map(|r| Some((text(r, "pk")?, r))).collect();
        for (id, (event_type, created_s)) in listed {
            let key = EventKey::new(scope.provider, scope.endpoint, id);
            if !by_key.contains_key(key.as_str()) {
                report.missing += 1;
                push(
                    &mut report.missing_items,
                    Named {
                        key: key.as_str().to_owned(),
                        event_type: event_type.clone(),
                        why: Some("listed by the provider, never recorded".into()),
                        repair: Some(format!(
                            "hookledger backfill --endpoint {} --since {} --until {}{}",
                            scope.endpoint,
                            created_s,
                            created_s + 1,
                            scope.repair_flags
                        )),
                    },
                );
            }
        }
        self.tally(scope, &mut report, &records).await?;
        self.doubled_by_body(scope, &mut report, &records).await?;
        Ok(report)
    }

    /// Audits what the ledger's attention index holds for the endpoint
    /// (its DEAD and PARKED records received in the window), without a
    /// provider's list.
    pub async fn without_list(&self, scope: &Scope<'_>) -> Result<Report, AuditError> {
        let mut report = self.empty(scope, false);
        report.notes.push(
            "this provider keeps no list of what it sent: completeness cannot be proven without provider truth; \
             what is shown is what the ledger holds (DEAD, PARKED) and what the routes hold"
                .into(),
        );
        let filter = RowFilter {
            endpoint: Some(scope.endpoint),
            since_ms: scope.since_s * 1000,
            until_ms: scope.until_s * 1000 - 1,
            ..RowFilter::default()
        };
        let mut keys = Vec::new();
        for status in [Status::Dead, Status::Parked] {
            for shard in 0..self.ledger.shards() {
                for row in self.ledger.rows(status, shard, &filter, usize::MAX).await? {
                    keys.extend(text(&row, "pk").and_then(EventKey::from_stored));
                }
            }
        }
        let records = self.ledger.records(&keys).await?;
        self.tally(scope, &mut report, &records).await?;
        self.deliveries_now(scope, &mut report).await?;
        Ok(report)
    }

    /// Without a list, the routes' tallies are the endpoint's deliveries
    /// the ledger holds now, whatever their event's time: every item still
    /// to send (each shard's home partition, and each destination's
    /// waiting partition) and every DEAD one (each shard's DEAD partition),
    /// at most [`CENSUS_READS`] a partition, those of the endpoint's events.
    async fn deliveries_now(&self, scope: &Scope<'_>, report: &mut Report) -> Result<(), AuditError> {
        use crate::ports::OutboxPartition;
        let prefix = format!("{}#", EventKey::new(scope.provider, scope.endpoint, "").as_str().trim_end_matches('#'));
        let mut seen = BTreeSet::new();
        let mut partial = false;
        let mut partitions: Vec<OutboxPartition<'_>> = Vec::new();
        for shard in 0..self.ledger.shards() {
            partitions.push(OutboxPartition::Home(shard));
            partitions.push(OutboxPartition::Dead(shard));
        }
        partitions.extend(scope.routes.destinations().iter().map(|d| OutboxPartition::Waiting(d.name.as_str())));
        for partition in partitions {
            let (states, more) = self.outbox.states_in(partition, CENSUS_READS).await?;
            partial |= more;
            for state in states {
                let Some(destination) = state.destination.clone() else { continue };
                if !state.event_key.starts_with(&prefix) || !seen.insert(state.id.clone()) {
                    continue;
                }
                let tally = report.routes.entry(destination.clone()).or_default();
                if state.status == "DEAD" {
                    tally.dead += 1;
                    push(
                        &mut report.dead_deliveries,
                        dead_delivery(&state.event_key, &destination, state.last_error.as_deref()),
                    );
                } else if state.status != "SENT" {
                    tally.pending += 1;
                    let waited = scope.now_ms - state.created_at.unwrap_or(scope.now_ms);
                    tally.oldest_pending_ms = Some(tally.oldest_pending_ms.map_or(waited, |o| o.max(waited)));
                }
            }
        }
        report.notes.push(
            "the routes' figures are the endpoint's deliveries still to send or DEAD now, whatever their event's time \
             (delivered ones are not counted without a list)"
                .into(),
        );
        if partial {
            report
                .notes
                .push(format!("a partition held more than {CENSUS_READS} deliveries: the counts are at least these"));
        }
        Ok(())
    }

    fn empty(&self, scope: &Scope<'_>, provider_truth: bool) -> Report {
        Report {
            endpoint: scope.endpoint.to_owned(),
            provider: scope.provider.to_owned(),
            since: scope.since_s,
            until: scope.until_s,
            at_ms: scope.now_ms,
            provider_truth,
            ..Report::default()
        }
    }

    /// Counts the records by status and outcome, and reads the delivery
    /// items of the routes each one matches.
    async fn tally(&self, scope: &Scope<'_>, report: &mut Report, records: &[Row]) -> Result<(), AuditError> {
        let mut latencies = Vec::new();
        // (outbox id) → (destination, event key, applied).
        let mut expected: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut applied_routes: BTreeSet<String> = BTreeSet::new();
        for r in records {
            let Some(key) = text(r, "pk") else { continue };
            report.recorded += 1;
            let status = text(r, "status").and_then(Status::parse);
            let event_type = text(r, "event_type").map(str::to_owned);
            let named = |why: Option<&str>, repair: Option<String>| Named {
                key: key.to_owned(),
                event_type: event_type.clone(),
                why: why.map(str::to_owned),
                repair,
            };
            match status {
                Some(Status::Processed) => {
                    match text(r, "outcome").unwrap_or("applied") {
                        "applied" => report.applied += 1,
                        other => {
                            report.ignored += 1;
                            *report.outcomes.entry(other.to_owned()).or_default() += 1;
                        }
                    }
                    if let (Some(at), Some(done)) = (num(r, "received_at"), num(r, "processed_at")) {
                        latencies.push((done - at).max(0));
                    }
                }
                Some(Status::Dead) => {
                    report.dead += 1;
                    push(&mut report.dead_items, named(text(r, "dead_reason"), Some(replay_command(key))));
                }
                Some(Status::Parked) => {
                    report.parked += 1;
                    push(&mut report.parked_items, named(text(r, "park_reason"), Some(replay_command(key))));
                }
                _ => report.in_flight += 1,
            }
            let tenant = text(r, "tenant").unwrap_or(scope.tenant);
            let applied = status == Some(Status::Processed) && text(r, "outcome").unwrap_or("applied") == "applied";
            // The record's type, else the provider's (the list's): without
            // either, every destination is read (what exists is counted).
            let known = event_type.as_deref().or_else(|| scope.types.get(key).map(String::as_str));
            let destinations = match known {
                Some(t) => scope.routes.matching(scope.endpoint, scope.provider, tenant, t),
                None => scope.routes.destinations().iter().collect(),
            };
            for d in destinations {
                let action = crate::routes::delivery_action(&d.name);
                let id = crate::message::outbox_id(key, &action);
                if applied && known.is_some() {
                    applied_routes.insert(id.clone());
                }
                expected.insert(id, (d.name.clone(), key.to_owned()));
            }
        }
        latencies.sort_unstable();
        report.outcome_p50_ms = percentile(&latencies, 0.50);
        report.outcome_p99_ms = percentile(&latencies, 0.99);
        for d in scope.routes.destinations() {
            report.routes.entry(d.name.clone()).or_default();
        }
        let ids: Vec<String> = expected.keys().cloned().collect();
        let mut found = BTreeSet::new();
        for state in self.outbox.states(&ids).await? {
            let Some((destination, event_key)) = expected.get(&state.id) else { continue };
            found.insert(state.id.clone());
            let tally = report.routes.entry(destination.clone()).or_default();
            match state.status.as_str() {
                "SENT" => tally.delivered += 1,
                "DEAD" => {
                    tally.dead += 1;
                    push(
                        &mut report.dead_deliveries,
                        dead_delivery(event_key, destination, state.last_error.as_deref()),
                    );
                }
                _ => {
                    tally.pending += 1;
                    let waited = scope.now_ms - state.created_at.unwrap_or(scope.now_ms);
                    tally.oldest_pending_ms = Some(tally.oldest_pending_ms.map_or(waited, |o| o.max(waited)));
                }
            }
            let stable = crate::message::idempotency_key(event_key, &crate::routes::delivery_action(destination));
            if state.idempotency_key != stable {
                report.doubled += 1;
                push(
                    &mut report.doubled_items,
                    Named {
                        key: event_key.clone(),
                        event_type: None,
                        why: Some(format!(
                            "delivered to {destination} under the key {}, not its (event, destination) key",
                            state.idempotency_key
                        )),
                        repair: None,
                    },
                );
            }
        }
        for id in applied_routes.difference(&found) {
            if let Some((destination, _)) = expected.get(id) {
                report.routes.entry(destination.clone()).or_default().never_queued += 1;
            }
        }
        Ok(())
    }

    /// A listed fact whose body was recorded again under another identity
    /// (`last_body_replay_id`), both records applied: one fact, applied twice.
    async fn doubled_by_body(&self, scope: &Scope<'_>, report: &mut Report, records: &[Row]) -> Result<(), AuditError> {
        let applied =
            |r: &Row| text(r, "status") == Some("PROCESSED") && text(r, "outcome").unwrap_or("applied") == "applied";
        let mut others = Vec::new();
        for r in records.iter().filter(|r| applied(r)) {
            if let (Some(key), Some(other)) = (text(r, "pk"), text(r, "last_body_replay_id")) {
                let other = EventKey::new(scope.provider, scope.endpoint, other);
                if other.as_str() != key {
                    others.push((key.to_owned(), other));
                }
            }
        }
        if others.is_empty() {
            return Ok(());
        }
        let keys: Vec<EventKey> = others.iter().map(|(_, o)| o.clone()).collect();
        let found = self.ledger.records(&keys).await?;
        for (key, other) in others {
            if found.iter().any(|r| text(r, "pk") == Some(other.as_str()) && applied(r)) {
                report.doubled += 1;
                push(
                    &mut report.doubled_items,
                    Named {
                        key,
                        event_type: None,
                        why: Some(format!("its body was applied again as {other}")),
                        repair: None,
                    },
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::memory::World;
    use crate::clock::Ambient;

    const NOW: i64 = 1_700_000_000_000;

    /// An audit of the hour before `NOW` of `endpoint` (its own tenant).
    fn last_hour<'a>(provider: &'a str, endpoint: &'a str, routes: &'a Routes) -> Scope<'a> {
        Scope {
            provider,
            endpoint,
            tenant: endpoint,
            since_s: (NOW - 3_600_000) / 1000,
            until_s: NOW / 1000,
            routes,
            now_ms: NOW,
            types: BTreeMap::new(),
            repair_flags: String::new(),
        }
    }

    /// Without a provider's list: the endpoint's DEAD and PARKED records
    /// received in the window (others' and older ones left out), and a note
    /// that completeness cannot be proven; nothing is "missing".
    #[tokio::test]
    async fn without_a_list_the_audit_shows_what_the_ledger_holds_and_says_it_proves_nothing() {
        let w = World::new(Ambient::fixed(NOW, 1)).with_shards(4);
        let l = w.ledger();
        let key = |ep: &str, id: &str| EventKey::new("slack", ep, id);
        l.add(&key("hooks", "a"), Status::Dead, NOW - 60_000, serde_json::json!({"dead_reason": "permanent"}));
        l.add(&key("hooks", "b"), Status::Parked, NOW - 50_000, serde_json::json!({"park_reason": "gap"}));
        l.add(&key("hooks", "old"), Status::Dead, NOW - 7_200_000, serde_json::json!({}));
        l.add(&key("other", "c"), Status::Dead, NOW - 60_000, serde_json::json!({}));
        let routes = Routes::none();
        let scope = last_hour("slack", "hooks", &routes);
        let outbox = w.outbox();
        let r = Audit { ledger: &l, outbox: &outbox }.without_list(&scope).await.unwrap();
        assert!(!r.provider_truth && !r.failed());
        assert_eq!((r.dead, r.parked, r.missing, r.recorded), (1, 1, 0, 2), "{r:?}");
        assert_eq!(r.dead_items[0].key, key("hooks", "a").as_str());
        assert_eq!(r.dead_items[0].why.as_deref(), Some("permanent"));
        assert!(r.dead_items[0].repair.as_deref().unwrap().starts_with("hookledger replay"));
        assert!(r.notes[0].contains("cannot be proven"), "{:?}", r.notes);
    }

    /// Without a list, the routes' figures are the endpoint's deliveries
    /// still to send or DEAD now (another endpoint's left out).
    #[tokio::test]
    async fn without_a_list_the_routes_are_the_endpoints_deliveries_still_to_send_or_dead() {
        use crate::adapters::memory::OutboxView;
        let w = World::new(Ambient::fixed(NOW, 1)).with_shards(1);
        let store = w.outbox();
        // `set_delivery` files each under the event `evt#acme#main#<its key>`.
        for (id, key, status) in [("outbox#k1", "k1", "PENDING"), ("outbox#k2", "k2", "DEAD")] {
            let mut item = OutboxView::pending(key, "https:partner", 0, NOW - 60_000);
            item.status = status.into();
            if status == "DEAD" {
                item.due_at = None;
                item.due_shard = None;
            }
            store.put(id, &item);
            store.set_delivery(id, "partner", NOW - 120_000);
        }
        let routes = Routes::none();
        let scope = last_hour("acme", "main", &routes);
        let l = w.ledger();
        let r = Audit { ledger: &l, outbox: &store }.without_list(&scope).await.unwrap();
        let partner = &r.routes["partner"];
        assert_eq!((partner.pending, partner.oldest_pending_ms), (1, Some(120_000)), "{r:?}");
        let other = Scope { endpoint: "other", ..scope.clone() };
        let r = Audit { ledger: &l, outbox: &store }.without_list(&other).await.unwrap();
        assert!(r.routes.is_empty(), "{r:?}");
    }

    /// GitHub lists a delivery and its redeliveries under one id: one
    /// identity. A list longer than the pages allowed is said to be
    /// partial; a list that cannot be read fails the audit (never taken as
    /// complete).
    #[tokio::test]
    async fn a_listed_identity_is_counted_once_and_an_unreadable_list_fails_the_audit() {
        use crate::adapters::memory::MemSource;
        let window = Window { since_s: 0, until_s: 10_000, types: vec![] };
        let mut events = MemSource::numbered(5, 100).state().events.clone();
        let mut redelivery = events[0].clone();
        redelivery.handle = Some("d-again".into());
        events.push(redelivery);
        let source = MemSource::new(events, 100);
        let (list, pages, partial) = listed(&source, &window, 10).await.unwrap();
        assert_eq!((list.len(), pages, partial), (5, 1, false));
        let (list, pages, partial) = listed(&MemSource::numbered(5, 2), &window, 2).await.unwrap();
        assert_eq!((list.len(), pages, partial), (4, 2, true));
        let (list, pages, partial) = listed_until(&MemSource::numbered(5, 2), &window, 10, || true).await.unwrap();
        assert_eq!((list.len(), pages, partial), (2, 1, true), "out of time after the first page");
        source.fail_next(vec![Some(SourceError::Unavailable("down".into()))]);
        assert!(matches!(listed(&source, &window, 10).await, Err(AuditError::Source(_))));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!((percentile(&v, 0.5), percentile(&v, 0.99)), (Some(50), Some(99)));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[7], 0.99), Some(7));
    }
}
