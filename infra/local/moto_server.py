"""Starts moto server for the local stack and the integration tests.

DynamoDB makes each conditional write atomic with respect to its item. moto's
server answers requests on many threads and does not lock its DynamoDB backend,
so two concurrent conditional puts could both pass their condition. This
launcher serialises DynamoDB requests (and only those: SQS long polls must not
block the rest), which restores the guarantee the real service gives.
"""

import argparse
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

_dynamodb_lock = threading.Lock()


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
