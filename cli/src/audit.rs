//! The operator audit log from the CLI: who is acting (the caller AWS
//! reports, asked once per command), `hookledger audit-log`, and the entries
//! of runs (written before a run, completed after it).

use std::fmt::Display;
use std::future::Future;
use std::io::Write;

use clap::Args;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::audit::{AuditEntry, Caller};
use hookledger::ports::AuditLog;

/// The caller as AWS reports it (`sts:GetCallerIdentity`), with the name
/// the operator gave. No write is made without it: an operator write that
/// cannot say who made it is refused.
pub async fn caller(aws: &aws_config::SdkConfig, operator: &str) -> Result<Caller, String> {
    use aws_sdk_sts::error::ProvideErrorMetadata;
    let me = aws_sdk_sts::Client::new(aws).get_caller_identity().send().await.map_err(|e| {
        let why = e.code().map_or_else(|| e.to_string(), |c| format!("{c}: {}", e.message().unwrap_or_default()));
        format!(
            "who is acting could not be asked of AWS (sts:GetCallerIdentity: {why}); operator writes are audited \
             with the caller's identity and are refused without it"
        )
    })?;
    let principal = me.arn().filter(|a| !a.is_empty()).ok_or("sts:GetCallerIdentity returned no ARN")?;
    Ok(Caller::new(principal, operator))
}

/// A run's entry around the run: written before it (`started`), completed
/// with its outcome after it. A run whose entry cannot be written does not
/// start.
pub async fn around<T, E: Display>(
    ledger: &DynamoLedger,
    entry: AuditEntry,
    run: impl Future<Output = Result<T, E>>,
    outcome: impl Fn(&T) -> String,
) -> Result<T, String> {
    ledger.audit_begin(&entry).await.map_err(|e| format!("the audit entry could not be written, nothing done: {e}"))?;
    let result = run.await;
    let said = match &result {
        Ok(t) => format!("done: {}", outcome(t)),
        Err(e) => format!("failed: {e}"),
    };
    let ended = ledger.audit_end(&entry, &said).await;
    let t = result.map_err(|e| e.to_string())?;
    ended.map_err(|e| format!("done, but its audit entry still says started: {e}"))?;
    Ok(t)
}

/// A new entry of `caller` doing `verb` on `target` now.
pub fn entry(ledger: &DynamoLedger, verb: &str, target: &str, caller: &Caller, reason: &str) -> AuditEntry {
    AuditEntry::new(ledger.audit_id(), super::now_ms(), verb, target, caller).because(reason)
}

#[derive(Args)]
pub struct AuditLogArgs {
    /// Entries written at or after: unix ms, or an age like 30m, 6h, 2d
    /// (with --record: every entry of the record unless given).
    #[arg(long, value_parser = super::parse_time, required_unless_present = "record")]
    since: Option<i64>,
    /// Entries written at or before (default: now).
    #[arg(long, value_parser = super::parse_time)]
    until: Option<i64>,
    /// One record's entries (evt#<provider>#<endpoint>#<id>), oldest first.
    #[arg(long)]
    record: Option<String>,
    /// Entries per page.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// The next page: the cursor the last one printed.
    #[arg(long)]
    after: Option<String>,
}

/// `hookledger audit-log`: by time (one query per month of the window,
/// paged), or one record's (one query of its partition).
pub async fn run(
    args: AuditLogArgs,
    ledger: &DynamoLedger,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), String> {
    let until = args.until.unwrap_or_else(super::now_ms);
    let since = args.since.unwrap_or(0);
    if until < since {
        return Err("--until is before --since".into());
    }
    let (entries, next) = match &args.record {
        Some(raw) => {
            let key = hookledger::ops::parse_key(raw).map_err(|e| e.to_string())?;
            let all = ledger.audit_of(&key).await.map_err(|e| e.to_string())?;
            (all.into_iter().filter(|e| (since..=until).contains(&e.at_ms)).collect(), None)
        }
        None => {
            let page = ledger
                .audit_page(since, until, args.after.as_deref(), args.limit.clamp(1, 1_000))
                .await
                .map_err(|e| e.to_string())?;
            (page.entries, page.next)
        }
    };
    if json {
        let v = serde_json::json!({ "entries": entries, "next": next });
        writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default()).map_err(|e| e.to_string())?;
    } else {
        super::table::audit(out, &entries).map_err(|e| e.to_string())?;
        if let Some(n) = next {
            writeln!(out, "next: --after '{n}'").map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Who is acting and why, for commands that write (kept in the audit entry
/// beside the caller AWS reports).
#[derive(Args, Clone)]
pub struct WhoArgs {
    /// Who is acting (kept in the audit entry).
    #[arg(long, env = "USER", default_value = "operator")]
    pub operator: String,
    /// Why (kept in the audit entry).
    #[arg(long, default_value = "")]
    pub reason: String,
}
