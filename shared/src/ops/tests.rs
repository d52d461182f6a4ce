//! The operator's commands on the memory world (`adapters::memory`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::adapters::memory::{MemLedger, MemQueue, World};
use crate::clock::Ambient;
use crate::ports::AuditLog;

const NOW: i64 = 1_700_000_000_000;
const SHARDS: u32 = 4;

fn world() -> World {
    World::new(Ambient::fixed(NOW, 7)).with_shards(SHARDS)
}

fn ops() -> (MemLedger, MemQueue, Ops<MemQueue, MemLedger>) {
    let w = world();
    (w.ledger(), w.queue(), Ops::new(w.ledger(), w.queue()))
}

fn st_at(r: &Row) -> i64 {
    r["st_at"].as_i64().unwrap()
}

fn pk(r: &Row) -> &str {
    r["pk"].as_str().unwrap()
}

fn key(id: &str) -> EventKey {
    EventKey::new("stripe", "billing-eu", id)
}

fn status_of(ledger: &MemLedger, key: &EventKey) -> String {
    ledger.row(key).unwrap()["status"].as_str().unwrap().to_owned()
}

// -------------------------------------------------------------- transitions

#[tokio::test]
async fn replay_moves_dead_and_parked_records_to_retryable_audits_it_and_queues_the_key_once() {
    let (ledger, queue, ops) = ops();
    let (dead, parked) = (key("evt_dead"), key("evt_parked"));
    ledger.add(&dead, Status::Dead, NOW - 1_000, json!({"attempts": 7, "failures": 5, "window_start": NOW - 900}));
    ledger.add(&parked, Status::Parked, NOW - 2_000, json!({"park_reason": "gap"}));

    ops.replay(&dead, &crate::audit::Caller::named("alice"), "the API key is fixed", NOW).await.unwrap();
    ops.replay(&parked, &crate::audit::Caller::named("alice"), "gap filled by hand", NOW + 1).await.unwrap();

    assert_eq!(queue.keys(), vec![dead.clone(), parked.clone()]);
    let r = ledger.row(&dead).unwrap();
    assert_eq!(r["status"], "RETRYABLE");
    let due = format!("due#{:03}", dead.shard(SHARDS));
    assert_eq!((r["due_shard"].as_str(), r.get("attn_shard")), (Some(due.as_str()), None), "back in the due index");
    assert_eq!((r["attempts"].as_i64(), r["failures"].as_i64()), (Some(0), Some(0)));
    assert_eq!((r["due_at"].as_i64(), r.get("window_start")), (Some(NOW), None));
    assert_eq!((r["last_replay_by"].as_str(), r["st_at"].as_i64()), (Some("alice"), Some(NOW - 1_000)));
    assert_eq!(status_of(&ledger, &parked), "RETRYABLE");
    let history = ledger.history_rows(&dead);
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0]["kind"], "replay");
    assert_eq!(history[0]["detail"], "by alice: the API key is fixed");
    assert_eq!(history[0]["at"], NOW);
    assert_eq!(ledger.history_rows(&parked)[0]["detail"], "by alice: gap filled by hand");
    // The audit log lists both, by time and by record.
    let page = ledger.audit_page(0, NOW + 1, None, 10).await.unwrap();
    let listed: Vec<(&str, &str, &str)> =
        page.entries.iter().map(|e| (e.verb.as_str(), e.target.as_str(), e.result.as_str())).collect();
    assert_eq!(listed, [("replay", dead.as_str(), "done"), ("replay", parked.as_str(), "done")]);
    assert_eq!(page.entries[0].principal, "name:alice");
    assert_eq!(ledger.audit_of(&dead).await.unwrap(), page.entries[..1]);
}

/// Issue 18.3: a record a backfill parked without its payload would only
/// fail if made RETRYABLE: the replay is refused (console, ops) with what
/// to do instead, nothing is queued or audited, and it can still be resolved.
#[tokio::test]
async fn a_record_a_backfill_parked_without_its_payload_is_not_replayed_without_it() {
    let (ledger, queue, ops) = ops();
    let k = key("evt_unfetched");
    let reason = "backfill_unrecoverable:no_payload";
    ledger.add(&k, Status::Parked, NOW - 1_000, json!({"park_reason": reason, "payload_stored": false}));
    let err = ops.replay(&k, &crate::audit::Caller::named("alice"), "try it", NOW).await.unwrap_err();
    assert!(matches!(err, OpsError::IllegalTransition { from: "PARKED", .. }), "{err}");
    assert!(err.needs_its_source(), "{err}");
    assert!(err.to_string().contains("hookledger replay"), "{err}");
    assert_eq!((status_of(&ledger, &k), queue.keys().len()), ("PARKED".to_owned(), 0));
    assert!(ledger.no_history());
    ops.resolve(&k, &crate::audit::Caller::named("alice"), "sent by hand", NOW).await.unwrap();
    assert_eq!(status_of(&ledger, &k), "PROCESSED");
}

#[tokio::test]
async fn replay_and_resolve_of_a_record_that_is_not_dead_or_parked_are_refused_naming_its_status() {
    let (ledger, queue, ops) = ops();
    for status in [Status::Processed, Status::Received, Status::Processing, Status::Retryable] {
        let k = key(&format!("evt_{}", status.as_str()));
        ledger.add(&k, status, NOW - 1_000, json!({}));
        let before = ledger.row(&k).unwrap();
        for action in [OperatorAction::Replay, OperatorAction::Resolve] {
            let err = match action {
                OperatorAction::Replay => {
                    ops.replay(&k, &crate::audit::Caller::named("alice"), "why", NOW).await.unwrap_err()
                }
                _ => ops.resolve(&k, &crate::audit::Caller::named("alice"), "why", NOW).await.unwrap_err(),
            };
            match err {
                OpsError::IllegalTransition { action: name, key: ref shown, from, allowed } => {
                    assert_eq!((name, shown.as_str(), from), (action.name(), k.as_str(), status.as_str()));
                    assert_eq!(allowed, action.allowed());
                }
                other => panic!("{action:?} of {status:?}: {other:?}"),
            }
            assert_eq!(ledger.row(&k).unwrap(), before, "{action:?} of {status:?} changed the record");
        }
    }
    assert!(queue.keys().is_empty(), "{:?}", queue.keys());
    assert!(ledger.no_history());
}

#[tokio::test]
async fn park_of_a_record_in_flight_processed_or_parked_is_refused_naming_its_status() {
    let (ledger, queue, ops) = ops();
    for status in [Status::Processing, Status::Processed, Status::Parked] {
        let k = key(&format!("evt_{}", status.as_str()));
        ledger.add(&k, status, NOW - 1_000, json!({}));
        let before = ledger.row(&k).unwrap();
        let err = ops.park(&k, &crate::audit::Caller::named("bob"), "noisy", NOW).await.unwrap_err();
        assert!(
            matches!(err, OpsError::IllegalTransition { action: "park", from, .. } if from == status.as_str()),
            "{status:?}: {err:?}"
        );
        assert!(err.to_string().contains(status.as_str()), "{err}");
        assert_eq!(ledger.row(&k).unwrap(), before);
    }
    assert!(queue.keys().is_empty());
    assert!(ledger.no_history());
}

#[tokio::test]
async fn park_stops_received_retryable_and_dead_records_without_queueing() {
    let (ledger, queue, ops) = ops();
    for status in [Status::Received, Status::Retryable, Status::Dead] {
        let k = key(&format!("evt_{}", status.as_str()));
        ledger.add(&k, status, NOW - 1_000, json!({"due_at": NOW, "due_shard": "due#001"}));
        ops.park(&k, &crate::audit::Caller::named("bob"), "customer asked to wait", NOW).await.unwrap();
        let r = ledger.row(&k).unwrap();
        assert_eq!(r["status"], "PARKED");
        assert_eq!(r["park_reason"], "operator bob: customer asked to wait");
        assert!(r.get("due_at").is_none(), "a parked record leaves the due index: {r:?}");
        let history = ledger.history_rows(&k);
        assert_eq!((history.len(), &history[0]["kind"]), (1, &json!("park")));
    }
    assert!(queue.keys().is_empty());
}

#[tokio::test]
async fn resolve_settles_dead_and_parked_records_as_processed_without_queueing() {
    let (ledger, queue, ops) = ops();
    for status in [Status::Dead, Status::Parked] {
        let k = key(&format!("evt_{}", status.as_str()));
        ledger.add(&k, status, NOW - 1_000, json!({}));
        ops.resolve(&k, &crate::audit::Caller::named("carol"), "refunded by hand", NOW).await.unwrap();
        let r = ledger.row(&k).unwrap();
        assert_eq!((r["status"].as_str(), r["outcome"].as_str()), (Some("PROCESSED"), Some("resolved")));
        assert_eq!(r["resolved_by"], "carol");
        let history = ledger.history_rows(&k);
        assert_eq!(history.len(), 1);
        assert_eq!(
            (&history[0]["kind"], &history[0]["detail"]),
            (&json!("resolve"), &json!("by carol: refunded by hand"))
        );
    }
    assert!(queue.keys().is_empty());
}

#[tokio::test]
async fn actions_on_an_unknown_key_report_an_unknown_event() {
    let (ledger, queue, ops) = ops();
    ledger.add(&key("evt_other"), Status::Dead, NOW, json!({}));
    let k = key("evt_missing");
    let results = [
        ops.replay(&k, &crate::audit::Caller::named("alice"), "why", NOW).await,
        ops.park(&k, &crate::audit::Caller::named("alice"), "why", NOW).await,
        ops.resolve(&k, &crate::audit::Caller::named("alice"), "why", NOW).await,
        ops.show(&k, true).await.map(|_| ()),
    ];
    for r in results {
        assert!(matches!(&r, Err(OpsError::UnknownEvent(shown)) if shown == k.as_str()), "{r:?}");
    }
    assert!(queue.keys().is_empty());
    assert!(ledger.no_history());
    assert!(matches!(parse_key("evt#stripe#billing-eu"), Err(OpsError::BadKey(_))));
}

#[tokio::test]
async fn a_queue_failure_after_a_replay_is_an_error_but_the_record_is_already_retryable() {
    let (ledger, queue, ops) = ops();
    let k = key("evt_dead");
    ledger.add(&k, Status::Dead, NOW - 1_000, json!({}));
    queue.fail_sends();

    let err = ops.replay(&k, &crate::audit::Caller::named("alice"), "fixed", NOW).await.unwrap_err();
    assert!(matches!(err, OpsError::Storage(PortError::Unavailable { service: "sqs", .. })), "{err:?}");
    // Audited and due now: the reconciler re-drives it; a second replay is refused.
    assert_eq!(status_of(&ledger, &k), "RETRYABLE");
    assert_eq!(ledger.row(&k).unwrap()["due_at"], NOW);
    assert_eq!(ledger.history_rows(&k).len(), 1);
    assert!(matches!(
        ops.replay(&k, &crate::audit::Caller::named("alice"), "again", NOW).await,
        Err(OpsError::IllegalTransition { from: "RETRYABLE", .. })
    ));
}

/// A replay's transition and its audit entry are one write; the key is
/// sent after it. A send that fails leaves the record RETRYABLE and due now
/// (the reconciler re-drives it) with its entry; a transition whose
/// acknowledgement was lost is recognised by its entry and written once.
#[tokio::test]
async fn a_replay_and_its_audit_entry_are_one_write_and_its_send_comes_after() {
    let w = world();
    let (ledger, queue, ops) = (w.ledger(), w.queue(), Ops::new(w.ledger(), w.queue()));
    let k = key("evt_dead");
    ledger.add(&k, Status::Dead, NOW - 1_000, json!({}));
    w.inject("queue.send", 0, Some(1), crate::adapters::memory::Fault::Unavailable);
    let err = ops.replay(&k, &crate::audit::Caller::named("alice"), "fixed", NOW).await.unwrap_err();
    assert!(matches!(err, OpsError::Storage(PortError::Unavailable { .. })), "{err:?}");
    assert!(queue.keys().is_empty());
    assert_eq!(status_of(&ledger, &k), "RETRYABLE");
    assert_eq!(ledger.row(&k).unwrap()["due_at"], NOW, "due now: the reconciler re-drives it");
    assert_eq!(ledger.audit_of(&k).await.unwrap().len(), 1, "audited with the transition");

    for fault in [crate::adapters::memory::Fault::LoseAckOnce, crate::adapters::memory::Fault::LoseAckAlways] {
        let k = key(&format!("evt_lost_{fault:?}"));
        ledger.add(&k, Status::Dead, NOW - 1_000, json!({}));
        w.inject("operator.transition", 0, Some(1), fault);
        let done = ops.replay(&k, &crate::audit::Caller::named("alice"), "fixed", NOW).await;
        let entries = ledger.audit_of(&k).await.unwrap();
        assert_eq!(entries.len(), 1, "{fault:?}: one entry, for the one transition");
        assert_eq!(status_of(&ledger, &k), "RETRYABLE", "{fault:?}");
        match fault {
            crate::adapters::memory::Fault::LoseAckOnce => {
                assert!(done.is_ok(), "the retry recognises its own write: {done:?}");
                assert_eq!(queue.keys().iter().filter(|q| **q == k).count(), 1);
            }
            _ => assert!(done.is_err(), "never acknowledged: the operator is told"),
        }
    }
    // A refused action writes no entry.
    let processed = key("evt_processed");
    ledger.add(&processed, Status::Processed, NOW - 1_000, json!({}));
    assert!(ops.park(&processed, &crate::audit::Caller::named("bob"), "x", NOW).await.is_err());
    assert!(ledger.audit_of(&processed).await.unwrap().is_empty());
    let all = ledger.audit_page(0, NOW, None, 100).await.unwrap().entries;
    assert!(all.iter().all(|e| e.target != processed.as_str()), "{all:?}");
}

#[tokio::test]
async fn show_returns_the_record_its_history_oldest_first_and_the_payload_when_asked() {
    let (ledger, _queue, ops) = ops();
    let k = key("evt_1");
    ledger.add(&k, Status::Dead, NOW - 5_000, json!({}));
    ledger.put_payload(&k, b"{\"id\":\"evt_1\"}");
    ops.park(&k, &crate::audit::Caller::named("bob"), "first", NOW).await.unwrap();
    ops.replay(&k, &crate::audit::Caller::named("bob"), "second", NOW + 1).await.unwrap();

    let (record, history, payload) = ops.show(&k, false).await.unwrap();
    assert_eq!((record["status"].as_str(), payload), (Some("RETRYABLE"), None));
    let kinds: Vec<&str> = history.iter().map(|h| h["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["park", "replay"]);
    assert_eq!(ops.show(&k, true).await.unwrap().2.as_deref(), Some(&b"{\"id\":\"evt_1\"}"[..]));
}

// ------------------------------------------------------------------- reads

/// Records over every status and several shards: (key, status, receive time).
fn populate(ledger: &MemLedger) -> Vec<(EventKey, Status, i64)> {
    let statuses = ALL_STATUSES;
    let mut out = Vec::new();
    for i in 0..30 {
        let k = key(&format!("evt_{i:02}"));
        let status = statuses[i % statuses.len()];
        // Some receive times shared (within and across partitions).
        let at = NOW - 1_000 * (i as i64 / 3);
        ledger.add(&k, status, at, json!({}));
        out.push((k, status, at));
    }
    let shards: std::collections::BTreeSet<u32> = out.iter().map(|(k, _, _)| k.shard(SHARDS)).collect();
    assert!(shards.len() > 1, "the records span shards");
    out
}

/// Five more DEAD records, all in shard 0, the last three received at the same time.
fn crowd_one_partition(ledger: &MemLedger) -> Vec<(EventKey, Status, i64)> {
    let mut dead = Vec::new();
    for i in 0.. {
        let k = key(&format!("evt_dead_{i}"));
        if k.shard(SHARDS) == 0 {
            let at = NOW - 100_000 - 1_000 * (dead.len() as i64).min(2);
            ledger.add(&k, Status::Dead, at, json!({}));
            dead.push((k, Status::Dead, at));
        }
        if dead.len() == 5 {
            return dead;
        }
    }
    unreachable!()
}

/// Newest first, ties by key descending (the order `list` promises).
fn newest_first(records: &[(EventKey, Status, i64)], keep: impl Fn(Status) -> bool) -> Vec<String> {
    let mut v: Vec<(i64, String)> =
        records.iter().filter(|(_, s, _)| keep(*s)).map(|(k, _, at)| (*at, k.as_str().to_owned())).collect();
    v.sort_by(|a, b| b.cmp(a));
    v.into_iter().map(|(_, k)| k).collect()
}

fn pks(rows: &[Row]) -> Vec<String> {
    rows.iter().map(|r| pk(r).to_owned()).collect()
}

#[tokio::test]
async fn list_is_newest_first_across_shards_and_statuses() {
    let (ledger, _queue, ops) = ops();
    let records = populate(&ledger);
    // Finished records are in no index: `list` shows every other one.
    let listed = |s: Status| s != Status::Processed;
    let (rows, cursor) = ops.list(&ListFilter { limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(pks(&rows), newest_first(&records, listed));
    assert_eq!(cursor, None);

    let (rows, cursor) = ops.list(&ListFilter { limit: 4, ..Default::default() }).await.unwrap();
    assert_eq!(pks(&rows), newest_first(&records, listed)[..4]);
    let last = rows.last().unwrap();
    assert_eq!(cursor, Some((st_at(last), pk(last).to_owned())));
}

#[tokio::test]
async fn list_keeps_only_the_statuses_asked_for() {
    let (ledger, _queue, ops) = ops();
    let records = populate(&ledger);
    let filter = ListFilter { statuses: vec![Status::Dead, Status::Parked], limit: 100, ..Default::default() };
    let (rows, _) = ops.list(&filter).await.unwrap();
    assert_eq!(pks(&rows), newest_first(&records, |s| matches!(s, Status::Dead | Status::Parked)));
    assert!(rows.iter().all(|r| r["status"] == "DEAD" || r["status"] == "PARKED"));

    let filter = ListFilter {
        statuses: vec![Status::Received],
        since_ms: Some(NOW - 5_000),
        until_ms: Some(NOW - 1_000),
        limit: 100,
        ..Default::default()
    };
    let (rows, _) = ops.list(&filter).await.unwrap();
    let in_range = |at: i64| (NOW - 5_000..=NOW - 1_000).contains(&at);
    let expected: Vec<String> =
        newest_first(&records.iter().filter(|(_, _, at)| in_range(*at)).cloned().collect::<Vec<_>>(), |s| {
            s == Status::Received
        });
    assert!(!expected.is_empty());
    assert_eq!(pks(&rows), expected);
}

async fn all_pages(ops: &Ops<MemQueue, MemLedger>, filter: ListFilter) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut filter = filter;
    loop {
        let (rows, cursor) = ops.list(&filter).await.unwrap();
        assert!(rows.len() <= filter.limit);
        pages.push(pks(&rows));
        match cursor {
            Some(c) => filter.cursor = Some(c),
            None => return pages,
        }
        assert!(pages.len() < 100, "paging does not end");
    }
}

#[tokio::test]
async fn list_pages_return_every_record_exactly_once() {
    let (ledger, _queue, ops) = ops();
    let mut records = populate(&ledger);
    records.extend(crowd_one_partition(&ledger));
    for limit in [1, 2, 3, 4, 7, 35] {
        let pages = all_pages(&ops, ListFilter { limit, ..Default::default() }).await;
        let listed = |s: Status| s != Status::Processed;
        assert_eq!(pages.concat(), newest_first(&records, listed), "limit {limit}: {pages:?}");
        let statuses = vec![Status::Dead];
        let pages = all_pages(&ops, ListFilter { statuses, limit, ..Default::default() }).await;
        assert_eq!(pages.concat(), newest_first(&records, |s| s == Status::Dead), "limit {limit}: {pages:?}");
    }
}

#[tokio::test]
async fn list_pages_return_every_record_exactly_once_when_the_ledger_returns_only_the_rows_asked_for() {
    // The port pages "until `want` rows (or the end)": one-row pages stop at exactly `want`.
    let w = world().with_page_items(1);
    let (ledger, ops) = (w.ledger(), Ops::new(w.ledger(), w.queue()));
    let dead = crowd_one_partition(&ledger);
    for limit in [1, 2, 3] {
        let filter = ListFilter { statuses: vec![Status::Dead], limit, ..Default::default() };
        let pages = all_pages(&ops, filter).await;
        // limit 1: one page and no cursor; the other four are never listed.
        assert_eq!(pages.concat(), newest_first(&dead, |_| true), "limit {limit}: {pages:?}");
    }
}

/// No metrics: the figures below come from the ledger's sparse sets.
struct NoMetrics;

impl crate::ports::MetricsReader for NoMetrics {
    async fn read(
        &self,
        _: &[&str],
        _: &crate::ports::MetricWindow,
    ) -> Result<Vec<crate::ports::MetricSeries>, PortError> {
        Ok(Vec::new())
    }
}

const WINDOW: crate::ports::MetricWindow =
    crate::ports::MetricWindow { since_ms: NOW - 86_400_000, until_ms: NOW, period_s: 3600 };

#[tokio::test]
async fn insight_counts_the_sparse_sets_and_never_the_finished_records() {
    let (ledger, _queue, ops) = ops();
    let gh = |id: &str| EventKey::new("github", "app-1", id);
    let none = Value::Null;
    for (k, status, age, extra) in [
        (key("p1"), Status::Processed, 900_000, json!({"duplicates": 1})),
        (key("p2"), Status::Processed, 800_000, json!({"event_type": "customer.created"})),
        (key("d1"), Status::Dead, 700_000, json!({"duplicates": 2, "subject": "cus_9"})),
        (key("k1"), Status::Parked, 600_000, json!({"event_type": none, "subject": "cus_9"})),
        (gh("r1"), Status::Received, 5_000, json!({"event_type": "push"})),
        (gh("r2"), Status::Retryable, 9_000, json!({"event_type": "push", "duplicates": 4})),
        (key("w1"), Status::Processing, 7_000, json!({"event_type": "customer.updated", "lease_expires_at": NOW - 1})),
    ] {
        ledger.add(&k, status, NOW - age, extra);
    }
    let insight = crate::insight::Insight::new(ledger.clone(), NoMetrics);
    let stats = insight.stats(&WINDOW, NOW).await.unwrap();
    let counts =
        |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> { pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect() };
    assert_eq!(
        stats.now.by_status,
        counts(&[("RECEIVED", 1), ("PROCESSING", 1), ("RETRYABLE", 1), ("DEAD", 1), ("PARKED", 1)]),
        "finished records are in no index"
    );
    // Only RECEIVED, RETRYABLE and PROCESSING are waiting to be processed.
    assert_eq!(stats.now.oldest_unprocessed_age_ms, Some(9_000));
    assert_eq!(stats.now.stuck_leases, 1);
    let failures = insight.failures(&WINDOW, NOW).await.unwrap();
    assert_eq!(failures.top_types.iter().map(|c| c.count).sum::<u64>(), 3, "DEAD, PARKED, RETRYABLE");
    assert_eq!(failures.repeated_subjects.len(), 1);
    assert_eq!(ops.count(Status::Processed).await.unwrap(), 0, "not counted: in no index");
    assert_eq!(ops.count(Status::Received).await.unwrap(), 1);
}

#[tokio::test]
async fn insight_over_an_empty_ledger_is_zero() {
    let (ledger, _queue, _ops) = ops();
    let stats = crate::insight::Insight::new(ledger, NoMetrics).stats(&WINDOW, NOW).await.unwrap();
    assert_eq!(stats.now.by_status.len(), 5);
    assert!(stats.now.by_status.values().all(|n| *n == 0));
    assert_eq!((stats.duplicate_rate, stats.now.oldest_unprocessed_age_ms), (0.0, None));
}

// -------------------------------------------------------------- erasure

/// Sealed events claimed through the admission path (an erasable
/// endpoint's), each noted under `cus_e`; `finished` of them leased and
/// completed.
async fn sealed_events(w: &World, ids: &[&str], finished: usize) -> Vec<EventKey> {
    use crate::admission::{Admission, Arrival, new_event};
    use crate::ports::{PayloadKeys, WorkLedger};
    let (ledger, queue, keys) = (w.ledger(), w.queue(), w.keys());
    let admission = Admission { ledger: &ledger, queue: &queue, by: "webhook", keys: Some(&keys) };
    let mut out = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let body = format!(r#"{{"id":"{id}","email":"SEALED-{id}"}}"#).into_bytes();
        let arrival = Arrival {
            provider: "stripe",
            endpoint: "billing-eu",
            tenant: "t1",
            event_id: id,
            event_type: Some("customer.updated"),
            body: &body,
            hashes: None,
            via: crate::ledger::Via::Webhook,
            batch_hash: None,
            retention_days: 30,
            index_shards: SHARDS,
            notification: false,
            kept: None,
        };
        let event = new_event(arrival, NOW, format!("send-{id}"));
        let admitted = admission.admit(&[(event.clone(), &body)]).await;
        assert!(admitted[0].sent(), "{admitted:?}");
        if i < finished {
            ledger.lease(&event.key, "tok", NOW + 1, 30_000).await.unwrap();
            ledger.commit(&event.key, "tok", &[], "applied", Some("cus_e"), NOW + 2).await.unwrap();
        }
        keys.index_subject("cus_e", &event.key, event.expires_at).await.unwrap();
        out.push(event.key);
    }
    out
}

/// `erase`: a dry run changes nothing; a finished sealed event has its key
/// destroyed and its ledger copies removed, once (a second run says
/// `already erased`); one in flight is left alone; an unknown key is
/// `unknown`; `show --payload` finds nothing to read after it. By subject:
/// every noted event of the endpoint asked for, each note forgotten once
/// its event is settled (the one in flight keeps its note, for the rerun).
#[tokio::test]
async fn erase_destroys_a_finished_events_key_once_leaves_one_in_flight_and_works_by_subject() {
    use crate::ports::PayloadKeys;
    let w = world();
    let keys = std::sync::Arc::new(w.keys());
    let ops = Ops::new(w.ledger(), w.queue()).with_keys(keys.clone());
    let caller = Caller::named("dpo");
    let events = sealed_events(&w, &["ev_a", "ev_b", "ev_open"], 2).await;
    let (_, _, payload) = ops.show(&events[0], true).await.unwrap();
    assert_eq!(payload.as_deref(), Some(&br#"{"id":"ev_a","email":"SEALED-ev_a"}"#[..]), "shown opened");

    let dry = ops.erase(&events[0], &caller, "asked", NOW + 10, true).await.unwrap();
    assert_eq!((dry.outcome, dry.sealed, dry.status.as_deref()), ("would erase", true, Some("PROCESSED")));
    assert!(matches!(keys.key_of(&events[0]).await.unwrap(), crate::sealing::KeyState::Live(_)));
    let open = ops.erase(&events[2], &caller, "asked", NOW + 10, false).await.unwrap();
    assert_eq!((open.outcome, open.status.as_deref()), ("in flight", Some("RECEIVED")));
    assert!(matches!(keys.key_of(&events[2]).await.unwrap(), crate::sealing::KeyState::Live(_)), "left alone");
    let unknown = ops.erase(&key("nobody"), &caller, "asked", NOW + 10, false).await.unwrap();
    assert_eq!((unknown.outcome, unknown.sealed), ("unknown", false));

    let erased = ops.erase(&events[0], &caller, "asked", NOW + 20, false).await.unwrap();
    assert_eq!((erased.outcome, erased.sealed), ("erased", true));
    assert!(matches!(keys.key_of(&events[0]).await.unwrap(), crate::sealing::KeyState::Erased { .. }));
    assert_eq!(ops.erase(&events[0], &caller, "again", NOW + 30, false).await.unwrap().outcome, "already erased");
    let (record, history, payload) = ops.show(&events[0], true).await.unwrap();
    assert_eq!(payload, None, "nothing to read");
    assert_eq!(record["erased_by"], "dpo");
    let audited = history.iter().filter(|h| h["audit_verb"] == "erase").count();
    assert_eq!(audited, 1, "one audit entry: {history:?}");

    // By subject, another endpoint's events of the same subject left out.
    let other = EventKey::new("stripe", "billing-us", "ev_other");
    keys.index_subject("cus_e", &other, 0).await.unwrap();
    let dry = ops.erase_subject("cus_e", Some("billing-eu"), &caller, "asked", NOW + 40, true).await.unwrap();
    let outcomes: Vec<(&str, &str)> = dry.iter().map(|e| (e.key.as_str(), e.outcome)).collect();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert_eq!(keys.subject_events("cus_e").await.unwrap().len(), 4, "a dry run forgets nothing");
    let done = ops.erase_subject("cus_e", Some("billing-eu"), &caller, "asked", NOW + 50, false).await.unwrap();
    let by_key: BTreeMap<&str, &str> = done.iter().map(|e| (e.key.as_str(), e.outcome)).collect();
    assert_eq!(by_key[events[0].as_str()], "already erased");
    assert_eq!(by_key[events[1].as_str()], "erased");
    assert_eq!(by_key[events[2].as_str()], "in flight");
    let left: Vec<String> = keys.subject_events("cus_e").await.unwrap().iter().map(|k| k.as_str().to_owned()).collect();
    assert_eq!(left, vec![events[2].as_str().to_owned(), other.as_str().to_owned()], "settled notes forgotten");
    let without = Ops::new(w.ledger(), w.queue());
    assert!(matches!(
        without.erase_subject("cus_e", None, &caller, "asked", NOW, false).await,
        Err(EraseError::NoKeyStore)
    ));
}

// -------------------------------------------------------------- replay by filter

/// Issue 49.4: a replay by filter counts first (the dry run's count is what
/// the run replays), replays in batches, each audited in the run; a run
/// interrupted after its first batch and started again replays the rest
/// and nothing twice, even what it replayed and that died again.
#[tokio::test]
async fn a_replay_by_filter_counts_first_and_an_interrupted_run_run_again_replays_nothing_twice() {
    use super::bulk::RecordFilter;
    let (ledger, queue, ops) = ops();
    for i in 0..7 {
        ledger.add(
            &key(&format!("evt_dead_{i}")),
            Status::Dead,
            NOW - 10_000 + i,
            json!({"event_type": "invoice.paid"}),
        );
    }
    ledger.add(&key("evt_other_type"), Status::Dead, NOW - 9_000, json!({"event_type": "charge.refunded"}));
    ledger.add(&EventKey::new("github", "gh", "d-1"), Status::Dead, NOW - 9_000, json!({"event_type": "invoice.paid"}));
    ledger.add(&key("evt_parked"), Status::Parked, NOW - 8_000, json!({"event_type": "invoice.payment_failed"}));
    ledger.add(
        &key("evt_unfetchable"),
        Status::Parked,
        NOW - 8_000,
        json!({"event_type": "invoice.paid", "payload_stored": false, "park_reason": "backfill_unrecoverable:gone"}),
    );
    let filter = RecordFilter {
        provider: Some("stripe".into()),
        event_type: Some("invoice.*".into()),
        reason: "the API key is fixed".into(),
        ..RecordFilter::default()
    };
    filter.check().unwrap();
    let (counted, partial) = ops.matching(&filter, 100).await.unwrap();
    assert!(!partial);
    assert_eq!(counted.records.len(), 8, "seven DEAD and one PARKED invoice event of stripe: {counted:?}");
    assert_eq!(counted.need_their_source, vec![key("evt_unfetchable").as_str().to_owned()]);
    let caller = crate::audit::Caller::named("alice");

    // The first batch, then the run stops.
    let first = ops.replay_batch(&filter, &counted.records[..3], &caller, NOW).await.unwrap();
    assert_eq!(first, super::bulk::Replayed { replayed: 3, skipped: 0 });
    // One of those dies again before the run is started again.
    let died = EventKey::from_stored(&counted.records[0].key).unwrap();
    let again = json!({"event_type": "invoice.paid", "replay_run": filter.run(), "replays": 1});
    ledger.add(&died, Status::Dead, NOW - 10_000, again);
    let (again, _) = ops.matching(&filter, 100).await.unwrap();
    assert_eq!(again.records.len(), 5, "the rest: {again:?}");
    assert_eq!(again.replayed_by_this_run, 1, "the one that died again is this run's already");
    // Even replayed against a stale count, the condition refuses it.
    let stale = ops.replay_batch(&filter, &counted.records, &caller, NOW + 1).await.unwrap();
    assert_eq!(stale, super::bulk::Replayed { replayed: 5, skipped: 3 });
    let mut queued: Vec<String> = queue.keys().iter().map(|k| k.as_str().to_owned()).collect();
    queued.sort();
    queued.dedup();
    assert_eq!(queue.keys().len(), 8, "each replayed once: {queued:?}");
    let page = ledger.audit_page(0, NOW + 2, None, 100).await.unwrap();
    assert_eq!(page.entries.len(), 8);
    assert!(page.entries.iter().all(|e| e.run.as_deref() == Some(filter.run().as_str()) && e.verb == "replay"));
    // Another reason is another run: it may replay what died again.
    let next = RecordFilter { reason: "again".into(), ..filter.clone() };
    assert_ne!(next.run(), filter.run());
    assert_eq!(ops.matching(&next, 100).await.unwrap().0.records.len(), 1);
    assert!(RecordFilter { statuses: vec![Status::Processed], ..filter.clone() }.check().is_err());
}
