"""Fake Stripe and GitHub APIs for the local stack (loopback only).

Stripe: GET /v1/subscriptions/{id}; GET /v1/events (newest first; limit,
created[gte], created[lt], types[], starting_after, as Stripe pages it);
GET /v1/events/{id} (one event, what a replay of a parked event asks for).
GitHub, one hook per path: GET /repos/{owner}/{repo}/hooks/{id}/deliveries
(newest first, Link cursors), GET .../deliveries/{id} (with the kept
payload; `null` for a delivery seeded without one, as GitHub serves some),
POST .../deliveries/{id}/attempts (a redelivery request, recorded).

Both check a bearer key (DEV_STRIPE_API_KEY, DEV_GITHUB_TOKEN from the
environment). The demo seeds state through POST /_admin/stripe/subscriptions,
/_admin/stripe/events and /_admin/github/deliveries (JSON bodies; a delivery
posted again with the same id replaces the first, so a payload can be
served later: a backfill parks the delivery, a replay then fetches it).
"""

import argparse
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

LOCK = threading.Lock()
SUBSCRIPTIONS = {}
EVENTS = []  # newest first
DELIVERIES = {}  # hook path -> list, newest first
REDELIVERED = []
DELIVERIES_PATH = re.compile(r"^/((?:repos/[^/]+/[^/]+|orgs/[^/]+)/hooks/\d+|app/hook)/deliveries(?:/(\d+)(/attempts)?)?$")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):  # quiet; the stack's logs are the functions'
        pass

    def answer(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def authorised(self, env):
        return self.headers.get("authorization", "") == "Bearer " + os.environ.get(env, "\0")

    def body(self):
        n = int(self.headers.get("content-length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_POST(self):
        url = urlparse(self.path)
        with LOCK:
            if url.path == "/_admin/stripe/subscriptions":
                sub = self.body()
                SUBSCRIPTIONS[sub["id"]] = sub
                return self.answer(200, sub)
            if url.path == "/_admin/stripe/events":
                ev = self.body()
                EVENTS.append(ev)
                EVENTS.sort(key=lambda e: (e["created"], e["id"]), reverse=True)
                return self.answer(200, ev)
            if url.path == "/_admin/github/deliveries":
                d = self.body()
                listed = DELIVERIES.setdefault(d.pop("hook"), [])
                same = next((i for i, old in enumerate(listed) if old["id"] == d["id"]), None)
                if same is None:
                    listed.insert(0, d)
                else:
                    listed[same] = d
                return self.answer(200, d)
            m = DELIVERIES_PATH.match(url.path)
            if m and m.group(3):
                if not self.authorised("DEV_GITHUB_TOKEN"):
                    return self.answer(401, {"message": "Bad credentials"})
                REDELIVERED.append(int(m.group(2)))
                return self.answer(202, {})
        self.answer(404, {"error": "not found"})

    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        with LOCK:
            if url.path.startswith("/v1/"):
                if not self.authorised("DEV_STRIPE_API_KEY"):
                    return self.answer(401, {"error": {"type": "invalid_request_error", "message": "Invalid API Key"}})
                if url.path.startswith("/v1/subscriptions/"):
                    sub = SUBSCRIPTIONS.get(url.path.rsplit("/", 1)[1])
                    return self.answer(200, sub) if sub else self.answer(404, {"error": {"code": "resource_missing"}})
                if url.path == "/v1/events":
                    return self.answer(200, self.events(q))
                if url.path.startswith("/v1/events/"):
                    ev = next((e for e in EVENTS if e["id"] == url.path.rsplit("/", 1)[1]), None)
                    return self.answer(200, ev) if ev else self.answer(404, {"error": {"code": "resource_missing"}})
            m = DELIVERIES_PATH.match(url.path)
            if m:
                if not self.authorised("DEV_GITHUB_TOKEN"):
                    return self.answer(401, {"message": "Bad credentials"})
                listed = DELIVERIES.get(m.group(1), [])
                if m.group(2):
                    d = next((d for d in listed if d["id"] == int(m.group(2))), None)
                    if d is None:
                        return self.answer(404, {"message": "Not Found"})
                    return self.answer(200, {**{k: v for k, v in d.items() if k != "payload"}, "request": {"payload": d.get("payload")}})
                start = int((q.get("cursor") or ["0"])[0])
                per_page = int((q.get("per_page") or ["30"])[0])
                page = [{k: v for k, v in d.items() if k != "payload"} for d in listed[start:start + per_page]]
                headers = []
                if start + per_page < len(listed):
                    nxt = f"http://{self.headers.get('host')}{url.path}?per_page={per_page}&cursor={start + per_page}"
                    headers.append(("Link", f'<{nxt}>; rel="next"'))
                return self.answer(200, page, headers)
        self.answer(404, {"error": "not found"})

    @staticmethod
    def events(q):
        def num(name):
            v = q.get(name)
            return int(v[0]) if v else None

        gte, lt, types = num("created[gte]"), num("created[lt]"), q.get("types[]", [])
        matching = [
            e for e in EVENTS
            if (gte is None or e["created"] >= gte) and (lt is None or e["created"] < lt) and (not types or e["type"] in types)
        ]
        start = 0
        after = q.get("starting_after")
        if after:
            ids = [e["id"] for e in matching]
            start = ids.index(after[0]) + 1 if after[0] in ids else len(matching)
        limit = min(num("limit") or 10, 100)
        page = matching[start:start + limit]
        return {"object": "list", "url": "/v1/events", "has_more": start + len(page) < len(matching), "data": page}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
