//! The audit log in the memory world: the adapter's transaction items and
//! conditions (`adapters::dynamodb::audit`), evaluated on the world's table.

use aws_sdk_dynamodb::types::TransactWriteItem;

use super::table::{Refusal, TransactError, Write};
use super::{MemLedger, World};
use crate::adapters::dynamodb::audit::{
    Audited, RECORD_PREFIX, audit_pk, audited_outcome, entry_key, entry_of, entry_puts, page_range, record_key,
};
use crate::adapters::dynamodb::conditions as cond;
use crate::audit::{AuditEntry, AuditPage, STARTED, months};
use crate::identity::EventKey;
use crate::ledger::PortError;
use crate::ports::AuditLog;

fn invalid(message: String) -> PortError {
    PortError::Unavailable { service: "dynamodb", message: format!("ValidationException: {message}") }
}

impl World {
    /// [`crate::adapters::dynamodb::DynamoLedger`]'s `audited`: the action's
    /// items and the entry's puts in one transaction under the entry's id.
    pub(crate) fn audited(
        &self,
        call: &str,
        actions: Vec<TransactWriteItem>,
        entry: &AuditEntry,
        names: &[&'static str],
    ) -> Result<Audited, PortError> {
        self.call_on(call, &entry.target, |w, st| {
            let count = actions.len();
            let mut items = actions.clone();
            items.extend(entry_puts("memory", entry, crate::audit::DEFAULT_AUDIT_RETENTION_DAYS));
            let writes = items.iter().map(Write::from_sdk).collect::<Result<Vec<_>, _>>().map_err(invalid)?;
            st.exercised.insert("audit_entry");
            st.exercised.extend(names.iter().copied());
            match st.table.transact(&writes, Some(&entry.id), w.now()) {
                Ok(()) => Ok(Audited::Done),
                Err(TransactError::Cancelled(reasons)) => {
                    let codes = Refusal::codes(&reasons);
                    let met = reasons
                        .iter()
                        .map(|r| match r {
                            Some(Refusal::Condition(met)) => met.clone(),
                            _ => None,
                        })
                        .collect();
                    let (pk, sk) = entry_key(entry);
                    audited_outcome(st.table.get(&pk, &sk).is_some(), &codes, met, count)
                }
                Err(e) => Err(invalid(format!("{e:?}"))),
            }
        })
    }
}

impl AuditLog for MemLedger {
    async fn audit_page(
        &self,
        since_ms: i64,
        until_ms: i64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<AuditPage, PortError> {
        let limit = limit.clamp(1, 1_000);
        let (since_ms, until_ms) =
            crate::audit::kept_window(since_ms, until_ms, crate::audit::DEFAULT_AUDIT_RETENTION_DAYS);
        let (lo, hi) = page_range(since_ms, until_ms, after);
        self.0.call_on("audit.page", "", |_, st| {
            let mut entries = Vec::new();
            for m in months(since_ms, until_ms) {
                for item in st.table.partition(&audit_pk(&m)) {
                    let sk = item.get("sk").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
                    if (lo.as_str()..=hi.as_str()).contains(&sk.as_str()) {
                        entries.extend(entry_of(item));
                        if entries.len() >= limit {
                            let next = entries.last().map(AuditEntry::cursor);
                            return Ok(AuditPage { entries, next });
                        }
                    }
                }
            }
            Ok(AuditPage { entries, next: None })
        })
    }

    async fn audit_of(&self, key: &EventKey) -> Result<Vec<AuditEntry>, PortError> {
        self.0.call_on("audit.of", key.as_str(), |_, st| {
            Ok(st
                .table
                .partition(key.as_str())
                .into_iter()
                .filter(|i| {
                    i.get("sk")
                        .and_then(|v| v.as_s().ok())
                        .is_some_and(|sk| sk.starts_with(RECORD_PREFIX) && sk.contains("#audit#"))
                })
                .filter_map(entry_of)
                .collect())
        })
    }

    async fn audit_begin(&self, entry: &AuditEntry) -> Result<(), PortError> {
        let entry = AuditEntry { result: STARTED.to_owned(), ..entry.clone() };
        self.0.audited("audit.begin", Vec::new(), &entry, &[]).map(drop)
    }

    async fn audit_end(&self, entry: &AuditEntry, result: &str) -> Result<(), PortError> {
        let mut keys = vec![entry_key(entry)];
        if let Some(r) = &entry.record {
            keys.push(record_key(entry, r));
        }
        let update = cond::audit_end(&cond::bounded(result));
        self.0.call_on("audit.end", &entry.target, |_, st| {
            st.exercised.insert(update.name());
            for (pk, sk) in &keys {
                match st.table.write(&Write::update(pk, sk, &update)) {
                    Ok(_) | Err(Refusal::Condition(_)) => {}
                    Err(e) => return Err(invalid(format!("{e:?}"))),
                }
            }
            Ok(())
        })
    }

    fn audit_id(&self) -> String {
        self.0.ambient.token()
    }
}
