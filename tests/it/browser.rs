//! A small WebDriver client for the console's browser test: Debian's
//! headless Chromium driven through chromedriver (both installed by
//! `scripts/install-browser`, which the test command runs).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    http: reqwest::Client,
    base: String,
    session: String,
    driver: Child,
    _profile: tempdir::Dir,
}

/// A directory removed on drop (the browser's profile).
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Browser {
    pub async fn start() -> Self {
        let chromium = std::env::var("HOOKLEDGER_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let driver_bin = std::env::var("HOOKLEDGER_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        assert!(
            std::path::Path::new(&chromium).exists() && std::path::Path::new(&driver_bin).exists(),
            "{chromium} and {driver_bin} are needed: scripts/install-browser installs them (the test command runs it)"
        );
        let port = free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = hookledger::adapters::tls::client_builder().timeout(Duration::from_secs(60)).build().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = http.get(format!("{base}/status")).send().await {
                let v: Value = serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or_default();
                if v["value"]["ready"] == true {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = std::env::temp_dir().join(format!("hookledger-chromium-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&profile).unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1280,1000",
                     format!("--user-data-dir={}", profile.display())]
        }}}});
        let mut b = Self { http, base, session: String::new(), driver, _profile: tempdir::Dir(profile) };
        let v = b.call("POST", "/session", Some(caps)).await;
        b.session = v["sessionId"].as_str().expect("a WebDriver session").to_owned();
        b
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = if path == "/session" {
            format!("{}{path}", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let req = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(body.unwrap_or(json!({})).to_string()),
        };
        let text = req.send().await.expect("WebDriver request").text().await.unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        assert!(v["value"]["error"].is_null(), "WebDriver {method} {path}: {text}");
        v["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url }))).await;
    }

    async fn find(&self, css: &str) -> String {
        let v = self.call("POST", "/element", Some(json!({"using": "css selector", "value": css}))).await;
        v[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}")).to_owned()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call("POST", &format!("/element/{id}/clear"), None).await;
        self.call("POST", &format!("/element/{id}/value"), Some(json!({ "text": text }))).await;
    }

    pub async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.call("POST", &format!("/element/{id}/click"), None).await;
    }

    pub async fn text(&self, css: &str) -> String {
        let id = self.find(css).await;
        self.call("GET", &format!("/element/{id}/text"), None).await.as_str().unwrap_or_default().to_owned()
    }

    pub async fn url(&self) -> String {
        self.call("GET", "/url", None).await.as_str().unwrap_or_default().to_owned()
    }

    /// Waits (up to 10 s) until the page's title is `want` (a click's
    /// navigation may still be loading when the click returns).
    pub async fn wait_title(&self, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let title = self.title().await;
            if title == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "title {title:?}, waited for {want:?}; page: {}",
                self.body_text().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn body_text(&self) -> String {
        self.text("body").await
    }

    pub async fn title(&self) -> String {
        self.call("GET", "/title", None).await.as_str().unwrap_or_default().to_owned()
    }

    /// Saves a PNG of the page; returns its size in bytes.
    pub async fn screenshot(&self, path: &std::path::Path) -> usize {
        let v = self.call("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or_default()).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, &png).unwrap();
        png.len()
    }

    pub async fn quit(mut self) {
        let _ = self.http.delete(format!("{}/session/{}", self.base, self.session)).send().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        // A browser left behind by a failed test: found by its profile directory.
        let _ = Command::new("pkill").arg("-f").arg(self._profile.0.as_os_str()).status();
    }
}
