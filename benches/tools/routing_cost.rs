//! What the MoE routing statistics cost on the host, against the rest of an analysis: on a
//! synthetic padded batch (default 64 × 4096 slots, L = 48, K = 8 of 128 experts, ~1% of rows
//! flipped, ~1% unrecorded), best of `--repeat` runs each of
//!
//! * `routing`: `Routing::new` (every id at a valid slot checked, the per-token outputs and
//!   the per-layer counts computed, in one pass),
//! * `analyze`: `analysis::analyze` on the CPU engine with and without the routing tensors.
//!
//! and the bytes of ids read per second, the figure to hold against a host-to-device upload
//! (the question whether a GPU kernel for the routing pass would pay).
//!
//! `cargo run --release --example routing_cost -- [--batch B] [--seq T] [--layers L]
//! [--top-k K] [--experts E] [--repeat N]`

use std::time::Instant;
use trmask::analysis::analyze;
use trmask::cpu::CpuEngine;
use trmask::routing::Routing;
use trmask::{Batch, CorrectionConfig};

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn best(repeat: usize, mut f: impl FnMut()) -> f64 {
    (0..repeat)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let (b, t) = (arg("--batch", 64), arg("--seq", 4096));
    let (l, k, e) = (
        arg("--layers", 48),
        arg("--top-k", 8),
        arg("--experts", 128) as u64,
    );
    let repeat = arg("--repeat", 3);
    let mut rng = Rng(42);
    let mut mask = vec![0.0; b * t];
    for row in 0..b {
        let len = t / 2 + rng.below(t as u64 / 2 + 1) as usize;
        mask[row * t..row * t + len]
            .iter_mut()
            .for_each(|m| *m = 1.0);
    }
    let rows = b * t * l;
    let (mut roll, mut old) = (vec![0i32; rows * k], vec![0i32; rows * k]);
    for r in 0..rows {
        let (start, step) = (rng.below(e), 2 * rng.below(e / 2) + 1);
        let id = |j: u64| ((start + j * step) % e) as i32;
        for j in 0..k {
            roll[r * k + j] = id(j as u64);
            old[r * k + k - 1 - j] = id(j as u64);
        }
        if rng.below(100) == 0 {
            old[r * k + k - 1] = id(k as u64); // one expert differs
        }
        if rng.below(200) == 0 {
            roll[r * k..(r + 1) * k].iter_mut().for_each(|x| *x = -1);
        }
    }
    let lp: Vec<f64> = (0..b * t).map(|i| -1.0 - (i % 97) as f64 / 97.0).collect();
    let lq: Vec<f64> = lp
        .iter()
        .enumerate()
        .map(|(i, x)| x + 1e-3 * ((i % 13) as f64 - 6.0))
        .collect();
    let base = Batch::padded(b, t, &mask)
        .unwrap()
        .with_log_probs("rollout_log_prob", lp)
        .unwrap()
        .with_log_probs("old_log_prob", lq)
        .unwrap();
    let valid: usize = mask.iter().filter(|&&m| m == 1.0).count();
    let m: Vec<bool> = mask.iter().map(|&x| x == 1.0).collect();
    let pos = |i: usize| format!("[{i}]");
    let scan = best(repeat, || {
        std::hint::black_box(Routing::new(&roll, &old, l, k, &m, &pos).unwrap());
    });
    let cfg = CorrectionConfig::default();
    let with = base.clone().with_routed_experts(&roll, &old, l, k).unwrap();
    let (with, base) = (with.build().unwrap(), base.build().unwrap());
    let cpu = CpuEngine::new();
    let a_with = best(repeat, || {
        std::hint::black_box(analyze(&cpu, &with, &cfg).unwrap());
    });
    let a_without = best(repeat, || {
        std::hint::black_box(analyze(&cpu, &base, &cfg).unwrap());
    });
    // ids read: both sides, every slot (padding is skipped but its rows are in the tensors)
    let bytes = (2 * rows * k * 4) as f64;
    println!(
        "{{\"shape\": [{b}, {t}, {l}, {k}], \"experts\": {e}, \"valid_tokens\": {valid}, \
         \"threads\": {}, \"best_of\": {repeat}, \"routing_s\": {scan:.4}, \
         \"analyze_with_routing_s\": {a_with:.4}, \
         \"analyze_without_routing_s\": {a_without:.4}, \"id_bytes\": {bytes}, \
         \"routing_gb_per_s\": {:.2}, \"routing_tokens_per_s\": {:.4e}}}",
        rayon::current_num_threads(),
        bytes / scan / 1e9,
        valid as f64 / scan,
    );
}
