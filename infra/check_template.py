"""Checks infra/template.yaml against the code and the house rules.

Usage: check_template.py TEMPLATE SCHEMA_JSON [IAM_ACTIONS_JSON]
  SCHEMA_JSON is the output of `hookledger schema` (what the code creates);
  IAM_ACTIONS_JSON defaults to iam-actions.json beside this script.

Asserts, each with a clear message:
- the table in the template is the table the code creates (keys, attribute
  definitions, both indexes, TTL), with on-demand billing, PITR and SSE;
- the work queue matches the code's visibility and redrive settings, and its
  visibility is at least 6 x the processor timeout;
- the processor's SQS event source reports batch item failures, with batch
  size <= 10 and a maximum concurrency;
- every function policy is least-privilege: no wildcard actions, no "*"
  resources for data services (DynamoDB, SQS, SNS, SSM, Secrets Manager);
- every function with a secret reference in its environment may read
  secrets the ways docs/deploy.md offers: SSM parameters under
  SecretsParameterPath, and Secrets Manager secrets through
  parameter/aws/reference/secretsmanager/<path>/* (ssm:GetParameter) with
  secretsmanager:GetSecretValue on secret:<path>/*;
- every SNS topic an alarm notifies is encrypted with a key of this template
  (never alias/aws/*: CloudWatch cannot publish to such a topic) with
  rotation on, administered by the account, and whose policy lets
  cloudwatch.amazonaws.com kms:Decrypt and kms:GenerateDataKey* under an
  aws:SourceAccount condition;
- every function's policy grants exactly what `infra/iam-actions.json` (the
  operations the code was seen to make, recorded by the integration tests)
  needs: a `TransactWriteItems` needs the actions of its items, a query on an
  index a grant on `table/index/*`, a `GetObject` also `s3:ListBucket` on the
  bucket (without it a missing object reads as AccessDenied, not absent), an
  SSM reference under `/aws/reference/secretsmanager/` also
  `secretsmanager:GetSecretValue`; and no data-service action is granted
  that no operation needs (ALLOWED_UNUSED lists the reasoned exceptions);
- the work queue's fair-queue metrics are alarmed on (a noisy tenant, and
  the age of the quiet tenants' oldest message), each notifying someone;
  the functions get HOOKLEDGER_TENANT_METRICS from the TenantMetrics
  parameter; the webhook API's default route throttling is the
  IngressRateLimit/IngressBurstLimit parameters, and absent when no limit
  is set;
- both values of `Ingress` (the template transformed by the SAM translator,
  offline, and its conditions evaluated): exactly one public entry (the
  HTTP API with its two routes and API Gateway's permission alone, or the
  intake's function URL with auth NONE and both permissions a new URL
  needs), the SES subscription and WebhookBaseUrl following it; `Tracing`
  sets every function's tracing mode;
- no secret value appears in the template;
- every alarm says how it treats missing data; alarms on the project's own
  metrics never read missing data as healthy (no `notBreaching`), name only
  metrics the code emits, and a heartbeat alarm on the reconciler's runs
  treats missing data as breaching; the records waiting for an operator
  (the reconciler's `dead_letters` and `parked` gauges) are alarmed on, each
  alarm notifying someone.
"""

import fnmatch
import json
import os
import sys

from cfnlint.decode import decode

DATA_SERVICES = ("dynamodb:", "sqs:", "sns:", "ssm:", "secretsmanager:", "kms:", "s3:", "events:")


def fail(msg):
    print(f"check_template: FAIL: {msg}")
    sys.exit(1)


def norm_keys(ks):
    return [(k["AttributeName"], k["KeyType"]) for k in ks]


def as_list(v):
    return v if isinstance(v, list) else [v]


# Environment variables that hold secret references (env:/ssm:) by the code's
# contract; any variable fed by a secret-reference parameter counts too.
SECRET_VARS = ("HOOKLEDGER_ENDPOINTS", "HOOKLEDGER_STRIPE_API_KEY", "HOOKLEDGER_GITHUB_TOKEN")
ALARM_ACTIONS = ("AlarmActions", "OKActions", "InsufficientDataActions")
ALARM_KMS_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey*")


def referenced(value):
    """Names a value refers to: Ref, Fn::GetAtt and ${...} in Fn::Sub, anywhere inside."""
    out = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Ref" and isinstance(v, str):
                out.add(v)
            elif k == "Fn::GetAtt":
                out.add((v.split(".")[0] if isinstance(v, str) else v[0]))
            elif k == "Fn::Sub":
                text = v if isinstance(v, str) else v[0]
                out |= {n.split(".")[0] for n in _sub_names(text)}
                if isinstance(v, list) and len(v) > 1:
                    out |= referenced(v[1])
            else:
                out |= referenced(v)
    elif isinstance(value, list):
        for v in value:
            out |= referenced(v)
    return out


def _sub_names(text):
    names, i = [], 0
    while True:
        i = text.find("${", i)
        if i < 0:
            return names
        j = text.find("}", i)
        if j < 0:
            return names
        if text[i + 2:i + 3] != "!":
            names.append(text[i + 2:j])
        i = j + 1


def sub_text(value):
    """A resource ARN as written: a plain string or the text of an Fn::Sub."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Sub" in value:
        v = value["Fn::Sub"]
        return v if isinstance(v, str) else v[0]
    return None


def literal_strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from literal_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from literal_strings(v)


def is_account_id(value):
    if isinstance(value, str):
        return value.isdigit() and len(value) == 12
    return value in ({"Ref": "AWS::AccountId"}, {"Fn::Sub": "${AWS::AccountId}"})


# The template's function for each function of infra/iam-actions.json.
FUNCTIONS = {"intake": "IntakeFunction", "processor": "ProcessorFunction", "reconciler": "ReconcilerFunction"}
# A TransactWriteItems is authorised item by item.
TRANSACT_ITEM_ACTIONS = {
    "table:Put": "dynamodb:PutItem",
    "table:Update": "dynamodb:UpdateItem",
    "table:ConditionCheck": "dynamodb:ConditionCheckItem",
    "table:Delete": "dynamodb:DeleteItem",
}
# Data-service actions a function may be granted although no recorded
# operation makes them, each with its reason. (None today: the event source
# mapping's SQS polling is granted by SAM's SQSPollerPolicy, not here.)
ALLOWED_UNUSED = {}


def needed_actions(operations):
    """IAM action -> resource kinds it is needed on, from one function's
    recorded operations (`service:Operation` -> resource kinds)."""
    need = {}

    def add(action, kind):
        need.setdefault(action, set()).add(kind)

    for op, kinds in operations.items():
        service, name = op.split(":", 1)
        for kind in kinds:
            if op == "dynamodb:TransactWriteItems":
                if kind not in TRANSACT_ITEM_ACTIONS:
                    fail(f"iam-actions.json: unknown transaction item kind {kind!r}")
                add(TRANSACT_ITEM_ACTIONS[kind], "table")
            elif service == "dynamodb":
                add(op, "index" if kind.startswith("index:") else "table")
            elif op == "s3:GetObject":
                add("s3:GetObject", "objects")
                add("s3:ListBucket", "bucket")
            elif service == "s3":
                add(op, "objects")
            elif op == "sqs:SendMessageBatch":
                # Authorised as SendMessage, entry by entry.
                add("sqs:SendMessage", kind)
            elif service == "ssm" and kind == "parameter:handshake":
                add(op, "parameter:handshake")
            elif op == "ssm:GetParameter" and kind == "parameter:secretsmanager":
                add("ssm:GetParameter", "parameter")
                add("secretsmanager:GetSecretValue", "secret")
            else:
                add(op, kind)
    return need


def policy_statements(policy):
    """A policy's statements, each `Fn::If` taken as the statements it may give."""
    for st in policy.get("Statement", []) if isinstance(policy, dict) else []:
        if isinstance(st, dict) and "Fn::If" in st:
            for branch in st["Fn::If"][1:]:
                if isinstance(branch, dict) and "Effect" in branch:
                    yield branch
        else:
            yield st


def grants(props):
    """IAM action -> the resource texts a function's inline statements allow it on."""
    granted = {}
    for policy in props.get("Policies", []):
        for st in policy_statements(policy):
            if st.get("Effect") != "Allow":
                continue
            for a in as_list(st["Action"]):
                texts = granted.setdefault(a, [])
                for r in as_list(st["Resource"]):
                    texts.append(sub_text(r) or json.dumps(r, sort_keys=True))
    return granted


def resource_fits(kind, texts):
    """Whether one of the granted resource texts is of `kind`."""
    if kind == "index":
        return any("/index/" in t for t in texts)
    if kind == "destination":
        # A route's destinations: the DestinationArns parameter, nothing wider.
        return any("DestinationArns" in t for t in texts)
    if kind == "deliveries":
        # The delivery queue, not the work queue or a destination.
        return any("DeliveryQueue" in t for t in texts)
    if kind == "queue":
        return any("WorkQueue" in t for t in texts)
    if kind == "parameter:handshake":
        # Secrets handed over at a handshake: only under the handshake path.
        return any("/handshake/" in t for t in texts)
    if kind == "bucket":
        # The bucket itself (ListBucket), not its objects.
        return any("PayloadBucket" in t and not t.rstrip('"}').endswith("*") for t in texts)
    return bool(texts)


def check_iam(res, iam):
    """Each function's policy against its recorded operations, both ways."""
    checks = 0
    unknown = set(iam) - set(FUNCTIONS)
    if unknown:
        fail(f"iam-actions.json names functions the template does not have: {sorted(unknown)}")
    for function, logical in FUNCTIONS.items():
        if logical not in res:
            fail(f"the template has no {logical}")
        need = needed_actions(iam.get(function, {}))
        granted = grants(res[logical]["Properties"])
        for action, kinds in sorted(need.items()):
            if action not in granted:
                fail(f"{logical} makes {action} (infra/iam-actions.json: {function}) but its policy does not grant it")
            for kind in sorted(kinds):
                if not resource_fits(kind, granted[action]):
                    fail(f"{logical}: {action} is needed on the {kind} but granted only on {granted[action]}")
            checks += 1
        for action in sorted(granted):
            if not action.startswith(DATA_SERVICES) or action in need:
                continue
            if action in ALLOWED_UNUSED.get(function, {}):
                continue
            fail(
                f"{logical} is granted {action}, which no recorded operation of the {function} needs "
                f"(infra/iam-actions.json); remove it, or add it to ALLOWED_UNUSED with the reason"
            )
    return checks


def covers(granted, wanted):
    return any(fnmatch.fnmatchcase(wanted.lower(), g.lower()) for g in granted)


def cloudwatch_may_use(statement):
    """The statement lets CloudWatch (this account's alarms only) encrypt for the topic."""
    if statement.get("Effect") != "Allow":
        return False
    principal = statement.get("Principal", {})
    services = as_list(principal.get("Service", [])) if isinstance(principal, dict) else []
    if "cloudwatch.amazonaws.com" not in services:
        return False
    if not all(covers(as_list(statement.get("Action", [])), a) for a in ALARM_KMS_ACTIONS):
        return False
    for op, conds in statement.get("Condition", {}).items():
        if op != "StringEquals":
            continue
        for key, value in conds.items():
            if key.lower() == "aws:sourceaccount" and all(is_account_id(v) for v in as_list(value)):
                return True
    return False


def account_administers(statement):
    if statement.get("Effect") != "Allow":
        return False
    principal = statement.get("Principal", {})
    roots = as_list(principal.get("AWS", [])) if isinstance(principal, dict) else []
    root = "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"
    return any(sub_text(r) == root for r in roots) and covers(as_list(statement.get("Action", [])), "kms:*")


# The reconciler's evidence gauges that must be alarmed on.
EVIDENCE_ALARMS = {
    "dead_letters": "records DEAD, waiting for an operator",
    "parked": "records PARKED, waiting for an operator or a predecessor that never came",
}

# The fair-queue metrics of the work queue that must be alarmed on.
FAIR_QUEUE_ALARMS = {
    "ApproximateNumberOfNoisyGroups": "a tenant holding a disproportionate share of the processor",
    "ApproximateAgeOfOldestMessageInQuietGroups": "the quiet tenants' oldest message waiting",
}


def check_tenants(template, res):
    """Fair queues, per-tenant metrics and the ingress limit, as documented."""
    checks = 0
    def on_work_queue(m):
        return m.get("Namespace") == "AWS/SQS" and any(
            d.get("Name") == "QueueName" and "WorkQueue" in referenced(d.get("Value")) for d in m.get("Dimensions", [])
        )

    def alarmed_metrics(props):
        """(namespace/dimensions dict, metric name) of an alarm: its own, or its metric math inputs."""
        if "MetricName" in props:
            yield props, props["MetricName"]
        for m in props.get("Metrics", []):
            metric = m.get("MetricStat", {}).get("Metric")
            if metric:
                yield metric, metric.get("MetricName")

    for metric, what in FAIR_QUEUE_ALARMS.items():
        found = [
            name for name, r in res.items()
            if r["Type"] == "AWS::CloudWatch::Alarm"
            and any(on_work_queue(m) and n == metric for m, n in alarmed_metrics(r["Properties"]))
        ]
        if not found:
            fail(f"no alarm on the work queue's {metric} ({what})")
        for name in found:
            if not res[name]["Properties"].get("AlarmActions"):
                fail(f"{name}: alarm notifies no one (AlarmActions)")
        checks += 1
    env = template.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    if "TenantMetrics" not in referenced(env.get("HOOKLEDGER_TENANT_METRICS")):
        fail("the functions' HOOKLEDGER_TENANT_METRICS is not the TenantMetrics parameter")
    if template.get("Parameters", {}).get("TenantMetrics", {}).get("Default", None) != "":
        fail("TenantMetrics must default to none (each tenant's metrics cost every month)")
    checks += 1
    settings = res["WebhookApiStage"].get("Properties", {}).get("DefaultRouteSettings")
    if not isinstance(settings, dict) or "Fn::If" not in settings:
        fail("WebhookApiStage: DefaultRouteSettings must be set from IngressRateLimit only when a limit is given (Fn::If)")
    cond, limited, unlimited = settings["Fn::If"]
    if unlimited != {"Ref": "AWS::NoValue"}:
        fail("WebhookApiStage: without IngressRateLimit there must be no throttling of ours (AWS::NoValue)")
    if limited.get("ThrottlingRateLimit") != {"Ref": "IngressRateLimit"} or limited.get("ThrottlingBurstLimit") != {"Ref": "IngressBurstLimit"}:
        fail(f"WebhookApiStage: throttling must be IngressRateLimit/IngressBurstLimit (got {limited})")
    if "IngressRateLimit" not in referenced(template.get("Conditions", {}).get(cond)):
        fail(f"WebhookApiStage: condition {cond} does not test IngressRateLimit")
    checks += 1
    return checks


def translate(template_path, parameters):
    """The template as CloudFormation deploys it with these parameter values:
    transformed by the SAM translator (offline: local code URIs stand in as
    S3 ones, no managed policy is looked up), its conditions evaluated, and
    only the resources and outputs whose condition holds kept."""
    import copy
    import logging

    from samtranslator.translator.transform import transform

    logging.getLogger("samtranslator").setLevel(logging.ERROR)

    template, matches = decode(template_path)
    if matches:
        fail(f"template does not parse: {matches}")
    template = copy.deepcopy(template)
    for r in template["Resources"].values():
        if r.get("Type") == "AWS::Serverless::Function":
            r["Properties"]["CodeUri"] = "s3://offline-check/code.zip"

    class NoManagedPolicies:
        def load(self):
            return {}

    # The translator wants a region for its pseudo parameters (nothing is called).
    os.environ.setdefault("AWS_DEFAULT_REGION", os.environ.get("AWS_REGION", "us-east-1"))
    out = transform(template, dict(parameters), NoManagedPolicies())
    params = {}
    for name, p in out.get("Parameters", {}).items():
        value = parameters.get(name, p.get("Default", ""))
        params[name] = [v.strip() for v in str(value).split(",")] if p.get("Type") == "CommaDelimitedList" else str(value)

    def value(x):
        if isinstance(x, dict) and len(x) == 1:
            (k, v), = x.items()
            if k == "Ref":
                return params.get(v, v)
            if k == "Fn::Join":
                return v[0].join(str(i) for i in value(v[1]))
            if k == "Fn::Equals":
                return str(value(v[0])) == str(value(v[1]))
            if k == "Fn::Not":
                return not value(v[0])
            if k == "Fn::And":
                return all(value(i) for i in v)
            if k == "Fn::Or":
                return any(value(i) for i in v)
            if k == "Condition":
                return holds(v)
        return x

    conditions = out.get("Conditions", {})

    def holds(name):
        if name not in conditions:
            fail(f"unknown condition {name}")
        return bool(value(conditions[name]))

    def pick(x):
        """Fn::If resolved, recursively (what CloudFormation would deploy)."""
        if isinstance(x, dict):
            if set(x) == {"Ref"} and x["Ref"] in params:
                return params[x["Ref"]]
            if set(x) == {"Fn::If"}:
                cond, yes, no = x["Fn::If"]
                return pick(yes if holds(cond) else no)
            return {k: pick(v) for k, v in x.items() if pick(v) != {"Ref": "AWS::NoValue"}}
        if isinstance(x, list):
            return [pick(i) for i in x if pick(i) != {"Ref": "AWS::NoValue"}]
        return x

    resources = {n: pick(r) for n, r in out["Resources"].items() if "Condition" not in r or holds(r["Condition"])}
    outputs = {n: pick(o) for n, o in out.get("Outputs", {}).items() if "Condition" not in o or holds(o["Condition"])}
    return resources, outputs


PUBLIC_ENTRIES = ("AWS::ApiGatewayV2::Api", "AWS::ApiGateway::RestApi", "AWS::Lambda::Url")


def check_ingress(template_path):
    """Both values of `Ingress`, as deployed (the SAM translator, offline):
    exactly one public entry each, routed to the intake with the permissions
    it needs and no other; the SES subscription and WebhookBaseUrl follow
    it; `Tracing` sets every function's tracing mode."""
    checks = 0
    for ingress in ("HttpApi", "FunctionUrl"):
        for tracing in ("PassThrough", "Active"):
            params = {"Ingress": ingress, "Tracing": tracing, "EndpointsConfig": "{}", "SesTopicArn": "arn:aws:sns:us-east-1:123456789012:ses"}
            res, outputs = translate(template_path, params)
            entries = sorted(n for n, r in res.items() if r["Type"] in PUBLIC_ENTRIES)
            if len(entries) != 1:
                fail(f"Ingress={ingress}: {len(entries)} public entries ({entries}), expected exactly one")
            entry = res[entries[0]]
            perms = [r["Properties"] for r in res.values() if r["Type"] == "AWS::Lambda::Permission"]
            to_intake = [p for p in perms if p.get("FunctionName") == {"Ref": "IntakeFunction"}]
            public = [p for p in perms if p.get("Principal") == "*"]
            if ingress == "HttpApi":
                if entry["Type"] != "AWS::ApiGatewayV2::Api":
                    fail(f"Ingress=HttpApi: the public entry is {entry['Type']}")
                routes = sorted(r["Properties"]["RouteKey"] for r in res.values() if r["Type"] == "AWS::ApiGatewayV2::Route")
                if routes != ["GET /webhooks/{endpoint}", "POST /webhooks/{endpoint}"]:
                    fail(f"Ingress=HttpApi: routes {routes}")
                if public or [p.get("Principal") for p in to_intake] != ["apigateway.amazonaws.com"]:
                    fail(f"Ingress=HttpApi: the intake's permissions must be API Gateway's alone (got {to_intake})")
                want = "execute-api"
            else:
                props = entry["Properties"]
                if entry["Type"] != "AWS::Lambda::Url" or props.get("AuthType") != "NONE" or "IntakeFunction" not in referenced(props.get("TargetFunctionArn")):
                    fail(f"Ingress=FunctionUrl: the public entry must be the intake's URL with AuthType NONE (got {entry})")
                url_perm = [p for p in to_intake if p.get("Action") == "lambda:InvokeFunctionUrl" and p.get("FunctionUrlAuthType") == "NONE"]
                invoke_perm = [p for p in to_intake if p.get("Action") == "lambda:InvokeFunction" and p.get("InvokedViaFunctionUrl") is True]
                if len(url_perm) != 1 or len(invoke_perm) != 1 or len(to_intake) != 2:
                    fail(f"Ingress=FunctionUrl: the intake needs lambda:InvokeFunctionUrl and lambda:InvokeFunction (via the URL), nothing else (got {to_intake})")
                want = "IntakeUrl"
            ses = res.get("SesSubscription", {}).get("Properties", {}).get("Endpoint")
            base = outputs.get("WebhookBaseUrl", {}).get("Value")
            for what, v in (("SesSubscription", ses), ("WebhookBaseUrl", base)):
                if want not in json.dumps(v):
                    fail(f"Ingress={ingress}: {what} does not follow the ingress ({v})")
            modes = {n: r["Properties"].get("TracingConfig", {}).get("Mode") for n, r in res.items() if r["Type"] == "AWS::Lambda::Function"}
            if set(modes.values()) != {tracing}:
                fail(f"Tracing={tracing}: the functions' tracing modes are {modes}")
            checks += 1
    return checks


def check_routes(template):
    """Every ARN the Routes parameter names is in DestinationArns (the
    values of ROUTES and DESTINATION_ARNS in the environment, the ones about
    to be deployed, else the template's defaults): the functions may send
    only to DestinationArns."""
    params = template.get("Parameters", {})
    for p in ("Routes", "DestinationArns"):
        if p not in params:
            fail(f"the template has no {p} parameter")
    routes = os.environ.get("ROUTES", params["Routes"].get("Default", ""))
    arns = os.environ.get("DESTINATION_ARNS", params["DestinationArns"].get("Default", ""))
    allowed = {a.strip() for a in arns.split(",") if a.strip()}
    if not routes.strip():
        return 1
    try:
        destinations = list(json.loads(routes)["destinations"].values())
        named = {d["arn"] for d in destinations if "url" not in d}
        # HTTPS destinations: their secrets, by reference.
        refs = [r for d in destinations if "url" in d for r in d.get("secrets", [])]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        fail(f"Routes is not routes JSON ({e.__class__.__name__})")
    missing = sorted(named - allowed)
    if missing:
        fail(f"Routes names destinations not in DestinationArns (the functions could not send to them): {missing}")
    # The functions may read parameters under SecretsParameterPath only.
    path = os.environ.get("SECRETS_PARAMETER_PATH", params.get("SecretsParameterPath", {}).get("Default", ""))
    unreadable = sorted(r for r in refs if r.startswith("ssm:") and not r.startswith(f"ssm:/{path}/"))
    if unreadable:
        fail(f"HTTPS destinations' secrets outside /{path}/ (the functions could not read them): {unreadable}")
    return 1


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

    # The delivery queue: consumed by the processor function's second event
    # source at its own concurrency, with a dead-letter queue, and named to
    # the processor and the reconciler (both hand deliveries to it).
    deliveries = res.get("DeliveryQueue", {}).get("Properties")
    if deliveries is None:
        fail("no DeliveryQueue")
    else:
        if deliveries.get("VisibilityTimeout", 30) < 6 * processor["Timeout"]:
            fail("delivery queue visibility must be at least 6 x the processor timeout")
        dlq = deliveries.get("RedrivePolicy", {}).get("deadLetterTargetArn")
        if "DeliveryDeadLetterQueue" not in referenced(dlq):
            fail("the delivery queue has no dead-letter queue")
        source = processor["Events"].get("Deliveries", {}).get("Properties", {})
        if "DeliveryQueue" not in referenced(source.get("Queue")):
            fail("the processor does not take the delivery queue")
        if "ReportBatchItemFailures" not in source.get("FunctionResponseTypes", []):
            fail("the delivery queue's event source does not report batch item failures")
        if "DeliveryConcurrency" not in referenced(source.get("ScalingConfig", {}).get("MaximumConcurrency")):
            fail("the delivery queue's event source is not bounded by DeliveryConcurrency")
        for fn in ("ProcessorFunction", "ReconcilerFunction"):
            env = res[fn]["Properties"].get("Environment", {}).get("Variables", {})
            if "DeliveryQueue" not in referenced(env.get("HOOKLEDGER_DELIVERY_QUEUE_URL")):
                fail(f"{fn} is not given the delivery queue (HOOKLEDGER_DELIVERY_QUEUE_URL)")
        for alarm, metric in (("DeliveryQueueBacklogAlarm", "ApproximateAgeOfOldestMessage"),
                              ("DeliveryDeadLetterAlarm", "ApproximateNumberOfMessagesVisible")):
            if res.get(alarm, {}).get("Properties", {}).get("MetricName") != metric:
                fail(f"no {alarm} on {metric}")
        # Each destination's health: the reconciler's own schedule for the
        # census (its input names the task), and an alarm on the oldest
        # pending delivery that notifies the alarm topic.
        events = res["ReconcilerFunction"]["Properties"].get("Events", {})
        census = [
            e for e in events.values()
            if e.get("Type") == "ScheduleV2" and '"delivery-health"' in str(e.get("Properties", {}).get("Input", ""))
        ]
        if not census:
            fail("no schedule runs the reconciler's delivery-health task")
        oldest = res.get("OldestPendingDeliveryAlarm", {}).get("Properties", {})
        dims = {d["Name"]: d["Value"] for d in oldest.get("Dimensions", [])}
        if (oldest.get("MetricName"), dims.get("function")) != ("delivery_oldest_pending_age", "reconciler"):
            fail("no OldestPendingDeliveryAlarm on the reconciler's delivery_oldest_pending_age")
        if oldest.get("ComparisonOperator") != "GreaterThanThreshold" or oldest.get("Statistic") != "Maximum":
            fail("OldestPendingDeliveryAlarm must fire on the Maximum above its threshold")
        if "OldestPendingDeliveryAlarmMs" not in referenced(oldest.get("Threshold")):
            fail("OldestPendingDeliveryAlarm's threshold is not OldestPendingDeliveryAlarmMs")
        if "AlarmTopic" not in referenced(oldest.get("AlarmActions")):
            fail("OldestPendingDeliveryAlarm notifies no one")
        checks += 14

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
            for st in policy_statements(policy):
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

    # Records waiting for an operator are alarmed on: DEAD ones at once, PARKED
    # ones (unknown subject, a sequence gap that never closed) when their count
    # stays above a threshold for a period; each alarm notifies the alarm topic.
    for metric, what in EVIDENCE_ALARMS.items():
        found = [
            name for name, r in res.items()
            if r["Type"] == "AWS::CloudWatch::Alarm"
            and r["Properties"].get("Namespace") == "Hookledger"
            and r["Properties"].get("MetricName") == metric
            and {d["Name"]: d["Value"] for d in r["Properties"].get("Dimensions", [])}.get("function") == "reconciler"
            and r["Properties"].get("ComparisonOperator") == "GreaterThanThreshold"
        ]
        if not found:
            fail(f"no alarm on the reconciler's {metric} ({what})")
        for name in found:
            if not res[name]["Properties"].get("AlarmActions"):
                fail(f"{name}: alarm notifies no one (AlarmActions)")
        checks += 1

    # Secrets the way docs/deploy.md says: a function that reads a secret reference
    # may read it as an SSM parameter or as a Secrets Manager secret through SSM.
    params = template.get("Parameters", {})
    secret_params = {
        p for p, d in params.items()
        if p.endswith("Ref") or "ssm:/" in str(d.get("Description", "")) or "secret reference" in str(d.get("Description", "")).lower()
    }
    global_env = template.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    plain = ":ssm:${AWS::Region}:${AWS::AccountId}:parameter/${SecretsParameterPath}/*"
    through_ssm = ":ssm:${AWS::Region}:${AWS::AccountId}:parameter/aws/reference/secretsmanager/${SecretsParameterPath}/*"
    secret = ":secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${SecretsParameterPath}/*"
    for name, r in res.items():
        if r["Type"] != "AWS::Serverless::Function":
            continue
        props = r["Properties"]
        env = dict(global_env)
        env.update(props.get("Environment", {}).get("Variables", {}))
        holders = sorted(
            var for var, value in env.items()
            if var in SECRET_VARS
            or referenced(value) & secret_params
            or any(s.startswith(("ssm:", "env:")) or '"ssm:/' in s for s in literal_strings(value))
        )
        if not holders:
            continue
        granted = {}
        for policy in props.get("Policies", []):
            for st in policy_statements(policy):
                if st.get("Effect") != "Allow":
                    continue
                for a in as_list(st["Action"]):
                    granted.setdefault(a, set()).update(t for t in map(sub_text, as_list(st["Resource"])) if t)
        def may(action, suffix):
            return any(t.startswith("arn:${AWS::Partition}") and t.endswith(suffix) for t in granted.get(action, ()))
        for action, suffix, what in (
            ("ssm:GetParameter", plain, "SSM parameters under SecretsParameterPath (parameter/${SecretsParameterPath}/*)"),
            ("ssm:GetParameter", through_ssm, "Secrets Manager references through SSM (parameter/aws/reference/secretsmanager/${SecretsParameterPath}/*)"),
            ("secretsmanager:GetSecretValue", secret, "the secrets behind them (secretsmanager:GetSecretValue on secret:${SecretsParameterPath}/*)"),
        ):
            if not may(action, suffix):
                fail(f"{name} holds secret references ({', '.join(holders)}) but may not read {what}: {action}")
            checks += 1

    # Alarms reach someone: CloudWatch must be able to encrypt for every topic
    # an alarm notifies, which the AWS managed key (alias/aws/sns) never allows.
    alarm_topics = {}
    for name, r in res.items():
        if r["Type"] not in ("AWS::CloudWatch::Alarm", "AWS::CloudWatch::CompositeAlarm"):
            continue
        for field in ALARM_ACTIONS:
            for target in referenced(r["Properties"].get(field, [])):
                if res.get(target, {}).get("Type") == "AWS::SNS::Topic":
                    alarm_topics.setdefault(target, name)
    for topic, alarm in sorted(alarm_topics.items()):
        key_id = (res[topic].get("Properties") or {}).get("KmsMasterKeyId")
        if key_id is None:
            fail(f"{topic} (notified by {alarm}) is not encrypted; give it a key of this template that CloudWatch may use")
        if isinstance(key_id, str):
            if key_id.startswith("alias/aws/"):
                fail(f"{topic} (notified by {alarm}) is encrypted with the AWS managed key {key_id}: CloudWatch cannot publish to it")
            fail(f"{topic} (notified by {alarm}) uses key {key_id!r}, not a key of this template whose policy the check can read")
        refs = referenced(key_id)
        key = next(iter(refs)) if len(refs) == 1 else None
        if key in res and res[key]["Type"] == "AWS::KMS::Alias":
            target = referenced(res[key]["Properties"].get("TargetKeyId"))
            key = next(iter(target)) if len(target) == 1 else None
        if key not in res or res[key]["Type"] != "AWS::KMS::Key":
            fail(f"{topic} (notified by {alarm}): KmsMasterKeyId {key_id} is not a Ref/GetAtt of an AWS::KMS::Key in the template")
        kprops = res[key]["Properties"]
        statements = as_list(kprops.get("KeyPolicy", {}).get("Statement", []))
        if not any(cloudwatch_may_use(st) for st in statements):
            fail(
                f"{topic} (notified by {alarm}): the policy of {key} has no statement allowing Service "
                f"cloudwatch.amazonaws.com {' and '.join(ALARM_KMS_ACTIONS)} with an aws:SourceAccount condition"
            )
        if not any(account_administers(st) for st in statements):
            fail(f"{key}: its policy does not let the account root (arn:${{AWS::Partition}}:iam::${{AWS::AccountId}}:root) administer it (kms:*)")
        if kprops.get("EnableKeyRotation") is not True:
            fail(f"{key}: key rotation is off (EnableKeyRotation: true)")
        checks += 1
    if not alarm_topics:
        fail("no alarm notifies an SNS topic of the template")

    checks += check_tenants(template, res)

    iam_path = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "iam-actions.json")
    checks += check_iam(res, json.load(open(iam_path)))
    checks += check_routes(template)
    checks += check_ingress(template_path)

    text = open(template_path).read()
    for marker in ("whsec_", "sk_live_", "sk_test_"):
        if marker in text:
            fail(f"template contains what looks like a secret ({marker}...)")
    checks += 1
    print(f"check_template: {checks} passed, 0 failed")


if __name__ == "__main__":
    main()
