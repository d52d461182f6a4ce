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
    if let Err(e) = write_emf(collector, std::io::stdout()) {
        tracing::warn!(error = %e, "metrics flush failed");
    }
}

/// The metrics gathered so far, as EMF documents merged by [`merge_emf`],
/// written to `writer` (one line each).
pub fn write_emf(
    collector: &metrics_cloudwatch_embedded::Collector,
    mut writer: impl std::io::Write,
) -> std::io::Result<()> {
    let mut raw = Vec::new();
    collector.flush(&mut raw)?;
    for doc in merge_emf(&String::from_utf8_lossy(&raw)) {
        writeln!(writer, "{doc}")?;
    }
    Ok(())
}

/// The most metric references one merged EMF document holds (CloudWatch
/// takes 100 per directive; a document stays well within its 1 MB).
pub const EMF_MAX_METRICS_PER_DOCUMENT: usize = 100;

/// The collector's documents (one per label set) merged into as few as EMF
/// allows: documents whose root keys agree wherever both have them become
/// one, each keeping its own directive (its dimensions and metrics).
/// CloudWatch publishes from it exactly what it did from the separate
/// documents (a value two directives name is published under both, as it
/// was from both documents); the `_aws` header, the timestamp and the
/// shared dimensions are written once. The intake's three documents per
/// invocation become one. A line that is not an EMF document is kept as it
/// is.
pub fn merge_emf(lines: &str) -> Vec<String> {
    use serde_json::{Map, Value};
    let directives = |doc: &Map<String, Value>| -> Vec<Value> {
        doc.get("_aws").and_then(|a| a.get("CloudWatchMetrics")).and_then(Value::as_array).cloned().unwrap_or_default()
    };
    let references = |ds: &[Value]| -> usize {
        ds.iter().map(|d| d.get("Metrics").and_then(Value::as_array).map_or(0, Vec::len)).sum()
    };
    let mut out: Vec<Result<Map<String, Value>, String>> = Vec::new();
    for line in lines.lines().filter(|l| !l.trim().is_empty()) {
        let doc = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(doc)) if doc.get("_aws").and_then(|a| a.get("Timestamp")).is_some() => doc,
            _ => {
                out.push(Err(line.to_owned()));
                continue;
            }
        };
        let theirs = directives(&doc);
        let fits = |into: &Map<String, Value>| {
            into["_aws"]["Timestamp"] == doc["_aws"]["Timestamp"]
                && references(&directives(into)) + references(&theirs) <= EMF_MAX_METRICS_PER_DOCUMENT
                && doc.iter().all(|(k, v)| k == "_aws" || into.get(k).is_none_or(|w| w == v))
        };
        match out.iter_mut().filter_map(|d| d.as_mut().ok()).find(|d| fits(d)) {
            Some(into) => {
                let mut all = directives(into);
                all.extend(theirs);
                into["_aws"]["CloudWatchMetrics"] = Value::Array(all);
                for (k, v) in doc {
                    if k != "_aws" {
                        into.entry(k).or_insert(v);
                    }
                }
            }
            None => out.push(Ok(doc)),
        }
    }
    out.into_iter().map(|d| d.map_or_else(|raw| raw, |doc| Value::Object(doc).to_string())).collect()
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
mod emf_tests {
    use super::merge_emf;
    use serde_json::Value;

    fn doc(dims: &[(&str, &str)], metrics: &[(&str, Value)]) -> String {
        let mut d = serde_json::json!({"_aws": {"Timestamp": 1_700_000_000_000_i64, "CloudWatchMetrics": [{
            "Namespace": "Hookledger",
            "Dimensions": [dims.iter().map(|(k, _)| *k).collect::<Vec<_>>()],
            "Metrics": metrics.iter().map(|(n, _)| serde_json::json!({"Name": n})).collect::<Vec<_>>(),
        }]}});
        for (k, v) in dims {
            d[*k] = serde_json::json!(v);
        }
        for (k, v) in metrics {
            d[*k] = v.clone();
        }
        d.to_string()
    }

    /// What CloudWatch publishes from documents, as the EMF specification
    /// reads them: every metric of every directive, under each of its
    /// dimension sets, with the root's values (name, namespace, dimensions,
    /// value, timestamp).
    fn published(lines: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for line in lines {
            let doc: Value = serde_json::from_str(line).expect("an EMF document");
            let at = &doc["_aws"]["Timestamp"];
            for directive in doc["_aws"]["CloudWatchMetrics"].as_array().unwrap() {
                for set in directive["Dimensions"].as_array().unwrap() {
                    let dims: Vec<String> =
                        set.as_array().unwrap().iter().map(|k| format!("{}={}", k, doc[k.as_str().unwrap()])).collect();
                    for m in directive["Metrics"].as_array().unwrap() {
                        let name = m["Name"].as_str().unwrap();
                        out.push(format!("{name} {} {dims:?} {} {at}", directive["Namespace"], doc[name]));
                    }
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn an_intakes_documents_become_one_that_publishes_the_same() {
        let f = ("function", "intake");
        let separate = [
            doc(&[f], &[("intake_caller_error", 0.into())]),
            doc(&[f, ("provider", "stripe"), ("endpoint", "stripe-a")], &[("received", 1.into())]),
            doc(&[f, ("provider", "stripe")], &[("intake_duration", serde_json::json!([12.5]))]),
        ];
        let merged = merge_emf(&separate.join("\n"));
        assert_eq!(merged.len(), 1, "{merged:?}");
        assert_eq!(published(&merged), published(&separate));
        assert_eq!(published(&merged).len(), 3);
        let (one, three) = (merged[0].len(), separate.iter().map(String::len).sum::<usize>());
        assert!(one * 4 < three * 3, "{one} bytes instead of {three}");
    }

    #[test]
    fn documents_that_disagree_on_a_key_stay_apart() {
        let f = ("function", "processor");
        let separate = [
            doc(&[f, ("outcome", "applied")], &[("processed", 3.into())]),
            doc(&[f, ("outcome", "duplicate")], &[("processed", 1.into())]),
            doc(&[f], &[("processing_duration", serde_json::json!([4.0, 5.0]))]),
            "not an EMF line".to_owned(),
        ];
        let merged = merge_emf(&separate.join("\n"));
        assert_eq!(merged.len(), 3, "the two outcomes apart, the duration with the first, the line kept: {merged:?}");
        assert_eq!(merged[2], "not an EMF line");
        assert_eq!(published(&merged[..2]), published(&separate[..3]));
    }

    #[test]
    fn a_merged_document_holds_at_most_a_hundred_metrics() {
        let f = ("function", "processor");
        let names: Vec<String> = (0..150).map(|i| format!("m{i}")).collect();
        let separate: Vec<String> = names.iter().map(|n| doc(&[f], &[(n.as_str(), 1.into())])).collect();
        let merged = merge_emf(&separate.join("\n"));
        assert_eq!(merged.len(), 2);
        assert_eq!(published(&merged), published(&separate));
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
