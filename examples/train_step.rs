//! A training step as a Rust RL stack writes it: the trainer's own f32 log-probs and bool
//! response mask go in borrowed, once per step; the modified mask and IS weights come out and
//! weight a token-mean policy-gradient loss.
//!
//! `cargo run --example train_step`

use trmask::backend::{open_engine, Backend};
use trmask::{CorrectionConfig, Corrector, Step};

/// A toy step: `b` responses of up to `t` tokens; the trainer drifts by `drift` on odd rows.
fn fake_step(b: usize, t: usize, drift: f32, seed: u32) -> (Vec<f32>, Vec<f32>, Vec<bool>) {
    let mut x = seed;
    let mut rnd = || {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (x >> 8) as f32 / (1u32 << 24) as f32
    };
    let (mut roll, mut old, mut mask) = (vec![], vec![], vec![]);
    for row in 0..b {
        let len = t / 2 + (row * 7) % (t / 2);
        for col in 0..t {
            let lp = -3.0 * rnd();
            let noise = 0.02 * (rnd() - 0.5) + if row % 2 == 1 { drift * rnd() } else { 0.0 };
            roll.push(lp);
            old.push(lp + noise);
            mask.push(col < len);
        }
    }
    (roll, old, mask)
}

fn main() -> anyhow::Result<()> {
    let mut notes = Vec::new();
    let engine = open_engine(Backend::Auto, &mut notes)?;
    notes.iter().for_each(|n| eprintln!("{n}"));
    // Once, at start-up: TRM-avg (seq_mean_k3 ≤ 0.01) with token-level TIS, checked here.
    let config = CorrectionConfig::preset("decoupled_k3_rs_token_tis")?;
    let corrector = Corrector::new(engine, &config)?;
    println!("engine: {}", corrector.engine().name());

    let (b, t) = (8, 64);
    for step in 0..3 {
        let (roll, old, mask) = fake_step(b, t, 0.4 * step as f32, 17 + step);
        let advantages: Vec<f32> = (0..b * t)
            .map(|i| if (i / t) % 3 == 0 { 1.0 } else { -0.5 })
            .collect();
        let out = corrector.correct(
            &Step::padded(b, t)
                .response_mask(&mask[..])
                .rollout_log_prob(&roll[..])
                .old_log_prob(&old[..]),
        )?;
        // loss = −Σ w·mask·A·logπ / Σ mask (token-mean over tokens that survive rejection)
        let keep = out.mask_f32();
        let w = out.weights_f32().expect("the preset has token IS");
        let denom: f32 = keep.iter().sum::<f32>().max(1.0);
        let loss: f32 = (0..b * t)
            .map(|i| -w[i] * keep[i] * advantages[i] * old[i])
            .sum::<f32>()
            / denom;
        let accepted = out.seq_accept.iter().filter(|&&a| a).count();
        println!(
            "step {step}: accepted {accepted}/{b} sequences, {} of {} tokens kept, \
             mean IS weight {:.4}, loss {loss:.4}",
            denom as usize,
            mask.iter().filter(|&&m| m).count(),
            out.metrics["rollout_corr/rollout_is_mean"],
        );
    }
    Ok(())
}
