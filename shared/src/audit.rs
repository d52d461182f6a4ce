//! The operator audit log: one entry per operator write (who, as AWS
//! reports the caller, and the name they gave; when; what; why; the
//! result), listable by time and by record, kept longer than records.
//!
//! Two kinds of entry:
//! - an **action** (replay, park, resolve, a delivery's replay, a subject's
//!   mapping) is one write to the ledger, and its entry is written in the
//!   same transaction: the entry exists if and only if the action happened;
//!   a retry after a lost acknowledgement finds its own entry (its id is
//!   the call's token) and knows the action is done;
//! - a **run** (migrate, backfill, a release fetched from the provider,
//!   arming a handshake, an SNS dead-letter replay) touches more than one
//!   item or another service: its entry is written before the run starts
//!   (`result = started`) and completed with its outcome after. An entry left
//!   `started` says the run began and its end was not recorded (the command
//!   died or lost the ledger): run it again; every run is safe to repeat.
//!
//! Layout (adapters): each entry in a month partition (`pk = audit#YYYY-MM`,
//! `sk = <ms, 13 digits>#<id>`), read by time with one query per month of the
//! window, paged; an action on a record also as a history item in the
//! record's partition (`sk = hist#…`, what `show` lists), read by record with
//! one query. Both expire after the audit retention, not the records'.

use crate::identity::EventKey;

/// The verbs written to the audit log (the CLI's and the console's).
pub mod verb {
    pub const REPLAY: &str = "replay";
    pub const PARK: &str = "park";
    pub const RESOLVE: &str = "resolve";
    pub const RELEASE: &str = "release";
    pub const DELIVERY_REPLAY: &str = "deliveries-replay";
    pub const MAP_SUBJECT: &str = "map-subject";
    pub const ARM: &str = "arm";
    pub const MIGRATE: &str = "migrate";
    pub const BACKFILL: &str = "backfill";
    pub const REPLAY_SNS: &str = "replay-sns";
    pub const ERASE: &str = "erase";
}

/// A run's entry before its outcome is known.
pub const STARTED: &str = "started";
/// An action's entry (written with the action itself).
pub const DONE: &str = "done";

/// How long entries are kept unless configured (`AuditRetentionDays`).
pub const DEFAULT_AUDIT_RETENTION_DAYS: u32 = 400;

/// Who is writing: the caller as AWS reports it (`sts:GetCallerIdentity`'s
/// ARN) and the name the operator gave (`--operator`, else `$USER`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caller {
    pub principal: String,
    pub operator: String,
}

impl Caller {
    pub fn new(principal: impl Into<String>, operator: impl Into<String>) -> Self {
        Self { principal: principal.into(), operator: operator.into() }
    }

    /// A caller known by name only (tests, simulations), its principal
    /// `name:<name>`.
    pub fn named(operator: &str) -> Self {
        Self::new(format!("name:{operator}"), operator)
    }
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct AuditEntry {
    /// Unique: the writing call's token.
    pub id: String,
    pub at_ms: i64,
    pub verb: String,
    /// What it acted on: a record's key, a delivery, an endpoint, a subject.
    pub target: String,
    /// The record it acted on, when it acted on one (listable by record).
    pub record: Option<String>,
    pub principal: String,
    pub operator: String,
    pub reason: String,
    /// [`DONE`] for an action; [`STARTED`] then the outcome for a run.
    pub result: String,
    /// The bulk run this action belongs to (`replay --filter`): a record
    /// replayed by a run is never replayed again by the same run.
    pub run: Option<String>,
}

impl AuditEntry {
    /// An entry of `caller` doing `verb` on `target` at `at_ms`.
    pub fn new(id: impl Into<String>, at_ms: i64, verb: &str, target: impl Into<String>, caller: &Caller) -> Self {
        Self {
            id: id.into(),
            at_ms,
            verb: verb.to_owned(),
            target: target.into(),
            record: None,
            principal: caller.principal.clone(),
            operator: caller.operator.clone(),
            reason: String::new(),
            result: DONE.to_owned(),
            run: None,
        }
    }

    /// Part of the bulk run `run`.
    pub fn in_run(mut self, run: &str) -> Self {
        self.run = Some(run.to_owned());
        self
    }

    pub fn on_record(mut self, key: &EventKey) -> Self {
        self.record = Some(key.as_str().to_owned());
        self
    }

    pub fn because(mut self, reason: &str) -> Self {
        self.reason = reason.to_owned();
        self
    }

    pub fn at(mut self, at_ms: i64) -> Self {
        self.at_ms = at_ms;
        self
    }

    pub fn started(mut self) -> Self {
        self.result = STARTED.to_owned();
        self
    }

    /// Its place in the log: the sort key within its month.
    pub fn cursor(&self) -> String {
        cursor(self.at_ms, &self.id)
    }

    /// A record's history line for it (what `show` prints).
    pub fn detail(&self) -> String {
        if self.principal == format!("name:{}", self.operator) {
            // No identity beyond the name given: said once.
            return format!("by {}: {}", self.operator, self.reason);
        }
        format!("by {} ({}): {}", self.operator, self.principal, self.reason)
    }
}

/// The sort key of an entry written at `at_ms` with `id`.
pub fn cursor(at_ms: i64, id: &str) -> String {
    format!("{:013}#{id}", at_ms.max(0))
}

/// One page of the log, oldest first; `next` continues after it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    pub next: Option<String>,
}

/// The part of a window entries kept `days` can be in: no earlier than
/// `days` (and two days of TTL's lag) before its end.
pub fn kept_window(since_ms: i64, until_ms: i64, days: u32) -> (i64, i64) {
    let earliest = until_ms.saturating_sub((i64::from(days) + 2) * 86_400_000);
    (since_ms.max(earliest), until_ms)
}

/// The month partitions (`YYYY-MM`, UTC) a window touches, oldest first.
pub fn months(since_ms: i64, until_ms: i64) -> Vec<String> {
    let (mut y, mut m) = year_month(since_ms.max(0));
    let (y1, m1) = year_month(until_ms.max(since_ms).max(0));
    let mut out = Vec::new();
    while (y, m) <= (y1, m1) {
        out.push(format!("{y:04}-{m:02}"));
        (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    }
    out
}

/// The month (UTC) a time falls in.
pub fn month(at_ms: i64) -> String {
    let (y, m) = year_month(at_ms.max(0));
    format!("{y:04}-{m:02}")
}

fn year_month(at_ms: i64) -> (i64, u32) {
    // Days since the epoch to a civil date (Howard Hinnant's algorithm).
    let z = at_ms.div_euclid(86_400_000) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_cover_the_window_across_a_year_end() {
        // 2026-11-30T23:00Z .. 2027-01-01T00:00Z
        let since = 1_796_079_600_000;
        let until = 1_798_761_600_000;
        assert_eq!(months(since, until), ["2026-11", "2026-12", "2027-01"]);
        assert_eq!(months(since, since), ["2026-11"]);
        assert_eq!(month(0), "1970-01");
        // The last millisecond of February in a leap year.
        assert_eq!(month(1_709_251_199_999), "2024-02");
        assert_eq!(month(1_709_251_200_000), "2024-03");
    }

    #[test]
    fn a_window_is_read_only_where_entries_are_kept() {
        let day = 86_400_000;
        assert_eq!(kept_window(0, 1_000 * day, 400), (598 * day, 1_000 * day));
        assert_eq!(kept_window(990 * day, 1_000 * day, 400), (990 * day, 1_000 * day));
        // At most 14 month partitions, whatever the window asked.
        let (since, until) = kept_window(0, 1_800_000_000_000, 400);
        assert!(months(since, until).len() <= 15);
    }

    #[test]
    fn the_detail_names_the_principal_when_aws_reported_one() {
        let arn = Caller::new("arn:aws:sts::123456789012:assumed-role/ops/ana", "ana");
        let e = AuditEntry::new("id", 0, verb::REPLAY, "k", &arn).because("rule fixed");
        assert_eq!(e.detail(), "by ana (arn:aws:sts::123456789012:assumed-role/ops/ana): rule fixed");
        let named = AuditEntry::new("id", 0, verb::REPLAY, "k", &Caller::named("ana")).because("rule fixed");
        assert_eq!(named.detail(), "by ana: rule fixed", "a name alone is said once");
    }

    #[test]
    fn cursors_sort_by_time_then_id() {
        let a = cursor(999, "b");
        let b = cursor(1_000, "a");
        assert!(a < b, "{a} before {b}");
        assert!(cursor(1_000, "a") < cursor(1_000, "b"));
    }
}
