//! Operator actions over the ledger: list, show, replay, park, resolve (the
//! figures are `insight`'s). Reads go through the sparse `attention` and
//! `due` indexes (never a table scan); every
//! change is one conditional update that names the statuses it may leave
//! (the [`OperatorLedger`] port; [`OperatorAction`] says which), plus an
//! audit entry in the record's history.

use crate::identity::EventKey;
use crate::ledger::{OperatorAction, PortError, Row, Status, Transitioned};
use crate::ports::{OperatorLedger, RowFilter, Shown, WorkQueue};

pub const ALL_STATUSES: [Status; 6] =
    [Status::Received, Status::Processing, Status::Retryable, Status::Processed, Status::Dead, Status::Parked];

/// The statuses `list` and `stats` see: every record that is not finished.
/// PROCESSED records are in no index (an index write saved per event);
/// `show KEY` reads one.
pub const INDEXED_STATUSES: [Status; 5] =
    [Status::Received, Status::Processing, Status::Retryable, Status::Dead, Status::Parked];

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("no event with key {0}")]
    UnknownEvent(String),
    #[error("{0:?} is not an event key (expected evt#<provider>#<endpoint>#<event id>)")]
    BadKey(String),
    #[error("cannot {action} {key}: it is {from} ({allowed})")]
    IllegalTransition { action: &'static str, key: String, from: &'static str, allowed: &'static str },
    #[error(transparent)]
    Storage(#[from] PortError),
}

/// Why a replay of a record a backfill parked without its payload is refused.
pub const NEEDS_ITS_SOURCE: &str = "a backfill parked it without its payload (its provider would not serve it); \
     `hookledger replay` fetches it from the provider again, and a webhook delivery of it releases it";

impl OpsError {
    /// A replay refused because a backfill parked the record without its
    /// payload (the condition on the replay refuses it): `hookledger replay`
    /// fetches it from its source instead (`backfill::Backfill::release`).
    pub fn needs_its_source(&self) -> bool {
        matches!(self, Self::IllegalTransition { action, from, .. }
            if *action == OperatorAction::Replay.name() && *from == Status::Parked.as_str())
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Empty: every status.
    pub statuses: Vec<Status>,
    pub endpoint: Option<String>,
    pub event_type: Option<String>,
    pub subject: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub limit: usize,
    /// Continue after this (receive time, key), from the previous page.
    pub cursor: Option<(i64, String)>,
}

pub struct Ops<Q, L> {
    ledger: L,
    queue: Q,
}

pub fn parse_key(raw: &str) -> Result<EventKey, OpsError> {
    EventKey::from_stored(raw).ok_or_else(|| OpsError::BadKey(raw.to_owned()))
}

fn row_at(r: &Row) -> i64 {
    r.get("st_at").and_then(serde_json::Value::as_i64).unwrap_or(0)
}

fn row_str<'a>(r: &'a Row, k: &str) -> Option<&'a str> {
    r.get(k).and_then(serde_json::Value::as_str)
}

impl<Q: WorkQueue, L: OperatorLedger> Ops<Q, L> {
    pub fn new(ledger: L, queue: Q) -> Self {
        Self { ledger, queue }
    }

    /// One status partition, newest first, after the filter's cursor.
    async fn partition(
        &self,
        status: Status,
        shard: u32,
        filter: &ListFilter,
        want: usize,
        fields: &[&str],
    ) -> Result<Vec<Row>, PortError> {
        let hi = filter.cursor.as_ref().map_or(i64::MAX, |c| c.0).min(filter.until_ms.unwrap_or(i64::MAX));
        let rows = RowFilter {
            endpoint: filter.endpoint.as_deref(),
            event_type: filter.event_type.as_deref(),
            subject: filter.subject.as_deref(),
            since_ms: filter.since_ms.unwrap_or(0),
            until_ms: hi,
            fields,
            after: filter.cursor.as_ref().map(|(at, pk)| (*at, pk.as_str())),
        };
        self.ledger.rows(status, shard, &rows, want).await
    }

    /// Records matching `filter`, newest first, at most `limit`; and the
    /// cursor for the next page when there may be more.
    pub async fn list(&self, filter: &ListFilter) -> Result<(Vec<Row>, Option<(i64, String)>), PortError> {
        let statuses = if filter.statuses.is_empty() { INDEXED_STATUSES.to_vec() } else { filter.statuses.clone() };
        let mut all = Vec::new();
        for status in statuses {
            for shard in 0..self.ledger.shards() {
                // One more than the page: a partition with more than `limit`
                // rows after the cursor says "there are more".
                all.extend(self.partition(status, shard, filter, filter.limit.saturating_add(1), &[]).await?);
            }
        }
        let pk = |r: &Row| row_str(r, "pk").unwrap_or_default().to_owned();
        all.sort_by_key(|r| std::cmp::Reverse((row_at(r), pk(r))));
        let more = all.len() > filter.limit;
        all.truncate(filter.limit);
        let cursor = if more { all.last().map(|r| (row_at(r), pk(r))) } else { None };
        Ok((all, cursor))
    }

    /// Counts one status.
    pub async fn count(&self, status: Status) -> Result<u64, PortError> {
        self.ledger.count(status).await
    }

    /// The record, its history (oldest first) and, if asked, its payload.
    pub async fn show(&self, key: &EventKey, with_payload: bool) -> Result<Shown, OpsError> {
        self.ledger.show(key, with_payload).await?.ok_or_else(|| OpsError::UnknownEvent(key.to_string()))
    }

    /// One audited, conditional transition.
    async fn transition(
        &self,
        key: &EventKey,
        action: OperatorAction,
        operator: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), OpsError> {
        match self.ledger.transition(key, action, operator, reason, now_ms).await? {
            Transitioned::Done => {}
            Transitioned::Missing => return Err(OpsError::UnknownEvent(key.to_string())),
            // PARKED may be replayed, unless a backfill parked it without its payload.
            Transitioned::Refused(Status::Parked) if action == OperatorAction::Replay => {
                return Err(OpsError::IllegalTransition {
                    action: action.name(),
                    key: key.to_string(),
                    from: Status::Parked.as_str(),
                    allowed: NEEDS_ITS_SOURCE,
                });
            }
            Transitioned::Refused(from) => {
                return Err(OpsError::IllegalTransition {
                    action: action.name(),
                    key: key.to_string(),
                    from: from.as_str(),
                    allowed: action.allowed(),
                });
            }
        }
        self.ledger.append_history(key, action.name(), &format!("by {operator}: {reason}"), now_ms).await?;
        Ok(())
    }

    /// DEAD or PARKED → RETRYABLE, due now, attempts and failures reset, a
    /// new time window (set by the next lease), same identity; audited; the
    /// key is queued at once. A record a backfill parked without its payload
    /// is refused ([`OpsError::needs_its_source`]): `hookledger replay`
    /// fetches it from its provider again (`backfill::Backfill::release`).
    pub async fn replay(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(key, OperatorAction::Replay, operator, reason, now_ms).await?;
        self.queue.send(key).await?;
        Ok(())
    }

    /// RECEIVED, RETRYABLE or DEAD → PARKED: stop working on it until replayed.
    pub async fn park(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(key, OperatorAction::Park, operator, reason, now_ms).await
    }

    /// DEAD or PARKED → PROCESSED with outcome `resolved`: the operator
    /// settled the outcome outside Hookledger.
    pub async fn resolve(&self, key: &EventKey, operator: &str, reason: &str, now_ms: i64) -> Result<(), OpsError> {
        self.transition(key, OperatorAction::Resolve, operator, reason, now_ms).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, MutexGuard};

    use serde_json::{Value, json};

    use super::*;

    /// The in-memory ledger's own partitioning (one per status and shard).
    fn status_shard(status: Status, shard: u32) -> String {
        format!("{}#{shard:03}", status.as_str())
    }

    const NOW: i64 = 1_700_000_000_000;
    const SHARDS: u32 = 4;

    // ------------------------------------------------------------ in-memory ports

    #[derive(Default)]
    struct Table {
        records: BTreeMap<String, Row>,
        history: BTreeMap<String, Vec<Row>>,
        payloads: BTreeMap<String, Vec<u8>>,
    }

    /// The ledger in memory as the operator sees it through the `status`
    /// index (`st_shard`/`st_at`, newest first, the filter applied to each
    /// page as DynamoDB does), with the conditions of
    /// `adapters::dynamodb::conditions::operator`.
    #[derive(Clone)]
    struct MemLedger {
        table: Arc<Mutex<Table>>,
        /// Items read per query page (DynamoDB: up to 1 MB); `rows` pages
        /// until it has `want` rows.
        page_rows: usize,
    }

    impl MemLedger {
        fn new() -> Self {
            Self { table: Arc::default(), page_rows: 1_000 }
        }

        fn table(&self) -> MutexGuard<'_, Table> {
            self.table.lock().unwrap()
        }

        /// A record as the intake writes it, moved to `status`, with extra attributes.
        fn add(&self, key: &EventKey, status: Status, received_at: i64, extra: Value) {
            let mut parts = key.as_str().splitn(4, '#').skip(1);
            let (provider, endpoint, event_id) = (parts.next(), parts.next(), parts.next());
            let mut row = json!({
                "pk": key.as_str(), "sk": "meta", "provider": provider, "endpoint": endpoint,
                "event_id": event_id, "event_type": "invoice.paid", "status": status.as_str(),
                "st_shard": status_shard(status, key.shard(SHARDS)), "st_at": received_at,
                "received_at": received_at, "attempts": 2, "failures": 1, "duplicates": 0,
            });
            for (k, v) in extra.as_object().cloned().unwrap_or_default() {
                if v.is_null() {
                    row.as_object_mut().unwrap().remove(&k);
                } else {
                    row[k] = v;
                }
            }
            let Value::Object(row) = row else { unreachable!() };
            self.table().records.insert(key.as_str().to_owned(), row);
        }

        fn record(&self, key: &EventKey) -> Row {
            self.table().records.get(key.as_str()).cloned().unwrap()
        }

        fn history(&self, key: &EventKey) -> Vec<Row> {
            self.table().history.get(key.as_str()).cloned().unwrap_or_default()
        }

        fn history_is_empty(&self) -> bool {
            self.table().history.is_empty()
        }
    }

    /// The record, its history and its payload.
    type Shown = (Row, Vec<Row>, Option<Vec<u8>>);

    fn st_at(r: &Row) -> i64 {
        r["st_at"].as_i64().unwrap()
    }

    fn pk(r: &Row) -> &str {
        r["pk"].as_str().unwrap()
    }

    impl OperatorLedger for MemLedger {
        fn shards(&self) -> u32 {
            SHARDS
        }

        async fn rows(
            &self,
            status: Status,
            shard: u32,
            filter: &RowFilter<'_>,
            want: usize,
        ) -> Result<Vec<Row>, PortError> {
            if status == Status::Processed {
                // As in DynamoDB: finished records are in no index.
                return Ok(Vec::new());
            }
            let table = self.table();
            let partition = status_shard(status, shard);
            let mut index: Vec<&Row> = table
                .records
                .values()
                .filter(|r| r.get("st_shard").and_then(Value::as_str) == Some(partition.as_str()))
                .filter(|r| (filter.since_ms..=filter.until_ms).contains(&st_at(r)))
                .filter(|r| filter.is_after(st_at(r), pk(r)))
                .collect();
            // Newest first; equal sort keys by key, descending.
            index.sort_by(|a, b| (st_at(b), pk(b)).cmp(&(st_at(a), pk(a))));
            let matches = |r: &Row| {
                [("endpoint", filter.endpoint), ("event_type", filter.event_type), ("subject", filter.subject)]
                    .into_iter()
                    .all(|(name, want)| want.is_none_or(|w| r.get(name).and_then(Value::as_str) == Some(w)))
            };
            let project = |r: &Row| -> Row {
                if filter.fields.is_empty() {
                    r.clone()
                } else {
                    r.iter()
                        .filter(|(k, _)| filter.fields.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                }
            };
            let mut out = Vec::new();
            for page in index.chunks(self.page_rows) {
                out.extend(page.iter().copied().filter(|r| matches(r)).map(project));
                if out.len() >= want {
                    break;
                }
            }
            Ok(out)
        }

        async fn count(&self, status: Status) -> Result<u64, PortError> {
            if status == Status::Processed {
                return Ok(0);
            }
            Ok(self.table().records.values().filter(|r| r["status"] == status.as_str()).count() as u64)
        }

        async fn show(&self, key: &EventKey, with_payload: bool) -> Result<Option<Shown>, PortError> {
            let table = self.table();
            let Some(record) = table.records.get(key.as_str()) else { return Ok(None) };
            let history = table.history.get(key.as_str()).cloned().unwrap_or_default();
            let payload = if with_payload { table.payloads.get(key.as_str()).cloned() } else { None };
            Ok(Some((record.clone(), history, payload)))
        }

        async fn transition(
            &self,
            key: &EventKey,
            action: OperatorAction,
            operator: &str,
            reason: &str,
            now_ms: i64,
        ) -> Result<Transitioned, PortError> {
            let mut table = self.table();
            let Some(r) = table.records.get_mut(key.as_str()) else { return Ok(Transitioned::Missing) };
            let from = Status::parse(r["status"].as_str().unwrap()).unwrap();
            if !action.from().contains(&from) {
                return Ok(Transitioned::Refused(from));
            }
            // As `conditions::operator`: no replay of a record awaiting its payload.
            let unfetched = r
                .get("park_reason")
                .and_then(Value::as_str)
                .is_some_and(|p| p.starts_with(crate::ledger::BACKFILL_UNRECOVERABLE));
            if action == OperatorAction::Replay && unfetched {
                return Ok(Transitioned::Refused(from));
            }
            let to = action.to();
            r.insert("status".into(), to.as_str().into());
            r.insert("st_shard".into(), status_shard(to, key.shard(SHARDS)).into());
            r.insert("operator_token".into(), uuid::Uuid::new_v4().to_string().into());
            if to.is_terminal() {
                for gone in ["due_shard", "due_at", "next_attempt_at"] {
                    r.remove(gone);
                }
            }
            match action {
                OperatorAction::Replay => {
                    for (k, v) in [
                        ("due_at", json!(now_ms)),
                        ("next_attempt_at", json!(now_ms)),
                        ("attempts", json!(0)),
                        ("failures", json!(0)),
                        ("last_replay_by", json!(operator)),
                        ("last_replay_reason", json!(reason)),
                        ("last_replay_at", json!(now_ms)),
                    ] {
                        r.insert(k.into(), v);
                    }
                    let replays = r.get("replays").and_then(Value::as_i64).unwrap_or(0);
                    r.insert("replays".into(), json!(replays + 1));
                    r.remove("window_start");
                }
                OperatorAction::Park => {
                    r.insert("park_reason".into(), json!(format!("operator {operator}: {reason}")));
                    r.insert("parked_at".into(), json!(now_ms));
                }
                OperatorAction::Resolve => {
                    for (k, v) in [
                        ("outcome", json!("resolved")),
                        ("processed_at", json!(now_ms)),
                        ("resolved_by", json!(operator)),
                        ("resolve_reason", json!(reason)),
                    ] {
                        r.insert(k.into(), v);
                    }
                }
            }
            Ok(Transitioned::Done)
        }

        async fn append_history(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) -> Result<(), PortError> {
            let entry = json!({"kind": kind, "detail": detail, "at": now_ms});
            let Value::Object(entry) = entry else { unreachable!() };
            self.table().history.entry(key.as_str().to_owned()).or_default().push(entry);
            Ok(())
        }
    }

    /// A queue that records what it was handed, and can be down.
    #[derive(Clone, Default)]
    struct RecordingQueue(Arc<Mutex<(Vec<EventKey>, bool)>>);

    impl RecordingQueue {
        fn sent(&self) -> Vec<EventKey> {
            self.0.lock().unwrap().0.clone()
        }

        fn go_down(&self) {
            self.0.lock().unwrap().1 = true;
        }
    }

    impl WorkQueue for RecordingQueue {
        async fn send(&self, key: &EventKey) -> Result<(), PortError> {
            let mut q = self.0.lock().unwrap();
            if q.1 {
                return Err(PortError::Unavailable { service: "sqs", message: "queue down".into() });
            }
            q.0.push(key.clone());
            Ok(())
        }
    }

    fn ops() -> (MemLedger, RecordingQueue, Ops<RecordingQueue, MemLedger>) {
        let (ledger, queue) = (MemLedger::new(), RecordingQueue::default());
        (ledger.clone(), queue.clone(), Ops::new(ledger, queue))
    }

    fn key(id: &str) -> EventKey {
        EventKey::new("stripe", "billing-eu", id)
    }

    fn status_of(ledger: &MemLedger, key: &EventKey) -> String {
        ledger.record(key)["status"].as_str().unwrap().to_owned()
    }

    // -------------------------------------------------------------- transitions

    #[tokio::test]
    async fn replay_moves_dead_and_parked_records_to_retryable_audits_it_and_queues_the_key_once() {
        let (ledger, queue, ops) = ops();
        let (dead, parked) = (key("evt_dead"), key("evt_parked"));
        ledger.add(&dead, Status::Dead, NOW - 1_000, json!({"attempts": 7, "failures": 5, "window_start": NOW - 900}));
        ledger.add(&parked, Status::Parked, NOW - 2_000, json!({"park_reason": "gap"}));

        ops.replay(&dead, "alice", "the API key is fixed", NOW).await.unwrap();
        ops.replay(&parked, "alice", "gap filled by hand", NOW + 1).await.unwrap();

        assert_eq!(queue.sent(), vec![dead.clone(), parked.clone()]);
        let r = ledger.record(&dead);
        assert_eq!(r["status"], "RETRYABLE");
        assert_eq!(r["st_shard"], status_shard(Status::Retryable, dead.shard(SHARDS)).as_str());
        assert_eq!((r["attempts"].as_i64(), r["failures"].as_i64()), (Some(0), Some(0)));
        assert_eq!((r["due_at"].as_i64(), r.get("window_start")), (Some(NOW), None));
        assert_eq!((r["last_replay_by"].as_str(), r["st_at"].as_i64()), (Some("alice"), Some(NOW - 1_000)));
        assert_eq!(status_of(&ledger, &parked), "RETRYABLE");
        let history = ledger.history(&dead);
        assert_eq!(history.len(), 1, "{history:?}");
        assert_eq!(history[0]["kind"], "replay");
        assert_eq!(history[0]["detail"], "by alice: the API key is fixed");
        assert_eq!(history[0]["at"], NOW);
        assert_eq!(ledger.history(&parked)[0]["detail"], "by alice: gap filled by hand");
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
        let err = ops.replay(&k, "alice", "try it", NOW).await.unwrap_err();
        assert!(matches!(err, OpsError::IllegalTransition { from: "PARKED", .. }), "{err}");
        assert!(err.needs_its_source(), "{err}");
        assert!(err.to_string().contains("hookledger replay"), "{err}");
        assert_eq!((status_of(&ledger, &k), queue.sent().len()), ("PARKED".to_owned(), 0));
        assert!(ledger.history_is_empty());
        ops.resolve(&k, "alice", "sent by hand", NOW).await.unwrap();
        assert_eq!(status_of(&ledger, &k), "PROCESSED");
    }

    #[tokio::test]
    async fn replay_and_resolve_of_a_record_that_is_not_dead_or_parked_are_refused_naming_its_status() {
        let (ledger, queue, ops) = ops();
        for status in [Status::Processed, Status::Received, Status::Processing, Status::Retryable] {
            let k = key(&format!("evt_{}", status.as_str()));
            ledger.add(&k, status, NOW - 1_000, json!({}));
            let before = ledger.record(&k);
            for action in [OperatorAction::Replay, OperatorAction::Resolve] {
                let err = match action {
                    OperatorAction::Replay => ops.replay(&k, "alice", "why", NOW).await.unwrap_err(),
                    _ => ops.resolve(&k, "alice", "why", NOW).await.unwrap_err(),
                };
                match err {
                    OpsError::IllegalTransition { action: name, key: ref shown, from, allowed } => {
                        assert_eq!((name, shown.as_str(), from), (action.name(), k.as_str(), status.as_str()));
                        assert_eq!(allowed, action.allowed());
                    }
                    other => panic!("{action:?} of {status:?}: {other:?}"),
                }
                assert_eq!(ledger.record(&k), before, "{action:?} of {status:?} changed the record");
            }
        }
        assert!(queue.sent().is_empty(), "{:?}", queue.sent());
        assert!(ledger.history_is_empty());
    }

    #[tokio::test]
    async fn park_of_a_record_in_flight_processed_or_parked_is_refused_naming_its_status() {
        let (ledger, queue, ops) = ops();
        for status in [Status::Processing, Status::Processed, Status::Parked] {
            let k = key(&format!("evt_{}", status.as_str()));
            ledger.add(&k, status, NOW - 1_000, json!({}));
            let before = ledger.record(&k);
            let err = ops.park(&k, "bob", "noisy", NOW).await.unwrap_err();
            assert!(
                matches!(err, OpsError::IllegalTransition { action: "park", from, .. } if from == status.as_str()),
                "{status:?}: {err:?}"
            );
            assert!(err.to_string().contains(status.as_str()), "{err}");
            assert_eq!(ledger.record(&k), before);
        }
        assert!(queue.sent().is_empty());
        assert!(ledger.history_is_empty());
    }

    #[tokio::test]
    async fn park_stops_received_retryable_and_dead_records_without_queueing() {
        let (ledger, queue, ops) = ops();
        for status in [Status::Received, Status::Retryable, Status::Dead] {
            let k = key(&format!("evt_{}", status.as_str()));
            ledger.add(&k, status, NOW - 1_000, json!({"due_at": NOW, "due_shard": "due#001"}));
            ops.park(&k, "bob", "customer asked to wait", NOW).await.unwrap();
            let r = ledger.record(&k);
            assert_eq!(r["status"], "PARKED");
            assert_eq!(r["park_reason"], "operator bob: customer asked to wait");
            assert!(r.get("due_at").is_none(), "a parked record leaves the due index: {r:?}");
            let history = ledger.history(&k);
            assert_eq!((history.len(), &history[0]["kind"]), (1, &json!("park")));
        }
        assert!(queue.sent().is_empty());
    }

    #[tokio::test]
    async fn resolve_settles_dead_and_parked_records_as_processed_without_queueing() {
        let (ledger, queue, ops) = ops();
        for status in [Status::Dead, Status::Parked] {
            let k = key(&format!("evt_{}", status.as_str()));
            ledger.add(&k, status, NOW - 1_000, json!({}));
            ops.resolve(&k, "carol", "refunded by hand", NOW).await.unwrap();
            let r = ledger.record(&k);
            assert_eq!((r["status"].as_str(), r["outcome"].as_str()), (Some("PROCESSED"), Some("resolved")));
            assert_eq!(r["resolved_by"], "carol");
            let history = ledger.history(&k);
            assert_eq!(history.len(), 1);
            assert_eq!(
                (&history[0]["kind"], &history[0]["detail"]),
                (&json!("resolve"), &json!("by carol: refunded by hand"))
            );
        }
        assert!(queue.sent().is_empty());
    }

    #[tokio::test]
    async fn actions_on_an_unknown_key_report_an_unknown_event() {
        let (ledger, queue, ops) = ops();
        ledger.add(&key("evt_other"), Status::Dead, NOW, json!({}));
        let k = key("evt_missing");
        let results = [
            ops.replay(&k, "alice", "why", NOW).await,
            ops.park(&k, "alice", "why", NOW).await,
            ops.resolve(&k, "alice", "why", NOW).await,
            ops.show(&k, true).await.map(|_| ()),
        ];
        for r in results {
            assert!(matches!(&r, Err(OpsError::UnknownEvent(shown)) if shown == k.as_str()), "{r:?}");
        }
        assert!(queue.sent().is_empty());
        assert!(ledger.history_is_empty());
        assert!(matches!(parse_key("evt#stripe#billing-eu"), Err(OpsError::BadKey(_))));
    }

    #[tokio::test]
    async fn a_queue_failure_after_a_replay_is_an_error_but_the_record_is_already_retryable() {
        let (ledger, queue, ops) = ops();
        let k = key("evt_dead");
        ledger.add(&k, Status::Dead, NOW - 1_000, json!({}));
        queue.go_down();

        let err = ops.replay(&k, "alice", "fixed", NOW).await.unwrap_err();
        assert!(matches!(err, OpsError::Storage(PortError::Unavailable { service: "sqs", .. })), "{err:?}");
        // Audited and due now: the reconciler re-drives it; a second replay is refused.
        assert_eq!(status_of(&ledger, &k), "RETRYABLE");
        assert_eq!(ledger.record(&k)["due_at"], NOW);
        assert_eq!(ledger.history(&k).len(), 1);
        assert!(matches!(
            ops.replay(&k, "alice", "again", NOW).await,
            Err(OpsError::IllegalTransition { from: "RETRYABLE", .. })
        ));
    }

    #[tokio::test]
    async fn show_returns_the_record_its_history_oldest_first_and_the_payload_when_asked() {
        let (ledger, _queue, ops) = ops();
        let k = key("evt_1");
        ledger.add(&k, Status::Dead, NOW - 5_000, json!({}));
        ledger.table().payloads.insert(k.as_str().to_owned(), b"{\"id\":\"evt_1\"}".to_vec());
        ops.park(&k, "bob", "first", NOW).await.unwrap();
        ops.replay(&k, "bob", "second", NOW + 1).await.unwrap();

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

    async fn all_pages(ops: &Ops<RecordingQueue, MemLedger>, filter: ListFilter) -> Vec<Vec<String>> {
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
        let (mut ledger, queue, _) = ops();
        // The port pages "until `want` rows (or the end)": one-row pages stop at exactly `want`.
        ledger.page_rows = 1;
        let ops = Ops::new(ledger.clone(), queue);
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
            (
                key("w1"),
                Status::Processing,
                7_000,
                json!({"event_type": "customer.updated", "lease_expires_at": NOW - 1}),
            ),
        ] {
            ledger.add(&k, status, NOW - age, extra);
        }
        let insight = crate::insight::Insight::new(ledger.clone(), NoMetrics);
        let stats = insight.stats(&WINDOW, NOW).await.unwrap();
        let counts = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };
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
}
