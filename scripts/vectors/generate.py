"""Writes shared/testdata/providers/<preset>/ for every HMAC preset and alias.

For each preset, four kinds of file (each named in the folder's MANIFEST with
where it comes from):

  ours.json         a delivery signed by `hookledger send --print` (our sign),
                    accepted by the provider's own verifier where its SDK has one
                    (the MANIFEST names package@version and function);
  independent.json  a delivery signed by this file's own implementation of the
                    provider's documented formula (the doc URL), also checked by
                    the SDK's verifier where there is one;
  sdk.json          where the SDK can sign: a delivery signed by the SDK itself;
  retry.json        the independent delivery as the provider retries it: a new
                    timestamp and signature, the retry counters changed, the same
                    event (`same_event_as`);
  published.json    the provider's published example, where it has one.

The SDK verifiers check the real clock, so every delivery is signed now and the
vector records `now`; the test command replays them at that time. Run by
scripts/provider-vectors (its own venv and npm packages, pinned); the test
command only reads the files.
"""

import base64
import hashlib
import hmac
import importlib.metadata as md
import json
import os
import subprocess
import sys
import time
import urllib.parse
import uuid
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = sys.argv[1]
OUT = sys.argv[2]
NOW = int(time.time())
NODE_DIR = HERE


def pkg(name):
    return f"{name}@{md.version(name)}"


def npm(name):
    with open(os.path.join(NODE_DIR, "node_modules", *name.split("/"), "package.json")) as f:
        return f"{name}@{json.load(f)['version']}"


def compact(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def rfc3339(t):
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def mac(secret, msg, algo=hashlib.sha256):
    key = secret if isinstance(secret, bytes) else secret.encode()
    return hmac.new(key, msg, algo).digest()


def b64(b):
    return base64.b64encode(b).decode()


def json_id(body, *pointers):
    doc = json.loads(body)
    out = []
    for p in pointers:
        v = doc
        for part in p.strip("/").split("/"):
            v = v[int(part)] if isinstance(v, list) else v[part]
        out.append(str(v) if not isinstance(v, str) else v)
    return ":".join(out)


def body_hash(body):
    return hashlib.sha256(body).hexdigest()


# ---------------------------------------------------------------------------
# The providers, from their documentation. Each entry:
#   doc: where the formula is documented
#   secret: a secret in the provider's format
#   url: the public URL, for providers that sign it
#   body(event, now) -> bytes: a delivery in the documented shape
#   sign(secret, body, now, event) -> [(header, value)]: the documented formula
#   ids(body, headers) -> [(id, type)]: the identity the preset must read
#   retry(body, now) -> bytes: the body as the provider retries it
#   sdk_verify(secret, url, headers, body) -> bool, with sdk_name (optional)
#   sdk_sign(secret, url, body, now, event) -> headers, with sdk_sign_name (optional)
# ---------------------------------------------------------------------------

P = {}


def hdr(headers, name):
    for k, v in headers:
        if k.lower() == name.lower():
            return v
    return None


def hdict(headers):
    return {k.lower(): v for k, v in headers}


# Shopify ---------------------------------------------------------------------
def shopify_body(ev, now):
    return compact({"id": 820982911946154508, "email": "jon@example.com", "total_price": "10.00",
                    "updated_at": rfc3339(now), "note": f"order {ev}"})


P["shopify"] = dict(
    doc="https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-2-validate-the-origin-of-your-webhook-to-ensure-its-coming-from-shopify",
    secret="shpss_0123456789abcdef0123456789abcdef",
    body=shopify_body,
    sign=lambda s, b, now, ev: [("X-Shopify-Hmac-Sha256", b64(mac(s, b))), ("X-Shopify-Topic", "orders/updated"),
                                ("X-Shopify-Event-Id", ev), ("X-Shopify-Webhook-Id", str(uuid.uuid4())),
                                ("X-Shopify-Shop-Domain", "demo.myshopify.com"), ("X-Shopify-API-Version", "2025-10"),
                                ("X-Shopify-Triggered-At", rfc3339(now))],
    ids=lambda b, h: [(hdr(h, "X-Shopify-Event-Id"), hdr(h, "X-Shopify-Topic"))],
    retry=lambda b, now: b,
)

# Twilio ----------------------------------------------------------------------
TWILIO_URL = "https://hooks.example.com/webhooks/twilio"


def twilio_body(ev, now):
    return urllib.parse.urlencode({"MessageSid": f"SM{ev}", "SmsStatus": "delivered", "MessageStatus": "delivered",
                                   "To": "+15558675310", "From": "+15017122661",
                                   "AccountSid": "AC" + "0" * 31 + "1", "ApiVersion": "2010-04-01"}).encode()


def twilio_sign(s, b, now, ev, url=TWILIO_URL):
    params = sorted(urllib.parse.parse_qsl(b.decode()))
    signed = url + "".join(k + v for k, v in params)
    return [("X-Twilio-Signature", b64(mac(s, signed.encode(), hashlib.sha1))),
            ("Content-Type", "application/x-www-form-urlencoded")]


def twilio_sdk_verify(s, url, h, b):
    from twilio.request_validator import RequestValidator
    return RequestValidator(s).validate(url, dict(urllib.parse.parse_qsl(b.decode())), hdr(h, "X-Twilio-Signature"))


def twilio_sdk_sign(s, url, b, now, ev):
    from twilio.request_validator import RequestValidator
    sig = RequestValidator(s).compute_signature(url, dict(urllib.parse.parse_qsl(b.decode())))
    return [("X-Twilio-Signature", sig), ("Content-Type", "application/x-www-form-urlencoded")]


P["twilio"] = dict(
    doc="https://www.twilio.com/docs/usage/webhooks/webhooks-security#validating-signatures-from-twilio",
    secret="12345", url=TWILIO_URL, body=twilio_body, sign=twilio_sign,
    ids=lambda b, h: [(body_hash(b), None)],
    retry=lambda b, now: b,
    sdk_verify=twilio_sdk_verify, sdk_name=lambda: pkg("twilio") + " twilio.request_validator.RequestValidator.validate",
    sdk_sign=twilio_sdk_sign, sdk_sign_name=lambda: pkg("twilio") + " twilio.request_validator.RequestValidator.compute_signature",
)

# Square ----------------------------------------------------------------------
SQUARE_URL = "https://hooks.example.com/webhooks/square"


def square_body(ev, now):
    return compact({"merchant_id": "6SSW7HV8K2ST5", "type": "payment.updated", "event_id": ev,
                    "created_at": rfc3339(now), "data": {"type": "payment", "id": "KkAkhdMsgzn59SM8A89WgKwekxLZY",
                                                         "object": {"payment": {"status": "COMPLETED"}}}})


def square_sdk_verify(s, url, h, b):
    from square.utils.webhooks_helper import verify_signature
    return verify_signature(request_body=b.decode(), signature_header=hdr(h, "x-square-hmacsha256-signature"),
                            signature_key=s, notification_url=url)


P["square"] = dict(
    doc="https://developer.squareup.com/docs/webhooks/step3validate",
    secret="Ft9xXt1qFA3hNfLw1LbRJg", url=SQUARE_URL, body=square_body,
    sign=lambda s, b, now, ev: [("x-square-hmacsha256-signature", b64(mac(s, SQUARE_URL.encode() + b)))],
    ids=lambda b, h: [(json_id(b, "/event_id"), json_id(b, "/type"))],
    retry=lambda b, now: b,
    sdk_verify=square_sdk_verify, sdk_name=lambda: pkg("squareup") + " square.utils.webhooks_helper.verify_signature",
)

# Razorpay --------------------------------------------------------------------
def razorpay_body(ev, now):
    return compact({"entity": "event", "account_id": "acc_BFQ7uQEaa7j2z7", "event": "payment.captured",
                    "contains": ["payment"], "payload": {"payment": {"entity": {"id": "pay_DESlfW9H8K9uqM",
                                                                                 "amount": 100, "currency": "INR"}}},
                    "created_at": now})


def razorpay_sdk_verify(s, url, h, b):
    import razorpay
    return razorpay.Client(auth=("rzp_test_key", "rzp_test_secret")).utility.verify_webhook_signature(
        b.decode(), hdr(h, "X-Razorpay-Signature"), s)


P["razorpay"] = dict(
    doc="https://razorpay.com/docs/webhooks/validate-test/",
    secret="razorpay-webhook-secret", body=razorpay_body,
    sign=lambda s, b, now, ev: [("X-Razorpay-Signature", mac(s, b).hex()), ("x-razorpay-event-id", ev)],
    ids=lambda b, h: [(hdr(h, "x-razorpay-event-id"), json_id(b, "/event"))],
    retry=lambda b, now: b,
    sdk_verify=razorpay_sdk_verify,
    sdk_name=lambda: pkg("razorpay") + " razorpay.Client().utility.verify_webhook_signature",
)

# Paddle ----------------------------------------------------------------------
def paddle_body(ev, now):
    return compact({"event_id": f"evt_{ev}", "event_type": "subscription.activated", "occurred_at": rfc3339(now),
                    "notification_id": "ntf_01h8bkrfe7w1vwf8xmytwn51e7",
                    "data": {"id": "sub_01h8bkrb3ykxjh6z0j2dr2qb0m", "status": "active"}})


def paddle_sign(s, b, now, ev):
    return [("Paddle-Signature", f"ts={now};h1={mac(s, f'{now}:'.encode() + b).hex()}")]


class _Headers(dict):
    def get(self, name, default=None):
        return next((v for k, v in self.items() if k.lower() == name.lower()), default)


class _Req:
    def __init__(self, headers, body):
        self.headers = _Headers(headers)
        self.body = body


def paddle_sdk_verify(s, url, h, b):
    from paddle_billing.Notifications import Secret, Verifier
    return Verifier().verify(_Req({k: v for k, v in h}, b), Secret(s))


def paddle_sdk_sign(s, url, b, now, ev):
    from paddle_billing.Notifications.PaddleSignature import PaddleSignature
    sig = PaddleSignature.calculate_hmac(s, f"{now}:{b.decode()}".encode()).hexdigest()
    return [("Paddle-Signature", f"ts={now};h1={sig}")]


P["paddle"] = dict(
    doc="https://developer.paddle.com/webhooks/signature-verification",
    secret="pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_6h3qd3uFSi9YCD3OLYAShQI90XTI5vEI",
    body=paddle_body, sign=paddle_sign,
    ids=lambda b, h: [(json_id(b, "/event_id"), json_id(b, "/event_type"))],
    retry=lambda b, now: b,
    sdk_verify=paddle_sdk_verify, sdk_name=lambda: pkg("paddle-python-sdk") + " paddle_billing.Notifications.Verifier.verify",
    sdk_sign=paddle_sdk_sign,
    sdk_sign_name=lambda: pkg("paddle-python-sdk") + " paddle_billing.Notifications.PaddleSignature.calculate_hmac",
)

# HubSpot ---------------------------------------------------------------------
HUBSPOT_URL = "https://hooks.example.com/webhooks/hubspot"


def hubspot_body(ev, now):
    n = int(ev[:10], 16)
    return compact([
        {"eventId": n, "subscriptionId": 2881778, "portalId": 62515, "appId": 1160452, "occurredAt": now * 1000,
         "subscriptionType": "contact.propertyChange", "attemptNumber": 0, "objectId": 1246965,
         "propertyName": "lifecyclestage", "propertyValue": "subscriber", "changeSource": "CRM_UI"},
        {"eventId": n + 1, "subscriptionId": 2881779, "portalId": 62515, "appId": 1160452, "occurredAt": now * 1000,
         "subscriptionType": "contact.creation", "attemptNumber": 0, "objectId": 1246966, "changeSource": "CRM_UI"},
    ])


def hubspot_sign(s, b, now, ev):
    ts = str(now * 1000)
    signed = b"POST" + HUBSPOT_URL.encode() + b + ts.encode()
    return [("X-HubSpot-Signature-v3", b64(mac(s, signed))), ("X-HubSpot-Request-Timestamp", ts)]


def hubspot_ids(b, h):
    return [(f"{e['subscriptionId']}:{e['eventId']}:{e['occurredAt']}", e["subscriptionType"]) for e in json.loads(b)]


def hubspot_retry(b, now):
    events = json.loads(b)
    for e in events:
        e["attemptNumber"] += 1
    return compact(events)


def hubspot_sdk_verify(s, url, h, b):
    from hubspot.utils.signature import Signature
    return Signature.is_valid(signature=hdr(h, "X-HubSpot-Signature-v3"), client_secret=s, request_body=b.decode(),
                              http_uri=url, http_method="POST", signature_version="v3",
                              timestamp=hdr(h, "X-HubSpot-Request-Timestamp"))


def hubspot_sdk_sign(s, url, b, now, ev):
    from hubspot.utils.signature import Signature
    ts = str(now * 1000)
    sig = Signature.get_signature(s, b.decode(), "v3", url, "POST", ts)
    return [("X-HubSpot-Signature-v3", sig), ("X-HubSpot-Request-Timestamp", ts)]


P["hubspot"] = dict(
    doc="https://developers.hubspot.com/docs/apps/legacy-apps/authentication/validating-requests",
    secret="b2f9a5c4-1111-4e2d-9a3b-000000000001", url=HUBSPOT_URL, body=hubspot_body, sign=hubspot_sign,
    ids=hubspot_ids, retry=hubspot_retry,
    sdk_verify=hubspot_sdk_verify, sdk_name=lambda: pkg("hubspot-api-client") + " hubspot.utils.signature.Signature.is_valid (v3)",
    sdk_sign=hubspot_sdk_sign, sdk_sign_name=lambda: pkg("hubspot-api-client") + " hubspot.utils.signature.Signature.get_signature (v3)",
)

# Mailgun ---------------------------------------------------------------------
def mailgun_seal(s, doc, now):
    token = hashlib.sha256(f"{now}{doc['event-data']['id']}".encode()).hexdigest()[:50]
    sig = mac(s, f"{now}{token}".encode()).hex()
    doc["signature"] = {"timestamp": str(now), "token": token, "signature": sig}
    return compact(doc)


def mailgun_body(ev, now):
    return compact({"event-data": {"id": ev, "event": "delivered", "timestamp": now + 0.5,
                                   "recipient": "alice@example.com",
                                   "message": {"headers": {"message-id": "20130503182626.18666.16540@example.com"}}}})


P["mailgun"] = dict(
    doc="https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/securing-webhooks",
    secret="key-mailgun-signing-0123456789", body=mailgun_body,
    # The signature is in the body: sealing writes it there.
    seal=lambda s, b, now: mailgun_seal(s, json.loads(b), now),
    sign=lambda s, b, now, ev: [],
    ids=lambda b, h: [(json_id(b, "/event-data/id"), json_id(b, "/event-data/event"))],
    retry=lambda b, now: b,
)

# Linear ----------------------------------------------------------------------
def linear_body(ev, now):
    return compact({"action": "create", "type": "Issue", "createdAt": rfc3339(now - 2),
                    "data": {"id": str(uuid.UUID(ev)), "title": "Demo issue", "priority": 2},
                    "url": "https://linear.app/demo/issue/DEM-1",
                    "organizationId": "0c9c0e14-0d5f-4c4e-8b5a-6b8f6f2e1a00",
                    "webhookTimestamp": now * 1000, "webhookId": "5b0c3e0e-8f1e-4a0a-9e49-2b3c4d5e6f70"})


def linear_retry(b, now):
    doc = json.loads(b)
    doc["webhookTimestamp"] = now * 1000
    return compact(doc)


P["linear"] = dict(
    doc="https://linear.app/developers/webhooks#securing-webhooks",
    secret="lin_wh_0123456789abcdef", body=linear_body,
    sign=lambda s, b, now, ev: [("Linear-Signature", mac(s, b).hex()), ("Linear-Delivery", str(uuid.uuid4())),
                                ("Linear-Event", "Issue")],
    ids=lambda b, h: [(json_id(b, "/type", "/action", "/data/id", "/createdAt"), json_id(b, "/type", "/action"))],
    retry=linear_retry, node="linear",
)

# Intercom --------------------------------------------------------------------
def intercom_body(ev, now):
    return compact({"type": "notification_event", "app_id": "abc123",
                    "data": {"type": "notification_event_data", "item": {"type": "contact", "id": "6762f0d51bb69f9f2193bb7f"}},
                    "id": f"notif_{ev}", "topic": "contact.user.created", "delivery_status": "pending",
                    "delivery_attempts": 1, "delivered_at": 0, "first_sent_at": now, "created_at": now, "self": None})


def intercom_retry(b, now):
    doc = json.loads(b)
    doc["delivery_attempts"] += 1
    doc["delivery_status"] = "retry"
    doc["delivered_at"] = now
    return compact(doc)


P["intercom"] = dict(
    doc="https://developers.intercom.com/docs/references/webhooks/webhook-models#signed-notifications",
    secret="intercom-client-secret", body=intercom_body,
    sign=lambda s, b, now, ev: [("X-Hub-Signature", "sha1=" + mac(s, b, hashlib.sha1).hex())],
    ids=lambda b, h: [(json_id(b, "/id"), json_id(b, "/topic"))],
    retry=intercom_retry,
)

# Calendly --------------------------------------------------------------------
def calendly_body(ev, now):
    return compact({"created_at": rfc3339(now), "created_by": "https://api.calendly.com/users/AAAAAAAAAAAAAAAA",
                    "event": "invitee.created",
                    "payload": {"uri": f"https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/{ev}",
                                "email": "test@example.com", "status": "active"}})


P["calendly"] = dict(
    doc="https://developer.calendly.com/api-docs/4c305798a61d3-webhook-signatures",
    secret="calendly-signing-key", body=calendly_body,
    sign=lambda s, b, now, ev: [("Calendly-Webhook-Signature", f"t={now},v1={mac(s, f'{now}.'.encode() + b).hex()}")],
    ids=lambda b, h: [(json_id(b, "/event", "/payload/uri"), json_id(b, "/event"))],
    retry=lambda b, now: b,
)

# Mux -------------------------------------------------------------------------
def mux_body(ev, now):
    return compact({"type": "video.asset.ready", "id": str(uuid.UUID(ev)), "created_at": rfc3339(now),
                    "object": {"type": "asset", "id": "0201p02fGKPE7MrbC269XRD7LpcHhrmbu0002"},
                    "environment": {"name": "Production", "id": "j0863n"}, "data": {"status": "ready"},
                    "attempts": [], "accessor_source": None, "accessor": None, "request_id": None})


def mux_retry(b, now):
    doc = json.loads(b)
    doc["attempts"].append({"webhook_id": 1234, "response_status_code": 500, "address": "https://hooks.example.com",
                            "created_at": rfc3339(now - 60), "id": "a3e9b8a3-0c5f-4b5a-9c44-000000000001"})
    return compact(doc)


P["mux"] = dict(
    doc="https://docs.mux.com/core/verify-webhook-signatures",
    secret="muxwebhooksecret0123456789abcdef", body=mux_body,
    sign=lambda s, b, now, ev: [("Mux-Signature", f"t={now},v1={mac(s, f'{now}.'.encode() + b).hex()}")],
    ids=lambda b, h: [(json_id(b, "/id"), json_id(b, "/type"))],
    retry=mux_retry, node="mux",
)

# Typeform --------------------------------------------------------------------
def typeform_body(ev, now):
    return compact({"event_id": ev.upper()[:26], "event_type": "form_response",
                    "form_response": {"form_id": "lT4Z3j", "token": "a3a12ec67a1365927098a606107fac15",
                                      "submitted_at": rfc3339(now), "answers": []}})


P["typeform"] = dict(
    doc="https://www.typeform.com/developers/webhooks/secure-your-webhooks/",
    secret="typeform-secret", body=typeform_body,
    sign=lambda s, b, now, ev: [("Typeform-Signature", "sha256=" + b64(mac(s, b)))],
    ids=lambda b, h: [(json_id(b, "/event_id"), json_id(b, "/event_type"))],
    retry=lambda b, now: b,
)

# Coinbase Commerce -----------------------------------------------------------
def coinbase_body(ev, now):
    return compact({"id": 1, "scheduled_for": rfc3339(now), "attempt_number": 1,
                    "event": {"id": str(uuid.UUID(ev)), "resource": "event", "type": "charge:confirmed",
                              "api_version": "2018-03-22", "created_at": rfc3339(now),
                              "data": {"code": "66BEOV2A", "name": "The Sovereign Individual", "pricing_type": "no_price"}}})


def coinbase_retry(b, now):
    doc = json.loads(b)
    doc["id"] += 1
    doc["attempt_number"] += 1
    doc["scheduled_for"] = rfc3339(now)
    return compact(doc)


def coinbase_sdk_verify(s, url, h, b):
    from coinbase_commerce.webhook import WebhookSignature
    return WebhookSignature.verify_sig_header(b.decode(), hdr(h, "X-CC-Webhook-Signature"), s)


P["coinbase_commerce"] = dict(
    doc="https://docs.cloud.coinbase.com/commerce-onchain/docs/webhooks-security",
    secret="coinbase-shared-secret", body=coinbase_body,
    sign=lambda s, b, now, ev: [("X-CC-Webhook-Signature", mac(s, b).hex())],
    ids=lambda b, h: [(json_id(b, "/event/id"), json_id(b, "/event/type"))],
    retry=coinbase_retry,
    sdk_verify=coinbase_sdk_verify,
    sdk_name=lambda: pkg("coinbase-commerce") + " coinbase_commerce.webhook.WebhookSignature.verify_sig_header",
)

# Sentry ----------------------------------------------------------------------
def sentry_body(ev, now):
    return compact({"action": "created", "installation": {"uuid": "7a485448-a9e2-4c85-8a3c-4f44175783c9"},
                    "data": {"issue": {"id": str(int(ev[:8], 16)), "title": "ZeroDivisionError", "status": "unresolved"}},
                    "actor": {"type": "application", "id": "sentry", "name": "Sentry"}})


P["sentry"] = dict(
    doc="https://docs.sentry.io/organization/integrations/integration-platform/webhooks/#verifying-the-signature",
    secret="sentry-client-secret", body=sentry_body,
    sign=lambda s, b, now, ev: [("Sentry-Hook-Signature", mac(s, b).hex()), ("Sentry-Hook-Resource", "issue"),
                                ("Sentry-Hook-Timestamp", str(now)), ("Request-ID", str(uuid.uuid4()))],
    ids=lambda b, h: [(body_hash(b), "issue:" + json_id(b, "/action"))],
    retry=lambda b, now: b,
)

# Lemon Squeezy ---------------------------------------------------------------
def lemonsqueezy_body(ev, now):
    return compact({"meta": {"event_name": "subscription_updated", "custom_data": None},
                    "data": {"type": "subscriptions", "id": str(int(ev[:6], 16)),
                             "attributes": {"status": "active", "updated_at": rfc3339(now)}}})


P["lemonsqueezy"] = dict(
    doc="https://docs.lemonsqueezy.com/help/webhooks/signing-requests",
    secret="lemonsqueezy-signing-secret", body=lemonsqueezy_body,
    sign=lambda s, b, now, ev: [("X-Signature", mac(s, b).hex()), ("X-Event-Name", "subscription_updated")],
    ids=lambda b, h: [(json_id(b, "/meta/event_name", "/data/type", "/data/id", "/data/attributes/updated_at"),
                       json_id(b, "/meta/event_name"))],
    retry=lambda b, now: b,
)

# Box -------------------------------------------------------------------------
def box_body(ev, now):
    return compact({"type": "webhook_event", "id": str(uuid.UUID(ev)), "created_at": rfc3339(now),
                    "trigger": "FILE.UPLOADED", "webhook": {"id": "1234567890", "type": "webhook"},
                    "created_by": {"type": "user", "id": "2", "name": "Demo", "login": "demo@example.com"},
                    "source": {"id": "12345", "type": "file", "name": "demo.txt"}})


def box_sign(s, b, now, ev):
    ts = rfc3339(now)
    return [("BOX-SIGNATURE-PRIMARY", b64(mac(s, b + ts.encode()))), ("BOX-DELIVERY-TIMESTAMP", ts),
            ("BOX-DELIVERY-ID", str(uuid.uuid4())), ("BOX-SIGNATURE-VERSION", "1"),
            ("BOX-SIGNATURE-ALGORITHM", "HmacSHA256")]


def box_sdk_verify(s, url, h, b):
    from box_sdk_gen.managers.webhooks import WebhooksManager
    return WebhooksManager.validate_message(b.decode(), hdict(h), s, max_age=600)


def box_sdk_sign(s, url, b, now, ev):
    from box_sdk_gen.internal.utils import compute_webhook_signature
    headers = {"box-delivery-timestamp": rfc3339(now), "box-signature-version": "1",
               "box-signature-algorithm": "HmacSHA256"}
    sig = compute_webhook_signature(b.decode(), headers, s)
    return [("BOX-SIGNATURE-PRIMARY", sig)] + [(k.upper(), v) for k, v in headers.items()]


P["box"] = dict(
    doc="https://developer.box.com/guides/webhooks/v2/signatures-v2/",
    secret="box-primary-signature-key", body=box_body, sign=box_sign,
    ids=lambda b, h: [(json_id(b, "/id"), json_id(b, "/trigger"))],
    retry=lambda b, now: b,
    sdk_verify=box_sdk_verify, sdk_name=lambda: pkg("box-sdk-gen") + " box_sdk_gen.managers.webhooks.WebhooksManager.validate_message",
    sdk_sign=box_sdk_sign, sdk_sign_name=lambda: pkg("box-sdk-gen") + " box_sdk_gen.internal.utils.compute_webhook_signature",
)

# Zendesk ---------------------------------------------------------------------
def zendesk_body(ev, now):
    return compact({"type": "zen:event-type:ticket.created", "account_id": 12514403, "id": str(uuid.UUID(ev)),
                    "time": rfc3339(now), "zendesk_event_version": "2022-11-06", "subject": "zen:ticket:1",
                    "detail": {"id": "1", "status": "OPEN"}, "event": {}})


def zendesk_sign(s, b, now, ev):
    ts = rfc3339(now)
    return [("X-Zendesk-Webhook-Signature", b64(mac(s, ts.encode() + b))),
            ("X-Zendesk-Webhook-Signature-Timestamp", ts), ("X-Zendesk-Webhook-Id", "01F1P8WGJQ5XMPGZ2TWQ8YFJ0K"),
            ("X-Zendesk-Webhook-Invocation-Id", str(int(ev[:12], 16)))]


P["zendesk"] = dict(
    doc="https://developer.zendesk.com/documentation/webhooks/verifying/",
    secret="zendesk-signing-secret", body=zendesk_body, sign=zendesk_sign,
    ids=lambda b, h: [(hdr(h, "X-Zendesk-Webhook-Invocation-Id"), json_id(b, "/type"))],
    retry=lambda b, now: b,
)

# DocuSign --------------------------------------------------------------------
def docusign_body(ev, now):
    env = str(uuid.UUID(ev))
    return compact({"event": "envelope-completed", "apiVersion": "v2.1",
                    "uri": f"/restapi/v2.1/accounts/00000000-0000-4000-8000-000000000001/envelopes/{env}",
                    "retryCount": 0, "configurationId": 10418, "generatedDateTime": rfc3339(now),
                    "data": {"accountId": "00000000-0000-4000-8000-000000000001",
                             "userId": "00000000-0000-4000-8000-000000000002", "envelopeId": env}})


def docusign_retry(b, now):
    doc = json.loads(b)
    doc["retryCount"] += 1
    return compact(doc)


P["docusign"] = dict(
    doc="https://developers.docusign.com/platform/webhooks/connect/hmac/",
    secret="docusign-connect-hmac-key", body=docusign_body,
    sign=lambda s, b, now, ev: [("X-DocuSign-Signature-1", b64(mac(s, b))),
                                ("X-DocuSign-Signature-2", b64(mac("an-older-connect-key", b)))],
    ids=lambda b, h: [(json_id(b, "/event", "/data/envelopeId", "/generatedDateTime"), json_id(b, "/event"))],
    retry=docusign_retry,
)

# Vercel ----------------------------------------------------------------------
def vercel_body(ev, now):
    return compact({"id": ev, "type": "deployment.succeeded", "createdAt": now * 1000,
                    "payload": {"deployment": {"id": "dpl_2euZBFqxYdDMDG1jTrHFnNZ2eUVa", "url": "demo.vercel.app"}},
                    "region": "sfo1"})


P["vercel"] = dict(
    doc="https://vercel.com/docs/webhooks/webhooks-api#securing-webhooks",
    secret="vercel-webhook-secret", body=vercel_body,
    sign=lambda s, b, now, ev: [("x-vercel-signature", mac(s, b, hashlib.sha1).hex())],
    ids=lambda b, h: [(json_id(b, "/id"), json_id(b, "/type"))],
    retry=lambda b, now: b,
)

# Segment ---------------------------------------------------------------------
def segment_body(ev, now):
    return compact({"messageId": str(uuid.UUID(ev)), "type": "track", "event": "Order Completed", "userId": "u_1",
                    "timestamp": rfc3339(now), "properties": {"revenue": 19.99}})


P["segment"] = dict(
    doc="https://segment.com/docs/connections/destinations/catalog/actions-webhook/#authentication",
    secret="segment-shared-secret", body=segment_body,
    sign=lambda s, b, now, ev: [("X-Signature", mac(s, b, hashlib.sha1).hex())],
    ids=lambda b, h: [(json_id(b, "/messageId"), json_id(b, "/type"))],
    retry=lambda b, now: b,
)

# GitLab ----------------------------------------------------------------------
def gitlab_body(ev, now):
    return compact({"object_kind": "push", "event_name": "push", "ref": "refs/heads/main",
                    "checkout_sha": ev + "00000000", "project": {"id": 15, "path_with_namespace": "demo/app"},
                    "commits": []})


P["gitlab"] = dict(
    doc="https://docs.gitlab.com/user/project/integrations/webhooks/#custom-headers",
    secret="gitlab-secret-token", body=gitlab_body,
    sign=lambda s, b, now, ev: [("X-Gitlab-Token", s), ("X-Gitlab-Event", "Push Hook"),
                                ("Idempotency-Key", str(uuid.UUID(ev))), ("X-Gitlab-Event-UUID", str(uuid.uuid4())),
                                ("X-Gitlab-Instance", "https://gitlab.com")],
    ids=lambda b, h: [(hdr(h, "Idempotency-Key"), hdr(h, "X-Gitlab-Event"))],
    retry=lambda b, now: b,
)

# Bitbucket -------------------------------------------------------------------
def bitbucket_body(ev, now):
    return compact({"push": {"changes": [{"new": {"type": "branch", "name": "main", "target": {"hash": ev}}}]},
                    "repository": {"full_name": "demo/app", "uuid": "{00000000-0000-4000-8000-000000000003}"},
                    "actor": {"display_name": "Demo"}})


P["bitbucket"] = dict(
    doc="https://support.atlassian.com/bitbucket-cloud/docs/manage-webhooks/#Secure-webhooks",
    secret="bitbucket-webhook-secret", body=bitbucket_body,
    sign=lambda s, b, now, ev: [("X-Hub-Signature", "sha256=" + mac(s, b).hex()), ("X-Event-Key", "repo:push"),
                                ("X-Request-UUID", str(uuid.uuid4())),
                                ("X-Hook-UUID", "00000000-0000-4000-8000-000000000004")],
    ids=lambda b, h: [(body_hash(b), hdr(h, "X-Event-Key"))],
    retry=lambda b, now: b,
)

# Jira ------------------------------------------------------------------------
def jira_body(ev, now):
    return compact({"timestamp": now * 1000, "webhookEvent": "jira:issue_created",
                    "issue_event_type_name": "issue_created",
                    "issue": {"id": str(int(ev[:6], 16)), "key": "DEMO-1", "fields": {"summary": "Demo"}},
                    "user": {"accountId": "5b10a2844c20165700ede21g"}})


P["jira"] = dict(
    doc="https://developer.atlassian.com/cloud/jira/platform/webhooks/#secure-admin-webhooks",
    secret="jira-webhook-secret", body=jira_body,
    sign=lambda s, b, now, ev: [("X-Hub-Signature", "sha256=" + mac(s, b).hex()),
                                ("X-Atlassian-Webhook-Identifier", str(int(ev[:12], 16)))],
    ids=lambda b, h: [(hdr(h, "X-Atlassian-Webhook-Identifier"), json_id(b, "/webhookEvent"))],
    retry=lambda b, now: b,
)

# Cashfree --------------------------------------------------------------------
def cashfree_body(ev, now):
    return compact({"data": {"order": {"order_id": f"order_{ev}", "order_amount": 2.0, "order_currency": "INR"},
                             "payment": {"cf_payment_id": int(ev[:10], 16), "payment_status": "SUCCESS",
                                         "payment_amount": 2.0}},
                    "event_time": rfc3339(now), "type": "PAYMENT_SUCCESS_WEBHOOK"})


def cashfree_sign(s, b, now, ev):
    ts = str(now * 1000)
    return [("x-webhook-signature", b64(mac(s, ts.encode() + b))), ("x-webhook-timestamp", ts),
            ("x-webhook-version", "2023-08-01")]


def cashfree_sdk_verify(s, url, h, b):
    from cashfree_pg.api_client import Cashfree
    cf = Cashfree(XEnvironment=Cashfree.SANDBOX, XClientId="TEST_CLIENT", XClientSecret=s)
    event = cf.PGVerifyWebhookSignature(hdr(h, "x-webhook-signature"), b.decode(), hdr(h, "x-webhook-timestamp"))
    return event is not None


P["cashfree"] = dict(
    doc="https://www.cashfree.com/docs/payments/online/webhooks/signature-verification",
    secret="cfsk_ma_test_0123456789abcdef", body=cashfree_body, sign=cashfree_sign,
    ids=lambda b, h: [(body_hash(b), json_id(b, "/type"))],
    retry=lambda b, now: b,
    sdk_verify=cashfree_sdk_verify, sdk_name=lambda: pkg("cashfree_pg") + " cashfree_pg.api_client.Cashfree.PGVerifyWebhookSignature",
)

# Postmark --------------------------------------------------------------------
def postmark_body(ev, now):
    return compact({"RecordType": "Delivery", "ServerID": 23, "MessageStream": "outbound",
                    "MessageID": str(uuid.UUID(ev)), "Recipient": "john@example.com", "Tag": "welcome",
                    "DeliveredAt": rfc3339(now), "Details": "Test delivery webhook details", "Metadata": {}})


P["postmark"] = dict(
    doc="https://postmarkapp.com/developer/webhooks/webhooks-overview#protecting-your-webhook",
    secret="hookuser:correct-horse-battery", body=postmark_body,
    sign=lambda s, b, now, ev: [("Authorization", "Basic " + b64(s.encode()))],
    ids=lambda b, h: [(body_hash(b), json_id(b, "/RecordType"))],
    retry=lambda b, now: b,
)


# Slack -----------------------------------------------------------------------
def slack_body(ev, now):
    return compact({"token": "XXYYZZ", "team_id": "T061EG9R6", "api_app_id": "A0PNCHHK2",
                    "event": {"type": "app_mention", "channel": "C0LAN2Q65", "user": "U061F7AUR",
                              "text": "<@U0LAN0Z89> is it everything a river should be?", "ts": "1515449522.000016"},
                    "type": "event_callback", "event_id": "Ev" + ev[:10].upper(), "event_time": now})


def slack_sign(s, b, now, ev, retry=0):
    sig = "v0=" + mac(s, f"v0:{now}:".encode() + b).hex()
    out = [("X-Slack-Signature", sig), ("X-Slack-Request-Timestamp", str(now))]
    if retry:
        out += [("X-Slack-Retry-Num", str(retry)), ("X-Slack-Retry-Reason", "http_timeout")]
    return out


def slack_sdk_verify(s, url, h, b):
    from slack_sdk.signature import SignatureVerifier
    return SignatureVerifier(s).is_valid(body=b.decode(), timestamp=hdr(h, "X-Slack-Request-Timestamp"),
                                         signature=hdr(h, "X-Slack-Signature"))


def slack_sdk_sign(s, url, b, now, ev):
    from slack_sdk.signature import SignatureVerifier
    sig = SignatureVerifier(s).generate_signature(timestamp=str(now), body=b.decode())
    return [("X-Slack-Signature", sig), ("X-Slack-Request-Timestamp", str(now))]


P["slack"] = dict(
    doc="https://api.slack.com/authentication/verifying-requests-from-slack",
    secret="8f742231b10e8888abcd99yyyzzz85a5", body=slack_body,
    sign=slack_sign,
    ids=lambda b, h: [(json_id(b, "/event_id"), json_id(b, "/event/type"))],
    retry=lambda b, now: b, retry_sign=lambda s, b, now, ev: slack_sign(s, b, now, ev, retry=1),
    sdk_verify=slack_sdk_verify, sdk_name=lambda: pkg("slack_sdk") + " slack_sdk.signature.SignatureVerifier.is_valid",
    sdk_sign=slack_sdk_sign, sdk_sign_name=lambda: pkg("slack_sdk") + " slack_sdk.signature.SignatureVerifier.generate_signature",
    # Messages that are not events: answered as Slack needs, nothing recorded.
    replies=[
        ("handshake-url_verification.json", "https://api.slack.com/events/url_verification",
         compact({"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
                  "type": "url_verification"}),
         {"status": 200, "code": "handshake", "text": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}),
        ("notice-app_rate_limited.json", "https://api.slack.com/events/app_rate_limited",
         compact({"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "type": "app_rate_limited", "team_id": "T123456",
                  "minute_rate_limited": 1518467820, "api_app_id": "A123456"}),
         {"status": 200, "code": "acknowledged", "text": None}),
    ],
)


# Zoom ------------------------------------------------------------------------
ZOOM_SECRET = "zoom-webhook-secret-token"


def zoom_body(ev, now):
    return compact({"event": "meeting.started",
                    "payload": {"account_id": "AAAAAABBBB",
                                "object": {"uuid": "4444AAAiAAAAAiAiAiiAii==", "id": str(int(ev[:9], 16)),
                                           "host_id": "x1yCzABCDEfg23HiJKl4mN", "topic": "My Meeting", "type": 2,
                                           "start_time": rfc3339(now), "duration": 60,
                                           "timezone": "America/Los_Angeles"}},
                    "event_ts": now * 1000})


def zoom_sign(s, b, now, ev):
    return [("x-zm-signature", "v0=" + mac(s, f"v0:{now}:".encode() + b).hex()), ("x-zm-request-timestamp", str(now)),
            ("x-zm-trackingid", "v=2.0&s=1&u=demo")]


ZOOM_PLAIN = "qgg8vlvZRS6UYooatFL8Aw"
P["zoom"] = dict(
    doc="https://developers.zoom.us/docs/api/webhooks/#verify-webhook-events",
    secret=ZOOM_SECRET, body=zoom_body, sign=zoom_sign,
    ids=lambda b, h: [(body_hash(b), json_id(b, "/event"))],
    retry=lambda b, now: b,
    replies=[
        ("handshake-endpoint.url_validation.json", "https://developers.zoom.us/docs/api/webhooks/#validate-your-webhook-endpoint",
         compact({"payload": {"plainToken": ZOOM_PLAIN}, "event_ts": 1654503849680, "event": "endpoint.url_validation"}),
         {"status": 200, "code": "handshake", "json": {"plainToken": ZOOM_PLAIN,
                                                     "encryptedToken": mac(ZOOM_SECRET, ZOOM_PLAIN.encode()).hex()}}),
    ],
)


# Twitch ----------------------------------------------------------------------
def twitch_body(ev, now):
    return compact({"subscription": {"id": "f1c2a387-161a-49f9-a165-0f21d7a4e1c4", "status": "enabled",
                                     "type": "channel.follow", "version": "2", "cost": 0,
                                     "condition": {"broadcaster_user_id": "12826", "moderator_user_id": "12826"},
                                     "transport": {"method": "webhook", "callback": "https://example.com/webhooks/callback"},
                                     "created_at": "2019-11-16T10:11:12.634234626Z"},
                    "event": {"user_id": "1337", "user_login": "awesome_user", "user_name": "Awesome_User",
                              "broadcaster_user_id": "12826", "broadcaster_user_login": "twitch",
                              "broadcaster_user_name": "Twitch", "followed_at": rfc3339(now)}})


def twitch_ts(now):
    # Twitch writes nanoseconds.
    return datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + ".634234626Z"


def twitch_sign(s, b, now, ev, kind="notification", retry=0):
    mid = str(uuid.UUID(ev)) if len(ev) == 32 else ev
    ts = twitch_ts(now)
    return [("Twitch-Eventsub-Message-Id", mid), ("Twitch-Eventsub-Message-Retry", str(retry)),
            ("Twitch-Eventsub-Message-Type", kind), ("Twitch-Eventsub-Message-Timestamp", ts),
            ("Twitch-Eventsub-Message-Signature", "sha256=" + mac(s, mid.encode() + ts.encode() + b).hex()),
            ("Twitch-Eventsub-Subscription-Type", "channel.follow"), ("Twitch-Eventsub-Subscription-Version", "2")]


TWITCH_CHALLENGE = "pogchamp-kappa-360noscope-vohiyo"
P["twitch"] = dict(
    doc="https://dev.twitch.tv/docs/eventsub/handling-webhook-events/#verifying-the-event-message",
    secret="twitch-eventsub-secret-0123456789", body=twitch_body,
    sign=lambda s, b, now, ev: twitch_sign(s, b, now, ev or "e0ffb5a4-1a4f-4e7a-9a49-7c0c5e2bca3d",
                                           kind="webhook_callback_verification" if b"challenge" in b else "notification"),
    retry_sign=lambda s, b, now, ev: twitch_sign(s, b, now, ev, retry=1),
    ids=lambda b, h: [(hdr(h, "Twitch-Eventsub-Message-Id"), hdr(h, "Twitch-Eventsub-Subscription-Type"))],
    retry=lambda b, now: b,
    replies=[
        ("handshake-webhook_callback_verification.json",
         "https://dev.twitch.tv/docs/eventsub/handling-webhook-events/#responding-to-a-challenge-request",
         compact({"challenge": TWITCH_CHALLENGE,
                  "subscription": {"id": "f1c2a387-161a-49f9-a165-0f21d7a4e1c4", "status": "webhook_callback_verification_pending",
                                   "type": "channel.follow", "version": "2", "cost": 1,
                                   "condition": {"broadcaster_user_id": "12826", "moderator_user_id": "12826"},
                                   "transport": {"method": "webhook", "callback": "https://example.com/webhooks/callback"},
                                   "created_at": "2019-11-16T10:11:12.634234626Z"}}),
         {"status": 200, "code": "handshake", "text": TWITCH_CHALLENGE}),
    ],
)


# Meta (WhatsApp, Instagram, Messenger) -----------------------------------------
def meta_body(ev, now):
    return compact({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{
        "value": {"messaging_product": "whatsapp",
                  "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
                  "contacts": [{"profile": {"name": "Kerry Fisher"}, "wa_id": "16505551234"}],
                  "messages": [{"from": "16505551234", "id": "wamid." + ev[:24].upper(), "timestamp": str(now),
                                "text": {"body": "Hello"}, "type": "text"}]},
        "field": "messages"}]}]})


def meta_ids(b):
    """Each update its own event: a WhatsApp message by its id, a status by id:status."""
    doc = json.loads(b)
    out = []
    for entry in doc["entry"]:
        for change in entry.get("changes", []):
            value = change.get("value", {})
            out += [(m["id"], doc["object"] + ".message") for m in value.get("messages", [])]
            out += [(s["id"] + ":" + s["status"], doc["object"] + ".status") for s in value.get("statuses", [])]
    return out


META_TOKEN = "meatyhamhock"
P["meta"] = dict(
    doc="https://developers.facebook.com/docs/graph-api/webhooks/getting-started#event-notifications",
    secret="meta-app-secret-0123456789abcdef", body=meta_body, verify_token=META_TOKEN,
    sign=lambda s, b, now, ev: [("X-Hub-Signature-256", "sha256=" + mac(s, b).hex())],
    ids=lambda b, h: meta_ids(b),
    retry=lambda b, now: b,
    gets=[("get-verification.json", "https://developers.facebook.com/docs/graph-api/webhooks/getting-started#verification-requests",
           f"hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token={META_TOKEN}",
           {"status": 200, "code": "handshake", "text": "1158201444"})],
)


# Dropbox -----------------------------------------------------------------------
P["dropbox"] = dict(
    doc="https://www.dropbox.com/developers/reference/webhooks#documentation",
    secret="dropbox-app-secret",
    body=lambda ev, now: compact({"list_folder": {"accounts": ["dbid:AAH4f99T0taONIb-" + ev[:20]]},
                                  "delta": {"users": [int(ev[:7], 16)]}}),
    sign=lambda s, b, now, ev: [("X-Dropbox-Signature", mac(s, b).hex())],
    ids=lambda b, h: [(body_hash(b), None)],
    retry=lambda b, now: b,
    gets=[("get-verification.json", "https://www.dropbox.com/developers/reference/webhooks#documentation",
           "challenge=tHiSiSaChAlLeNgE-1234", {"status": 200, "code": "handshake", "text": "tHiSiSaChAlLeNgE-1234"})],
)


# Xero ----------------------------------------------------------------------------
def xero_body(ev, now):
    rid = str(uuid.UUID(ev))
    return compact({"events": [{"resourceUrl": f"https://api.xero.com/api.xro/2.0/Contacts/{rid}", "resourceId": rid,
                                "eventDateUtc": rfc3339(now), "eventType": "UPDATE", "eventCategory": "CONTACT",
                                "tenantId": "c2cc9b6e-9458-4c7d-93cc-f02b81b0594f", "tenantType": "ORGANISATION"}],
                    "lastEventSequence": 1, "firstEventSequence": 1, "entropy": "S0m3r4Nd0mt3xt"})


def xero_ids(b, h):
    return [(":".join([e["tenantId"], e["eventCategory"], e["resourceId"], e["eventType"], e["eventDateUtc"]]),
             e["eventType"]) for e in json.loads(b)["events"]]


P["xero"] = dict(
    doc="https://developer.xero.com/documentation/guides/webhooks/configuring-your-server/",
    secret="xero-webhooks-key-0123456789", body=xero_body,
    sign=lambda s, b, now, ev: [("x-xero-signature", b64(mac(s, b)))],
    ids=xero_ids, retry=lambda b, now: b,
    replies=[("handshake-intent-to-receive.json",
              "https://developer.xero.com/documentation/guides/webhooks/configuring-your-server/#intent-to-receive",
              compact({"events": [], "firstEventSequence": 0, "lastEventSequence": 0, "entropy": "KSOTLMBFNVNKQBMKXCOZ"}),
              {"status": 200, "code": "acknowledged", "text": ""})],
)


# Discord (Ed25519) -------------------------------------------------------------
# A fixed test key stands in for Discord's: the endpoint holds the public key.
def discord_key():
    import nacl.signing
    return nacl.signing.SigningKey(hashlib.sha256(b"discord-test-key").digest())


def discord_sign(s, b, now, ev):
    ts = str(now)
    sig = discord_key().sign(ts.encode() + b).signature.hex()
    return [("X-Signature-Ed25519", sig), ("X-Signature-Timestamp", ts)]


def discord_sdk_verify(s, url, h, b):
    from discord_interactions import verify_key
    return verify_key(b, hdr(h, "X-Signature-Ed25519"), hdr(h, "X-Signature-Timestamp"), s)


def discord_public():
    return discord_key().verify_key.encode().hex()


P["discord"] = dict(
    doc="https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-validating-security-request-headers",
    secret=None,  # set below: the public key
    body=lambda ev, now: compact({"app_permissions": "442368", "application_id": "1099999999999999999",
                                  "data": {"id": "1100000000000000000", "name": "hello", "type": 1},
                                  "guild_id": "1000000000000000000", "id": str(int(ev[:15], 16)),
                                  "token": "aW50ZXJhY3Rpb24tdG9rZW4", "type": 2, "version": 1}),
    sign=discord_sign, ids=lambda b, h: [(json_id(b, "/id"), "application_command")], retry=lambda b, now: b,
    sdk_verify=discord_sdk_verify, sdk_name=lambda: pkg("discord-interactions") + " discord_interactions.verify_key",
    no_tool=True,
    replies=[("handshake-ping.json", "https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-acknowledging-ping-requests",
              compact({"application_id": "1099999999999999999", "id": "1100000000000000001", "token": "dG9rZW4", "type": 1,
                       "user": {"id": "53908232506183680", "username": "Mason"}, "version": 1}),
              {"status": 200, "code": "handshake", "json": {"type": 1}})],
)


# Microsoft Graph (no signature: each notification's clientState) ---------------
GRAPH_STATE = "graph-client-state-0123456789"


def graph_notification(ev, change, n):
    return {"subscriptionId": "7f105c7d-2dc5-4530-97cd-4e7ae6534c07",
            "subscriptionExpirationDateTime": "2026-12-05T11:00:00.0000000Z", "changeType": change,
            "resource": f"Users/{ev[:8]}/Messages/AAMkADFhMWM5{n}",
            "resourceData": {"@odata.type": "#Microsoft.Graph.Message",
                             "@odata.id": f"Users/{ev[:8]}/Messages/AAMkADFhMWM5{n}",
                             "@odata.etag": 'W/"CQAAABYAAADkrWGo7bouTKlsgTZMr9KOAAAUWRHf"', "id": f"AAMkADFhMWM5{n}"},
            "clientState": GRAPH_STATE, "tenantId": "84bd8158-6d4d-4958-8b9f-9d6445542f95"}


def hashed_elements(b, at, type_of):
    """Each element of the array at `at` as it sits in the body: its hash and type."""
    return [(body_hash(compact(e)), type_of(e)) for e in json.loads(b)[at]]


GRAPH_TOKEN = "Validation: Testing client application reachability for subscription Request-Id: 522a8e7e-096a-494c-aaf1-ac0dcfca45b7"
P["microsoft_graph"] = dict(
    doc="https://learn.microsoft.com/en-us/graph/change-notifications-delivery-webhooks",
    secret=GRAPH_STATE,
    body=lambda ev, now: compact({"value": [graph_notification(ev, "updated", 1), graph_notification(ev, "created", 2)]}),
    sign=lambda s, b, now, ev: [],
    ids=lambda b, h: hashed_elements(b, "value", lambda e: e.get("lifecycleEvent") or e["changeType"]),
    retry=lambda b, now: b,
    queries=[("handshake-validation.json",
              "https://learn.microsoft.com/en-us/graph/change-notifications-delivery-webhooks#notificationurl-validation",
              urllib.parse.urlencode({"validationToken": GRAPH_TOKEN}), b"",
              {"status": 200, "code": "handshake", "text": GRAPH_TOKEN})],
)


# Asana (the secret handed over at the handshake) --------------------------------
def asana_body(ev, now):
    return compact({"events": [{"user": {"gid": "1201004560000000", "resource_type": "user"},
                                "created_at": rfc3339(now).replace("Z", ".164Z"), "action": "changed",
                                "resource": {"gid": str(int(ev[:12], 16)), "resource_type": "task",
                                             "resource_subtype": "default_task"},
                                "parent": None,
                                "change": {"field": "assignee", "action": "changed",
                                           "new_value": {"gid": "1201004560000000", "resource_type": "user"}}}]})


P["asana"] = dict(
    doc="https://developers.asana.com/docs/webhooks-guide#security",
    secret="asana-hook-secret-0123456789abcdef",
    body=asana_body,
    sign=lambda s, b, now, ev: [("X-Hook-Signature", mac(s, b).hex())],
    ids=lambda b, h: hashed_elements(b, "events", lambda e: f"{e['resource']['resource_type']}.{e['action']}"),
    retry=lambda b, now: b,
    replies=[("notice-heartbeat.json", "https://developers.asana.com/docs/webhooks-guide#heartbeat-events",
              compact({"events": []}), {"status": 200, "code": "acknowledged"})],
)


# Clerk and Resend (Svix) -----------------------------------------------------
def svix_sign(s, b, now, ev):
    key = base64.b64decode(s.removeprefix("whsec_"))
    sig = b64(mac(key, f"{ev}.{now}.".encode() + b))
    return [("svix-id", ev), ("svix-timestamp", str(now)), ("svix-signature", f"v1,{sig}")]


def svix_sdk_verify(s, url, h, b):
    from svix.webhooks import Webhook
    Webhook(s).verify(b, hdict(h))
    return True


def svix_sdk_sign(s, url, b, now, ev):
    from svix.webhooks import Webhook
    sig = Webhook(s).sign(ev, datetime.fromtimestamp(now, tz=timezone.utc), b.decode())
    return [("svix-id", ev), ("svix-timestamp", str(now)), ("svix-signature", sig)]


P["clerk"] = dict(
    doc="https://clerk.com/docs/guides/development/webhooks/overview#verify-webhooks",
    secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    body=lambda ev, now: compact({"data": {"id": "user_29w83sxmDNGwOuEthce5gg56FcC", "object": "user"},
                                  "object": "event", "type": "user.created", "timestamp": now * 1000,
                                  "instance_id": "ins_123"}),
    sign=svix_sign, ids=lambda b, h: [(hdr(h, "svix-id"), json_id(b, "/type"))], retry=lambda b, now: b,
    sdk_verify=svix_sdk_verify, sdk_name=lambda: pkg("svix") + " svix.webhooks.Webhook.verify",
    sdk_sign=svix_sdk_sign, sdk_sign_name=lambda: pkg("svix") + " svix.webhooks.Webhook.sign",
    node="clerk", event_id=lambda ev: "msg_" + ev[:24],
)
P["resend"] = dict(
    doc="https://resend.com/docs/dashboard/webhooks/verify-webhooks-requests",
    secret="whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    body=lambda ev, now: compact({"type": "email.delivered", "created_at": rfc3339(now),
                                  "data": {"email_id": "56761188-7520-42d8-8898-ff6fc54ce618",
                                           "from": "Acme <onboarding@resend.dev>", "to": ["delivered@resend.dev"],
                                           "subject": "Sending this example"}}),
    sign=svix_sign, ids=lambda b, h: [(hdr(h, "svix-id"), json_id(b, "/type"))], retry=lambda b, now: b,
    sdk_verify=svix_sdk_verify, sdk_name=lambda: pkg("svix") + " svix.webhooks.Webhook.verify",
    sdk_sign=svix_sdk_sign, sdk_sign_name=lambda: pkg("svix") + " svix.webhooks.Webhook.sign",
    node="resend", event_id=lambda ev: "msg_" + ev[:24],
)
# Shopify's own library is in Node.
P["shopify"]["node"] = "shopify"
# Linear and Mux: their own verifiers are in Node (set above).

NODE_NAMES = {
    "shopify": lambda: npm("@shopify/shopify-api") + " shopifyApi().webhooks.validate",
    "linear": lambda: npm("@linear/sdk") + " LinearWebhooks.verify",
    "mux": lambda: npm("@mux/mux-node") + " Mux.webhooks.verifySignature",
    "clerk": lambda: npm("@clerk/backend") + " verifyWebhook",
    "resend": lambda: npm("resend") + " Resend.webhooks.verify",
}


def node_verify(name, secret, url, headers, body):
    req = json.dumps({"preset": name, "secret": secret, "url": url, "headers": headers, "body": b64(body)})
    r = subprocess.run(["node", os.path.join(HERE, "verify.mjs")], input=req.encode(), capture_output=True,
                       cwd=NODE_DIR, timeout=60)
    out = r.stdout.decode().strip()
    if r.returncode != 0 or out != "ok":
        raise SystemExit(f"{name}: the provider's Node library refused the delivery: {out} {r.stderr.decode()[-400:]}")
    return True


# ---------------------------------------------------------------------------


def ours(name, p, ev):
    """A delivery signed by our own `hookledger send --print` at NOW."""
    spec = {"provider": name, "secrets": ["env:VECTOR_SECRET"]}
    if p.get("url"):
        spec["public_url"] = p["url"]
    if p.get("verify_token"):
        spec["verify_token"] = "env:VECTOR_TOKEN"
    env = dict(os.environ, VECTOR_SECRET=p["secret"], VECTOR_TOKEN=p.get("verify_token") or "")
    out = subprocess.run([CLI, "send", "--print", "--now", str(NOW), "--endpoint", "v", "--event-id", ev,
                          "--type", "demo.event", "--endpoints", json.dumps({"v": spec})],
                         env=env, capture_output=True, check=True, timeout=60).stdout
    d = json.loads(out)
    return [tuple(h) for h in d["headers"]], base64.b64decode(d["body_base64"])


def vector(name, p, what, headers, body, now, expect, source, **extra):
    v = {"preset": name, "what": what, "source": source, "secrets": [p["secret"]], "public_url": p.get("url"),
         "now": now, "method": "POST", "query": "", "headers": [list(h) for h in headers], "body_base64": b64(body),
         "expect": [{"id": i, "type": t} for i, t in expect]}
    if p.get("verify_token"):
        v["verify_token"] = p["verify_token"]
    if p.get("wrong_secret"):
        v["wrong_secret"] = p["wrong_secret"]
    v.update(extra)
    return v


def tampered(body):
    """`body` with its last letter or digit changed."""
    b = bytearray(body)
    i = max(i for i, c in enumerate(b) if chr(c).isalnum())
    b[i] = ord("2") if b[i] == ord("1") else ord("1")
    return bytes(b)


def refuses(check):
    try:
        return not check()
    except SystemExit:
        return True
    except Exception:
        return True


def sdk_checks(name, p, headers, body):
    """The names of the provider's own verifiers that accepted this delivery
    (each must also refuse it with one byte of the body changed, so an
    acceptance means something)."""
    names = []
    if "sdk_verify" in p:
        if not p["sdk_verify"](p["secret"], p.get("url"), headers, body):
            raise SystemExit(f"{name}: {p['sdk_name']()} refused the delivery")
        if not refuses(lambda: p["sdk_verify"](p["secret"], p.get("url"), headers, tampered(body))):
            raise SystemExit(f"{name}: {p['sdk_name']()} accepted a tampered delivery: it checks nothing")
        names.append(p["sdk_name"]())
    if "node" in p:
        node_verify(p["node"], p["secret"], p.get("url"), headers, body)
        if not refuses(lambda: node_verify(p["node"], p["secret"], p.get("url"), headers, tampered(body))):
            raise SystemExit(f"{name}: the Node library accepted a tampered delivery")
        names.append(NODE_NAMES[p["node"]]())
    return names


# The providers' published examples (a), where they publish one with its secret.
PUBLISHED = {
    "twilio": dict(
        source="https://www.twilio.com/docs/usage/webhooks/webhooks-security (the example: auth token 12345, "
               "https://mycompany.com/myapp.php?foo=1&bar=2, signature 0/KCTR6DLpKmkAf8muzZqo1nDgQ=)",
        secret="12345", url="https://mycompany.com/myapp.php", query="foo=1&bar=2",
        body=b"CallSid=CA1234567890ABCDE&Caller=%2B12349013030&Digits=1234&From=%2B12349013030&To=%2B18005551212",
        headers=[("X-Twilio-Signature", "0/KCTR6DLpKmkAf8muzZqo1nDgQ="),
                 ("Content-Type", "application/x-www-form-urlencoded")],
        expect=[(hashlib.sha256(b"CallSid=CA1234567890ABCDE&Caller=%2B12349013030&Digits=1234&From=%2B12349013030"
                                b"&To=%2B18005551212").hexdigest(), None)],
    ),
}


def main():
    only = set(sys.argv[3:])
    P["discord"]["secret"] = discord_public()
    import nacl.signing
    P["discord"]["wrong_secret"] = nacl.signing.SigningKey(hashlib.sha256(b"not-discord").digest()).verify_key.encode().hex()
    for name, p in P.items():
        if only and name not in only:
            continue
        folder = os.path.join(OUT, name)
        os.makedirs(folder, exist_ok=True)
        manifest = []
        raw = hashlib.sha256(f"{name}-vectors".encode()).hexdigest()[:32]
        ev = p.get("event_id", lambda e: e)(raw)
        files = {}

        # (b) our sign, checked by the provider's own verifier (not for a
        # provider that signs with a private key of its own: Discord).
        checked = []
        if not p.get("no_tool"):
            h, b = ours(name, p, ev)
            checked = sdk_checks(name, p, h, b)
            files["ours.json"] = vector(name, p, "ours", h, b, NOW, p["ids"](b, h),
                                        "hookledger send --print", signed_by_us={"event_id": ev, "type": "demo.event"},
                                        accepted_by=checked)
            manifest.append(("ours.json", "our sign (hookledger send --print) accepted by " + (
                "; ".join(checked) if checked else "no provider library (none is published): see independent.json")))

        # (c) the documented formula, implemented here.
        ev2 = p.get("event_id", lambda e: e)(hashlib.sha256(f"{name}-independent".encode()).hexdigest()[:32])
        b = p["body"](ev2, NOW)
        if "seal" in p:
            b = p["seal"](p["secret"], b, NOW)
        h = p["sign"](p["secret"], b, NOW, ev2)
        checked2 = sdk_checks(name, p, h, b)
        files["independent.json"] = vector(name, p, "independent", h, b, NOW, p["ids"](b, h), p["doc"],
                                           accepted_by=checked2)
        manifest.append(("independent.json", f"the documented formula ({p['doc']}), signed by "
                         "scripts/vectors/generate.py" + (f"; accepted by {'; '.join(checked2)}" if checked2 else "")))

        # The same event as the provider retries it.
        later = NOW + 60
        rb = p["retry"](b, later)
        if "seal" in p:
            rb = p["seal"](p["secret"], rb, later)
        rh = p.get("retry_sign", p["sign"])(p["secret"], rb, later, ev2)
        # Headers the provider renews per attempt (a new delivery id) stay as they are generated.
        files["retry.json"] = vector(name, p, "retry", rh, rb, later, p["ids"](rb, rh),
                                     p["doc"], same_event_as="independent.json")
        manifest.append(("retry.json", f"independent.json as the provider retries it (documented formula, {p['doc']})"))

        # (b) the provider's own signer, where it has one.
        if "sdk_sign" in p:
            ev3 = p.get("event_id", lambda e: e)(hashlib.sha256(f"{name}-sdk".encode()).hexdigest()[:32])
            b3 = p["body"](ev3, NOW)
            h3 = p["sdk_sign"](p["secret"], p.get("url"), b3, NOW, ev3)
            files["sdk.json"] = vector(name, p, "sdk", h3, b3, NOW, p["ids"](b3, h3), p["sdk_sign_name"]())
            manifest.append(("sdk.json", "signed by " + p["sdk_sign_name"]()))

        # Messages that are not events (handshakes, notices), signed by the documented formula.
        for fname, doc, rbody, answer in p.get("replies", []):
            rh2 = p["sign"](p["secret"], rbody, NOW, "")
            checked3 = sdk_checks(name, p, rh2, rbody)
            files[fname] = vector(name, p, "reply", rh2, rbody, NOW, [], doc, answer=answer, accepted_by=checked3)
            manifest.append((fname, f"the message of {doc}, signed by the documented formula"
                             + (f"; accepted by {'; '.join(checked3)}" if checked3 else "")))

        # A handshake the provider makes with a query (Graph's validationToken; nothing signed).
        for fname, doc, query, qbody, answer in p.get("queries", []):
            files[fname] = vector(name, p, "query", [("Content-Type", "text/plain; charset=utf-8")], qbody, NOW, [],
                                  doc, answer=answer, query=query)
            manifest.append((fname, f"the request of {doc}"))

        # The provider's GET check of the endpoint (no body; nothing signed).
        for fname, doc, query, answer in p.get("gets", []):
            files[fname] = vector(name, p, "get", [], b"", NOW, [], doc, answer=answer, method="GET", query=query,
                                  verify_token=p.get("verify_token"))
            manifest.append((fname, f"the GET check of {doc}"))

        if name in PUBLISHED:
            pub = PUBLISHED[name]
            if "sdk_verify" in p:
                url = pub["url"] + "?" + pub["query"]
                assert p["sdk_verify"](pub["secret"], url, pub["headers"], pub["body"]), f"{name}: published example"
            v = vector(name, dict(p, secret=pub["secret"], url=pub["url"]), "published", pub["headers"], pub["body"],
                       NOW, pub["expect"], pub["source"], query=pub["query"])
            files["published.json"] = v
            manifest.append(("published.json", pub["source"]))
        for fname, v in files.items():
            with open(os.path.join(folder, fname), "w") as f:
                json.dump(v, f, indent=1)
                f.write("\n")
        for f in os.listdir(folder):
            if f not in files and f != "MANIFEST":
                os.remove(os.path.join(folder, f))
        with open(os.path.join(folder, "MANIFEST"), "w") as f:
            for fname, source in manifest:
                f.write(f"{fname}  {source}\n")
        print(f"{name}: {', '.join(sorted(files))}" + (f" (accepted by {', '.join(checked)})" if checked else ""))


if __name__ == "__main__":
    main()
