"""A Lambda consuming a Hookledger route's SQS destination, in Python.

Hookledger delivers each verified event at least once to each destination,
under one key per (event, destination): the envelope's `idempotency_key`
(also the message attribute `idempotency-key`). The consumer de-duplicates
on it with Powertools' idempotency utility, so its business logic runs once
per event however often the message arrives (an SQS redelivery, Hookledger's
own retry after a lost acknowledgement).

Environment: IDEMPOTENCY_TABLE (a DynamoDB table with the partition key `id`,
as Powertools documents), EFFECTS_TABLE (where this example records what it
did; yours does its own work instead).
"""

import json
import os

import boto3
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

persistence = DynamoDBPersistenceLayer(table_name=os.environ["IDEMPOTENCY_TABLE"])
# Keep the keys at least as long as a destination may redeliver (Hookledger
# retries a delivery for 24 hours; SQS keeps a message up to 14 days).
config = IdempotencyConfig(event_key_jmespath="idempotency_key", expires_after_seconds=14 * 86_400)
processor = BatchProcessor(event_type=EventType.SQS)
effects = boto3.resource("dynamodb").Table(os.environ["EFFECTS_TABLE"])


@idempotent_function(data_keyword_argument="envelope", persistence_store=persistence, config=config)
def handle(envelope: dict) -> dict:
    """The team's own logic, run once per delivered event."""
    effects.update_item(
        Key={"id": f"{envelope['provider']}#{envelope['event_id']}"},
        UpdateExpression="ADD applied :one SET event_type = :t",
        ExpressionAttributeValues={":one": 1, ":t": envelope["event_type"]},
    )
    return {"event_id": envelope["event_id"]}


def record_handler(record):
    handle(envelope=json.loads(record.body))


def lambda_handler(event, context):
    config.register_lambda_context(context)
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
