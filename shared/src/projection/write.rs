//! One conditional write of a projection, as data: which item, what to do
//! to it, and the condition that makes repeating it safe. The adapters turn
//! a `Write` into their store's request (a DynamoDB transaction item; the
//! memory world evaluates the same expressions), so a projection never
//! names a storage SDK and its writes can be checked in a unit test.

use std::collections::HashMap;

use super::STATE_SK;
use crate::item::{Item, Value};

/// What a write does to its item.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Replaces the whole item with these attributes (its keys are added).
    Put(Item),
    /// Applies a DynamoDB update expression (`SET …`, `ADD …`).
    Update(String),
    /// Writes nothing: the condition alone must hold.
    Check,
    /// Removes the item.
    Delete,
}

/// A write to one item (`pk`, `sk`), applied only if `condition` holds.
/// `names` and `values` are the expression's `#name` and `:value`
/// placeholders, as in DynamoDB.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub pk: String,
    pub sk: String,
    pub action: Action,
    pub condition: Option<String>,
    pub names: HashMap<String, String>,
    pub values: HashMap<String, Value>,
}

impl Write {
    fn on(pk: &str, action: Action) -> Self {
        Self {
            pk: pk.to_owned(),
            sk: STATE_SK.to_owned(),
            action,
            condition: None,
            names: HashMap::new(),
            values: HashMap::new(),
        }
    }

    /// Puts the state item `pk` with `attrs`.
    pub fn put(pk: &str, attrs: Item) -> Self {
        Self::on(pk, Action::Put(attrs))
    }

    /// Updates the state item `pk` with `expression`.
    pub fn update(pk: &str, expression: impl Into<String>) -> Self {
        Self::on(pk, Action::Update(expression.into()))
    }

    /// Requires `condition` of the state item `pk`, writing nothing.
    pub fn check(pk: &str, condition: impl Into<String>) -> Self {
        Self::on(pk, Action::Check).when(condition)
    }

    /// Deletes the state item `pk`.
    pub fn delete(pk: &str) -> Self {
        Self::on(pk, Action::Delete)
    }

    /// Another item of the same partition (its sort key).
    pub fn at(mut self, sk: impl Into<String>) -> Self {
        self.sk = sk.into();
        self
    }

    /// The condition the write needs.
    pub fn when(mut self, condition: impl Into<String>) -> Self {
        self.condition = Some(condition.into());
        self
    }

    /// An expression name placeholder (`#name`).
    pub fn name(mut self, placeholder: impl Into<String>, name: impl Into<String>) -> Self {
        self.names.insert(placeholder.into(), name.into());
        self
    }

    /// An expression value placeholder (`:value`).
    pub fn value(mut self, placeholder: impl Into<String>, value: Value) -> Self {
        self.values.insert(placeholder.into(), value);
        self
    }

    /// The whole item a put writes: its attributes and its keys.
    pub fn item(&self) -> Option<Item> {
        match &self.action {
            Action::Put(attrs) => {
                let mut item = attrs.clone();
                item.insert("pk".to_owned(), Value::S(self.pk.clone()));
                item.insert("sk".to_owned(), Value::S(self.sk.clone()));
                Some(item)
            }
            _ => None,
        }
    }
}
