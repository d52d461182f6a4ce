//! Subject mapping: which of our accounts a provider subject (a Stripe
//! customer, say) belongs to, per tenant. An event for an unmapped subject is
//! parked — recorded, bounded, and nothing is mutated — until the mapping
//! exists and an operator replays it.

use hookledger::projection::state::required_s;
use hookledger::projection::{Item, ProjectionContext, ProjectionError, State, StateKey, Write, s};

/// A subject's mapping: the account it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub account: String,
}

impl State for Mapping {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        Ok(Self { account: required_s(item, "account")?.to_owned() })
    }
}

pub fn subject_pk(provider: &str, tenant: &str, subject: &str) -> String {
    format!("subject#{provider}#{tenant}#{subject}")
}

pub fn subject_key(provider: &str, tenant: &str, subject: &str) -> StateKey<Mapping> {
    StateKey::new(subject_pk(provider, tenant, subject))
}

/// The account a subject maps to, if any.
pub async fn account_for(
    cx: &ProjectionContext,
    provider: &str,
    tenant: &str,
    subject: &str,
) -> Result<Option<String>, ProjectionError> {
    Ok(cx.read(&subject_key(provider, tenant, subject)).await?.map(|m| m.account))
}

/// The write that maps a subject to an account (operators, tests and the
/// demo apply it; it replaces an earlier mapping).
pub fn mapping(provider: &str, tenant: &str, subject: &str, account: &str) -> Write {
    Write::put(&subject_pk(provider, tenant, subject), Item::from([("account".to_owned(), s(account))]))
}
