//! The registry: every provider an endpoint can name, each found by its
//! name. It sits above the providers' modules (which implement
//! [`Provider`]); nothing below it names a provider.

use serde::Deserialize;

use super::provider::{Provider, ProviderKind};
use crate::event::DecodeError;
use crate::identity::payload_hash;

/// The providers with modules of their own, in the order `docs/providers.md`
/// lists them; the presets on the generic verifier follow them
/// ([`providers`]).
pub const REGISTRY: &[&dyn Provider] = &[
    &super::stripe::Stripe,
    &super::github::Github,
    &super::standard::StandardWebhooks,
    &super::sns::Sns,
    &super::quiltt::Quiltt,
    &super::discord::Discord,
    &super::graph::MicrosoftGraph,
    &super::asana::Asana,
    &super::generic::Hmac,
];

/// Every provider an endpoint can name: [`REGISTRY`], then the HMAC
/// presets and the Standard Webhooks aliases (`verify::presets`).
pub fn providers() -> impl Iterator<Item = &'static dyn Provider> {
    let presets = super::presets::PRESETS.iter().map(|p| p as &'static dyn Provider);
    let aliases = super::presets::ALIASES.iter().map(|p| p as &'static dyn Provider);
    REGISTRY.iter().copied().chain(presets).chain(aliases)
}

impl ProviderKind {
    pub const STRIPE: Self = Self::of(&super::stripe::Stripe);
    pub const GITHUB: Self = Self::of(&super::github::Github);
    pub const STANDARD_WEBHOOKS: Self = Self::of(&super::standard::StandardWebhooks);
    pub const SNS: Self = Self::of(&super::sns::Sns);
    pub const QUILTT: Self = Self::of(&super::quiltt::Quiltt);
    pub const HMAC: Self = Self::of(&super::generic::Hmac);

    /// The registered provider of this name.
    pub fn named(name: &str) -> Option<Self> {
        providers().find(|p| p.name() == name).map(Self::of)
    }

    /// The names of every registered provider, for error messages.
    pub fn names() -> String {
        providers().map(|p| p.name()).collect::<Vec<_>>().join(", ")
    }
}

impl<'de> Deserialize<'de> for ProviderKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::named(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown provider {name:?} (known: {})", Self::names())))
    }
}

/// `(event type, JSON body)` of a payload a record of `provider` stored; a
/// name no provider is registered under (a record older than its
/// provider's removal) is decoded as plain JSON.
pub fn decode(
    provider: &str,
    stored_type: Option<&str>,
    payload: &[u8],
) -> Result<(String, serde_json::Value), DecodeError> {
    match ProviderKind::named(provider) {
        Some(p) => p.decode(stored_type, payload),
        None => crate::event::decode_json(stored_type, payload),
    }
}

/// Hash of what a delivery of `provider` (by name, as records store it)
/// says, as opposed to its exact bytes: the provider's
/// [`Provider::content_hash`]. Providers' retries of one fact may differ in
/// fields that describe the delivery rather than the fact: Stripe re-renders
/// `pending_webhooks` (the count of endpoints still owed this event) on
/// every attempt; such fields are masked. A name no provider is registered
/// under hashes the bytes.
pub fn content_hash(provider: &str, body: &[u8]) -> String {
    ProviderKind::named(provider).map_or_else(|| payload_hash(body), |p| p.content_hash(body))
}

/// Whether a record's stored content hash says the same as this delivery's
/// (the provider's [`Provider::same_content`]).
pub fn same_content(stored: &str, ours: &str, provider: &str, body: &[u8]) -> bool {
    match ProviderKind::named(provider) {
        Some(p) => p.same_content(stored, ours, body),
        None => stored == ours,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::payload_hash;
    use crate::verify::provider::SuccessAnswer;

    /// The rows of the markdown table under `heading` in `docs/providers.md`, as cells.
    fn table(heading: &str) -> Vec<Vec<String>> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/providers.md");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let at = text.find(heading).unwrap_or_else(|| panic!("no {heading:?} in docs/providers.md"));
        let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
        text[line_start..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.trim().trim_matches('|').split(" | ").map(|c| c.trim().to_owned()).collect())
            .collect()
    }

    /// The name in backticks in a table's first cell (`` `mailgun` `` or "Mailgun (`mailgun`)").
    fn named(cell: &str) -> Option<&str> {
        cell.split('`').nth(1)
    }

    /// One table of answers: every provider declares the answer it needs
    /// ([`Provider::success`]), `docs/providers.md`'s answers table gives
    /// exactly that for every one of them, and a preset whose documented
    /// behaviour ("the provider on our answers") completes only on 200 is
    /// answered 200, never the intake's 202.
    #[test]
    fn every_providers_answer_is_declared_once_and_the_docs_say_the_same() {
        let rows = table("## Answers the providers need");
        let (head, rows) = rows.split_first().unwrap_or_else(|| panic!("an empty answers table"));
        assert_eq!(head[..2], ["provider".to_owned(), "a recorded delivery".to_owned()], "{head:?}");
        let mut documented = std::collections::BTreeMap::new();
        for row in rows.iter().skip(1) {
            let name = named(&row[0]).unwrap_or_else(|| panic!("{row:?}"));
            assert!(documented.insert(name.to_owned(), row[1].clone()).is_none(), "{name} twice");
        }
        let mut wrong = Vec::new();
        for p in providers() {
            let want = p.success(None).describe();
            match documented.remove(p.name()) {
                Some(cell) if cell.starts_with(&want) => {}
                Some(cell) => wrong.push(format!("{}: the docs say {cell:?}, the code {want:?}", p.name())),
                None => wrong.push(format!("{}: not in the docs' answers table (the code: {want:?})", p.name())),
            }
        }
        wrong.extend(documented.keys().map(|n| format!("{n}: in the docs' answers table, no such provider")));
        assert!(wrong.is_empty(), "docs/providers.md's answers table and the code disagree:\n{}", wrong.join("\n"));

        let presets = table("| preset (`provider`) |");
        let column = presets[0].iter().position(|h| h == "the provider on our answers").unwrap_or(usize::MAX);
        assert!(presets.len() >= 32, "{} preset rows", presets.len());
        for row in &presets[2..] {
            let name = named(&row[0]).unwrap_or_else(|| panic!("{row:?}"));
            let p = ProviderKind::named(name).unwrap_or_else(|| panic!("{name}: no such provider"));
            let says = row.get(column).unwrap_or_else(|| panic!("{name}: no answers column"));
            let only_200 = says.starts_with("200") || says.contains(": 200 done");
            if only_200 {
                assert!(
                    matches!(p.success(None), SuccessAnswer::Exactly(s) if s.status == 200),
                    "{name}: its documentation completes a delivery only on 200 ({says:?}), the code answers {}",
                    p.success(None).describe()
                );
            }
        }
    }

    /// Every provider declares its identity contract ([`Provider::identity`]),
    /// and `docs/providers.md`'s identity table gives exactly that for every
    /// one of them.
    #[test]
    fn every_providers_identity_contract_is_declared_and_the_docs_say_the_same() {
        let rows = table("## Identity contracts");
        let (head, rows) = rows.split_first().unwrap_or_else(|| panic!("an empty identity table"));
        assert_eq!(head[..3], ["provider", "contract", "a body replayed under another identity"], "{head:?}");
        let mut documented = std::collections::BTreeMap::new();
        for row in rows.iter().skip(1) {
            let name = named(&row[0]).unwrap_or_else(|| panic!("{row:?}"));
            assert!(row.get(3).is_some_and(|why| why.len() > 10), "{name}: no reason given");
            assert!(documented.insert(name.to_owned(), (row[1].clone(), row[2].clone())).is_none(), "{name} twice");
        }
        let mut wrong = Vec::new();
        for p in providers() {
            let (contract, replay) = p.identity().describe();
            match documented.remove(p.name()) {
                Some((c, r)) if c == contract && r == replay => {}
                Some(cells) => {
                    wrong.push(format!("{}: the docs say {cells:?}, the code {contract:?}, {replay:?}", p.name()))
                }
                None => wrong.push(format!("{}: not in the docs' identity table", p.name())),
            }
        }
        wrong.extend(documented.keys().map(|n| format!("{n}: in the docs' identity table, no such provider")));
        assert!(wrong.is_empty(), "docs/providers.md's identity table and the code disagree:\n{}", wrong.join("\n"));
    }

    #[test]
    fn every_provider_is_registered_once_and_found_by_its_name() {
        let mut names: Vec<&str> = providers().map(|p| p.name()).collect();
        let count = names.len();
        for name in &names {
            assert_eq!(ProviderKind::named(name).map(ProviderKind::as_str), Some(*name));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "two providers share a name");
        for k in [
            ProviderKind::STRIPE,
            ProviderKind::GITHUB,
            ProviderKind::STANDARD_WEBHOOKS,
            ProviderKind::SNS,
            ProviderKind::QUILTT,
            ProviderKind::HMAC,
        ] {
            assert!(names.contains(&k.as_str()), "{k} is a constant but not registered");
        }
        assert_eq!(ProviderKind::named("stripe "), None);
    }

    /// Adding a provider means a row in docs/providers.md: each registered
    /// name appears there as `` `name` `` in the table's first column.
    #[test]
    fn every_registered_provider_has_its_row_in_the_docs() {
        let docs = include_str!("../../../docs/providers.md");
        let missing: Vec<&str> = providers()
            .map(|p| p.name())
            .filter(|n| !docs.lines().any(|l| l.starts_with("| ") && l.contains(&format!("`{n}`"))))
            .collect();
        assert!(missing.is_empty(), "docs/providers.md has no row for {missing:?}");
    }

    #[test]
    fn an_unknown_provider_is_refused_with_the_known_ones() {
        let err = serde_json::from_str::<ProviderKind>("\"paypal\"").unwrap_err().to_string();
        assert!(err.contains("unknown provider \"paypal\"") && err.contains("stripe, github"), "{err}");
        assert_eq!(serde_json::from_str::<ProviderKind>("\"quiltt\"").unwrap(), ProviderKind::QUILTT);
    }

    #[test]
    fn stored_payloads_of_unregistered_providers_decode_as_json() {
        let (t, b) = decode("gone", None, br#"{"type":"x.y","n":1}"#).unwrap();
        assert_eq!((t.as_str(), b["n"].as_i64()), ("x.y", Some(1)));
        assert_eq!(content_hash("gone", b"abc"), payload_hash(b"abc"));
    }

    #[test]
    fn provider_shapes_decode() {
        let (t, b) = decode("stripe", Some("invoice.paid"), br#"{"id":"evt_1","type":"invoice.paid"}"#).unwrap();
        assert_eq!((t.as_str(), b["id"].as_str()), ("invoice.paid", Some("evt_1")));
        let sns =
            serde_json::json!({"Type": "Notification", "Message": "{\"notificationType\":\"Bounce\"}"}).to_string();
        let (t, b) = decode("sns", Some("ses.Bounce"), sns.as_bytes()).unwrap();
        assert_eq!((t.as_str(), b["notificationType"].as_str()), ("ses.Bounce", Some("Bounce")));
        let (t, b) = decode("github", Some("push"), b"payload=%7B%22ref%22%3A%22refs%2Fheads%2Fmain%22%7D").unwrap();
        assert_eq!((t.as_str(), b["ref"].as_str()), ("push", Some("refs/heads/main")));
        let (t, _) = decode("standard_webhooks", None, br#"{"type":"seats.snapshot"}"#).unwrap();
        assert_eq!(t, "seats.snapshot");
    }

    #[test]
    fn undecodable_payloads_are_permanent_errors() {
        assert!(decode("stripe", None, b"\xff\xfe").is_err());
        assert!(decode("standard_webhooks", None, br#"{"no":"type"}"#).is_err());
        assert!(decode("sns", None, br#"{"Type":"Notification"}"#).is_err());
    }

    mod proptests {
        use proptest::prelude::*;

        use super::*;
        use crate::event::DecodeError;

        fn payload() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..200),
                r#"\{("(type|Message|id)":("[ -~]{0,10}"|[0-9]{1,3}|null|\{\}),?){0,3}\}"#.prop_map(String::into_bytes),
                "payload=[ -~]{0,40}".prop_map(String::into_bytes),
                any::<String>()
                    .prop_map(|m| serde_json::json!({"Type": "Notification", "Message": m}).to_string().into_bytes()),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any stored payload, for any provider: a type and a body, or
            /// the typed (permanent) decode error; never a panic.
            #[test]
            fn decoding_never_panics_and_errors_are_typed(
                provider in prop::sample::select(providers().map(|p| p.name()).chain(["other"]).collect::<Vec<_>>()),
                stored_type in prop::option::of("[a-z.]{0,10}"),
                payload in payload(),
            ) {
                match decode(provider, stored_type.as_deref(), &payload) {
                    Ok((ty, _)) => if let Some(t) = &stored_type { prop_assert_eq!(&ty, t) },
                    Err(DecodeError(why)) => prop_assert!(!why.is_empty()),
                }
            }
        }
    }
}

#[cfg(test)]
mod registry_only {
    use super::providers;

    fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// No production code outside a provider's own module names a provider
    /// in a string (`"stripe"`): everything provider-specific goes through
    /// the registry. Test modules and files of tests are not looked at.
    #[test]
    fn no_code_outside_the_registry_matches_on_a_provider_name() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["shared/src", "cli/src", "functions"] {
            sources(&root.join(dir), &mut files);
        }
        let mut found = Vec::new();
        for file in files {
            let rel = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
            let suite = rel.ends_with("/contract.rs");
            if suite || rel.ends_with("/tests.rs") || rel.contains("/tests/") || rel.ends_with("_tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let production = text.split("#[cfg(test)]").next().unwrap_or_default();
            for p in providers() {
                let quoted = format!("\"{}\"", p.name());
                let own = production.contains(&format!("fn name(&self) -> &'static str {{\n        {quoted}"));
                let matches = [
                    format!("== {quoted}"),
                    format!("!= {quoted}"),
                    format!("{quoted} =>"),
                    format!("| {quoted}"),
                    format!("({quoted},"),
                    format!("provider: {quoted}"),
                    format!("new({quoted}"),
                    format!("content_hash({quoted}"),
                ];
                for (n, line) in production.lines().enumerate() {
                    // (`service == "sns"`: the AWS service of an ARN, not the provider.)
                    let matched = matches.iter().any(|m| line.contains(m.as_str())) && !line.contains("service ==");
                    if !own && matched && !line.trim_start().starts_with("//") {
                        found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(found.is_empty(), "provider names outside their modules:\n{}", found.join("\n"));
    }
}

#[cfg(test)]
mod hash_tests {
    use super::*;
    use crate::identity::payload_hash;
    use crate::verify::Content;
    use crate::verify::hashes::delivery_hashes;
    use crate::verify::stripe;
    use crate::verify::stripe::legacy_content_hash as legacy_stripe_content_hash;

    #[test]
    fn stripe_retries_that_differ_only_in_pending_webhooks_have_one_content_hash() {
        let first = br#"{"id":"evt_1","object":"event","pending_webhooks":2,"data":{"object":{"id":"pi_1"}}}"#;
        let retry = br#"{"id":"evt_1","object":"event","pending_webhooks":1,"data":{"object":{"id":"pi_1"}}}"#;
        let changed = br#"{"id":"evt_1","object":"event","pending_webhooks":1,"data":{"object":{"id":"pi_2"}}}"#;
        assert_ne!(payload_hash(first), payload_hash(retry));
        assert_eq!(content_hash("stripe", first), content_hash("stripe", retry));
        assert_ne!(content_hash("stripe", first), content_hash("stripe", changed));
        // Other providers: the bytes are the content.
        assert_eq!(content_hash("github", first), payload_hash(first));
        assert_ne!(content_hash("github", first), content_hash("github", retry));
    }

    const FIXTURES: [&[u8]; 4] = [
        include_bytes!("../../testdata/providers/stripe/events/charge.refunded.json"),
        include_bytes!("../../testdata/providers/stripe/events/customer.subscription.updated.json"),
        include_bytes!("../../testdata/providers/stripe/events/openapi-fixtures3-selected-resources.json"),
        include_bytes!("../../testdata/providers/stripe/events/payment_intent.succeeded.json"),
    ];

    fn stripe(body: &str) -> String {
        content_hash("stripe", body.as_bytes())
    }

    #[test]
    fn stripe_content_hash_ignores_only_the_values_of_top_level_pending_webhooks() {
        let base = r#"{"id":"evt_1", "pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#;
        let h = stripe(base);
        assert!(h.starts_with("c2:") && h.len() == 3 + 64, "{h}");
        let same = [
            r#"{"id":"evt_1", "pending_webhooks": 1, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1", "pending_webhooks": 12345, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1", "pending_webhooks": null, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1", "pending_webhooks": {"a":[1]}, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
        ];
        for body in same {
            assert_eq!(stripe(body), h, "{body}");
        }
        let different = [
            // The nested member is part of the event.
            r#"{"id":"evt_1", "pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":2}}}"#,
            // Whitespace, order, escapes and presence all count.
            r#"{"id":"evt_1", "pending_webhooks":2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1","pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"pending_webhooks": 2, "id":"evt_1", "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt\u005f1", "pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_1", "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            r#"{"id":"evt_2", "pending_webhooks": 2, "data":{"object":{"id":"pi_1","pending_webhooks":1}}}"#,
            // Masked, but a literal 0 is not the same as the member's absence of a mask.
            r#"{"id":"evt_1", "pending_webhooks": 0, "data":{"object":{"id":"pi_1","pending_webhooks":1}}, "x":0}"#,
        ];
        for body in different {
            assert_ne!(stripe(body), h, "{body}");
        }
    }

    #[test]
    fn every_top_level_pending_webhooks_is_masked_including_duplicates_and_escaped_names() {
        let a = r#"{"pending_webhooks":1,"id":"e","pending\u005fwebhooks":2,"pending_webhooks":3}"#;
        let b = r#"{"pending_webhooks":9,"id":"e","pending\u005fwebhooks":8,"pending_webhooks":7}"#;
        assert_eq!(stripe(a), stripe(b));
        // The bytes around each masked value still count.
        let c = r#"{"pending_webhooks":1,"id":"f","pending\u005fwebhooks":2,"pending_webhooks":3}"#;
        assert_ne!(stripe(a), stripe(c));
        // A masked event is the body with each value replaced by 0.
        let masked = r#"{"pending_webhooks":0,"id":"e","pending\u005fwebhooks":0,"pending_webhooks":0}"#;
        assert_eq!(stripe(a), format!("c2:{}", payload_hash(masked.as_bytes())));
    }

    #[test]
    fn bodies_that_are_not_json_objects_and_other_providers_hash_the_bytes() {
        for body in [&b"not json"[..], b"[1,2]", b"\"pending_webhooks\"", b"{\"a\":1", b"{\"a\":\"\xff\"}", b""] {
            assert_eq!(content_hash("stripe", body), payload_hash(body));
        }
        let event = FIXTURES[1];
        for provider in ["github", "standard_webhooks", "hmac", "sns"] {
            assert_eq!(content_hash(provider, event), payload_hash(event));
            assert_eq!(delivery_hashes(event, &Content::Bytes), (payload_hash(event), payload_hash(event)));
        }
    }

    #[test]
    fn hashes_computed_together_equal_the_separate_hashes() {
        let mut masked = 0;
        for body in FIXTURES {
            let content = stripe::content(body).expect("fixtures are JSON objects");
            if matches!(&content, Content::StripeEvent { pending_webhooks } if !pending_webhooks.is_empty()) {
                masked += 1;
            }
            let (payload, content_h) = delivery_hashes(body, &content);
            assert_eq!(payload, payload_hash(body));
            assert_eq!(content_h, content_hash("stripe", body));
            // Ranges that do not belong to this body are found again.
            let past_the_end = body.len() - 1..body.len() + 5;
            let stale = Content::StripeEvent { pending_webhooks: Vec::from([past_the_end]) };
            assert_eq!(delivery_hashes(body, &stale), (payload.clone(), content_h.clone()));
            let unordered = Content::StripeEvent { pending_webhooks: vec![10..12, 2..4] };
            assert_eq!(delivery_hashes(body, &unordered), (payload, content_h));
        }
        assert_eq!(masked, 3, "the three events have a top-level pending_webhooks");
        let no_member = br#"{"id":"evt_1"}"#;
        let content = stripe::content(no_member).unwrap();
        assert_eq!(delivery_hashes(no_member, &content).1, format!("c2:{}", payload_hash(no_member)));
    }

    #[test]
    fn records_with_the_earlier_content_hash_still_recognise_a_retry() {
        let first = br#"{"id":"evt_1","object":"event","pending_webhooks":2,"data":{"object":{"id":"pi_1"}}}"#;
        let retry = br#"{"id":"evt_1","object":"event","pending_webhooks":1,"data":{"object":{"id":"pi_1"}}}"#;
        let changed = br#"{"id":"evt_1","object":"event","pending_webhooks":1,"data":{"object":{"id":"pi_2"}}}"#;
        // What the previous release stored for `first` (SHA-256 of
        // {"data":{"object":{"id":"pi_1"}},"id":"evt_1","object":"event"}).
        let stored = "c:28d3a07fa10a706a84a50ce920adac0fd7e7c17a8c3aec78a5a6ea3d6601c876";
        assert_eq!(legacy_stripe_content_hash(first).as_deref(), Some(stored));
        assert!(same_content(stored, &content_hash("stripe", retry), "stripe", retry));
        assert!(!same_content(stored, &content_hash("stripe", changed), "stripe", changed));
        // Current hashes compare as they are.
        let now = content_hash("stripe", first);
        assert!(same_content(&now, &content_hash("stripe", retry), "stripe", retry));
        assert!(!same_content(&now, &content_hash("stripe", changed), "stripe", changed));
        // Other providers never had `c:` hashes.
        assert!(!same_content(stored, &payload_hash(retry), "github", retry));
        assert!(same_content(&payload_hash(retry), &payload_hash(retry), "github", retry));
    }
}
