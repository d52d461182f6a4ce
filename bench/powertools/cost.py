"""The bill's comparison: the same events through the Powertools-Python pattern,
its AWS requests counted the way Hookledger's are.

The pattern, as its documentation shows it:
- an intake that verifies each delivery with the provider's own SDK (Stripe's
  `stripe.Webhook.construct_event`, Standard Webhooks' `Webhook.verify`) and
  sends the body to SQS;
- a processor, an SQS batch handler whose business function is wrapped in
  `@idempotent_function(event_key_jmespath="id", expires_after_seconds=3600)`
  (a DynamoDB persistence layer) and writes the projection (one item per
  event's subject).

Every request goes through a recording proxy in front of the emulator, which
counts requests by service and operation, and prices each DynamoDB write and
read by DynamoDB's rules from the item before and after it (read by a client
that does not pass through the proxy): 1 write unit per started KB of the
larger, 1 read unit per started 4 KB (a strongly consistent read). SQS sends
are counted in 64 KB chunks. The handlers' own CPU time (`time.process_time`
around each call) is measured in this process.

What the pattern does not guarantee, beside Hookledger: no fence (a handler
whose lease ran out and one that took over can both write), duplicates are
recognised for an hour only (`expires_after_seconds=3600`), nothing records a
delivery the intake answered but could not enqueue, and no reconciliation.

Usage: cost.py SAMPLES_JSON EVENTS  (AWS_ENDPOINT_URL: the emulator). Prints JSON.
"""

import base64
import hashlib
import hmac
import http.client
import http.server
import json
import math
import os
import socketserver
import sys
import threading
import time
import urllib.parse
import uuid

import boto3

UPSTREAM = os.environ["AWS_ENDPOINT_URL"]
STRIPE_SECRET = "whsec_bench_only"
SVIX_SECRET = "whsec_" + base64.b64encode(b"bench-only-standard-webhooks-key").decode()

# ---------------------------------------------------------------- the recorder

direct = boto3.client("dynamodb", endpoint_url=UPSTREAM)
state = {"scope": "harness", "tallies": {}}
lock = threading.Lock()
key_schema = {}


def value_size(v):
    (kind, x), = v.items()
    if kind in ("S",):
        return len(x.encode())
    if kind == "B":
        return len(base64.b64decode(x))
    if kind == "N":
        digits = x.lstrip("-").replace(".", "").lstrip("0") or "0"
        return (len(digits) + 1) // 2 + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(1 + value_size(i) for i in x)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + value_size(i) for k, i in x.items())
    if kind in ("SS", "NS", "BS"):
        return sum(value_size({kind[0]: i}) for i in x)
    return 0


def item_size(item):
    return sum(len(k.encode()) + value_size(v) for k, v in (item or {}).items())


def key_of(table, item):
    if table not in key_schema:
        d = direct.describe_table(TableName=table)["Table"]["KeySchema"]
        key_schema[table] = [k["AttributeName"] for k in d]
    return {k: item[k] for k in key_schema[table]}


def current(table, key):
    return direct.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")


def tally():
    with lock:
        return state["tallies"].setdefault(
            state["scope"], {"requests": 0, "by_operation": {}, "write_units": 0.0, "read_units": 0.0, "sqs_requests": 0.0}
        )


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        target = self.headers.get("x-amz-target", "")
        auth = self.headers.get("authorization", "")
        service = auth.split("Credential=")[1].split("/")[3] if "Credential=" in auth else "?"
        if target:
            op = target.split(".")[-1]
        else:
            op = urllib.parse.parse_qs(body.decode(errors="replace")).get("Action", ["?"])[0]
        t = tally()
        t["requests"] += 1
        name = f"{service}:{op}"
        t["by_operation"][name] = t["by_operation"].get(name, 0) + 1
        before = None
        req = json.loads(body) if service == "dynamodb" and body else {}
        if service == "dynamodb" and op in ("PutItem", "UpdateItem", "DeleteItem"):
            key = req.get("Key") or key_of(req["TableName"], req["Item"])
            before = item_size(current(req["TableName"], key))
        conn = http.client.HTTPConnection(urllib.parse.urlparse(UPSTREAM).netloc, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
        conn.request("POST", self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if service == "dynamodb" and op in ("PutItem", "UpdateItem", "DeleteItem"):
            key = req.get("Key") or key_of(req["TableName"], req["Item"])
            after = item_size(current(req["TableName"], key))
            t["write_units"] += max(1, math.ceil(max(before, after) / 1024))
        elif service == "dynamodb" and op == "GetItem":
            found = json.loads(data).get("Item")
            t["read_units"] += max(1, math.ceil(item_size(found) / 4096))
        elif service == "sqs" and op.startswith("SendMessage"):
            msg = json.loads(body)
            size = sum(len(e.get("MessageBody", "")) for e in msg.get("Entries", [msg]))
            t["sqs_requests"] += max(1, math.ceil(size / 65536))
        elif service == "sqs":
            t["sqs_requests"] += 1
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


proxy = Server(("127.0.0.1", 0), Proxy)
threading.Thread(target=proxy.serve_forever, daemon=True).start()
os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.server_address[1]}"

# ---------------------------------------------------------------- the pattern

import stripe  # noqa: E402  (after the endpoint is the proxy's)
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response  # noqa: E402
from aws_lambda_powertools.utilities.idempotency import (  # noqa: E402
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from standardwebhooks.webhooks import Webhook  # noqa: E402

run = uuid.uuid4().hex[:8]
IDEMPOTENCY = f"pt-idem-{run}"
PROJECTION = f"pt-proj-{run}"
direct.create_table(TableName=IDEMPOTENCY, BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
direct.create_table(TableName=PROJECTION, BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
raw_sqs = boto3.client("sqs", endpoint_url=UPSTREAM)
queue_url = raw_sqs.create_queue(QueueName=f"pt-work-{run}")["QueueUrl"]

sqs = boto3.client("sqs")
projection = boto3.resource("dynamodb").Table(PROJECTION)
persistence = DynamoDBPersistenceLayer(table_name=IDEMPOTENCY)
config = IdempotencyConfig(event_key_jmespath="id", expires_after_seconds=3600)
processor = BatchProcessor(event_type=EventType.SQS)


def intake(provider, body, headers):
    """The intake Lambda: verify with the provider's SDK, then enqueue."""
    if provider == "stripe":
        event = stripe.Webhook.construct_event(body, headers["stripe-signature"], STRIPE_SECRET)
        event_id = event["id"]
    else:
        Webhook(SVIX_SECRET).verify(body, headers)
        event_id = headers["webhook-id"]
    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"id": event_id, "body": body}))
    return {"statusCode": 202}


@idempotent_function(data_keyword_argument="message", persistence_store=persistence, config=config)
def apply(message):
    """The team's projection: the event's subject's latest state, one write."""
    event = json.loads(message["body"])
    subject = str(event.get("data", {}).get("object", {}).get("id") or event.get("data", {}).get("account") or message["id"])
    projection.put_item(Item={"pk": subject, "event_id": message["id"], "type": str(event.get("type", ""))})
    return {"applied": message["id"]}


def record_handler(record):
    apply(message=json.loads(record.body))


def processor_handler(event, context=None):
    config.register_lambda_context(context)
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)


class Context:
    function_name = "bench"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    aws_request_id = "bench"

    @staticmethod
    def get_remaining_time_in_millis():
        return 300_000




def signed(provider, body, event_id):
    now = int(time.time())
    if provider == "stripe":
        mac = hmac.new(STRIPE_SECRET.encode(), f"{now}.{body}".encode(), hashlib.sha256).hexdigest()
        return {"stripe-signature": f"t={now},v1={mac}"}
    sig = Webhook(SVIX_SECRET).sign(event_id, __import__("datetime").datetime.now(__import__("datetime").timezone.utc), body)
    return {"webhook-id": event_id, "webhook-timestamp": str(now), "webhook-signature": sig}


def renamed(body, provider, event_id):
    """The sample with its own id (Stripe's is in the body)."""
    if provider != "stripe":
        return body
    v = json.loads(body)
    v["id"] = event_id
    return json.dumps(v)


def measure(scope, fn, cpu):
    with lock:
        state["scope"] = scope
    tally()
    started = time.process_time()
    out = fn()
    cpu[scope] = cpu.get(scope, 0.0) + (time.process_time() - started) * 1000
    with lock:
        state["scope"] = "harness"
    return out


def main():
    samples = json.load(open(sys.argv[1]))["samples"]
    n = int(sys.argv[2])
    cpu, counts = {}, {}
    for contract, sample in samples.items():
        events = n if contract != "large" else max(1, (n + 3) // 4)
        for i in range(events):
            event_id = f"evt_{contract}_{run}_{i}"
            body = renamed(sample["body"], sample["provider"], event_id)
            for flow in ("intake_new", "processor", "intake_duplicate", "processor_duplicate", "processor_redelivery"):
                if contract == "large" and flow in ("intake_new", "processor"):
                    flow = flow.replace("new", "large") if flow == "intake_new" else "processor_large"
                scope = f"{flow}/{contract}"
                counts[scope] = counts.get(scope, 0) + 1
                if flow.startswith("intake"):
                    headers = signed(sample["provider"], body, event_id)
                    measure(scope, lambda: intake(sample["provider"], body, headers), cpu)
                    got = raw_sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1)["Messages"][0]
                    raw_sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=got["ReceiptHandle"])
                    message = got
                else:
                    record = {"messageId": message["MessageId"], "receiptHandle": message["ReceiptHandle"],
                              "body": message["Body"], "attributes": {}, "messageAttributes": {},
                              "md5OfBody": message["MD5OfBody"], "eventSource": "aws:sqs",
                              "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:pt-work", "awsRegion": "us-east-1"}
                    answer = measure(scope, lambda: processor_handler({"Records": [record]}, Context()), cpu)
                    assert answer == {"batchItemFailures": []}, answer
    flows = {}
    for scope, count in counts.items():
        t = state["tallies"].get(scope, {"requests": 0, "by_operation": {}, "write_units": 0, "read_units": 0, "sqs_requests": 0})
        per = lambda x: x / count  # noqa: E731
        flows[scope] = {
            "events": count,
            "requests": per(t["requests"]),
            "by_operation": {k: per(v) for k, v in sorted(t["by_operation"].items())},
            "dynamodb_requests": per(sum(v for k, v in t["by_operation"].items() if k.startswith("dynamodb:"))),
            "write_units": per(t["write_units"]),
            "read_units": per(t["read_units"]),
            "sqs_requests": per(t["sqs_requests"]),
            "sns_requests": 0.0,
            "s3_put_requests": 0.0,
            "s3_get_requests": 0.0,
            "cpu_ms": per(cpu.get(scope, 0.0)),
            "log_bytes": 0.0,
        }
    print(json.dumps({"events_per_contract": n, "flows": flows}, indent=2, sort_keys=True))
    proxy.shutdown()


if __name__ == "__main__":
    main()
