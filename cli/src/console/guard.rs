//! What stands between a browser and the operator's AWS credentials:
//!
//! - **Host check** (DNS rebinding): a page from `evil.example` that makes
//!   its name resolve to 127.0.0.1 still sends `Host: evil.example`; every
//!   request whose Host is not one of the console's own addresses is refused.
//! - **CSRF**: every write is a POST carrying the console's random token
//!   (compared in constant time), and an `Origin`, when the browser sends
//!   one, must be the console's own.
//! - **Headers**: no caching, no framing, no referrer to other sites, a content security
//!   policy that allows nothing from elsewhere and no script at all. The
//!   referrer policy is `same-origin`, not `no-referrer`: under the latter
//!   browsers send `Origin: null` with the console's own forms.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// The addresses the console answers to, and its CSRF token.
#[derive(Clone)]
pub struct Guard {
    hosts: Vec<String>,
    token: String,
}

impl Guard {
    /// `port`: the bound port. Loopback names always; the bound address if
    /// the operator chose another one.
    pub fn new(bound: std::net::SocketAddr, token: String) -> Self {
        let port = bound.port();
        let mut hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")];
        let own = bound.to_string();
        if !hosts.contains(&own) {
            hosts.push(own);
        }
        Self { hosts, token }
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        host.is_some_and(|h| self.hosts.iter().any(|a| a.eq_ignore_ascii_case(h)))
    }

    /// An `Origin` header, if sent, names one of our hosts over http.
    pub fn origin_allowed(&self, origin: Option<&str>) -> bool {
        match origin {
            None => true,
            Some(o) => o.strip_prefix("http://").is_some_and(|h| self.host_allowed(Some(h))),
        }
    }

    pub fn token_matches(&self, sent: &str) -> bool {
        !sent.is_empty() && sent.as_bytes().ct_eq(self.token.as_bytes()).into()
    }
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], why.to_owned()).into_response()
}

/// Middleware: the host and origin checks, then the security headers.
pub async fn check(State(guard): State<Guard>, req: Request<Body>, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok());
    if !guard.host_allowed(host) {
        return refuse(StatusCode::MISDIRECTED_REQUEST, "unknown Host: the console answers only to its own address");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let origin = req.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok());
        if !guard.origin_allowed(origin) {
            return refuse(StatusCode::FORBIDDEN, "cross-origin request refused");
        }
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_origins_and_tokens() {
        let g = Guard::new("127.0.0.1:8088".parse().unwrap(), "tok-123".into());
        for ok in ["127.0.0.1:8088", "localhost:8088", "LOCALHOST:8088", "[::1]:8088"] {
            assert!(g.host_allowed(Some(ok)), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8088", "127.0.0.1:9999", "127.0.0.1", ""] {
            assert!(!g.host_allowed(Some(bad)), "{bad}");
        }
        assert!(!g.host_allowed(None));
        assert!(g.origin_allowed(None) && g.origin_allowed(Some("http://localhost:8088")));
        assert!(!g.origin_allowed(Some("http://evil.example")) && !g.origin_allowed(Some("null")));
        assert!(!g.origin_allowed(Some("https://localhost:8088")));
        assert!(g.token_matches("tok-123"));
        assert!(!g.token_matches("tok-12") && !g.token_matches("") && !g.token_matches("tok-1234"));
    }
}
