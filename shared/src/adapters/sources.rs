//! The backfill sources behind one type, for a deployment that backfills
//! endpoints of several providers (the reconciler's schedule).

use super::github::GithubDeliveries;
use super::stripe::StripeEvents;
use crate::ports::{BackfillSource, SourceError, SourceEvent, SourcePage, Window};

pub enum ProviderSource {
    Stripe(StripeEvents),
    Github(GithubDeliveries),
}

impl BackfillSource for ProviderSource {
    async fn page(&self, window: &Window, cursor: Option<&str>) -> Result<SourcePage, SourceError> {
        match self {
            Self::Stripe(s) => s.page(window, cursor).await,
            Self::Github(s) => s.page(window, cursor).await,
        }
    }

    async fn body(&self, event: &SourceEvent) -> Result<Vec<u8>, SourceError> {
        match self {
            Self::Stripe(s) => s.body(event).await,
            Self::Github(s) => s.body(event).await,
        }
    }

    async fn redeliver(&self, event: &SourceEvent) -> Result<(), SourceError> {
        match self {
            Self::Stripe(s) => s.redeliver(event).await,
            Self::Github(s) => s.redeliver(event).await,
        }
    }

    fn origin(&self) -> Option<String> {
        match self {
            Self::Stripe(s) => s.origin(),
            Self::Github(s) => s.origin(),
        }
    }
}

/// Reads an answer up to `limit` bytes; a longer one is `TooLarge`.
pub async fn read_bounded(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, SourceError> {
    let too_large = |n: u64| SourceError::Unfetchable {
        cause: crate::ports::Unfetchable::TooLarge,
        detail: format!("the answer ({n} bytes or more) exceeds the {limit} bytes a backfill reads"),
    };
    if let Some(n) = resp.content_length().filter(|n| *n > limit as u64) {
        return Err(too_large(n));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| SourceError::Unavailable(e.without_url().to_string()))? {
        if out.len() + chunk.len() > limit {
            return Err(too_large((out.len() + chunk.len()) as u64));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}
