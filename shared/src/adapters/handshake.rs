//! Secrets providers hand over at a handshake (Asana), in SSM: under the
//! path `HOOKLEDGER_HANDSHAKE_PATH` (`/<secrets path>/handshake`), each
//! endpoint has `<path>/<endpoint>/window` (a String: until when, in Unix
//! seconds, the operator's `hookledger providers arm` opened it) and
//! `<path>/<endpoint>/secret` (a SecureString, written once with
//! `Overwrite=false`: a second offer meets `ParameterAlreadyExists`, and the
//! stored value is read back to tell a lost acknowledgement's retry, the
//! same value, from another secret, which stays).
//!
//! The intake may `ssm:GetParameter` and `ssm:PutParameter` under that path
//! only; the operator's tool writes the window.

use aws_sdk_ssm::error::ProvideErrorMetadata;
use aws_sdk_ssm::types::ParameterType;
use subtle::ConstantTimeEq;

use crate::secret::Secret;
use crate::verify::provider::{SecretStore, Stored, Storing};

pub struct SsmSecretStore {
    ssm: aws_sdk_ssm::Client,
    path: String,
}

/// Whether `path` may hold the handshake parameters: `/` then segments of
/// letters, digits and `_.-`, no trailing `/`.
pub fn valid_path(path: &str) -> bool {
    path.len() <= 512
        && path.starts_with('/')
        && path[1..].split('/').all(|s| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        })
}

impl SsmSecretStore {
    pub fn new(ssm: aws_sdk_ssm::Client, path: &str) -> Self {
        Self { ssm, path: path.trim_end_matches('/').to_owned() }
    }

    fn name(&self, endpoint: &str, what: &str) -> String {
        format!("{}/{endpoint}/{what}", self.path)
    }

    /// A parameter's value (decrypted), or `None` when it does not exist.
    async fn get(&self, name: &str) -> Result<Option<String>, String> {
        match self.ssm.get_parameter().name(name).with_decryption(true).send().await {
            Ok(out) => Ok(out.parameter.and_then(|p| p.value)),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_parameter_not_found()) => Ok(None),
            Err(e) => Err(super::error_chain(&e)),
        }
    }
}

impl SecretStore for SsmSecretStore {
    fn window(&self, endpoint: &str) -> Storing<'_, Option<i64>> {
        let name = self.name(endpoint, "window");
        Box::pin(async move {
            let Some(text) = self.get(&name).await? else { return Ok(None) };
            text.trim().parse::<i64>().map(Some).map_err(|_| format!("{name} is not a Unix time"))
        })
    }

    fn open_window(&self, endpoint: &str, until_s: i64) -> Storing<'_, ()> {
        let name = self.name(endpoint, "window");
        Box::pin(async move {
            self.ssm
                .put_parameter()
                .name(&name)
                .value(until_s.to_string())
                .r#type(ParameterType::String)
                .overwrite(true)
                .description("Hookledger: until when (Unix seconds) this endpoint takes its provider's handshake")
                .send()
                .await
                .map(|_| ())
                .map_err(|e| super::error_chain(&e))
        })
    }

    fn store_once<'a>(&'a self, endpoint: &'a str, secret: &'a Secret) -> Storing<'a, Stored> {
        let name = self.name(endpoint, "secret");
        Box::pin(async move {
            let value = std::str::from_utf8(secret.expose()).map_err(|_| "the secret is not text".to_owned())?;
            let put = self
                .ssm
                .put_parameter()
                .name(&name)
                .value(value)
                .r#type(ParameterType::SecureString)
                .overwrite(false)
                .description("Hookledger: the secret this endpoint's provider handed over at its handshake")
                .send()
                .await;
            match put {
                Ok(_) => Ok(Stored::New),
                Err(e) if e.as_service_error().is_some_and(|s| s.code() == Some("ParameterAlreadyExists")) => {
                    // Ours (a retry after a lost acknowledgement), or another secret, which stays.
                    let stored = self.get(&name).await?.ok_or_else(|| format!("{name} exists and cannot be read"))?;
                    Ok(if bool::from(stored.as_bytes().ct_eq(secret.expose())) { Stored::Same } else { Stored::Other })
                }
                Err(e) => Err(super::error_chain(&e)),
            }
        })
    }

    fn load(&self, endpoint: &str) -> Storing<'_, Option<Secret>> {
        let name = self.name(endpoint, "secret");
        Box::pin(async move { Ok(self.get(&name).await?.map(Secret::new)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_absolute_plain_and_without_a_trailing_slash() {
        assert!(valid_path("/hookledger/prod/handshake"));
        for bad in ["", "/", "hookledger", "/a//b", "/a/b/", "/a b", "/a/../b", "/a/*"] {
            assert!(!valid_path(bad), "{bad:?}");
        }
    }
}
