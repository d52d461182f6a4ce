//! A stored item as the domain sees it: attribute values without a storage
//! SDK. Projections build their writes from these and read their state as
//! these; the adapters convert them to and from their store's own types
//! (DynamoDB's `AttributeValue`), so nothing above the adapters names one.

use std::collections::HashMap;

/// One attribute's value, with DynamoDB's kinds (numbers are kept as their
/// decimal text, as DynamoDB keeps them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    S(String),
    N(String),
    Bool(bool),
    B(Vec<u8>),
    L(Vec<Value>),
    M(HashMap<String, Value>),
    Ss(Vec<String>),
    Null,
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::S(v) => Some(v),
            _ => None,
        }
    }

    /// A number that is a whole `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::N(v) => v.parse().ok(),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(v) => Some(*v),
            _ => None,
        }
    }
}

/// An item: attribute name → value (its keys included when it was read).
pub type Item = HashMap<String, Value>;

/// A number attribute.
pub fn n(v: i64) -> Value {
    Value::N(v.to_string())
}

/// A string attribute.
pub fn s(v: impl Into<String>) -> Value {
    Value::S(v.into())
}

/// Reads a whole-number attribute of an item.
pub fn get_n(item: &Item, name: &str) -> Option<i64> {
    item.get(name).and_then(Value::as_i64)
}

/// Reads a string attribute of an item.
pub fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_strings_read_back_and_other_kinds_do_not_pass_for_them() {
        let item = Item::from([
            ("seq".to_owned(), n(-7)),
            ("name".to_owned(), s("a")),
            ("ratio".to_owned(), Value::N("1.5".into())),
            ("flag".to_owned(), Value::Bool(true)),
        ]);
        assert_eq!((get_n(&item, "seq"), get_s(&item, "name")), (Some(-7), Some("a")));
        assert_eq!(get_n(&item, "ratio"), None, "not a whole number");
        assert_eq!((get_n(&item, "name"), get_s(&item, "seq"), get_s(&item, "missing")), (None, None, None));
        assert_eq!(item["flag"].as_bool(), Some(true));
    }
}
