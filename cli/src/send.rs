//! Signs and sends a delivery as the endpoint's provider would.

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use hookledger::config::{self, EndpointSpec, ProviderKind, SecretResolver};
use hookledger::secret::Secret;
use hookledger::verify::generic::{self, GenericHmacConfig, SignedContent, Source};
use hookledger::verify::{github, quiltt, sns, standard, stripe};

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
    let resolver = wiring.secrets();
    let reference = spec.secrets.first().ok_or("sns endpoints are signed by AWS; the tool cannot sign for them")?;
    let mut secret = resolver.resolve(reference).await.map_err(|e| format!("secret {reference}: {e}"))?;
    if args.bad_signature {
        secret = Secret::new(b"not-the-secret".to_vec());
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?.as_secs() as i64;
    let event_id = args.event_id.clone().unwrap_or_else(|| fresh_id(spec.provider));
    let body = match &args.body {
        Some(b) if b.starts_with('@') => std::fs::read(&b[1..]).map_err(|e| format!("{}: {e}", &b[1..]))?,
        Some(b) => b.clone().into_bytes(),
        None => default_body(spec, &event_id, &args.event_type, now),
    };
    let delivery = sign(spec, &secret, &event_id, &args.event_type, body, now)?;

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

fn fresh_id(provider: ProviderKind) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    match provider {
        ProviderKind::Stripe => format!("evt_{}", &id[..24]),
        ProviderKind::StandardWebhooks => format!("msg_{}", &id[..24]),
        _ => uuid::Uuid::new_v4().to_string(),
    }
}

fn default_body(spec: &EndpointSpec, event_id: &str, event_type: &str, now: i64) -> Vec<u8> {
    let value = match spec.provider {
        ProviderKind::Stripe => serde_json::json!({
            "id": event_id, "object": "event", "type": event_type, "created": now,
            "livemode": false, "data": {"object": {}}
        }),
        ProviderKind::Hmac => {
            // Put the id and type where the endpoint is configured to read them.
            let mut v = serde_json::json!({});
            if let Some(h) = &spec.hmac {
                for (source, value) in [(Some(&h.id), event_id), (h.event_type.as_ref(), event_type)] {
                    if let Some(Source::JsonPointer(p)) = source {
                        set_pointer(&mut v, p, value);
                    }
                }
            }
            v
        }
        // A batch of one event, in Quiltt's shape.
        ProviderKind::Quiltt => return quiltt::batch(&[(event_id, event_type)], &sns::format_timestamp(now)),
        _ => serde_json::json!({"type": event_type, "timestamp": now, "data": {}}),
    };
    value.to_string().into_bytes()
}

fn set_pointer(root: &mut serde_json::Value, pointer: &str, value: &str) {
    let mut cur = root;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let obj = cur.as_object_mut().expect("objects all the way down");
        if i + 1 == parts.len() {
            obj.insert((*part).to_owned(), serde_json::Value::String(value.to_owned()));
            return;
        }
        cur = obj.entry((*part).to_owned()).or_insert_with(|| serde_json::json!({}));
    }
}

pub(crate) fn sign(
    spec: &EndpointSpec,
    secret: &Secret,
    event_id: &str,
    event_type: &str,
    body: Vec<u8>,
    now: i64,
) -> Result<Delivery, String> {
    let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    match spec.provider {
        ProviderKind::Stripe => headers.push((stripe::SIGNATURE_HEADER.into(), stripe::sign(secret, now, &body))),
        ProviderKind::Github => {
            headers.push((github::SIGNATURE_HEADER.into(), github::sign(secret, &body)));
            headers.push((github::DELIVERY_HEADER.into(), event_id.to_owned()));
            headers.push((github::EVENT_HEADER.into(), event_type.to_owned()));
        }
        ProviderKind::StandardWebhooks => {
            let key = standard::decode_secret(secret).unwrap_or_else(|_| secret.clone());
            headers.push(("webhook-id".into(), event_id.to_owned()));
            headers.push(("webhook-timestamp".into(), now.to_string()));
            headers.push(("webhook-signature".into(), standard::sign(&key, event_id, now, &body)));
        }
        ProviderKind::Hmac => {
            let h = spec.hmac.as_ref().ok_or("hmac endpoint without hmac section")?;
            let header =
                |n: &str| http::HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).map_err(|e| e.to_string());
            let cfg = GenericHmacConfig {
                signature_header: header(&h.signature_header)?,
                prefix: h.prefix.clone(),
                encoding: h.encoding,
                timestamp_header: h.timestamp_header.as_deref().map(header).transpose()?,
                tolerance_secs: 300,
                signed_content: SignedContent::parse(&h.signed_content)?,
                id: h.id.clone(),
                event_type: h.event_type.clone(),
            };
            headers.push((h.signature_header.clone(), generic::sign(&cfg, secret, now, &body)));
            if let Some(t) = &h.timestamp_header {
                headers.push((t.clone(), now.to_string()));
            }
            if let Source::Header(name) = &h.id {
                headers.push((name.clone(), event_id.to_owned()));
            }
            if let Some(Source::Header(name)) = &h.event_type {
                headers.push((name.clone(), event_type.to_owned()));
            }
        }
        ProviderKind::Quiltt => {
            headers.push(("Quiltt-Signature".into(), quiltt::sign(secret, now, &body)));
            headers.push(("Quiltt-Timestamp".into(), now.to_string()));
        }
        ProviderKind::Sns => return Err("sns endpoints are signed by AWS; the tool cannot sign for them".into()),
    }
    Ok(Delivery { headers, body })
}

#[cfg(test)]
mod tests {
    use super::*;

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
