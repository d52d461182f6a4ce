//! The one TLS crypto provider of the process (rustls with ring) and the
//! reqwest clients built on it. Every HTTPS client of the library (SNS
//! certificates, the Stripe and GitHub APIs, the AWS SDK's) uses ring: no C
//! build of aws-lc. Also what those provider clients share when they read an
//! answer: [`read_bounded`].

use crate::ports::SourceError;

/// Makes ring the process's TLS crypto provider (once; harmless when one is
/// installed already). Every HTTPS client of the library is built after it:
/// reqwest is compiled without a provider of its own.
pub fn install_tls() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A reqwest client builder, with the TLS provider installed.
pub fn client_builder() -> reqwest::ClientBuilder {
    install_tls();
    reqwest::Client::builder()
}

/// Reads an answer up to `limit` bytes; a longer one is `TooLarge`.
pub async fn read_bounded(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, SourceError> {
    let too_large = |n: u64| SourceError::Unfetchable {
        cause: crate::ports::Unfetchable::TooLarge,
        detail: format!("the answer ({n} bytes or more) exceeds the {limit} bytes a backfill reads"),
    };
    if let Some(n) = resp.content_length().filter(|n| *n > limit as u64) {
        return Err(too_large(n));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| SourceError::Unavailable(e.without_url().to_string()))? {
        if out.len() + chunk.len() > limit {
            return Err(too_large((out.len() + chunk.len()) as u64));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}
