//! Reading batches from safetensors (memory-mapped) or JSON files, and writing per-token /
//! per-sequence outputs and metrics.
//!
//! Tensor names are trmask's or a framework's (verl, TRL, prime-rl, SkyRL, slime), both from
//! the one tensor table, [`crate::input::tensors::TENSORS`]. Other tensors are ignored. The
//! per-token dumps prime-rl and NeMo-RL write on their own are read too ([`dumps`]).
//!
//! Layout rules — never guessed: with `cu_seqlens` the batch is packed (`[N]` tensors, `[N, V]`
//! logits); with `response_mask` it is padded (`[B, T]`). With neither, reading fails naming
//! both unless [`ReadOptions::all_valid`] says every slot is valid (a `[B, T]` batch without
//! padding, or a `[N]` input holding one sequence). JSON may carry Python's bare `NaN` /
//! `Infinity` / `-Infinity` and `null` at padding positions; `null` at a valid position is an
//! error naming the tensor and the position.

pub mod dumps;
mod files;
mod json_stream;
mod mapped;
pub mod names;
mod raw;
mod write;

pub use files::{
    check_distinct, first_line, open_input, read_lines, read_text, Commit, JSON_LIMIT,
};
pub use json_stream::label_id;
pub use mapped::MappedStep;
pub use names::Renames;
pub use write::{
    append_metrics_line, metrics_bytes, metrics_json, metrics_line, outputs_bytes, seq_output,
    token_output, write_metrics, write_outputs, Output,
};

use crate::error::{Error, Result};
use crate::input::batch::{Batch, BatchBuilder};
use crate::input::logits::Logits;
use crate::input::tensors;
use raw::{Dense, LogitsSource, Raw};
use std::path::Path;

/// How to read a batch.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    /// Every slot is valid: a `[B, T]` batch without `response_mask` has no padding, and a
    /// `[N]` batch without `cu_seqlens` is one sequence.
    pub all_valid: bool,
}

/// A batch as read, with where its tensors came from.
pub struct Input {
    pub batch: Batch,
    /// Framework keys renamed to trmask names.
    pub renames: Renames,
    /// `(trmask name, name in the file, dtype)` of every tensor read.
    pub sources: Vec<(String, String, String)>,
    /// The file's `step` (safetensors metadata key `step`, or a top-level JSON number).
    pub step: Option<f64>,
}

/// Reads a batch from `path` with the default options (the layout must be given): `.json`, a
/// pipe such as `<(…)`, or a file starting with `{` is read as JSON, anything else as
/// safetensors.
pub fn read_batch(path: &Path) -> Result<Batch> {
    Ok(read_input(path, &ReadOptions::default())?.batch)
}

/// Reads a batch and where its tensors came from.
pub fn read_input(path: &Path, opts: &ReadOptions) -> Result<Input> {
    let p = path.display().to_string();
    let is_json = has_extension(path, "json");
    // A pipe (`<(…)`, a FIFO, piped stdin) has no useful name: it is read as JSON, like
    // `--config` reads one. Safetensors inputs are memory-mapped and must be regular files.
    let stream = files::is_stream(path);
    // A trainer's own dump (a prime-rl step directory or rank file, a NeMo-RL train_data
    // file), recognised by its content.
    if !stream && !has_extension(path, "safetensors") {
        if let Some(format) = dumps::detect(path)? {
            return build(dumps::read(path, format)?, opts);
        }
    }
    let raw = if is_json || stream || (!has_extension(path, "safetensors") && starts_as_json(path))
    {
        let text = files::read_text_checked(path, files::JSON_LIMIT, |head| {
            if looks_like_safetensors(head) {
                return Err(Error::file(
                    &p,
                    if stream {
                        "is a pipe carrying a safetensors file; safetensors inputs are \
                         memory-mapped, so save it to a regular file first (a pipe is read as JSON)"
                    } else {
                        "holds a safetensors file, not JSON: name it .safetensors"
                    },
                ));
            }
            Ok(())
        })?;
        raw::read_json(&text).map_err(|e| relabel(e, &p))?
    } else {
        raw::read_safetensors(path)?
    };
    build(raw, opts)
}

/// `path` mapped for the fused analysis when it is a padded safetensors step of log-probs
/// ([`MappedStep`]); `None`: read it with [`read_input`].
pub fn map_step(path: &Path, opts: &ReadOptions) -> Result<Option<MappedStep>> {
    if opts.all_valid {
        return Ok(None);
    }
    mapped::map(path)
}

/// The [`Input`] of a mapped step: its layout and response mask, no tensor attached (`None`
/// on a mask value other than 0 / 1).
pub fn mapped_input(m: MappedStep) -> Option<Input> {
    let (batch, renames, sources, step) = m.into_parts()?;
    Some(Input {
        batch,
        renames,
        sources,
        step,
    })
}

/// Reads a batch from JSON text (see the module docs for the accepted names).
pub fn batch_from_json(text: &str) -> Result<Batch> {
    Ok(input_from_json(text, &ReadOptions::default())?.batch)
}

/// Reads a batch from JSON text with options.
pub fn input_from_json(text: &str, opts: &ReadOptions) -> Result<Input> {
    build(raw::read_json(text)?, opts)
}

fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// Whether a regular file without a telling name (`/dev/stdin` redirected from a file) starts
/// with JSON's `{`: never the start of a safetensors file (see [`looks_like_safetensors`]).
fn starts_as_json(path: &Path) -> bool {
    use std::io::Read as _;
    let Ok((f, _)) = files::open_input(path) else {
        return false;
    };
    let mut head = Vec::with_capacity(64);
    if f.take(64).read_to_end(&mut head).is_err() {
        return false;
    }
    head.iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{')
}

/// The start of a safetensors file: an 8-byte little-endian header length, then the header's
/// `{`. JSON text cannot start so: its first 8 bytes, read as that length, exceed 2^56.
fn looks_like_safetensors(head: &[u8]) -> bool {
    head.len() > 8
        && head[8] == b'{'
        && u64::from_le_bytes(head[..8].try_into().unwrap_or([0xff; 8])) < 1 << 40
}

fn relabel(e: Error, path: &str) -> Error {
    match e {
        Error::File { problem, .. } => Error::file(path, problem),
        other => other,
    }
}

/// The largest integer every f64 holds exactly: ids and offsets beyond it are out of range.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

fn to_ids(name: &str, d: &[f64]) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    out.try_reserve_exact(d.len())
        .map_err(|_| Error::OutOfMemory(format!("{} ids of {name}", d.len())))?;
    for &x in d {
        if x.is_finite() && x.fract() == 0.0 && x.abs() <= MAX_EXACT {
            out.push(x as i64);
        } else if x.is_finite() && x.fract() == 0.0 {
            return Err(Error::input(
                name,
                format!("value {x} is out of range (|value| at most 2^53 = 9007199254740992)"),
            ));
        } else {
            return Err(Error::input(name, format!("value {x} is not an integer")));
        }
    }
    Ok(out)
}

/// Both sides' routed experts (`[.., L, K]`), attached when given; one side alone is an error
/// naming the other. Ids at padding (garbage, NaN, null) are never read.
fn routed_experts(
    raw: &mut Raw,
    batch: BatchBuilder,
    mask: &[bool],
    check: impl Fn(&str, &[usize], usize) -> Result<()>,
) -> Result<BatchBuilder> {
    use crate::input::routing::{OLD, ROLLOUT};
    match (raw.dense.remove(ROLLOUT), raw.dense.remove(OLD)) {
        (Some(mut r), Some(mut o)) => {
            check(ROLLOUT, &r.shape, 2)?;
            check(OLD, &o.shape, 2)?;
            let lk = |s: &[usize]| s[s.len() - 2..].to_vec();
            if lk(&r.shape) != lk(&o.shape) {
                return Err(Error::input(
                    OLD,
                    format!(
                        "shape {:?} disagrees with {ROLLOUT}'s {:?} (the same [L, K] on both sides)",
                        o.shape, r.shape
                    ),
                ));
            }
            let (l, k) = (r.shape[r.shape.len() - 2], r.shape[r.shape.len() - 1]);
            let per_slot = l * k;
            for d in [&mut r, &mut o] {
                for (i, x) in d.data.iter_mut().enumerate() {
                    if !mask[i / per_slot.max(1)] {
                        *x = -1.0; // padding: never read
                    }
                }
            }
            let (r, o) = (to_ids(ROLLOUT, &r.data)?, to_ids(OLD, &o.data)?);
            batch.with_routed_experts(&r, &o, l, k)
        }
        (Some(_), None) => Err(missing(
            raw,
            OLD,
            "it is required with rollout_routed_experts (the trainer's own routing, recorded \
             without replay)",
        )),
        (None, Some(_)) => Err(missing(
            raw,
            ROLLOUT,
            "it is required with old_routed_experts (the rollout engine's routing)",
        )),
        (None, None) => Ok(batch),
    }
}

fn no_nulls(name: &str, d: &Dense) -> Result<()> {
    match d.nulls.first() {
        Some(i) => Err(Error::input(
            name,
            format!("null at flat index {i} (only token tensors may hold null, at padding)"),
        )),
        None => Ok(()),
    }
}

/// The missing-tensor error, naming the file's keys that may be it.
fn missing(raw: &Raw, target: &str, what: &str) -> Error {
    let hints = names::near_misses(target, &raw.keys, &raw::known());
    let mut msg = format!("is missing: {what}");
    if !hints.is_empty() {
        msg.push_str("; ");
        msg.push_str(&hints.join("; "));
    }
    Error::input(target, msg)
}

fn layout(raw: &mut Raw, opts: &ReadOptions) -> Result<BatchBuilder> {
    let token_shape = tensors::token_shape_sources()
        .into_iter()
        .find_map(|n| raw.dense.get(n).map(|d| (n.to_string(), d.shape.clone())));
    let (source, shape) = match (&token_shape, raw.logits.iter().next()) {
        (Some((n, s)), _) => (n.clone(), s.clone()),
        (None, Some((name, (s, _)))) if s.len() >= 2 => {
            if s.last() == Some(&0) {
                return Err(Error::input(name, "vocabulary size is 0"));
            }
            (name.clone(), s[..s.len() - 1].to_vec())
        }
        _ => {
            return Err(missing(
                raw,
                "rollout_log_prob",
                "no per-token tensor found (need log-probs or logits)",
            ))
        }
    };
    if let Some(cu) = raw.dense.remove("cu_seqlens") {
        no_nulls("cu_seqlens", &cu)?;
        if cu.shape.len() != 1 {
            return Err(Error::input(
                "cu_seqlens",
                format!("must be 1-D, got shape {:?}", cu.shape),
            ));
        }
        if raw.dense.contains_key("response_mask") {
            return Err(Error::input(
                "response_mask",
                "cannot be combined with cu_seqlens (packed layout has no padding)",
            ));
        }
        let cu = to_ids("cu_seqlens", &cu.data)?;
        // Checked against the tensors that exist before anything is sized by it.
        let [n] = shape.as_slice() else {
            return Err(Error::input(
                source,
                format!("shape {shape:?} is not [N]: with cu_seqlens the batch is packed"),
            ));
        };
        if let Some(&last) = cu.last() {
            if last != *n as i64 {
                return Err(Error::input(
                    "cu_seqlens",
                    format!("ends at {last}, but {source} holds {n} token slots"),
                ));
            }
        }
        return Batch::packed(&cu);
    }
    let mask = raw.dense.remove("response_mask");
    if mask.is_none() && !opts.all_valid {
        return Err(Error::input(
            "response_mask",
            format!(
                "and cu_seqlens are both missing: the layout of the {shape:?} batch must be \
                 given (response_mask for a padded batch, cu_seqlens for a packed one), or pass \
                 --all-valid if every slot is a valid token{}",
                names::near_misses("response_mask", &raw.keys, &raw::known())
                    .first()
                    .map(|h| format!("; {h}"))
                    .unwrap_or_default()
            ),
        ));
    }
    match shape.as_slice() {
        [b, t] => {
            let slots = b.checked_mul(*t).unwrap_or(usize::MAX);
            // A [B, 0] tensor holds no bytes whatever B is: bound B by what the file holds.
            if *b as u64 > (slots as u64).max(raw.bytes) {
                return Err(Error::input(
                    source,
                    format!(
                        "{b} sequences is out of range for a {}-byte input holding {slots} \
                         token slots (at most {})",
                        raw.bytes,
                        (slots as u64).max(raw.bytes)
                    ),
                ));
            }
            let mask = match mask {
                Some(m) if m.shape != shape => {
                    return Err(Error::input(
                        "response_mask",
                        format!("shape {:?} differs from the token shape {shape:?}", m.shape),
                    ))
                }
                Some(m) => {
                    no_nulls("response_mask", &m)?;
                    m.data
                }
                None => {
                    let mut m = Vec::new();
                    m.try_reserve_exact(slots)
                        .map_err(|_| Error::OutOfMemory(format!("a mask of {slots} slots")))?;
                    m.resize(slots, 1.0);
                    m
                }
            };
            Batch::padded(*b, *t, &mask)
        }
        [n] if mask.is_none() => Batch::packed(&[0, *n as i64]),
        [_] => Err(Error::input(
            "response_mask",
            "a 1-D batch is packed: give cu_seqlens instead of response_mask",
        )),
        other => Err(Error::input(
            token_shape.map(|t| t.0).unwrap_or_default(),
            format!("shape {other:?} is neither [B, T] nor [N]"),
        )),
    }
}

fn build(mut raw: Raw, opts: &ReadOptions) -> Result<Input> {
    let implied = opts.all_valid
        && !raw.dense.contains_key("response_mask")
        && !raw.dense.contains_key("cu_seqlens");
    let mut batch = layout(&mut raw, opts)?;
    let tshape = batch.token_shape();
    // TRL's advantages are per sequence, [B]: one value for every token of the row.
    if let (Some(adv), [b, t]) = (raw.dense.get_mut("advantages"), tshape.as_slice()) {
        if adv.shape == [*b] {
            adv.data = adv
                .data
                .iter()
                .flat_map(|&x| std::iter::repeat_n(x, *t))
                .collect();
            adv.nulls = adv.nulls.iter().flat_map(|&i| i * t..(i + 1) * t).collect();
            adv.shape = tshape.clone();
        }
    }
    let check = |name: &str, shape: &[usize], extra: usize| -> Result<()> {
        let ok = shape.len() == tshape.len() + extra && shape[..tshape.len()] == tshape[..];
        if ok {
            Ok(())
        } else {
            let want = if extra == 0 {
                format!("{tshape:?}")
            } else {
                format!("{tshape:?} + [..]")
            };
            Err(Error::input(
                name,
                format!("shape {shape:?} does not match the batch layout {want}"),
            ))
        }
    };
    // JSON nulls may only stand at padding.
    let mask = batch.mask().to_vec();
    for (name, d) in &raw.dense {
        // CSR tensors are not laid out by slot: any null in them is an error (below)
        let csr = tensors::spec(name)
            .is_some_and(|t| matches!(t.shape, tensors::Shape::Flat | tensors::Shape::KeptOffsets));
        if csr {
            continue;
        }
        let per_slot = d.data.len() / mask.len().max(1);
        if let Some(&i) = d
            .nulls
            .iter()
            // A null past the mask belongs to a tensor of the wrong shape: the shape check
            // below names that.
            .find(|&&i| mask.get(i / per_slot.max(1)).copied().unwrap_or(false))
        {
            return Err(Error::input(
                name,
                format!(
                    "null at valid position {} (null is accepted only where response_mask is 0)",
                    batch.position(i / per_slot.max(1))
                ),
            ));
        }
    }
    for name in tensors::per_token_values() {
        if let Some(d) = raw.dense.remove(name) {
            check(name, &d.shape, 0)?;
            batch = batch.with_log_probs(name, d.data)?;
        }
    }
    if let Some(d) = raw.dense.remove("uid") {
        if d.shape.len() != 1 {
            let msg = format!("must be 1-D ([B] or [S]), got shape {:?}", d.shape);
            return Err(Error::input("uid", msg));
        }
        if !d.nulls.is_empty() {
            return Err(Error::input("uid", "null group id"));
        }
        batch = batch.with_uid(to_ids("uid", &d.data)?)?;
    }
    if let Some(mut d) = raw.dense.remove("responses") {
        check("responses", &d.shape, 0)?;
        // Ids are read only where the mask is 1: padding (null, NaN, 2^63 − 1, …) never matters.
        for (x, &valid) in d.data.iter_mut().zip(&mask) {
            if !valid {
                *x = 0.0;
            }
        }
        batch = batch.with_responses(to_ids("responses", &d.data)?)?;
    }
    for name in tensors::logits_names() {
        if let Some((shape, src)) = raw.logits.remove(name) {
            check(name, &shape, 1)?;
            let vocab = *shape.last().unwrap();
            let rows = batch.slots();
            let logits = match src {
                LogitsSource::Mapped {
                    map,
                    offset,
                    len,
                    dtype,
                } => Logits::mapped(map, offset, len, dtype, rows, vocab),
                LogitsSource::Values(v, nulls) => {
                    // a null row of logits is legal only at padding (docs/FORMAT.md, Input tensors), like NaN there
                    let valid_null = nulls
                        .iter()
                        .find(|&&i| mask.get(i / vocab.max(1)).copied().unwrap_or(true));
                    if let Some(&i) = valid_null {
                        return Err(Error::input(
                            name,
                            format!(
                                "null at valid position {}, column {} (logits must be numbers; \
                                 -Infinity masks a token)",
                                batch.position(i / vocab.max(1)),
                                i % vocab.max(1)
                            ),
                        ));
                    }
                    Logits::from_f32(&v, rows, vocab)
                }
            }
            .map_err(|e| match e {
                Error::InvalidInput { problem, .. } => Error::input(name, problem),
                other => other,
            })?;
            batch = batch.with_logits(name, logits)?;
        }
    }
    match (
        raw.dense.remove("rollout_topk_ids"),
        raw.dense.remove("rollout_topk_log_prob"),
    ) {
        (Some(mut ids), Some(lp)) => {
            check("rollout_topk_ids", &ids.shape, 1)?;
            check("rollout_topk_log_prob", &lp.shape, 1)?;
            let k = *ids.shape.last().unwrap();
            for (i, x) in ids.data.iter_mut().enumerate() {
                if !mask[i / k.max(1)] {
                    *x = 0.0; // padding: never read
                }
            }
            batch = batch.with_topk(to_ids("rollout_topk_ids", &ids.data)?, lp.data, k)?;
        }
        (Some(_), None) => {
            return Err(missing(
                &raw,
                "rollout_topk_log_prob",
                "it is required with rollout_topk_ids",
            ))
        }
        (None, Some(_)) => {
            return Err(missing(
                &raw,
                "rollout_topk_ids",
                "it is required with rollout_topk_log_prob",
            ))
        }
        (None, None) => {}
    }
    batch = routed_experts(&mut raw, batch, &mask, check)?;
    let (ids_name, off_name) = (
        crate::sampling::kept_set::IDS,
        crate::sampling::kept_set::OFFSETS,
    );
    match (raw.dense.remove(ids_name), raw.dense.remove(off_name)) {
        (Some(ids), Some(off)) => {
            for (name, d) in [(ids_name, &ids), (off_name, &off)] {
                no_nulls(name, d)?;
                if d.shape.len() != 1 {
                    let msg = format!("must be 1-D (CSR), got shape {:?}", d.shape);
                    return Err(Error::input(name, msg));
                }
            }
            let off = to_ids(off_name, &off.data)?;
            batch = batch.with_kept_sets(to_ids(ids_name, &ids.data)?, &off)?;
        }
        (Some(_), None) => return Err(missing(&raw, off_name, "it is required with the kept ids")),
        (None, Some(_)) => {
            return Err(missing(
                &raw,
                ids_name,
                "it is required with the kept-set offsets",
            ))
        }
        (None, None) => {}
    }
    if !batch.has_rollout_policy() {
        return Err(missing(
            &raw,
            "rollout_log_prob",
            "the rollout policy's log-probs (or rollout_logits, or its top-K) are needed",
        ));
    }
    if !batch.has_training_policy() {
        return Err(missing(
            &raw,
            "old_log_prob",
            "the training policy's log-probs (old_log_prob, log_prob or old_logits) are needed",
        ));
    }
    let batch = batch.build()?;
    if implied && batch.slots() == 0 {
        // the layout-less batch has no token: say so rather than name a mask it lacks
        let name = tensors::log_prob_names()
            .into_iter()
            .find(|n| raw.sources.iter().any(|(t, _, _)| t == n))
            .unwrap_or("rollout_log_prob");
        return Err(Error::input(
            name,
            "is empty: --all-valid needs at least one valid token",
        ));
    }
    Ok(Input {
        batch,
        renames: raw.renames,
        sources: raw.sources,
        step: raw.step,
    })
}
