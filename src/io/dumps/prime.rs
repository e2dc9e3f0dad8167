//! prime-rl's token export, schema v1 (`token_exports/step_<N>/rank_<R>.jsonl`).

use super::detect::prime;
use super::values::{check_len, field, parse_record, span, Collected, Row, Seq};
use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::Path;

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

pub(super) fn prime_file(path: &Path, c: &mut Collected) -> Result<()> {
    let p = path.display().to_string();
    crate::io::files::read_lines(path, (0, 1), true, u64::MAX, &mut |n, line| {
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
                (prime("response_mask"), &r.loss_mask, true),
                (prime("rollout_log_prob"), &r.inference_logprobs, true),
                (prime("log_prob"), &r.trainer_logprobs, true),
                (prime("advantages"), &r.advantages, false),
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
                prime("rollout_log_prob"),
                &at,
                &valid,
                sp.clone(),
                note,
            )?,
            trainer: field(
                &r.trainer_logprobs,
                prime("log_prob"),
                &at,
                &valid,
                sp.clone(),
                note,
            )?,
            adv: if r.advantages.0.is_empty() {
                Vec::new()
            } else {
                field(
                    &r.advantages,
                    prime("advantages"),
                    &at,
                    &valid,
                    sp.clone(),
                    note,
                )?
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
