//! The functions' HTTPS clients, each built on its first request: a request
//! that never needs one (a rejected webhook, an SQS record that is not a
//! subscription event) never pays for it, and neither does the cold start.
//! Building any of them reads and parses the system's root certificates.
//!
//! - [`ReqwestGetter`]: HTTPS GET for SNS certificates and subscription
//!   confirmations. Only ever called with URLs that passed `verify::sns`
//!   validation. No redirects are followed (a redirect could leave the
//!   validated host), answers are size-limited, and the function's
//!   [`Timeouts`] keep the intake within the providers' response deadlines.
//! - [`sdk_http_client`]: the AWS SDK's default HTTPS client for every SDK
//!   client of a function (and aws-config's credential providers).
//! - [`lazy_subscription_source`]: the Stripe API of `HOOKLEDGER_STRIPE_API_KEY`,
//!   its key resolved on first use.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::shared::IntoShared;
use aws_smithy_types::config_bag::ConfigBag;
use url::Url;

use crate::adapters::provider_http::read_capped;
use crate::adapters::timeouts::Timeouts;
use crate::config::ConfigError;
use crate::projection::fetch::{ProviderError, SubscriptionFuture, SubscriptionSource};
use crate::verify::sns::{FetchError, HttpsGet, MAX_CERTIFICATE_BYTES};

/// The SNS getter. Its client is built on the first fetch (only SNS
/// deliveries ever fetch), and a failure to build it fails that fetch.
pub struct ReqwestGetter {
    client: OnceLock<Result<reqwest::Client, String>>,
    timeouts: Timeouts,
}

/// The largest answer the SNS getter reads (a certificate, or a
/// subscription confirmation's answer).
const MAX_SNS_ANSWER_BYTES: usize = MAX_CERTIFICATE_BYTES * 4;

impl ReqwestGetter {
    /// Creates nothing yet: the client, within `timeouts` (the intake's),
    /// is built by the first fetch.
    pub fn new(timeouts: Timeouts) -> Self {
        Self { client: OnceLock::new(), timeouts }
    }

    fn client(&self) -> Result<&reqwest::Client, FetchError> {
        let built = self.client.get_or_init(|| {
            self.timeouts
                .http_client_builder()
                .redirect(reqwest::redirect::Policy::none())
                .https_only(true)
                .build()
                .map_err(|e| e.to_string())
        });
        built.as_ref().map_err(|e| FetchError::Failed(format!("https client: {e}")))
    }
}

impl HttpsGet for ReqwestGetter {
    fn get<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        Box::pin(async move {
            let client = self.client()?;
            let mut resp = client.get(url.clone()).send().await.map_err(|e| FetchError::Failed(e.to_string()))?;
            if !resp.status().is_success() {
                return Err(FetchError::Status(resp.status().as_u16()));
            }
            read_capped(&mut resp, MAX_SNS_ANSWER_BYTES).await.map_err(|e| FetchError::Failed(e.to_string()))
        })
    }
}

/// The HTTP client for `aws_config::from_env().http_client(..)`: the SDK's
/// default (hyper 1.x, rustls with aws-lc, proxy settings from the
/// environment, as `aws-smithy-runtime` builds it for the latest behavior
/// version), less one thing. The default client builds a TLS connector, which
/// loads and parses the system's root certificates, in the constructor of
/// every SDK client (to fail early); this one builds it for the first
/// request, and the client caches it for all later ones, as it always does.
/// One client is shared by all SDK clients of a function.
pub fn sdk_http_client() -> SharedHttpClient {
    use aws_smithy_http_client::proxy::ProxyConfig;
    use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
    use aws_smithy_http_client::{Builder, ConnectorBuilder};
    let default = Builder::new().build_with_connector_fn(|settings, components| {
        let mut conn = ConnectorBuilder::default().tls_provider(tls::Provider::Rustls(CryptoMode::Ring));
        conn.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            conn.set_sleep_impl(components.sleep_impl());
        }
        conn.set_proxy_config(Some(ProxyConfig::from_env()));
        conn.build()
    });
    OnFirstRequest(default).into_shared()
}

#[derive(Debug)]
struct OnFirstRequest(SharedHttpClient);

impl HttpClient for OnFirstRequest {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    // `validate_base_client_config` is left as the trait's no-op: that is
    // where the default client builds its connector ahead of any request.

    fn validate_final_config(&self, components: &RuntimeComponents, cfg: &ConfigBag) -> Result<(), BoxError> {
        self.0.validate_final_config(components, cfg)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// The Stripe subscription source of `HOOKLEDGER_STRIPE_API_KEY` (a secret
/// reference) and `HOOKLEDGER_STRIPE_API_BASE`, or `None` when no key is set.
/// Its client runs within `timeouts` (the function's).
///
/// Nothing is read or built here: the key is resolved and the client built
/// by the first subscription fetch (only subscription events and drift checks
/// fetch). What can be checked without reading the secret is checked now, so
/// a misconfiguration still fails the cold start: the reference's scheme, and
/// for `env:` that the variable is set. An `ssm:` parameter that cannot be
/// read fails the fetches (as the provider being unavailable) until it can.
pub fn lazy_subscription_source(
    get: impl Fn(&str) -> Option<String>,
    secrets: Arc<dyn crate::config::SecretResolver>,
    timeouts: Timeouts,
) -> Result<Option<Arc<dyn SubscriptionSource>>, ConfigError> {
    const KEY: &str = "HOOKLEDGER_STRIPE_API_KEY";
    let Some(reference) = get(KEY) else { return Ok(None) };
    let invalid = |reason: String| ConfigError::Invalid { name: KEY.into(), reason };
    match reference.split_once(':') {
        Some(("env", name)) if std::env::var_os(name).is_none_or(|v| v.is_empty()) => {
            return Err(invalid(format!("environment variable {name} is not set")));
        }
        Some(("env" | "ssm", rest)) if !rest.is_empty() => {}
        _ => return Err(invalid("expected a secret reference, env:NAME or ssm:/path".into())),
    }
    let base = get("HOOKLEDGER_STRIPE_API_BASE");
    Ok(Some(Arc::new(LazyStripe { reference, base, secrets, timeouts, api: tokio::sync::OnceCell::new() })))
}

struct LazyStripe {
    reference: String,
    base: Option<String>,
    /// Reads the key on the first fetch (the wiring's resolver).
    secrets: Arc<dyn crate::config::SecretResolver>,
    timeouts: Timeouts,
    api: tokio::sync::OnceCell<Arc<dyn SubscriptionSource>>,
}

impl LazyStripe {
    async fn build(&self) -> Result<Arc<dyn SubscriptionSource>, String> {
        let vars = |k: &str| match k {
            "HOOKLEDGER_STRIPE_API_KEY" => Some(self.reference.clone()),
            "HOOKLEDGER_STRIPE_API_BASE" => self.base.clone(),
            _ => None,
        };
        let source = crate::adapters::stripe::source_from_env(vars, self.secrets.as_ref(), self.timeouts)
            .await
            .map_err(|e| e.to_string())?;
        source.ok_or_else(|| "no Stripe API key".to_owned())
    }
}

impl SubscriptionSource for LazyStripe {
    fn subscription<'a>(&'a self, id: &'a str) -> SubscriptionFuture<'a> {
        Box::pin(async move {
            let api = self.api.get_or_try_init(|| self.build()).await.map_err(ProviderError::Unavailable)?;
            api.subscription(id).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    fn sdk() -> Arc<dyn crate::config::SecretResolver> {
        let aws = aws_config::SdkConfig::builder().behavior_version(aws_config::BehaviorVersion::latest()).build();
        Arc::new(crate::adapters::secrets::AwsSecretResolver::new(aws_sdk_ssm::Client::new(&aws)))
    }

    #[test]
    fn no_key_no_source() {
        assert!(lazy_subscription_source(vars(&[]), sdk(), Timeouts::PROCESSOR).unwrap().is_none());
    }

    #[test]
    fn a_bad_reference_still_fails_the_cold_start() {
        for reference in ["sk_live_inline", "env:", "ssm:", "vault:/x", "env:HOOKLEDGER_TEST_SURELY_UNSET_VAR"] {
            let get = |k: &str| (k == "HOOKLEDGER_STRIPE_API_KEY").then(|| reference.to_owned());
            let err = lazy_subscription_source(get, sdk(), Timeouts::PROCESSOR).err();
            assert!(
                err.is_some_and(|e| e.to_string().contains("HOOKLEDGER_STRIPE_API_KEY")),
                "{reference} was accepted"
            );
        }
    }

    #[test]
    fn a_good_reference_is_not_read_until_a_fetch() {
        // PATH is always set; the source is built without reading it.
        let source =
            lazy_subscription_source(vars(&[("HOOKLEDGER_STRIPE_API_KEY", "env:PATH")]), sdk(), Timeouts::PROCESSOR)
                .unwrap();
        assert!(source.is_some());
        let ssm = lazy_subscription_source(
            vars(&[("HOOKLEDGER_STRIPE_API_KEY", "ssm:/hookledger/stripe")]),
            sdk(),
            Timeouts::PROCESSOR,
        );
        assert!(ssm.unwrap().is_some(), "no SSM call at construction");
    }

    #[test]
    fn the_lazy_source_reads_its_key_and_fetches_on_first_use() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let n = conn.read(&mut request).unwrap();
            let body = r#"{"id":"sub_1","customer":"cus_1","status":"active","quantity":3}"#;
            let answer =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            conn.write_all(answer.as_bytes()).unwrap();
            String::from_utf8_lossy(&request[..n]).into_owned()
        });
        let get = move |k: &str| match k {
            "HOOKLEDGER_STRIPE_API_KEY" => Some("env:PATH".to_owned()),
            "HOOKLEDGER_STRIPE_API_BASE" => Some(base.clone()),
            _ => None,
        };
        let source = lazy_subscription_source(get, sdk(), Timeouts::PROCESSOR).unwrap().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let fetched = rt.block_on(source.subscription("sub_1")).unwrap();
        assert_eq!(fetched.object.map(|s| (s.status, s.seats)), Some(("active".to_owned(), 3)));
        let request = server.join().unwrap();
        assert!(request.starts_with("GET /v1/subscriptions/sub_1 "), "{request}");
        let key = std::env::var("PATH").unwrap();
        assert!(request.contains(&format!("authorization: Bearer {key}")), "the env: reference's value is the key");
    }

    #[test]
    fn the_sns_getter_builds_no_client_until_a_fetch() {
        let getter = ReqwestGetter::new(Timeouts::INTAKE);
        assert!(getter.client.get().is_none());
    }
}
