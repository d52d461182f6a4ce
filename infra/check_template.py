"""Checks infra/template.yaml against the code and the house rules.

Usage: check_template.py TEMPLATE SCHEMA_JSON
  SCHEMA_JSON is the output of `hookledger schema` (what the code creates).

Asserts, each with a clear message:
- the table in the template is the table the code creates (keys, attribute
  definitions, both indexes, TTL), with on-demand billing, PITR and SSE;
- the work queue matches the code's visibility and redrive settings, and its
  visibility is at least 6 x the processor timeout;
- the processor's SQS event source reports batch item failures, with batch
  size <= 10 and a maximum concurrency;
- every function policy is least-privilege: no wildcard actions, no "*"
  resources for data services (DynamoDB, SQS, SNS, SSM, Secrets Manager);
- no secret value appears in the template;
- every alarm says how it treats missing data; alarms on the project's own
  metrics never read missing data as healthy (no `notBreaching`), name only
  metrics the code emits, and a heartbeat alarm on the reconciler's runs
  treats missing data as breaching.
"""

import json
import os
import sys

from cfnlint.decode import decode

DATA_SERVICES = ("dynamodb:", "sqs:", "sns:", "ssm:", "secretsmanager:", "kms:", "s3:")


def fail(msg):
    print(f"check_template: FAIL: {msg}")
    sys.exit(1)


def norm_keys(ks):
    return [(k["AttributeName"], k["KeyType"]) for k in ks]


def main():
    template_path, schema_path = sys.argv[1], sys.argv[2]
    template, matches = decode(template_path)
    if matches:
        fail(f"template does not parse: {matches}")
    schema = json.load(open(schema_path))
    res = template["Resources"]
    checks = 0

    table = res["LedgerTable"]["Properties"]
    want = schema["table"]
    if table["BillingMode"] != want["BillingMode"]:
        fail("table billing mode differs from the code")
    if norm_keys(table["KeySchema"]) != norm_keys(want["KeySchema"]):
        fail("table key schema differs from the code")
    defs = sorted((a["AttributeName"], a["AttributeType"]) for a in table["AttributeDefinitions"])
    if defs != sorted((a["AttributeName"], a["AttributeType"]) for a in want["AttributeDefinitions"]):
        fail(f"table attribute definitions differ from the code: {defs}")
    def proj(g):
        p = g["Projection"]
        return (p["ProjectionType"], tuple(sorted(p.get("NonKeyAttributes", []))))
    have_idx = {g["IndexName"]: (norm_keys(g["KeySchema"]), proj(g)) for g in table["GlobalSecondaryIndexes"]}
    want_idx = {g["IndexName"]: (norm_keys(g["KeySchema"]), proj(g)) for g in want["GlobalSecondaryIndexes"]}
    if have_idx != want_idx:
        fail(f"table indexes differ from the code: {have_idx} vs {want_idx}")
    if table["TimeToLiveSpecification"] != want["TimeToLiveSpecification"]:
        fail("table TTL differs from the code")
    if not table.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled"):
        fail("point-in-time recovery is off")
    if not table.get("SSESpecification", {}).get("SSEEnabled"):
        fail("table encryption (SSE) is off")
    checks += 7

    queue = res["WorkQueue"]["Properties"]
    if queue["VisibilityTimeout"] != schema["queue"]["VisibilityTimeout"]:
        fail("work queue visibility differs from the code")
    if queue["RedrivePolicy"]["maxReceiveCount"] != schema["queue"]["maxReceiveCount"]:
        fail("work queue maxReceiveCount differs from the code")
    processor = res["ProcessorFunction"]["Properties"]
    if queue["VisibilityTimeout"] < 6 * processor["Timeout"]:
        fail("queue visibility must be at least 6 x the processor timeout")
    esm = processor["Events"]["Work"]["Properties"]
    if "ReportBatchItemFailures" not in esm.get("FunctionResponseTypes", []):
        fail("the processor's event source does not report batch item failures")
    if esm.get("BatchSize", 10) > 10:
        fail("batch size above 10")
    if "MaximumConcurrency" not in esm.get("ScalingConfig", {}):
        fail("the processor's event source has no maximum concurrency")
    checks += 6

    for name, r in res.items():
        if r["Type"] != "AWS::Serverless::Function":
            continue
        props = r["Properties"]
        if r.get("Metadata", {}).get("BuildMethod") != "makefile":
            fail(f"{name} is not built by the project's Makefile")
        makefile = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Makefile")).read()
        if f"build-{name}:" not in makefile:
            fail(f"the Makefile has no build-{name} target")
        if props.get("Runtime", template["Globals"]["Function"]["Runtime"]) != "provided.al2023":
            fail(f"{name} does not run on provided.al2023")
        for policy in props.get("Policies", []):
            if not isinstance(policy, dict) or "Statement" not in policy:
                fail(f"{name}: only inline statements are allowed (got {policy})")
            for st in policy["Statement"]:
                actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
                resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                for a in actions:
                    if "*" in a:
                        fail(f"{name}: wildcard action {a}")
                if any(a.startswith(DATA_SERVICES) for a in actions) and any(r == "*" for r in resources):
                    fail(f"{name}: {actions} on resource '*'")
                checks += 1

    metrics = set(schema.get("metrics", {}).get("reconciler", []))
    if not metrics:
        fail("the schema lists no reconciler metrics")
    heartbeat = False
    for name, r in res.items():
        if r["Type"] != "AWS::CloudWatch::Alarm":
            continue
        props = r["Properties"]
        missing = props.get("TreatMissingData")
        if missing not in ("breaching", "notBreaching", "ignore", "missing"):
            fail(f"{name}: TreatMissingData must be chosen explicitly (got {missing!r})")
        if props.get("Namespace") != "Hookledger":
            checks += 1
            continue
        if missing == "notBreaching":
            fail(f"{name}: missing data of a Hookledger metric means no report, not health (notBreaching)")
        dims = {d["Name"]: d["Value"] for d in props.get("Dimensions", [])}
        if dims.get("function") == "reconciler" and props["MetricName"] not in metrics:
            fail(f"{name}: the reconciler emits no metric {props['MetricName']!r} (it would never have data)")
        if (
            props["MetricName"] == "reconciler_runs"
            and missing == "breaching"
            and props.get("ComparisonOperator") == "LessThanThreshold"
        ):
            heartbeat = True
        checks += 1
    if not heartbeat:
        fail("no heartbeat alarm: reconciler_runs, LessThanThreshold, TreatMissingData breaching")
    checks += 1

    text = open(template_path).read()
    for marker in ("whsec_", "sk_live_", "sk_test_"):
        if marker in text:
            fail(f"template contains what looks like a secret ({marker}...)")
    checks += 1
    print(f"check_template: {checks} passed, 0 failed")


if __name__ == "__main__":
    main()
