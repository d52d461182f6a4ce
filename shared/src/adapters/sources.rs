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
