//! The one table of input tensor names: every tensor a batch may hold, with its role, its
//! shape relative to the batch layout, the dtypes read, and the framework keys that hold it.
//!
//! Every name list of the crate and of the Python package (the file reader's known names, the
//! per-token tensors, framework renames and near-miss hints, the Python-side role of each
//! argument) is derived from [`TENSORS`]; a test checks that no other list of tensor names
//! exists in `src/` or `python/`.
//!
//! ```
//! use trmask::tensors::{spec, Role, Shape};
//! let s = spec("old_log_prob").unwrap();
//! assert_eq!((s.role, s.shape), (Role::Values, Shape::Token));
//! assert!(s.aliases.iter().any(|a| a.source == "old_log_probs")); // verl's key
//! ```

/// How a tensor is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Floating-point values (f64, f32, f16, bf16), read in their own dtype.
    Values,
    /// The response mask: bool or 0/1 numbers.
    Mask,
    /// Integers (token ids, offsets, group ids).
    Ids,
    /// Full logits `[.., V]` (f32, f16, bf16), never widened as a whole.
    Logits,
}

impl Role {
    /// The role's name on the Python side (`values`, `mask`, `ids`, `logits`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Values => "values",
            Role::Mask => "mask",
            Role::Ids => "ids",
            Role::Logits => "logits",
        }
    }
}

/// A tensor's shape relative to the batch's token shape (`[B, T]` padded, `[N]` packed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One value per token slot.
    Token,
    /// One value per token slot, or (advantages, TRL) one per sequence, broadcast over it.
    TokenOrSeq,
    /// The token shape plus a trailing K axis (the rollout top-K).
    TokenK,
    /// The token shape plus a trailing vocabulary axis.
    TokenV,
    /// The token shape plus trailing `[L, K]` axes (MoE routing: L layers, top-K experts).
    TokenLK,
    /// One value per sequence (`[B]` or `[S]`).
    Seq,
    /// `S + 1` offsets (the packed layout).
    Offsets,
    /// A flat 1-D list of any length, sliced by a [`Shape::KeptOffsets`] tensor (the kept ids
    /// of every valid token, CSR values).
    Flat,
    /// CSR offsets into a [`Shape::Flat`] tensor: one span per valid token (valid tokens + 1
    /// values) or one per token slot (slots + 1; spans at padding are ignored).
    KeptOffsets,
}

/// One framework key for a tensor.
#[derive(Clone, Copy, Debug)]
pub struct Alias {
    /// The key as the framework writes it.
    pub source: &'static str,
    /// The frameworks that use this key for this quantity.
    pub frameworks: &'static [&'static str],
}

/// One input tensor.
#[derive(Clone, Copy, Debug)]
pub struct TensorSpec {
    /// The trmask name (verl's where verl has one).
    pub name: &'static str,
    pub role: Role,
    pub shape: Shape,
    /// The dtypes read in place (others are an error, or converted by the Python package).
    pub dtypes: &'static [&'static str],
    /// The framework keys renamed to [`name`](Self::name) when a batch is read.
    pub aliases: &'static [Alias],
    /// Fragments of other keys that may be this tensor (for the missing-tensor hint).
    pub hint_words: &'static [&'static str],
    /// What the tensor holds, for error messages and docs.
    pub about: &'static str,
}

const fn al(source: &'static str, frameworks: &'static [&'static str]) -> Alias {
    Alias { source, frameworks }
}

const FLOATS: &[&str] = &["f64", "f32", "f16", "bf16"];
const MASKS: &[&str] = &["bool", "u8", "i64", "f32", "f64"];
const IDS: &[&str] = &["i64", "i32"];
const LOGITS: &[&str] = &["f32", "f16", "bf16"];
const EXPERT_IDS: &[&str] = &["i64", "i32", "i16", "i8", "u8"];
const ROUTING_WORDS: &[&str] = &["routed", "expert", "routing"];
const LOGP_WORDS: &[&str] = &["old", "train", "logp", "logprob", "prox"];

// Framework sources of the aliases below: verl — verl/trainer/ppo/ray_trainer.py
// (`_compute_old_log_prob`: "old_log_probs"; `compute_response_mask`: "responses",
// "response_mask") and verl/trainer/ppo/rollout_corr_helper.py
// (batch.batch["rollout_log_probs"]). slime — slime/ray/rollout.py (train_data
// ["rollout_log_probs"], ["loss_masks"]) and slime/backends/megatron_utils/loss.py
// (old_log_probs = batch["log_probs"]). SkyRL — skyrl-train/skyrl_train/training_batch.py
// (`TrainingInput.rollout_logprobs`, `.loss_mask`) and skyrl_train/trainer.py
// (training_input["action_log_probs"], the trainer recompute). TRL — trl/trainer/grpo_trainer.py
// (`_generate_and_score_completions`: "old_per_token_logps", "sampling_per_token_logps",
// "completion_mask", "completion_ids"). prime-rl — src/prime_rl/trainer/rl/loss.py
// (`LossInputs.inference_logprobs`, `.trainer_logprobs`, `.loss_mask`). AReaL is deliberately
// absent: its `old_logprobs` is the *rollout* log-prob, the opposite of verl's "old" (a hint
// in `io::names`, never a rename). TRL writes per-sequence advantages [B] under verl's name.
// Kept sets (a truncated sampler's surviving ids per token, CSR): slime — slime/utils/types.py
// (`Sample.rollout_top_p_token_ids`, `.rollout_top_p_token_offsets`: one span per response
// token) and slime/backends/megatron_utils/loss.py (`ROLLOUT_TOP_P_TOKEN_KEYS`); vLLM —
// vllm/v1/outputs.py (`SamplingMaskLists.token_ids`, `.offsets`, the CSR form of a completion's
// `sampling_mask`; vLLM writes no file, so its keys carry the `sampling_mask_` prefix). miles
// (slime's fork) writes trmask's own names. prime-rl (src/prime_rl/trainer, 2026-08) has no
// kept-set tensor, so none of its keys is listed.
// Routed experts `[.., L, K]`: slime — slime/utils/types.py (`Sample.rollout_routed_experts`)
// and slime/backends/megatron_utils (the R3 replay reads `rollout_routed_experts`); vLLM —
// vllm/outputs.py (`CompletionOutput.routed_experts`, `[tokens, L, K]`), which SkyRL and
// NeMo-RL pass through under the same key (the rollout side: they replay it, the trainer's own
// choice has no framework key). docs/RECIPES.md cites the commits.

/// Every input tensor, in the order the reader and the error messages use.
pub const TENSORS: [TensorSpec; 16] = [
    TensorSpec {
        name: "rollout_log_prob",
        role: Role::Values,
        shape: Shape::Token,
        dtypes: FLOATS,
        aliases: &[
            al("rollout_log_probs", &["verl", "slime", "SkyRL"]),
            al("sampling_per_token_logps", &["TRL"]),
            al("inference_logprobs", &["prime-rl"]),
            al("rollout_logprobs", &["SkyRL"]),
        ],
        hint_words: &["rollout", "sampl", "infer", "behav", "logp", "logprob"],
        about: "log π_roll of each sampled token",
    },
    TensorSpec {
        name: "old_log_prob",
        role: Role::Values,
        shape: Shape::Token,
        dtypes: FLOATS,
        aliases: &[
            al("old_log_probs", &["verl"]),
            al("old_per_token_logps", &["TRL"]),
            al("action_log_probs", &["SkyRL"]),
            al("log_probs", &["slime"]),
        ],
        hint_words: LOGP_WORDS,
        about: "log π_train of each sampled token (the trainer's recompute)",
    },
    TensorSpec {
        name: "log_prob",
        role: Role::Values,
        shape: Shape::Token,
        dtypes: FLOATS,
        aliases: &[al("trainer_logprobs", &["prime-rl"])],
        hint_words: LOGP_WORDS,
        about: "log π_θ of each sampled token (the current policy, bypass mode)",
    },
    TensorSpec {
        name: "responses",
        role: Role::Ids,
        shape: Shape::Token,
        dtypes: IDS,
        aliases: &[al("completion_ids", &["TRL"])],
        hint_words: &["ids", "token", "response", "completion"],
        about: "sampled token ids",
    },
    TensorSpec {
        name: "response_mask",
        role: Role::Mask,
        shape: Shape::Token,
        dtypes: MASKS,
        aliases: &[
            al("completion_mask", &["TRL"]),
            al("loss_mask", &["prime-rl", "SkyRL"]),
            al("loss_masks", &["slime"]),
        ],
        hint_words: &["mask"],
        about: "1 at valid tokens, 0 at padding (padded layout)",
    },
    TensorSpec {
        name: "advantages",
        role: Role::Values,
        shape: Shape::TokenOrSeq,
        dtypes: FLOATS,
        aliases: &[al(
            "advantages",
            &["verl", "TRL", "prime-rl", "SkyRL", "slime"],
        )],
        hint_words: &[],
        about: "per-token advantages (per-sequence [B] broadcast)",
    },
    TensorSpec {
        name: "cu_seqlens",
        role: Role::Ids,
        shape: Shape::Offsets,
        dtypes: IDS,
        aliases: &[],
        hint_words: &[],
        about: "sequence offsets of a packed batch",
    },
    TensorSpec {
        name: "uid",
        role: Role::Ids,
        shape: Shape::Seq,
        dtypes: IDS,
        aliases: &[],
        hint_words: &[],
        about: "per-sequence GRPO group id",
    },
    TensorSpec {
        name: "rollout_topk_ids",
        role: Role::Ids,
        shape: Shape::TokenK,
        dtypes: IDS,
        aliases: &[],
        hint_words: &[],
        about: "the rollout's top-K token ids",
    },
    TensorSpec {
        name: "rollout_topk_log_prob",
        role: Role::Values,
        shape: Shape::TokenK,
        dtypes: FLOATS,
        aliases: &[],
        hint_words: &[],
        about: "the rollout's top-K log-probs",
    },
    TensorSpec {
        name: "rollout_sampling_mask_ids",
        role: Role::Ids,
        shape: Shape::Flat,
        dtypes: IDS,
        aliases: &[
            al("rollout_top_p_token_ids", &["slime"]),
            al("sampling_mask_token_ids", &["vLLM"]),
        ],
        hint_words: &["sampling_mask", "top_p", "kept"],
        about: "the ids a truncated sampler kept at each valid token, concatenated (CSR values)",
    },
    TensorSpec {
        name: "rollout_sampling_mask_offsets",
        role: Role::Ids,
        shape: Shape::KeptOffsets,
        dtypes: IDS,
        aliases: &[
            al("rollout_top_p_token_offsets", &["slime"]),
            al("sampling_mask_offsets", &["vLLM"]),
        ],
        hint_words: &["sampling_mask", "top_p", "kept"],
        about: "CSR offsets of the kept ids: one span per valid token (or per token slot)",
    },
    TensorSpec {
        name: "rollout_logits",
        role: Role::Logits,
        shape: Shape::TokenV,
        dtypes: LOGITS,
        aliases: &[],
        hint_words: &[],
        about: "the rollout's full logits",
    },
    TensorSpec {
        name: "old_logits",
        role: Role::Logits,
        shape: Shape::TokenV,
        dtypes: LOGITS,
        aliases: &[],
        hint_words: &[],
        about: "the trainer's full logits",
    },
    TensorSpec {
        name: "rollout_routed_experts",
        role: Role::Ids,
        shape: Shape::TokenLK,
        dtypes: EXPERT_IDS,
        aliases: &[
            al("rollout_routed_experts", &["slime"]),
            al("routed_experts", &["vLLM", "SkyRL", "NeMo-RL"]),
        ],
        hint_words: ROUTING_WORDS,
        about: "the experts the rollout engine routed each token to, per MoE layer (-1: not \
                recorded)",
    },
    TensorSpec {
        name: "old_routed_experts",
        role: Role::Ids,
        shape: Shape::TokenLK,
        dtypes: EXPERT_IDS,
        aliases: &[],
        hint_words: ROUTING_WORDS,
        about: "the experts the trainer's own router chose for each token, per MoE layer, \
                without routing replay (-1: not recorded)",
    },
];

/// Argument names of the Python functions for a batch tensor (`vocab_divergence(rollout_logits,
/// trainer_logits)`), `(argument, trmask name)`; never renamed in a file.
pub const PYTHON_NAMES: [(&str, &str); 1] = [("trainer_logits", "old_logits")];

/// The spec of `name` (a trmask name, not an alias).
pub fn spec(name: &str) -> Option<&'static TensorSpec> {
    TENSORS.iter().find(|t| t.name == name)
}

/// The trmask names of a batch, in table order.
pub fn batch_names() -> impl Iterator<Item = &'static str> {
    TENSORS.iter().map(|t| t.name)
}

/// The names whose spec satisfies `f`, in table order.
pub fn names_where(f: impl Fn(&TensorSpec) -> bool) -> Vec<&'static str> {
    TENSORS.iter().filter(|t| f(t)).map(|t| t.name).collect()
}

/// The per-token floating-point tensors (log-probs and advantages), in table order.
pub fn per_token_values() -> Vec<&'static str> {
    names_where(|t| t.role == Role::Values && matches!(t.shape, Shape::Token | Shape::TokenOrSeq))
}

/// The per-token log-prob tensors (per-token values without advantages).
pub fn log_prob_names() -> Vec<&'static str> {
    names_where(|t| t.role == Role::Values && t.shape == Shape::Token)
}

/// The per-token tensors that fix a batch's token shape, in the order they are consulted
/// (log-probs, ids, then the mask; not TRL's possibly per-sequence advantages).
pub fn token_shape_sources() -> Vec<&'static str> {
    names_where(|t| t.shape == Shape::Token)
}

/// The logits tensors of a batch.
pub fn logits_names() -> Vec<&'static str> {
    names_where(|t| t.role == Role::Logits)
}

/// The MoE routing tensors (`[.., L, K]`): the rollout's and the trainer's routed experts.
pub fn routing_names() -> Vec<&'static str> {
    names_where(|t| t.shape == Shape::TokenLK)
}

/// Every `(framework key, trmask name, frameworks)` rename, in table order.
pub fn aliases() -> impl Iterator<Item = (&'static Alias, &'static str)> {
    TENSORS
        .iter()
        .flat_map(|t| t.aliases.iter().map(move |a| (a, t.name)))
}

/// The key `framework` writes for the trmask tensor `target`, from the aliases (`None`: the
/// table lists none).
pub fn alias_of(framework: &str, target: &str) -> Option<&'static str> {
    aliases()
        .find(|(a, t)| *t == target && a.frameworks.contains(&framework))
        .map(|(a, _)| a.source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for t in &TENSORS {
            assert!(seen.insert(t.name), "{} twice", t.name);
        }
        let mut src = std::collections::BTreeSet::new();
        for (a, target) in aliases() {
            assert!(src.insert(a.source), "alias {} twice", a.source);
            assert!(a.source == target || spec(a.source).is_none());
        }
        assert_eq!(
            per_token_values(),
            ["rollout_log_prob", "old_log_prob", "log_prob", "advantages"]
        );
        assert_eq!(logits_names(), ["rollout_logits", "old_logits"]);
        assert_eq!(
            names_where(|t| matches!(t.shape, Shape::Flat | Shape::KeptOffsets)),
            ["rollout_sampling_mask_ids", "rollout_sampling_mask_offsets"]
        );
        assert_eq!(
            routing_names(),
            [crate::input::routing::ROLLOUT, crate::input::routing::OLD]
        );
    }
}
