//! The one TLS crypto provider of the process (rustls with ring) and the
//! reqwest clients built on it. Every HTTPS client of the library (SNS
//! certificates, the Stripe and GitHub APIs, the AWS SDK's) uses ring: no C
//! build of aws-lc.

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
