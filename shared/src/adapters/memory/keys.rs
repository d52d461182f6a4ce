//! The key store in memory: the key table's items as
//! `adapters::dynamodb::keys` writes them, in a table of their own (the
//! contract suite runs the same scenarios on both).

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::World;
use crate::adapters::dynamodb::keys::key_state;
use crate::identity::EventKey;
use crate::ports::{PayloadKeys, PortFuture};
use crate::sealing::{DataKey, KeyState};

/// The key store's view of the world.
#[derive(Clone)]
pub struct MemKeys(pub World);

fn item(pk: String, sk: &str, expires_at: i64) -> super::expr::Item {
    std::collections::HashMap::from([
        ("pk".to_owned(), AttributeValue::S(pk)),
        ("sk".to_owned(), AttributeValue::S(sk.to_owned())),
        ("expires_at".to_owned(), AttributeValue::N(expires_at.to_string())),
    ])
}

fn key_pk(event: &EventKey) -> String {
    format!("key#{}", event.as_str())
}

impl PayloadKeys for MemKeys {
    fn key_for<'a>(&'a self, event: &'a EventKey, fresh: &'a DataKey, expires_at: i64) -> PortFuture<'a, KeyState> {
        Box::pin(async move {
            self.0.call_on("keys.key_for", event.as_str(), |_, st| {
                if let Some(met) = st.keys.get(&key_pk(event), "k") {
                    return Ok(key_state(Some(met)));
                }
                let mut it = item(key_pk(event), "k", expires_at);
                it.insert("dk".into(), AttributeValue::B(Blob::new(fresh.bytes().to_vec())));
                st.keys.insert(it);
                Ok(KeyState::Live(fresh.clone()))
            })
        })
    }

    fn key_of<'a>(&'a self, event: &'a EventKey) -> PortFuture<'a, KeyState> {
        Box::pin(async move {
            self.0.call_on("keys.key_of", event.as_str(), |_, st| Ok(key_state(st.keys.get(&key_pk(event), "k"))))
        })
    }

    fn destroy<'a>(&'a self, event: &'a EventKey, by: &'a str, at_ms: i64, expires_at: i64) -> PortFuture<'a, ()> {
        Box::pin(async move {
            self.0.call_on("keys.destroy", event.as_str(), |_, st| {
                if matches!(key_state(st.keys.get(&key_pk(event), "k")), KeyState::Erased { .. }) {
                    return Ok(());
                }
                let mut it = item(key_pk(event), "k", expires_at);
                it.insert("erased_at".into(), AttributeValue::N(at_ms.to_string()));
                it.insert("erased_by".into(), AttributeValue::S(by.to_owned()));
                st.keys.insert(it);
                Ok(())
            })
        })
    }

    fn index_subject<'a>(&'a self, subject: &'a str, event: &'a EventKey, expires_at: i64) -> PortFuture<'a, ()> {
        Box::pin(async move {
            self.0.call_on("keys.index_subject", event.as_str(), |_, st| {
                st.keys.insert(item(format!("subj#{subject}"), event.as_str(), expires_at));
                Ok(())
            })
        })
    }

    fn subject_events<'a>(&'a self, subject: &'a str) -> PortFuture<'a, Vec<EventKey>> {
        Box::pin(async move {
            self.0.call("keys.subject_events", |_, st| {
                let mut out: Vec<EventKey> = st
                    .keys
                    .partition(&format!("subj#{subject}"))
                    .into_iter()
                    .filter_map(|i| i.get("sk").and_then(|v| v.as_s().ok()))
                    .filter_map(|sk| EventKey::from_stored(sk))
                    .collect();
                out.sort_by(|a, b| a.as_str().cmp(b.as_str()));
                Ok(out)
            })
        })
    }

    fn forget_subject<'a>(&'a self, subject: &'a str, event: &'a EventKey) -> PortFuture<'a, ()> {
        Box::pin(async move {
            self.0.call_on("keys.forget_subject", event.as_str(), |_, st| {
                st.keys.remove(&format!("subj#{subject}"), event.as_str());
                Ok(())
            })
        })
    }
}
