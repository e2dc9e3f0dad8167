//! Per-token dumps that trainers already write, read as a batch — recognised by content, not
//! by name (docs/FORMAT.md, "Trainer dumps", has each format's fields and the writer code
//! they were read from):
//!
//! * **prime-rl's token export** (`token_exports/step_<N>/rank_<R>.jsonl`, schema v1; written
//!   by `src/prime_rl/trainer/rl/token_export.py`): one JSON object per sequence, prompt and
//!   completion, with aligned per-token arrays. A step directory's rank files are merged into
//!   one step, in rank order.
//! * **NeMo-RL's `train_data_step<N>.jsonl`** (`Logger.log_batched_dict_as_jsonl` in
//!   `nemo_rl/utils/logger.py`, called from `nemo_rl/algorithms/grpo.py`): one JSON object per
//!   sample, each array a batch of one (`[[…]]`), padded to the step's longest sequence.
//!
//! Each sequence keeps its tokens from its first to its last valid one (the prompt before its
//! first loss-mask token is left out, holes inside stay as mask 0): a padded `[B, T]` batch
//! with `T` the longest such span. Files are read one line at a time; a damaged or partial
//! line is a one-line error naming the file and line.

use super::names::Renames;
use super::raw::{Dense, Raw};
use crate::error::{Error, Result};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// A trainer dump format trmask reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    /// prime-rl's token export, schema v1.
    PrimeRl,
    /// NeMo-RL's `train_data_step<N>.jsonl`.
    NemoRl,
}

impl DumpFormat {
    pub fn name(self) -> &'static str {
        match self {
            DumpFormat::PrimeRl => "prime-rl token export (schema v1)",
            DumpFormat::NemoRl => "NeMo-RL train_data_step*.jsonl",
        }
    }
}

/// The keys that mark each format's records (all must be present in the first record).
const PRIME_KEYS: &[&str] = &[
    "schema_version",
    "inference_logprobs",
    "trainer_logprobs",
    "loss_mask",
];
const NEMO_KEYS: &[&str] = &["generation_logprobs", "prev_logprobs", "token_loss_mask"];

/// The number in a prime-rl rank file's name (`rank_<R>.jsonl`).
pub fn rank_of(name: &str) -> Option<u64> {
    name.strip_prefix("rank_")?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

/// The prime-rl rank files of a step directory, in rank order.
pub fn rank_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let p = dir.display().to_string();
    let mut ranks: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(&p, &e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            rank_of(&name).map(|r| (r, e.path()))
        })
        .collect();
    ranks.sort();
    Ok(ranks.into_iter().map(|(_, p)| p).collect())
}

/// The first key of the JSON object a file starts with, from its first bytes (`None` when it
/// does not start with an object or the key is longer than what was read).
fn first_key(head: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(head)
        .unwrap_or_else(|e| std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default());
    let rest = s.trim_start().strip_prefix('{')?.trim_start();
    let mut de = serde_json::Deserializer::from_str(rest);
    String::deserialize(&mut de).ok()
}

/// Which trainer dump `path` is, by content: a directory holding prime-rl rank files, or a
/// JSON-lines file whose first record carries one format's keys. `None`: neither (a batch).
pub fn detect(path: &Path) -> Result<Option<DumpFormat>> {
    use std::io::Read as _;
    let p = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| Error::io(&p, &e))?;
    if meta.is_dir() {
        if !rank_files(path)?.is_empty() {
            return Ok(Some(DumpFormat::PrimeRl));
        }
        let steps = std::fs::read_dir(path)
            .map_err(|e| Error::io(&p, &e))?
            .filter_map(|e| e.ok())
            .any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n == "token_exports" || n.starts_with("step_")
            });
        return Err(Error::file(
            &p,
            if steps {
                "is a directory of prime-rl steps: give one step directory \
                 (token_exports/step_<N>) or a rank file, or follow the run with `trmask watch`"
            } else {
                "is a directory, not a batch file or a prime-rl step directory (rank_<R>.jsonl)"
            },
        ));
    }
    if !meta.is_file() {
        return Ok(None);
    }
    let mut head = Vec::with_capacity(4096);
    let f = std::fs::File::open(path).map_err(|e| Error::io(&p, &e))?;
    f.take(4096)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(&p, &e))?;
    // A batch's first key is a tensor name: decided without reading on.
    let Some(key) = first_key(&head) else {
        return Ok(None);
    };
    let known = super::raw::known();
    if known.contains(&key.as_str())
        || crate::input::tensors::aliases().any(|(a, _)| a.source == key)
    {
        return Ok(None);
    }
    let mut keys: Vec<String> = Vec::new();
    if let Some(line) = super::files::first_line(path)? {
        let mut de = serde_json::Deserializer::from_str(&line);
        if let Ok(m) = std::collections::BTreeMap::<String, de::IgnoredAny>::deserialize(&mut de) {
            keys = m.into_keys().collect();
        }
    }
    let has = |want: &[&str]| want.iter().all(|k| keys.iter().any(|x| x == k));
    Ok(if has(PRIME_KEYS) {
        Some(DumpFormat::PrimeRl)
    } else if has(NEMO_KEYS) {
        Some(DumpFormat::NemoRl)
    } else {
        None
    })
}

/// A JSON number, `null`, or a non-finite marker string (`NaN`, `Infinity`, `-Infinity`; bare
/// literals are quoted before parsing). `null` is `None`.
#[derive(Clone, Copy, Debug, Default)]
struct Num(Option<f64>);

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
struct Row(Vec<Num>);

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
enum NumOrRow {
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
struct Scalar(Option<f64>);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let r = Row::deserialize(d)?;
        Ok(Scalar(r.0.first().and_then(|n| n.0)))
    }
}

/// A prime-rl token-export record (schema v1): the fields trmask reads; the rest is skipped.
#[derive(Deserialize)]
struct PrimeRecord {
    schema_version: i64,
    step: Option<i64>,
    #[serde(default)]
    token_ids: Row,
    loss_mask: Row,
    #[serde(default)]
    advantages: Row,
    inference_logprobs: Row,
    trainer_logprobs: Row,
    #[serde(default)]
    rl_weights: Row,
    #[serde(default)]
    ref_kl_weights: Row,
}

/// A NeMo-RL `train_data_step<N>.jsonl` line: the fields trmask reads.
#[derive(Deserialize)]
struct NemoRecord {
    #[serde(default)]
    token_ids: Row,
    token_loss_mask: Row,
    #[serde(default)]
    sample_loss_mask: Scalar,
    #[serde(default)]
    input_lengths: Scalar,
    #[serde(default)]
    advantages: Row,
    generation_logprobs: Row,
    prev_logprobs: Row,
}

/// One sequence's valid span, as read.
struct Seq {
    rollout: Vec<f64>,
    trainer: Vec<f64>,
    adv: Vec<f64>,
    ids: Vec<f64>,
    mask: Vec<bool>,
}

/// What a dump gave, before the batch's layout rules.
struct Collected {
    seqs: Vec<Seq>,
    step: Option<i64>,
    /// Records without a valid token (left out).
    empty: usize,
    has_adv: bool,
    has_ids: bool,
    bytes: u64,
}

fn parse_record<'a, T: Deserialize<'a>>(line: &'a str, at: &str, what: &str) -> Result<T> {
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
fn field(
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
fn span(valid: &[bool]) -> Option<std::ops::Range<usize>> {
    let a = valid.iter().position(|&v| v)?;
    let b = valid.iter().rposition(|&v| v)?;
    Some(a..b + 1)
}

fn check_len(at: &str, n: usize, fields: &[(&str, &Row, bool)]) -> Result<()> {
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

fn prime_file(path: &Path, c: &mut Collected) -> Result<()> {
    let p = path.display().to_string();
    super::files::read_lines(path, 0, 1, true, &mut |n, line| {
        c.bytes += line.len() as u64 + 1;
        if line.trim().is_empty() {
            return Ok(());
        }
        let at = format!("{p}: line {n}");
        let r: PrimeRecord = parse_record(line, &at, "prime-rl token-export")?;
        if r.schema_version != 1 {
            return Err(Error::file(
                &at,
                format!(
                    "schema_version {}: trmask reads prime-rl's token export schema v1",
                    r.schema_version
                ),
            ));
        }
        match (c.step, r.step) {
            (Some(a), Some(b)) if a != b => {
                return Err(Error::file(
                    &at,
                    format!(
                    "holds step {b} where the records before hold step {a}: one step per directory"
                ),
                ))
            }
            (None, b) => c.step = b,
            _ => {}
        }
        let len = r.loss_mask.0.len();
        check_len(
            &at,
            len,
            &[
                ("loss_mask", &r.loss_mask, true),
                ("inference_logprobs", &r.inference_logprobs, true),
                ("trainer_logprobs", &r.trainer_logprobs, true),
                ("advantages", &r.advantages, false),
                ("token_ids", &r.token_ids, false),
                ("rl_weights", &r.rl_weights, false),
                ("ref_kl_weights", &r.ref_kl_weights, false),
            ],
        )?;
        // prime-rl's mismatch tokens (train.py): the loss mask, narrowed to the policy-sampled
        // tokens (rl weight ≠ 0, or a ref-KL weight ≠ 0) when a weight stream is present; an
        // all-null stream is an absent one.
        let present = |r: &Row| r.0.iter().any(|x| x.0.is_some());
        let (rl, kl) = (present(&r.rl_weights), present(&r.ref_kl_weights));
        let w = |r: &Row, t: usize| r.0[t].0.is_some_and(|x| x != 0.0);
        let valid: Vec<bool> = (0..len)
            .map(|t| {
                let lm = r.loss_mask.0[t].0.is_some_and(|x| x != 0.0);
                let sampled = (if rl { w(&r.rl_weights, t) } else { true })
                    || (kl && w(&r.ref_kl_weights, t));
                lm && sampled
            })
            .collect();
        let Some(sp) = span(&valid) else {
            c.empty += 1;
            return Ok(());
        };
        let note = " (prime-rl writes a non-finite value as null)";
        c.has_adv |= !r.advantages.0.is_empty();
        c.has_ids |= !r.token_ids.0.is_empty();
        c.seqs.push(Seq {
            rollout: field(
                &r.inference_logprobs,
                "inference_logprobs",
                &at,
                &valid,
                sp.clone(),
                note,
            )?,
            trainer: field(
                &r.trainer_logprobs,
                "trainer_logprobs",
                &at,
                &valid,
                sp.clone(),
                note,
            )?,
            adv: if r.advantages.0.is_empty() {
                Vec::new()
            } else {
                field(&r.advantages, "advantages", &at, &valid, sp.clone(), note)?
            },
            ids: if r.token_ids.0.is_empty() {
                Vec::new()
            } else {
                field(&r.token_ids, "token_ids", &at, &valid, sp.clone(), note)?
            },
            mask: valid[sp].to_vec(),
        });
        Ok(())
    })?;
    Ok(())
}

/// The step number in a NeMo-RL file name (`train_data_step<N>.jsonl`).
pub fn nemo_step(name: &str) -> Option<i64> {
    name.strip_prefix("train_data_step")?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

fn nemo_file(path: &Path, c: &mut Collected) -> Result<()> {
    let p = path.display().to_string();
    c.step = path
        .file_name()
        .and_then(|n| nemo_step(&n.to_string_lossy()));
    let mut any_prev = false;
    super::files::read_lines(path, 0, 1, true, &mut |n, line| {
        c.bytes += line.len() as u64 + 1;
        if line.trim().is_empty() {
            return Ok(());
        }
        let at = format!("{p}: line {n}");
        // json.dumps writes Python's bare NaN / Infinity
        let text = crate::lenient_json::quote_non_finite(line);
        let r: NemoRecord = parse_record(&text, &at, "NeMo-RL train_data")?;
        let len = r.token_loss_mask.0.len();
        check_len(
            &at,
            len,
            &[
                ("token_loss_mask", &r.token_loss_mask, true),
                ("generation_logprobs", &r.generation_logprobs, true),
                ("prev_logprobs", &r.prev_logprobs, true),
                ("advantages", &r.advantages, false),
                ("token_ids", &r.token_ids, false),
            ],
        )?;
        // NeMo-RL's loss mask: token_mask × sample_mask (grpo.py), within input_lengths
        let sample = r.sample_loss_mask.0.unwrap_or(1.0);
        let length = r
            .input_lengths
            .0
            .map_or(len, |l| (l.max(0.0) as usize).min(len));
        let valid: Vec<bool> = (0..len)
            .map(|t| {
                t < length && sample != 0.0 && r.token_loss_mask.0[t].0.is_some_and(|x| x != 0.0)
            })
            .collect();
        let Some(sp) = span(&valid) else {
            c.empty += 1;
            return Ok(());
        };
        let note = "";
        let trainer = field(
            &r.prev_logprobs,
            "prev_logprobs",
            &at,
            &valid,
            sp.clone(),
            note,
        )?;
        any_prev |= trainer
            .iter()
            .zip(&valid[sp.clone()])
            .any(|(&x, &v)| v && x != 0.0);
        c.has_adv |= !r.advantages.0.is_empty();
        c.has_ids |= !r.token_ids.0.is_empty();
        c.seqs.push(Seq {
            rollout: field(
                &r.generation_logprobs,
                "generation_logprobs",
                &at,
                &valid,
                sp.clone(),
                note,
            )?,
            trainer,
            adv: if r.advantages.0.is_empty() {
                Vec::new()
            } else {
                field(&r.advantages, "advantages", &at, &valid, sp.clone(), note)?
            },
            ids: if r.token_ids.0.is_empty() {
                Vec::new()
            } else {
                field(&r.token_ids, "token_ids", &at, &valid, sp.clone(), note)?
            },
            mask: valid[sp].to_vec(),
        });
        Ok(())
    })?;
    if !c.seqs.is_empty() && !any_prev {
        return Err(Error::file(
            &p,
            "`prev_logprobs` is 0 at every valid token: NeMo-RL skipped the trainer's \
             recompute (force_on_policy_ratio), so there is no trainer log-prob to compare",
        ));
    }
    Ok(())
}

/// Reads a trainer dump as [`Raw`] tensors under trmask names, with the note stderr prints.
pub(super) fn read(path: &Path, format: DumpFormat) -> Result<Raw> {
    let p = path.display().to_string();
    let mut c = Collected {
        seqs: Vec::new(),
        step: None,
        empty: 0,
        has_adv: false,
        has_ids: false,
        bytes: 0,
    };
    let mut what = String::new();
    match format {
        DumpFormat::PrimeRl if path.is_dir() => {
            let files = rank_files(path)?;
            for f in &files {
                prime_file(f, &mut c)?;
            }
            let names: Vec<String> = files
                .iter()
                .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            what = format!(
                "{} rank file{} merged ({})",
                files.len(),
                if files.len() == 1 { "" } else { "s" },
                names.join(", ")
            );
        }
        DumpFormat::PrimeRl => prime_file(path, &mut c)?,
        DumpFormat::NemoRl => nemo_file(path, &mut c)?,
    }
    if c.seqs.is_empty() {
        return Err(Error::file(
            &p,
            format!(
                "holds no sequence with a valid token ({} record{} read)",
                c.empty,
                if c.empty == 1 { "" } else { "s" }
            ),
        ));
    }
    let (rollout_src, trainer_src, trainer_dst, mask_src) = match format {
        DumpFormat::PrimeRl => (
            "inference_logprobs",
            "trainer_logprobs",
            "log_prob",
            "loss_mask",
        ),
        DumpFormat::NemoRl => (
            "generation_logprobs",
            "prev_logprobs",
            "old_log_prob",
            "token_loss_mask × sample_loss_mask",
        ),
    };
    let b = c.seqs.len();
    let t = c.seqs.iter().map(|s| s.mask.len()).max().unwrap_or(0);
    let slots = b * t;
    let mut tensors: Vec<(&str, &str, Vec<f64>)> = vec![
        ("rollout_log_prob", rollout_src, vec![f64::NAN; slots]),
        (trainer_dst, trainer_src, vec![f64::NAN; slots]),
        ("response_mask", mask_src, vec![0.0; slots]),
    ];
    if c.has_adv {
        tensors.push(("advantages", "advantages", vec![0.0; slots]));
    }
    if c.has_ids {
        tensors.push(("responses", "token_ids", vec![0.0; slots]));
    }
    for (i, s) in c.seqs.iter().enumerate() {
        let row = i * t;
        for (k, (_, _, data)) in tensors.iter_mut().enumerate() {
            let src: Vec<f64> = match k {
                0 => s.rollout.clone(),
                1 => s.trainer.clone(),
                2 => s.mask.iter().map(|&v| v as u8 as f64).collect(),
                _ if k == 3 && c.has_adv => s.adv.clone(),
                _ => s.ids.clone(),
            };
            // a record without this field (mixed files) leaves its row at the default
            let n = src.len().min(t);
            data[row..row + n].copy_from_slice(&src[..n]);
        }
    }
    let mut raw = Raw {
        keys: tensors.iter().map(|x| x.1.to_string()).collect(),
        step: c.step.map(|s| s as f64),
        bytes: c.bytes,
        ..Raw::default()
    };
    let mut pairs = Vec::new();
    for (name, src, data) in tensors {
        raw.sources
            .push((name.to_string(), src.to_string(), "jsonl".to_string()));
        pairs.push((src.to_string(), name.to_string()));
        raw.dense.insert(
            name.to_string(),
            Dense {
                shape: vec![b, t],
                data,
                nulls: Vec::new(),
            },
        );
    }
    let mut about = vec![format!("{b} sequences")];
    if !what.is_empty() {
        about.insert(0, what);
    }
    if let Some(s) = c.step {
        about.push(format!("step {s}"));
    }
    if c.empty > 0 {
        about.push(format!(
            "{} record{} without a valid token left out",
            c.empty,
            if c.empty == 1 { "" } else { "s" }
        ));
    }
    about.push("each sequence from its first to its last valid token".into());
    raw.renames = Renames {
        applied: pairs,
        format: Some(format!("{}, {}", format.name(), about.join(", "))),
    };
    Ok(raw)
}
