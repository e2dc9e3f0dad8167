//! [`Partial`]: named accumulators, merged key by key and finished into metrics.

use super::acc::Acc;
use crate::error::Result;
use std::collections::BTreeMap;

/// Named accumulators: one shard's (or, merged, the whole batch's) batch-level statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Partial {
    pub(crate) accs: BTreeMap<String, Acc>,
}

impl Partial {
    /// An empty partial (the identity of [`merge`](Self::merge)).
    pub fn new() -> Self {
        Partial::default()
    }
    /// Sets `key` (replacing what it held, as a metric map does).
    pub fn put(&mut self, key: impl Into<String>, acc: Acc) {
        self.accs.insert(key.into(), acc);
    }
    /// The accumulator under `key`.
    pub fn get(&self, key: &str) -> Option<&Acc> {
        self.accs.get(key)
    }
    /// Sets every accumulator of `other` (replacing same-named ones).
    pub fn extend(&mut self, other: Partial) {
        self.accs.extend(other.accs);
    }
    /// The number of accumulators.
    pub fn len(&self) -> usize {
        self.accs.len()
    }
    /// True when it holds no accumulator.
    pub fn is_empty(&self) -> bool {
        self.accs.is_empty()
    }
    /// The accumulators whose keys `other` also holds.
    pub fn restricted_to(&self, other: &Partial) -> Partial {
        let accs = self
            .accs
            .iter()
            .filter(|(k, _)| other.accs.contains_key(*k))
            .map(|(k, a)| (k.clone(), a.clone()))
            .collect();
        Partial { accs }
    }
    /// Merges another shard's partial into this one (a key only one side has is kept as is).
    pub fn merge(&mut self, other: &Partial) -> Result<()> {
        for (k, a) in &other.accs {
            match self.accs.get_mut(k) {
                Some(mine) => mine.merge(a, k)?,
                None => {
                    self.accs.insert(k.clone(), a.clone());
                }
            }
        }
        Ok(())
    }
    /// Every metric (keys starting with `#` and certificate inputs are not metrics).
    pub fn finish(&self) -> Result<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        for (k, a) in self.accs.iter().filter(|(k, _)| !k.starts_with('#')) {
            a.finish(k, &mut out)?;
        }
        Ok(out)
    }
    /// The histograms (keys `#hist/<name>`), by name.
    pub fn histograms(&self) -> BTreeMap<String, super::hist::Hist> {
        self.accs
            .iter()
            .filter_map(|(k, a)| match (k.strip_prefix("#hist/"), a) {
                (Some(name), Acc::Hist(h)) => Some((name.to_string(), h.clone())),
                _ => None,
            })
            .collect()
    }
    /// The value of an internal count (`#`-key), 0 when absent.
    pub fn count(&self, key: &str) -> u64 {
        match self.accs.get(key) {
            Some(Acc::Count(c)) => *c,
            _ => 0,
        }
    }
    /// A single metric finished from its accumulator.
    pub fn finish_one(&self, key: &str) -> Result<Option<f64>> {
        let mut out = BTreeMap::new();
        if let Some(a) = self.accs.get(key) {
            a.finish(key, &mut out)?;
        }
        Ok(out.get(key).copied())
    }
}
