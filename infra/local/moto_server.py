"""Starts moto server for the local stack and the integration tests.

Two adjustments, neither changing what a request returns:

1. Atomicity. DynamoDB makes each conditional write atomic with respect to
   its item. moto's server answers requests on many threads and does not lock
   its DynamoDB backend, so two concurrent conditional puts could both pass
   their condition. This launcher serialises DynamoDB requests (and only those:
   SQS long polls must not block the rest).

2. Speed. moto's TransactWriteItems deep-copies every table a transaction
   touches (once per item) so it can roll back, which makes each transaction
   cost O(table size). With requests serialised, an undo log of just the items
   the transaction touches gives the same rollback at O(items). Two costs paid
   on every request or subscription, measured with a sampling profiler under
   the integration tests (about a sixth of the server's time), are paid once:
   the list of moto's service modules, read from disk for each request's host,
   and the RSA key SNS signs its HTTP(S) notifications with, generated for each
   new subscription (AWS signs with one certificate per region, not one per
   subscription).
"""

import argparse
import copy
import threading
import types

import moto.dynamodb.models as ddb_models
from moto.dynamodb.models.table import Table

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

_dynamodb_lock = threading.Lock()


def _transaction_with_undo_log():
    original = ddb_models.DynamoDBBackend.transact_write_items
    # Inside moto's function, "copy.deepcopy(table)" keeps the table itself;
    # its rollback then reassigns the same object, and ours restores items.
    shim = types.SimpleNamespace(
        deepcopy=lambda obj, *a, **k: obj if isinstance(obj, Table) else copy.deepcopy(obj, *a, **k)
    )
    ddb_models.copy = shim

    def transact_write_items(self, transact_items):
        undo = []
        for entry in transact_items:
            _, op = next(iter(entry.items()))
            table_name = op.get("TableName")
            if table_name not in self.tables:
                continue
            table = self.tables[table_name]
            if "Item" in op:
                key = {table.hash_key_attr: op["Item"][table.hash_key_attr]}
                if table.range_key_attr is not None and table.range_key_attr in op["Item"]:
                    key[table.range_key_attr] = op["Item"][table.range_key_attr]
            else:
                key = op.get("Key")
            if not key:
                continue
            try:
                before = self.get_item(table_name, key)
            except Exception:  # invalid keys: moto itself reports them below
                continue
            undo.append((table_name, key, copy.deepcopy(before.to_json()["Attributes"]) if before else None))
        try:
            return original(self, transact_items)
        except Exception:
            for table_name, key, before in reversed(undo):
                try:
                    if before is None:
                        self.delete_item(table_name, key)
                    else:
                        self.put_item(table_name, before)
                except Exception:
                    pass
            raise

    ddb_models.DynamoDBBackend.transact_write_items = transact_write_items


def _costs_paid_once():
    import moto.backends as backends
    import moto.sns.models as sns_models
    from cryptography.hazmat.primitives.asymmetric import rsa

    modules = frozenset(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules

    key = []

    def private_key(_subscription):
        if not key:
            key.append(rsa.generate_private_key(public_exponent=65537, key_size=2048))
        return key[0]

    sns_models.Subscription.private_key = private_key


def serialise_dynamodb(app):
    def wrapped(environ, start_response):
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target.startswith("DynamoDB"):
            with _dynamodb_lock:
                # Materialise the response while holding the lock.
                body = list(app(environ, start_response))
            return body
        return app(environ, start_response)

    return wrapped


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    _transaction_with_undo_log()
    _costs_paid_once()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        serialise_dynamodb(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
