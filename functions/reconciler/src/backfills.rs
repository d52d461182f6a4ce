//! The scheduled backfills (`HOOKLEDGER_BACKFILL`, endpoint → schedule):
//! each invocation reads every endpoint's due window from its provider's
//! API, in the time the reconciliation left. The provider clients and their
//! secrets (`HOOKLEDGER_STRIPE_API_KEY`, `HOOKLEDGER_GITHUB_TOKEN`, secret
//! references) are built when a run needs them, not at init.

use std::collections::BTreeMap;
use std::time::Instant;

use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::github::GithubDeliveries;
use hookledger::adapters::secrets::AwsSecretResolver;
use hookledger::adapters::sources::ProviderSource;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::adapters::stripe::StripeEvents;
use hookledger::backfill::{self, Backfill, BackfillSettings, Schedule, Summary, Target};
use hookledger::config::{ConfigError, EnvSecrets, SecretResolver};

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
}

/// One endpoint's run: its window and summary, or why it did not run.
#[derive(Debug, serde::Serialize)]
pub struct Ran {
    pub endpoint: String,
    pub window: Option<(i64, i64)>,
    pub summary: Option<Summary>,
    pub error: Option<String>,
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
            return GithubDeliveries::new(self.github_base.clone(), hook, token).map(ProviderSource::Github);
        }
        let key = self.secret(self.stripe_key.as_deref().unwrap_or_default()).await?;
        StripeEvents::new(self.stripe_base.clone(), key, schedule.account.clone()).map(ProviderSource::Stripe)
    }

    /// Every endpoint's due window, while time is left. One endpoint's
    /// failure does not stop the others; its next run resumes.
    pub async fn run(&self, now_ms: i64, deadline: Instant) -> Vec<Ran> {
        let mut out = Vec::new();
        for (endpoint, schedule) in &self.schedules {
            if Instant::now() >= deadline {
                break;
            }
            let mut ran = Ran { endpoint: endpoint.clone(), window: None, summary: None, error: None };
            let target = Target {
                provider: schedule.provider.clone(),
                endpoint: endpoint.clone(),
                tenant: schedule.tenant.clone().unwrap_or_else(|| endpoint.clone()),
                retention_days: self.retention_days,
                index_shards: self.ledger.shards(),
                mode: schedule.mode,
            };
            let result = match self.source(schedule).await {
                Ok(source) => {
                    let b = Backfill::new(self.ledger.clone(), self.queue.clone(), source, BackfillSettings::default());
                    b.scheduled(&target, schedule, now_ms, deadline).await
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(Some((window, summary))) => {
                    backfill::emit(endpoint, &window, &summary);
                    ran.window = Some((window.since_s, window.until_s));
                    ran.summary = Some(summary);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(endpoint, error = %e, "scheduled backfill failed; the next run resumes");
                    ran.error = Some(e);
                }
            }
            out.push(ran);
        }
        out
    }
}
