//! The metrics of a use case the CLI runs in its own process (`hookledger
//! reconcile`, the demo's reconciler run): recorded by the collector the
//! reconciler function records with (`function = reconciler`), then written
//! to CloudWatch as the function's EMF would be (`PutMetricData`, as the
//! local stack's bridge forwards the functions' lines). Without it, such a
//! run's drift repairs, re-drives and backfills reach no metric, and
//! `hookledger stats` and the console show 0 for them.

use std::future::Future;
use std::sync::OnceLock;

use hookledger::adapters::cloudwatch::CloudWatchMetrics;
use metrics_cloudwatch_embedded::Collector;

/// The process's collector, installed on first use (`None`: another recorder
/// was installed first, and the run's metrics are not forwarded).
fn collector() -> Option<&'static Collector> {
    static COLLECTOR: OnceLock<Option<&'static Collector>> = OnceLock::new();
    *COLLECTOR.get_or_init(|| hookledger::telemetry::init_metrics("reconciler").ok())
}

/// Runs `work` with its metrics recorded, then writes them with `writer`
/// (one attempt per line: a retry after a lost acknowledgement would count
/// a line twice). A line that cannot be written is reported on stderr; the
/// run's result stands.
pub async fn reconciler_run<T>(writer: &CloudWatchMetrics, work: impl Future<Output = T>) -> T {
    let collector = collector();
    if let Some(c) = collector {
        // What the process recorded before this run is not this run's.
        let _ = c.flush(std::io::sink());
    }
    let out = work.await;
    let Some(c) = collector else {
        eprintln!("metrics: another recorder is installed; this run's metrics are not written");
        return out;
    };
    let mut lines = Vec::new();
    if let Err(e) = c.flush(&mut lines) {
        eprintln!("metrics: not recorded: {e}");
        return out;
    }
    for line in String::from_utf8_lossy(&lines).lines().filter(|l| !l.trim().is_empty()) {
        if let Err(e) = writer.put_emf(line).await {
            eprintln!("metrics: a line of this run's metrics was not written to CloudWatch: {e}");
        }
    }
    out
}
