//! The console's HTML: one layout, escaped text everywhere, forms that
//! carry the CSRF token. Pages are built as strings; every value from the
//! ledger or the request goes through [`esc`].

use hookledger::ledger::Row;

/// Escapes text for HTML element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes a query-string component.
pub fn url(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#111}\
header{background:#111827;color:#fff;padding:10px 20px;display:flex;gap:20px;align-items:center}\
header a{color:#fff;text-decoration:none}header .who{margin-left:auto;color:#9ca3af}\
main{padding:16px 20px;max-width:1200px}table{border-collapse:collapse;margin:8px 0}\
td,th{border-bottom:1px solid #e5e7eb;padding:4px 10px;text-align:left;vertical-align:top}\
th{background:#f9fafb}.muted{color:#6b7280}.num{text-align:right}\
.figs{display:flex;flex-wrap:wrap;gap:12px}.fig{border:1px solid #e5e7eb;border-radius:6px;padding:8px 14px;min-width:120px}\
.fig b{display:block;font-size:22px}.charts{display:flex;flex-wrap:wrap;gap:24px}\
.DEAD{color:#b91c1c;font-weight:600}.PARKED{color:#b45309;font-weight:600}.PROCESSED{color:#15803d;font-weight:600}\
.RETRYABLE,.PROCESSING,.RECEIVED{color:#1d4ed8;font-weight:600}\
form.inline{display:inline}input,select,button{font:inherit;padding:3px 6px}\
button.danger{background:#b91c1c;color:#fff;border:0;border-radius:4px;padding:5px 12px}\
.notice{background:#ecfdf5;border:1px solid #a7f3d0;padding:8px 12px;border-radius:6px}\
.error{background:#fef2f2;border:1px solid #fecaca;padding:8px 12px;border-radius:6px}\
pre{background:#f3f4f6;padding:10px;overflow:auto;max-height:480px}progress{width:320px}figure{margin:0}";

/// The layout around a page's body.
pub fn page(title: &str, operator: &str, body: &str, refresh: Option<u32>) -> String {
    let refresh = refresh.map(|s| format!("<meta http-equiv=refresh content=\"{s}\">")).unwrap_or_default();
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>{t} · Hookledger</title>{refresh}\
         <style>{STYLE}</style></head><body><header><a href=\"/\"><b>Hookledger</b></a><a href=\"/\">Overview</a>\
         <a href=\"/records?status=DEAD\">Dead</a><a href=\"/records?status=PARKED\">Parked</a>\
         <a href=\"/records?status=RETRYABLE\">Retrying</a><a href=\"/destinations\">Destinations</a><a href=\"/audit\">Audit</a>\
         <form class=inline action=\"/search\" method=get><input name=q id=search placeholder=\"event id or key\" size=32>\
         <button type=submit id=search-go>Find</button></form><span class=who>operator: {op}</span></header>\
         <main><h1>{t}</h1>{body}</main></body></html>",
        t = esc(title),
        op = esc(operator),
    )
}

pub fn field(r: &Row, k: &str) -> String {
    match r.get(k) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    }
}

/// A record field for people: times (`*_at`, `*_until`: Unix ms;
/// `expires_at`: Unix seconds) as UTC dates, everything else as stored.
pub fn field_value(r: &Row, k: &str) -> String {
    let ms = match num(r, k) {
        Some(s) if k == "expires_at" => Some(s.saturating_mul(1000)),
        Some(ms) if k.ends_with("_at") || k.ends_with("_until") => Some(ms),
        _ => None,
    };
    match ms {
        Some(ms) if ms > 0 => format!("{} UTC", when(ms)),
        _ => field(r, k),
    }
}

pub fn num(r: &Row, k: &str) -> Option<i64> {
    r.get(k).and_then(serde_json::Value::as_i64)
}

/// A time in UTC, `YYYY-MM-DD HH:MM:SS.mmm`.
pub fn when(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = hookledger::verify::sns::civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}", rem / 3600, rem % 3600 / 60, rem % 60, ms.rem_euclid(1000))
}

/// A hidden CSRF field.
pub fn csrf(token: &str) -> String {
    format!("<input type=hidden name=csrf value=\"{}\">", esc(token))
}

/// A table of rows with a header.
pub fn table(id: &str, header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("<table id=\"{}\"><tr>", esc(id));
    for h in header {
        out.push_str(&format!("<th>{}</th>", esc(h)));
    }
    out.push_str("</tr>");
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            // Cells are HTML already (escaped by the caller).
            out.push_str(&format!("<td>{c}</td>"));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

pub fn status(s: &str) -> String {
    format!("<span class=\"{0}\">{0}</span>", esc(s))
}

pub fn record_link(key: &str) -> String {
    format!("<a href=\"/record?key={}\">{}</a>", url(key), esc(key))
}

/// The record's timeline: receipt, deliveries, attempts, errors, operator
/// actions and the outcome, oldest first.
pub fn timeline(record: &Row, history: &[Row]) -> Vec<(i64, String, String)> {
    let mut t: Vec<(i64, String, String)> = Vec::new();
    let via = field(record, "via");
    if let Some(at) = num(record, "received_at") {
        let how = if via.is_empty() { "webhook".to_owned() } else { via };
        t.push((at, "received".into(), format!("first delivery recorded (via {how})")));
    }
    if let Some(at) = num(record, "enqueued_at") {
        t.push((at, "enqueued".into(), "handed to the work queue".into()));
    }
    let dups = num(record, "duplicates").unwrap_or(0);
    let conflicts = num(record, "conflicts").unwrap_or(0);
    if let Some(at) = num(record, "last_conflict_at") {
        t.push((at, "conflict".into(), format!("a delivery with different content ({conflicts} in all)")));
    }
    for h in history {
        t.push((num(h, "at").unwrap_or(0), field(h, "kind"), field(h, "detail")));
    }
    // The last attempt; its error only while the record still waits on it
    // (earlier attempts are in the history).
    if let Some(at) = num(record, "last_attempt_at") {
        let n = num(record, "attempts").unwrap_or(0);
        let detail = match (field(record, "status").as_str(), field(record, "error_code").as_str()) {
            ("RETRYABLE", code) if !code.is_empty() => {
                format!("attempt {n}: {code} {}", field(record, "error_message"))
            }
            _ => format!("attempt {n} (the latest)"),
        };
        t.push((at, "attempt".into(), detail));
    }
    // Written by releases or paths that kept no history entry for it.
    let told = |kind: &str| history.iter().any(|h| field(h, "kind") == kind);
    for (k, at, what, kind) in
        [("dead_reason", "dead_at", "dead-lettered", "dead"), ("park_reason", "parked_at", "parked", "parked")]
    {
        let why = field(record, k);
        if !why.is_empty() && !told(kind) {
            t.push((num(record, at).or(num(record, "attn_at")).unwrap_or(0), what.into(), why));
        }
    }
    if let Some(at) = num(record, "processed_at") {
        t.push((at, "completed".into(), format!("outcome {}", field(record, "outcome"))));
    }
    t.sort_by_key(|e| e.0);
    if dups > 0 {
        t.push((i64::MAX, "duplicates".into(), format!("{dups} further deliveries counted on the record")));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_times_are_utc() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(url("evt#stripe#a#evt 1"), "evt%23stripe%23a%23evt%201");
        assert_eq!(when(0), "1970-01-01 00:00:00.000");
        assert_eq!(when(1_700_000_000_123), "2023-11-14 22:13:20.123");
        assert_eq!(when(951_782_400_000), "2000-02-29 00:00:00.000");
    }

    #[test]
    fn record_times_show_as_utc_dates_and_other_fields_as_stored() {
        let r: Row = serde_json::from_value(serde_json::json!({
            "received_at": 1_700_000_000_123_i64, "lease_until": 1_700_000_030_000_i64,
            "expires_at": 1_700_086_400, "attempts": 3, "status": "DEAD"
        }))
        .unwrap();
        assert_eq!(field_value(&r, "received_at"), "2023-11-14 22:13:20.123 UTC");
        assert_eq!(field_value(&r, "lease_until"), "2023-11-14 22:13:50.000 UTC");
        assert_eq!(field_value(&r, "expires_at"), "2023-11-15 22:13:20.000 UTC", "TTL in seconds");
        assert_eq!((field_value(&r, "attempts"), field_value(&r, "status")), ("3".into(), "DEAD".into()));
    }
}
