//! The handshake secret store in memory (`verify::provider::SecretStore`),
//! as `adapters::handshake` keeps it in SSM: a window per endpoint, a secret
//! written once and never overwritten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::secret::Secret;
use crate::verify::provider::{SecretStore, Stored, Storing};

#[derive(Clone, Default)]
pub struct MemSecretStore {
    inner: Arc<Mutex<Params>>,
}

#[derive(Default)]
struct Params {
    windows: HashMap<String, i64>,
    secrets: HashMap<String, Vec<u8>>,
    writes: usize,
}

impl MemSecretStore {
    /// Writes that changed something (windows and secrets).
    pub fn writes(&self) -> usize {
        self.inner.lock().map(|p| p.writes).unwrap_or(0)
    }
}

impl SecretStore for MemSecretStore {
    fn window(&self, endpoint: &str) -> Storing<'_, Option<i64>> {
        let r = self.inner.lock().map(|p| p.windows.get(endpoint).copied()).map_err(|e| e.to_string());
        Box::pin(async move { r })
    }

    fn open_window(&self, endpoint: &str, until_s: i64) -> Storing<'_, ()> {
        let r = self
            .inner
            .lock()
            .map(|mut p| {
                p.windows.insert(endpoint.to_owned(), until_s);
                p.writes += 1;
            })
            .map_err(|e| e.to_string());
        Box::pin(async move { r })
    }

    fn store_once<'a>(&'a self, endpoint: &'a str, secret: &'a Secret) -> Storing<'a, Stored> {
        let r = self
            .inner
            .lock()
            .map(|mut p| match p.secrets.get(endpoint) {
                Some(s) if s.as_slice() == secret.expose() => Stored::Same,
                Some(_) => Stored::Other,
                None => {
                    p.secrets.insert(endpoint.to_owned(), secret.expose().to_vec());
                    p.writes += 1;
                    Stored::New
                }
            })
            .map_err(|e| e.to_string());
        Box::pin(async move { r })
    }

    fn load(&self, endpoint: &str) -> Storing<'_, Option<Secret>> {
        let r = self
            .inner
            .lock()
            .map(|p| p.secrets.get(endpoint).map(|s| Secret::new(s.clone())))
            .map_err(|e| e.to_string());
        Box::pin(async move { r })
    }
}
