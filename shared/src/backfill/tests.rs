//! The backfill on the memory world: its ledger, its queue and a provider's
//! list (`adapters::memory::MemSource`).

use std::collections::BTreeMap;

use super::*;
use crate::adapters::memory::{self, Fault, MemLedger, MemQueue, MemSource, World};
use crate::clock::Ambient;
use crate::ports::Unfetchable;

type TestBackfill = Backfill<MemLedger, MemQueue, MemSource>;

fn on(source: MemSource, s: BackfillSettings) -> TestBackfill {
    let w = World::new(Ambient::fixed(5_000, 9)).with_shards(16);
    Backfill::new(w.ledger(), w.queue(), source, s)
}

fn world(b: &TestBackfill) -> &World {
    &b.ledger.0
}

/// Every record's provenance, by key.
fn records(b: &TestBackfill) -> BTreeMap<String, Via> {
    b.ledger
        .keys()
        .into_iter()
        .map(|k| {
            let via = Via::parse(b.ledger.field(&k, "via").as_deref());
            (k.as_str().to_owned(), via)
        })
        .collect()
}

/// Items the backfill wrote (applied writes: a refused claim writes nothing).
fn writes(b: &TestBackfill) -> u64 {
    world(b).state().table.writes()
}

/// Claims asked for, by key.
fn claims(b: &TestBackfill) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for k in world(b).calls_named("ledger.claim") {
        *out.entry(k).or_default() += 1;
    }
    out
}

/// Parked records: key → (reason, handle, origin).
fn parked(b: &TestBackfill) -> BTreeMap<String, (String, Option<String>, Option<String>)> {
    b.ledger
        .keys()
        .into_iter()
        .filter(|k| b.ledger.field(k, "status").as_deref() == Some("PARKED"))
        .map(|k| {
            let f = |n: &str| b.ledger.field(&k, n);
            (k.as_str().to_owned(), (f("park_reason").unwrap_or_default(), f("backfill_handle"), f("backfill_origin")))
        })
        .collect()
}

fn queued(b: &TestBackfill) -> Vec<String> {
    b.queue.keys().into_iter().map(|k| k.as_str().to_owned()).collect()
}

fn progress(b: &TestBackfill, w: &Window) -> BackfillProgress {
    memory::ready(b.ledger.progress(&w.run_id("stripe-a"))).unwrap().expect("progress saved")
}

fn schedule(b: &TestBackfill) -> ScheduleState {
    memory::ready(b.ledger.schedule_state("stripe-a")).unwrap().expect("schedule saved")
}

/// Fails the next claim (or park) of `id`: the ledger unavailable.
fn fail_once(b: &TestBackfill, call: &str, id: &str) {
    world(b).inject_on(call, &key(id), Some(1), Fault::Unavailable);
}

fn target() -> Target {
    Target {
        provider: "stripe".into(),
        endpoint: "stripe-a".into(),
        tenant: "t".into(),
        retention_days: 30,
        index_shards: 16,
        mode: Mode::Import,
        payload: Default::default(),
        erasable: false,
    }
}

fn window() -> Window {
    Window { since_s: 1_000, until_s: 2_000, types: vec![] }
}

fn settings() -> BackfillSettings {
    BackfillSettings {
        max_pages: 50,
        max_waits: 3,
        backoff: Backoff { base_ms: 1, max_ms: 4 },
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
    }
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn backfill(n: usize, per_page: usize, s: BackfillSettings) -> TestBackfill {
    on(MemSource::numbered(n, per_page), s)
}

/// Events a webhook delivered (and the processor finished) already.
fn webhook(b: &TestBackfill, ids: &[&str]) {
    for id in ids {
        b.ledger.add(
            &EventKey::new("stripe", "stripe-a", id),
            crate::ledger::Status::Processed,
            4_000,
            serde_json::json!({}),
        );
    }
}

#[tokio::test]
async fn missing_events_are_recovered_once_and_recorded_ones_are_not_touched() {
    let b = backfill(25, 10, settings());
    webhook(&b, &["evt_003", "evt_017", "evt_024"]);
    let mut pages = Vec::new();
    let s = b.run(&target(), &window(), false, 5_000, later(), |s| pages.push(s.seen)).await;
    assert_eq!((s.seen, s.already_recorded, s.recovered, s.failed), (25, 3, 22, 0));
    assert!(s.complete && s.stopped.is_none(), "{s:?}");
    assert_eq!(pages, [10, 20, 25], "progress after each page");
    assert_eq!(queued(&b).len(), 22, "each recovered event queued once");
    let records = records(&b);
    assert_eq!(records.values().filter(|v| **v == Via::Backfill).count(), 22);
    assert_eq!(records["evt#stripe#stripe-a#evt_003"], Via::Webhook, "the webhook's record is kept");
    // The window is done: a second run reads nothing.
    let calls = b.source.state().pages;
    let again = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
    assert!(again.complete && again.seen == 0);
    assert_eq!(b.source.state().pages, calls);
    // Another window over the same events: everything already recorded, nothing written.
    let before = writes(&b);
    let other = Window { since_s: 1_000, until_s: 1_024, types: vec![] };
    let s = b.run(&target(), &other, false, 7_000, later(), |_| {}).await;
    assert_eq!((s.seen, s.already_recorded, s.recovered), (24, 24, 0));
    assert_eq!(writes(&b), before + 3, "only the progress of its 3 pages");
}

#[tokio::test]
async fn an_interrupted_run_resumes_from_its_cursor_and_skips_nothing() {
    let b = backfill(25, 10, BackfillSettings { max_pages: 1, ..settings() });
    let first = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((first.recovered, first.complete), (10, false));
    assert!(first.stopped.as_deref().is_some_and(|w| w.contains("page bound")));
    let second = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
    let third = b.run(&target(), &window(), false, 7_000, later(), |_| {}).await;
    assert_eq!((second.recovered, third.recovered, third.complete), (10, 5, true));
    let claims = claims(&b);
    assert_eq!(claims.len(), 25);
    assert!(claims.values().all(|n| *n == 1), "no page read twice: {claims:?}");
}

#[tokio::test]
async fn a_failed_claim_leaves_the_page_to_the_next_run() {
    let b = backfill(25, 10, settings());
    fail_once(&b, "ledger.claim", "evt_012");
    let first = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((first.recovered, first.failed, first.complete), (10 + 2, 1, false), "{first:?}");
    let second = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
    assert!(second.complete);
    // The second page was read again: its first two events are already recorded.
    assert_eq!((second.already_recorded, second.recovered), (2, 13));
    assert_eq!(records(&b).len(), 25, "nothing skipped");
}

#[tokio::test]
async fn rate_limits_are_waited_out_or_end_the_run_when_the_provider_says_so() {
    let b = backfill(5, 10, settings());
    let limited = |after| Some(SourceError::RateLimited { retry_after_s: after, should_retry: true });
    b.source.fail_next(vec![limited(Some(0)), limited(None), limited(None)]);
    let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((s.rate_limit_waits, s.recovered, s.complete), (3, 5, true), "{s:?}");

    let b = backfill(5, 10, settings());
    b.source.fail_next(vec![Some(SourceError::RateLimited { retry_after_s: None, should_retry: false })]);
    let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((s.rate_limit_waits, s.recovered, s.complete), (0, 0, false));
    assert!(s.stopped.unwrap().contains("not to retry"));

    // More waits than the run allows, or a wait past its deadline: stop, resume later.
    let b = backfill(5, 10, settings());
    b.source.fail_next(vec![limited(None); 4]);
    let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((s.rate_limit_waits, s.complete), (3, false));
    let b = backfill(5, 10, settings());
    b.source.fail_next(vec![limited(Some(3_600))]);
    let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((s.rate_limit_waits, s.complete), (0, false));
    let resumed = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
    assert_eq!((resumed.recovered, resumed.complete), (5, true));
}

#[tokio::test]
async fn a_dry_run_writes_nothing_and_counts_what_the_real_run_recovers() {
    let b = backfill(25, 10, settings());
    webhook(&b, &["evt_001", "evt_010"]);
    let dry = b.run(&target(), &window(), true, 5_000, later(), |_| {}).await;
    assert_eq!(writes(&b), 0);
    assert!(queued(&b).is_empty());
    let real = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((dry.seen, dry.already_recorded, dry.recovered), (real.seen, real.already_recorded, real.recovered));
    assert_eq!(real.recovered, 23);
}

#[tokio::test]
async fn only_the_window_and_the_asked_types_are_recovered() {
    let b = backfill(25, 10, settings());
    let w = Window { since_s: 1_005, until_s: 1_015, types: vec!["charge.refunded".into()] };
    let s = b.run(&target(), &w, false, 5_000, later(), |_| {}).await;
    // 1005..1015 holds evt_005..evt_014; of those, 006, 009 and 012 are refunds.
    assert_eq!((s.seen, s.recovered), (3, 3));
    assert_eq!(w.run_id("stripe-a"), "stripe-a#1005#1015#charge.refunded");
}

/// A list without bodies (GitHub's deliveries): recorded events cost a
/// read, only the missing ones are fetched; a redelivered identity is met once.
#[tokio::test]
async fn bodies_are_fetched_only_for_what_is_missing_and_repeated_identities_count_once() {
    let b = backfill(6, 10, settings());
    let mut events = b.source.state().events.clone();
    for e in &mut events {
        e.body = None;
    }
    // A redelivery of evt_004 in the list.
    events.insert(1, events[1].clone());
    let b = on(MemSource::new(events, 10), settings());
    webhook(&b, &["evt_002"]);
    let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((s.seen, s.already_recorded, s.recovered), (6, 1, 5), "{s:?}");
    let mut fetched = b.source.state().fetched.clone();
    fetched.sort();
    assert_eq!(fetched, ["evt_000", "evt_001", "evt_003", "evt_004", "evt_005"]);
}

/// Redelivery mode asks the provider again for what is missing, notes
/// the request under the event's key, and records nothing itself.
#[tokio::test]
async fn redelivery_mode_asks_for_the_missing_events_and_notes_it() {
    let b = backfill(4, 10, settings());
    webhook(&b, &["evt_001"]);
    let t = Target { mode: Mode::Redeliver, ..target() };
    let s = b.run(&t, &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!((s.seen, s.already_recorded, s.redeliveries_requested, s.recovered), (4, 1, 3, 0));
    assert_eq!(b.source.state().redelivered, ["d3", "d2", "d0"]);
    let k3 = EventKey::new("stripe", "stripe-a", "evt_003");
    let notes = b.ledger.history(&k3);
    assert_eq!(
        notes[0],
        ("redelivery_requested".to_owned(), "backfill asked the provider to redeliver delivery d3".to_owned())
    );
    assert_eq!(records(&b).len(), 1, "the redelivery records it, through the intake");
}

#[test]
fn scheduled_windows_follow_the_high_water_mark_with_overlap_lag_and_a_bound() {
    let sc =
        Schedule { lag_secs: 100, overlap_secs: 50, lookback_secs: 1_000, max_window_secs: 400, ..Schedule::default() };
    let w = |st: &ScheduleState, now| next_window(st, &sc, now).map(|w| (w.since_s, w.until_s));
    let first = ScheduleState::default();
    assert_eq!(w(&first, 10_000), Some((9_000, 9_400)), "from the lookback, bounded");
    let hw = ScheduleState { high_water: Some(9_400), current: None };
    assert_eq!(w(&hw, 10_000), Some((9_350, 9_750)), "after the mark, less the overlap");
    let caught_up = ScheduleState { high_water: Some(9_880), current: None };
    assert_eq!(w(&caught_up, 10_000), Some((9_830, 9_900)), "ends lag before now");
    let done = ScheduleState { high_water: Some(9_900), current: None };
    assert_eq!(w(&done, 10_000), None, "nothing new yet");
    let busy = ScheduleState { high_water: Some(9_400), current: Some((9_350, 9_750)) };
    assert_eq!(w(&busy, 50_000), Some((9_350, 9_750)), "the window in progress is kept");
    let parsed = parse_schedules(r#"{"gh": {"provider": "github", "hook": "repos/o/r/hooks/1", "lag_secs": 60, "mode": "redeliver"}, "stripe-a": {"provider": "stripe"}}"#, 30).unwrap();
    assert_eq!((parsed["gh"].lag_secs, parsed["gh"].overlap_secs, parsed["gh"].mode), (60, 3_600, Mode::Redeliver));
    assert_eq!(parsed["stripe-a"].mode, Mode::Import);
    for (bad, why) in [
        (r#"{"a": {"provider": "stripe", "lagsecs": 60}}"#, "unknown field"),
        (r#"{"a": {"provider": "stripe", "mode": "redeliver"}}"#, "cannot redeliver"),
        (r#"{"a": {"provider": "github"}}"#, "needs \"hook\""),
        (r#"{"a": {"provider": "github", "hook": "repos/x"}}"#, "needs \"hook\""),
        (r#"{"a": {"provider": "sns"}}"#, "keeps no list"),
        (r#"{"a": {"provider": "stripe", "max_window_secs": 0}}"#, "max window"),
    ] {
        let err = parse_schedules(bad, 30).unwrap_err();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[tokio::test]
async fn scheduled_runs_advance_the_mark_only_when_a_window_is_complete() {
    let b = backfill(25, 10, BackfillSettings { max_pages: 2, ..settings() });
    // Events created 1000..1025; now 1200 s, lag 100, lookback 300: window [900, 1100).
    let sc =
        Schedule { lag_secs: 100, overlap_secs: 10, lookback_secs: 300, max_window_secs: 1_000, ..Schedule::default() };
    let (w1, s1) = b.scheduled(&target(), &sc, 1_200_000, later()).await.unwrap().unwrap();
    assert_eq!(((w1.since_s, w1.until_s), s1.recovered, s1.complete), ((900, 1_100), 20, false));
    let st = schedule(&b);
    assert_eq!(st, ScheduleState { high_water: None, current: Some((900, 1_100)) });
    // Later, the same window is resumed, not a new one.
    let (w2, s2) = b.scheduled(&target(), &sc, 1_500_000, later()).await.unwrap().unwrap();
    assert_eq!(((w2.since_s, w2.until_s), s2.recovered, s2.complete), ((900, 1_100), 5, true));
    let st = schedule(&b);
    assert_eq!(st, ScheduleState { high_water: Some(1_100), current: None });
    // The next window starts at the mark less the overlap.
    let (w3, s3) = b.scheduled(&target(), &sc, 1_500_000, later()).await.unwrap().unwrap();
    assert_eq!(((w3.since_s, w3.until_s), s3.seen), ((1_090, 1_400), 0));
}

#[test]
fn a_backfilled_event_has_the_webhooks_identity_and_its_provenance() {
    let ev = SourceEvent { event_id: "evt_1".into(), event_type: None, created_s: 1, body: None, handle: None };
    let e = new_event(&target(), &ev, b"{}", 1_000, "t".into());
    assert_eq!((e.key.as_str(), e.via), ("evt#stripe#stripe-a#evt_1", Via::Backfill));
    assert!(!Via::Backfill.compares_bytes_with(Via::Webhook));
    assert!(!Via::Webhook.compares_bytes_with(Via::Backfill));
    assert!(Via::Webhook.compares_bytes_with(Via::Redelivery));
}

fn refused(cause: Unfetchable) -> SourceError {
    SourceError::Unfetchable { cause, detail: format!("the list's source says {}", cause.cause()) }
}

fn key(id: &str) -> String {
    format!("evt#stripe#stripe-a#{id}")
}

/// A JSON body whose stored form is larger than an item takes (380 KB).
fn too_large_for_an_item(id: &str) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: String = (0..700_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    format!(r#"{{"id":"{id}","noise":"{noise}"}}"#).into_bytes()
}

/// Issue 18.3: an event whose body the source does not serve (and one
/// not JSON, one answered 404, one over the size bound, one too large for
/// a ledger without a payload bucket) no longer stops the window: each is
/// parked under its identity, the others are recovered, the cursor is
/// saved and the window completes.
#[tokio::test]
async fn events_the_source_cannot_serve_are_parked_and_the_window_completes() {
    let list = MemSource::numbered(8, 3);
    list.refuse("evt_006", refused(Unfetchable::NoPayload));
    list.listed_body("evt_005", b"<html>not json</html>");
    list.refuse("evt_004", refused(Unfetchable::Status(404)));
    list.listed_body("evt_003", format!(r#"{{"id":"evt_003","pad":"{}"}}"#, "x".repeat(300)).as_bytes());
    let b = on(list, BackfillSettings { max_body_bytes: 200, ..settings() });
    let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert!(s.complete && s.stopped.is_none(), "{s:?}");
    assert_eq!((s.seen, s.recovered, s.parked, s.failed, s.pages), (8, 4, 4, 0, 3), "{s:?}");
    let parked = parked(&b);
    let reason = |id: &str| parked.get(&key(id)).map(|p| p.0.as_str());
    assert_eq!(reason("evt_006"), Some("backfill_unrecoverable:no_payload"));
    assert_eq!(reason("evt_005"), Some("backfill_unrecoverable:not_json"));
    assert_eq!(reason("evt_004"), Some("backfill_unrecoverable:http_404"));
    assert_eq!(reason("evt_003"), Some("backfill_unrecoverable:too_large"), "over the backfill's bound");
    let (_, handle, origin) = &parked[&key("evt_006")];
    assert_eq!(
        (handle.as_deref(), origin.as_deref()),
        (Some("d6"), Some("repos/o/r/hooks/1")),
        "what a replay asks for"
    );
    assert_eq!(queued(&b).len(), 4, "only the recovered events are queued");
    assert!(progress(&b, &window()).done, "the cursor moved on to the end");
    // A wider window reads them again: recorded (parked), nothing parked twice.
    let wider = Window { since_s: 999, ..window() };
    let again = b.run(&target(), &wider, false, 6_000, later(), |_| {}).await;
    assert_eq!((again.seen, again.already_recorded, again.parked, again.recovered), (8, 8, 0, 0), "{again:?}");
}

/// The ledger refuses a payload larger than an item takes when no payload
/// bucket is configured: that event is parked as too large, the rest recovered.
#[tokio::test]
async fn an_event_too_large_for_a_ledger_without_a_payload_bucket_is_parked() {
    let list = MemSource::numbered(3, 10);
    list.listed_body("evt_002", &too_large_for_an_item("evt_002"));
    let b = on(list, settings());
    let s = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
    assert!(s.complete && s.stopped.is_none(), "{s:?}");
    assert_eq!((s.recovered, s.parked, s.failed), (2, 1, 0), "{s:?}");
    assert_eq!(parked(&b)[&key("evt_002")].0, "backfill_unrecoverable:too_large");
}

/// Issue 18.3: on a schedule, the window holding an unfetchable event
/// completes, the high-water mark moves to its end, and the next run
/// reads the next window (today the window in progress was kept forever).
#[tokio::test]
async fn a_scheduled_window_holding_an_unfetchable_event_completes_and_moves_the_mark() {
    let list = MemSource::numbered(25, 10);
    list.refuse("evt_012", refused(Unfetchable::NoPayload));
    let b = on(list, BackfillSettings { max_pages: 5, ..settings() });
    let sc =
        Schedule { lag_secs: 100, overlap_secs: 10, lookback_secs: 300, max_window_secs: 1_000, ..Schedule::default() };
    let (w, s) = b.scheduled(&target(), &sc, 1_200_000, later()).await.unwrap().unwrap();
    assert_eq!(((w.since_s, w.until_s), s.complete, s.parked, s.recovered), ((900, 1_100), true, 1, 24), "{s:?}");
    let st = schedule(&b);
    assert_eq!(st, ScheduleState { high_water: Some(1_100), current: None });
    let (next, _) = b.scheduled(&target(), &sc, 1_500_000, later()).await.unwrap().unwrap();
    assert_eq!((next.since_s, next.until_s), (1_090, 1_400), "the next window, not the same one again");
}

/// Only what retrying can cure stops a page: a 5xx or a rate limit on the
/// body, the ledger unavailable for the claim or the park. The page's
/// cursor is not saved; the next run reads it again and skips nothing.
#[tokio::test]
async fn transient_failures_still_stop_the_page_without_saving_its_cursor() {
    let unavailable = SourceError::Unavailable("HTTP 502".into());
    let limited = SourceError::RateLimited { retry_after_s: None, should_retry: false };
    for case in ["5xx", "throttle", "claim", "park"] {
        let list = MemSource::numbered(25, 10);
        match case {
            "5xx" => list.refuse("evt_012", unavailable.clone()),
            "throttle" => list.refuse("evt_012", limited.clone()),
            "park" => list.refuse("evt_012", refused(Unfetchable::NoPayload)),
            _ => {}
        }
        let b = on(list, settings());
        match case {
            "claim" => fail_once(&b, "ledger.claim", "evt_012"),
            "park" => fail_once(&b, "backfill.park", "evt_012"),
            _ => {}
        }
        let first = b.run(&target(), &window(), false, 5_000, later(), |_| {}).await;
        assert_eq!((first.complete, first.failed, first.parked), (false, 1, 0), "{case}: {first:?}");
        assert!(first.stopped.is_some(), "{case}");
        let progress = progress(&b, &window());
        assert_eq!(progress.cursor.as_deref(), Some("evt_015"), "{case}: only the first page is saved");
        if case != "park" {
            b.source.state().refusals.clear();
        }
        let second = b.run(&target(), &window(), false, 6_000, later(), |_| {}).await;
        assert!(second.complete, "{case}: {second:?}");
        assert_eq!(records(&b).len(), 25, "{case}: nothing skipped");
        assert_eq!(parked(&b).len(), usize::from(case == "park"), "{case}");
    }
}

fn parked_evt_001() -> ParkedBackfill {
    ParkedBackfill {
        key: EventKey::new("stripe", "stripe-a", "evt_001"),
        provider: "stripe".into(),
        endpoint: "stripe-a".into(),
        tenant: "t".into(),
        reason: "backfill_unrecoverable:no_payload".into(),
        origin: Some("repos/o/r/hooks/1".into()),
        event: SourceEvent {
            event_id: "evt_001".into(),
            event_type: Some("invoice.paid".into()),
            created_s: 1_001,
            body: None,
            handle: Some("d1".into()),
        },
    }
}

/// Issue 18.3: a replay asks the source for that one event again (same
/// identity, `via = backfill`); while it still cannot serve it the record
/// stays parked; once it can, the payload is stored, the record released
/// and queued, the replay audited; a second replay finds nothing to do.
#[tokio::test]
async fn a_replay_fetches_a_parked_event_again_and_releases_it_once() {
    let list = MemSource::numbered(3, 10);
    list.refuse("evt_001", refused(Unfetchable::NoPayload));
    let b = on(list, settings());
    assert_eq!(b.run(&target(), &window(), false, 5_000, later(), |_| {}).await.parked, 1);
    let record = parked_evt_001();
    let still = b.release(&target(), &record, "alice", "GitHub serves it now", 6_000, later()).await.unwrap();
    assert!(matches!(&still, Released::StillUnfetchable { cause, .. } if cause == "no_payload"), "{still:?}");
    assert_eq!(parked(&b).len(), 1, "still parked");
    b.source.state().refusals.clear();
    let done = b.release(&target(), &record, "alice", "GitHub serves it now", 7_000, later()).await.unwrap();
    assert_eq!(done, Released::Released { queued: true });
    let k1 = EventKey::new("stripe", "stripe-a", "evt_001");
    let (row, _, payload) = memory::ready(crate::ports::OperatorLedger::show(&b.ledger, &k1, true)).unwrap().unwrap();
    assert_eq!(
        (payload.as_deref(), row["released_by"].as_str()),
        (Some(&br#"{"fetched":"evt_001"}"#[..]), Some("operator alice"))
    );
    assert_eq!(records(&b)[&key("evt_001")], Via::Backfill);
    assert_eq!(queued(&b).last(), Some(&key("evt_001")));
    let notes = b.ledger.history(&k1);
    assert!(notes.iter().any(|(kind, d)| kind == "replay" && d.contains("alice")), "{notes:?}");
    let again = b.release(&target(), &record, "alice", "again", 8_000, later()).await.unwrap();
    assert_eq!(again, Released::NotAwaiting);
    assert_eq!(queued(&b).len(), 3, "queued once");
}

#[test]
fn a_parked_record_row_names_what_a_replay_asks_for() {
    let row = |extra: serde_json::Value| -> crate::ledger::Row {
        let mut r = serde_json::json!({
            "pk": "evt#stripe#stripe-a#evt_001", "provider": "stripe", "endpoint": "stripe-a", "tenant": "t",
            "event_id": "evt_001", "event_type": "invoice.paid", "status": "PARKED", "payload_stored": false,
            "via": "backfill", "park_reason": "backfill_unrecoverable:no_payload", "backfill_created": 1_001,
            "backfill_handle": "d1", "backfill_origin": "repos/o/r/hooks/1",
        });
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r.as_object().unwrap().clone()
    };
    assert_eq!(ParkedBackfill::from_row(&row(serde_json::json!({}))), Some(parked_evt_001()));
    for other in [
        serde_json::json!({"park_reason": "gap"}),
        serde_json::json!({"status": "DEAD"}),
        serde_json::json!({"payload_stored": true}),
    ] {
        assert_eq!(ParkedBackfill::from_row(&row(other.clone())), None, "{other}");
    }
}

/// `backfill_overdue_windows`: the end of the window in progress, or with
/// none the high-water mark, more than 2 × max window + 1 h behind
/// now − lag; an endpoint that completed a window in this invocation is
/// catching up, one that never ran has nothing to be behind.
#[test]
fn an_endpoint_is_overdue_when_its_window_or_mark_falls_behind_its_bound() {
    let sc = Schedule { lag_secs: 600, max_window_secs: 21_600, ..Schedule::default() };
    let now = 1_000_000;
    let edge = now - 600 - (2 * 21_600 + 3_600);
    let mark = |hw| ScheduleState { high_water: Some(hw), current: None };
    assert!(!overdue(&mark(edge), &sc, now, false), "at the bound");
    assert!(overdue(&mark(edge - 1), &sc, now, false), "past it");
    let stuck = ScheduleState { high_water: Some(now), current: Some((edge - 100, edge - 1)) };
    assert!(overdue(&stuck, &sc, now, false), "a window in progress counts by its end");
    let fresh = ScheduleState { high_water: Some(0), current: Some((edge - 100, edge)) };
    assert!(!overdue(&fresh, &sc, now, false));
    assert!(!overdue(&mark(edge - 1), &sc, now, true), "catching up: a window completed in this run");
    assert!(!overdue(&ScheduleState::default(), &sc, now, false), "never ran");
}

/// A fetched body is kept as its endpoint's policy keeps a delivered one:
/// under `redact`, what is stored and queued is the redacted body.
#[tokio::test]
async fn a_redacting_endpoints_recovered_events_are_stored_redacted() {
    let b = backfill(3, 10, settings());
    let policy = serde_json::from_value(serde_json::json!({"policy": "redact", "remove": ["/object"]})).unwrap();
    let t = Target { payload: policy, ..target() };
    let s = b.run(&t, &window(), false, 5_000, later(), |_| {}).await;
    assert_eq!(s.recovered, 3, "{s:?}");
    for id in ["evt_000", "evt_001", "evt_002"] {
        let key = EventKey::new("stripe", "stripe-a", id);
        let (_, _, payload) =
            crate::adapters::memory::ready(crate::ports::OperatorLedger::show(&b.ledger, &key, true)).unwrap().unwrap();
        assert_eq!(payload.unwrap(), format!(r#"{{"id":"{id}"}}"#).into_bytes(), "stored redacted");
        assert_eq!(b.ledger.field(&key, "payload_policy").as_deref(), Some("redact"));
    }
    let bodies = b.queue.bodies();
    assert_eq!(bodies.len(), 3);
    assert!(bodies.iter().all(|m| m.contains("evt_0") && !m.contains("object")), "queued redacted: {bodies:?}");
}
