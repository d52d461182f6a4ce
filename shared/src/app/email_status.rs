//! SES delivery status by precedence: send < delivery delay < delivery <
//! bounce / reject / rendering failure < complaint. A late `Delivery` never
//! overwrites a `Bounce`. Engagement events (open, click) are not statuses.

use std::collections::HashMap;

use super::str_field;
use crate::config::ProviderKind;
use crate::projection::precedence::advance;
use crate::projection::{Decision, EventContext, PlanFuture, Projection, ProjectionContext, n, s};

pub struct EmailStatus;

pub fn email_pk(tenant: &str, message_id: &str) -> String {
    format!("proj#email#{tenant}#{message_id}")
}

/// Rank of an SES status (`None`: not a delivery status).
pub fn rank(status: &str) -> Option<i64> {
    Some(match status {
        "Send" => 10,
        "DeliveryDelay" => 20,
        "Delivery" => 30,
        "Bounce" | "Reject" | "Rendering Failure" => 40,
        "Complaint" => 50,
        _ => return None,
    })
}

impl Projection for EmailStatus {
    fn name(&self) -> &'static str {
        "email_status"
    }

    fn handles(&self, provider: &str, event_type: &str) -> bool {
        provider == ProviderKind::SNS.as_str() && event_type.starts_with("ses.")
    }

    fn subject(&self, ev: &EventContext) -> Option<String> {
        ev.body["mail"]["messageId"].as_str().map(str::to_owned)
    }

    fn plan<'a>(&'a self, ev: &'a EventContext, cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let status = ev.event_type.trim_start_matches("ses.");
            let Some(rank) = rank(status) else {
                return Ok(Decision::Ignore("not a delivery status"));
            };
            let message_id = str_field(&ev.body, "/mail/messageId")?;
            let attrs = HashMap::from([
                ("status".to_owned(), s(status)),
                ("message_id".to_owned(), s(message_id)),
                ("event_id".to_owned(), s(&ev.event_id)),
                ("rank_value".to_owned(), n(rank)),
            ]);
            Ok(Decision::Apply(vec![advance(&cx.table, &email_pk(&ev.tenant, message_id), rank, &[], attrs)]))
        })
    }
}
