"""The comparison for `init_bench`: an idempotent handler as Powertools for AWS
Lambda (Python) documents it, a DynamoDB persistence layer keyed on a request
header, started through the official runtime interface client:

    python -m awslambdaric handler.fn

Everything at module level is its init (the imports and the persistence layer
with its boto3 client); the bench measures it from spawn to the first
`GET /runtime/invocation/next`. The benched request carries no idempotency key,
so the decorator skips the persistence layer and no AWS call is made (the same
as the Rust intake's request, rejected before any AWS call).
"""

import os

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent,
)

persistence = DynamoDBPersistenceLayer(table_name=os.environ["IDEMPOTENCY_TABLE"])
config = IdempotencyConfig(event_key_jmespath='headers."idempotency-key"', raise_on_no_idempotency_key=False)


@idempotent(persistence_store=persistence, config=config)
def fn(event, context):
    return {"statusCode": 202, "headers": {"content-type": "application/json"}, "body": '{"code":"accepted"}'}
