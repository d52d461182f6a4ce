//! A fake Stripe API on a local port: `GET /v1/subscriptions/{id}` answers
//! from an in-memory map. Tests change its state, make it fail, and count
//! requests. It speaks plain HTTP/1.1, one request per connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Default)]
pub struct FakeStripe {
    pub subscriptions: Mutex<HashMap<String, serde_json::Value>>,
    pub fail: AtomicBool,
    pub requests: AtomicUsize,
}

impl FakeStripe {
    /// Starts the server; returns its state and base URL.
    pub async fn start() -> (Arc<Self>, String) {
        let state = Arc::new(Self::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let s = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                let s = s.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut len = 0;
                    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf[len..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => len += n,
                        }
                        if len == buf.len() {
                            return;
                        }
                    }
                    let head = String::from_utf8_lossy(&buf[..len]).into_owned();
                    let (status, body) = s.answer(&head);
                    let resp = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        (state, base)
    }

    fn answer(&self, head: &str) -> (&'static str, String) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return ("503 Service Unavailable", r#"{"error":{"message":"down"}}"#.into());
        }
        if !head.to_ascii_lowercase().contains("authorization: bearer sk_test_fake") {
            return ("401 Unauthorized", r#"{"error":{"message":"bad key"}}"#.into());
        }
        let path = head.split_whitespace().nth(1).unwrap_or("");
        let Some(id) = path.strip_prefix("/v1/subscriptions/") else {
            return ("404 Not Found", "{}".into());
        };
        match self.subscriptions.lock().unwrap().get(id) {
            Some(v) => ("200 OK", v.to_string()),
            None => ("404 Not Found", r#"{"error":{"code":"resource_missing"}}"#.into()),
        }
    }

    pub fn set(&self, id: &str, customer: &str, status: &str, seats: i64) {
        let v = serde_json::json!({"id": id, "object": "subscription", "customer": customer, "status": status, "quantity": seats});
        self.subscriptions.lock().unwrap().insert(id.to_owned(), v);
    }
}
