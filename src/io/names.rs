//! Framework tensor names → trmask names.
//!
//! A dump written straight from a trainer's batch carries that framework's keys. The renames
//! come from the tensor table ([`crate::input::tensors::TENSORS`]: each tensor lists the framework
//! keys that hold it, with the framework source they were read in). AReaL is deliberately
//! absent: its `old_logprobs` is the *rollout* (behaviour) log-prob, the opposite of verl's and
//! TRL's "old", so it is only ever suggested, never mapped.

use crate::error::{Error, Result};
use crate::input::tensors::{self, Alias};
use std::collections::BTreeMap;

/// The alias `source` and the trmask name it maps to.
fn alias(source: &str) -> Option<(&'static Alias, &'static str)> {
    tensors::aliases().find(|(a, _)| a.source == source)
}

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
    /// The trainer dump format the input was read as (prime-rl's token export, NeMo-RL's
    /// train data), with what was read: the note then names it.
    pub format: Option<String>,
}

impl Renames {
    /// The framework whose keys explain every rename (`None`: none applied, or mixed).
    pub fn framework(&self) -> Option<&'static str> {
        let mut common: Option<Vec<&'static str>> = None;
        for (src, _) in &self.applied {
            let fw = alias(src)
                .map(|(a, _)| a.frameworks.to_vec())
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
        let pairs: Vec<String> = self
            .applied
            .iter()
            .map(|(s, t)| format!("{s} → {t}"))
            .collect();
        if let Some(f) = &self.format {
            return Some(format!("input: {f}; read as {}", pairs.join(", ")));
        }
        if self.applied.is_empty() {
            return None;
        }
        let who = self.framework().unwrap_or("framework");
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
        } else if let Some((al, target)) = alias(name) {
            by_target.entry(target).or_default().push(al.source);
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
    Ok(Renames {
        applied: moves,
        format: None,
    })
}

/// Keys of the input that may be what a missing `target` is, each with a word on why
/// (`known`: trmask's own names, never suggested).
pub fn near_misses(target: &str, present: &[String], known: &[&str]) -> Vec<String> {
    let squash = |s: &str| s.to_ascii_lowercase().replace(['_', '-', '.', '/'], "");
    let words: &[&str] = tensors::spec(target).map_or(&[], |t| t.hint_words);
    let mut out = Vec::new();
    for name in present {
        if let Some((_, why)) = HINTS.iter().find(|(h, _)| *h == name.as_str()) {
            out.push(format!("found `{name}`: {why}"));
            continue;
        }
        let n = squash(name);
        if known.contains(&name.as_str()) || alias(name).is_some() {
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
