//! The operator audit log's items ([`crate::audit`]): each entry in its
//! month partition (`pk = audit#YYYY-MM`, `sk = <ms>#<id>`), an action on a
//! record also as a history item of the record (`sk = hist#<ms>#audit#<id>`);
//! both put once (`attribute_not_exists(pk)`), expiring after the audit
//! retention.
//!
//! An action is audited by `DynamoLedger::audited`: its own transaction
//! items and the entry's puts in one `TransactWriteItems`, whose
//! `ClientRequestToken` is the entry's id. A cancelled transaction whose entry
//! exists was ours (the SDK's retry after a lost acknowledgement, on a
//! store that does not remember the token): the action is done. Otherwise
//! the action was refused and nothing was written.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem};

use super::conditions as cond;
use super::{DynamoLedger, Item, get_n, get_s};
use crate::adapters::port_error;
use crate::audit::{AuditEntry, AuditPage, STARTED, cursor, month, months};
use crate::identity::EventKey;
use crate::ledger::PortError;
use crate::policy::expires_at;
use crate::ports::AuditLog;

/// The history items of a record that are audit entries.
pub const RECORD_PREFIX: &str = "hist#";
const RECORD_MARK: &str = "#audit#";

pub fn audit_pk(month: &str) -> String {
    format!("audit#{month}")
}

/// The key of an entry's item in its month.
pub fn entry_key(e: &AuditEntry) -> (String, String) {
    (audit_pk(&month(e.at_ms)), e.cursor())
}

/// The key of an entry's copy in its record's partition.
pub fn record_key(e: &AuditEntry, record: &str) -> (String, String) {
    (record.to_owned(), format!("{RECORD_PREFIX}{:013}{RECORD_MARK}{}", e.at_ms.max(0), e.id))
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn fields(e: &AuditEntry, (pk, sk): (String, String), days: u32) -> Item {
    let mut item = HashMap::from([
        ("pk".to_owned(), s(pk)),
        ("sk".to_owned(), s(sk)),
        ("audit_id".to_owned(), s(&e.id)),
        ("at".to_owned(), n(e.at_ms)),
        ("audit_verb".to_owned(), s(&e.verb)),
        ("audit_target".to_owned(), s(cond::bounded(&e.target))),
        ("principal".to_owned(), s(cond::bounded(&e.principal))),
        ("operator".to_owned(), s(cond::bounded(&e.operator))),
        ("audit_reason".to_owned(), s(cond::bounded(&e.reason))),
        ("audit_result".to_owned(), s(cond::bounded(&e.result))),
        (super::attr::EXPIRES_AT.to_owned(), n(expires_at(e.at_ms, days))),
    ]);
    if let Some(r) = &e.record {
        item.insert("audit_record".to_owned(), s(r));
    }
    if let Some(r) = &e.run {
        item.insert("audit_run".to_owned(), s(cond::bounded(r)));
    }
    item
}

/// The entry's item in its month partition.
pub fn entry_item(e: &AuditEntry, days: u32) -> Item {
    fields(e, entry_key(e), days)
}

/// The entry's copy in its record's partition: a history item too (`kind`,
/// `detail`), so `show` lists it with the record's other history.
pub fn record_item(e: &AuditEntry, record: &str, days: u32) -> Item {
    let mut item = fields(e, record_key(e, record), days);
    item.insert("kind".to_owned(), s(&e.verb));
    item.insert("detail".to_owned(), s(cond::bounded(&e.detail())));
    item
}

/// An entry read back from either of its items.
pub fn entry_of(item: &Item) -> Option<AuditEntry> {
    Some(AuditEntry {
        id: get_s(item, "audit_id")?.to_owned(),
        at_ms: get_n(item, "at")?,
        verb: get_s(item, "audit_verb").unwrap_or_default().to_owned(),
        target: get_s(item, "audit_target").unwrap_or_default().to_owned(),
        record: get_s(item, "audit_record").map(str::to_owned),
        principal: get_s(item, "principal").unwrap_or_default().to_owned(),
        operator: get_s(item, "operator").unwrap_or_default().to_owned(),
        reason: get_s(item, "audit_reason").unwrap_or_default().to_owned(),
        result: get_s(item, "audit_result").unwrap_or_default().to_owned(),
        run: get_s(item, "audit_run").map(str::to_owned),
    })
}

fn put_once(table: &str, item: Item) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression(cond::AUDIT_ENTRY)
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .build()
        .unwrap_or_else(|e| unreachable!("table and item are set: {e}"));
    TransactWriteItem::builder().put(put).build()
}

/// A conditions.rs update as a transaction item (returning the item it met
/// when refused).
pub fn update_item(table: &str, pk: &str, sk: &str, u: cond::Update) -> TransactWriteItem {
    let key = HashMap::from([("pk".to_owned(), s(pk)), ("sk".to_owned(), s(sk))]);
    let update = u
        .transact(table, key)
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .build()
        .unwrap_or_else(|e| unreachable!("table, key and expressions are set: {e}"));
    TransactWriteItem::builder().update(update).build()
}

/// The entry of an action on a record, as the adapter writes it: the
/// call's token its id, written now, on the record.
pub fn on_record(entry: &AuditEntry, verb: &str, key: &EventKey, token: &str, now_ms: i64) -> AuditEntry {
    AuditEntry {
        id: token.to_owned(),
        at_ms: now_ms,
        verb: verb.to_owned(),
        target: key.as_str().to_owned(),
        record: Some(key.as_str().to_owned()),
        ..entry.clone()
    }
}

/// The entry's puts as transaction items (its month's, and its record's).
pub fn entry_puts(table: &str, e: &AuditEntry, days: u32) -> Vec<TransactWriteItem> {
    let mut items = vec![put_once(table, entry_item(e, days))];
    if let Some(record) = &e.record {
        items.push(put_once(table, record_item(e, record, days)));
    }
    items
}

/// What an audited action's transaction did.
#[derive(Debug, Clone, PartialEq)]
pub enum Audited {
    /// The action and its entry were written (now, or by our earlier attempt).
    Done,
    /// The action's own condition refused it; nothing was written. Each of
    /// the action's items: `None` passed, `Some(met)` refused (the item met,
    /// empty when the store did not return it).
    Refused(Vec<Option<Item>>),
}

/// Reads a cancelled audited transaction: the entry's existence decides.
pub(crate) fn audited_outcome(
    entry_exists: bool,
    codes: &[&str],
    met: Vec<Option<Item>>,
    actions: usize,
) -> Result<Audited, PortError> {
    if entry_exists {
        return Ok(Audited::Done);
    }
    if codes.contains(&"TransactionConflict") {
        return Err(PortError::Unavailable {
            service: "dynamodb",
            message: "TransactionConflict: another write held the item; try again".into(),
        });
    }
    let refused = codes
        .iter()
        .zip(met)
        .take(actions)
        .map(|(code, met)| (*code == "ConditionalCheckFailed").then(|| met.unwrap_or_default()))
        .collect();
    Ok(Audited::Refused(refused))
}

impl DynamoLedger {
    /// How long the audit entries it writes are kept.
    pub fn with_audit_retention(mut self, days: u32) -> Self {
        self.audit_days = days;
        self
    }

    /// One audited action: `actions` (the action's own transaction items)
    /// and the entry's puts, in one transaction.
    pub(crate) async fn audited(
        &self,
        actions: Vec<TransactWriteItem>,
        entry: &AuditEntry,
    ) -> Result<Audited, PortError> {
        let count = actions.len();
        let mut items = actions;
        items.extend(entry_puts(self.table(), entry, self.audit_days));
        let result = self
            .client()
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(&entry.id)
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Audited::Done),
            Err(e) => e,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancel)) = err.as_service_error() else {
            return Err(port_error("dynamodb", &err));
        };
        let codes: Vec<&str> = cancel.cancellation_reasons().iter().map(|r| r.code().unwrap_or("None")).collect();
        let met: Vec<Option<Item>> = cancel.cancellation_reasons().iter().map(|r| r.item().cloned()).collect();
        let (pk, sk) = entry_key(entry);
        let exists = self.read_item(&pk, &sk).await?.is_some();
        audited_outcome(exists, &codes, met, count)
    }

    /// A write outside the records (a subject's mapping) and its audit
    /// entry, as one transaction. `Ok(false)`: the write's own condition
    /// refused it (and no entry was written).
    pub async fn apply_audited(&self, w: &crate::projection::Write, entry: &AuditEntry) -> Result<bool, PortError> {
        Ok(matches!(self.audited(vec![super::item::transact(self.table(), w)], entry).await?, Audited::Done))
    }

    async fn audit_query(
        &self,
        pk: &str,
        lo: &str,
        hi: &str,
        start: Option<Item>,
        limit: Option<i32>,
    ) -> Result<(Vec<Item>, Option<Item>), PortError> {
        let out = self
            .client()
            .query()
            .table_name(self.table())
            .key_condition_expression("pk = :pk AND sk BETWEEN :lo AND :hi")
            .expression_attribute_values(":pk", s(pk))
            .expression_attribute_values(":lo", s(lo))
            .expression_attribute_values(":hi", s(hi))
            .consistent_read(true)
            .set_limit(limit)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok((out.items.unwrap_or_default(), out.last_evaluated_key))
    }
}

/// The sort-key range of a page: from `since_ms` (or just after `after`) to
/// `until_ms`. Sort keys are of one length, so `after` followed by `~` (above
/// every id character) is above `after` and below every later key.
pub fn page_range(since_ms: i64, until_ms: i64, after: Option<&str>) -> (String, String) {
    let from = cursor(since_ms, "");
    let lo = match after {
        Some(a) if a.to_owned() + "~" > from => format!("{a}~"),
        _ => from,
    };
    (lo, format!("{:013}#~", until_ms.max(0)))
}

/// The sort-key range of a record's audit entries (its history items).
pub fn record_range() -> (String, String) {
    (RECORD_PREFIX.to_owned(), format!("{RECORD_PREFIX}~"))
}

impl AuditLog for DynamoLedger {
    async fn audit_page(
        &self,
        since_ms: i64,
        until_ms: i64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<AuditPage, PortError> {
        let limit = limit.clamp(1, 1_000);
        let (since_ms, until_ms) = crate::audit::kept_window(since_ms, until_ms, self.audit_days);
        let (lo, hi) = page_range(since_ms, until_ms, after);
        let mut entries = Vec::new();
        for m in months(since_ms, until_ms) {
            let pk = audit_pk(&m);
            let mut start = None;
            loop {
                let want = (limit - entries.len()) as i32;
                let (items, next) = self.audit_query(&pk, &lo, &hi, start.take(), Some(want)).await?;
                entries.extend(items.iter().filter_map(entry_of));
                if entries.len() >= limit {
                    let next = entries.last().map(AuditEntry::cursor);
                    return Ok(AuditPage { entries, next });
                }
                match next {
                    Some(k) => start = Some(k),
                    None => break,
                }
            }
        }
        Ok(AuditPage { entries, next: None })
    }

    async fn audit_of(&self, key: &EventKey) -> Result<Vec<AuditEntry>, PortError> {
        let (lo, hi) = record_range();
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let (items, next) = self.audit_query(key.as_str(), &lo, &hi, start.take(), None).await?;
            out.extend(
                items.iter().filter(|i| get_s(i, "sk").is_some_and(|sk| sk.contains(RECORD_MARK))).filter_map(entry_of),
            );
            match next {
                Some(k) => start = Some(k),
                None => return Ok(out),
            }
        }
    }

    async fn audit_begin(&self, entry: &AuditEntry) -> Result<(), PortError> {
        let mut entry = entry.clone();
        entry.result = STARTED.to_owned();
        match self.audited(Vec::new(), &entry).await? {
            // Refused with no action of its own: the entry is there (ours).
            Audited::Done | Audited::Refused(_) => Ok(()),
        }
    }

    async fn audit_end(&self, entry: &AuditEntry, result: &str) -> Result<(), PortError> {
        let mut keys = vec![entry_key(entry)];
        if let Some(r) = &entry.record {
            keys.push(record_key(entry, r));
        }
        for (pk, sk) in keys {
            // Refused: no such entry (its begin failed) or another outcome
            // already recorded; neither is overwritten.
            self.conditional_ok(&pk, &sk, cond::audit_end(&cond::bounded(result))).await?;
        }
        Ok(())
    }

    fn audit_id(&self) -> String {
        self.ambient.token()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Caller;

    fn entry() -> AuditEntry {
        AuditEntry::new(
            "tok",
            1_796_079_600_000,
            "replay",
            "stripe/ep/evt_1",
            &Caller::new("arn:aws:iam::1:user/a", "a"),
        )
        .on_record(&EventKey::new("stripe", "ep", "evt_1"))
        .because("fixed")
    }

    #[test]
    fn an_entry_reads_back_from_both_its_items() {
        let e = entry();
        let month = entry_item(&e, 400);
        let record = record_item(&e, e.record.as_deref().unwrap_or_default(), 400);
        assert_eq!(get_s(&month, "pk"), Some("audit#2026-11"));
        assert_eq!(entry_of(&month).as_ref(), Some(&e));
        assert_eq!(entry_of(&record).as_ref(), Some(&e));
        assert!(get_s(&record, "sk").is_some_and(|sk| sk.starts_with("hist#") && sk.contains(RECORD_MARK)));
        // Kept for the audit retention, not the records'.
        assert_eq!(get_n(&month, "expires_at"), Some(1_796_079_600 + 400 * 86_400));
    }

    #[test]
    fn a_page_starts_after_its_cursor_and_ends_at_until() {
        let (lo, hi) = page_range(1_000, 5_000, None);
        assert!(lo <= cursor(1_000, "a") && cursor(5_000, "zz") <= hi);
        assert!(cursor(999, "z") < lo && hi < cursor(5_001, "0"));
        let after = cursor(2_000, "abc");
        let (lo, _) = page_range(1_000, 5_000, Some(&after));
        assert!(after < lo && lo < cursor(2_000, "abd") && lo < cursor(2_001, "0"));
        // A cursor before `since` does not widen the window.
        let (lo, _) = page_range(3_000, 5_000, Some(&cursor(2_000, "x")));
        assert_eq!(lo, cursor(3_000, ""));
    }

    #[test]
    fn a_cancelled_transaction_whose_entry_exists_was_ours() {
        let met = vec![Some(Item::new()), None, None];
        let codes = ["ConditionalCheckFailed", "None", "None"];
        assert_eq!(audited_outcome(true, &codes, met.clone(), 1).ok(), Some(Audited::Done));
        assert_eq!(
            audited_outcome(false, &codes, met.clone(), 1).ok(),
            Some(Audited::Refused(vec![Some(Item::new())]))
        );
        assert!(audited_outcome(false, &["TransactionConflict", "None", "None"], met, 1).is_err());
    }
}
