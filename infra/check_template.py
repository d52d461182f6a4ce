"""Checks infra/template.yaml against the code and the house rules.

Usage: check_template.py [--keys-only | --without-keys] TEMPLATE SCHEMA_JSON [IAM_ACTIONS_JSON]
  SCHEMA_JSON is the output of `hookledger schema` (what the code creates);
  IAM_ACTIONS_JSON defaults to iam-actions.json beside this script.
  --keys-only runs the customer managed key's checks alone, --without-keys
  all the others (scripts/check-template checks copies of the template that
  way; the template itself is always checked whole).

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
  aws:SourceAccount condition; or with the key passed in as KeyArn, whose
  policy lives outside the template (docs/deploy.md checks it after a
  deploy); checked as deployed, for each key variant below;
- the customer managed key (check_keys), as deployed for no key,
  CreateKey=true (with and without SesTopicArn) and KeyArn (an example ARN),
  each variant printing its number of checks: the Rules refuse both at once;
  with no key every store keeps its own encryption, the only key created is
  AlarmKey and no function is granted any KMS action; with a key, the table,
  the payload bucket (with an S3 Bucket Key), the work and delivery queues and
  their dead-letter queues (with a data key reuse period), the SES
  dead-letter queue and the alarm topic are encrypted with it, NotifyTopic
  stays on alias/aws/sns, and each function is granted exactly the KMS
  actions its recorded operations (and its SQS event sources) need on the
  stores under the key (KMS_FOR_OPERATION), each through its service
  (kms:ViaService), on the key's ARN alone; the key CreateKey creates is
  retained, has rotation on, an alias, and a policy letting the account
  administer it, CloudWatch encrypt for the alarm topic, SNS encrypt for the
  SES dead-letter queue (with SesTopicArn) and DynamoDB describe it; with
  KeyArn no key is created;
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
  offline, its parameter constraints and Rules applied and its conditions
  evaluated): exactly one public entry (the
  HTTP API with its two routes and API Gateway's permission alone, or the
  intake's function URL with auth NONE and both permissions a new URL
  needs), the SES subscription and WebhookBaseUrl following it; `Tracing`
  sets every function's tracing mode;
- the reconciler is given AuditRetentionDays (HOOKLEDGER_AUDIT_RETENTION_DAYS),
  whose default is at least RetentionDays' (the code refuses less);
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
import re
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
                add(op, "index" if kind.startswith("index:") else "keys" if kind == "keys" else "table")
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
    if kind == "keys":
        # The key table of sealed payloads, not the ledger's.
        return any("PayloadKeysTable" in t for t in texts)
    if kind == "table":
        return any("LedgerTable" in t and "/index/" not in t for t in texts)
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
            if action.startswith("kms:"):
                # Granted only with a customer managed key: check_keys checks
                # them as deployed, against the operations on the stores under it.
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
    # What CloudFormation refuses before it deploys anything: a value outside
    # a parameter's AllowedValues or AllowedPattern, a failed Rules assertion.
    for name, value in parameters.items():
        p = template.get("Parameters", {}).get(name)
        if p is None:
            fail(f"the template has no parameter {name}")
        if "AllowedValues" in p and str(value) not in [str(v) for v in p["AllowedValues"]]:
            fail(f"{name}={value!r} is not one of its AllowedValues {p['AllowedValues']}")
        if "AllowedPattern" in p and not re.fullmatch(p["AllowedPattern"], str(value)):
            fail(f"{name}={value!r} does not match its AllowedPattern {p['AllowedPattern']}")
    refused = rule_violations(template, parameters)
    if refused:
        fail(f"the template's Rules refuse {parameters}: {refused}")
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


def check_alarm_topics(res, label, user_key=None):
    """Alarms reach someone: CloudWatch must be able to encrypt for every topic
    an alarm notifies, which the AWS managed key (alias/aws/sns) never allows.
    `res` as deployed; `user_key`, the ARN of a key passed in (KeyArn), whose
    policy lives outside the template (docs/deploy.md gives the command that
    checks it after a deploy)."""
    checks = 0
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
            fail(f"{label}: {topic} (notified by {alarm}) is not encrypted; give it a key of this template that CloudWatch may use")
        if isinstance(key_id, str):
            if key_id.startswith("alias/aws/"):
                fail(f"{label}: {topic} (notified by {alarm}) is encrypted with the AWS managed key {key_id}: CloudWatch cannot publish to it")
            if user_key is not None and key_id == user_key:
                checks += 1
                continue
            fail(f"{label}: {topic} (notified by {alarm}) uses key {key_id!r}, not a key of this template whose policy the check can read")
        key = key_named(res, key_id)
        if key is None or key not in res:
            fail(f"{label}: {topic} (notified by {alarm}): KmsMasterKeyId {key_id} is not a Ref/GetAtt of an AWS::KMS::Key in the template")
        kprops = res[key]["Properties"]
        statements = as_list(kprops.get("KeyPolicy", {}).get("Statement", []))
        if not any(cloudwatch_may_use(st) for st in statements):
            fail(
                f"{label}: {topic} (notified by {alarm}): the policy of {key} has no statement allowing Service "
                f"cloudwatch.amazonaws.com {' and '.join(ALARM_KMS_ACTIONS)} with an aws:SourceAccount condition"
            )
        if not any(account_administers(st) for st in statements):
            fail(f"{label}: {key}: its policy does not let the account root (arn:${{AWS::Partition}}:iam::${{AWS::AccountId}}:root) administer it (kms:*)")
        if kprops.get("EnableKeyRotation") is not True:
            fail(f"{label}: {key}: key rotation is off (EnableKeyRotation: true)")
        checks += 1
    if not alarm_topics:
        fail(f"{label}: no alarm notifies an SNS topic of the template")
    return checks


# --- The customer managed key (CreateKey=true, or KeyArn) -------------------

KEY_ARN_EXAMPLE = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000"
SES_TOPIC_EXAMPLE = "arn:aws:sns:us-east-1:123456789012:ses"
# The stores encrypted with the customer managed key when there is one (the
# SES dead-letter queue exists only with SesTopicArn). NotifyTopic is not
# among them: it stays on alias/aws/sns (its subscribers are the user's).
KEY_STORES = (
    "LedgerTable", "PayloadKeysTable", "PayloadBucket", "WorkQueue", "WorkDeadLetterQueue", "DeliveryQueue",
    "DeliveryDeadLetterQueue", "SesDeadLetterQueue", "AlarmTopic",
)
# The store an operation of infra/iam-actions.json touches, by its resource
# kind; None: not a store of ours (destinations, SSM parameters, secrets).
STORE_OF_KIND = {"table": "LedgerTable", "keys": "PayloadKeysTable", "bucket": "PayloadBucket", "queue": "WorkQueue", "deliveries": "DeliveryQueue", "topic": "NotifyTopic"}

DYNAMODB_READS = ("dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query", "dynamodb:Scan", "dynamodb:TransactGetItems")
DYNAMODB_WRITES = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:TransactWriteItems", "dynamodb:BatchWriteItem")
# What an operation on a store encrypted with the key needs of the key (each
# service's documentation), and the service it goes through (kms:ViaService,
# <service>.${AWS::Region}.amazonaws.com). The caller's own IAM permissions
# authorise these: SQS, S3 and DynamoDB call KMS on the caller's behalf.
#
#   operation                              KMS actions on the key                          through
#   sqs:SendMessage, sqs:SendMessageBatch  kms:GenerateDataKey, kms:Decrypt                sqs
#   an SQS event source (Lambda receives   kms:Decrypt                                     sqs
#     with the function's role)
#   sqs:ChangeMessageVisibility            nothing (no message body is touched)
#   s3:PutObject                           kms:GenerateDataKey                             s3
#   s3:GetObject                           kms:Decrypt                                     s3
#   s3:DeleteObject                        nothing (no object body is touched)
#   a DynamoDB read (GetItem,              kms:Decrypt, kms:DescribeKey                    dynamodb
#     BatchGetItem, Query, Scan,
#     TransactGetItems)
#   a DynamoDB write (PutItem, UpdateItem, kms:Decrypt, kms:DescribeKey,                   dynamodb
#     DeleteItem, TransactWriteItems,        kms:Encrypt, kms:GenerateDataKey
#     BatchWriteItem)
#
# (DynamoDB: AWS's guidance for principals of a table under a customer
# managed key, as the CDK's table grants give it, with the actions named: the
# checker allows no wildcard action.) sns:Publish to NotifyTopic (on
# alias/aws/sns) and every operation on a destination need nothing of this
# key: neither is encrypted with it (a destination under a key of the user's
# needs its own grant, docs/deploy.md). An operation on a store under the key
# that is not in this table fails the check until it is added.
KMS_FOR_OPERATION = {
    "sqs:SendMessage": (("kms:GenerateDataKey", "kms:Decrypt"), "sqs"),
    "sqs:SendMessageBatch": (("kms:GenerateDataKey", "kms:Decrypt"), "sqs"),
    "sqs:ReceiveMessage": (("kms:Decrypt",), "sqs"),
    "sqs:ChangeMessageVisibility": ((), "sqs"),
    "s3:PutObject": (("kms:GenerateDataKey",), "s3"),
    "s3:GetObject": (("kms:Decrypt",), "s3"),
    "s3:DeleteObject": ((), "s3"),
    **{op: (("kms:Decrypt", "kms:DescribeKey"), "dynamodb") for op in DYNAMODB_READS},
    **{op: (("kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey"), "dynamodb") for op in DYNAMODB_WRITES},
}


def key_named(res, value):
    """The KMS key a reference names: a key of the template (its logical
    name; through an alias of the template too), an ARN as given, or None."""
    if isinstance(value, str):
        return value
    refs = referenced(value)
    name = next(iter(refs)) if len(refs) == 1 else None
    if res.get(name, {}).get("Type") == "AWS::KMS::Alias":
        target = referenced(res[name]["Properties"].get("TargetKeyId"))
        name = next(iter(target)) if len(target) == 1 else None
    return name if res.get(name, {}).get("Type") == "AWS::KMS::Key" else None


def granted_key(value):
    """The key an IAM statement's Resource names: a key's ARN (Fn::GetAtt
    <key>.Arn), or an ARN as given; a key id or an alias authorises nothing."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        att = value["Fn::GetAtt"]
        name, attr = att.split(".", 1) if isinstance(att, str) else att
        return name if attr == "Arn" else None
    return None


def store_key(res, name):
    """(the key reference a store is encrypted with, or None; what it is encrypted with, in words)."""
    r = res[name]
    props = r.get("Properties", {})
    if r["Type"] == "AWS::DynamoDB::Table":
        sse = props.get("SSESpecification", {})
        if sse.get("SSEEnabled") is True and sse.get("SSEType") == "KMS" and "KMSMasterKeyId" in sse:
            return sse["KMSMasterKeyId"], "SSESpecification KMS"
        return None, f"SSESpecification {sse} (SSEType KMS and KMSMasterKeyId needed)"
    if r["Type"] == "AWS::S3::Bucket":
        rules = props.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", [])
        defaults = [rule.get("ServerSideEncryptionByDefault", {}) for rule in rules]
        if len(defaults) == 1 and defaults[0].get("SSEAlgorithm") == "aws:kms" and "KMSMasterKeyID" in defaults[0]:
            return defaults[0]["KMSMasterKeyID"], "SSE-KMS"
        return None, f"default encryption {defaults} (SSEAlgorithm aws:kms and KMSMasterKeyID needed)"
    if r["Type"] == "AWS::SQS::Queue":
        if "KmsMasterKeyId" in props:
            return props["KmsMasterKeyId"], "SSE-KMS"
        what = "SQS-managed SSE (SqsManagedSseEnabled)" if props.get("SqsManagedSseEnabled") else "no KmsMasterKeyId (SQS-managed SSE by default)"
        return None, what
    if r["Type"] == "AWS::SNS::Topic":
        key = props.get("KmsMasterKeyId")
        return key, f"KmsMasterKeyId {key}"
    fail(f"{name}: a {r['Type']} is not a store the key checks know")


def service_principal(statement, service):
    if statement.get("Effect") != "Allow":
        return False
    principal = statement.get("Principal", {})
    return isinstance(principal, dict) and service in as_list(principal.get("Service", []))


def sns_may_use_for(statement, topic_arn):
    """The statement lets SNS encrypt for the SES topic's subscription (its dead-letter queue) only."""
    if not service_principal(statement, "sns.amazonaws.com"):
        return False
    if not all(covers(as_list(statement.get("Action", [])), a) for a in ("kms:Decrypt", "kms:GenerateDataKey")):
        return False
    for op, conds in statement.get("Condition", {}).items():
        if op not in ("ArnEquals", "ArnLike", "StringEquals"):
            continue
        for key, value in conds.items():
            if key.lower() == "aws:sourcearn" and as_list(value) == [topic_arn]:
                return True
    return False


def dynamodb_may_describe(statement):
    return service_principal(statement, "dynamodb.amazonaws.com") and covers(as_list(statement.get("Action", [])), "kms:DescribeKey")


def via_service(statement):
    """The services a statement's kms:ViaService condition names (sqs, s3, dynamodb, ...), or None without one."""
    cond = statement.get("Condition", {}).get("StringEquals", {})
    values = [v for k, v in cond.items() if k.lower() == "kms:viaservice"]
    if not values:
        return None
    services = []
    for v in as_list(values[0]):
        text = sub_text(v) or ""
        service, _, rest = text.partition(".")
        if rest != "${AWS::Region}.amazonaws.com":
            fail(f"kms:ViaService {v} is not <service>.${{AWS::Region}}.amazonaws.com")
        services.append(service)
    return services


def kms_grants(res, function):
    """(KMS action, service it goes through) -> the resources a function's role allows it on, as deployed."""
    role_refs = referenced(res[function]["Properties"].get("Role"))
    role = next(iter(role_refs)) if len(role_refs) == 1 else None
    if res.get(role, {}).get("Type") != "AWS::IAM::Role":
        fail(f"{function}: its role is not an AWS::IAM::Role of the template ({res[function]['Properties'].get('Role')})")
    out = {}
    for policy in res[role]["Properties"].get("Policies", []):
        for st in as_list(policy.get("PolicyDocument", {}).get("Statement", [])):
            actions = [a for a in as_list(st.get("Action", [])) if a.lower().startswith("kms:")]
            if not actions or st.get("Effect") != "Allow":
                continue
            vias = via_service(st)
            if vias is None:
                fail(f"{function} is granted {actions} without a kms:ViaService condition (each grant names the service it goes through)")
            for a in actions:
                for via in vias:
                    out.setdefault((a, via), []).extend(as_list(st.get("Resource", [])))
    return out


def kms_needs(res, function, operations, key):
    """(KMS action, service) -> why: what a function's recorded operations
    and its SQS event sources need of `key`, for the stores encrypted with it."""
    def on_key(store):
        return store in res and key_named(res, store_key(res, store)[0]) == key

    need = {}
    for op, kinds in sorted(operations.items()):
        for kind in kinds:
            store = "LedgerTable" if kind.startswith(("index:", "table:")) else STORE_OF_KIND.get(kind)
            if store is None or not on_key(store):
                continue
            if op not in KMS_FOR_OPERATION:
                fail(f"{function} makes {op} on {store}, which is encrypted with the key, and KMS_FOR_OPERATION does not say what that needs of the key")
            actions, service = KMS_FOR_OPERATION[op]
            for a in actions:
                need.setdefault((a, service), set()).add(f"{op} on {store}")
    for name, r in res.items():
        if r["Type"] != "AWS::Lambda::EventSourceMapping" or function not in referenced(r["Properties"].get("FunctionName")):
            continue
        for queue in referenced(r["Properties"].get("EventSourceArn")):
            if res.get(queue, {}).get("Type") == "AWS::SQS::Queue" and on_key(queue):
                actions, service = KMS_FOR_OPERATION["sqs:ReceiveMessage"]
                for a in actions:
                    need.setdefault((a, service), set()).add(f"its SQS event source on {queue}")
    return need


def rule_violations(template, parameters):
    """The template's Rules as CloudFormation evaluates them for these
    parameter values (the defaults for the others): each failed assertion's
    description."""
    declared = template.get("Parameters", {})
    params = {}
    for name, p in declared.items():
        value = parameters.get(name, p.get("Default", ""))
        params[name] = [v.strip() for v in str(value).split(",")] if p.get("Type") == "CommaDelimitedList" else str(value)

    def ev(x):
        if isinstance(x, dict) and len(x) == 1:
            (k, v), = x.items()
            if k == "Ref":
                if v not in params:
                    fail(f"Rules: Ref {v} is not a parameter")
                return params[v]
            if k == "Fn::Equals":
                return str(ev(v[0])) == str(ev(v[1]))
            if k == "Fn::Not":
                return not ev(v[0])
            if k == "Fn::And":
                return all(ev(i) for i in v)
            if k == "Fn::Or":
                return any(ev(i) for i in v)
            if k == "Fn::Contains":
                return str(ev(v[1])) in [str(ev(i)) for i in as_list(ev(v[0]))]
            fail(f"Rules: {k} is a rule function this check cannot evaluate")
        return x

    out = []
    for name, rule in template.get("Rules", {}).items():
        if "RuleCondition" in rule and not ev(rule["RuleCondition"]):
            continue
        for assertion in rule.get("Assertions", []):
            if not ev(assertion["Assert"]):
                out.append(f"{name}: {assertion.get('AssertDescription', assertion['Assert'])}")
    return out


def check_keys(template_path, template, iam):
    """The customer managed key, three ways, as deployed (the SAM translator,
    offline): none (every store as before, no KMS grant), CreateKey=true (the
    stack's key: every store on it, rotation on, the statements its policy
    needs; with and without SesTopicArn), and KeyArn (the user's key: every
    store on it, no key created). For both keys, each function is granted
    exactly the KMS actions its recorded operations need on it, each through
    its service; both at once are refused by the template's Rules."""
    total = 0
    both = {"EndpointsConfig": "{}", "CreateKey": "true", "KeyArn": KEY_ARN_EXAMPLE}
    if not rule_violations(template, both):
        fail("CreateKey=true with KeyArn set is not refused (a Rules assertion must allow one key at most)")
    total += 1
    variants = (
        ("no key", {"SesTopicArn": SES_TOPIC_EXAMPLE}, None),
        ("CreateKey=true", {"CreateKey": "true"}, "DataKey"),
        ("CreateKey=true with SesTopicArn", {"CreateKey": "true", "SesTopicArn": SES_TOPIC_EXAMPLE}, "DataKey"),
        ("KeyArn", {"KeyArn": KEY_ARN_EXAMPLE, "SesTopicArn": SES_TOPIC_EXAMPLE}, KEY_ARN_EXAMPLE),
    )
    for label, extra, key in variants:
        params = {"EndpointsConfig": "{}", **extra}
        res, _ = translate(template_path, params)
        checks = 0
        created = sorted(n for n, r in res.items() if r["Type"] == "AWS::KMS::Key")
        notify = res.get("NotifyTopic", {}).get("Properties", {}).get("KmsMasterKeyId")
        if notify != "alias/aws/sns":
            fail(f"{label}: NotifyTopic must stay on alias/aws/sns (its subscribers are the user's), got {notify}")
        checks += 1
        if key is None:
            # As before the key: AWS managed and SQS-managed encryption, the
            # alarm topic on AlarmKey, and no KMS grant to any function.
            for name in KEY_STORES:
                if name not in res or name == "AlarmTopic":
                    continue
                if store_key(res, name)[0] is not None:
                    fail(f"{label}: {name} is encrypted with a customer managed key although neither CreateKey nor KeyArn is set")
                checks += 1
            if created != ["AlarmKey"]:
                fail(f"{label}: the template creates the keys {created}, expected AlarmKey alone")
            for function in FUNCTIONS.values():
                grants = kms_grants(res, function)
                if grants:
                    granted = ", ".join(sorted(f"{a} via {service}" for a, service in grants))
                    fail(f"{label}: {function} is granted {granted} with no customer managed key (a KMS grant exists only under HasCmk)")
                checks += 1
        else:
            for name in KEY_STORES:
                if name not in res:
                    if name == "SesDeadLetterQueue" and "SesTopicArn" not in extra:
                        continue
                    fail(f"{label}: no {name}")
                ref, what = store_key(res, name)
                if key_named(res, ref) != key:
                    fail(f"{label}: {name} is not encrypted with the customer managed key ({what})")
                props = res[name]["Properties"]
                if res[name]["Type"] == "AWS::SQS::Queue":
                    if props.get("SqsManagedSseEnabled") is True:
                        fail(f"{label}: {name} sets both SqsManagedSseEnabled and KmsMasterKeyId")
                    if "KmsDataKeyReusePeriodSeconds" not in props:
                        fail(f"{label}: {name} has no KmsDataKeyReusePeriodSeconds (the default 300 s asks KMS 12 times as often as an hour)")
                if name == "PayloadBucket":
                    rule = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
                    if rule.get("BucketKeyEnabled") is not True:
                        fail(f"{label}: PayloadBucket uses the key without an S3 Bucket Key (BucketKeyEnabled: true): a KMS request per object")
                checks += 1
            if key == "DataKey":
                if created != ["DataKey"]:
                    fail(f"{label}: the template creates the keys {created}, expected DataKey alone (AlarmKey only without a customer managed key)")
                data_key = res["DataKey"]
                kprops = data_key["Properties"]
                statements = as_list(kprops.get("KeyPolicy", {}).get("Statement", []))
                if kprops.get("EnableKeyRotation") is not True:
                    fail(f"{label}: DataKey: key rotation is off (EnableKeyRotation: true)")
                if (data_key.get("DeletionPolicy"), data_key.get("UpdateReplacePolicy")) != ("Retain", "Retain"):
                    fail(f"{label}: DataKey must be retained (DeletionPolicy and UpdateReplacePolicy Retain): deleting it destroys every payload encrypted under it")
                if not any(account_administers(st) for st in statements):
                    fail(f"{label}: DataKey: its policy does not let the account root (arn:${{AWS::Partition}}:iam::${{AWS::AccountId}}:root) administer it (kms:*), so the functions' IAM grants would count for nothing")
                if not any(cloudwatch_may_use(st) for st in statements):
                    fail(f"{label}: DataKey: its policy has no statement allowing Service cloudwatch.amazonaws.com {' and '.join(ALARM_KMS_ACTIONS)} with an aws:SourceAccount condition: alarms could not publish to AlarmTopic")
                if "SesTopicArn" in extra and not any(sns_may_use_for(st, extra["SesTopicArn"]) for st in statements):
                    fail(f"{label}: DataKey: its policy does not let SNS (sns.amazonaws.com) kms:Decrypt and kms:GenerateDataKey* for the SES topic (aws:SourceArn = SesTopicArn): SNS could not dead-letter to SesDeadLetterQueue")
                if not any(dynamodb_may_describe(st) for st in statements):
                    fail(f"{label}: DataKey: its policy does not let DynamoDB (dynamodb.amazonaws.com) kms:DescribeKey")
                aliases = [r["Properties"] for r in res.values() if r["Type"] == "AWS::KMS::Alias" and key_named(res, r["Properties"].get("TargetKeyId")) == "DataKey"]
                if [sub_text(a.get("AliasName")) for a in aliases] != ["alias/${AWS::StackName}-data"]:
                    fail(f"{label}: DataKey has no alias alias/${{AWS::StackName}}-data")
                checks += 7
            elif created:
                fail(f"{label}: the template creates the keys {created}; with KeyArn it creates none")
            else:
                checks += 1
            for function, logical in FUNCTIONS.items():
                need = kms_needs(res, logical, iam.get(function, {}), key)
                granted = kms_grants(res, logical)
                for (action, service), why in sorted(need.items()):
                    if (action, service) not in granted:
                        fail(
                            f"{label}: {logical} needs {action} on the key via {service}.${{AWS::Region}}.amazonaws.com "
                            f"({'; '.join(sorted(why))}) but is not granted it"
                        )
                    checks += 1
                for (action, service), resources in sorted(granted.items()):
                    if (action, service) not in need:
                        fail(
                            f"{label}: {logical} is granted {action} via {service}.${{AWS::Region}}.amazonaws.com, which none of "
                            f"its operations needs on the key (infra/iam-actions.json, KMS_FOR_OPERATION)"
                        )
                    wrong = [r for r in resources if granted_key(r) != key]
                    if wrong:
                        fail(f"{label}: {logical}: {action} is granted on {wrong}, not on the customer managed key's ARN alone")
        checks += check_alarm_topics(res, label, user_key=key if key != "DataKey" else None)
        print(f"check_template: key variant {label}: {checks} checks passed")
        total += checks
    return total


def main():
    # `--keys-only`: only the customer managed key's checks (a copy of the
    # template that must be refused for its key, checked quickly).
    # `--without-keys`: everything but the key's checks (a copy checked for
    # something else: routes, ingress).
    keys_only = "--keys-only" in sys.argv
    without_keys = "--without-keys" in sys.argv
    args = [a for a in sys.argv[1:] if a not in ("--keys-only", "--without-keys")]
    template_path, schema_path = args[0], args[1]
    template, matches = decode(template_path)
    if matches:
        fail(f"template does not parse: {matches}")
    if keys_only:
        iam_path = args[2] if len(args) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "iam-actions.json")
        checks = check_keys(template_path, template, json.load(open(iam_path)))
        print(f"check_template: {checks} key checks passed, 0 failed")
        return
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

    # Operator audit entries: kept AuditRetentionDays, which the reconciler
    # is given, and which by default outlives the records (the code refuses
    # less; CloudFormation rules cannot compare two numbers).
    params = template.get("Parameters", {})
    env = res["ReconcilerFunction"]["Properties"].get("Environment", {}).get("Variables", {})
    if "AuditRetentionDays" not in referenced(env.get("HOOKLEDGER_AUDIT_RETENTION_DAYS")):
        fail("the ReconcilerFunction's HOOKLEDGER_AUDIT_RETENTION_DAYS is not the AuditRetentionDays parameter")
    audit_days = int(params.get("AuditRetentionDays", {}).get("Default", 0))
    record_days = int(params.get("RetentionDays", {}).get("Default", 0))
    if audit_days < record_days:
        fail(f"AuditRetentionDays' default ({audit_days}) is below RetentionDays' ({record_days}): the reconciler refuses it")
    checks += 1

    checks += check_tenants(template, res)

    iam_path = args[2] if len(args) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "iam-actions.json")
    iam = json.load(open(iam_path))
    checks += check_iam(res, iam)
    checks += check_routes(template)
    checks += check_ingress(template_path)
    if not without_keys:
        checks += check_keys(template_path, template, iam)

    text = open(template_path).read()
    for marker in ("whsec_", "sk_live_", "sk_test_"):
        if marker in text:
            fail(f"template contains what looks like a secret ({marker}...)")
    checks += 1
    print(f"check_template: {checks} passed, 0 failed")


if __name__ == "__main__":
    main()
