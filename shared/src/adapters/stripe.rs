//! The Stripe API as a [`SubscriptionSource`]: `GET /v1/subscriptions/{id}`.
//! The base URL is configurable so tests and the local stack point it at a
//! fake provider server. The fetched version is the fetch time (ms): Stripe
//! subscriptions carry no revision, and a later read reflects later state.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::projection::fetch::{Fetched, ProviderError, Subscription, SubscriptionFuture, SubscriptionSource};
use crate::secret::Secret;

/// The subscription source configured by `HOOKLEDGER_STRIPE_API_KEY` (a
/// secret reference) and `HOOKLEDGER_STRIPE_API_BASE`; `None` when no key is set.
pub async fn source_from_env(
    get: impl Fn(&str) -> Option<String>,
    secrets: &dyn crate::config::SecretResolver,
) -> Result<Option<std::sync::Arc<dyn crate::projection::fetch::SubscriptionSource>>, crate::config::ConfigError> {
    use crate::config::ConfigError;
    let Some(reference) = get("HOOKLEDGER_STRIPE_API_KEY") else { return Ok(None) };
    let key = secrets
        .resolve(&reference)
        .await
        .map_err(|reason| ConfigError::Invalid { name: "HOOKLEDGER_STRIPE_API_KEY".into(), reason })?;
    let base = get("HOOKLEDGER_STRIPE_API_BASE").unwrap_or_else(|| "https://api.stripe.com".into());
    let api = StripeApi::new(base, key)
        .map_err(|reason| ConfigError::Invalid { name: "HOOKLEDGER_STRIPE_API_BASE".into(), reason })?;
    Ok(Some(std::sync::Arc::new(api)))
}

pub struct StripeApi {
    client: reqwest::Client,
    base_url: String,
    api_key: Secret,
}

impl StripeApi {
    pub fn new(base_url: impl Into<String>, api_key: Secret) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { client, base_url: base_url.into().trim_end_matches('/').to_owned(), api_key })
    }
}

/// Parses a Stripe subscription object.
pub fn parse_subscription(v: &serde_json::Value) -> Option<Subscription> {
    let seats = v["quantity"].as_i64().or_else(|| v["items"]["data"][0]["quantity"].as_i64()).unwrap_or(0);
    Some(Subscription {
        id: v["id"].as_str()?.to_owned(),
        customer: v["customer"].as_str()?.to_owned(),
        status: v["status"].as_str()?.to_owned(),
        seats,
    })
}

impl SubscriptionSource for StripeApi {
    fn subscription<'a>(&'a self, id: &'a str) -> SubscriptionFuture<'a> {
        Box::pin(async move {
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(ProviderError::Rejected("subscription id has unexpected characters".into()));
            }
            let key = String::from_utf8_lossy(self.api_key.expose()).into_owned();
            let resp = self
                .client
                .get(format!("{}/v1/subscriptions/{id}", self.base_url))
                .bearer_auth(key)
                .send()
                .await
                .map_err(|e| ProviderError::Unavailable(e.without_url().to_string()))?;
            let version = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
            let status = resp.status();
            if status == reqwest::StatusCode::NOT_FOUND {
                return Ok(Fetched { object: None, version });
            }
            if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                return Err(ProviderError::Unavailable(format!("HTTP {status}")));
            }
            if !status.is_success() {
                return Err(ProviderError::Rejected(format!("HTTP {status}")));
            }
            let bytes = resp.bytes().await.map_err(|e| ProviderError::Unavailable(e.without_url().to_string()))?;
            let body: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|_| ProviderError::Rejected("subscription is not JSON".into()))?;
            let sub = parse_subscription(&body)
                .ok_or_else(|| ProviderError::Rejected("unexpected subscription shape".into()))?;
            Ok(Fetched { object: Some(sub), version })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_subscription_fixture() {
        let ev: serde_json::Value = serde_json::from_str(include_str!(
            "../../testdata/providers/stripe/events/customer.subscription.updated.json"
        ))
        .unwrap();
        let sub = parse_subscription(&ev["data"]["object"]).unwrap();
        assert_eq!((sub.id.as_str(), sub.status.as_str(), sub.seats), ("sub_000000000000000000000000", "active", 1));
    }
}
