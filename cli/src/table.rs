//! Human-readable output.

use std::io::{self, Write};

use hookledger::ledger::Row;
use hookledger::ops::Stats;

fn get(item: &Row, k: &str) -> String {
    match item.get(k) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

fn time(ms: &str) -> String {
    ms.parse::<i64>().map(|ms| format!("{}.{:03}", ms / 1000, ms % 1000)).unwrap_or_else(|_| ms.to_owned())
}

/// Writes rows as aligned columns.
pub fn columns(out: &mut (dyn Write + Send), header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect::<Vec<_>>().join("  ")
    };
    writeln!(out, "{}", line(header.iter().map(|h| (*h).to_owned()).collect()).trim_end())?;
    for r in rows {
        writeln!(out, "{}", line(r.clone()).trim_end())?;
    }
    Ok(())
}

pub fn list(out: &mut (dyn Write + Send), items: &[Row]) -> io::Result<()> {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            let why = ["dead_reason", "park_reason", "error_code", "outcome"]
                .iter()
                .map(|k| get(i, k))
                .find(|v| v != "-")
                .unwrap_or_else(|| "-".into());
            vec![
                get(i, "pk"),
                get(i, "status"),
                get(i, "event_type"),
                get(i, "subject"),
                get(i, "attempts"),
                why,
                time(&get(i, "received_at")),
            ]
        })
        .collect();
    columns(out, &["KEY", "STATUS", "TYPE", "SUBJECT", "ATTEMPTS", "OUTCOME/REASON", "RECEIVED"], &rows)?;
    writeln!(out, "{} record(s)", items.len())
}

pub fn stats(out: &mut (dyn Write + Send), s: &Stats) -> io::Result<()> {
    let rows: Vec<Vec<String>> = s.by_status.iter().map(|(k, v)| vec![k.clone(), v.to_string()]).collect();
    columns(out, &["STATUS", "COUNT"], &rows)?;
    writeln!(out, "(PROCESSED records are in no index and not counted; `hookledger show KEY` reads one)")?;
    writeln!(out)?;
    let rows: Vec<Vec<String>> = s.by_provider.iter().map(|(k, v)| vec![k.clone(), v.to_string()]).collect();
    columns(out, &["PROVIDER", "RECORDS"], &rows)?;
    if !s.open_by_type.is_empty() {
        writeln!(out)?;
        let rows: Vec<Vec<String>> = s.open_by_type.iter().map(|(k, v)| vec![k.clone(), v.to_string()]).collect();
        columns(out, &["NOT PROCESSED (PROVIDER TYPE)", "COUNT"], &rows)?;
    }
    writeln!(out)?;
    match s.oldest_unprocessed_age_ms {
        Some(ms) => writeln!(out, "oldest unprocessed: {:.1} s", ms as f64 / 1000.0)?,
        None => writeln!(out, "oldest unprocessed: none")?,
    }
    writeln!(
        out,
        "deliveries: {}, duplicates: {}, duplicate rate: {:.1}%",
        s.deliveries,
        s.duplicates,
        s.duplicate_rate * 100.0
    )
}

pub fn show(
    out: &mut (dyn Write + Send),
    record: &Row,
    history: &[Row],
    payload: Option<&[u8]>,
    asked: bool,
) -> io::Result<()> {
    let mut keys: Vec<&String> = record.keys().collect();
    keys.sort();
    let rows: Vec<Vec<String>> = keys.iter().map(|k| vec![(*k).clone(), get(record, k)]).collect();
    columns(out, &["FIELD", "VALUE"], &rows)?;
    writeln!(out, "\nhistory:")?;
    writeln!(out, "  {}  received", time(&get(record, "received_at")))?;
    for h in history {
        writeln!(out, "  {}  {}: {}", time(&get(h, "at")), get(h, "kind"), get(h, "detail"))?;
    }
    if get(record, "processed_at") != "-" {
        writeln!(out, "  {}  completed ({})", time(&get(record, "processed_at")), get(record, "outcome"))?;
    }
    match (asked, payload) {
        (true, Some(p)) => writeln!(out, "\npayload ({} bytes):\n{}", p.len(), String::from_utf8_lossy(p)),
        (true, None) => writeln!(out, "\npayload: not stored"),
        (false, _) => writeln!(out, "\npayload: redacted (use --payload to show it)"),
    }
}
