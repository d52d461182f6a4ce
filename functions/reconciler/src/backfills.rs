//! The scheduled backfills (`HOOKLEDGER_BACKFILL`, endpoint → schedule):
//! each invocation reads every endpoint's due window from its provider's
//! API, in the time the reconciliation left. The provider clients and their
//! secrets (`HOOKLEDGER_STRIPE_API_KEY`, `HOOKLEDGER_GITHUB_TOKEN`, secret
//! references) are built when a run needs them, not at init. Bodies too
//! large for an item go to `HOOKLEDGER_PAYLOAD_BUCKET`, as the intake's do;
//! a body over `HOOKLEDGER_MAX_BACKFILL_BODY_BYTES` (default 25 MiB, at most
//! 64 MiB) is parked `too_large`. Every invocation with schedules sets the
//! gauges `backfill_failed_last_run` and `backfill_overdue_windows`. A
//! schedule with `audit_window_secs` is audited after its run
//! (`hookledger::completeness`, in the time left), and the audits that ran
//! set `audit_missing` and `audit_doubled`.

use std::time::Instant;

use hookledger::backfill::{self, Schedule, ScheduledRun, Summary, Target};
use hookledger::config::ConfigError;
use hookledger::wiring::Wiring;

pub struct Backfills {
    wiring: Wiring,
    ledger: hookledger::adapters::dynamodb::DynamoLedger,
}

/// One endpoint's run: its window and summary, or why it did not run, and
/// whether the endpoint is behind its bound after it ([`backfill::overdue`]).
#[derive(Debug, serde::Serialize)]
pub struct Ran {
    pub endpoint: String,
    pub window: Option<(i64, i64)>,
    pub summary: Option<Summary>,
    pub error: Option<String>,
    pub overdue: bool,
    /// The scheduled audit after it (`audit_window_secs`), if configured.
    pub audit: Option<Audited>,
}

/// One endpoint's scheduled audit: its window and counts, or why it failed.
#[derive(Debug, Default, serde::Serialize)]
pub struct Audited {
    pub window: (i64, i64),
    pub listed: u64,
    pub missing: u64,
    pub doubled: u64,
    pub dead: u64,
    pub error: Option<String>,
}

impl Backfills {
    /// The schedules, secrets and sources of the composition root's settings
    /// (validated there: each schedule has its provider's key or token).
    pub fn new(wiring: Wiring) -> Result<Self, ConfigError> {
        let ledger = wiring.ledger()?;
        Ok(Self { wiring, ledger })
    }

    pub fn is_empty(&self) -> bool {
        self.wiring.settings.backfill_schedules.is_empty()
    }

    /// Every endpoint's due window, while time is left. One endpoint's
    /// failure does not stop the others; its next run resumes. Sets the
    /// alarmed gauges ([`backfill::ALARMED_METRICS`]) when there are schedules.
    pub async fn run(&self, now_ms: i64, deadline: Instant) -> Vec<Ran> {
        let mut out = Vec::new();
        let schedules = &self.wiring.settings.backfill_schedules;
        for (endpoint, schedule) in schedules {
            let mut ran = Ran {
                endpoint: endpoint.clone(),
                window: None,
                summary: None,
                error: None,
                overdue: false,
                audit: None,
            };
            if self.wiring.ambient().past(deadline) {
                // Not run: still counted if it falls behind (a starved schedule alarms).
                ran.error = Some("not run: the invocation's time was used up".into());
                ran.overdue = self.overdue_now(endpoint, schedule, now_ms).await;
                out.push(ran);
                continue;
            }
            let Some(tenant) = self.wiring.settings.backfill_tenant(endpoint) else {
                // Checked when the settings were read; unreachable from there.
                ran.error = Some(format!("{endpoint} is not an endpoint of HOOKLEDGER_ENDPOINTS"));
                out.push(ran);
                continue;
            };
            let target = Target {
                provider: schedule.provider.as_str().to_owned(),
                endpoint: endpoint.clone(),
                tenant,
                retention_days: self.wiring.settings.retention_days,
                index_shards: self.ledger.shards(),
                mode: schedule.mode,
                payload: self.wiring.settings.payload_policy(endpoint).unwrap_or_default(),
                erasable: self.wiring.settings.erasable(endpoint),
            };
            let built = match self.wiring.scheduled_source(schedule).await {
                Ok(source) => self.wiring.backfill(source, self.wiring.settings.backfill()).map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            let run = match built {
                Ok(b) => b.scheduled_run(&target, schedule, now_ms, deadline).await,
                Err(e) => ScheduledRun { ran: None, state: None, error: Some(e) },
            };
            let advanced = run.ran.as_ref().is_some_and(|(_, s)| s.complete);
            ran.overdue = match &run.state {
                Some(state) => backfill::overdue(state, schedule, now_ms / 1000, advanced),
                None => self.overdue_now(endpoint, schedule, now_ms).await,
            };
            if let Some((window, summary)) = run.ran {
                backfill::emit(endpoint, &window, &summary);
                ran.window = Some((window.since_s, window.until_s));
                ran.summary = Some(summary);
            }
            if let Some(e) = run.error {
                tracing::warn!(endpoint, error = %e, "scheduled backfill failed; the next run resumes");
                ran.error = Some(e);
            }
            if let Some(window_secs) = schedule.audit_window_secs {
                ran.audit = Some(self.audit(endpoint, &target, schedule, window_secs, now_ms, deadline).await);
            }
            out.push(ran);
        }
        // Only audits that ran set the gauges: one that could not keeps the
        // alarm's last state rather than report 0.
        let audited: Vec<&Audited> =
            out.iter().filter_map(|r| r.audit.as_ref()).filter(|a| a.error.is_none()).collect();
        if !audited.is_empty() {
            let missing = audited.iter().map(|a| a.missing).sum();
            let doubled = audited.iter().map(|a| a.doubled).sum();
            backfill::emit_audit_gauges(missing, doubled);
        }
        if !schedules.is_empty() {
            let (failed, overdue) = gauges(&out);
            backfill::emit_gauges(failed, overdue);
            if overdue > 0 {
                let behind: Vec<&str> = out.iter().filter(|r| r.overdue).map(|r| r.endpoint.as_str()).collect();
                tracing::warn!(endpoints = ?behind, "scheduled backfills behind their bound");
            }
        }
        out
    }

    /// The scheduled audit of `endpoint`: the window of `window_secs` that
    /// ends the schedule's lag before now, the provider's list against the
    /// ledger and the routes; its summary kept for the console. A failure
    /// is reported in the run, and the window is audited again next time.
    async fn audit(
        &self,
        endpoint: &str,
        target: &Target,
        schedule: &Schedule,
        window_secs: i64,
        now_ms: i64,
        deadline: Instant,
    ) -> Audited {
        use hookledger::completeness::{self, Audit, Scope};
        let until = now_ms / 1000 - schedule.lag_secs;
        let mut audited = Audited { window: (until - window_secs, until), ..Audited::default() };
        if self.wiring.ambient().past(deadline) {
            audited.error = Some("not run: the invocation's time was used up".into());
            return audited;
        }
        let scope = Scope {
            provider: &target.provider,
            endpoint,
            tenant: &target.tenant,
            since_s: until - window_secs,
            until_s: until,
            routes: &self.wiring.settings.routes,
            now_ms,
            types: Default::default(),
            repair_flags: match (&schedule.hook, &schedule.account) {
                (Some(hook), _) => format!(" --github-hook {hook}"),
                (None, Some(account)) => format!(" --account {account}"),
                (None, None) => String::new(),
            },
        };
        let outbox = hookledger::adapters::dynamodb::outbox::DynamoOutbox::on(self.ledger.clone());
        let audit = Audit { ledger: &self.ledger, outbox: &outbox };
        let window = hookledger::ports::Window { since_s: scope.since_s, until_s: until, types: Vec::new() };
        let report = match self.wiring.scheduled_source(schedule).await {
            Ok(source) => match completeness::listed_until(&source, &window, completeness::DEFAULT_MAX_PAGES, || {
                self.wiring.ambient().past(deadline)
            })
            .await
            {
                Ok((listed, pages, partial)) => {
                    audit.of_listed(&scope, &listed, pages, partial).await.map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e),
        };
        match report {
            Ok(report) => {
                (audited.listed, audited.missing, audited.doubled, audited.dead) =
                    (report.listed, report.missing, report.doubled, report.dead);
                let summary = serde_json::to_string(&report.summary()).unwrap_or_default();
                if let Err(e) =
                    hookledger::ports::BackfillLedger::save_audit(&self.ledger, endpoint, &summary, now_ms).await
                {
                    tracing::warn!(endpoint, error = %e, "audit summary not kept; the next run writes it");
                }
                if report.failed() {
                    tracing::warn!(
                        endpoint,
                        missing = report.missing,
                        doubled = report.doubled,
                        "audit: events missing or doubled"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(endpoint, error = %e, "scheduled audit failed; the next run audits again");
                audited.error = Some(e);
            }
        }
        audited
    }

    /// Whether `endpoint` is overdue by its stored state (one read; for an
    /// endpoint whose run did not get as far as reading it). Unreadable: not
    /// counted (logged).
    async fn overdue_now(&self, endpoint: &str, schedule: &Schedule, now_ms: i64) -> bool {
        match hookledger::ports::BackfillLedger::schedule_state(&self.ledger, endpoint).await {
            Ok(state) => backfill::overdue(&state.unwrap_or_default(), schedule, now_ms / 1000, false),
            Err(e) => {
                tracing::warn!(endpoint, error = %e, "backfill schedule unreadable; not counted as overdue");
                false
            }
        }
    }
}

/// The alarmed gauges of one invocation's scheduled backfills:
/// `backfill_failed_last_run` (events that failed or were parked, all
/// endpoints) and `backfill_overdue_windows` (endpoints [`backfill::overdue`]).
pub fn gauges(ran: &[Ran]) -> (u64, u64) {
    let failed = ran.iter().filter_map(|r| r.summary.as_ref()).map(|s| s.failed + s.parked).sum();
    let overdue = ran.iter().filter(|r| r.overdue).count() as u64;
    (failed, overdue)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(endpoint: &str, failed: u64, parked: u64, overdue: bool) -> Ran {
        let summary = Summary { failed, parked, ..Summary::default() };
        Ran { endpoint: endpoint.into(), window: None, summary: Some(summary), error: None, overdue, audit: None }
    }

    /// The alarmed gauges sum over every endpoint of the invocation.
    #[test]
    fn the_gauges_count_failed_and_parked_events_and_overdue_endpoints_of_all_endpoints() {
        let mut none = ran("c", 0, 0, true);
        none.summary = None;
        assert_eq!(gauges(&[ran("a", 1, 2, false), ran("b", 0, 3, true), none]), (6, 2));
        assert_eq!(gauges(&[]), (0, 0));
    }
}
