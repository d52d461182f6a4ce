//! Logs and metrics. Logs are structured `tracing` events (JSON in Lambda);
//! metrics go through the `metrics` facade and are written as CloudWatch EMF
//! by the function's collector. Neither ever carries a secret or a payload.

use crate::intake::Outcome;

/// Counts one intake outcome and records its duration.
pub fn intake_outcome(provider: &'static str, endpoint: &str, outcome: &Outcome, duration_ms: f64) {
    let provider = provider.to_owned();
    let endpoint = endpoint.to_owned();
    match outcome {
        Outcome::Accepted => {
            metrics::counter!("received", "provider" => provider.clone(), "endpoint" => endpoint.clone()).increment(1)
        }
        Outcome::Duplicate { conflict, .. } => {
            metrics::counter!("duplicate", "provider" => provider.clone(), "endpoint" => endpoint.clone()).increment(1);
            if *conflict {
                metrics::counter!("payload_conflict", "provider" => provider.clone(), "endpoint" => endpoint.clone())
                    .increment(1);
            }
        }
        Outcome::Unavailable { stage } => {
            metrics::counter!("failed", "provider" => provider.clone(), "stage" => *stage).increment(1);
        }
        Outcome::SubscriptionConfirmed | Outcome::Unsubscribed => {
            metrics::counter!("subscription", "provider" => provider.clone(), "outcome" => outcome.label())
                .increment(1);
        }
        other => {
            metrics::counter!("rejected", "provider" => provider.clone(), "reason" => other.label()).increment(1);
        }
    }
    metrics::histogram!("intake_duration", "provider" => provider).record(duration_ms);
}

/// Declares units once per process, so EMF carries them.
pub fn describe() {
    metrics::describe_histogram!("intake_duration", metrics::Unit::Milliseconds, "intake handling time");
}
