//! Secret references: `env:NAME` reads the process environment; `ssm:/path`
//! reads an SSM parameter with decryption (Secrets Manager secrets through
//! `ssm:/aws/reference/secretsmanager/<name>`).

use std::future::Future;
use std::pin::Pin;

use crate::config::SecretResolver;
use crate::secret::Secret;

pub struct AwsSecretResolver {
    ssm: aws_sdk_ssm::Client,
}

impl AwsSecretResolver {
    pub fn new(ssm: aws_sdk_ssm::Client) -> Self {
        Self { ssm }
    }
}

impl SecretResolver for AwsSecretResolver {
    fn resolve<'a>(&'a self, reference: &'a str) -> Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>> {
        Box::pin(async move {
            if let Some(name) = reference.strip_prefix("env:") {
                return std::env::var(name)
                    .map(Secret::new)
                    .map_err(|_| format!("environment variable {name} is not set"));
            }
            if let Some(path) = reference.strip_prefix("ssm:") {
                let out = self
                    .ssm
                    .get_parameter()
                    .name(path)
                    .with_decryption(true)
                    .send()
                    .await
                    .map_err(|e| super::error_chain(&e))?;
                return out
                    .parameter
                    .and_then(|p| p.value)
                    .map(Secret::new)
                    .ok_or_else(|| "parameter has no value".to_owned());
            }
            Err("unknown reference scheme (expected env: or ssm:)".to_owned())
        })
    }
}
