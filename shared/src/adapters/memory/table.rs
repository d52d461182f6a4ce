//! The ledger's table in memory: items under `(pk, sk)`, the sparse `due`
//! and `attention` indexes derived from their attributes, conditional
//! writes that return the old item on failure (`ALL_OLD`), transactions
//! all or nothing with DynamoDB's cancellation reasons, and
//! `ClientRequestToken` idempotency for 10 minutes.
//!
//! With index lag on, index queries read a copy of the indexes taken at the
//! last [`Table::settle`] (a GSI is eventually consistent); reads by key
//! are always current.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use super::expr::{self, Bindings, Item};
use crate::adapters::dynamodb::conditions::Update;
use crate::adapters::dynamodb::{ATTENTION_INDEX, DUE_INDEX, attr};

/// How long DynamoDB remembers a transaction's `ClientRequestToken`.
pub const TOKEN_WINDOW_MS: i64 = 10 * 60 * 1000;

pub type Key = (String, String);

/// One write of a transaction (or a single conditional write).
#[derive(Debug, Clone)]
pub enum Write {
    Put { item: Item, condition: Option<String>, names: HashMap<String, String>, values: Item },
    Update { key: Key, expression: String, condition: Option<String>, names: HashMap<String, String>, values: Item },
    Check { key: Key, condition: String, names: HashMap<String, String>, values: Item },
    Delete { key: Key, condition: Option<String>, names: HashMap<String, String>, values: Item },
}

/// Why a write or a transaction item was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Its condition failed; the item it met (`None`: no item).
    Condition(Option<Item>),
    /// The request itself is invalid (DynamoDB's `ValidationException`).
    Invalid(String),
    /// Another transaction holds the item (`TransactionConflict`).
    Conflict,
}

impl Refusal {
    /// A cancelled transaction's reasons as DynamoDB's cancellation codes
    /// (`None` for an item that passed).
    pub fn codes(reasons: &[Option<Refusal>]) -> Vec<&'static str> {
        reasons
            .iter()
            .map(|r| match r {
                None => "None",
                Some(Refusal::Conflict) => "TransactionConflict",
                Some(_) => "ConditionalCheckFailed",
            })
            .collect()
    }
}

fn key_of(item: &Item) -> Option<Key> {
    let get = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
    Some((get(attr::PK)?, get(attr::SK)?))
}

fn item_key(key: &Key) -> Item {
    Item::from([
        (attr::PK.to_owned(), AttributeValue::S(key.0.clone())),
        (attr::SK.to_owned(), AttributeValue::S(key.1.clone())),
    ])
}

impl Write {
    /// A conditions.rs update on `(pk, sk)`.
    pub fn update(pk: &str, sk: &str, u: &Update) -> Self {
        Write::Update {
            key: (pk.to_owned(), sk.to_owned()),
            expression: u.expression(),
            condition: Some(u.condition.clone()).filter(|c| !c.is_empty()),
            names: u.names().into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
            values: u.values().iter().cloned().collect(),
        }
    }

    /// A put, conditional when `condition` is given.
    pub fn put(item: Item, condition: Option<&str>) -> Self {
        Write::Put { item, condition: condition.map(str::to_owned), names: HashMap::new(), values: Item::new() }
    }

    /// The SDK's transaction item, as DynamoDB would read it.
    pub fn from_sdk(w: &TransactWriteItem) -> Result<Self, String> {
        let key = |k: Option<&HashMap<String, AttributeValue>>| {
            k.and_then(key_of).ok_or_else(|| "transaction item without pk and sk".to_owned())
        };
        let names = |n: Option<&HashMap<String, String>>| n.cloned().unwrap_or_default();
        let values = |v: Option<&HashMap<String, AttributeValue>>| v.cloned().unwrap_or_default();
        if let Some(p) = w.put() {
            return Ok(Write::Put {
                item: p.item().clone(),
                condition: p.condition_expression().map(str::to_owned),
                names: names(p.expression_attribute_names()),
                values: values(p.expression_attribute_values()),
            });
        }
        if let Some(u) = w.update() {
            return Ok(Write::Update {
                key: key(Some(u.key()))?,
                expression: u.update_expression().to_owned(),
                condition: u.condition_expression().map(str::to_owned),
                names: names(u.expression_attribute_names()),
                values: values(u.expression_attribute_values()),
            });
        }
        if let Some(c) = w.condition_check() {
            return Ok(Write::Check {
                key: key(Some(c.key()))?,
                condition: c.condition_expression().to_owned(),
                names: names(c.expression_attribute_names()),
                values: values(c.expression_attribute_values()),
            });
        }
        if let Some(d) = w.delete() {
            return Ok(Write::Delete {
                key: key(Some(d.key()))?,
                condition: d.condition_expression().map(str::to_owned),
                names: names(d.expression_attribute_names()),
                values: values(d.expression_attribute_values()),
            });
        }
        Err("an empty transaction item".into())
    }

    fn key(&self) -> Result<Key, String> {
        match self {
            Write::Put { item, .. } => key_of(item).ok_or_else(|| "a put without pk and sk".to_owned()),
            Write::Update { key, .. } | Write::Check { key, .. } | Write::Delete { key, .. } => Ok(key.clone()),
        }
    }

    /// Evaluates the write against `old`: the item after it (`None`: deleted,
    /// or a check), or the refusal.
    fn evaluate(&self, old: Option<&Item>) -> Result<Option<Item>, Refusal> {
        let (condition, names, values) = match self {
            Write::Put { condition, names, values, .. }
            | Write::Update { condition, names, values, .. }
            | Write::Delete { condition, names, values, .. } => (condition.as_deref(), names, values),
            Write::Check { condition, names, values, .. } => (Some(condition.as_str()), names, values),
        };
        let b = Bindings { names, values };
        if let Some(c) = condition {
            match expr::holds(c, old, b) {
                Ok(true) => {}
                Ok(false) => return Err(Refusal::Condition(old.cloned())),
                Err(e) => return Err(Refusal::Invalid(e)),
            }
        }
        match self {
            Write::Put { item, .. } => Ok(Some(item.clone())),
            Write::Update { key, expression, .. } => {
                let base = old.cloned().unwrap_or_else(|| item_key(key));
                expr::apply(expression, &base, b).map(Some).map_err(Refusal::Invalid)
            }
            Write::Check { .. } => Ok(old.cloned()),
            Write::Delete { .. } => Ok(None),
        }
    }
}

/// Why a transaction was cancelled: one reason per item, `None` for the
/// items that were fine (DynamoDB's `CancellationReasons`).
pub type Cancelled = Vec<Option<Refusal>>;

#[derive(Debug, Default)]
pub struct Table {
    items: BTreeMap<Key, Item>,
    /// `ClientRequestToken` → (first use, the request it named).
    tokens: HashMap<String, (i64, String)>,
    /// The indexes' copy of the items while index lag is on.
    lagging: Option<BTreeMap<Key, Item>>,
    /// Transactions still to cancel for contention.
    contend: u32,
    /// Tokens ignored (as by the emulator).
    ignore_tokens: bool,
    /// Items written by requests (puts, updates and deletes that applied;
    /// not arrangements, not refused or cancelled writes).
    writes: u64,
}

impl Table {
    pub fn get(&self, pk: &str, sk: &str) -> Option<&Item> {
        self.items.get(&(pk.to_owned(), sk.to_owned()))
    }

    /// Every item of a partition, by sort key.
    pub fn partition(&self, pk: &str) -> Vec<&Item> {
        self.items.range((pk.to_owned(), String::new())..).take_while(|((p, _), _)| p == pk).map(|(_, i)| i).collect()
    }

    pub fn items(&self) -> impl Iterator<Item = &Item> {
        self.items.values()
    }

    /// Writes an item as it is, with no condition (a test's arrangement).
    pub fn insert(&mut self, item: Item) {
        if let Some(k) = key_of(&item) {
            self.items.insert(k, item);
        }
    }

    pub fn remove(&mut self, pk: &str, sk: &str) -> Option<Item> {
        self.items.remove(&(pk.to_owned(), sk.to_owned()))
    }

    /// One write: the item after it, or the refusal (with `ALL_OLD`).
    pub fn write(&mut self, w: &Write) -> Result<Option<Item>, Refusal> {
        let key = w.key().map_err(Refusal::Invalid)?;
        let new = w.evaluate(self.items.get(&key))?;
        match (&w, new.clone()) {
            (Write::Check { .. }, _) => {}
            (_, Some(item)) => {
                self.writes += 1;
                self.items.insert(key, item);
            }
            (_, None) => {
                self.writes += 1;
                self.items.remove(&key);
            }
        }
        Ok(new)
    }

    /// All or nothing. A token seen in the last 10 minutes with the same
    /// request succeeds again without writing; with another request it is
    /// refused, as DynamoDB's `IdempotentParameterMismatchException`.
    pub fn transact(&mut self, writes: &[Write], token: Option<&str>, now_ms: i64) -> Result<(), TransactError> {
        let token = token.filter(|_| !self.ignore_tokens);
        if self.contend > 0 {
            self.contend -= 1;
            return Err(TransactError::Cancelled(writes.iter().map(|_| Some(Refusal::Conflict)).collect()));
        }
        self.tokens.retain(|_, (at, _)| now_ms - *at < TOKEN_WINDOW_MS);
        let fingerprint = fingerprint(writes);
        if let Some(t) = token
            && let Some((_, seen)) = self.tokens.get(t)
        {
            return if *seen == fingerprint { Ok(()) } else { Err(TransactError::TokenReused) };
        }
        let mut keys = Vec::new();
        for w in writes {
            let k = w.key().map_err(TransactError::Invalid)?;
            if keys.contains(&k) {
                return Err(TransactError::Invalid("two operations on one item in a transaction".into()));
            }
            keys.push(k);
        }
        let mut results = Vec::new();
        let mut reasons: Cancelled = Vec::new();
        for (w, k) in writes.iter().zip(&keys) {
            match w.evaluate(self.items.get(k)) {
                Ok(new) => {
                    results.push(new);
                    reasons.push(None);
                }
                Err(Refusal::Invalid(e)) => return Err(TransactError::Invalid(e)),
                Err(r) => {
                    results.push(None);
                    reasons.push(Some(r));
                }
            }
        }
        if reasons.iter().any(Option::is_some) {
            return Err(TransactError::Cancelled(reasons));
        }
        for ((w, k), new) in writes.iter().zip(keys).zip(results) {
            match (w, new) {
                (Write::Check { .. }, _) => {}
                (_, Some(item)) => {
                    self.writes += 1;
                    self.items.insert(k, item);
                }
                (_, None) => {
                    self.writes += 1;
                    self.items.remove(&k);
                }
            }
        }
        if let Some(t) = token {
            self.tokens.insert(t.to_owned(), (now_ms, fingerprint));
        }
        Ok(())
    }

    /// Items written by requests so far.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    pub fn contend(&mut self, n: u32) {
        self.contend = n;
    }

    pub fn ignore_tokens(&mut self) {
        self.ignore_tokens = true;
    }

    /// Turns index lag on (`true`: queries see the indexes as of now, until
    /// the next [`Table::settle`]) or off.
    pub fn set_index_lag(&mut self, on: bool) {
        self.lagging = on.then(|| self.items.clone());
    }

    /// The indexes catch up with the table.
    pub fn settle(&mut self) {
        if self.lagging.is_some() {
            self.lagging = Some(self.items.clone());
        }
    }

    /// The items of one index partition, by its range key (then table key),
    /// at most `up_to` on the range key. `index`: [`DUE_INDEX`] or
    /// [`ATTENTION_INDEX`].
    pub fn index(&self, index: &str, partition: &str, up_to: Option<i64>) -> Vec<(i64, Key, Item)> {
        let (hash, range) = match index {
            DUE_INDEX => (attr::DUE_SHARD, attr::DUE_AT),
            ATTENTION_INDEX => (attr::ATTN_SHARD, attr::ATTN_AT),
            other => panic!("no index {other}"),
        };
        let source = self.lagging.as_ref().unwrap_or(&self.items);
        let mut out: Vec<(i64, Key, Item)> = source
            .iter()
            .filter(|(_, i)| i.get(hash).and_then(|v| v.as_s().ok()).is_some_and(|p| p == partition))
            .filter_map(|(k, i)| {
                let at = i.get(range).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok())?;
                Some((at, k.clone(), i.clone()))
            })
            .filter(|(at, _, _)| up_to.is_none_or(|u| *at <= u))
            .collect();
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        out
    }
}

/// The request a token names, independent of map order.
fn fingerprint(writes: &[Write]) -> String {
    fn sorted<V: std::fmt::Debug>(m: &HashMap<String, V>) -> String {
        format!("{:?}", m.iter().collect::<BTreeMap<_, _>>())
    }
    writes
        .iter()
        .map(|w| match w {
            Write::Put { item, condition, names, values } => {
                format!("put {} {condition:?} {} {}", sorted(item), sorted(names), sorted(values))
            }
            Write::Update { key, expression, condition, names, values } => {
                format!("update {key:?} {expression} {condition:?} {} {}", sorted(names), sorted(values))
            }
            Write::Check { key, condition, names, values } => {
                format!("check {key:?} {condition} {} {}", sorted(names), sorted(values))
            }
            Write::Delete { key, condition, names, values } => {
                format!("delete {key:?} {condition:?} {} {}", sorted(names), sorted(values))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why a transaction did not commit.
#[derive(Debug, Clone, PartialEq)]
pub enum TransactError {
    Cancelled(Cancelled),
    Invalid(String),
    TokenReused,
}
