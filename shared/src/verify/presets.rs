//! Providers by name on the generic verifier: each preset is a fixed `hmac`
//! section (what an operator would otherwise write for an `hmac`
//! endpoint), the fields its provider changes between retries, and a body
//! in the provider's shape for `hookledger send`; Clerk and Resend send
//! through Svix, so they are Standard Webhooks under their own names.
//!
//! Adding a preset is one entry in [`PRESETS`] (or [`ALIASES`]), its
//! vectors under `shared/testdata/providers/<name>/` and its row in
//! `docs/providers.md`. Every section is checked by the same code that
//! checks an operator's (`GenericHmacConfig::from_spec`), in a test.

use std::ops::Range;

use super::generic::{self, GenericHmacConfig, GenericHmacVerifier, json_text};
use super::provider::{
    BuildContext, Delivery, EndpointSpec, Handshake, HandshakeAnswer, HandshakeInput, HmacSpec, Identity, Provider,
    Source, Success, SuccessAnswer, Verifier, Verifying, no_sections, ready,
};
use super::{
    Action, BatchEvent, Content, Verified, VerifyError, checked_event_id, echoable, json, malformed_element,
    push_event, standard,
};
use crate::secret::Secret;

/// A delivery carrying several events as a JSON array (HubSpot's).
#[derive(Debug)]
pub struct Batch {
    /// Where the array is: `""` for the body itself (HubSpot), a pointer (Xero's `/events`).
    pub at: &'static str,
    /// Pointers into each element, joined by `:`, that identify it.
    pub id: &'static [&'static str],
    /// Where each element names its type.
    pub event_type: Option<&'static str>,
    /// An empty batch is a notice (Xero's Intent to Receive): acknowledged,
    /// nothing recorded. Otherwise it is refused.
    pub empty_is_notice: bool,
    /// Its own split, where its updates sit at several depths (Meta's
    /// `entry[].changes[].value.messages[]`): `at`, `id` and `event_type`
    /// are then unused.
    pub split: Option<Splitter>,
}

/// A batch's own split: its events, each with its identity and bytes.
pub type Splitter = fn(&[u8]) -> Result<Vec<BatchEvent>, VerifyError>;

/// What a preset answers to a message that is not an event: a handshake or
/// a notice, recognised (once authenticated) by a value in its body or a header.
#[derive(Debug)]
pub struct Reply {
    /// The message: the value at `at` is `equals`.
    pub at: Field,
    pub equals: &'static str,
    pub with: ReplyWith,
}

/// A message recorded under its own type rather than the one the `hmac`
/// section reads: the value at `at` is `equals` (Twitch's revocation, whose
/// subscription-type header names the subscription it ends, not an event of it).
#[derive(Debug)]
pub struct Retype {
    pub at: Field,
    pub equals: &'static str,
    pub event_type: &'static str,
}

/// A value of a delivery: a JSON pointer into its body, or a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Json(&'static str),
    Header(&'static str),
}

#[derive(Debug, Clone, Copy)]
pub enum ReplyWith {
    /// 200 with the value at this field, as `text/plain`: letters, digits and
    /// `._~-` only, at most 256 of them (anything else is refused).
    Echo(Field),
    /// 200 with `{"plainToken": v, "encryptedToken": hex HMAC-SHA256(secret, v)}`
    /// for the value `v` at this pointer (Zoom's validation; the endpoint's
    /// first secret).
    SignedToken(&'static str),
    /// 200, nothing recorded (counted as `handshake`, outcome `acknowledged`).
    Acknowledge,
}

/// How a preset's events are named by `hookledger send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdStyle {
    /// The random hex digits.
    Hex,
    /// A UUID made of them.
    Uuid,
    /// A decimal number made of the first 12 of them.
    Number,
}

/// A provider that signs with an HMAC (or a token), as a fixed `hmac` section.
#[derive(Debug)]
pub struct Preset {
    pub name: &'static str,
    /// How it signs and identifies, in a line (`hookledger providers`).
    pub summary: &'static str,
    /// The `hmac` section, as an `hmac` endpoint would write it (no `mask`).
    pub hmac: &'static str,
    /// JSON pointers of the values it changes between retries of one event
    /// (masked in the content hash; for a batch, inside each element).
    pub mask: &'static [&'static str],
    /// The provider signs the URL it calls: the endpoint names its `public_url`.
    pub public_url: bool,
    /// Its documented timestamp window, where it names one (else 300 s).
    pub tolerance_secs: i64,
    pub content_type: &'static str,
    /// A body in its shape, with `{{id}}`, `{{type}}`, `{{ts}}`, `{{ms}}`,
    /// `{{rfc3339}}`, `{{number}}` and `{{token}}` put in by `hookledger send`.
    pub sample: &'static str,
    /// Headers it sends besides the signature, the timestamp and the ids.
    pub headers: &'static [(&'static str, &'static str)],
    pub id_style: IdStyle,
    pub batch: Option<Batch>,
    /// Its handshakes and notices (checked before the identity is read).
    pub replies: &'static [Reply],
    /// Its messages recorded under their own type (checked once authenticated).
    pub retype: &'static [Retype],
    /// Its check of the endpoint with a GET, if it makes one.
    pub get: Option<GetCheck>,
    /// The answer it needs to a recorded delivery (its documentation's).
    pub success: SuccessAnswer,
    /// What its identities claim (`docs/providers.md`, "Identity contracts").
    pub identity: Identity,
}

/// A provider's check of the endpoint with a GET (no body, nothing recorded).
#[derive(Debug)]
pub enum GetCheck {
    /// Meta: `mode` is `subscribe` and `token` equals the endpoint's
    /// `verify_token` (compared in constant time): `challenge` is echoed.
    VerifyToken { mode: &'static str, token: &'static str, challenge: &'static str },
    /// Dropbox: `challenge` is echoed, unauthenticated (Dropbox signs nothing
    /// on its GET), so only a plain value is.
    Echo { challenge: &'static str },
}

const JSON: &str = "application/json";
const FORM: &str = "application/x-www-form-urlencoded";
const DEFAULT_TOLERANCE: i64 = generic::DEFAULT_TOLERANCE_SECS;

/// Every HMAC preset, in the order `docs/providers.md` lists them.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "shopify",
        summary: "X-Shopify-Hmac-Sha256: base64 HMAC-SHA256 of the body; id X-Shopify-Event-Id",
        hmac: r#"{"signature_header": "X-Shopify-Hmac-Sha256", "encoding": "base64",
            "id": {"header": "X-Shopify-Event-Id"}, "type": {"header": "X-Shopify-Topic"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"id":{{number}},"email":"jon@example.com","total_price":"199.00","updated_at":"{{rfc3339}}"}"#,
        headers: &[
            ("X-Shopify-Shop-Domain", "demo.myshopify.com"),
            ("X-Shopify-API-Version", "2025-10"),
            ("X-Shopify-Webhook-Id", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
        ],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::BOUND_TO_BODY,
    },
    Preset {
        name: "twilio",
        summary: "X-Twilio-Signature: base64 HMAC-SHA1 of the URL and the sorted POST parameters; no documented event id: the body hash",
        hmac: r#"{"signature_header": "X-Twilio-Signature", "algorithm": "sha1", "encoding": "base64",
            "signed_content": "{url}{form_sorted}", "id": "body_hash"}"#,
        mask: &[],
        public_url: true,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: FORM,
        sample: "AccountSid=AC00000000000000000000000000000001&ApiVersion=2010-04-01&From=%2B15017122661&MessageSid=SM{{id}}&MessageStatus={{type}}&SmsStatus={{type}}&To=%2B15558675310",
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "square",
        summary: "x-square-hmacsha256-signature: base64 HMAC-SHA256 of the notification URL and the body; id event_id",
        hmac: r#"{"signature_header": "x-square-hmacsha256-signature", "encoding": "base64",
            "signed_content": "{url}{body}", "id": {"json_pointer": "/event_id"}, "type": {"json_pointer": "/type"}}"#,
        mask: &[],
        public_url: true,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"merchant_id":"6SSW7HV8K2ST5","type":"{{type}}","event_id":"{{id}}","created_at":"{{rfc3339}}","data":{"type":"payment","id":"KkAkhdMsgzn59SM8A89WgKwekxLZY","object":{"payment":{"id":"KkAkhdMsgzn59SM8A89WgKwekxLZY","status":"COMPLETED"}}}}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "razorpay",
        summary: "X-Razorpay-Signature: hex HMAC-SHA256 of the body; id x-razorpay-event-id",
        hmac: r#"{"signature_header": "X-Razorpay-Signature", "encoding": "hex",
            "id": {"header": "x-razorpay-event-id"}, "type": {"json_pointer": "/event"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"entity":"event","account_id":"acc_BFQ7uQEaa7j2z7","event":"{{type}}","contains":["payment"],"payload":{"payment":{"entity":{"id":"pay_DESlfW9H8K9uqM","amount":100,"currency":"INR","status":"captured"}}},"created_at":{{ts}}}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::BOUND_TO_BODY,
    },
    Preset {
        name: "paddle",
        summary: "Paddle-Signature: ts=…;h1=… hex HMAC-SHA256 of \"{ts}:{body}\"; id event_id",
        hmac: r#"{"signature_header": "Paddle-Signature", "list": {"separator": ";", "signature": "h1", "timestamp": "ts"},
            "encoding": "hex", "signed_content": "{timestamp}:{body}",
            "id": {"json_pointer": "/event_id"}, "type": {"json_pointer": "/event_type"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: 5,
        content_type: JSON,
        sample: r#"{"event_id":"evt_{{id}}","event_type":"{{type}}","occurred_at":"{{rfc3339}}","notification_id":"ntf_01h8bkrfe7w1vwf8xmytwn51e7","data":{"id":"sub_01h8bkrb3ykxjh6z0j2dr2qb0m","status":"active"}}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "hubspot",
        summary: "X-HubSpot-Signature-v3: base64 HMAC-SHA256 of method, URL, body and the millisecond timestamp; a batch, each event identified by subscriptionId:eventId:occurredAt",
        hmac: r#"{"signature_header": "X-HubSpot-Signature-v3", "encoding": "base64",
            "timestamp_header": "X-HubSpot-Request-Timestamp", "timestamp_format": "milliseconds",
            "signed_content": "{method}{url}{body}{timestamp}", "id": "body_hash"}"#,
        mask: &["/attemptNumber"],
        public_url: true,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"[{"eventId":{{number}},"subscriptionId":2881778,"portalId":62515,"appId":1160452,"occurredAt":{{ms}},"subscriptionType":"{{type}}","attemptNumber":0,"objectId":1246965,"propertyName":"lifecyclestage","propertyValue":"subscriber","changeSource":"CRM_UI"}]"#,
        headers: &[],
        replies: &[],
        id_style: IdStyle::Number,
        batch: Some(Batch {
            at: "",
            id: &["/subscriptionId", "/eventId", "/occurredAt"],
            event_type: Some("/subscriptionType"),
            empty_is_notice: false,
            split: None,
        }),
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "mailgun",
        summary: "in the body: signature.signature, hex HMAC-SHA256 of signature.timestamp and signature.token (the event itself is not signed); id event-data.id",
        hmac: r#"{"signature_pointer": "/signature/signature", "encoding": "hex",
            "timestamp_pointer": "/signature/timestamp", "signed_content": "{timestamp}{json:/signature/token}",
            "id": {"json_pointer": "/event-data/id"}, "type": {"json_pointer": "/event-data/event"}}"#,
        mask: &["/signature"],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"signature":{"timestamp":"{{ts}}","token":"{{token}}","signature":""},"event-data":{"id":"{{id}}","event":"{{type}}","timestamp":{{ts}},"recipient":"alice@example.com","message":{"headers":{"message-id":"20130503182626.18666.16540@example.com"}}}}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::OK,
        identity: Identity::UNBOUND,
    },
    Preset {
        name: "linear",
        summary: "Linear-Signature: hex HMAC-SHA256 of the body, webhookTimestamp (ms) in it within 60 s; id type:action:data.id:createdAt",
        hmac: r#"{"signature_header": "Linear-Signature", "encoding": "hex",
            "timestamp_pointer": "/webhookTimestamp", "timestamp_format": "milliseconds",
            "id": {"composite": [{"json_pointer": "/type"}, {"json_pointer": "/action"}, {"json_pointer": "/data/id"}, {"json_pointer": "/createdAt"}]},
            "type": {"composite": [{"json_pointer": "/type"}, {"json_pointer": "/action"}]}}"#,
        mask: &["/webhookTimestamp"],
        public_url: false,
        tolerance_secs: 60,
        content_type: JSON,
        sample: r#"{"action":"create","type":"{{type}}","createdAt":"{{rfc3339}}","data":{"id":"{{id}}","title":"Demo issue","priority":2},"url":"https://linear.app/demo/issue/DEM-1","organizationId":"0c9c0e14-0d5f-4c4e-8b5a-6b8f6f2e1a00","webhookTimestamp":{{ms}},"webhookId":"5b0c3e0e-8f1e-4a0a-9e49-2b3c4d5e6f70"}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::OK,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "intercom",
        summary: "X-Hub-Signature: sha1= hex HMAC-SHA1 of the body; id id (notif_…)",
        hmac: r#"{"signature_header": "X-Hub-Signature", "prefix": "sha1=", "algorithm": "sha1", "encoding": "hex",
            "id": {"json_pointer": "/id"}, "type": {"json_pointer": "/topic"}}"#,
        mask: &["/delivery_attempts", "/delivery_status", "/delivered_at"],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"type":"notification_event","app_id":"abc123","data":{"type":"notification_event_data","item":{"type":"contact","id":"6762f0d51bb69f9f2193bb7f"}},"id":"notif_{{id}}","topic":"{{type}}","delivery_status":"pending","delivery_attempts":1,"delivered_at":0,"first_sent_at":{{ts}},"created_at":{{ts}},"self":null}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "calendly",
        summary: "Calendly-Webhook-Signature: t=…,v1=… hex HMAC-SHA256 of \"{t}.{body}\"; id event:payload.uri",
        hmac: r#"{"signature_header": "Calendly-Webhook-Signature", "list": {"signature": "v1", "timestamp": "t"},
            "encoding": "hex", "signed_content": "{timestamp}.{body}",
            "id": {"composite": [{"json_pointer": "/event"}, {"json_pointer": "/payload/uri"}]}, "type": {"json_pointer": "/event"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: 180,
        content_type: JSON,
        sample: r#"{"created_at":"{{rfc3339}}","created_by":"https://api.calendly.com/users/AAAAAAAAAAAAAAAA","event":"{{type}}","payload":{"uri":"https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/{{id}}","email":"test@example.com","status":"active"}}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "mux",
        summary: "Mux-Signature: t=…,v1=… hex HMAC-SHA256 of \"{t}.{body}\"; id id",
        hmac: r#"{"signature_header": "Mux-Signature", "list": {"signature": "v1", "timestamp": "t"},
            "encoding": "hex", "signed_content": "{timestamp}.{body}",
            "id": {"json_pointer": "/id"}, "type": {"json_pointer": "/type"}}"#,
        mask: &["/attempts"],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"type":"{{type}}","id":"{{id}}","created_at":"{{rfc3339}}","object":{"type":"asset","id":"0201p02fGKPE7MrbC269XRD7LpcHhrmbu0002"},"environment":{"name":"Production","id":"j0863n"},"data":{"status":"ready"},"attempts":[],"accessor_source":null,"accessor":null,"request_id":null}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "typeform",
        summary: "Typeform-Signature: sha256= base64 HMAC-SHA256 of the body; id event_id",
        hmac: r#"{"signature_header": "Typeform-Signature", "prefix": "sha256=", "encoding": "base64",
            "id": {"json_pointer": "/event_id"}, "type": {"json_pointer": "/event_type"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"event_id":"{{id}}","event_type":"{{type}}","form_response":{"form_id":"lT4Z3j","token":"a3a12ec67a1365927098a606107fac15","submitted_at":"{{rfc3339}}","answers":[]}}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "coinbase_commerce",
        summary: "X-CC-Webhook-Signature: hex HMAC-SHA256 of the body; id event.id",
        hmac: r#"{"signature_header": "X-CC-Webhook-Signature", "encoding": "hex",
            "id": {"json_pointer": "/event/id"}, "type": {"json_pointer": "/event/type"}}"#,
        mask: &["/id", "/attempt_number", "/scheduled_for"],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"id":1,"scheduled_for":"{{rfc3339}}","attempt_number":1,"event":{"id":"{{id}}","resource":"event","type":"{{type}}","api_version":"2018-03-22","created_at":"{{rfc3339}}","data":{"code":"66BEOV2A","name":"The Sovereign Individual","pricing_type":"no_price"}}}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::OK,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "sentry",
        summary: "Sentry-Hook-Signature: hex HMAC-SHA256 of the body; no event id: the body hash",
        hmac: r#"{"signature_header": "Sentry-Hook-Signature", "encoding": "hex", "id": "body_hash",
            "type": {"composite": [{"header": "Sentry-Hook-Resource"}, {"json_pointer": "/action"}]}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"action":"created","installation":{"uuid":"7a485448-a9e2-4c85-8a3c-4f44175783c9"},"data":{"issue":{"id":"{{number}}","title":"{{type}}","status":"unresolved"}},"actor":{"type":"application","id":"sentry","name":"Sentry"}}"#,
        headers: &[("Sentry-Hook-Resource", "issue")],
        id_style: IdStyle::Number,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "lemonsqueezy",
        summary: "X-Signature: hex HMAC-SHA256 of the body; id meta.event_name:data.type:data.id:data.attributes.updated_at",
        hmac: r#"{"signature_header": "X-Signature", "encoding": "hex",
            "id": {"composite": [{"json_pointer": "/meta/event_name"}, {"json_pointer": "/data/type"}, {"json_pointer": "/data/id"}, {"json_pointer": "/data/attributes/updated_at"}]},
            "type": {"json_pointer": "/meta/event_name"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"meta":{"event_name":"{{type}}","custom_data":null},"data":{"type":"subscriptions","id":"{{number}}","attributes":{"status":"active","updated_at":"{{rfc3339}}"}}}"#,
        headers: &[],
        id_style: IdStyle::Number,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::OK,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "box",
        summary: "BOX-SIGNATURE-PRIMARY / -SECONDARY: base64 HMAC-SHA256 of the body and BOX-DELIVERY-TIMESTAMP (RFC 3339, 10 minutes); id id",
        hmac: r#"{"signature_header": ["BOX-SIGNATURE-PRIMARY", "BOX-SIGNATURE-SECONDARY"], "encoding": "base64",
            "timestamp_header": "BOX-DELIVERY-TIMESTAMP", "timestamp_format": "rfc3339", "signed_content": "{body}{timestamp}",
            "id": {"json_pointer": "/id"}, "type": {"json_pointer": "/trigger"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: 600,
        content_type: JSON,
        sample: r#"{"type":"webhook_event","id":"{{id}}","created_at":"{{rfc3339}}","trigger":"{{type}}","webhook":{"id":"1234567890","type":"webhook"},"created_by":{"type":"user","id":"2","name":"Demo","login":"demo@example.com"},"source":{"id":"12345","type":"file","name":"demo.txt"}}"#,
        headers: &[("BOX-SIGNATURE-VERSION", "1"), ("BOX-SIGNATURE-ALGORITHM", "HmacSHA256")],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "zendesk",
        summary: "X-Zendesk-Webhook-Signature: base64 HMAC-SHA256 of X-Zendesk-Webhook-Signature-Timestamp (RFC 3339) and the body; id X-Zendesk-Webhook-Invocation-Id",
        hmac: r#"{"signature_header": "X-Zendesk-Webhook-Signature", "encoding": "base64",
            "timestamp_header": "X-Zendesk-Webhook-Signature-Timestamp", "timestamp_format": "rfc3339",
            "signed_content": "{timestamp}{body}", "id": {"header": "X-Zendesk-Webhook-Invocation-Id"},
            "type": {"json_pointer": "/type"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"type":"{{type}}","account_id":12514403,"id":"{{id}}","time":"{{rfc3339}}","zendesk_event_version":"2022-11-06","subject":"zen:ticket:1","detail":{"id":"1","status":"OPEN"},"event":{}}"#,
        headers: &[],
        id_style: IdStyle::Number,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::UNBOUND,
    },
    Preset {
        name: "docusign",
        summary: "X-DocuSign-Signature-1…10 (one per Connect key): base64 HMAC-SHA256 of the body; id event:data.envelopeId:generatedDateTime",
        hmac: r#"{"signature_header": ["X-DocuSign-Signature-1", "X-DocuSign-Signature-2", "X-DocuSign-Signature-3",
                "X-DocuSign-Signature-4", "X-DocuSign-Signature-5", "X-DocuSign-Signature-6", "X-DocuSign-Signature-7",
                "X-DocuSign-Signature-8", "X-DocuSign-Signature-9", "X-DocuSign-Signature-10"],
            "encoding": "base64",
            "id": {"composite": [{"json_pointer": "/event"}, {"json_pointer": "/data/envelopeId"}, {"json_pointer": "/generatedDateTime"}]},
            "type": {"json_pointer": "/event"}}"#,
        mask: &["/retryCount"],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"event":"{{type}}","apiVersion":"v2.1","uri":"/restapi/v2.1/accounts/00000000-0000-4000-8000-000000000001/envelopes/{{id}}","retryCount":0,"configurationId":10418,"generatedDateTime":"{{rfc3339}}","data":{"accountId":"00000000-0000-4000-8000-000000000001","userId":"00000000-0000-4000-8000-000000000002","envelopeId":"{{id}}"}}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::OK,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "vercel",
        summary: "x-vercel-signature: hex HMAC-SHA1 of the body; id id",
        hmac: r#"{"signature_header": "x-vercel-signature", "algorithm": "sha1", "encoding": "hex",
            "id": {"json_pointer": "/id"}, "type": {"json_pointer": "/type"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"id":"{{id}}","type":"{{type}}","createdAt":{{ms}},"payload":{"deployment":{"id":"dpl_2euZBFqxYdDMDG1jTrHFnNZ2eUVa","url":"demo.vercel.app"}},"region":"sfo1"}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "segment",
        summary: "X-Signature: hex HMAC-SHA1 of the body; id messageId",
        hmac: r#"{"signature_header": "X-Signature", "algorithm": "sha1", "encoding": "hex",
            "id": {"json_pointer": "/messageId"}, "type": {"json_pointer": "/type"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"messageId":"{{id}}","type":"{{type}}","event":"Order Completed","userId":"u_1","timestamp":"{{rfc3339}}","properties":{"revenue":19.99}}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "gitlab",
        summary: "X-Gitlab-Token: the secret itself (no signature), compared in constant time; id Idempotency-Key",
        hmac: r#"{"auth": "token", "signature_header": "X-Gitlab-Token",
            "id": {"header": "Idempotency-Key"}, "type": {"header": "X-Gitlab-Event"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"object_kind":"push","event_name":"push","ref":"refs/heads/main","checkout_sha":"da1560886d4f094c3e6c9ef40349f7d38b5d27d7","project":{"id":15,"path_with_namespace":"demo/app"},"commits":[]}"#,
        headers: &[("X-Gitlab-Instance", "https://gitlab.com")],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::UNBOUND,
    },
    Preset {
        name: "bitbucket",
        summary: "X-Hub-Signature: sha256= hex HMAC-SHA256 of the body; no stable event id: the body hash",
        hmac: r#"{"signature_header": "X-Hub-Signature", "prefix": "sha256=", "encoding": "hex", "id": "body_hash",
            "type": {"header": "X-Event-Key"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"push":{"changes":[{"new":{"type":"branch","name":"main","target":{"hash":"{{id}}"}}}]},"repository":{"full_name":"demo/app","uuid":"{00000000-0000-4000-8000-000000000003}"},"actor":{"display_name":"Demo"}}"#,
        headers: &[("X-Hook-UUID", "00000000-0000-4000-8000-000000000004")],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "jira",
        summary: "X-Hub-Signature: sha256= hex HMAC-SHA256 of the body; id X-Atlassian-Webhook-Identifier",
        hmac: r#"{"signature_header": "X-Hub-Signature", "prefix": "sha256=", "encoding": "hex",
            "id": {"header": "X-Atlassian-Webhook-Identifier"}, "type": {"json_pointer": "/webhookEvent"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"timestamp":{{ms}},"webhookEvent":"{{type}}","issue_event_type_name":"issue_created","issue":{"id":"10001","key":"DEMO-1","fields":{"summary":"Demo"}},"user":{"accountId":"5b10a2844c20165700ede21g"}}"#,
        headers: &[],
        id_style: IdStyle::Number,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::BOUND_TO_BODY,
    },
    Preset {
        name: "cashfree",
        summary: "x-webhook-signature: base64 HMAC-SHA256 of x-webhook-timestamp (ms) and the body; no event id common to every type: the body hash",
        hmac: r#"{"signature_header": "x-webhook-signature", "encoding": "base64",
            "timestamp_header": "x-webhook-timestamp", "timestamp_format": "milliseconds",
            "signed_content": "{timestamp}{body}", "id": "body_hash", "type": {"json_pointer": "/type"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"data":{"order":{"order_id":"order_{{id}}","order_amount":2.00,"order_currency":"INR"},"payment":{"cf_payment_id":{{number}},"payment_status":"SUCCESS","payment_amount":2.00}},"event_time":"{{rfc3339}}","type":"{{type}}"}"#,
        headers: &[("x-webhook-version", "2023-08-01")],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::OK,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "postmark",
        summary: "HTTP basic auth in the webhook URL (no signature), compared in constant time; no event id for every record type: the body hash",
        hmac: r#"{"auth": "basic", "id": "body_hash", "type": {"json_pointer": "/RecordType"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"RecordType":"{{type}}","ServerID":23,"MessageStream":"outbound","MessageID":"{{id}}","Recipient":"john@example.com","Tag":"welcome","DeliveredAt":"{{rfc3339}}","Details":"Test delivery webhook details","Metadata":{}}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::OK,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "slack",
        summary: "X-Slack-Signature: v0= hex HMAC-SHA256 of \"v0:{X-Slack-Request-Timestamp}:{body}\", 5 min; id event_id; url_verification answered with its challenge, app_rate_limited acknowledged",
        hmac: r#"{"signature_header": "X-Slack-Signature", "prefix": "v0=", "encoding": "hex",
            "timestamp_header": "X-Slack-Request-Timestamp", "signed_content": "v0:{timestamp}:{body}",
            "id": {"json_pointer": "/event_id"}, "type": {"json_pointer": "/event/type"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"token":"XXYYZZ","team_id":"T061EG9R6","api_app_id":"A0PNCHHK2","event":{"type":"{{type}}","channel":"C0LAN2Q65","user":"U061F7AUR","text":"<@U0LAN0Z89> is it everything a river should be?","ts":"1515449522.000016","event_ts":"1515449522000016"},"type":"event_callback","authorizations":[{"team_id":"T061EG9R6","user_id":"U0LAN0Z89","is_bot":false}],"event_id":"Ev{{id}}","event_time":{{ts}}}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[
            Reply {
                at: Field::Json("/type"),
                equals: "url_verification",
                with: ReplyWith::Echo(Field::Json("/challenge")),
            },
            Reply { at: Field::Json("/type"), equals: "app_rate_limited", with: ReplyWith::Acknowledge },
        ],
        retype: &[],
        get: None,
        success: SuccessAnswer::Exactly(Success { status: 200, body: None }),
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "zoom",
        summary: "x-zm-signature: v0= hex HMAC-SHA256 of \"v0:{x-zm-request-timestamp}:{body}\", 5 min; no event id: the body hash; endpoint.url_validation answered with its plainToken and their HMAC",
        hmac: r#"{"signature_header": "x-zm-signature", "prefix": "v0=", "encoding": "hex",
            "timestamp_header": "x-zm-request-timestamp", "signed_content": "v0:{timestamp}:{body}",
            "id": "body_hash", "type": {"json_pointer": "/event"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"event":"{{type}}","payload":{"account_id":"AAAAAABBBB","object":{"uuid":"4444AAAiAAAAAiAiAiiAii==","id":"{{number}}","host_id":"x1yCzABCDEfg23HiJKl4mN","topic":"My Meeting","type":2,"start_time":"{{rfc3339}}","duration":60,"timezone":"America/Los_Angeles"}},"event_ts":{{ms}}}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[Reply {
            at: Field::Json("/event"),
            equals: "endpoint.url_validation",
            with: ReplyWith::SignedToken("/payload/plainToken"),
        }],
        retype: &[],
        get: None,
        success: SuccessAnswer::Exactly(Success { status: 200, body: None }),
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "twitch",
        summary: "Twitch-Eventsub-Message-Signature: sha256= hex HMAC-SHA256 of message id, Twitch-Eventsub-Message-Timestamp (RFC 3339) and body, 10 min; id Twitch-Eventsub-Message-Id; webhook_callback_verification answered with its challenge; a revocation recorded as type revocation",
        hmac: r#"{"signature_header": "Twitch-Eventsub-Message-Signature", "prefix": "sha256=", "encoding": "hex",
            "timestamp_header": "Twitch-Eventsub-Message-Timestamp", "timestamp_format": "rfc3339",
            "signed_content": "{header:Twitch-Eventsub-Message-Id}{timestamp}{body}",
            "id": {"header": "Twitch-Eventsub-Message-Id"}, "type": {"header": "Twitch-Eventsub-Subscription-Type"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: 600,
        content_type: JSON,
        sample: r#"{"subscription":{"id":"f1c2a387-161a-49f9-a165-0f21d7a4e1c4","status":"enabled","type":"{{type}}","version":"1","cost":0,"condition":{"broadcaster_user_id":"12826"},"transport":{"method":"webhook","callback":"https://example.com/webhooks/callback"},"created_at":"{{rfc3339}}"},"event":{"user_id":"1337","user_login":"awesome_user","user_name":"Awesome_User","broadcaster_user_id":"12826","broadcaster_user_login":"twitch","broadcaster_user_name":"Twitch","followed_at":"{{rfc3339}}"}}"#,
        headers: &[
            ("Twitch-Eventsub-Message-Type", "notification"),
            ("Twitch-Eventsub-Message-Retry", "0"),
            ("Twitch-Eventsub-Subscription-Version", "1"),
        ],
        id_style: IdStyle::Uuid,
        batch: None,
        replies: &[Reply {
            at: Field::Header("twitch-eventsub-message-type"),
            equals: "webhook_callback_verification",
            with: ReplyWith::Echo(Field::Json("/challenge")),
        }],
        retype: &[Retype {
            at: Field::Header("twitch-eventsub-message-type"),
            equals: "revocation",
            event_type: "revocation",
        }],
        get: None,
        success: SuccessAnswer::Accepted,
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "meta",
        summary: "X-Hub-Signature-256: sha256= hex HMAC-SHA256 of the body with the app secret; each update its own event (a WhatsApp message by its id, a status by id:status, a Messenger entry by its mid, other changes by their hash); the GET check (hub.mode, hub.verify_token, hub.challenge) answered with its challenge when the verify token matches",
        hmac: r#"{"signature_header": "X-Hub-Signature-256", "prefix": "sha256=", "encoding": "hex",
            "id": "body_hash", "type": {"json_pointer": "/object"}}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"object":"whatsapp_business_account","entry":[{"id":"102290129340398","changes":[{"value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"messages":[{"from":"16505551234","id":"wamid.{{id}}","timestamp":"{{ts}}","text":{"body":"Hello"},"type":"text"}]},"field":"messages"}]}]}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: Some(Batch {
            at: "",
            id: &[],
            event_type: None,
            empty_is_notice: false,
            split: Some(super::meta::split),
        }),
        replies: &[],
        retype: &[],
        get: Some(GetCheck::VerifyToken { mode: "hub.mode", token: "hub.verify_token", challenge: "hub.challenge" }),
        success: SuccessAnswer::Exactly(Success { status: 200, body: Some(("text/plain; charset=utf-8", "")) }),
        identity: Identity::SIGNED_EVENT,
    },
    Preset {
        name: "dropbox",
        summary: "X-Dropbox-Signature: hex HMAC-SHA256 of the body with the app secret; no event id: the body hash; the GET check answered with its challenge (plain values only)",
        hmac: r#"{"signature_header": "X-Dropbox-Signature", "encoding": "hex", "id": "body_hash"}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb-{{id}}"]},"delta":{"users":[{{number}}]}}"#,
        headers: &[],
        id_style: IdStyle::Hex,
        batch: None,
        replies: &[],
        retype: &[],
        get: Some(GetCheck::Echo { challenge: "challenge" }),
        success: SuccessAnswer::Exactly(Success { status: 200, body: None }),
        identity: Identity::NOTIFICATION,
    },
    Preset {
        name: "xero",
        summary: "x-xero-signature: base64 HMAC-SHA256 of the body with the webhook key; a batch (events), each identified by tenantId:eventCategory:resourceId:eventType:eventDateUtc; an empty batch (Intent to Receive) acknowledged; 200 with no body",
        hmac: r#"{"signature_header": "x-xero-signature", "encoding": "base64", "id": "body_hash"}"#,
        mask: &[],
        public_url: false,
        tolerance_secs: DEFAULT_TOLERANCE,
        content_type: JSON,
        sample: r#"{"events":[{"resourceUrl":"https://api.xero.com/api.xro/2.0/Contacts/{{id}}","resourceId":"{{id}}","eventDateUtc":"{{rfc3339}}","eventType":"{{type}}","eventCategory":"CONTACT","tenantId":"c2cc9b6e-9458-4c7d-93cc-f02b81b0594f","tenantType":"ORGANISATION"}],"lastEventSequence":1,"firstEventSequence":1,"entropy":"S0m3r4Nd0mt3xt"}"#,
        headers: &[],
        id_style: IdStyle::Uuid,
        batch: Some(Batch {
            at: "/events",
            id: &["/tenantId", "/eventCategory", "/resourceId", "/eventType", "/eventDateUtc"],
            event_type: Some("/eventType"),
            empty_is_notice: true,
            split: None,
        }),
        replies: &[],
        retype: &[],
        get: None,
        success: SuccessAnswer::Exactly(Success { status: 200, body: Some(("text/plain; charset=utf-8", "")) }),
        identity: Identity::SIGNED_EVENT,
    },
];

/// Senders that sign as Standard Webhooks (through Svix), by their own names.
#[derive(Debug)]
pub struct Alias {
    pub name: &'static str,
    pub summary: &'static str,
    pub sample: &'static str,
}

pub const ALIASES: &[Alias] = &[
    Alias {
        name: "clerk",
        summary: "Svix: svix-id, svix-timestamp, svix-signature (v1, HMAC-SHA256 with the whsec_ secret); id svix-id",
        sample: r#"{"data":{"id":"user_29w83sxmDNGwOuEthce5gg56FcC","object":"user","email_addresses":[]},"object":"event","type":"{{type}}","timestamp":{{ms}},"instance_id":"ins_123"}"#,
    },
    Alias {
        name: "resend",
        summary: "Svix: svix-id, svix-timestamp, svix-signature (v1, HMAC-SHA256 with the whsec_ secret); id svix-id",
        sample: r#"{"type":"{{type}}","created_at":"{{rfc3339}}","data":{"email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <onboarding@resend.dev>","to":["delivered@resend.dev"],"subject":"Sending this example"}}"#,
    },
];

/// The sample `template` with its placeholders filled.
fn fill(template: &str, event_id: &str, event_type: &str, now_s: i64) -> Vec<u8> {
    let digits: String = event_id.chars().filter(char::is_ascii_hexdigit).take(12).collect();
    let number = u64::from_str_radix(&digits, 16).unwrap_or(1) % 1_000_000_000_000 + 1;
    let token: String = event_id.chars().filter(char::is_ascii_hexdigit).cycle().take(50).collect();
    template
        .replace("{{id}}", event_id)
        .replace("{{type}}", event_type)
        .replace("{{ts}}", &now_s.to_string())
        .replace("{{ms}}", &(now_s * 1000).to_string())
        .replace("{{rfc3339}}", &super::sns::format_timestamp(now_s))
        .replace("{{number}}", &number.to_string())
        .replace("{{token}}", if token.is_empty() { "0" } else { &token })
        .into_bytes()
}

fn styled(style: IdStyle, hex: &str) -> String {
    match style {
        IdStyle::Hex => hex.to_owned(),
        IdStyle::Uuid if hex.len() >= 32 => {
            format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
        }
        IdStyle::Uuid => hex.to_owned(),
        IdStyle::Number => {
            let digits: String = hex.chars().filter(char::is_ascii_hexdigit).take(12).collect();
            (u64::from_str_radix(&digits, 16).unwrap_or(0) % 1_000_000_000_000 + 1).to_string()
        }
    }
}

impl Preset {
    /// The preset's `hmac` section, with its mask.
    pub fn section(&self) -> HmacSpec {
        let mut spec: HmacSpec = serde_json::from_str(self.hmac)
            .unwrap_or_else(|e| panic!("the {} preset's hmac section does not parse: {e}", self.name));
        spec.mask = self.mask.iter().map(|m| (*m).to_owned()).collect();
        spec
    }

    /// The verifier's configuration for an endpoint of this preset.
    pub fn config(&self, spec: &EndpointSpec) -> Result<GenericHmacConfig, String> {
        let section = self.section();
        let tolerance = spec.tolerance_secs.unwrap_or(self.tolerance_secs);
        GenericHmacConfig::from_spec(&section, tolerance, spec.public_url.as_deref())
    }
}

/// A preset's verifier: the generic one, and a batch split where the
/// provider sends several events at once.
struct PresetVerifier {
    inner: GenericHmacVerifier,
    batch: Option<&'static Batch>,
    mask: &'static [&'static str],
    replies: &'static [Reply],
    retype: &'static [Retype],
    get: Option<&'static GetCheck>,
    verify_token: Option<Secret>,
}

impl PresetVerifier {
    fn verify_now(&self, d: &Delivery<'_>, now_s: i64) -> Result<Verified, VerifyError> {
        if d.method == http::Method::GET {
            return self.get_check(d);
        }
        if self.batch.is_none() && self.replies.is_empty() && self.retype.is_empty() {
            return self.inner.verify_delivery(d, now_s);
        }
        self.inner.authenticate(d, now_s)?;
        // Authenticated: a handshake or a notice is answered, not recorded.
        if let Some(reply) = self.reply(d)? {
            return Ok(reply);
        }
        let Some(batch) = self.batch else {
            let mut verified = self.inner.identify(d)?;
            // Its id stays the one the section reads (a revocation's own message id).
            if let Some(r) = self.retype.iter().find(|r| field_value(d, r.at).as_deref() == Some(r.equals)) {
                verified.event_type = Some(r.event_type.to_owned());
            }
            return Ok(verified);
        };
        if batch.empty_is_notice && is_empty_batch(d.body, batch) {
            return Ok(notice("an empty batch"));
        }
        // A batch: each event is identified by itself.
        let events = split_masked(d.body, batch, self.mask)?;
        let first = events.first().map(|e| e.event_id.clone()).unwrap_or_default();
        Ok(Verified { action: Action::Batch(events), ..Verified::record(first, None) })
    }

    /// The provider's GET check of the endpoint: its challenge echoed, once
    /// whatever it proves is checked; nothing recorded.
    fn get_check(&self, d: &Delivery<'_>) -> Result<Verified, VerifyError> {
        let Some(check) = self.get else { return Err(VerifyError::MalformedEnvelope("this provider sends no GET")) };
        let params: Vec<(std::borrow::Cow<'_, str>, std::borrow::Cow<'_, str>)> =
            url::form_urlencoded::parse(d.query.as_bytes()).collect();
        let param = |name: &str| {
            let mut all = params.iter().filter(|(k, _)| k == name);
            match (all.next(), all.next()) {
                (Some((_, v)), None) => Some(v.as_ref()),
                _ => None,
            }
        };
        let challenge = match check {
            GetCheck::VerifyToken { mode, token, challenge } => {
                let expected = self.verify_token.as_ref().ok_or(VerifyError::SignatureMismatch)?;
                let offered = param(token).ok_or(VerifyError::MissingHeader("verify token"))?;
                if !generic::same_secret(expected.expose(), offered.as_bytes()) {
                    return Err(VerifyError::SignatureMismatch);
                }
                if param(mode) != Some("subscribe") {
                    return Err(VerifyError::MalformedPayload("the check is not a subscription"));
                }
                param(challenge)
            }
            GetCheck::Echo { challenge } => param(challenge),
        };
        let challenge = challenge.ok_or(VerifyError::MalformedPayload("the check carries no challenge"))?;
        if !echoable(challenge) {
            return Err(VerifyError::MalformedPayload("the challenge is not a value to echo"));
        }
        let action = Action::Reply { content_type: "text/plain; charset=utf-8", body: challenge.to_owned() };
        Ok(Verified { event_id: String::new(), event_type: Some("get_check".into()), action, content: Content::Bytes })
    }

    /// The answer to an authenticated delivery that is one of the preset's
    /// handshakes or notices, if it is one.
    fn reply(&self, d: &Delivery<'_>) -> Result<Option<Verified>, VerifyError> {
        if self.replies.is_empty() {
            return Ok(None);
        }
        let mut wanted: Vec<&str> = Vec::new();
        for r in self.replies {
            for f in [Some(r.at), reply_field(r.with)].into_iter().flatten() {
                if let Field::Json(p) = f {
                    wanted.push(p);
                }
            }
        }
        let found = json::pointers_many(d.body, &wanted);
        let value = |f: Field| -> Option<String> {
            match f {
                Field::Json(p) => {
                    let at = wanted.iter().position(|w| *w == p)?;
                    json::string_at(d.body, found[at].as_ref()?).map(std::borrow::Cow::into_owned)
                }
                Field::Header(h) => d.headers.get(h)?.to_str().ok().map(|v| v.trim().to_owned()),
            }
        };
        let Some(r) = self.replies.iter().find(|r| value(r.at).as_deref() == Some(r.equals)) else {
            return Ok(None);
        };
        let plain = |f: Field| -> Result<String, VerifyError> {
            let v = value(f).ok_or(VerifyError::MalformedPayload("the handshake carries no value to answer"))?;
            if echoable(&v) {
                Ok(v)
            } else {
                Err(VerifyError::MalformedPayload("the handshake's value is not one to echo"))
            }
        };
        let action = match r.with {
            ReplyWith::Echo(f) => Action::Reply { content_type: "text/plain; charset=utf-8", body: plain(f)? },
            ReplyWith::SignedToken(p) => {
                let token = plain(Field::Json(p))?;
                let encrypted = self.inner.first_mac_hex(token.as_bytes());
                let body = serde_json::json!({"plainToken": token, "encryptedToken": encrypted}).to_string();
                Action::Reply { content_type: "application/json", body }
            }
            ReplyWith::Acknowledge => Action::Acknowledge { what: r.equals },
        };
        Ok(Some(Verified {
            event_id: String::new(),
            event_type: Some(r.equals.to_owned()),
            action,
            content: Content::Bytes,
        }))
    }
}

/// A header's value, or a JSON string at a pointer, of a delivery.
fn field_value(d: &Delivery<'_>, f: Field) -> Option<String> {
    match f {
        Field::Json(p) => {
            let [at] = json::pointers(d.body, [Some(p)]);
            json::string_at(d.body, &at?).map(std::borrow::Cow::into_owned)
        }
        Field::Header(h) => d.headers.get(h)?.to_str().ok().map(|v| v.trim().to_owned()),
    }
}

/// Whether the batch's array is there and empty.
fn is_empty_batch(body: &[u8], batch: &Batch) -> bool {
    let at = if batch.at.is_empty() { Some(0..body.len()) } else { json::pointers(body, [Some(batch.at)])[0].clone() };
    at.is_some_and(|r| {
        let mut n = 0;
        json::scan(&body[r], |_| n += 1) == Ok(json::Kind::Array) && n == 0
    })
}

/// A notice without an identity: acknowledged, nothing recorded.
fn notice(what: &'static str) -> Verified {
    Verified {
        event_id: String::new(),
        event_type: None,
        action: Action::Acknowledge { what },
        content: Content::Bytes,
    }
}

/// The field a reply answers with, if any.
fn reply_field(with: ReplyWith) -> Option<Field> {
    match with {
        ReplyWith::Echo(f) => Some(f),
        ReplyWith::SignedToken(p) => Some(Field::Json(p)),
        ReplyWith::Acknowledge => None,
    }
}

impl Verifier for PresetVerifier {
    fn verify<'a>(&'a self, d: Delivery<'a>, now_s: i64) -> Verifying<'a> {
        ready(self.verify_now(&d, now_s))
    }
}

/// The most events one delivery may carry.
pub const MAX_BATCH_EVENTS: usize = super::MAX_BATCH_EVENTS;

/// The events of a verified batch body (a JSON array): each element's id
/// (its `batch.id` values joined by `:`), type, bytes and content (the
/// preset's `mask` inside it). An element without its id refuses the whole
/// delivery.
pub fn split(body: &[u8], batch: &Batch) -> Result<Vec<BatchEvent>, VerifyError> {
    split_masked(body, batch, &[])
}

fn split_masked(body: &[u8], batch: &Batch, mask: &[&str]) -> Result<Vec<BatchEvent>, VerifyError> {
    if let Some(split) = batch.split {
        return split(body);
    }
    let list = if batch.at.is_empty() {
        0..body.len()
    } else {
        let [at] = json::pointers(body, [Some(batch.at)]);
        at.ok_or(VerifyError::MalformedPayload("the delivery has no array of events where its provider puts them"))?
    };
    let mut elements: Vec<Range<usize>> = Vec::new();
    let kind = json::scan(&body[list.clone()], |e| elements.push(e.value.start + list.start..e.value.end + list.start))
        .map_err(|_| VerifyError::MalformedPayload("not JSON"))?;
    if kind != json::Kind::Array {
        return Err(VerifyError::MalformedPayload("the batch is not a JSON array"));
    }
    if elements.is_empty() {
        return Err(VerifyError::MalformedPayload("the batch has no events"));
    }
    if elements.len() > MAX_BATCH_EVENTS {
        return Err(VerifyError::MalformedPayload("the batch has more events than a delivery may carry"));
    }
    // Every field of an element in one pass over it: the id's, the type, the mask.
    let fields: Vec<&str> = batch.id.iter().copied().chain(batch.event_type).chain(mask.iter().copied()).collect();
    let type_at = batch.id.len();
    let mask_at = type_at + usize::from(batch.event_type.is_some());
    let mut out: Vec<BatchEvent> = Vec::with_capacity(elements.len());
    for range in elements {
        let event = &body[range.clone()];
        let found = json::pointers_many(event, &fields);
        let parts: Option<Vec<String>> =
            found[..type_at].iter().map(|at| at.as_ref().and_then(|r| json_text(event, r))).collect();
        // An element without its id, or with one that cannot be an id, is
        // kept apart (parked); the others are recorded as usual.
        let Some(event_id) = parts.and_then(|p| checked_event_id(&p.join(":")).ok()) else {
            push_event(&mut out, malformed_element(body, range, "an event of the batch has no id"))?;
            continue;
        };
        let event_type = found[type_at..mask_at].first().and_then(|at| json_text(event, at.as_ref()?));
        let content = if mask.is_empty() {
            Content::Bytes
        } else {
            let mut ranges: Vec<Range<usize>> = found[mask_at..].iter().flatten().cloned().collect();
            ranges.sort_by_key(|r| r.start);
            ranges.dedup_by(|later, earlier| later.start < earlier.end);
            Content::Masked { ranges }
        };
        push_event(&mut out, BatchEvent { event_id, event_type, bytes: range, content })?;
    }
    Ok(out)
}

impl Provider for Preset {
    fn name(&self) -> &'static str {
        self.name
    }

    fn summary(&self) -> &'static str {
        self.summary
    }

    fn options(&self) -> String {
        let url = if self.public_url { "public_url (required), " } else { "" };
        let signed_ts = serde_json::from_str::<HmacSpec>(self.hmac).is_ok_and(|h| {
            h.timestamp_header.is_some()
                || h.timestamp_pointer.is_some()
                || h.list.is_some_and(|l| l.timestamp.is_some())
        });
        if signed_ts {
            format!("{url}tolerance_secs (default {})", self.tolerance_secs)
        } else {
            url.trim_end_matches(", ").to_owned()
        }
    }

    fn validate(&self, spec: &EndpointSpec) -> Result<(), String> {
        let mut common = spec.clone();
        common.public_url = None;
        no_sections(self.name, &common)
            .map_err(|e| format!("{e} (a preset's hmac section is fixed: use provider hmac to change it)"))?;
        match (self.public_url, spec.public_url.is_some()) {
            (true, false) => {
                return Err(format!("{} signs the URL it calls: the endpoint needs its public_url", self.name));
            }
            (false, true) => return Err(format!("public_url is for providers that sign their URL, not {}", self.name)),
            _ => {}
        }
        self.config(spec).map(|_| ())
    }

    fn verifier(
        &self,
        spec: &EndpointSpec,
        secrets: Vec<Secret>,
        cx: &BuildContext,
    ) -> Result<Box<dyn Verifier>, String> {
        let inner = GenericHmacVerifier::new(self.config(spec)?, secrets)?;
        let (batch, mask, replies) = preset_batch(self.name);
        let listed = PRESETS.iter().find(|p| p.name == self.name);
        let get = listed.and_then(|p| p.get.as_ref());
        let retype = listed.map_or(&[][..], |p| p.retype);
        Ok(Box::new(PresetVerifier { inner, batch, mask, replies, retype, get, verify_token: cx.verify_token.clone() }))
    }

    /// A JSON body, or a form's parameters as a JSON object (Twilio); the
    /// type stored at intake, else `<preset>.delivery` for a provider that
    /// names none (Dropbox, Twilio).
    fn decode(
        &self,
        stored_type: Option<&str>,
        payload: &[u8],
    ) -> Result<(String, serde_json::Value), crate::event::DecodeError> {
        let body = if self.content_type == FORM {
            let params: serde_json::Map<String, serde_json::Value> = url::form_urlencoded::parse(payload)
                .into_owned()
                .map(|(k, v)| (k, serde_json::Value::String(v)))
                .collect();
            serde_json::Value::Object(params)
        } else {
            serde_json::from_slice(payload)
                .map_err(|e| crate::event::DecodeError(format!("payload is not JSON: {e}")))?
        };
        let ty = stored_type.map_or_else(|| format!("{}.delivery", self.name), str::to_owned);
        Ok((ty, body))
    }

    /// The masked values do not count: a retry whose counters changed says the same.
    fn content_hash(&self, body: &[u8]) -> String {
        if self.mask.is_empty() {
            return crate::identity::payload_hash(body);
        }
        let ranges = generic::mask_ranges(body, self.mask);
        super::hashes::delivery_hashes(body, &Content::Masked { ranges }).1
    }

    fn event_id(&self, random_hex: &str) -> String {
        styled(self.id_style, random_hex)
    }

    fn sample(&self, _: &EndpointSpec, event_id: &str, event_type: &str, now_s: i64) -> Vec<u8> {
        fill(self.sample, event_id, event_type, now_s)
    }

    fn content_type(&self) -> &'static str {
        self.content_type
    }

    fn methods(&self) -> &'static [http::Method] {
        if self.get.is_some() { &[http::Method::POST, http::Method::GET] } else { &[http::Method::POST] }
    }

    fn takes_verify_token(&self) -> bool {
        matches!(self.get, Some(GetCheck::VerifyToken { .. }))
    }

    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        self.success
    }

    fn identity(&self) -> Identity {
        self.identity
    }

    fn seal(&self, spec: &EndpointSpec, secret: &Secret, now_s: i64, body: Vec<u8>) -> Result<Vec<u8>, String> {
        generic::seal(&self.config(spec)?, secret, now_s, body)
    }

    fn sign(
        &self,
        spec: &EndpointSpec,
        secret: &Secret,
        event_id: &str,
        event_type: &str,
        now_s: i64,
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        let section = self.section();
        let mut extra: Vec<(String, String)> =
            self.headers.iter().map(|(k, v)| ((*k).to_ascii_lowercase(), (*v).to_owned())).collect();
        if let Source::Header(name) = &section.id {
            extra.push((name.to_ascii_lowercase(), event_id.to_owned()));
        }
        if let Some(Source::Header(name)) = &section.event_type {
            extra.push((name.to_ascii_lowercase(), event_type.to_owned()));
        }
        let mut headers = generic::sign_headers(&self.config(spec)?, secret, now_s, body, &extra)?;
        headers.extend(extra);
        Ok(headers)
    }

    fn split(&self, payload: &[u8]) -> Option<Result<Vec<BatchEvent>, VerifyError>> {
        self.batch.as_ref().map(|b| split_masked(payload, b, self.mask))
    }

    /// Its handshakes and notices as its provider sends them, built from
    /// [`Preset::replies`], an empty batch that is a notice, and its GET check.
    fn handshakes(&self, hs: HandshakeInput<'_>) -> Result<Vec<Handshake>, String> {
        const TEXT: Option<&str> = Some("text/plain; charset=utf-8");
        let answer = |status, content_type, body: &str| HandshakeAnswer {
            status,
            content_type,
            body: body.to_owned(),
            header: None,
        };
        // A notice is acknowledged with the provider's own success answer.
        let acknowledged = match self.success {
            SuccessAnswer::Exactly(Success { status, body: Some((content_type, body)) }) => {
                answer(status, Some(content_type), body)
            }
            SuccessAnswer::Exactly(Success { status, body: None }) => answer(status, None, ""),
            SuccessAnswer::Accepted => answer(200, None, ""),
        };
        let mut out = Vec::new();
        // (name, body, headers besides the signature's, the answer it needs)
        let mut posts: Vec<SignedHandshake> = Vec::new();
        for r in self.replies {
            let mut body = serde_json::json!({});
            let mut extra = Vec::new();
            match r.at {
                Field::Json(p) => set_pointer(&mut body, p, r.equals.into()),
                Field::Header(h) => extra.push((h.to_ascii_lowercase(), r.equals.to_owned())),
            }
            let expect = match r.with {
                ReplyWith::Echo(f) => {
                    match f {
                        Field::Json(p) => set_pointer(&mut body, p, hs.nonce.into()),
                        Field::Header(h) => extra.push((h.to_ascii_lowercase(), hs.nonce.to_owned())),
                    }
                    answer(200, TEXT, hs.nonce)
                }
                ReplyWith::SignedToken(p) => {
                    set_pointer(&mut body, p, hs.nonce.into());
                    let secret = hs.secret.ok_or("the handshake is answered with the endpoint's secret")?;
                    let encrypted =
                        hex::encode(super::mac_bytes(super::hmac_sha256(secret.expose(), &[hs.nonce.as_bytes()])));
                    let json = serde_json::json!({"plainToken": hs.nonce, "encryptedToken": encrypted});
                    answer(200, Some("application/json"), &json.to_string())
                }
                ReplyWith::Acknowledge => acknowledged.clone(),
            };
            posts.push((r.equals, body, extra, expect));
        }
        if let Some(batch) = self.batch.as_ref().filter(|b| b.empty_is_notice) {
            let mut body = serde_json::json!({});
            set_pointer(&mut body, batch.at, serde_json::json!([]));
            posts.push(("an empty batch", body, Vec::new(), acknowledged.clone()));
        }
        for (name, body, extra, expect) in posts {
            let secret = hs.secret.ok_or("the handshake is signed with the endpoint's secret")?;
            let body = body.to_string().into_bytes();
            let body = self.seal(hs.spec, secret, hs.now_s, body)?;
            let mut headers = vec![("content-type".to_owned(), self.content_type.to_owned())];
            headers.extend(self.sign(hs.spec, secret, hs.nonce, name, hs.now_s, &body)?);
            for (k, v) in extra {
                headers.retain(|(h, _)| !h.eq_ignore_ascii_case(&k));
                headers.push((k, v));
            }
            out.push(Handshake { name, method: http::Method::POST, query: String::new(), headers, body, expect });
        }
        if let Some(get) = &self.get {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            match get {
                GetCheck::VerifyToken { mode, token, challenge } => {
                    let t = hs.verify_token.ok_or("the GET check carries the endpoint's verify_token")?;
                    let t = std::str::from_utf8(t.expose()).map_err(|_| "the verify token is not text".to_owned())?;
                    query.append_pair(mode, "subscribe").append_pair(challenge, hs.nonce).append_pair(token, t);
                }
                GetCheck::Echo { challenge } => {
                    query.append_pair(challenge, hs.nonce);
                }
            }
            out.push(Handshake {
                name: "GET check",
                method: http::Method::GET,
                query: query.finish(),
                headers: Vec::new(),
                body: Vec::new(),
                expect: answer(200, TEXT, hs.nonce),
            });
        }
        Ok(out)
    }
}

/// A signed handshake before it is signed: its name, body, extra headers and answer.
type SignedHandshake = (&'static str, serde_json::Value, Vec<(String, String)>, HandshakeAnswer);

/// Sets the value at a JSON pointer of plain names, making the objects on its way.
fn set_pointer(doc: &mut serde_json::Value, pointer: &str, value: serde_json::Value) {
    let names: Vec<&str> = pointer.split('/').skip(1).collect();
    let mut at = doc;
    for (i, name) in names.iter().enumerate() {
        if !at.is_object() {
            *at = serde_json::json!({});
        }
        let Some(map) = at.as_object_mut() else { return };
        if i + 1 == names.len() {
            map.insert((*name).to_owned(), value);
            return;
        }
        at = map.entry((*name).to_owned()).or_insert_with(|| serde_json::json!({}));
    }
}

/// The batch shape, mask and replies of the preset of this name (`'static` borrows of the table).
#[allow(clippy::type_complexity)]
fn preset_batch(name: &str) -> (Option<&'static Batch>, &'static [&'static str], &'static [Reply]) {
    PRESETS.iter().find(|p| p.name == name).map_or((None, &[], &[]), |p| (p.batch.as_ref(), p.mask, p.replies))
}

impl Provider for Alias {
    fn name(&self) -> &'static str {
        self.name
    }

    /// Svix senders take any 2xx as delivered.
    fn success(&self, _: Option<&str>) -> SuccessAnswer {
        SuccessAnswer::Accepted
    }

    /// `svix-id` is signed with the body.
    fn identity(&self) -> Identity {
        Identity::SIGNED_EVENT
    }

    fn summary(&self) -> &'static str {
        self.summary
    }

    fn validate(&self, spec: &EndpointSpec) -> Result<(), String> {
        no_sections(self.name, spec)
    }

    fn verifier(
        &self,
        spec: &EndpointSpec,
        secrets: Vec<Secret>,
        cx: &BuildContext,
    ) -> Result<Box<dyn Verifier>, String> {
        standard::StandardWebhooks.verifier(spec, secrets, cx)
    }

    fn event_id(&self, random_hex: &str) -> String {
        standard::StandardWebhooks.event_id(random_hex)
    }

    fn sample(&self, _: &EndpointSpec, event_id: &str, event_type: &str, now_s: i64) -> Vec<u8> {
        fill(self.sample, event_id, event_type, now_s)
    }

    /// As Svix sends: the `svix-*` names of the Standard Webhooks headers.
    fn sign(
        &self,
        spec: &EndpointSpec,
        secret: &Secret,
        event_id: &str,
        event_type: &str,
        now_s: i64,
        body: &[u8],
    ) -> Result<Vec<(String, String)>, String> {
        let headers = standard::StandardWebhooks.sign(spec, secret, event_id, event_type, now_s, body)?;
        Ok(headers.into_iter().map(|(k, v)| (k.replacen("webhook-", "svix-", 1), v)).collect())
    }
}

#[cfg(test)]
mod tests;
