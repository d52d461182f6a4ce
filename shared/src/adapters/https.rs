//! HTTPS GET for SNS certificates and subscription confirmations.
//!
//! Only ever called with URLs that passed `verify::sns` validation. No
//! redirects are followed (a redirect could leave the validated host), answers
//! are size-limited, and timeouts keep the intake within the providers'
//! response deadlines.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use url::Url;

use crate::verify::sns::{FetchError, HttpsGet, MAX_CERTIFICATE_BYTES};

pub struct ReqwestGetter {
    client: reqwest::Client,
}

impl ReqwestGetter {
    pub fn new() -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .https_only(true)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(4))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { client })
    }
}

impl HttpsGet for ReqwestGetter {
    fn get<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        Box::pin(async move {
            let mut resp = self.client.get(url.clone()).send().await.map_err(|e| FetchError::Failed(e.to_string()))?;
            if !resp.status().is_success() {
                return Err(FetchError::Status(resp.status().as_u16()));
            }
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| FetchError::Failed(e.to_string()))? {
                if body.len() + chunk.len() > MAX_CERTIFICATE_BYTES * 4 {
                    return Err(FetchError::Failed("response too large".into()));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(body)
        })
    }
}
