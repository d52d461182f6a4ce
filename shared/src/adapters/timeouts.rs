//! How long a function waits on what it calls. Every SDK client and every
//! provider HTTP client of a function runs within that function's
//! [`Timeouts`], so a connection that stalls fails its call with a timeout
//! (which the caller answers as an outage: a 503, a retried message, a
//! failed run) instead of holding the function until Lambda ends it.
//!
//! [`crate::wiring::load_aws`] puts a profile into the SDK configuration;
//! the provider clients the wiring builds read it back from there
//! ([`Timeouts::of`]), so one function has one set of numbers.

use std::time::Duration;

/// One function's bounds on each call it makes.
///
/// On an SDK client: `connect` bounds a connection's TCP and TLS handshake,
/// `attempt` one try of a call (the SDK retries a timed-out try), and
/// `operation` the call with all its tries and the backoff between them.
///
/// On a provider HTTP client (the Stripe and GitHub APIs, SNS certificates),
/// which never retries a request itself: `connect` as above, `attempt` how
/// long the answer may go without a byte (its head, or the next part of its
/// body), and `operation` the whole request, body included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub attempt: Duration,
    pub operation: Duration,
}

impl Timeouts {
    /// The intake: a stalled call fails in 4 s, well within its 10 s Lambda
    /// timeout, and the provider is answered 503 (it retries the webhook).
    pub const INTAKE: Self = Self::secs(1, 2, 4);
    /// The processor: a stalled call (a subscription fetch included) fails
    /// in 8 s, within its 20 s Lambda timeout; the message is retried.
    pub const PROCESSOR: Self = Self::secs(1, 3, 8);
    /// The reconciler: scans, redrives and backfill pages and payloads of
    /// many MiB, each call within 15 s of its 120 s Lambda timeout.
    pub const RECONCILER: Self = Self::secs(2, 5, 15);
    /// The CLI: an operator's machine, outside AWS, moving payloads of up to
    /// 64 MiB over its own network.
    pub const CLI: Self = Self::secs(3, 30, 60);

    const fn secs(connect: u64, attempt: u64, operation: u64) -> Self {
        Self {
            connect: Duration::from_secs(connect),
            attempt: Duration::from_secs(attempt),
            operation: Duration::from_secs(operation),
        }
    }

    /// This profile as the SDK's timeout configuration.
    pub fn sdk(&self) -> aws_config::timeout::TimeoutConfig {
        aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(self.connect)
            .operation_attempt_timeout(self.attempt)
            .operation_timeout(self.operation)
            .build()
    }

    /// The profile an SDK configuration carries (as [`crate::wiring::load_aws`]
    /// builds it); a bound it does not set is the reconciler's.
    pub fn of(aws: &aws_config::SdkConfig) -> Self {
        let fallback = Self::RECONCILER;
        let Some(set) = aws.timeout_config() else { return fallback };
        Self {
            connect: set.connect_timeout().unwrap_or(fallback.connect),
            attempt: set.operation_attempt_timeout().unwrap_or(fallback.attempt),
            operation: set.operation_timeout().unwrap_or(fallback.operation),
        }
    }

    /// A provider HTTP client's builder (the process's TLS provider
    /// installed) within this profile.
    pub fn http_client_builder(&self) -> reqwest::ClientBuilder {
        crate::adapters::tls::client_builder()
            .connect_timeout(self.connect)
            .read_timeout(self.attempt)
            .timeout(self.operation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_function_waits_less_per_attempt_than_per_operation() {
        for t in [Timeouts::INTAKE, Timeouts::PROCESSOR, Timeouts::RECONCILER, Timeouts::CLI] {
            assert!(t.connect <= t.attempt && t.attempt < t.operation, "{t:?}");
        }
    }

    #[test]
    fn the_sdk_configuration_carries_the_profile_back() {
        let aws = aws_config::SdkConfig::builder().timeout_config(Timeouts::INTAKE.sdk()).build();
        assert_eq!(Timeouts::of(&aws), Timeouts::INTAKE);
        let bare = aws_config::SdkConfig::builder().build();
        assert_eq!(Timeouts::of(&bare), Timeouts::RECONCILER);
    }
}
