//! A fake Stripe API on a local port: `GET /v1/subscriptions/{id}` answers
//! from an in-memory map, `GET /v1/events` lists its events newest first
//! (`limit`, `created[gte]`, `created[lt]`, `types[]`, `starting_after`, as
//! Stripe does), `GET /v1/events/{id}` answers one. Tests change its state, make it fail or rate-limit, and
//! count requests. It speaks plain HTTP/1.1, one request per connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type Answer = (&'static str, String, Vec<(&'static str, String)>);
/// A scripted refusal: status line and headers.
pub type Limit = (&'static str, Vec<(&'static str, String)>);

/// Serves `answer(request head)` on a local port, one request per
/// connection; returns the base URL.
async fn serve(answer: Arc<dyn Fn(&str) -> Answer + Send + Sync>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let answer = answer.clone();
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
                let (status, body, extra) = answer(&head);
                let extra: String = extra.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    base
}

#[derive(Default)]
pub struct FakeStripe {
    pub subscriptions: Mutex<HashMap<String, serde_json::Value>>,
    /// Events, newest first.
    pub events: Mutex<Vec<serde_json::Value>>,
    /// The largest page it returns (Stripe's: 100).
    pub page_cap: AtomicUsize,
    /// Scripted answers to the next event-list requests: 429 with these
    /// headers (`Retry-After`, `Stripe-Should-Retry`).
    pub rate_limits: Mutex<Vec<Vec<(&'static str, String)>>>,
    /// The `Stripe-Account` header of each event-list request.
    pub accounts: Mutex<Vec<Option<String>>>,
    /// An API key accepted besides `sk_test_fake`.
    pub other_key: Mutex<Option<String>>,
    pub fail: AtomicBool,
    pub requests: AtomicUsize,
}

impl FakeStripe {
    /// Starts the server; returns its state and base URL.
    pub async fn start() -> (Arc<Self>, String) {
        let state = Arc::new(Self::default());
        let s = state.clone();
        let base = serve(Arc::new(move |head: &str| s.answer(head))).await;
        (state, base)
    }

    fn answer(&self, head: &str) -> Answer {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return ("503 Service Unavailable", r#"{"error":{"message":"down"}}"#.into(), vec![]);
        }
        let bearer = |key: &str| {
            head.to_ascii_lowercase().contains(&format!("authorization: bearer {}", key.to_ascii_lowercase()))
        };
        let other = self.other_key.lock().unwrap().clone();
        if !bearer("sk_test_fake") && !other.as_deref().is_some_and(bearer) {
            return ("401 Unauthorized", r#"{"error":{"message":"bad key"}}"#.into(), vec![]);
        }
        let target = head.split_whitespace().nth(1).unwrap_or("");
        let url = url::Url::parse(&format!("http://fake{target}")).unwrap();
        if url.path() == "/v1/events" {
            let account = head
                .lines()
                .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("stripe-account")))
                .map(|(_, v)| v.trim().to_owned());
            self.accounts.lock().unwrap().push(account);
            let limited = {
                let mut r = self.rate_limits.lock().unwrap();
                if r.is_empty() { None } else { Some(r.remove(0)) }
            };
            if let Some(headers) = limited {
                return ("429 Too Many Requests", r#"{"error":{"type":"rate_limit_error"}}"#.into(), headers);
            }
            return ("200 OK", self.list_events(&url), vec![]);
        }
        if let Some(id) = url.path().strip_prefix("/v1/events/") {
            let events = self.events.lock().unwrap();
            return match events.iter().find(|e| e["id"] == id) {
                Some(e) => ("200 OK", e.to_string(), vec![]),
                None => ("404 Not Found", r#"{"error":{"code":"resource_missing"}}"#.into(), vec![]),
            };
        }
        let Some(id) = url.path().strip_prefix("/v1/subscriptions/") else {
            return ("404 Not Found", "{}".into(), vec![]);
        };
        match self.subscriptions.lock().unwrap().get(id) {
            Some(v) => ("200 OK", v.to_string(), vec![]),
            None => ("404 Not Found", r#"{"error":{"code":"resource_missing"}}"#.into(), vec![]),
        }
    }

    fn list_events(&self, url: &url::Url) -> String {
        let q: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        let one = |name: &str| q.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let num = |name: &str| one(name).and_then(|v| v.parse::<i64>().ok());
        let types: Vec<String> = q.iter().filter(|(k, _)| k == "types[]").map(|(_, v)| v.clone()).collect();
        let cap = match self.page_cap.load(Ordering::SeqCst) {
            0 => 100,
            n => n,
        };
        let limit = num("limit").map_or(10, |l| l as usize).min(cap);
        let events = self.events.lock().unwrap();
        let matching: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| num("created[gte]").is_none_or(|t| e["created"].as_i64().unwrap() >= t))
            .filter(|e| num("created[lt]").is_none_or(|t| e["created"].as_i64().unwrap() < t))
            .filter(|e| types.is_empty() || types.iter().any(|t| e["type"].as_str() == Some(t.as_str())))
            .collect();
        let start = one("starting_after")
            .map_or(0, |c| matching.iter().position(|e| e["id"] == c.as_str()).map_or(matching.len(), |i| i + 1));
        let page: Vec<&serde_json::Value> = matching.iter().skip(start).take(limit).copied().collect();
        let has_more = start + page.len() < matching.len();
        serde_json::json!({"object": "list", "url": "/v1/events", "has_more": has_more, "data": page}).to_string()
    }

    pub fn set(&self, id: &str, customer: &str, status: &str, seats: i64) {
        let v = serde_json::json!({"id": id, "object": "subscription", "customer": customer, "status": status, "quantity": seats});
        self.subscriptions.lock().unwrap().insert(id.to_owned(), v);
    }
}

/// A fake GitHub API for one hook (`/repos/octo/app/hooks/7`): its deliveries
/// newest first with `Link` cursor pagination, each delivery's kept payload
/// (`null` when the delivery has none: GitHub keeps none for some), and
/// redelivery requests. Rate limits, and the answer for one delivery, can
/// be scripted.
#[derive(Default)]
pub struct FakeGithub {
    /// `{id, guid, delivered_at, event, status_code, payload}`, newest first.
    pub deliveries: Mutex<Vec<serde_json::Value>>,
    pub per_page: AtomicUsize,
    /// Scripted answers to the next requests: (status, headers).
    pub limits: Mutex<Vec<Limit>>,
    /// What `GET …/deliveries/{id}` answers for these ids instead: (status, body).
    pub delivery_answers: Mutex<HashMap<u64, (&'static str, String)>>,
    /// Delivery ids whose redelivery was asked for.
    pub redelivered: Mutex<Vec<u64>>,
    /// A token accepted besides `ghp_fake`.
    pub other_token: Mutex<Option<String>>,
    pub requests: AtomicUsize,
}

pub const GITHUB_HOOK: &str = "repos/octo/app/hooks/7";
pub const GITHUB_TOKEN: &str = "ghp_fake";

impl FakeGithub {
    pub async fn start() -> (Arc<Self>, String) {
        let state = Arc::new(Self::default());
        let s = state.clone();
        let base = serve(Arc::new(move |head: &str| s.answer(head))).await;
        (state, base)
    }

    fn answer(&self, head: &str) -> Answer {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let bearer = |token: &str| {
            head.to_ascii_lowercase().contains(&format!("authorization: bearer {}", token.to_ascii_lowercase()))
        };
        let other = self.other_token.lock().unwrap().clone();
        if !bearer(GITHUB_TOKEN) && !other.as_deref().is_some_and(bearer) {
            return ("401 Unauthorized", r#"{"message":"Bad credentials"}"#.into(), vec![]);
        }
        let limited = {
            let mut l = self.limits.lock().unwrap();
            if l.is_empty() { None } else { Some(l.remove(0)) }
        };
        if let Some((status, headers)) = limited {
            return (status, r#"{"message":"API rate limit exceeded"}"#.into(), headers);
        }
        let mut words = head.split_whitespace();
        let method = words.next().unwrap_or("");
        let url = url::Url::parse(&format!("http://fake{}", words.next().unwrap_or(""))).unwrap();
        let prefix = format!("/{GITHUB_HOOK}/deliveries");
        let Some(rest) = url.path().strip_prefix(&prefix) else { return ("404 Not Found", "{}".into(), vec![]) };
        let deliveries = self.deliveries.lock().unwrap();
        match (method, rest.trim_start_matches('/').split('/').collect::<Vec<_>>().as_slice()) {
            ("GET", [""]) => {
                let per_page = match self.per_page.load(Ordering::SeqCst) {
                    0 => 100,
                    n => n,
                };
                let start: usize = url
                    .query_pairs()
                    .find(|(k, _)| k == "cursor")
                    .and_then(|(_, v)| v.strip_prefix("c").and_then(|n| n.parse().ok()))
                    .unwrap_or(0);
                let page: Vec<serde_json::Value> = deliveries
                    .iter()
                    .skip(start)
                    .take(per_page)
                    .map(|d| {
                        let mut d = d.clone();
                        d.as_object_mut().unwrap().remove("payload");
                        d
                    })
                    .collect();
                let mut headers = vec![];
                if start + page.len() < deliveries.len() {
                    let next = format!("http://fake{prefix}?per_page={per_page}&cursor=c{}", start + page.len());
                    headers.push(("Link", format!("<{next}>; rel=\"next\"")));
                }
                ("200 OK", serde_json::Value::Array(page).to_string(), headers)
            }
            ("GET", [id])
                if id.parse::<u64>().is_ok_and(|n| self.delivery_answers.lock().unwrap().contains_key(&n)) =>
            {
                let (status, body) = self.delivery_answers.lock().unwrap()[&id.parse::<u64>().unwrap()].clone();
                (status, body, vec![])
            }
            ("GET", [id]) => match deliveries.iter().find(|d| id.parse::<u64>().is_ok_and(|n| d["id"] == n)) {
                Some(d) => {
                    let full = serde_json::json!({"id": d["id"], "guid": d["guid"], "event": d["event"],
                        "request": {"headers": {"X-GitHub-Event": d["event"]}, "payload": d["payload"]},
                        "response": {"payload": "ok"}});
                    ("200 OK", full.to_string(), vec![])
                }
                None => ("404 Not Found", "{}".into(), vec![]),
            },
            ("POST", [id, "attempts"]) => match id.parse::<u64>() {
                Ok(n) if deliveries.iter().any(|d| d["id"] == n) => {
                    self.redelivered.lock().unwrap().push(n);
                    ("202 Accepted", "{}".into(), vec![])
                }
                _ => ("404 Not Found", "{}".into(), vec![]),
            },
            _ => ("404 Not Found", "{}".into(), vec![]),
        }
    }
}
