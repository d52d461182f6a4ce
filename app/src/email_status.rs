//! SES delivery status by precedence: send < delivery delay < delivery <
//! bounce / reject / rendering failure < complaint. A late `Delivery` never
//! overwrites a `Bounce`. Engagement events (open, click) are not statuses.

use hookledger::projection::precedence::advance;
use hookledger::projection::state::{required_n, required_s};
use hookledger::projection::{
    Decision, EventContext, Item, PlanFuture, Projection, ProjectionContext, ProjectionError, State, StateKey, n, s,
};

use super::{SNS, str_field};

pub struct EmailStatus;

pub fn email_pk(tenant: &str, message_id: &str) -> String {
    format!("proj#email#{tenant}#{message_id}")
}

/// Rank of an SES status (`None`: not a delivery status).
/// A message's delivery status as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub status: String,
    pub rank: i64,
}

impl State for Delivery {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        Ok(Self { status: required_s(item, "status")?.to_owned(), rank: required_n(item, "rank")? })
    }
}

pub fn email_key(tenant: &str, message_id: &str) -> StateKey<Delivery> {
    StateKey::new(email_pk(tenant, message_id))
}

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
        provider == SNS && event_type.starts_with("ses.")
    }

    fn subject(&self, ev: &EventContext) -> Option<String> {
        ev.body["mail"]["messageId"].as_str().map(str::to_owned)
    }

    fn plan<'a>(&'a self, ev: &'a EventContext, _cx: &'a ProjectionContext) -> PlanFuture<'a> {
        Box::pin(async move {
            let status = ev.event_type.trim_start_matches("ses.");
            let Some(rank) = rank(status) else {
                return Ok(Decision::Ignore("not a delivery status"));
            };
            let message_id = str_field(&ev.body, "/mail/messageId")?;
            let attrs = Item::from([
                ("status".to_owned(), s(status)),
                ("message_id".to_owned(), s(message_id)),
                ("event_id".to_owned(), s(&ev.event_id)),
                ("rank_value".to_owned(), n(rank)),
            ]);
            Ok(Decision::Apply(vec![advance(&email_pk(&ev.tenant, message_id), rank, &[], attrs)]))
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{Bench, event};

    fn ses(status: &str, id: &str) -> EventContext {
        event(SNS, &format!("ses.{status}"), id, json!({"eventType": status, "mail": {"messageId": "m-1"}}))
    }

    #[tokio::test]
    async fn a_status_never_regresses_and_a_later_one_wins_in_any_order() {
        let b = Bench::new();
        let key = email_key("t1", "m-1");
        assert!(b.project(&EmailStatus, &ses("Delivery", "n2")).await.1.is_empty());
        assert_eq!(b.project(&EmailStatus, &ses("Send", "n1")).await.1, [0], "Send after Delivery is stale");
        assert_eq!(b.read(&key).await.map(|d| d.status), Some("Delivery".to_owned()));
        assert!(b.project(&EmailStatus, &ses("Complaint", "n3")).await.1.is_empty());
        assert_eq!(b.project(&EmailStatus, &ses("Bounce", "n4")).await.1, [0], "a bounce after a complaint");
        assert_eq!(b.read(&key).await, Some(Delivery { status: "Complaint".into(), rank: 50 }));
    }

    #[tokio::test]
    async fn a_notification_that_is_not_a_delivery_status_is_ignored() {
        let b = Bench::new();
        let (decision, _) = b.project(&EmailStatus, &ses("Open", "n5")).await;
        assert!(matches!(decision, Decision::Ignore(_)), "{decision:?}");
        assert_eq!(b.read(&email_key("t1", "m-1")).await, None);
    }
}
