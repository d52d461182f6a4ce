//! Logs and metrics. Logs are structured `tracing` events (JSON in Lambda);
//! metrics go through the `metrics` facade and are written as CloudWatch EMF
//! by the function's collector. Neither ever carries a secret or a payload.

/// Logging and metrics for a function's `main`: JSON logs when Lambda asks
/// (`AWS_LAMBDA_LOG_FORMAT`, through the runtime's subscriber), and an EMF
/// collector in `HOOKLEDGER_METRICS_NAMESPACE` (default `Hookledger`) with a
/// `function` dimension. Flush it after every invocation.
pub fn init_metrics(function: &'static str) -> Result<&'static metrics_cloudwatch_embedded::Collector, String> {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(std::env::var("HOOKLEDGER_METRICS_NAMESPACE").unwrap_or_else(|_| "Hookledger".into()))
        .with_dimension("function", function)
        .init()
        .map_err(|e| e.to_string())?;
    describe();
    Ok(collector)
}

/// Writes the metrics gathered during one invocation as EMF to stdout.
pub fn flush(collector: &metrics_cloudwatch_embedded::Collector) {
    if let Err(e) = collector.flush(std::io::stdout()) {
        tracing::warn!(error = %e, "metrics flush failed");
    }
}

/// Declares units once per process, so EMF carries them.
pub fn describe() {
    metrics::describe_histogram!("intake_duration", metrics::Unit::Milliseconds, "intake handling time");
    metrics::describe_histogram!("processing_duration", metrics::Unit::Milliseconds, "processor time per event");
    metrics::describe_histogram!("queue_to_complete", metrics::Unit::Milliseconds, "receipt to completion");
    metrics::describe_histogram!("reconcile_duration", metrics::Unit::Milliseconds, "reconciler run time");
    metrics::describe_gauge!(
        "oldest_unprocessed_age",
        metrics::Unit::Milliseconds,
        "age of the oldest unprocessed record"
    );
}
