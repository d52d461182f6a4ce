//! The operator's figures at any volume (`hookledger stats`, `hookledger
//! failures`, the console's overview), from two bounded sources:
//!
//! - **the functions' metrics** ([`MetricsReader`]): throughput, outcomes,
//!   latency, the duplicate rate and drift repairs, per period. Their cost
//!   depends on the number of series, never on traffic;
//! - **the ledger's sparse sets** ([`OperatorLedger`]): DEAD and PARKED
//!   records (the `attention` index) and open records (the `due` index), at
//!   most `cap` rows of each per shard. PROCESSED records are in no index and
//!   are never read to be counted; the pipeline writes no counter items.

use std::collections::BTreeMap;

use crate::ledger::{PortError, Row, Status};
use crate::ports::{MetricSeries, MetricWindow, MetricsReader, OperatorLedger, RowFilter};

/// The metrics the figures are made of (names as the functions emit them).
pub const METRIC_NAMES: [&str; 18] = [
    "received",
    "duplicate",
    "payload_conflict",
    "rejected",
    "failed",
    "processed",
    "retried",
    "dead_lettered",
    "parked",
    "processing_duration",
    "queue_to_complete",
    "drift_found",
    "drift_repaired",
    // Routes' deliveries, each with its `destination`.
    "delivered",
    "delivery_retried",
    "delivery_failed",
    "delivery_dead",
    "delivery_latency",
];

/// One route destination's deliveries over the window.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DestinationFigures {
    pub delivered: u64,
    /// Delivered after a first attempt failed.
    pub retried: u64,
    /// Attempts that failed (each backed off for the sweep).
    pub failed: u64,
    pub dead: u64,
    /// Receipt to delivery.
    pub latency: Latency,
}

/// Defaults: rows read at most per shard and sparse set, and list lengths.
pub const DEFAULT_CAP_PER_SHARD: usize = 500;
pub const DEFAULT_TOP: usize = 10;

#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Latency {
    pub mean_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// One period of the window, for plots.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Period {
    pub at_ms: i64,
    pub received: u64,
    pub duplicates: u64,
    pub processed: u64,
    /// Retries scheduled plus records dead-lettered in the period.
    pub failed: u64,
    pub processing: Latency,
}

/// What the ledger holds now that is not finished.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Standing {
    pub by_status: BTreeMap<String, u64>,
    pub oldest_unprocessed_age_ms: Option<i64>,
    pub stuck_leases: u64,
    /// Some shard had more rows than the cap: counts are lower bounds.
    pub truncated: bool,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    pub since_ms: i64,
    pub until_ms: i64,
    pub period_s: i64,
    /// New events recorded by the intake.
    pub received: u64,
    /// Deliveries of events already recorded.
    pub duplicates: u64,
    /// duplicates / (received + duplicates).
    pub duplicate_rate: f64,
    pub payload_conflicts: u64,
    /// Deliveries refused (signature, age, size, unknown endpoint, ...).
    pub rejected: u64,
    /// Deliveries the intake could not take (answered 503).
    pub unavailable: u64,
    /// Processor outcomes (applied, no-op, stale, ...).
    pub processed: BTreeMap<String, u64>,
    pub retried: u64,
    pub dead_lettered: u64,
    pub parked: u64,
    pub processing: Latency,
    pub receipt_to_completion: Latency,
    pub drift_found: u64,
    pub drift_repaired: u64,
    /// Routes' deliveries, by destination.
    pub destinations: BTreeMap<String, DestinationFigures>,
    pub now: Standing,
    pub periods: Vec<Period>,
}

/// The processor outcomes that end an event's processing (a final state
/// reached): the projection applied it, found it stale or already applied,
/// or had nothing to do. DEAD and PARKED are counted on their own.
pub const FINAL_OUTCOMES: [&str; 4] = ["applied", "stale", "duplicate", "ignored"];
/// Outcomes of a message whose event was not processed by it: a redelivery
/// of an event already final, leased elsewhere, not due yet, unknown, or
/// fenced out by a newer lease.
pub const REDELIVERY_OUTCOMES: [&str; 5] = ["already_final", "busy", "not_due", "missing", "fenced"];

impl Stats {
    /// Events that reached a final state through processing in the window.
    pub fn processed_final(&self) -> u64 {
        FINAL_OUTCOMES.iter().filter_map(|o| self.processed.get(*o)).sum()
    }

    /// Queue messages that found nothing to process (see [`REDELIVERY_OUTCOMES`]).
    pub fn redeliveries(&self) -> u64 {
        REDELIVERY_OUTCOMES.iter().filter_map(|o| self.processed.get(*o)).sum()
    }
}

/// One tenant's figures (`hookledger stats --tenant T`): what is open,
/// dead or parked now, from the ledger's sparse sets; and, for a tenant
/// listed in `TenantMetrics`, its own metrics over the window.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TenantStats {
    pub tenant: String,
    pub since_ms: i64,
    pub until_ms: i64,
    /// `None`: the tenant has no metrics of its own in the window (it is
    /// not listed in `TenantMetrics`, or nothing happened).
    pub metrics: Option<TenantFigures>,
    pub now: Standing,
}

/// A listed tenant's own metrics over the window.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TenantFigures {
    pub received: u64,
    pub processed: u64,
    pub dead: u64,
    pub receipt_to_completion: Latency,
}

/// The metrics written for the tenants listed in `TenantMetrics`.
pub const TENANT_METRIC_NAMES: [&str; 4] =
    ["tenant_received", "tenant_processed", "tenant_dead", "tenant_queue_to_complete"];

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Count {
    pub key: String,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StuckLease {
    pub key: String,
    pub lease_expired_ms_ago: i64,
    pub attempts: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Oldest {
    pub key: String,
    pub status: String,
    pub age_ms: i64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RatePoint {
    pub at_ms: i64,
    pub deliveries: u64,
    pub rate: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DriftPoint {
    pub at_ms: i64,
    pub found: u64,
    pub repaired: u64,
}

/// A bounded failure summary: top-N lists over the sparse sets, and the
/// trends from the metrics.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Failures {
    pub since_ms: i64,
    pub until_ms: i64,
    /// `provider event_type` of DEAD, PARKED and RETRYABLE records, most first.
    pub top_types: Vec<Count>,
    /// Subjects (a Stripe customer, a repository) with two or more failing records.
    pub repeated_subjects: Vec<Count>,
    /// Why: the dead or park reason, or the last error code.
    pub reasons: Vec<Count>,
    /// PROCESSING records whose lease has expired (their worker died).
    pub stuck_leases: Vec<StuckLease>,
    pub oldest_unprocessed: Option<Oldest>,
    pub duplicate_rate: Vec<RatePoint>,
    pub drift: Vec<DriftPoint>,
    /// Routes' destinations by their failed delivery attempts in the
    /// window (each backed off for the sweep), most first.
    pub failing_destinations: Vec<Count>,
    /// Routes' destinations by the deliveries that went DEAD in the window.
    pub dead_deliveries: Vec<Count>,
    pub now: Standing,
}

/// The operator's figures over a ledger and the functions' metrics.
pub struct Insight<L, M> {
    ledger: L,
    metrics: M,
    cap_per_shard: usize,
    top: usize,
}

fn text<'a>(r: &'a Row, k: &str) -> Option<&'a str> {
    r.get(k).and_then(serde_json::Value::as_str).filter(|s| !s.is_empty())
}

fn num(r: &Row, k: &str) -> Option<i64> {
    r.get(k).and_then(serde_json::Value::as_i64)
}

/// The rows of the sparse sets, as read.
#[derive(Debug, Default)]
pub struct Sparse {
    pub rows: Vec<Row>,
    pub truncated: bool,
}

impl<L: OperatorLedger, M: MetricsReader> Insight<L, M> {
    pub fn new(ledger: L, metrics: M) -> Self {
        Self { ledger, metrics, cap_per_shard: DEFAULT_CAP_PER_SHARD, top: DEFAULT_TOP }
    }

    pub fn with_limits(mut self, cap_per_shard: usize, top: usize) -> Self {
        self.cap_per_shard = cap_per_shard.max(1);
        self.top = top.max(1);
        self
    }

    /// DEAD and PARKED (at most `cap` each per shard) and every open record.
    pub async fn sparse(&self) -> Result<Sparse, PortError> {
        self.sparse_of(None).await
    }

    /// [`Self::sparse`], of one tenant's records only.
    async fn sparse_of(&self, tenant: Option<&str>) -> Result<Sparse, PortError> {
        let all = RowFilter { until_ms: i64::MAX, tenant, ..RowFilter::default() };
        let mut out = Sparse::default();
        for shard in 0..self.ledger.shards() {
            for status in [Status::Dead, Status::Parked] {
                let rows = self.ledger.rows(status, shard, &all, self.cap_per_shard).await?;
                out.truncated |= rows.len() >= self.cap_per_shard;
                out.rows.extend(rows.into_iter().take(self.cap_per_shard));
            }
            let mut open = self.ledger.open_rows(shard).await?;
            if let Some(t) = tenant {
                open.retain(|r| text(r, "tenant") == Some(t));
            }
            out.truncated |= open.len() > self.cap_per_shard;
            out.rows.extend(open.into_iter().take(self.cap_per_shard));
        }
        Ok(out)
    }

    pub async fn stats(&self, window: &MetricWindow, now_ms: i64) -> Result<Stats, PortError> {
        let series = self.metrics.read(&METRIC_NAMES, window).await?;
        let sparse = self.sparse().await?;
        Ok(stats_from(&series, &sparse, window, now_ms))
    }

    /// Both, from one read of each source (the console's overview).
    pub async fn overview(&self, window: &MetricWindow, now_ms: i64) -> Result<(Stats, Failures), PortError> {
        let series = self.metrics.read(&METRIC_NAMES, window).await?;
        let sparse = self.sparse().await?;
        Ok((stats_from(&series, &sparse, window, now_ms), failures_from(&series, &sparse, window, now_ms, self.top)))
    }

    /// One tenant's figures: its standing from the sparse sets, filtered by
    /// tenant, and its own metrics when it has any.
    pub async fn tenant_stats(
        &self,
        tenant: &str,
        window: &MetricWindow,
        now_ms: i64,
    ) -> Result<TenantStats, PortError> {
        let series = self.metrics.read(&TENANT_METRIC_NAMES, window).await?;
        let sparse = self.sparse_of(Some(tenant)).await?;
        Ok(tenant_stats_from(tenant, &series, &sparse, window, now_ms))
    }

    pub async fn failures(&self, window: &MetricWindow, now_ms: i64) -> Result<Failures, PortError> {
        let series = self.metrics.read(&["received", "duplicate", "drift_found", "drift_repaired"], window).await?;
        let sparse = self.sparse().await?;
        Ok(failures_from(&series, &sparse, window, now_ms, self.top))
    }
}

/// Sums of `name` over every series, per period.
fn per_period(series: &[MetricSeries], name: &str) -> BTreeMap<i64, (f64, f64, f64)> {
    let mut out: BTreeMap<i64, (f64, f64, f64)> = BTreeMap::new();
    for s in series.iter().filter(|s| s.name == name) {
        for p in &s.points {
            let e = out.entry(p.at_ms).or_default();
            e.0 += p.sum;
            e.1 += p.count;
            e.2 = e.2.max(p.max);
        }
    }
    out
}

fn total(series: &[MetricSeries], name: &str) -> u64 {
    per_period(series, name).values().map(|v| v.0).sum::<f64>().round() as u64
}

fn latency(series: &[MetricSeries], name: &str) -> Latency {
    let p = per_period(series, name);
    let (sum, count) = p.values().fold((0.0, 0.0), |a, v| (a.0 + v.0, a.1 + v.1));
    if count == 0.0 {
        return Latency::default();
    }
    Latency { mean_ms: Some(sum / count), max_ms: p.values().map(|v| v.2).reduce(f64::max) }
}

fn rate(dups: u64, received: u64) -> f64 {
    let deliveries = dups + received;
    if deliveries == 0 { 0.0 } else { dups as f64 / deliveries as f64 }
}

/// One tenant's figures from its metric series (those with its `tenant`
/// dimension) and its rows of the sparse sets.
pub fn tenant_stats_from(
    tenant: &str,
    series: &[MetricSeries],
    sparse: &Sparse,
    window: &MetricWindow,
    now_ms: i64,
) -> TenantStats {
    let own: Vec<MetricSeries> =
        series.iter().filter(|s| s.dimensions.iter().any(|(k, v)| k == "tenant" && v == tenant)).cloned().collect();
    let metrics = (!own.is_empty()).then(|| TenantFigures {
        received: total(&own, "tenant_received"),
        processed: total(&own, "tenant_processed"),
        dead: total(&own, "tenant_dead"),
        receipt_to_completion: latency(&own, "tenant_queue_to_complete"),
    });
    TenantStats {
        tenant: tenant.to_owned(),
        since_ms: window.since_ms,
        until_ms: window.until_ms,
        metrics,
        now: standing(sparse, now_ms),
    }
}

fn standing(sparse: &Sparse, now_ms: i64) -> Standing {
    let mut s = Standing { truncated: sparse.truncated, ..Standing::default() };
    for status in [Status::Received, Status::Processing, Status::Retryable, Status::Dead, Status::Parked] {
        s.by_status.insert(status.as_str().to_owned(), 0);
    }
    for r in &sparse.rows {
        let status = text(r, "status").unwrap_or("-");
        *s.by_status.entry(status.to_owned()).or_default() += 1;
        if is_unprocessed(status) {
            let age = now_ms - num(r, "received_at").unwrap_or(now_ms);
            s.oldest_unprocessed_age_ms = Some(s.oldest_unprocessed_age_ms.map_or(age, |a| a.max(age)));
        }
        if stuck(r, now_ms).is_some() {
            s.stuck_leases += 1;
        }
    }
    s
}

fn is_unprocessed(status: &str) -> bool {
    [Status::Received, Status::Processing, Status::Retryable].iter().any(|s| s.as_str() == status)
}

/// How long ago the lease of a PROCESSING row expired, if it has.
fn stuck(r: &Row, now_ms: i64) -> Option<i64> {
    if text(r, "status") != Some(Status::Processing.as_str()) {
        return None;
    }
    let expires = num(r, "lease_expires_at")?;
    (expires < now_ms).then_some(now_ms - expires)
}

pub fn stats_from(series: &[MetricSeries], sparse: &Sparse, window: &MetricWindow, now_ms: i64) -> Stats {
    let (received, duplicates) = (total(series, "received"), total(series, "duplicate"));
    let mut processed = BTreeMap::new();
    for s in series.iter().filter(|s| s.name == "processed") {
        let outcome = s.dimensions.iter().find(|(k, _)| k == "outcome").map_or("-", |(_, v)| v.as_str());
        *processed.entry(outcome.to_owned()).or_default() += s.points.iter().map(|p| p.sum).sum::<f64>().round() as u64;
    }
    let by = |name: &str| per_period(series, name);
    let (rec, dup, done, retried, dead, proc) = (
        by("received"),
        by("duplicate"),
        by("processed"),
        by("retried"),
        by("dead_lettered"),
        by("processing_duration"),
    );
    let mut at: Vec<i64> = [&rec, &dup, &done, &retried, &dead, &proc].iter().flat_map(|m| m.keys().copied()).collect();
    at.sort_unstable();
    at.dedup();
    let get = |m: &BTreeMap<i64, (f64, f64, f64)>, t: i64| m.get(&t).map_or(0, |v| v.0.round() as u64);
    let periods = at
        .into_iter()
        .map(|t| Period {
            at_ms: t,
            received: get(&rec, t),
            duplicates: get(&dup, t),
            processed: get(&done, t),
            failed: get(&retried, t) + get(&dead, t),
            processing: proc
                .get(&t)
                .filter(|v| v.1 > 0.0)
                .map_or(Latency::default(), |v| Latency { mean_ms: Some(v.0 / v.1), max_ms: Some(v.2) }),
        })
        .collect();
    Stats {
        since_ms: window.since_ms,
        until_ms: window.until_ms,
        period_s: window.period_s,
        received,
        duplicates,
        duplicate_rate: rate(duplicates, received),
        payload_conflicts: total(series, "payload_conflict"),
        rejected: total(series, "rejected"),
        unavailable: total(series, "failed"),
        processed,
        retried: total(series, "retried"),
        dead_lettered: total(series, "dead_lettered"),
        parked: total(series, "parked"),
        processing: latency(series, "processing_duration"),
        receipt_to_completion: latency(series, "queue_to_complete"),
        drift_found: total(series, "drift_found"),
        drift_repaired: total(series, "drift_repaired"),
        destinations: destinations(series),
        now: standing(sparse, now_ms),
        periods,
    }
}

/// The deliveries' figures per `destination` dimension.
fn destinations(series: &[MetricSeries]) -> BTreeMap<String, DestinationFigures> {
    let mut names: Vec<String> = series
        .iter()
        .filter(|s| s.name.starts_with("deliver"))
        .filter_map(|s| s.dimensions.iter().find(|(k, _)| k == "destination").map(|(_, v)| v.clone()))
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|d| {
            let of: Vec<MetricSeries> = series
                .iter()
                .filter(|s| s.dimensions.iter().any(|(k, v)| k == "destination" && *v == d))
                .cloned()
                .collect();
            let figures = DestinationFigures {
                delivered: total(&of, "delivered"),
                retried: total(&of, "delivery_retried"),
                failed: total(&of, "delivery_failed"),
                dead: total(&of, "delivery_dead"),
                latency: latency(&of, "delivery_latency"),
            };
            (d, figures)
        })
        .collect()
}

fn top(counts: BTreeMap<String, u64>, n: usize, at_least: u64) -> Vec<Count> {
    let mut v: Vec<Count> =
        counts.into_iter().filter(|(_, c)| *c >= at_least).map(|(key, count)| Count { key, count }).collect();
    v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    v.truncate(n);
    v
}

pub fn failures_from(
    series: &[MetricSeries],
    sparse: &Sparse,
    window: &MetricWindow,
    now_ms: i64,
    n: usize,
) -> Failures {
    let failing = |r: &&Row| matches!(text(r, "status"), Some(s) if [Status::Dead, Status::Parked, Status::Retryable].iter().any(|x| x.as_str() == s));
    let (mut types, mut subjects, mut reasons) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for r in sparse.rows.iter().filter(failing) {
        let provider = text(r, "provider").unwrap_or("-");
        *types.entry(format!("{provider} {}", text(r, "event_type").unwrap_or("-"))).or_default() += 1;
        if let Some(subject) = text(r, "subject") {
            *subjects.entry(format!("{provider} {subject}")).or_default() += 1;
        }
        let why = ["dead_reason", "park_reason", "error_code"].iter().find_map(|k| text(r, k)).unwrap_or("-");
        *reasons.entry(why.to_owned()).or_default() += 1;
    }
    let mut stuck_leases: Vec<StuckLease> = sparse
        .rows
        .iter()
        .filter_map(|r| {
            stuck(r, now_ms).map(|ago| StuckLease {
                key: text(r, "pk").unwrap_or("-").to_owned(),
                lease_expired_ms_ago: ago,
                attempts: num(r, "attempts").unwrap_or(0).max(0) as u64,
            })
        })
        .collect();
    stuck_leases.sort_by(|a, b| b.lease_expired_ms_ago.cmp(&a.lease_expired_ms_ago).then_with(|| a.key.cmp(&b.key)));
    stuck_leases.truncate(n);
    let oldest_unprocessed = sparse
        .rows
        .iter()
        .filter(|r| text(r, "status").is_some_and(is_unprocessed))
        .max_by_key(|r| (now_ms - num(r, "received_at").unwrap_or(now_ms), text(r, "pk").map(str::to_owned)))
        .map(|r| Oldest {
            key: text(r, "pk").unwrap_or("-").to_owned(),
            status: text(r, "status").unwrap_or("-").to_owned(),
            age_ms: now_ms - num(r, "received_at").unwrap_or(now_ms),
        });
    let (rec, dup) = (per_period(series, "received"), per_period(series, "duplicate"));
    let mut at: Vec<i64> = rec.keys().chain(dup.keys()).copied().collect();
    at.sort_unstable();
    at.dedup();
    let get = |m: &BTreeMap<i64, (f64, f64, f64)>, t: i64| m.get(&t).map_or(0, |v| v.0.round() as u64);
    let duplicate_rate = at
        .iter()
        .map(|&t| {
            let (r, d) = (get(&rec, t), get(&dup, t));
            RatePoint { at_ms: t, deliveries: r + d, rate: rate(d, r) }
        })
        .collect();
    let (found, repaired) = (per_period(series, "drift_found"), per_period(series, "drift_repaired"));
    let mut at: Vec<i64> = found.keys().chain(repaired.keys()).copied().collect();
    at.sort_unstable();
    at.dedup();
    let drift =
        at.iter().map(|&t| DriftPoint { at_ms: t, found: get(&found, t), repaired: get(&repaired, t) }).collect();
    Failures {
        since_ms: window.since_ms,
        until_ms: window.until_ms,
        top_types: top(types, n, 1),
        repeated_subjects: top(subjects, n, 2),
        reasons: top(reasons, n, 1),
        stuck_leases,
        oldest_unprocessed,
        duplicate_rate,
        drift,
        failing_destinations: top(destinations(series).into_iter().map(|(d, f)| (d, f.failed)).collect(), n, 1),
        dead_deliveries: top(destinations(series).into_iter().map(|(d, f)| (d, f.dead)).collect(), n, 1),
        now: standing(sparse, now_ms),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ports::MetricPoint;

    const NOW: i64 = 1_700_000_000_000;
    const WINDOW: MetricWindow = MetricWindow { since_ms: NOW - 3_600_000, until_ms: NOW, period_s: 300 };

    fn row(v: serde_json::Value) -> Row {
        let serde_json::Value::Object(m) = v else { unreachable!() };
        m
    }

    fn series(name: &str, dims: &[(&str, &str)], points: &[(i64, f64, f64, f64)]) -> MetricSeries {
        MetricSeries {
            name: name.into(),
            dimensions: dims.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            points: points.iter().map(|&(at_ms, sum, count, max)| MetricPoint { at_ms, sum, count, max }).collect(),
        }
    }

    #[test]
    fn deliveries_are_counted_per_destination() {
        let t = NOW - 300_000;
        let series = vec![
            series("delivered", &[("destination", "orders")], &[(t, 5.0, 5.0, 1.0)]),
            series("delivered", &[("destination", "bus")], &[(t, 2.0, 2.0, 1.0)]),
            series("delivery_retried", &[("destination", "orders")], &[(t, 1.0, 1.0, 1.0)]),
            series("delivery_failed", &[("destination", "orders")], &[(t, 3.0, 3.0, 1.0)]),
            series("delivery_dead", &[("destination", "bus")], &[(t, 1.0, 1.0, 1.0)]),
            series("delivery_latency", &[("destination", "orders")], &[(t, 500.0, 5.0, 300.0)]),
            series("received", &[("provider", "stripe")], &[(t, 7.0, 1.0, 7.0)]),
        ];
        let s = stats_from(&series, &Sparse::default(), &WINDOW, NOW);
        assert_eq!(s.destinations.keys().collect::<Vec<_>>(), ["bus", "orders"]);
        let orders = &s.destinations["orders"];
        assert_eq!((orders.delivered, orders.retried, orders.failed, orders.dead), (5, 1, 3, 0));
        assert_eq!((orders.latency.mean_ms, orders.latency.max_ms), (Some(100.0), Some(300.0)));
        assert_eq!((s.destinations["bus"].delivered, s.destinations["bus"].dead), (2, 1));
        let f = failures_from(&series, &Sparse::default(), &WINDOW, NOW, 10);
        assert_eq!(f.failing_destinations, [Count { key: "orders".into(), count: 3 }]);
        assert_eq!(f.dead_deliveries, [Count { key: "bus".into(), count: 1 }]);
    }

    fn sample() -> (Vec<MetricSeries>, Sparse) {
        let t0 = NOW - 600_000;
        let t1 = NOW - 300_000;
        let series = vec![
            series("received", &[("provider", "stripe")], &[(t0, 8.0, 2.0, 5.0), (t1, 2.0, 1.0, 2.0)]),
            series("received", &[("provider", "github")], &[(t1, 10.0, 1.0, 10.0)]),
            series("duplicate", &[("provider", "stripe")], &[(t1, 5.0, 1.0, 5.0)]),
            series("processed", &[("outcome", "applied")], &[(t0, 7.0, 1.0, 7.0), (t1, 9.0, 1.0, 9.0)]),
            series("processed", &[("outcome", "noop")], &[(t1, 2.0, 1.0, 2.0)]),
            series("retried", &[("code", "throttled")], &[(t1, 3.0, 1.0, 3.0)]),
            series("dead_lettered", &[("reason", "permanent")], &[(t1, 1.0, 1.0, 1.0)]),
            series("processing_duration", &[("provider", "stripe")], &[(t0, 40.0, 4.0, 20.0), (t1, 60.0, 2.0, 50.0)]),
            series("drift_found", &[], &[(t1, 2.0, 1.0, 2.0)]),
            series("drift_repaired", &[], &[(t1, 1.0, 1.0, 1.0)]),
        ];
        let rows = vec![
            row(json!({"pk": "evt#stripe#a#1", "status": "DEAD", "provider": "stripe", "event_type": "invoice.paid",
                "subject": "cus_1", "dead_reason": "permanent", "received_at": NOW - 50_000})),
            row(json!({"pk": "evt#stripe#a#2", "status": "DEAD", "provider": "stripe", "event_type": "invoice.paid",
                "subject": "cus_1", "dead_reason": "permanent", "received_at": NOW - 40_000})),
            row(
                json!({"pk": "evt#stripe#a#3", "status": "PARKED", "provider": "stripe", "event_type": "customer.updated",
                "subject": "cus_2", "park_reason": "unmapped_subject", "received_at": NOW - 30_000}),
            ),
            row(json!({"pk": "evt#github#g#4", "status": "RETRYABLE", "provider": "github", "event_type": "push",
                "error_code": "throttled", "received_at": NOW - 90_000})),
            row(json!({"pk": "evt#github#g#5", "status": "PROCESSING", "provider": "github", "event_type": "push",
                "lease_expires_at": NOW - 20_000, "attempts": 2, "received_at": NOW - 10_000})),
            row(json!({"pk": "evt#github#g#6", "status": "PROCESSING", "provider": "github", "event_type": "push",
                "lease_expires_at": NOW + 20_000, "attempts": 1, "received_at": NOW - 5_000})),
        ];
        (series, Sparse { rows, truncated: false })
    }

    /// Issue 22.2: one tenant's figures come from its own series only (the
    /// `tenant` dimension), and from its rows of every sparse set.
    #[test]
    fn tenant_stats_read_its_own_series_only() {
        let (_, sparse) = sample();
        let series = vec![
            series("tenant_received", &[("tenant", "acme")], &[(NOW - 600_000, 4.0, 4.0, 1.0)]),
            series("tenant_received", &[("tenant", "globex")], &[(NOW - 600_000, 9.0, 9.0, 1.0)]),
            series("tenant_processed", &[("tenant", "acme")], &[(NOW - 300_000, 3.0, 3.0, 1.0)]),
            series("tenant_dead", &[("tenant", "acme")], &[(NOW - 300_000, 1.0, 1.0, 1.0)]),
            series("tenant_queue_to_complete", &[("tenant", "acme")], &[(NOW - 300_000, 900.0, 3.0, 500.0)]),
        ];
        let s = tenant_stats_from("acme", &series, &sparse, &WINDOW, NOW);
        let m = s.metrics.expect("acme has metrics");
        assert_eq!((m.received, m.processed, m.dead), (4, 3, 1));
        assert_eq!(m.receipt_to_completion, Latency { mean_ms: Some(300.0), max_ms: Some(500.0) });
        assert_eq!(tenant_stats_from("initech", &series, &sparse, &WINDOW, NOW).metrics, None, "not listed");
    }

    #[test]
    fn stats_add_every_series_of_a_metric_and_count_the_sparse_sets() {
        let (series, sparse) = sample();
        let s = stats_from(&series, &sparse, &WINDOW, NOW);
        assert_eq!((s.received, s.duplicates), (20, 5));
        assert!((s.duplicate_rate - 0.2).abs() < 1e-9);
        assert_eq!(s.processed, BTreeMap::from([("applied".into(), 16), ("noop".into(), 2)]));
        assert_eq!((s.retried, s.dead_lettered, s.drift_found, s.drift_repaired), (3, 1, 2, 1));
        assert_eq!(s.processing, Latency { mean_ms: Some(100.0 / 6.0), max_ms: Some(50.0) });
        assert_eq!(s.receipt_to_completion, Latency::default());
        assert_eq!(s.now.by_status["DEAD"], 2);
        assert_eq!((s.now.by_status["PARKED"], s.now.by_status["PROCESSING"], s.now.by_status["RECEIVED"]), (1, 2, 0));
        assert_eq!(s.now.oldest_unprocessed_age_ms, Some(90_000));
        assert_eq!(s.now.stuck_leases, 1);
        assert_eq!(s.periods.len(), 2);
        assert_eq!(
            (s.periods[1].received, s.periods[1].duplicates, s.periods[1].processed, s.periods[1].failed),
            (12, 5, 11, 4)
        );
        assert_eq!(s.periods[0].processing, Latency { mean_ms: Some(10.0), max_ms: Some(20.0) });
    }

    #[test]
    fn failures_rank_types_subjects_and_reasons_and_name_the_stuck_and_the_oldest() {
        let (series, sparse) = sample();
        let f = failures_from(&series, &sparse, &WINDOW, NOW, 2);
        assert_eq!(
            f.top_types,
            [Count { key: "stripe invoice.paid".into(), count: 2 }, Count { key: "github push".into(), count: 1 }]
        );
        assert_eq!(
            f.repeated_subjects,
            [Count { key: "stripe cus_1".into(), count: 2 }],
            "a subject failing once is not repeated"
        );
        assert_eq!(f.reasons[0], Count { key: "permanent".into(), count: 2 });
        assert_eq!(f.reasons.len(), 2, "top 2");
        assert_eq!(
            f.stuck_leases,
            [StuckLease { key: "evt#github#g#5".into(), lease_expired_ms_ago: 20_000, attempts: 2 }]
        );
        assert_eq!(f.oldest_unprocessed.as_ref().map(|o| (o.key.as_str(), o.age_ms)), Some(("evt#github#g#4", 90_000)));
        let rates: Vec<(u64, f64)> = f.duplicate_rate.iter().map(|p| (p.deliveries, p.rate)).collect();
        assert_eq!(rates, [(8, 0.0), (17, 5.0 / 17.0)]);
        assert_eq!(f.drift, [DriftPoint { at_ms: NOW - 300_000, found: 2, repaired: 1 }]);
    }

    #[test]
    fn empty_sources_give_zeros_not_errors() {
        let s = stats_from(&[], &Sparse::default(), &WINDOW, NOW);
        assert_eq!((s.received, s.duplicate_rate, s.now.oldest_unprocessed_age_ms), (0, 0.0, None));
        assert!(s.periods.is_empty() && s.now.by_status.values().all(|c| *c == 0));
        let f = failures_from(&[], &Sparse::default(), &WINDOW, NOW, 10);
        assert!(f.top_types.is_empty() && f.stuck_leases.is_empty() && f.oldest_unprocessed.is_none());
    }
}

#[cfg(test)]
mod tenant_tests;
