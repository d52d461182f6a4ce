//! Subject mapping: which of our accounts a provider subject (a Stripe
//! customer, say) belongs to, per tenant. An event for an unmapped subject is
//! parked — recorded, bounded, and nothing is mutated — until the mapping
//! exists and an operator replays it.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::projection::{ProjectionContext, ProjectionError, STATE_SK, get_s};

pub fn subject_pk(provider: &str, tenant: &str, subject: &str) -> String {
    format!("subject#{provider}#{tenant}#{subject}")
}

/// The account a subject maps to, if any.
pub async fn account_for(
    cx: &ProjectionContext,
    provider: &str,
    tenant: &str,
    subject: &str,
) -> Result<Option<String>, ProjectionError> {
    Ok(cx
        .read_state(&subject_pk(provider, tenant, subject))
        .await?
        .and_then(|i| get_s(&i, "account").map(str::to_owned)))
}

/// Writes a mapping (used by operators, tests and the demo).
pub async fn map_subject(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    provider: &str,
    tenant: &str,
    subject: &str,
    account: &str,
) -> Result<(), String> {
    ddb.put_item()
        .table_name(table)
        .set_item(Some(HashMap::from([
            ("pk".to_owned(), AttributeValue::S(subject_pk(provider, tenant, subject))),
            ("sk".to_owned(), AttributeValue::S(STATE_SK.to_owned())),
            ("account".to_owned(), AttributeValue::S(account.to_owned())),
        ])))
        .send()
        .await
        .map_err(|e| crate::ledger::error_chain(&e))?;
    Ok(())
}
