//! A consumer of HTTPS destinations on a local port (plain HTTP/1.1 on
//! loopback, one request per connection): it keeps every request's headers
//! and body, verifies each with Hookledger's own Standard Webhooks verifier,
//! and answers 204 (or a scripted status). Tests read what it received by
//! `webhook-id`: the consumer's view of "each event once".

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The signing secret the sink's destinations use (`whsec_` + base64 of 24 bytes).
pub const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    /// When it arrived (the order of arrivals across sinks).
    pub at: std::time::Instant,
}

#[derive(Default)]
pub struct Sink {
    received: Mutex<Vec<Received>>,
    /// The status answered (0: 204).
    pub status: AtomicU16,
    /// The next this many requests are answered 503 (an outage).
    pub fail_next: AtomicUsize,
    pub connections: AtomicUsize,
    /// Answers only after this long (a slow partner).
    pub delay_ms: std::sync::atomic::AtomicU64,
}

impl Sink {
    /// Starts it; returns its state and its URL (`http://127.0.0.1:PORT/hooks`).
    pub async fn start() -> (Arc<Self>, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        let sink = Arc::new(Self::default());
        let state = sink.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                let state = state.clone();
                tokio::spawn(async move {
                    state.connections.fetch_add(1, Ordering::SeqCst);
                    if let Some(r) = read_request(&mut sock).await {
                        state.received.lock().unwrap().push(r);
                    }
                    let outage =
                        state.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
                    let status = match state.status.load(Ordering::SeqCst) {
                        _ if outage => 503,
                        0 => 204,
                        s => s,
                    };
                    let delay = state.delay_ms.load(Ordering::SeqCst);
                    if delay > 0 {
                        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                    }
                    let resp = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        (sink, url)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Every request's `webhook-id`, with how many times it came.
    pub fn ids(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for r in self.received() {
            *out.entry(r.headers.get("webhook-id").cloned().unwrap_or_default()).or_insert(0) += 1;
        }
        out
    }

    /// A secret resolver that answers [`SECRET`] for every reference.
    pub fn secrets() -> Arc<dyn hookledger::config::SecretResolver> {
        Arc::new(Fixed)
    }

    /// Requests whose signature Hookledger's verifier refuses (with a wide
    /// tolerance: the tests' clocks may be virtual).
    pub fn unverified(&self) -> usize {
        use hookledger::verify::standard::{StandardWebhooksVerifier, decode_secret};
        let key = decode_secret(&hookledger::secret::Secret::new(SECRET)).unwrap();
        let verifier = StandardWebhooksVerifier::new(vec![key], i64::MAX / 4);
        self.received()
            .iter()
            .filter(|r| {
                let mut h = http::HeaderMap::new();
                for (k, v) in &r.headers {
                    if let (Ok(k), Ok(v)) = (http::HeaderName::try_from(k.as_str()), http::HeaderValue::from_str(v)) {
                        h.insert(k, v);
                    }
                }
                verifier.verify(&r.body, &h, 0).is_err()
            })
            .count()
    }
}

async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<Received> {
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let headers: BTreeMap<String, String> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    while buf.len() < head_end + len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(Received { headers, body: buf[head_end..head_end + len].to_vec(), at: std::time::Instant::now() })
}

struct Fixed;

impl hookledger::config::SecretResolver for Fixed {
    fn resolve<'a>(
        &'a self,
        _: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<hookledger::secret::Secret, String>> + Send + 'a>>
    {
        Box::pin(async { Ok(hookledger::secret::Secret::new(SECRET)) })
    }
}
