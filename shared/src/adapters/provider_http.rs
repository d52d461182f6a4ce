//! What the provider API clients (Stripe, GitHub) and the SNS getter share:
//! which base URLs they may send a key to, how a failed request is told, and
//! an answer read up to a bound. Below the clients, so none of them imports
//! another.

use url::Url;

/// Whether `base` may be a provider API's base URL (the Stripe and GitHub
/// clients send their key or token to it): `https://`, or plain `http://`
/// to a loopback host only (127.0.0.0/8, `::1`, `localhost`: a fake
/// provider on the same machine).
pub fn check_api_base(base: &str) -> Result<(), String> {
    let url = Url::parse(base).map_err(|e| format!("{base:?} is not a URL ({e})"))?;
    match (url.scheme(), url.host()) {
        ("https", Some(_)) => Ok(()),
        ("http", Some(host)) if is_loopback(&host) => Ok(()),
        ("http", Some(_)) => Err(format!("{base}: plain http only to a loopback host (127.0.0.1, ::1, localhost)")),
        _ => Err(format!("{base}: expected an https:// URL")),
    }
}

fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// A failed provider request, told without its URL (which may carry a
/// cursor or an id) and with every cause: a timeout reads
/// "… operation timed out".
pub fn request_failure(e: reqwest::Error) -> String {
    crate::ledger::error_chain(&e.without_url())
}

/// Why a provider's answer could not be read whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The answer is longer than the bound it is read to.
    #[error("the answer is larger than the {limit}-byte bound")]
    TooLarge { limit: usize },
    /// The connection failed or timed out while the answer was read.
    #[error("reading the answer: {0}")]
    Read(String),
}

/// Reads an answer's body chunk by chunk, at most `limit` bytes of it: one
/// longer (by its `Content-Length`, or once its chunks pass `limit`) is
/// `TooLarge`, and nothing beyond the bound is read.
pub async fn read_capped(resp: &mut reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| BodyError::Read(request_failure(e)))? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Fake provider servers on loopback, for the tests of the clients.
#[cfg(test)]
pub(crate) mod test_servers {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A server that accepts connections and never answers; its base URL.
    pub(crate) fn silent() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        std::thread::spawn(move || {
            let held: Vec<_> = listener.incoming().collect();
            drop(held);
        });
        base
    }

    /// A server that answers one request 200 with `bytes` bytes of body,
    /// streamed without a `Content-Length` (the client cannot know the size
    /// before it reads); its base URL.
    pub(crate) fn answering_bytes(bytes: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        std::thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else { return };
            let _ = conn.read(&mut [0u8; 4096]);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n");
            let chunk = vec![b' '; 64 * 1024];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(chunk.len());
                // The client hangs up once the answer passes its bound.
                if conn.write_all(&chunk[..n]).is_err() {
                    return;
                }
                left -= n;
            }
        });
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_api_base_is_https_or_http_to_loopback() {
        for ok in [
            "https://api.stripe.com",
            "https://ghe.example.com/api/v3",
            "http://127.0.0.1:9",
            "http://[::1]:9",
            "http://LOCALHOST",
        ] {
            assert_eq!(check_api_base(ok), Ok(()), "{ok}");
        }
        for bad in
            ["http://api.stripe.com", "http://127.0.0.1.example.com", "ws://127.0.0.1", "file:///etc", "stripe", ""]
        {
            assert!(check_api_base(bad).is_err(), "{bad}");
        }
    }
}
