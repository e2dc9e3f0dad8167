//! NeMo-RL's `train_data_step<N>.jsonl`.

use super::values::{check_len, field, parse_record, span, Collected, Row, Scalar, Seq};
use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::Path;

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

/// NeMo-RL's advantages key (trmask's own name).
const ADV: &str = "advantages";

/// The step number in a NeMo-RL file name (`train_data_step<N>.jsonl`).
pub fn nemo_step(name: &str) -> Option<i64> {
    name.strip_prefix("train_data_step")?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

pub(super) fn nemo_file(path: &Path, c: &mut Collected) -> Result<()> {
    let p = path.display().to_string();
    c.step = path
        .file_name()
        .and_then(|n| nemo_step(&n.to_string_lossy()));
    let mut any_prev = false;
    crate::io::files::read_lines(path, (0, 1), true, u64::MAX, &mut |n, line| {
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
                (ADV, &r.advantages, false),
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
                field(&r.advantages, ADV, &at, &valid, sp.clone(), note)?
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
