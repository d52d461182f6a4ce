"""Runs consumer.py's handler over SQS messages as the Lambda trigger hands
them over, each batch twice (an at-least-once destination), and prints what
the consumer applied: `{"events": N, "applied": {event: times}}`.

Usage: run_against.py MESSAGES_JSON   (a list of {"messageId", "body"});
AWS_ENDPOINT_URL points boto3 at the emulator. Creates its two tables.
"""

import json
import sys
import uuid

import boto3

suffix = uuid.uuid4().hex[:10]
import os

os.environ.setdefault("IDEMPOTENCY_TABLE", f"consumer-idempotency-{suffix}")
os.environ.setdefault("EFFECTS_TABLE", f"consumer-effects-{suffix}")
ddb = boto3.client("dynamodb")
for name in (os.environ["IDEMPOTENCY_TABLE"], os.environ["EFFECTS_TABLE"]):
    ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                     AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                     KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])

import consumer  # noqa: E402  (after the tables exist)


class Context:
    function_name = "consumer"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:consumer"
    aws_request_id = "local"

    @staticmethod
    def get_remaining_time_in_millis():
        return 30_000


messages = json.load(open(sys.argv[1]))
records = [{"messageId": m["messageId"], "receiptHandle": "r", "body": m["body"], "attributes": {},
            "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:deliveries", "awsRegion": "us-east-1"}
           for m in messages]
for _ in range(2):
    answer = consumer.lambda_handler({"Records": records}, Context())
    assert answer == {"batchItemFailures": []}, answer
applied = {}
for item in boto3.resource("dynamodb").Table(os.environ["EFFECTS_TABLE"]).scan()["Items"]:
    applied[item["id"]] = int(item["applied"])
print(json.dumps({"events": len(applied), "applied": applied}))
