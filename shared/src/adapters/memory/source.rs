//! A provider's list of the events it sent, in memory: newest first, pages
//! of `per_page` whose cursor is the page's last id, bodies listed or
//! fetched one by one, redeliveries asked for, and scripted failures.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::ports::{BackfillSource, SourceError, SourceEvent, SourcePage, Window};
use crate::projection::fetch::{Fetched, ProviderError, Subscription, SubscriptionFuture, SubscriptionSource};

#[derive(Default)]
pub struct SourceState {
    pub events: Vec<SourceEvent>,
    /// What the next page calls answer, in order (`None`: the page).
    pub script: Vec<Option<SourceError>>,
    pub pages: u32,
    /// Event ids whose bodies were fetched one by one.
    pub fetched: Vec<String>,
    /// Handles whose redelivery was asked for.
    pub redelivered: Vec<String>,
    /// What fetching an event's body answers, by event id.
    pub refusals: HashMap<String, SourceError>,
}

/// A provider source; `origin`: where it reads (GitHub's hook path).
pub struct MemSource {
    state: Mutex<SourceState>,
    per_page: usize,
    origin: Option<String>,
}

impl MemSource {
    /// `n` events `evt_000`.. (created at 1,000 s + i), newest first, with
    /// JSON bodies in the list.
    pub fn numbered(n: usize, per_page: usize) -> Self {
        let events = (0..n)
            .rev()
            .map(|i| SourceEvent {
                event_id: format!("evt_{i:03}"),
                event_type: Some(if i % 3 == 0 { "charge.refunded" } else { "invoice.paid" }.into()),
                created_s: 1_000 + i as i64,
                body: Some(format!(r#"{{"id":"evt_{i:03}","object":"event"}}"#).into_bytes()),
                handle: Some(format!("d{i}")),
            })
            .collect();
        Self::new(events, per_page)
    }

    pub fn new(events: Vec<SourceEvent>, per_page: usize) -> Self {
        Self {
            state: Mutex::new(SourceState { events, ..SourceState::default() }),
            per_page: per_page.max(1),
            origin: Some("repos/o/r/hooks/1".into()),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, SourceState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fetching `id`'s body answers `e` (and the list carries no body for it).
    pub fn refuse(&self, id: &str, e: SourceError) {
        self.without_body(id);
        self.state().refusals.insert(id.to_owned(), e);
    }

    pub fn without_body(&self, id: &str) {
        if let Some(e) = self.state().events.iter_mut().find(|e| e.event_id == id) {
            e.body = None;
        }
    }

    pub fn listed_body(&self, id: &str, body: &[u8]) {
        if let Some(e) = self.state().events.iter_mut().find(|e| e.event_id == id) {
            e.body = Some(body.to_vec());
        }
    }

    pub fn fail_next(&self, errors: Vec<Option<SourceError>>) {
        self.state().script = errors;
    }
}

impl BackfillSource for MemSource {
    async fn page(&self, window: &Window, cursor: Option<&str>) -> Result<SourcePage, SourceError> {
        let mut st = self.state();
        st.pages += 1;
        if !st.script.is_empty()
            && let Some(e) = st.script.remove(0)
        {
            return Err(e);
        }
        let matching: Vec<&SourceEvent> =
            st.events.iter().filter(|e| (window.since_s..window.until_s).contains(&e.created_s)).collect();
        let start = cursor.map_or(0, |c| matching.iter().position(|e| e.event_id == c).map_or(0, |i| i + 1));
        let page: Vec<SourceEvent> = matching.iter().skip(start).take(self.per_page).map(|e| (*e).clone()).collect();
        let next = (start + page.len() < matching.len()).then(|| page.last().map(|e| e.event_id.clone())).flatten();
        Ok(SourcePage { events: page, next })
    }

    async fn body(&self, event: &SourceEvent) -> Result<Vec<u8>, SourceError> {
        let mut st = self.state();
        st.fetched.push(event.event_id.clone());
        if let Some(e) = st.refusals.get(&event.event_id) {
            return Err(e.clone());
        }
        Ok(format!(r#"{{"fetched":"{}"}}"#, event.event_id).into_bytes())
    }

    fn origin(&self) -> Option<String> {
        self.origin.clone()
    }

    async fn redeliver(&self, event: &SourceEvent) -> Result<(), SourceError> {
        self.state().redelivered.push(event.handle.clone().unwrap_or_default());
        Ok(())
    }
}

/// What the provider answers for one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It exists with this status and seat count.
    Is(String, i64),
    /// The provider no longer has it.
    Gone,
    /// The provider's API is down.
    Down,
}

/// A provider's subscriptions API (the drift checks' source): one answer per
/// subscription (`Gone` unless told), every fetch noted in order.
#[derive(Default)]
pub struct MemSubscriptions {
    answers: Mutex<HashMap<String, Answer>>,
    fetched: Mutex<Vec<String>>,
}

impl MemSubscriptions {
    pub fn answer(&self, id: &str, answer: Answer) {
        self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id.to_owned(), answer);
    }

    /// The subscriptions fetched, in order.
    pub fn fetched(&self) -> Vec<String> {
        self.fetched.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl SubscriptionSource for MemSubscriptions {
    fn subscription<'a>(&'a self, id: &'a str) -> SubscriptionFuture<'a> {
        self.fetched.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(id.to_owned());
        let answer = self
            .answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(id)
            .cloned()
            .unwrap_or(Answer::Gone);
        Box::pin(async move {
            match answer {
                Answer::Is(status, seats) => Ok(Fetched {
                    object: Some(Subscription { id: id.to_owned(), customer: "cus_1".into(), status, seats }),
                    version: 1,
                }),
                Answer::Gone => Ok(Fetched { object: None, version: 1 }),
                Answer::Down => Err(ProviderError::Unavailable("the provider's API is down (memory world)".into())),
            }
        })
    }
}
