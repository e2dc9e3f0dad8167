//! The vocabulary kernel's tuner: every candidate configuration ([`Context::vocab_variants`])
//! timed on a few hundred rows of device-resident logits generated for the purpose, the
//! fastest kept per key — adapter, driver, both dtypes, a vocabulary bucket and a row bucket —
//! in memory and in a small text file under the user's cache directory, so a later process on
//! the same machine skips the timing. Times come from timestamp queries where the adapter has
//! them ([`Context::last_device_ns`]), else from the wall clock around the blocking run.
//! CPU adapters (lavapipe) are not tuned by default: the default configuration is kept.

use crate::error::{Error, Result};
use crate::gpu::device::context::Context;
use crate::gpu::ops::vocab_divergence::vocab_divergence_with;
use crate::gpu::ops::vocab_variant::VocabVariant;
use crate::input::logits::{DType, Logits};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Rows the tuner times each candidate on (at most; fewer when the batch's bucket is smaller),
/// more on short rows: up to [`TUNE_LOGITS`] logits per tensor.
pub const TUNE_ROWS: u64 = 256;

/// Logits per tensor the tuner's rows may hold when [`TUNE_ROWS`] rows hold fewer (short rows:
/// enough workgroups that several rows per workgroup are timed on a full GPU).
pub const TUNE_LOGITS: u64 = 1 << 24;

/// Runs of each candidate after its warm-up run; the fastest counts.
pub const TUNE_REPEATS: usize = 3;

/// Environment variable naming the tuner's cache file (empty: no file); unset: the user's cache
/// directory (`$XDG_CACHE_HOME/trmask/vocab-kernel.tsv`, else `~/.cache/trmask/…`).
pub const TUNE_CACHE_ENV: &str = "TRMASK_TUNE_CACHE";

/// What the tuner found for one key.
#[derive(Clone, Debug, PartialEq)]
pub struct VocabTuning {
    /// The key: adapter, driver, dtypes and buckets.
    pub key: String,
    /// The fastest configuration.
    pub choice: VocabVariant,
    /// Each candidate with its time in seconds (the fastest of [`TUNE_REPEATS`] runs).
    pub timings: Vec<(VocabVariant, f64)>,
    /// Whether the times came from timestamp queries (else the wall clock).
    pub device_timed: bool,
}

/// The bucket of a vocabulary size: the next power of two.
pub fn vocab_bucket(vocab: u64) -> u64 {
    vocab.max(1).next_power_of_two()
}

/// The bucket of a row count: the next power of two, at most 16,384 (beyond, every GPU is
/// full whatever the configuration).
pub fn row_bucket(rows: u64) -> u64 {
    rows.clamp(1, 16_384).next_power_of_two()
}

/// The tuner's key of a call on `ctx` (one line of text, no tabs).
pub fn tune_key(ctx: &Context, (da, db): (DType, DType), rows: u64, vocab: u64) -> String {
    let caps = ctx.capabilities();
    format!(
        "{}|{}|{}|{}/{}|v{}|r{}",
        caps.adapter_name,
        caps.backend,
        caps.driver,
        da.name(),
        db.name(),
        vocab_bucket(vocab),
        row_bucket(rows)
    )
    .replace(['\t', '\n', '\r'], " ")
}

/// The cache file: [`TUNE_CACHE_ENV`] when set (empty: none), else under the user's cache
/// directory.
pub fn cache_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(TUNE_CACHE_ENV) {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("trmask").join("vocab-kernel.tsv"))
}

/// The cached choices of a cache file (`key<TAB>label` lines; unreadable lines are skipped,
/// a missing file is empty).
pub fn load_cache(path: &Path) -> HashMap<String, VocabVariant> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return HashMap::new();
    };
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('\t')?;
            Some((k.to_string(), VocabVariant::parse(v, "tuner cache").ok()?))
        })
        .collect()
}

/// Adds `key → choice` to the cache file (written to a temporary file and renamed into place).
pub fn store_cache(path: &Path, key: &str, choice: VocabVariant) -> Result<()> {
    let mut all = load_cache(path);
    all.insert(key.to_string(), choice);
    let mut lines: Vec<String> = all
        .iter()
        .map(|(k, v)| format!("{k}\t{}", v.label()))
        .collect();
    lines.sort();
    let io = |e: std::io::Error| Error::config(TUNE_CACHE_ENV, format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, lines.join("\n") + "\n").map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Logits for the tuner: `rows` × `vocab` values of `dtype` drawn around a peaked softmax (a
/// fixed generator, so every candidate sees the same rows).
fn synthetic(dtype: DType, rows: u64, vocab: u64, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let n = (rows * vocab) as usize;
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let u = ((s >> 40) as f32) / (1u64 << 24) as f32;
        let x = 8.0 * u * u - 4.0;
        match dtype {
            DType::F32 => out.extend_from_slice(&x.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes()),
        }
    }
    out
}

impl Context {
    /// Times every candidate of [`Self::vocab_variants`] for `rows` rows of `vocab` logits of
    /// dtypes `da` (rollout) / `db` (trainer), on at most `rows`'s bucket of rows of
    /// device-resident logits ([`TUNE_ROWS`], or [`TUNE_LOGITS`] logits where that is more
    /// rows), and returns the fastest with every timing. Runs on any adapter (lavapipe
    /// included); [`Self::vocab_variant`] calls it only on GPUs.
    pub fn tune_vocab(
        &self,
        (da, db): (DType, DType),
        rows: u64,
        vocab: u64,
    ) -> Result<VocabTuning> {
        let n = row_bucket(rows).min(TUNE_ROWS.max(TUNE_LOGITS / vocab.max(1)));
        let a = self.upload(&synthetic(da, n, vocab, 1))?;
        let b = self.upload(&synthetic(db, n, vocab, 2))?;
        let (ra, rb) = (n as usize, vocab as usize);
        let la = Logits::device(a.raw().clone(), 0, da, ra, rb)?;
        let lb = Logits::device(b.raw().clone(), 0, db, ra, rb)?;
        let mask = vec![true; ra];
        let ids: Vec<i64> = (0..n).map(|r| (r * 7919 % vocab) as i64).collect();
        let mut timings = Vec::new();
        let mut device_timed = true;
        for v in self.vocab_variants(db, rows, vocab) {
            // the first run builds the pipeline
            vocab_divergence_with(self, &la, &lb, Some(&ids), &mask, 1.0, Some(v))?;
            let mut best = f64::INFINITY;
            for _ in 0..TUNE_REPEATS {
                let t0 = Instant::now();
                vocab_divergence_with(self, &la, &lb, Some(&ids), &mask, 1.0, Some(v))?;
                let wall = t0.elapsed().as_secs_f64();
                let secs = match self.last_device_ns() {
                    Some(ns) if self.capabilities().timestamp_query => ns as f64 * 1e-9,
                    _ => {
                        device_timed = false;
                        wall
                    }
                };
                best = best.min(secs);
            }
            timings.push((v, best));
        }
        let choice = timings
            .iter()
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .map(|t| t.0)
            .ok_or_else(|| Error::Gpu("no vocabulary kernel configuration to tune".into()))?;
        Ok(VocabTuning {
            key: tune_key(self, (da, db), rows, vocab),
            choice,
            timings,
            device_timed,
        })
    }

    /// The tuned configuration for a call (from memory, else the cache file, else timed now
    /// and stored in both); `None` on CPU adapters and where tuning fails (the caller keeps
    /// the default).
    pub(in crate::gpu) fn tuned_vocab(
        &self,
        dtypes: (DType, DType),
        rows: u64,
        vocab: u64,
    ) -> Option<VocabVariant> {
        if self.caps.is_cpu() || self.workgroup_size.is_some() {
            return None;
        }
        let key = tune_key(self, dtypes, rows, vocab);
        let mut memo = self.vocab_tuned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = memo.get(&key) {
            return Some(*v);
        }
        let path = cache_path();
        let cached = path
            .as_deref()
            .and_then(|p| load_cache(p).get(&key).copied());
        let choice = match cached {
            Some(v) => v,
            None => {
                let t = self.tune_vocab(dtypes, rows, vocab).ok()?;
                if let Some(p) = &path {
                    if let Err(e) = store_cache(p, &key, t.choice) {
                        eprintln!("warning: the vocabulary kernel's tuning was not cached: {e}");
                    }
                }
                t.choice
            }
        };
        memo.insert(key, choice);
        Some(choice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(vocab_bucket(151_936), 262_144);
        assert_eq!(vocab_bucket(1), 1);
        assert_eq!(row_bucket(0), 1);
        assert_eq!(row_bucket(2048), 2048);
        assert_eq!(row_bucket(2049), 4096);
        assert_eq!(row_bucket(1 << 30), 16_384);
    }

    #[test]
    fn the_cache_file_round_trips_and_skips_bad_lines() {
        let dir = std::env::temp_dir().join(format!("trmask-tune-{}", std::process::id()));
        let path = dir.join("sub").join("vocab-kernel.tsv");
        let v = VocabVariant {
            workgroup: 128,
            slice: 16384,
            subgroups: true,
            ..VocabVariant::default()
        };
        store_cache(&path, "a|b|f32/bf16|v262144|r64", v).unwrap();
        let w = VocabVariant { slice: 0, ..v };
        store_cache(&path, "other", w).unwrap();
        let text = std::fs::read_to_string(&path).unwrap() + "garbage line\nk\twg=0\n";
        std::fs::write(&path, text).unwrap();
        let got = load_cache(&path);
        assert_eq!(got.len(), 2);
        assert_eq!(got["a|b|f32/bf16|v262144|r64"], v);
        assert_eq!(got["other"], w);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(load_cache(&path).is_empty());
    }
}
