//! Endpoints whose secret could not be resolved at the intake's cold start.
//!
//! One unreachable or missing secret must not take every endpoint down: the
//! cold start builds the others ([`EndpointBuilder::build_all`]) and keeps
//! such an endpoint here. A delivery to it is answered 503 with
//! `Retry-After` (the provider retries; nothing is lost), logged and counted
//! (`failed`, stage `secret`); the secret is resolved again at most once per
//! [`RETRY_EVERY_MS`] per execution environment, by the delivery that finds
//! the bound passed, and once it resolves the endpoint works like the
//! others for the rest of the environment's life.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::{ConfigError, Endpoint, EndpointBuilder, EndpointSpec};

/// How often, at most, an execution environment tries an endpoint's secret again.
pub const RETRY_EVERY_MS: i64 = 30_000;

/// What a delivery to a name finds.
pub enum Found {
    /// The endpoint, built after the cold start.
    Ready(Arc<Endpoint>),
    /// Its secret still cannot be resolved: ask the sender to come back in
    /// this many seconds.
    Waiting { retry_after_secs: u32 },
    /// No such endpoint.
    Unknown,
}

struct Waiting {
    spec: EndpointSpec,
    next_try_ms: i64,
}

pub struct WaitingEndpoints {
    builder: EndpointBuilder,
    waiting: Mutex<BTreeMap<String, Waiting>>,
    ready: Mutex<BTreeMap<String, Arc<Endpoint>>>,
}

impl WaitingEndpoints {
    /// `waiting`: the endpoints the cold start could not build (tried just
    /// now, at `now_ms`), each logged with why.
    pub fn new(builder: EndpointBuilder, waiting: BTreeMap<String, (EndpointSpec, ConfigError)>, now_ms: i64) -> Self {
        let waiting = waiting
            .into_iter()
            .map(|(name, (spec, why))| {
                tracing::error!(endpoint = %name, error = %why, "endpoint waits for its secret; its deliveries are answered 503");
                (name, Waiting { spec, next_try_ms: now_ms + RETRY_EVERY_MS })
            })
            .collect();
        Self { builder, waiting: Mutex::new(waiting), ready: Mutex::new(BTreeMap::new()) }
    }

    /// Names still waiting for their secret.
    pub fn waiting(&self) -> Vec<String> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// The endpoint `name` if it is (now) built; else whether it waits.
    pub async fn find(&self, name: &str, now_ms: i64) -> Found {
        if let Some(e) = self.ready.lock().unwrap_or_else(PoisonError::into_inner).get(name) {
            return Found::Ready(e.clone());
        }
        // Take the try (the next one is a bound away) before resolving, so
        // deliveries meanwhile answer at once instead of trying too.
        let spec = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(w) = waiting.get_mut(name) else { return Found::Unknown };
            if now_ms < w.next_try_ms {
                return Found::Waiting { retry_after_secs: secs_until(w.next_try_ms, now_ms) };
            }
            w.next_try_ms = now_ms + RETRY_EVERY_MS;
            w.spec.clone()
        };
        match self.builder.build(name, &spec).await {
            Ok(endpoint) => {
                tracing::info!(endpoint = %name, "endpoint's secret resolved; it takes deliveries");
                let endpoint = Arc::new(endpoint);
                self.waiting.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
                self.ready.lock().unwrap_or_else(PoisonError::into_inner).insert(name.to_owned(), endpoint.clone());
                Found::Ready(endpoint)
            }
            Err(e) => {
                tracing::error!(endpoint = %name, error = %e, "endpoint's secret still cannot be resolved");
                Found::Waiting { retry_after_secs: secs_until(now_ms + RETRY_EVERY_MS, now_ms) }
            }
        }
    }
}

fn secs_until(at_ms: i64, now_ms: i64) -> u32 {
    u32::try_from(((at_ms - now_ms).max(0) + 999) / 1000).unwrap_or(u32::MAX).max(crate::intake::RETRY_AFTER_SECS)
}
