//! The AWS operations each function makes, read from the fault plan's
//! trace: what `infra/iam-actions.json` records and
//! `infra/check_template.py` turns into the IAM actions each function's
//! policy must grant (and may grant, no more).
//!
//! A call is attributed to a function by the plan's scope: `intake`,
//! `processor` and `reconciler` are the functions; `dispatcher` (the outbox
//! dispatcher) runs in both the processor (after a commit) and the
//! reconciler (the outbox sweep). Other scopes (the operator's CLI, the test
//! harness) are not functions and are not recorded.
//!
//! Each operation is recorded with the kinds of resource it touches:
//! `table`, `index:<name>` (a query on a global index), `table:<Put|Update|
//! ConditionCheck|Delete>` (the items of a `TransactWriteItems`, which IAM
//! authorises item by item), `queue`, `topic`, `bucket`, `parameter` and
//! `keys` (the key table of sealed payloads),
//! `parameter:secretsmanager` (an SSM reference to a Secrets Manager secret)
//! and `parameter:handshake` (a secret handed over at a handshake, under
//! `HOOKLEDGER_HANDSHAKE_PATH`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::faults::{Call, FaultPlan};

/// Function → operation (`service:Operation`) → resource kinds.
pub type Actions = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Where the recorded operations are committed.
pub fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../infra/iam-actions.json")
}

/// The functions a call in `scope` runs in.
pub fn functions_of(scope: &str) -> &'static [&'static str] {
    match scope {
        "intake" => &["intake"],
        "processor" => &["processor"],
        "reconciler" => &["reconciler"],
        "dispatcher" => &["processor", "reconciler"],
        _ => &[],
    }
}

/// The resource kinds one call touches.
pub fn resources(call: &Call) -> Vec<String> {
    let body = || serde_json::from_str::<serde_json::Value>(&call.body).unwrap_or_default();
    match (call.service, call.operation.as_str()) {
        // The key table of sealed payloads (`<table>-keys` in the recorded runs).
        ("dynamodb", _) if body()["TableName"].as_str().is_some_and(|t| t.ends_with("-keys")) => vec!["keys".into()],
        ("dynamodb", "TransactWriteItems") => {
            let v = body();
            let kinds: BTreeSet<String> = v["TransactItems"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|item| item.as_object()?.keys().next().map(|k| format!("table:{k}")))
                .collect();
            kinds.into_iter().collect()
        }
        ("dynamodb", "Query" | "Scan") => match body()["IndexName"].as_str() {
            Some(index) => vec![format!("index:{index}")],
            None => vec!["table".into()],
        },
        ("dynamodb", _) => vec!["table".into()],
        // A route's destinations are named `dest-…` by the recorded runs.
        ("sqs", _)
            if body()["QueueUrl"]
                .as_str()
                .is_some_and(|u| u.rsplit('/').next().is_some_and(|n| n.starts_with("dest-"))) =>
        {
            vec!["destination".into()]
        }
        // The delivery queue is named `deliveries-…` by the recorded runs.
        ("sqs", _)
            if body()["QueueUrl"]
                .as_str()
                .is_some_and(|u| u.rsplit('/').next().is_some_and(|n| n.starts_with("deliveries-"))) =>
        {
            vec!["deliveries".into()]
        }
        ("sqs", _) => vec!["queue".into()],
        ("sns", _) if call.body.contains(":dest-") || call.body.contains("%3Adest-") => vec!["destination".into()],
        ("sns", _) => vec!["topic".into()],
        ("events", _) => vec!["destination".into()],
        ("s3", _) => vec!["bucket".into()],
        ("ssm", _) => match body()["Name"].as_str() {
            Some(name) if name.starts_with("/aws/reference/secretsmanager/") => {
                vec!["parameter:secretsmanager".into()]
            }
            // A secret a provider hands over at a handshake (HOOKLEDGER_HANDSHAKE_PATH).
            Some(name) if name.contains("/handshake/") => vec!["parameter:handshake".into()],
            _ => vec!["parameter".into()],
        },
        (_, _) => vec!["other".into()],
    }
}

/// Adds every call of `trace` made by a function to `into`.
pub fn observe(trace: &[Call], into: &mut Actions) {
    for call in trace {
        for function in functions_of(&call.scope) {
            let op = into
                .entry((*function).to_owned())
                .or_default()
                .entry(format!("{}:{}", call.service, call.operation))
                .or_default();
            op.extend(resources(call));
        }
    }
}

/// The committed file, read once per process.
pub fn committed() -> &'static Actions {
    static COMMITTED: OnceLock<Actions> = OnceLock::new();
    COMMITTED.get_or_init(|| {
        let p = path();
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    })
}

/// What `observed` has that `listed` lacks, one line each.
pub fn missing(observed: &Actions, listed: &Actions) -> Vec<String> {
    let mut out = Vec::new();
    for (function, ops) in observed {
        for (op, kinds) in ops {
            for kind in kinds {
                let have = listed.get(function).and_then(|o| o.get(op)).is_some_and(|k| k.contains(kind));
                if !have {
                    out.push(format!("{function}: {op} on {kind}"));
                }
            }
        }
    }
    out
}

/// Fails when a function made an operation `infra/iam-actions.json` does
/// not list: its policy, checked against that file, may not allow it.
/// (Not while the file is being rewritten: `HOOKLEDGER_BLESS=1`.)
pub fn assert_listed(plan: &FaultPlan) {
    if std::env::var("HOOKLEDGER_BLESS").is_ok_and(|v| v == "1") {
        return;
    }
    let mut observed = Actions::new();
    observe(&plan.trace(), &mut observed);
    let missing = missing(&observed, committed());
    assert!(
        missing.is_empty(),
        "operations missing from infra/iam-actions.json (and so perhaps from the functions' policies):\n{}\n\
         rewrite the file with HOOKLEDGER_BLESS=1 and iam::iam_actions_are_the_ones_the_code_makes, \
         then run scripts/check-template",
        missing.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(scope: &str, service: &'static str, operation: &str, body: &str) -> Call {
        Call {
            scope: scope.into(),
            service,
            operation: operation.into(),
            op_index: 0,
            attempt: 1,
            fault: None,
            body: body.into(),
        }
    }

    #[test]
    fn transactions_are_recorded_by_their_items_queries_by_their_index_and_references_by_their_store() {
        let trace = [
            call(
                "processor",
                "dynamodb",
                "TransactWriteItems",
                r#"{"TransactItems": [{"Update": {}}, {"Put": {}}, {"Update": {}}]}"#,
            ),
            call("reconciler", "dynamodb", "Query", r#"{"IndexName": "due"}"#),
            call("dispatcher", "sns", "Publish", "Action=Publish"),
            call("intake", "ssm", "GetParameter", r#"{"Name": "/aws/reference/secretsmanager/hl/x"}"#),
            call("operator", "dynamodb", "DeleteItem", "{}"),
        ];
        let mut got = Actions::new();
        observe(&trace, &mut got);
        let kinds = |f: &str, op: &str| got[f][op].iter().cloned().collect::<Vec<_>>();
        assert_eq!(kinds("processor", "dynamodb:TransactWriteItems"), ["table:Put", "table:Update"]);
        assert_eq!(kinds("reconciler", "dynamodb:Query"), ["index:due"]);
        assert_eq!(kinds("processor", "sns:Publish"), ["topic"]);
        assert_eq!(kinds("reconciler", "sns:Publish"), ["topic"]);
        assert_eq!(kinds("intake", "ssm:GetParameter"), ["parameter:secretsmanager"]);
        assert!(!got.contains_key("operator"));
        let mut listed = got.clone();
        assert!(missing(&got, &listed).is_empty());
        listed.get_mut("processor").unwrap().get_mut("dynamodb:TransactWriteItems").unwrap().remove("table:Put");
        assert_eq!(missing(&got, &listed), ["processor: dynamodb:TransactWriteItems on table:Put"]);
    }
}
