//! Human-readable output.

use std::io::{self, Write};

use hookledger::insight::{Count, Failures, Standing, Stats, TenantStats};
use hookledger::ledger::Row;

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

/// Writes rows as aligned columns (comfy-table, no borders: easy to read
/// and to grep).
pub fn columns(out: &mut (dyn Write + Send), header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(header.iter().copied());
    for r in rows {
        t.add_row(r.iter().map(String::as_str));
    }
    for line in t.lines() {
        writeln!(out, "{}", line.trim_end())?;
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

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1} ms"))
}

fn age(v: Option<i64>) -> String {
    v.map_or("none".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
}

fn counts(out: &mut (dyn Write + Send), title: &str, items: &[Count]) -> io::Result<()> {
    if items.is_empty() {
        return writeln!(out, "{title}: none");
    }
    let rows: Vec<Vec<String>> = items.iter().map(|c| vec![c.key.clone(), c.count.to_string()]).collect();
    columns(out, &[title, "COUNT"], &rows)
}

fn standing(out: &mut (dyn Write + Send), now: &Standing) -> io::Result<()> {
    let rows: Vec<Vec<String>> = now.by_status.iter().map(|(k, v)| vec![k.clone(), v.to_string()]).collect();
    columns(out, &["STATUS", "NOW"], &rows)?;
    writeln!(out, "(PROCESSED records are in no index and never counted here: see the metrics above)")?;
    if now.truncated {
        writeln!(out, "(some shard held more rows than the cap: these counts are lower bounds)")?;
    }
    writeln!(out, "oldest unprocessed: {}; stuck leases: {}", age(now.oldest_unprocessed_age_ms), now.stuck_leases)
}

pub fn tenant_stats(out: &mut (dyn Write + Send), s: &TenantStats) -> io::Result<()> {
    writeln!(out, "tenant {}", s.tenant)?;
    match &s.metrics {
        Some(m) => {
            writeln!(out, "last {} (its own metrics)", span(s.until_ms - s.since_ms))?;
            let rows = vec![
                vec!["received".to_owned(), m.received.to_string()],
                vec!["processed".into(), m.processed.to_string()],
                vec!["dead-lettered".into(), m.dead.to_string()],
            ];
            columns(out, &["FIGURE", "VALUE"], &rows)?;
            writeln!(
                out,
                "receipt to completion: mean {}, max {}",
                ms(m.receipt_to_completion.mean_ms),
                ms(m.receipt_to_completion.max_ms)
            )?;
        }
        None => writeln!(
            out,
            "no metrics of its own in the last {} (list it in TenantMetrics for received, processed, dead and latency)",
            span(s.until_ms - s.since_ms)
        )?,
    }
    writeln!(out)?;
    standing(out, &s.now)
}

pub fn stats(out: &mut (dyn Write + Send), s: &Stats) -> io::Result<()> {
    writeln!(out, "last {} (metrics, {} s periods)", span(s.until_ms - s.since_ms), s.period_s)?;
    let mut rows = vec![
        vec!["received".to_owned(), s.received.to_string()],
        vec!["duplicates".into(), s.duplicates.to_string()],
        vec!["payload conflicts".into(), s.payload_conflicts.to_string()],
        vec!["rejected".into(), s.rejected.to_string()],
        vec!["unavailable (503)".into(), s.unavailable.to_string()],
    ];
    rows.extend(s.processed.iter().map(|(k, v)| vec![format!("processed: {k}"), v.to_string()]));
    rows.extend([
        vec!["retried".into(), s.retried.to_string()],
        vec!["dead-lettered".into(), s.dead_lettered.to_string()],
        vec!["parked".into(), s.parked.to_string()],
        vec!["drift found / repaired".into(), format!("{} / {}", s.drift_found, s.drift_repaired)],
    ]);
    columns(out, &["FIGURE", "VALUE"], &rows)?;
    writeln!(out, "duplicate rate: {:.1}%", s.duplicate_rate * 100.0)?;
    writeln!(out, "processing: mean {}, max {}", ms(s.processing.mean_ms), ms(s.processing.max_ms))?;
    writeln!(
        out,
        "receipt to completion: mean {}, max {}",
        ms(s.receipt_to_completion.mean_ms),
        ms(s.receipt_to_completion.max_ms)
    )?;
    if !s.destinations.is_empty() {
        writeln!(out)?;
        let rows: Vec<Vec<String>> = s
            .destinations
            .iter()
            .map(|(d, f)| {
                vec![
                    d.clone(),
                    f.delivered.to_string(),
                    f.retried.to_string(),
                    f.failed.to_string(),
                    f.dead.to_string(),
                    ms(f.latency.mean_ms),
                ]
            })
            .collect();
        columns(
            out,
            &["DESTINATION", "DELIVERED", "AFTER A RETRY", "FAILED TRIES", "DEAD", "RECEIPT TO DELIVERY"],
            &rows,
        )?;
    }
    writeln!(out)?;
    standing(out, &s.now)
}

fn span(ms: i64) -> String {
    match ms / 1000 {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

pub fn failures(out: &mut (dyn Write + Send), f: &Failures) -> io::Result<()> {
    counts(out, "FAILING (PROVIDER TYPE)", &f.top_types)?;
    writeln!(out)?;
    counts(out, "REPEATED (PROVIDER SUBJECT)", &f.repeated_subjects)?;
    writeln!(out)?;
    counts(out, "REASON", &f.reasons)?;
    writeln!(out)?;
    if !f.failing_destinations.is_empty() || !f.dead_deliveries.is_empty() {
        counts(out, "DESTINATION (FAILED TRIES)", &f.failing_destinations)?;
        writeln!(out)?;
        counts(out, "DESTINATION (DEAD DELIVERIES)", &f.dead_deliveries)?;
        writeln!(out)?;
    }
    if f.stuck_leases.is_empty() {
        writeln!(out, "stuck leases: none")?;
    } else {
        let rows: Vec<Vec<String>> = f
            .stuck_leases
            .iter()
            .map(|l| vec![l.key.clone(), age(Some(l.lease_expired_ms_ago)), l.attempts.to_string()])
            .collect();
        columns(out, &["STUCK LEASE", "EXPIRED AGO", "ATTEMPTS"], &rows)?;
    }
    match &f.oldest_unprocessed {
        Some(o) => writeln!(out, "oldest unprocessed: {} ({}, {})", o.key, o.status, age(Some(o.age_ms)))?,
        None => writeln!(out, "oldest unprocessed: none")?,
    }
    writeln!(out)?;
    let rows: Vec<Vec<String>> = f
        .duplicate_rate
        .iter()
        .map(|p| vec![time(&p.at_ms.to_string()), p.deliveries.to_string(), format!("{:.1}%", p.rate * 100.0)])
        .collect();
    columns(out, &["PERIOD", "DELIVERIES", "DUPLICATE RATE"], &rows)?;
    writeln!(out)?;
    let rows: Vec<Vec<String>> =
        f.drift.iter().map(|p| vec![time(&p.at_ms.to_string()), p.found.to_string(), p.repaired.to_string()]).collect();
    columns(out, &["PERIOD", "DRIFT FOUND", "REPAIRED"], &rows)?;
    if f.now.truncated {
        writeln!(out, "(some shard held more rows than the cap: these lists are drawn from the first rows)")?;
    }
    Ok(())
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

/// The operator audit log: one line per entry, oldest first.
pub fn audit(out: &mut (dyn Write + Send), entries: &[hookledger::audit::AuditEntry]) -> io::Result<()> {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                time(&e.at_ms.to_string()),
                e.verb.clone(),
                e.target.clone(),
                e.operator.clone(),
                e.principal.clone(),
                e.reason.clone(),
                e.result.clone(),
            ]
        })
        .collect();
    columns(out, &["at", "verb", "target", "operator", "principal", "reason", "result"], &rows)
}
