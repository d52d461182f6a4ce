//! DynamoDB's condition and update expressions, evaluated on an item in
//! memory: the subset the ledger's writes (`adapters::dynamodb::conditions`)
//! and the projections' transaction items use.
//!
//! Conditions: `attribute_exists(p)`, `attribute_not_exists(p)`,
//! `begins_with(a, b)`, `=`, `<>`, `<`, `<=`, `>`, `>=`, `BETWEEN`, `NOT`,
//! `AND`, `OR` (that precedence) and parentheses; a comparison with a
//! missing attribute is false, as in DynamoDB. Updates: `SET p = v` (`v` a
//! path, a value, `if_not_exists(p, v)`, or `a + b`, `a - b`), `REMOVE p`,
//! `ADD p :n` on numbers and string sets, `DELETE p :set` on string sets;
//! `size(p)` as an operand. Paths are top-level attributes or `#names`.
//! Anything else is an error, so a write this world cannot evaluate fails
//! loudly instead of passing.

use std::cmp::Ordering;
use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

pub type Item = HashMap<String, AttributeValue>;

/// The expression attribute names and values of one request.
#[derive(Debug, Clone, Copy)]
pub struct Bindings<'a> {
    pub names: &'a HashMap<String, String>,
    pub values: &'a HashMap<String, AttributeValue>,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Value(String),
    Name(String),
    Open,
    Close,
    Comma,
    Op(&'static str),
}

fn tokens(text: &str) -> Result<Vec<Tok>, String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let word = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && (b[*i].is_ascii_alphanumeric() || b[*i] == b'_') {
            *i += 1;
        }
        text[start..*i].to_owned()
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' => i += 1,
            b'(' => {
                out.push(Tok::Open);
                i += 1;
            }
            b')' => {
                out.push(Tok::Close);
                i += 1;
            }
            b',' => {
                out.push(Tok::Comma);
                i += 1;
            }
            b'+' | b'-' => {
                out.push(Tok::Op(if c == b'+' { "+" } else { "-" }));
                i += 1;
            }
            b'=' => {
                out.push(Tok::Op("="));
                i += 1;
            }
            b'<' | b'>' => {
                let two = b.get(i + 1).copied();
                let op = match (c, two) {
                    (b'<', Some(b'=')) => "<=",
                    (b'<', Some(b'>')) => "<>",
                    (b'>', Some(b'=')) => ">=",
                    (b'<', _) => "<",
                    _ => ">",
                };
                i += op.len();
                out.push(Tok::Op(op));
            }
            b':' => {
                i += 1;
                out.push(Tok::Value(format!(":{}", word(&mut i))));
            }
            b'#' => {
                i += 1;
                out.push(Tok::Name(format!("#{}", word(&mut i))));
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => out.push(Tok::Word(word(&mut i))),
            other => return Err(format!("unexpected {:?} in {text:?}", other as char)),
        }
    }
    Ok(out)
}

/// A value in an expression: an attribute of the item, or a bound value.
#[derive(Debug, Clone)]
enum Operand {
    Path(String),
    Value(String),
    IfNotExists(String, Box<Operand>),
    /// `size(p)`: a string's length, a set's, list's or map's elements.
    Size(String),
    Sum(Box<Operand>, &'static str, Box<Operand>),
}

struct Parser<'a> {
    toks: Vec<Tok>,
    at: usize,
    text: &'a str,
    b: Bindings<'a>,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str, b: Bindings<'a>) -> Result<Self, String> {
        Ok(Self { toks: tokens(text)?, at: 0, text, b })
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn keyword(&self, k: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(w)) if w.eq_ignore_ascii_case(k))
    }

    fn expect(&mut self, t: &Tok) -> Result<(), String> {
        match self.next() {
            Some(ref got) if got == t => Ok(()),
            got => Err(format!("expected {t:?}, found {got:?} in {:?}", self.text)),
        }
    }

    fn path(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Tok::Word(w)) => Ok(w),
            Some(Tok::Name(n)) => {
                self.b.names.get(&n).cloned().ok_or_else(|| format!("{n} has no name in {:?}", self.text))
            }
            got => Err(format!("expected an attribute, found {got:?} in {:?}", self.text)),
        }
    }

    fn operand(&mut self) -> Result<Operand, String> {
        let first = match self.peek() {
            Some(Tok::Value(v)) => {
                let v = v.clone();
                self.at += 1;
                Operand::Value(v)
            }
            Some(Tok::Word(w)) if w == "if_not_exists" => {
                self.at += 1;
                self.expect(&Tok::Open)?;
                let p = self.path()?;
                self.expect(&Tok::Comma)?;
                let v = self.operand()?;
                self.expect(&Tok::Close)?;
                Operand::IfNotExists(p, Box::new(v))
            }
            Some(Tok::Word(w)) if w == "size" => {
                self.at += 1;
                self.expect(&Tok::Open)?;
                let p = self.path()?;
                self.expect(&Tok::Close)?;
                Operand::Size(p)
            }
            _ => Operand::Path(self.path()?),
        };
        match self.peek() {
            Some(Tok::Op(op @ ("+" | "-"))) => {
                let op = *op;
                self.at += 1;
                let rhs = self.operand()?;
                Ok(Operand::Sum(Box::new(first), op, Box::new(rhs)))
            }
            _ => Ok(first),
        }
    }

    fn value(&self, o: &Operand, item: &Item) -> Result<Option<AttributeValue>, String> {
        Ok(match o {
            Operand::Path(p) => item.get(p).cloned(),
            Operand::Value(v) => {
                Some(self.b.values.get(v).cloned().ok_or_else(|| format!("{v} has no value in {:?}", self.text))?)
            }
            Operand::IfNotExists(p, v) => match item.get(p) {
                Some(x) => Some(x.clone()),
                None => self.value(v, item)?,
            },
            Operand::Size(p) => item.get(p).and_then(|v| {
                let len = match v {
                    AttributeValue::S(s) => s.len(),
                    AttributeValue::Ss(s) => s.len(),
                    AttributeValue::Ns(s) => s.len(),
                    AttributeValue::L(l) => l.len(),
                    AttributeValue::M(m) => m.len(),
                    _ => return None,
                };
                Some(AttributeValue::N(len.to_string()))
            }),
            Operand::Sum(a, op, b) => {
                let (Some(a), Some(b)) = (self.value(a, item)?, self.value(b, item)?) else {
                    return Err(format!("arithmetic on a missing attribute in {:?}", self.text));
                };
                let (a, b) = (number(&a)?, number(&b)?);
                Some(AttributeValue::N((if *op == "+" { a + b } else { a - b }).to_string()))
            }
        })
    }

    // ------------------------------------------------------------ conditions

    fn or(&mut self, item: &Item) -> Result<bool, String> {
        let mut v = self.and(item)?;
        while self.keyword("OR") {
            self.at += 1;
            let r = self.and(item)?;
            v = v || r;
        }
        Ok(v)
    }

    fn and(&mut self, item: &Item) -> Result<bool, String> {
        let mut v = self.not(item)?;
        while self.keyword("AND") {
            self.at += 1;
            let r = self.not(item)?;
            v = v && r;
        }
        Ok(v)
    }

    fn not(&mut self, item: &Item) -> Result<bool, String> {
        if self.keyword("NOT") {
            self.at += 1;
            return Ok(!self.not(item)?);
        }
        self.primary(item)
    }

    fn primary(&mut self, item: &Item) -> Result<bool, String> {
        if self.peek() == Some(&Tok::Open) {
            self.at += 1;
            let v = self.or(item)?;
            self.expect(&Tok::Close)?;
            return Ok(v);
        }
        if let Some(Tok::Word(w)) = self.peek() {
            let f = w.clone();
            if matches!(f.as_str(), "attribute_exists" | "attribute_not_exists" | "begins_with") {
                self.at += 1;
                self.expect(&Tok::Open)?;
                let result = if f == "begins_with" {
                    let a = self.operand()?;
                    self.expect(&Tok::Comma)?;
                    let b = self.operand()?;
                    match (self.value(&a, item)?, self.value(&b, item)?) {
                        (Some(AttributeValue::S(a)), Some(AttributeValue::S(b))) => a.starts_with(&b),
                        _ => false,
                    }
                } else {
                    let exists = item.contains_key(&self.path()?);
                    exists == (f == "attribute_exists")
                };
                self.expect(&Tok::Close)?;
                return Ok(result);
            }
        }
        let a = self.operand()?;
        if self.keyword("BETWEEN") {
            self.at += 1;
            let lo = self.operand()?;
            if !self.keyword("AND") {
                return Err(format!("BETWEEN without AND in {:?}", self.text));
            }
            self.at += 1;
            let hi = self.operand()?;
            let (a, lo, hi) = (self.value(&a, item)?, self.value(&lo, item)?, self.value(&hi, item)?);
            return Ok(match (a, lo, hi) {
                (Some(a), Some(lo), Some(hi)) => {
                    compare(&a, &lo).is_some_and(|o| o != Ordering::Less)
                        && compare(&a, &hi).is_some_and(|o| o != Ordering::Greater)
                }
                _ => false,
            });
        }
        let op = match self.next() {
            Some(Tok::Op(op)) if !matches!(op, "+" | "-") => op,
            got => return Err(format!("expected a comparison, found {got:?} in {:?}", self.text)),
        };
        let b = self.operand()?;
        let (Some(a), Some(b)) = (self.value(&a, item)?, self.value(&b, item)?) else { return Ok(false) };
        let ord = compare(&a, &b);
        Ok(match op {
            "=" => ord == Some(Ordering::Equal),
            "<>" => ord != Some(Ordering::Equal),
            "<" => ord == Some(Ordering::Less),
            "<=" => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
            ">" => ord == Some(Ordering::Greater),
            ">=" => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
            _ => unreachable!("comparison operators only"),
        })
    }

    // --------------------------------------------------------------- updates

    fn update(&mut self, old: &Item) -> Result<Item, String> {
        let mut new = old.clone();
        while let Some(t) = self.next() {
            let Tok::Word(clause) = t else { return Err(format!("expected a clause in {:?}", self.text)) };
            match clause.to_ascii_uppercase().as_str() {
                "SET" => loop {
                    let p = self.path()?;
                    self.expect(&Tok::Op("="))?;
                    let v = self.operand()?;
                    // Every right-hand side reads the item as it was.
                    match self.value(&v, old)? {
                        Some(v) => new.insert(p, v),
                        None => return Err(format!("SET {p} from a missing attribute in {:?}", self.text)),
                    };
                    if !self.comma() {
                        break;
                    }
                },
                "REMOVE" => loop {
                    let p = self.path()?;
                    new.remove(&p);
                    if !self.comma() {
                        break;
                    }
                },
                "ADD" => loop {
                    let p = self.path()?;
                    let v = self.operand()?;
                    let v = self.value(&v, old)?.ok_or_else(|| format!("ADD without a value in {:?}", self.text))?;
                    if let AttributeValue::Ss(add) = &v {
                        // A string set: the union.
                        let mut set = match new.get(&p) {
                            Some(AttributeValue::Ss(cur)) => cur.clone(),
                            Some(other) => return Err(format!("ADD a set to {other:?} in {:?}", self.text)),
                            None => Vec::new(),
                        };
                        for e in add {
                            if !set.contains(e) {
                                set.push(e.clone());
                            }
                        }
                        new.insert(p, AttributeValue::Ss(set));
                    } else {
                        let sum = match new.get(&p) {
                            Some(cur) => number(cur)? + number(&v)?,
                            None => number(&v)?,
                        };
                        new.insert(p, AttributeValue::N(sum.to_string()));
                    }
                    if !self.comma() {
                        break;
                    }
                },
                "DELETE" => loop {
                    // Elements out of a string set; an empty set is no attribute.
                    let p = self.path()?;
                    let v = self.operand()?;
                    let Some(AttributeValue::Ss(gone)) = self.value(&v, old)? else {
                        return Err(format!("DELETE takes a string set in {:?}", self.text));
                    };
                    if let Some(AttributeValue::Ss(cur)) = new.get(&p) {
                        let left: Vec<String> = cur.iter().filter(|e| !gone.contains(e)).cloned().collect();
                        if left.is_empty() {
                            new.remove(&p);
                        } else {
                            new.insert(p, AttributeValue::Ss(left));
                        }
                    }
                    if !self.comma() {
                        break;
                    }
                },
                other => return Err(format!("unknown clause {other} in {:?}", self.text)),
            }
        }
        Ok(new)
    }

    fn comma(&mut self) -> bool {
        if self.peek() == Some(&Tok::Comma) {
            self.at += 1;
            true
        } else {
            false
        }
    }
}

fn number(v: &AttributeValue) -> Result<i128, String> {
    match v {
        AttributeValue::N(n) => n.parse().map_err(|_| format!("{n} is not an integer")),
        other => Err(format!("{other:?} is not a number")),
    }
}

/// DynamoDB's ordering of two values of the same type (`None`: not comparable).
pub fn compare(a: &AttributeValue, b: &AttributeValue) -> Option<Ordering> {
    match (a, b) {
        (AttributeValue::N(x), AttributeValue::N(y)) => {
            let (x, y) = (x.parse::<f64>().ok()?, y.parse::<f64>().ok()?);
            x.partial_cmp(&y)
        }
        (AttributeValue::S(x), AttributeValue::S(y)) => Some(x.cmp(y)),
        (AttributeValue::B(x), AttributeValue::B(y)) => Some(x.as_ref().cmp(y.as_ref())),
        (x, y) if x == y => Some(Ordering::Equal),
        _ => None,
    }
}

/// Whether `condition` holds on `item` (an absent item is the empty item).
pub fn holds(condition: &str, item: Option<&Item>, b: Bindings<'_>) -> Result<bool, String> {
    let empty = Item::new();
    let mut p = Parser::new(condition, b)?;
    let v = p.or(item.unwrap_or(&empty))?;
    if p.at != p.toks.len() {
        return Err(format!("trailing tokens in {condition:?}"));
    }
    Ok(v)
}

/// The item after `expression` (an absent item starts from its key).
pub fn apply(expression: &str, item: &Item, b: Bindings<'_>) -> Result<Item, String> {
    Parser::new(expression, b)?.update(item)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.into())
    }

    fn n(v: i64) -> AttributeValue {
        AttributeValue::N(v.to_string())
    }

    #[test]
    fn conditions_follow_dynamodb() {
        let names = HashMap::from([("#st".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":p".to_owned(), s("PROCESSING")),
            (":now".to_owned(), n(10)),
            (":pre".to_owned(), s("back")),
        ]);
        let b = Bindings { names: &names, values: &values };
        let item = Item::from([
            ("pk".into(), s("k")),
            ("status".into(), s("PROCESSING")),
            ("lease".into(), n(9)),
            ("why".into(), s("backfill_x")),
        ]);
        let yes = |c: &str| holds(c, Some(&item), b).unwrap();
        assert!(yes("attribute_exists(pk) AND (#st = :p AND lease < :now)"));
        assert!(!yes("attribute_not_exists(pk) OR lease >= :now"));
        assert!(yes("NOT attribute_exists(gone) AND begins_with(why, :pre)"));
        assert!(!yes("gone < :now"), "a comparison with a missing attribute is false");
        assert!(yes("lease BETWEEN :now AND :now OR lease <= :now"));
        assert!(yes("attribute_not_exists(pk) OR lease < :now AND #st = :p"), "AND binds tighter than OR");
        assert!(holds("attribute_not_exists(pk)", None, b).unwrap());
        assert!(holds("unknown = :nothing", Some(&item), b).is_err(), "an unbound value is an error");
    }

    #[test]
    fn updates_read_the_old_item_and_add_numbers() {
        let values = HashMap::from([(":one".to_owned(), n(1)), (":zero".to_owned(), n(0)), (":t".to_owned(), s("x"))]);
        let names = HashMap::new();
        let b = Bindings { names: &names, values: &values };
        let item = Item::from([("a".into(), n(5)), ("gone".into(), s("y")), ("r".into(), n(7))]);
        let new =
            apply("SET f = if_not_exists(f, :zero) + :one, t = :t, c = r REMOVE gone ADD a :one, fresh :one", &item, b)
                .unwrap();
        assert_eq!(new.get("f"), Some(&n(1)));
        assert_eq!(new.get("a"), Some(&n(6)));
        assert_eq!(new.get("fresh"), Some(&n(1)));
        assert_eq!(new.get("c"), Some(&n(7)));
        assert_eq!(new.get("t"), Some(&s("x")));
        assert!(!new.contains_key("gone"));
    }

    /// String sets as the flights of a rate limit use them: `ADD` is a
    /// union (the same element twice counts once), `DELETE` a difference
    /// (an emptied set is no attribute), `size` counts the elements.
    #[test]
    fn string_sets_add_delete_and_size() {
        let ss = |v: &[&str]| AttributeValue::Ss(v.iter().map(|s| (*s).to_owned()).collect());
        let values = HashMap::from([
            (":a".to_owned(), ss(&["a"])),
            (":ab".to_owned(), ss(&["a", "b"])),
            (":two".to_owned(), n(2)),
        ]);
        let names = HashMap::new();
        let b = Bindings { names: &names, values: &values };
        let once = apply("ADD f :a", &Item::new(), b).unwrap();
        let twice = apply("ADD f :a", &once, b).unwrap();
        assert_eq!(twice.get("f"), Some(&ss(&["a"])));
        assert!(holds("attribute_not_exists(f) OR size(f) < :two", Some(&twice), b).unwrap());
        let both = apply("ADD f :ab", &twice, b).unwrap();
        assert_eq!(both.get("f"), Some(&ss(&["a", "b"])));
        assert!(!holds("size(f) < :two", Some(&both), b).unwrap());
        let one = apply("DELETE f :a", &both, b).unwrap();
        assert_eq!(one.get("f"), Some(&ss(&["b"])));
        assert!(!apply("DELETE f :ab", &one, b).unwrap().contains_key("f"));
    }
}
