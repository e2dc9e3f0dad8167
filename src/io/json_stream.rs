//! JSON batches read in two streaming passes, without building a JSON tree: the first lists
//! the top-level keys that hold arrays (and a numeric `step`), the second flattens the wanted
//! tensors straight into f64 buffers. Memory is the text plus 8 bytes per number read, however
//! the file is shaped (a tree of `serde_json::Value`s costs 15–30× the text).

use crate::error::{Error, Result};
use crate::lenient_json;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

/// A tensor read from a file: shape plus values widened to f64 (ids are exact up to 2^53).
#[derive(Clone, Debug)]
pub(super) struct Dense {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
    /// Flat indices that held JSON `null` (their value is NaN).
    pub nulls: Vec<usize>,
}

/// `text` as the two passes read it: Python's bare non-finite literals quoted, numbers beyond
/// f64's range as quoted infinities ([`lenient_json::quote_non_finite`]; done once per file).
pub(super) fn prepare(text: &str) -> std::borrow::Cow<'_, str> {
    lenient_json::quote_non_finite(text)
}

/// The top-level keys holding arrays (sorted) and the numeric `step`, if any, of a
/// [`prepare`]d text.
pub(super) fn scan(text: &str) -> Result<(Vec<String>, Option<f64>)> {
    if !text.trim_start().starts_with('{') {
        // Still a JSON error first when the text is not JSON at all.
        serde_json::from_str::<IgnoredAny>(text).map_err(not_json)?;
        return Err(Error::file(
            "<json>",
            "the top level must be an object of tensors",
        ));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let (mut keys, step) = de::Deserializer::deserialize_any(&mut de, Scan).map_err(not_json)?;
    de.end().map_err(not_json)?;
    keys.sort();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        // Python's `json` would silently keep the last value: never guess which was meant
        return Err(Error::input(
            &w[0],
            "appears twice in the JSON object; keep one (a JSON reader would silently keep \
             the last)",
        ));
    }
    Ok((keys, step))
}

/// Flattens the arrays under `wanted` (file key → tensor name) of a [`prepare`]d text into
/// dense tensors.
pub(super) fn flatten(
    text: &str,
    wanted: &BTreeMap<String, String>,
) -> Result<Vec<(String, Dense)>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let failure = RefCell::new(None);
    let r = de::Deserializer::deserialize_map(
        &mut de,
        Tensors {
            wanted,
            failure: &failure,
        },
    );
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    let out = r.map_err(not_json)?;
    de.end().map_err(not_json)?;
    Ok(out)
}

fn not_json(e: serde_json::Error) -> Error {
    Error::file("<json>", format!("not valid JSON: {e}"))
}

struct Scan;

impl<'de> Visitor<'de> for Scan {
    type Value = (Vec<String>, Option<f64>);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of tensors")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut keys, mut step) = (Vec::new(), None);
        while let Some(k) = map.next_key::<String>()? {
            match map.next_value_seed(Kind)? {
                Found::Array => keys.push(k),
                Found::Number(x) if k == "step" => step = Some(x),
                _ => {}
            }
        }
        Ok((keys, step))
    }
}

enum Found {
    Array,
    Number(f64),
    Other,
}

/// What a value is, skipping its contents.
struct Kind;

impl<'de> DeserializeSeed<'de> for Kind {
    type Value = Found;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Kind {
    type Value = Found;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Found::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Found::Other)
    }
    fn visit_f64<E>(self, v: f64) -> Result<Found, E> {
        Ok(Found::Number(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Found, E> {
        Ok(Found::Number(v as f64))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Found, E> {
        Ok(Found::Number(v as f64))
    }
    fn visit_str<E>(self, _: &str) -> Result<Found, E> {
        Ok(Found::Other)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Found, E> {
        Ok(Found::Other)
    }
    fn visit_unit<E>(self) -> Result<Found, E> {
        Ok(Found::Other)
    }
}

struct Tensors<'a> {
    wanted: &'a BTreeMap<String, String>,
    failure: &'a RefCell<Option<Error>>,
}

impl<'de> Visitor<'de> for Tensors<'_> {
    type Value = Vec<(String, Dense)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of tensors")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out: Vec<(String, Dense)> = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            let Some(name) = self.wanted.get(&k) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let mut st = Shape::default();
            let mut d = Dense {
                shape: Vec::new(),
                data: Vec::new(),
                nulls: Vec::new(),
            };
            let mut labels = Labels::default();
            map.next_value_seed(Flat {
                name,
                depth: 0,
                st: &mut st,
                out: &mut d,
                labels: &mut labels,
                failure: self.failure,
            })?;
            d.shape = st.finish();
            let count = d.shape.iter().try_fold(1usize, |p, &n| p.checked_mul(n));
            if st.leaf.is_some_and(|l| l != d.shape.len()) || count != Some(d.data.len()) {
                *self.failure.borrow_mut() = Some(Error::input(
                    name,
                    format!(
                        "is ragged: arrays of different depths (shape {:?})",
                        d.shape
                    ),
                ));
                return Err(de::Error::custom("invalid tensor"));
            }
            // A repeated key: the last one wins, as in a JSON object.
            out.retain(|(n, _)| n != name);
            out.push((name.clone(), d));
        }
        Ok(out)
    }
}

/// The shape seen so far: every array length per depth, and the depth of the numbers.
#[derive(Default)]
struct Shape {
    lens: Vec<Option<usize>>,
    leaf: Option<usize>,
}

impl Shape {
    fn finish(&self) -> Vec<usize> {
        self.lens.iter().map_while(|l| *l).collect()
    }
}

/// Group labels: verl's `uid` holds strings (one UUID per prompt). Each string becomes the
/// group id [`label_id`], the same on every rank of a data-parallel job and in the Python
/// package. A `uid` holds labels or numbers, not both.
#[derive(Default)]
struct Labels {
    strings: bool,
    numbers: bool,
}

/// The group id of a string label: FNV-1a (64 bits) of its UTF-8 bytes, cut to 52 bits so that
/// it is an exact f64 integer (the Python package calls this one too).
///
/// ```
/// assert_eq!(trmask::io::label_id("a"), (0xaf63_dc4c_8601_ec8cu64 & ((1 << 52) - 1)) as f64);
/// ```
pub fn label_id(s: &str) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in s.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h & ((1 << 52) - 1)) as f64
}

struct Flat<'a> {
    name: &'a str,
    depth: usize,
    st: &'a mut Shape,
    out: &'a mut Dense,
    labels: &'a mut Labels,
    failure: &'a RefCell<Option<Error>>,
}

impl Flat<'_> {
    fn fail<E: de::Error>(&self, problem: String) -> E {
        *self.failure.borrow_mut() = Some(Error::input(self.name, problem));
        E::custom("invalid tensor")
    }
    fn ragged<E: de::Error>(&self, what: &str) -> E {
        let shape = self
            .st
            .lens
            .iter()
            .map(|l| l.unwrap_or(0))
            .collect::<Vec<_>>();
        self.fail(format!(
            "is ragged: {what} at depth {} where arrays of shape {shape:?} were expected",
            self.depth
        ))
    }
    fn number<E: de::Error>(self, x: Option<f64>) -> Result<(), E> {
        self.labels.numbers |= x.is_some();
        if self.labels.numbers && self.labels.strings {
            return Err(self.fail("mixes numbers and string labels".into()));
        }
        self.value(x)
    }
    fn label<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.labels.strings = true;
        if self.labels.numbers {
            return Err(self.fail("mixes numbers and string labels".into()));
        }
        self.value(Some(label_id(s)))
    }
    fn value<E: de::Error>(self, x: Option<f64>) -> Result<(), E> {
        match self.st.leaf {
            None => self.st.leaf = Some(self.depth),
            Some(l) if l != self.depth => return Err(self.ragged("a number")),
            _ => {}
        }
        if self.out.data.len() == self.out.data.capacity() {
            let extra = self.out.data.len().max(1024);
            if self.out.data.try_reserve(extra).is_err() {
                return Err(self.fail(format!(
                    "{} values do not fit in memory",
                    self.out.data.len()
                )));
            }
        }
        match x {
            Some(v) => self.out.data.push(v),
            None => {
                self.out.nulls.push(self.out.data.len());
                self.out.data.push(f64::NAN);
            }
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Flat<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flat<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("numbers in nested arrays")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.st.leaf.is_some_and(|l| self.depth >= l) {
            return Err(self.ragged("an array"));
        }
        let mut n = 0usize;
        loop {
            let child = Flat {
                name: self.name,
                depth: self.depth + 1,
                st: &mut *self.st,
                out: &mut *self.out,
                labels: &mut *self.labels,
                failure: self.failure,
            };
            if seq.next_element_seed(child)?.is_none() {
                break;
            }
            n += 1;
        }
        if self.st.lens.len() <= self.depth {
            self.st.lens.resize(self.depth + 1, None);
        }
        match self.st.lens[self.depth] {
            None => self.st.lens[self.depth] = Some(n),
            Some(m) if m != n => {
                return Err(self.fail(format!(
                    "is ragged: an array at depth {} has {n} items, expected {m}",
                    self.depth
                )))
            }
            _ => {}
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(self.fail("expected a number, found an object".into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.number(Some(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.number(Some(v as f64))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.number(Some(v as f64))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        // true / false only in the mask: a boolean log-prob or id is a mistake, not 1 / 0
        if self.name != "response_mask" {
            return Err(self.fail(format!(
                "{v} is not a number (booleans are accepted only in response_mask)"
            )));
        }
        self.number(Some(v as u8 as f64))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.number(None)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        match lenient_json::non_finite(s) {
            Some(v) => self.number(Some(v)),
            None if self.name == "uid" => self.label(s),
            None => Err(self.fail(format!(
                "string {s:?} is not a number (only \"NaN\", \"Infinity\", \"-Infinity\")"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_ids_are_fnv1a_cut_to_52_bits() {
        // FNV-1a 64 of "" is the offset basis; of "a" the published 0xaf63dc4c8601ec8c
        assert_eq!(
            label_id(""),
            (0xcbf2_9ce4_8422_2325u64 & ((1 << 52) - 1)) as f64
        );
        assert_eq!(
            label_id("a"),
            (0xaf63_dc4c_8601_ec8cu64 & ((1 << 52) - 1)) as f64
        );
        assert_ne!(label_id("a"), label_id("b"));
    }

    fn read(text: &str, key: &str) -> Result<Vec<(String, Dense)>> {
        let wanted = BTreeMap::from([(key.to_string(), key.to_string())]);
        flatten(&prepare(text), &wanted)
    }

    #[test]
    fn a_duplicate_key_is_an_error_naming_it() {
        let e =
            scan(r#"{"old_log_prob": [0.0], "rollout_log_prob": [0.0], "old_log_prob": [1.0]}"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("`old_log_prob`") && e.contains("twice"), "{e}");
        assert_eq!(scan(r#"{"a": [1], "b": [2]}"#).unwrap().0, ["a", "b"]);
    }

    #[test]
    fn uid_strings_are_labels_booleans_only_in_the_mask() {
        let t = read(r#"{"uid": ["x", "y", "x"]}"#, "uid").unwrap();
        let d = &t[0].1.data;
        assert_eq!(d[0], d[2]);
        assert_ne!(d[0], d[1]);
        let e = read(r#"{"uid": ["x", 3]}"#, "uid").unwrap_err().to_string();
        assert!(e.contains("`uid`") && e.contains("mixes"), "{e}");
        let m = read(r#"{"response_mask": [[true, false]]}"#, "response_mask").unwrap();
        assert_eq!(m[0].1.data, vec![1.0, 0.0]);
        let e = read(r#"{"old_log_prob": [true]}"#, "old_log_prob")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`old_log_prob`") && e.contains("true is not a number"),
            "{e}"
        );
        let e = read(r#"{"responses": ["x"]}"#, "responses")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`responses`"), "{e}");
    }
}
