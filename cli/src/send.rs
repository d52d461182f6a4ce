//! Signs and sends a delivery as the endpoint's provider would.

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use hookledger::config::{self, EndpointSpec, ProviderKind, SecretResolver};
use hookledger::secret::Secret;
#[cfg(test)]
use hookledger::verify::sns;

#[derive(Args)]
pub struct SendArgs {
    /// Endpoint name, as configured in HOOKLEDGER_ENDPOINTS.
    #[arg(long)]
    endpoint: String,
    /// Base URL of the intake; the request goes to <url>/webhooks/<endpoint>.
    #[arg(long, env = "HOOKLEDGER_INTAKE_URL", default_value = "http://127.0.0.1:9000/lambda-url/intake")]
    url: String,
    /// Endpoint configuration JSON (the same value the intake reads).
    #[arg(long, env = "HOOKLEDGER_ENDPOINTS", hide_env_values = true)]
    endpoints: String,
    /// Provider event id (generated if omitted).
    #[arg(long)]
    event_id: Option<String>,
    /// Provider event type.
    #[arg(long = "type", default_value = "test.event")]
    event_type: String,
    /// Raw body to send; `@path` reads a file. Default: a small JSON event carrying the id and type.
    #[arg(long)]
    body: Option<String>,
    /// Sign with a wrong secret (to see a 401).
    #[arg(long)]
    bad_signature: bool,
    /// Send the same signed delivery this many times (duplicates).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Print only the HTTP status codes, one per line.
    #[arg(long)]
    quiet: bool,
    /// Print the signed delivery (JSON: method, headers, body in base64) instead of sending it.
    #[arg(long)]
    print: bool,
    /// Sign as of this Unix time (seconds) instead of now.
    #[arg(long)]
    now: Option<i64>,
    /// Play the provider's side of its handshakes (challenges, GET checks,
    /// notices) against the endpoint, and check each answer is the one the
    /// provider needs.
    #[arg(long, conflicts_with_all = ["bad_signature", "body", "print", "repeat"])]
    handshake: bool,
}

#[derive(clap::Subcommand)]
pub enum ProvidersAction {
    /// Open an endpoint's handshake window: the first secret its provider
    /// hands over before it closes is stored (once, never overwritten).
    Arm(ArmArgs),
}

#[derive(Args)]
pub struct ArmArgs {
    /// The provider (one that hands its secret over at a handshake: asana).
    provider: String,
    /// The endpoint, as configured in HOOKLEDGER_ENDPOINTS.
    #[arg(long)]
    endpoint: String,
    /// How long the window stays open: 90s, 10m, 1h (at most 1h).
    #[arg(long = "for", default_value = "10m")]
    duration: String,
    /// Endpoint configuration JSON (the same value the intake reads).
    #[arg(long, env = "HOOKLEDGER_ENDPOINTS", hide_env_values = true)]
    endpoints: String,
    #[command(flatten)]
    pub who: crate::audit::WhoArgs,
}

impl ArmArgs {
    /// The endpoint it arms (the audit entry's target).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// The longest handshake window an operator may open.
pub const MAX_WINDOW_SECS: i64 = 3600;

/// `90s`, `10m`, `1h` (or plain seconds) in seconds, within 1 s..=1 h.
pub fn window_secs(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => t.split_at(at),
        None => (t, "s"),
    };
    let n: i64 = digits.parse().map_err(|_| format!("--for {text:?}: a number then s, m or h (10m)"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("--for {text:?}: the unit is s, m or h")),
    };
    if !(1..=MAX_WINDOW_SECS).contains(&secs) {
        return Err(format!("--for {text:?}: a window is open 1 s to 1 h"));
    }
    Ok(secs)
}

/// `hookledger providers arm`: opens the endpoint's handshake window.
pub async fn arm(
    args: ArmArgs,
    wiring: &hookledger::wiring::Wiring,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    let provider =
        ProviderKind::named(&args.provider).ok_or_else(|| format!("unknown provider {:?}", args.provider))?;
    if !provider.learns_secret() {
        return Err(format!("{provider} does not hand its secret over at a handshake: nothing to arm"));
    }
    let specs = config::parse_endpoints(&args.endpoints).map_err(|e| e.to_string())?;
    let spec = specs.get(&args.endpoint).ok_or_else(|| format!("endpoint {:?} is not configured", args.endpoint))?;
    if spec.provider != provider {
        return Err(format!("endpoint {} is a {} endpoint, not {provider}", args.endpoint, spec.provider));
    }
    let secs = window_secs(&args.duration)?;
    let path = wiring
        .settings
        .handshake_path
        .clone()
        .ok_or("HOOKLEDGER_HANDSHAKE_PATH is not set (where the secret is kept)")?;
    let store = wiring.secret_store().ok_or("HOOKLEDGER_HANDSHAKE_PATH is not set")?;
    if store.load(&args.endpoint).await?.is_some() {
        return Err(format!(
            "a secret is already stored for {} ({path}/{}/secret) and is never overwritten: delete that parameter first to take a new one",
            args.endpoint, args.endpoint
        ));
    }
    let until = unix_now()? + secs;
    store.open_window(&args.endpoint, until).await?;
    writeln!(
        out,
        "{}: handshake window open until {} ({secs} s); the first secret {provider} offers is stored at {path}/{}/secret",
        args.endpoint,
        hookledger::verify::sns::format_timestamp(until),
        args.endpoint
    )
    .map_err(|e| e.to_string())
}

fn unix_now() -> Result<i64, String> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?.as_secs() as i64)
}

pub(crate) struct Delivery {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

pub async fn run(
    args: SendArgs,
    wiring: &hookledger::wiring::Wiring,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    let specs = config::parse_endpoints(&args.endpoints).map_err(|e| e.to_string())?;
    let spec = specs.get(&args.endpoint).ok_or_else(|| format!("endpoint {:?} is not configured", args.endpoint))?;
    if args.handshake {
        return handshake(&args, spec, wiring, out).await;
    }
    let mut secret = signing_secret(&args.endpoint, spec, wiring).await?;
    if args.bad_signature {
        secret = Secret::new(b"not-the-secret".to_vec());
    }
    let now = match args.now {
        Some(t) => t,
        None => SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?.as_secs() as i64,
    };
    let event_id = args.event_id.clone().unwrap_or_else(|| fresh_id(spec.provider));
    let body = match &args.body {
        Some(b) if b.starts_with('@') => std::fs::read(&b[1..]).map_err(|e| format!("{}: {e}", &b[1..]))?,
        Some(b) => b.clone().into_bytes(),
        None => spec.provider.sample(spec, &event_id, &args.event_type, now),
    };
    let delivery = sign(spec, &secret, &event_id, &args.event_type, body, now)?;

    if args.print {
        let headers: Vec<[&str; 2]> = delivery.headers.iter().map(|(k, v)| [k.as_str(), v.as_str()]).collect();
        let printed = serde_json::json!({
            "method": "POST", "event_id": event_id, "now": now, "headers": headers,
            "body_base64": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &delivery.body),
        });
        return writeln!(out, "{printed}").map_err(|e| e.to_string());
    }
    let url = format!("{}/webhooks/{}", args.url.trim_end_matches('/'), args.endpoint);
    let client = reqwest::Client::new();
    for _ in 0..args.repeat {
        let mut req = client.post(&url).body(delivery.body.clone());
        for (k, v) in &delivery.headers {
            req = req.header(k, v);
        }
        let resp = req.send().await.map_err(|e| format!("POST {url}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let line = if args.quiet {
            format!("{status}")
        } else {
            format!("{status} {text}  (endpoint={} event_id={event_id})", args.endpoint)
        };
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The secret the endpoint's deliveries are signed with: its first
/// configured one, else (a provider that hands its secret over) the one stored
/// at its handshake.
async fn signing_secret(
    endpoint: &str,
    spec: &EndpointSpec,
    wiring: &hookledger::wiring::Wiring,
) -> Result<Secret, String> {
    if let Some(reference) = spec.secrets.first() {
        return wiring.secrets().resolve(reference).await.map_err(|e| format!("secret {reference}: {e}"));
    }
    if spec.provider.learns_secret() {
        let store = wiring.secret_store().ok_or("HOOKLEDGER_HANDSHAKE_PATH is not set")?;
        return store.load(endpoint).await?.ok_or_else(|| {
            format!("no secret is stored for {endpoint} yet: `providers arm`, then `send --handshake`")
        });
    }
    Err(format!("{} deliveries are not signed with a shared secret; the tool cannot sign them", spec.provider))
}

/// `send --handshake`: each of the provider's handshakes against the
/// endpoint, its answer checked against the one the provider needs.
async fn handshake(
    args: &SendArgs,
    spec: &EndpointSpec,
    wiring: &hookledger::wiring::Wiring,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    let secret = match spec.secrets.first() {
        Some(_) => Some(signing_secret(&args.endpoint, spec, wiring).await?),
        None => None,
    };
    let verify_token = match &spec.verify_token {
        Some(r) => Some(wiring.secrets().resolve(r).await.map_err(|e| format!("verify_token {r}: {e}"))?),
        None => None,
    };
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let now_s = match args.now {
        Some(t) => t,
        None => unix_now()?,
    };
    let input = hookledger::verify::provider::HandshakeInput {
        spec,
        secret: secret.as_ref(),
        verify_token: verify_token.as_ref(),
        nonce: &nonce,
        now_s,
    };
    let all = spec.provider.handshakes(input)?;
    if all.is_empty() {
        return Err(format!("{} makes no handshake the tool can play", spec.provider));
    }
    let url = format!("{}/webhooks/{}", args.url.trim_end_matches('/'), args.endpoint);
    let client = reqwest::Client::new();
    let mut wrong = Vec::new();
    for h in all {
        let target = if h.query.is_empty() { url.clone() } else { format!("{url}?{}", h.query) };
        let mut req = client.request(h.method.clone(), &target).body(h.body.clone());
        for (k, v) in &h.headers {
            req = req.header(k, v);
        }
        let resp = req.send().await.map_err(|e| format!("{} {url}: {e}", h.method))?;
        let status = resp.status().as_u16();
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let header =
            h.expect.header.as_ref().map(|(name, _)| {
                resp.headers().get(*name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
            });
        let text = resp.text().await.unwrap_or_default();
        let problem = h.expect.mismatch(status, content_type.as_deref(), &text, header.as_deref());
        let shown: String = text.chars().take(120).collect();
        let verdict = problem.clone().unwrap_or_else(|| "as the provider needs".into());
        writeln!(out, "{} {}: {status} {shown}  ({verdict})", h.method, h.name).map_err(|e| e.to_string())?;
        if let Some(p) = problem {
            wrong.push(format!("{}: {p}", h.name));
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(format!("answers the provider would not accept: {}", wrong.join("; "))) }
}

/// `hookledger providers`: every provider an endpoint can name.
pub fn providers(json: bool, out: &mut (dyn std::io::Write + Send)) -> Result<(), String> {
    let all: Vec<&dyn hookledger::verify::provider::Provider> = hookledger::verify::registry::providers().collect();
    let text = if json {
        let rows: Vec<serde_json::Value> = all
            .iter()
            .map(|p| serde_json::json!({"provider": p.name(), "options": p.options(), "summary": p.summary()}))
            .collect();
        serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
    } else {
        let width = all.iter().map(|p| p.name().len()).max().unwrap_or(0);
        let mut lines =
            vec![format!("{:width$}  {}", "PROVIDER", "HOW IT SIGNS AND IDENTIFIES · WHAT ITS ENDPOINT MAY SET")];
        for p in &all {
            let takes = match (p.learns_secret(), p.takes_secrets()) {
                (true, _) => "secrets optional (learned at its handshake)",
                (false, true) => "secrets",
                (false, false) => "no secrets",
            };
            let options = p.options();
            let sets = if options.is_empty() { takes.to_owned() } else { format!("{takes}, {options}") };
            lines.push(format!("{:width$}  {} · {sets}", p.name(), p.summary()));
        }
        lines.join("\n")
    };
    writeln!(out, "{text}").map_err(|e| e.to_string())
}

fn fresh_id(provider: ProviderKind) -> String {
    provider.event_id(&uuid::Uuid::new_v4().simple().to_string())
}

/// The provider's signed delivery of `body` (its headers, and the content type).
pub(crate) fn sign(
    spec: &EndpointSpec,
    secret: &Secret,
    event_id: &str,
    event_type: &str,
    body: Vec<u8>,
    now: i64,
) -> Result<Delivery, String> {
    let body = spec.provider.seal(spec, secret, now, body)?;
    let mut headers = vec![("content-type".to_owned(), spec.provider.content_type().to_owned())];
    headers.extend(spec.provider.sign(spec, secret, event_id, event_type, now, &body)?);
    Ok(Delivery { headers, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoFetch;
    impl sns::HttpsGet for NoFetch {
        fn get<'a>(
            &'a self,
            _: &'a reqwest::Url,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, sns::FetchError>> + Send + 'a>>
        {
            Box::pin(async { Err(sns::FetchError::Failed("no network in tests".into())) })
        }
    }

    /// `hookledger send` signs for every provider that takes a shared
    /// secret, the presets among them: what it would send verifies.
    #[tokio::test]
    async fn the_tool_signs_every_provider_with_a_secret() {
        let cx = hookledger::verify::provider::BuildContext {
            certificates: std::sync::Arc::new(sns::CertificateCache::new(std::sync::Arc::new(NoFetch))),
            verify_token: Some(Secret::new("tool-verify-token")),
            learned: None,
        };
        let now = 1_800_000_000;
        let mut signed = 0;
        for p in hookledger::verify::registry::providers()
            .filter(|p| p.tool_signs() && p.options() != "hmac (required), public_url, tolerance_secs")
        {
            let mut v = serde_json::json!({"provider": p.name(), "secrets": ["env:A"]});
            if p.options().contains("public_url (required)") {
                v["public_url"] = "https://hooks.example.com/webhooks/x".into();
            }
            let spec: EndpointSpec = serde_json::from_value(v).unwrap();
            let secret = Secret::new(if p.name().contains("standard") || ["clerk", "resend"].contains(&p.name()) {
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            } else {
                "tool-secret"
            });
            let id = fresh_id(spec.provider);
            let body = p.sample(&spec, &id, "tool.test", now);
            let d = sign(&spec, &secret, &id, "tool.test", body, now).unwrap_or_else(|e| panic!("{}: {e}", p.name()));
            let mut headers = http::HeaderMap::new();
            for (k, v) in &d.headers {
                headers.append(
                    http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).unwrap(),
                    http::HeaderValue::from_str(v).unwrap(),
                );
            }
            assert_eq!(headers["content-type"], p.content_type(), "{}", p.name());
            let verifier = p.verifier(&spec, vec![secret], &cx).unwrap();
            let delivery = hookledger::verify::provider::Delivery {
                body: &d.body,
                headers: &headers,
                method: &http::Method::POST,
                query: "",
            };
            verifier.verify(delivery, now).await.unwrap_or_else(|e| panic!("{}: {e}", p.name()));
            signed += 1;
        }
        assert!(signed >= 31, "the four with modules and the presets: {signed}");
    }

    #[test]
    fn times_are_written_as_rfc3339_utc_and_read_back() {
        for (secs, text) in [
            (0, "1970-01-01T00:00:00Z"),
            (1_764_504_000, "2025-11-30T12:00:00Z"),
            (951_782_400 + 86_399, "2000-02-29T23:59:59Z"),
        ] {
            assert_eq!(sns::format_timestamp(secs), text);
            assert_eq!(sns::parse_timestamp(text), Some(secs), "{text}");
        }
    }
}
