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

/// The most tenants [`TenantMetrics`] takes: each one's series are custom
/// metrics, billed every month.
pub const MAX_TENANT_METRICS: usize = 50;

/// The tenants whose own metrics are written (`HOOKLEDGER_TENANT_METRICS`,
/// template parameter `TenantMetrics`: a comma-separated list, default
/// none): `tenant_received` (intake), `tenant_processed`, `tenant_dead` and
/// `tenant_queue_to_complete` (processor), with a `tenant` dimension. Every
/// other tenant is answered by `hookledger stats --tenant` from the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantMetrics(std::collections::BTreeSet<String>);

impl TenantMetrics {
    /// Parses the list; every name must be a valid tenant.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut set = std::collections::BTreeSet::new();
        for t in raw.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if !crate::config::valid_tenant(t) {
                return Err(format!("{t:?}: {}", crate::config::TENANT_RULE));
            }
            set.insert(t.to_owned());
        }
        if set.len() > MAX_TENANT_METRICS {
            return Err(format!(
                "{} tenants listed; at most {MAX_TENANT_METRICS} (each one's metrics cost every month)",
                set.len()
            ));
        }
        Ok(Self(set))
    }

    pub fn covers(&self, tenant: &str) -> bool {
        self.0.contains(tenant)
    }

    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// A new event accepted for `tenant`.
    pub fn received(&self, tenant: &str) {
        if self.covers(tenant) {
            metrics::counter!("tenant_received", "tenant" => tenant.to_owned()).increment(1);
        }
    }

    /// An event of `tenant` finished (`dead`: dead-lettered), and, if it
    /// completed, its receipt-to-completion time.
    pub fn finished(&self, tenant: &str, dead: bool, queue_to_complete_ms: Option<f64>) {
        if !self.covers(tenant) {
            return;
        }
        let t = tenant.to_owned();
        if dead {
            metrics::counter!("tenant_dead", "tenant" => t).increment(1);
            return;
        }
        metrics::counter!("tenant_processed", "tenant" => t.clone()).increment(1);
        if let Some(ms) = queue_to_complete_ms {
            metrics::histogram!("tenant_queue_to_complete", "tenant" => t).record(ms);
        }
    }
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
    metrics::describe_histogram!(
        "tenant_queue_to_complete",
        metrics::Unit::Milliseconds,
        "receipt to completion of a listed tenant"
    );
    metrics::describe_histogram!("reconcile_duration", metrics::Unit::Milliseconds, "reconciler run time");
    metrics::describe_gauge!(
        "delivery_oldest_pending_age",
        metrics::Unit::Milliseconds,
        "age of the oldest delivery still to send, over every destination"
    );
    metrics::describe_gauge!(
        "destination_oldest_pending_age",
        metrics::Unit::Milliseconds,
        "age of a destination's oldest delivery still to send"
    );
    metrics::describe_gauge!(
        "oldest_unprocessed_age",
        metrics::Unit::Milliseconds,
        "age of the oldest unprocessed record"
    );
}

/// An error a function hands back to the Lambda runtime, with a stable
/// `errorType` (`Hookledger.<Kind>`) instead of the Rust type name the
/// runtime would derive (`&alloc::boxed::Box<dyn core::error::Error …>`).
/// The message says what went wrong and never carries a payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct FunctionError {
    pub kind: FailureKind,
    pub message: String,
}

/// What kind of failure ended an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The event is not what the trigger sends (an SQS record without a
    /// message id, an API Gateway event that does not parse).
    BadEvent,
    /// A worker task of the invocation panicked or was cancelled.
    WorkerFailed,
    /// A response could not be built.
    Response,
}

impl FailureKind {
    pub fn error_type(self) -> &'static str {
        match self {
            Self::BadEvent => "Hookledger.BadEvent",
            Self::WorkerFailed => "Hookledger.WorkerFailed",
            Self::Response => "Hookledger.Response",
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.error_type())
    }
}

impl FunctionError {
    pub fn new(kind: FailureKind, message: impl std::fmt::Display) -> Self {
        Self { kind, message: message.to_string() }
    }
}

impl From<FunctionError> for lambda_runtime::Diagnostic {
    fn from(e: FunctionError) -> Self {
        Self { error_type: e.kind.error_type().to_owned(), error_message: e.message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_error_reports_its_kind_as_the_error_type() {
        let d: lambda_runtime::Diagnostic =
            FunctionError::new(FailureKind::BadEvent, "SQS record without messageId").into();
        assert_eq!(d.error_type, "Hookledger.BadEvent");
        assert_eq!(d.error_message, "SQS record without messageId");
        for kind in [FailureKind::BadEvent, FailureKind::WorkerFailed, FailureKind::Response] {
            assert!(kind.error_type().starts_with("Hookledger.") && !kind.error_type().contains(' '));
        }
    }
}
