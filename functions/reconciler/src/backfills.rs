//! The scheduled backfills (`HOOKLEDGER_BACKFILL`, endpoint → schedule):
//! each invocation reads every endpoint's due window from its provider's
//! API, in the time the reconciliation left. The provider clients and their
//! secrets (`HOOKLEDGER_STRIPE_API_KEY`, `HOOKLEDGER_GITHUB_TOKEN`, secret
//! references) are built when a run needs them, not at init. Bodies too
//! large for an item go to `HOOKLEDGER_PAYLOAD_BUCKET`, as the intake's do;
//! a body over `HOOKLEDGER_MAX_BACKFILL_BODY_BYTES` (default 25 MiB, at most
//! 64 MiB) is parked `too_large`. Every invocation with schedules sets the
//! gauges `backfill_failed_last_run` and `backfill_overdue_windows`.

use std::collections::BTreeMap;
use std::time::Instant;

use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::github::GithubDeliveries;
use hookledger::adapters::s3::S3Payloads;
use hookledger::adapters::secrets::AwsSecretResolver;
use hookledger::adapters::sources::ProviderSource;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::adapters::stripe::StripeEvents;
use hookledger::backfill::{self, Backfill, BackfillSettings, Schedule, ScheduledRun, Summary, Target};
use hookledger::config::{ConfigError, EnvSecrets, SecretResolver};
use hookledger::ports::BackfillLedger;

const STRIPE_KEY: &str = "HOOKLEDGER_STRIPE_API_KEY";
const GITHUB_TOKEN: &str = "HOOKLEDGER_GITHUB_TOKEN";

pub struct Backfills {
    schedules: BTreeMap<String, Schedule>,
    aws: aws_config::SdkConfig,
    ledger: DynamoLedger,
    queue: SqsQueue,
    retention_days: u32,
    stripe_key: Option<String>,
    stripe_base: String,
    github_token: Option<String>,
    github_base: String,
    max_body_bytes: usize,
}

/// One endpoint's run: its window and summary, or why it did not run, and
/// whether the endpoint is behind its bound after it ([`backfill::overdue`]).
#[derive(Debug, serde::Serialize)]
pub struct Ran {
    pub endpoint: String,
    pub window: Option<(i64, i64)>,
    pub summary: Option<Summary>,
    pub error: Option<String>,
    pub overdue: bool,
}

impl Backfills {
    pub fn from_env(
        env: impl Fn(&str) -> Option<String>,
        aws: &aws_config::SdkConfig,
        ledger: DynamoLedger,
        queue: SqsQueue,
        retention_days: u32,
    ) -> Result<Self, ConfigError> {
        let invalid = |name: &str, reason: String| ConfigError::Invalid { name: name.into(), reason };
        let schedules = match env("HOOKLEDGER_BACKFILL") {
            Some(json) => backfill::parse_schedules(&json).map_err(|e| invalid("HOOKLEDGER_BACKFILL", e))?,
            None => BTreeMap::new(),
        };
        let stripe_key = env(STRIPE_KEY);
        let github_token = env(GITHUB_TOKEN);
        // Bodies too large for an item go to the payload bucket, as the intake's do.
        let ledger = match env("HOOKLEDGER_PAYLOAD_BUCKET") {
            Some(bucket) => ledger.with_payload_bucket(S3Payloads::from_config(aws, bucket)),
            None => ledger,
        };
        let max_body_bytes = hookledger::config::env_number(
            &env,
            "HOOKLEDGER_MAX_BACKFILL_BODY_BYTES",
            backfill::DEFAULT_MAX_BODY_BYTES as i64,
            1024,
            backfill::MAX_MAX_BODY_BYTES as i64,
        )? as usize;
        for (endpoint, s) in &schedules {
            let (needs, have) = match s.provider.as_str() {
                "github" => (GITHUB_TOKEN, &github_token),
                _ => (STRIPE_KEY, &stripe_key),
            };
            if have.is_none() {
                return Err(invalid(
                    "HOOKLEDGER_BACKFILL",
                    format!("{endpoint} is backfilled from {}: set {needs}", s.provider),
                ));
            }
        }
        Ok(Self {
            schedules,
            aws: aws.clone(),
            ledger,
            queue,
            retention_days,
            stripe_key,
            stripe_base: env("HOOKLEDGER_STRIPE_API_BASE").unwrap_or_else(|| "https://api.stripe.com".into()),
            github_token,
            github_base: env("HOOKLEDGER_GITHUB_API_BASE").unwrap_or_else(|| "https://api.github.com".into()),
            max_body_bytes,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.schedules.is_empty()
    }

    async fn secret(&self, reference: &str) -> Result<hookledger::secret::Secret, String> {
        if reference.starts_with("ssm:") {
            AwsSecretResolver::new(aws_sdk_ssm::Client::new(&self.aws)).resolve(reference).await
        } else {
            EnvSecrets.resolve(reference).await
        }
    }

    async fn source(&self, schedule: &Schedule) -> Result<ProviderSource, String> {
        if schedule.provider == "github" {
            let token = self.secret(self.github_token.as_deref().unwrap_or_default()).await?;
            let hook = schedule.hook.as_deref().unwrap_or_default();
            return GithubDeliveries::new(self.github_base.clone(), hook, token)
                .map(|s| ProviderSource::Github(s.with_max_body_bytes(self.max_body_bytes)));
        }
        let key = self.secret(self.stripe_key.as_deref().unwrap_or_default()).await?;
        StripeEvents::new(self.stripe_base.clone(), key, schedule.account.clone())
            .map(|s| ProviderSource::Stripe(s.with_max_body_bytes(self.max_body_bytes)))
    }

    /// Every endpoint's due window, while time is left. One endpoint's
    /// failure does not stop the others; its next run resumes. Sets the
    /// alarmed gauges ([`backfill::ALARMED_METRICS`]) when there are schedules.
    pub async fn run(&self, now_ms: i64, deadline: Instant) -> Vec<Ran> {
        let mut out = Vec::new();
        for (endpoint, schedule) in &self.schedules {
            let mut ran = Ran { endpoint: endpoint.clone(), window: None, summary: None, error: None, overdue: false };
            if Instant::now() >= deadline {
                // Not run: still counted if it falls behind (a starved schedule alarms).
                ran.error = Some("not run: the invocation's time was used up".into());
                ran.overdue = self.overdue_now(endpoint, schedule, now_ms).await;
                out.push(ran);
                continue;
            }
            let target = Target {
                provider: schedule.provider.clone(),
                endpoint: endpoint.clone(),
                tenant: schedule.tenant.clone().unwrap_or_else(|| endpoint.clone()),
                retention_days: self.retention_days,
                index_shards: self.ledger.shards(),
                mode: schedule.mode,
            };
            let settings = BackfillSettings { max_body_bytes: self.max_body_bytes, ..BackfillSettings::default() };
            let run = match self.source(schedule).await {
                Ok(source) => {
                    let b = Backfill::new(self.ledger.clone(), self.queue.clone(), source, settings);
                    b.scheduled_run(&target, schedule, now_ms, deadline).await
                }
                Err(e) => ScheduledRun { ran: None, state: None, error: Some(e) },
            };
            let advanced = run.ran.as_ref().is_some_and(|(_, s)| s.complete);
            ran.overdue = match &run.state {
                Some(state) => backfill::overdue(state, schedule, now_ms / 1000, advanced),
                None => self.overdue_now(endpoint, schedule, now_ms).await,
            };
            if let Some((window, summary)) = run.ran {
                backfill::emit(endpoint, &window, &summary);
                ran.window = Some((window.since_s, window.until_s));
                ran.summary = Some(summary);
            }
            if let Some(e) = run.error {
                tracing::warn!(endpoint, error = %e, "scheduled backfill failed; the next run resumes");
                ran.error = Some(e);
            }
            out.push(ran);
        }
        if !self.schedules.is_empty() {
            let (failed, overdue) = gauges(&out);
            backfill::emit_gauges(failed, overdue);
            if overdue > 0 {
                let behind: Vec<&str> = out.iter().filter(|r| r.overdue).map(|r| r.endpoint.as_str()).collect();
                tracing::warn!(endpoints = ?behind, "scheduled backfills behind their bound");
            }
        }
        out
    }

    /// Whether `endpoint` is overdue by its stored state (one read; for an
    /// endpoint whose run did not get as far as reading it). Unreadable: not
    /// counted (logged).
    async fn overdue_now(&self, endpoint: &str, schedule: &Schedule, now_ms: i64) -> bool {
        match BackfillLedger::schedule_state(&self.ledger, endpoint).await {
            Ok(state) => backfill::overdue(&state.unwrap_or_default(), schedule, now_ms / 1000, false),
            Err(e) => {
                tracing::warn!(endpoint, error = %e, "backfill schedule unreadable; not counted as overdue");
                false
            }
        }
    }
}

/// The alarmed gauges of one invocation's scheduled backfills:
/// `backfill_failed_last_run` (events that failed or were parked, all
/// endpoints) and `backfill_overdue_windows` (endpoints [`backfill::overdue`]).
pub fn gauges(ran: &[Ran]) -> (u64, u64) {
    let failed = ran.iter().filter_map(|r| r.summary.as_ref()).map(|s| s.failed + s.parked).sum();
    let overdue = ran.iter().filter(|r| r.overdue).count() as u64;
    (failed, overdue)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(endpoint: &str, failed: u64, parked: u64, overdue: bool) -> Ran {
        let summary = Summary { failed, parked, ..Summary::default() };
        Ran { endpoint: endpoint.into(), window: None, summary: Some(summary), error: None, overdue }
    }

    /// The alarmed gauges sum over every endpoint of the invocation.
    #[test]
    fn the_gauges_count_failed_and_parked_events_and_overdue_endpoints_of_all_endpoints() {
        let mut none = ran("c", 0, 0, true);
        none.summary = None;
        assert_eq!(gauges(&[ran("a", 1, 2, false), ran("b", 0, 3, true), none]), (6, 2));
        assert_eq!(gauges(&[]), (0, 0));
    }

    #[test]
    fn the_backfill_body_bound_has_a_default_and_bounds() {
        let aws = aws_config::SdkConfig::builder().behavior_version(aws_config::BehaviorVersion::latest()).build();
        let ledger = || DynamoLedger::new(aws_sdk_dynamodb::Client::new(&aws), "t");
        let queue = || SqsQueue::new(aws_sdk_sqs::Client::new(&aws), "q");
        let with = |v: &'static str| move |k: &str| (k == "HOOKLEDGER_MAX_BACKFILL_BODY_BYTES").then(|| v.to_owned());
        let b = Backfills::from_env(|_| None, &aws, ledger(), queue(), 30).unwrap();
        assert_eq!(b.max_body_bytes, 25 * 1024 * 1024);
        assert_eq!(Backfills::from_env(with("2048"), &aws, ledger(), queue(), 30).unwrap().max_body_bytes, 2048);
        for bad in ["10", "999999999999", "lots"] {
            let err = Backfills::from_env(with(bad), &aws, ledger(), queue(), 30).err().unwrap();
            assert!(err.to_string().contains("HOOKLEDGER_MAX_BACKFILL_BODY_BYTES"), "{bad}: {err}");
        }
    }
}
