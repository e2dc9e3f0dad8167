#!/usr/bin/env bash
# Mutation testing of the numeric core (docs/TESTING.md). A mutant of the crate itself costs a
# rebuild of trmask (about a minute on 2 cores), so this script copies each pure file into a
# small crate of its own (shims for the few crate types it names) and runs cargo-mutants
# there: a rebuild takes about a second. Only the tests that travel with the copy run (the
# file's own unit tests, and the integration test named below), so the score is a lower bound
# for the crate.
#
#   scripts/dev/mutants.sh math|grammar|cpu|bounds_sums|bounds|topk|vocab [extra cargo-mutants args]
#
# Needs `cargo install cargo-mutants` and python3 (scripts/dev/mutants-extract.py copies the CPU
# halves of tests/conformance/topk.rs and tests/gpu/vocab_divergence.rs). Work directory:
# ${MUTANTS_DIR:-/tmp/trmask-mutants}/NAME (results in its mutants.out/). Set MUTANTS_NICE=19 to
# run at the lowest CPU priority. `vocab` mutates vocab_divergence.rs, vocab_general.rs,
# vocab_fast.rs and vocab_f32.rs; MUTANTS_FILES="vocab_general" (say) limits it to some of
# them, so that two runs in two MUTANTS_DIRs can share the work. cpu/mod.rs (the Engine glue) is not covered.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
name=${1:?usage: scripts/dev/mutants.sh math|grammar|cpu|bounds_sums|bounds|topk|vocab [cargo-mutants args]}
shift
dir=${MUTANTS_DIR:-/tmp/trmask-mutants}/$name
rm -rf "$dir/src" "$dir/tests"
mkdir -p "$dir/src" "$dir/tests"
# logits.rs names wgpu::Buffer for device-resident logits: a shim stands in for wgpu (those
# logits are refused by every CPU entry point)
logits_with_wgpu_shim() {
    sed 's/^use std::sync::Arc;$/use std::sync::Arc;\nuse crate::wgpu;/' "$root/src/input/logits.rs" >"$dir/src/logits.rs"
    cat >>"$dir/src/lib.rs" <<'RS'
pub mod wgpu {
    #[derive(Clone, Debug)]
    pub struct Buffer;
    impl Buffer {
        pub fn size(&self) -> u64 {
            0
        }
        pub fn usage(&self) -> BufferUsages {
            BufferUsages
        }
    }
    pub struct BufferUsages;
    impl BufferUsages {
        pub const STORAGE: BufferUsages = BufferUsages;
        pub fn contains(&self, _: BufferUsages) -> bool {
            false
        }
    }
}
RS
}
manifest() { # crate name, extra manifest text
    printf '[package]\nname = "%s"\nversion = "0.1.0"\nedition = "2021"\n\n%s\n[profile.test]\nopt-level = 1\n' \
        "$1" "${2:-}" >"$dir/Cargo.toml"
}
case $name in
math)
    manifest mh_math
    cp "$root/src/math.rs" "$dir/src/lib.rs"
    args=(-- --lib)
    ;;
grammar)
    manifest mh_grammar
    mkdir -p "$dir/src/config"
    cp "$root/src/error.rs" "$dir/src/error.rs"
    cp "$root/src/config/grammar.rs" "$dir/src/config/grammar.rs"
    cat >"$dir/src/config/types.rs" <<'RS'
#[derive(Clone, Debug, PartialEq)]
pub enum ThresholdSpec {
    Number(f64),
    Text(String),
}
RS
    printf 'pub mod error;\npub mod config {\n    pub mod grammar;\n    pub mod types;\n}\n' >"$dir/src/lib.rs"
    args=(--file src/config/grammar.rs -- --lib)
    ;;
cpu)
    manifest mh_cpu "$(printf '[dependencies]\nrayon = "1"\n')"
    mkdir -p "$dir/src/cpu"
    cp "$root/src/math.rs" "$dir/src/math.rs"
    cp "$root/src/cpu/segment_reduce.rs" "$root/src/cpu/token_stats.rs" "$dir/src/cpu/"
    cat >"$dir/src/lib.rs" <<'RS'
#![allow(dead_code)]
pub mod math;
pub mod cpu {
    pub mod segment_reduce;
    pub mod token_stats;
}
pub mod error {
    pub type Result<T> = std::result::Result<T, String>;
}
pub mod stats {
    pub const SAFETY_BOUND: f64 = 20.0;
    #[derive(Debug)]
    pub struct TokenStats {
        pub log_ratio: Vec<f64>,
        pub rho: Vec<f64>,
        pub k1: Vec<f64>,
        pub k2: Vec<f64>,
        pub k3: Vec<f64>,
        pub abs: Vec<f64>,
        pub ser: Vec<f64>,
    }
    #[derive(Debug)]
    pub struct SegmentStats {
        pub sum: Vec<f64>,
        pub mean: Vec<f64>,
        pub max: Vec<f64>,
        pub min: Vec<f64>,
        pub argmax: Vec<i64>,
        pub count: Vec<u32>,
    }
}
pub mod batch {
    pub struct Segments {
        ranges: Vec<(usize, usize)>,
        mask: Vec<bool>,
    }
    impl Segments {
        pub fn new(ranges: Vec<(usize, usize)>, mask: Vec<bool>) -> crate::error::Result<Self> {
            Ok(Segments { ranges, mask })
        }
        pub fn ranges(&self) -> &[(usize, usize)] {
            &self.ranges
        }
        pub fn mask(&self) -> &[bool] {
            &self.mask
        }
        pub fn len(&self) -> usize {
            self.ranges.len()
        }
    }
}
RS
    # the CPU half of tests/conformance/numeric_rules.rs (the argmax rules)
    cat >"$dir/tests/conformance/numeric_rules.rs" <<'RS'
use mh_cpu::batch::Segments;
use mh_cpu::cpu::segment_reduce::segment_reduce;

#[test]
fn argmax_is_the_first_maximum() {
    let mask = vec![true, true, true, true, false, true, true, true, true, true, true];
    let seg = Segments::new(vec![(0, 4), (4, 8), (8, 11)], mask).unwrap();
    let v = [0.5, 2.0, 1.0, 2.0, 9.0, 5.0, 5.0, -1.0, 3.0, 3.0, 3.0];
    let r = segment_reduce(&v, &seg);
    assert_eq!(r.argmax, vec![1, 1, 0]);
    assert_eq!(r.max, vec![2.0, 5.0, 3.0]);
}

#[test]
fn argmax_of_a_sequence_of_minus_infinity_is_its_first_valid_token() {
    let ninf = f64::NEG_INFINITY;
    let seg = Segments::new(vec![(0, 3), (3, 5)], vec![false, true, true, true, true]).unwrap();
    let r = segment_reduce(&[0.0, ninf, ninf, ninf, 1.0], &seg);
    assert_eq!(r.argmax, vec![1, 1]);
    assert_eq!(r.max, vec![ninf, 1.0]);
    assert_eq!(r.count, vec![2, 2]);
}
RS
    args=(--file src/cpu/segment_reduce.rs --file src/cpu/token_stats.rs -- --lib --tests)
    ;;
bounds_sums | bounds)
    # named trmask so that tests/conformance/bounds.rs compiles unchanged
    manifest trmask "$(printf '[dependencies]\nserde = { version = "1", features = ["derive"] }\n\n[dev-dependencies]\nserde_json = { version = "1", features = ["float_roundtrip"] }\n')"
    cp "$root/Cargo.lock" "$dir/Cargo.lock"
    mkdir -p "$dir/src/bounds"
    cp "$root/src/bounds/formulas.rs" "$root/src/bounds/sums.rs" "$dir/src/bounds/"
    cp "$root/src/error.rs" "$dir/src/"
    cp "$root/tests/conformance/bounds.rs" "$dir/tests/"
    printf 'pub mod bounds {\n    mod formulas;\n    pub use formulas::*;\n    pub(crate) mod sums;\n}\npub mod error;\npub use error::{Error, Result};\n' >"$dir/src/lib.rs"
    file=formulas; [ "$name" = bounds_sums ] && file=sums
    args=(--file "src/bounds/$file.rs" -- --lib --test conformance bounds::)
    ;;
topk)
    # named trmask so that the CPU half of tests/conformance/topk.rs compiles unchanged but for its `use`s
    manifest trmask "$(printf '[dependencies]\nrayon = "1"\nserde = { version = "1", features = ["derive"] }\nmemmap2 = "0.9"\nhalf = "2"\n\n[dev-dependencies]\nsafetensors = "0.6"\n')"
    cp "$root/Cargo.lock" "$dir/Cargo.lock"
    mkdir -p "$dir/src/cpu" "$dir/tests/common"
    ln -sfn "$root/data" "$dir/data"
    for f in error math stats batch support; do cp "$root/src/$f.rs" "$dir/src/"; done
    cp "$root/src/cpu/topk_divergence.rs" "$dir/src/cpu/"
    cat >"$dir/src/lib.rs" <<'RS'
#![allow(dead_code, unused_imports)]
mod batch;
pub mod cpu {
    mod topk_divergence;
    pub use topk_divergence::{topk_divergence, topk_divergence_batch, topk_row, TopkRow};
}
mod error;
mod logits;
mod math;
mod stats;
mod support;
pub use batch::{Batch, Layout, Segments};
pub use error::{Error, Result};
pub use logits::{DType, Logits};
pub mod topk {
    pub use crate::cpu::topk_divergence_batch as topk_divergence;
    pub use crate::stats::{TopkStats, TopkSupport};
    pub use crate::support::{TrainerSupportLogProbs, TrainerTopk};
}
RS
    logits_with_wgpu_shim
    python3 "$root/scripts/dev/mutants-extract.py" "$root/tests/common/mod.rs" --drop trmask::gpu:: --drop std::sync:: \
        --keep Rng --keep seed --keep close --keep assert_close >"$dir/tests/common/mod.rs"
    # the CPU half of tests/conformance/topk.rs: the top-K statistics (not the DPPO masks, not the GPU)
    python3 "$root/scripts/dev/mutants-extract.py" "$root/tests/conformance/topk.rs" --from trmask::gpu::pipeline \
        --drop sign_cases --drop dppo_and_pdm_sign_combinations --drop asymmetric_thresholds \
        --drop empty_batch_metrics_are_zero --drop real_small_masks \
        --replace 'use common::{assert_close, close, gpu, gpu_small_chunks, gpu_with_flavour, seed, Rng};' \
        'use common::{assert_close, close};' \
        --replace 'dppo_mask, topk_divergence, DppoConfig, DppoDirection, TopkDivergence, TopkStats,' \
        'topk_divergence, TopkStats,' \
        --replace 'use trmask::{Batch, DType, Engine, Error, Logits};' 'use trmask::{Batch, DType, Error, Logits};' \
        >"$dir/tests/conformance/topk.rs"
    args=(--file src/cpu/topk_divergence.rs -- --lib --test conformance topk::)
    ;;
vocab)
    # vocab_divergence.rs + vocab_general.rs + vocab_fast.rs, with the CPU half of
    # tests/gpu/vocab_divergence.rs (the f64 references on real logits) through a one-method Engine
    manifest trmask "$(printf '[dependencies]\nrayon = "1"\nserde = { version = "1", features = ["derive"] }\nmemmap2 = "0.9"\nhalf = "2"\n\n[dev-dependencies]\nsafetensors = "0.6"\n')"
    cp "$root/Cargo.lock" "$dir/Cargo.lock"
    mkdir -p "$dir/src/cpu" "$dir/tests/common"
    ln -sfn "$root/data" "$dir/data"
    for f in error math stats; do cp "$root/src/$f.rs" "$dir/src/"; done
    cp "$root/src/cpu/vocab_divergence.rs" "$root/src/cpu/vocab_general.rs" "$root/src/cpu/vocab_fast.rs" \
        "$root/src/cpu/vocab_f32.rs" "$dir/src/cpu/"
    cat >"$dir/src/lib.rs" <<'RS'
#![allow(dead_code, unused_imports)]
mod error;
mod logits;
mod math;
mod stats;
pub use error::{Error, Result};
pub use logits::{DType, Logits};
pub use stats::VocabStats;
/// The one method of trmask's `Engine` that tests/gpu/vocab_divergence.rs's CPU half calls.
pub trait Engine {
    fn name(&self) -> String;
    fn vocab_divergence(
        &self,
        rollout: &Logits,
        train: &Logits,
        responses: Option<&[i64]>,
        mask: &[bool],
        temperature: f64,
    ) -> Result<VocabStats>;
}
pub mod cpu {
    mod vocab_divergence;
    mod vocab_f32;
    mod vocab_fast;
    mod vocab_general;
    pub use vocab_divergence::{vocab_divergence, vocab_divergence_f32};
    use crate::{Logits, Result, VocabStats};
    pub struct CpuEngine {
        fast: bool,
    }
    impl CpuEngine {
        pub fn new() -> Self {
            CpuEngine { fast: false }
        }
        pub fn fast() -> Self {
            CpuEngine { fast: true }
        }
    }
    impl crate::Engine for CpuEngine {
        fn name(&self) -> String {
            "cpu".into()
        }
        fn vocab_divergence(
            &self,
            rollout: &Logits,
            train: &Logits,
            responses: Option<&[i64]>,
            mask: &[bool],
            temperature: f64,
        ) -> Result<VocabStats> {
            if self.fast {
                vocab_divergence_f32(rollout, train, responses, mask, temperature)
            } else {
                vocab_divergence(rollout, train, responses, mask, temperature)
            }
        }
    }
}
RS
    logits_with_wgpu_shim
    python3 "$root/scripts/dev/mutants-extract.py" "$root/tests/common/mod.rs" --drop trmask::gpu:: --drop std::sync:: \
        --keep Rng --keep seed --keep close --keep assert_close >"$dir/tests/common/mod.rs"
    python3 "$root/scripts/dev/mutants-extract.py" "$root/tests/gpu/vocab_divergence.rs" --keep DATA --keep Real --keep f64s \
        --keep i32s --keep logits --keep real --keep fields --keep check_real \
        --keep cpu_matches_float64_references --keep gpu_tol --keep normal --keep encode --keep Case \
        --keep case --keep compare --keep run_case --keep DTYPES --keep half_ulp \
        --keep cpu_fast_matches_float64_references_at_the_gpu_tolerance \
        --keep cpu_fast_matches_cpu_on_random_batches_every_dtype_pair \
        --keep random_batches_every_dtype_pair --keep cpu_fast_matches_cpu_on_large_vocabularies \
        --keep large_vocabularies --keep cpu_fast_handles_extreme_magnitudes_temperature_and_identical_inputs \
        --keep extreme_magnitudes_temperature_and_identical_inputs \
        --keep cpu_fast_infinite_divergences_and_errors_match_cpu --keep infinite_divergences_and_errors \
        --keep cpu_fast_resolves_a_1e_7_kl_next_to_logits_of_100 >"$dir/tests/gpu/vocab_divergence.rs"
    files=(vocab_divergence vocab_general vocab_fast vocab_f32)
    [ -n "${MUTANTS_FILES:-}" ] && read -ra files <<<"$MUTANTS_FILES"
    args=()
    for f in "${files[@]}"; do args+=(--file "src/cpu/$f.rs"); done
    args+=(-- --lib --test gpu vocab_divergence::)
    ;;
*)
    echo "unknown set '$name' (math, grammar, cpu, bounds_sums, bounds, topk, vocab)" >&2
    exit 2
    ;;
esac
cd "$dir"
# With the kernel's autogroup scheduling (sched_autogroup_enabled = 1, the default on many
# distributions) a nice value only ranks processes within one session: a niced run in its own
# session still takes half the cores from a benchmark in another. So a niced run gets a
# session of its own whose autogroup is niced too (Ctrl-C then does not reach it: use kill).
if [ -n "${MUTANTS_NICE:-}" ] && [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)" = 1 ]; then
    exec setsid bash -c 'echo "$0" >/proc/self/autogroup 2>/dev/null; exec nice -n "$0" "$@"' \
        "$MUTANTS_NICE" cargo mutants --in-place --timeout 60 "$@" "${args[@]}"
fi
exec nice -n "${MUTANTS_NICE:-0}" cargo mutants --in-place --timeout 60 "$@" "${args[@]}"
