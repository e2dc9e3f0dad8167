//! The JSON values of the dumps (numbers, nulls, non-finite markers; per-token arrays given
//! as themselves or as a batch of one), the per-line checks, and what a dump's lines collect.

use crate::error::{Error, Result};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// A JSON number, `null`, or a non-finite marker string (`NaN`, `Infinity`, `-Infinity`; bare
/// literals are quoted before parsing). `null` is `None`.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Num(pub(super) Option<f64>);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number, null or a boolean")
            }
            fn visit_f64<E>(self, x: f64) -> std::result::Result<Num, E> {
                Ok(Num(Some(x)))
            }
            fn visit_i64<E>(self, x: i64) -> std::result::Result<Num, E> {
                Ok(Num(Some(x as f64)))
            }
            fn visit_u64<E>(self, x: u64) -> std::result::Result<Num, E> {
                Ok(Num(Some(x as f64)))
            }
            fn visit_bool<E>(self, x: bool) -> std::result::Result<Num, E> {
                Ok(Num(Some(x as u8 as f64)))
            }
            fn visit_unit<E>(self) -> std::result::Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_none<E>(self) -> std::result::Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<Num, E> {
                crate::lenient_json::non_finite(s)
                    .map(|x| Num(Some(x)))
                    .ok_or_else(|| E::custom(format!("the string {s:?} where a number belongs")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A per-token array: `[…]`, or NeMo-RL's batch of one `[[…]]`.
#[derive(Debug, Default)]
pub(super) struct Row(pub(super) Vec<Num>);

impl<'de> Deserialize<'de> for Row {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Row;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of numbers (or a batch of one such array)")
            }
            fn visit_unit<E>(self) -> std::result::Result<Row, E> {
                Ok(Row(Vec::new()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> std::result::Result<Row, A::Error> {
                let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0));
                let mut rows = 0usize;
                // the first element says which: a number, or a nested row
                match a.next_element::<NumOrRow>()? {
                    None => return Ok(Row(out)),
                    Some(NumOrRow::N(x)) => out.push(x),
                    Some(NumOrRow::R(r)) => {
                        out = r;
                        rows = 1;
                    }
                }
                if rows == 0 {
                    while let Some(x) = a.next_element::<Num>()? {
                        out.push(x);
                    }
                } else {
                    while a.next_element::<de::IgnoredAny>()?.is_some() {
                        rows += 1;
                    }
                    if rows > 1 {
                        return Err(de::Error::custom(format!(
                            "holds {rows} rows where one sample's row belongs (a batch of one)"
                        )));
                    }
                }
                Ok(Row(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// An element of a [`Row`]'s outer array.
pub(super) enum NumOrRow {
    N(Num),
    R(Vec<Num>),
}

impl<'de> Deserialize<'de> for NumOrRow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NumOrRow;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number or an array of numbers")
            }
            fn visit_f64<E>(self, x: f64) -> std::result::Result<NumOrRow, E> {
                Ok(NumOrRow::N(Num(Some(x))))
            }
            fn visit_i64<E>(self, x: i64) -> std::result::Result<NumOrRow, E> {
                Ok(NumOrRow::N(Num(Some(x as f64))))
            }
            fn visit_u64<E>(self, x: u64) -> std::result::Result<NumOrRow, E> {
                Ok(NumOrRow::N(Num(Some(x as f64))))
            }
            fn visit_bool<E>(self, x: bool) -> std::result::Result<NumOrRow, E> {
                Ok(NumOrRow::N(Num(Some(x as u8 as f64))))
            }
            fn visit_unit<E>(self) -> std::result::Result<NumOrRow, E> {
                Ok(NumOrRow::N(Num(None)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<NumOrRow, E> {
                Num::deserialize(de::value::StrDeserializer::<E>::new(s)).map(NumOrRow::N)
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<NumOrRow, A::Error> {
                let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0));
                while let Some(x) = a.next_element::<Num>()? {
                    out.push(x);
                }
                Ok(NumOrRow::R(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A scalar given as itself or as a batch of one (`[x]`).
#[derive(Debug, Default)]
pub(super) struct Scalar(pub(super) Option<f64>);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let r = Row::deserialize(d)?;
        Ok(Scalar(r.0.first().and_then(|n| n.0)))
    }
}

/// One sequence's valid span, as read.
pub(super) struct Seq {
    pub(super) rollout: Vec<f64>,
    pub(super) trainer: Vec<f64>,
    pub(super) adv: Vec<f64>,
    pub(super) ids: Vec<f64>,
    pub(super) mask: Vec<bool>,
}

/// What a dump gave, before the batch's layout rules.
pub(super) struct Collected {
    pub(super) seqs: Vec<Seq>,
    pub(super) step: Option<i64>,
    /// Records without a valid token (left out).
    pub(super) empty: usize,
    pub(super) has_adv: bool,
    pub(super) has_ids: bool,
    pub(super) bytes: u64,
}

pub(super) fn parse_record<'a, T: Deserialize<'a>>(
    line: &'a str,
    at: &str,
    what: &str,
) -> Result<T> {
    let mut de = serde_json::Deserializer::from_str(line);
    let r = T::deserialize(&mut de).and_then(|v| de.end().map(|_| v));
    r.map_err(|e| {
        let why = if e.is_eof() {
            "a partial line (the JSON object is cut off; the writer may still be writing it)"
                .to_string()
        } else if e.is_syntax() {
            format!("not valid JSON ({e})")
        } else {
            format!("not a {what} record ({e})")
        };
        Error::file(at, why)
    })
}

/// Values of a per-token field over `span`, every valid token's required finite or at least
/// present: a `null` there is an error naming the field and token.
pub(super) fn field(
    row: &Row,
    name: &str,
    at: &str,
    valid: &[bool],
    span: std::ops::Range<usize>,
    null_note: &str,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(span.len());
    for t in span {
        match row.0[t].0 {
            Some(x) => out.push(x),
            None if valid[t] => {
                return Err(Error::file(
                    at,
                    format!("`{name}` is null at token {t}, a valid (loss-mask) token{null_note}"),
                ))
            }
            None => out.push(f64::NAN),
        }
    }
    Ok(out)
}

/// The span from the first to the last valid token.
pub(super) fn span(valid: &[bool]) -> Option<std::ops::Range<usize>> {
    let a = valid.iter().position(|&v| v)?;
    let b = valid.iter().rposition(|&v| v)?;
    Some(a..b + 1)
}

pub(super) fn check_len(at: &str, n: usize, fields: &[(&str, &Row, bool)]) -> Result<()> {
    for (name, row, required) in fields {
        if (*required || !row.0.is_empty()) && row.0.len() != n {
            return Err(Error::file(
                at,
                format!(
                    "`{name}` holds {} values where `{}` holds {n}: per-token arrays must be \
                     aligned",
                    row.0.len(),
                    fields[0].0
                ),
            ));
        }
    }
    Ok(())
}
