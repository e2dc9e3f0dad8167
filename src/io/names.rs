//! Framework tensor names → trmask names.
//!
//! A dump written straight from a trainer's batch carries that framework's keys. Each row of
//! [`ALIASES`] maps one such key to the trmask name it holds; only names read in the
//! framework's own source are listed (file and function in the comment above each group).
//! AReaL is deliberately absent: its `old_logprobs` is the *rollout* (behaviour) log-prob,
//! the opposite of verl's and TRL's "old", so it is only ever suggested, never mapped.

use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// One recognised framework key.
#[derive(Clone, Copy, Debug)]
pub struct Alias {
    /// The key as the framework writes it.
    pub source: &'static str,
    /// The trmask name it maps to.
    pub target: &'static str,
    /// The frameworks that use this key for this quantity.
    pub frameworks: &'static [&'static str],
}

const fn a(
    source: &'static str,
    target: &'static str,
    frameworks: &'static [&'static str],
) -> Alias {
    Alias {
        source,
        target,
        frameworks,
    }
}

/// Every recognised framework key.
pub const ALIASES: [Alias; 14] = [
    // verl — verl/trainer/ppo/ray_trainer.py (`_compute_old_log_prob`: "old_log_probs";
    // `compute_response_mask`: "responses", "response_mask") and
    // verl/trainer/ppo/rollout_corr_helper.py (`compute_rollout_correction_and_add_to_batch`:
    // batch.batch["rollout_log_probs"]). slime — slime/ray/rollout.py
    // (`_convert_samples_to_train_data`: train_data["rollout_log_probs"]); SkyRL's older
    // skyrl-train/skyrl_train/training_batch.py spells it the same.
    a("old_log_probs", "old_log_prob", &["verl"]),
    a(
        "rollout_log_probs",
        "rollout_log_prob",
        &["verl", "slime", "SkyRL"],
    ),
    // TRL — trl/trainer/grpo_trainer.py (`GRPOTrainer._generate_and_score_completions`: output
    // keys "old_per_token_logps", "sampling_per_token_logps", "completion_mask",
    // "completion_ids"; `_compute_loss` reads them back).
    a("old_per_token_logps", "old_log_prob", &["TRL"]),
    a("sampling_per_token_logps", "rollout_log_prob", &["TRL"]),
    a("completion_mask", "response_mask", &["TRL"]),
    a("completion_ids", "responses", &["TRL"]),
    // prime-rl — src/prime_rl/trainer/rl/loss.py (`LossInputs.inference_logprobs`,
    // `.trainer_logprobs`, `.loss_mask`) and src/prime_rl/trainer/rl/train.py
    // (micro_batch["inference_logprobs"], micro_batch["loss_mask"]). SkyRL —
    // skyrl-train/skyrl_train/training_batch.py (`TrainingInput.loss_mask`).
    a("inference_logprobs", "rollout_log_prob", &["prime-rl"]),
    a("trainer_logprobs", "log_prob", &["prime-rl"]),
    a("loss_mask", "response_mask", &["prime-rl", "SkyRL"]),
    // SkyRL — skyrl-train/skyrl_train/training_batch.py (`TrainingInput.rollout_logprobs`) and
    // skyrl-train/skyrl_train/trainer.py (`fwd_logprobs_values_reward`:
    // training_input["action_log_probs"], the trainer recompute passed as old_log_probs).
    a("rollout_logprobs", "rollout_log_prob", &["SkyRL"]),
    a("action_log_probs", "old_log_prob", &["SkyRL"]),
    // slime — slime/backends/megatron_utils/loss.py (`policy_loss_function`: old_log_probs =
    // batch["log_probs"]; batch["loss_masks"]) and slime/ray/rollout.py
    // (train_data["loss_masks"]).
    a("log_probs", "old_log_prob", &["slime"]),
    a("loss_masks", "response_mask", &["slime"]),
    // TRL writes per-sequence advantages [B] under the same name as verl's [B, T]; the reader
    // broadcasts a [B] tensor over the response (see `io`).
    a(
        "advantages",
        "advantages",
        &["verl", "TRL", "prime-rl", "SkyRL", "slime"],
    ),
];

/// Names that look like a quantity but are not mapped, with what they probably are.
const HINTS: [(&str, &str); 3] = [
    (
        "old_logprobs",
        "AReaL's name for the rollout (behaviour) log-prob; if so, rename it rollout_log_prob \
         (verl's and TRL's \"old\" is the trainer recompute, so trmask does not guess)",
    ),
    (
        "proximal_logprobs",
        "AReaL's trainer recompute; if so, rename it old_log_prob",
    ),
    (
        "ref_log_prob",
        "the reference policy's log-prob, not the trainer's recompute of the rollout policy",
    ),
];

/// The renames applied to one input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Renames {
    /// `(source, target)` pairs, in file order of the targets.
    pub applied: Vec<(String, String)>,
}

impl Renames {
    /// The framework whose keys explain every rename (`None`: none applied, or mixed).
    pub fn framework(&self) -> Option<&'static str> {
        let mut common: Option<Vec<&'static str>> = None;
        for (src, _) in &self.applied {
            let fw = ALIASES
                .iter()
                .find(|a| a.source == src.as_str())
                .map(|a| a.frameworks.to_vec())
                .unwrap_or_default();
            common = Some(match common {
                None => fw,
                Some(c) => c.into_iter().filter(|f| fw.contains(f)).collect(),
            });
        }
        common.and_then(|c| c.first().copied())
    }

    /// The one-line note printed on stderr (`None` when no key was renamed).
    pub fn note(&self) -> Option<String> {
        if self.applied.is_empty() {
            return None;
        }
        let who = self.framework().unwrap_or("framework");
        let pairs: Vec<String> = self
            .applied
            .iter()
            .map(|(s, t)| format!("{s} → {t}"))
            .collect();
        Some(format!("input: {who} names ({})", pairs.join(", ")))
    }
}

/// Renames the recognised framework keys of `tensors` to trmask names. A trmask name always
/// wins over nothing; two keys for the same quantity (`old_log_prob` and `old_log_probs`,
/// or `loss_mask` and `response_mask`) are an error naming both.
pub fn apply<T>(tensors: &mut BTreeMap<String, T>, known: &[&str]) -> Result<Renames> {
    let mut by_target: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in tensors.keys() {
        if known.contains(&name.as_str()) {
            by_target
                .entry(name.as_str())
                .or_default()
                .push(name.as_str());
        } else if let Some(al) = ALIASES.iter().find(|a| a.source == name.as_str()) {
            by_target.entry(al.target).or_default().push(al.source);
        }
    }
    for (target, sources) in &by_target {
        if sources.len() > 1 {
            let list: Vec<String> = sources.iter().map(|s| format!("`{s}`")).collect();
            return Err(Error::input(
                *target,
                format!(
                    "is ambiguous: {} {} hold it; keep one (rename or drop the others)",
                    list.join(" and "),
                    if list.len() == 2 { "both" } else { "all" }
                ),
            ));
        }
    }
    let moves: Vec<(String, String)> = by_target
        .iter()
        .filter(|(t, s)| s[0] != **t)
        .map(|(t, s)| (s[0].to_string(), t.to_string()))
        .collect();
    for (src, dst) in &moves {
        if let Some(v) = tensors.remove(src) {
            tensors.insert(dst.clone(), v);
        }
    }
    Ok(Renames { applied: moves })
}

/// Keys of the input that may be what a missing `target` is, each with a word on why
/// (`known`: trmask's own names, never suggested).
pub fn near_misses(target: &str, present: &[String], known: &[&str]) -> Vec<String> {
    let squash = |s: &str| s.to_ascii_lowercase().replace(['_', '-', '.', '/'], "");
    let words: &[&str] = match target {
        "rollout_log_prob" => &["rollout", "sampl", "infer", "behav", "logp", "logprob"],
        "old_log_prob" | "log_prob" => &["old", "train", "logp", "logprob", "prox"],
        "response_mask" => &["mask"],
        "responses" => &["ids", "token", "response", "completion"],
        _ => &[],
    };
    let mut out = Vec::new();
    for name in present {
        if let Some((_, why)) = HINTS.iter().find(|(h, _)| *h == name.as_str()) {
            out.push(format!("found `{name}`: {why}"));
            continue;
        }
        let n = squash(name);
        if known.contains(&name.as_str()) || ALIASES.iter().any(|a| a.source == name.as_str()) {
            continue;
        }
        if words.iter().any(|w| n.contains(w)) || n == squash(target) {
            out.push(format!(
                "found `{name}`: rename it {target} if it holds that quantity"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verl_and_trl_are_named() {
        let mut m: BTreeMap<String, u8> = ["old_log_probs", "rollout_log_probs", "response_mask"]
            .iter()
            .map(|s| (s.to_string(), 0))
            .collect();
        let r = apply(
            &mut m,
            &["old_log_prob", "rollout_log_prob", "response_mask"],
        )
        .unwrap();
        assert_eq!(r.framework(), Some("verl"));
        assert!(m.contains_key("old_log_prob") && m.contains_key("rollout_log_prob"));
        let note = r.note().unwrap();
        assert!(
            note.starts_with("input: verl names (old_log_probs → old_log_prob"),
            "{note}"
        );
        let mut m: BTreeMap<String, u8> = ["sampling_per_token_logps", "completion_mask"]
            .iter()
            .map(|s| (s.to_string(), 0))
            .collect();
        let r = apply(&mut m, &["rollout_log_prob", "response_mask"]).unwrap();
        assert_eq!(r.framework(), Some("TRL"));
    }

    #[test]
    fn two_sources_for_one_tensor_is_an_error_naming_both() {
        let mut m: BTreeMap<String, u8> = ["old_log_prob", "old_log_probs"]
            .iter()
            .map(|s| (s.to_string(), 0))
            .collect();
        let e = apply(&mut m, &["old_log_prob"]).unwrap_err().to_string();
        assert!(
            e.contains("`old_log_prob`") && e.contains("`old_log_probs`"),
            "{e}"
        );
        let hints = near_misses(
            "rollout_log_prob",
            &[
                "old_logprobs".into(),
                "foo".into(),
                "rollout_topk_log_prob".into(),
            ],
            &["rollout_topk_log_prob"],
        );
        assert_eq!(hints.len(), 1);
        assert!(hints[0].contains("AReaL"));
    }
}
