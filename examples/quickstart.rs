//! Quick start: build a padded batch in memory, pick the GPU when there is one, and print the
//! per-sequence mismatch statistics a TRM mask is made of.
//!
//! `cargo run --example quickstart`

use trmask::backend::{open_engine, Backend};
use trmask::Batch;

fn main() -> anyhow::Result<()> {
    // Three responses of lengths 4, 2 and 0 in a [3, 4] padded batch.
    let mask = [1., 1., 1., 1., 1., 1., 0., 0., 0., 0., 0., 0.];
    let rollout = vec![-0.5, -1.2, -0.1, -2.0, -0.7, -0.3, 0., 0., 0., 0., 0., 0.];
    // The trainer agrees on sequence 0 and drifts on sequence 1; padding is garbage.
    let old = vec![
        -0.5,
        -1.2,
        -0.1,
        -2.0,
        -0.2,
        -1.3,
        f64::NAN,
        9.,
        9.,
        9.,
        9.,
        9.,
    ];
    let batch = Batch::padded(3, 4, &mask)?
        .with_log_probs("rollout_log_prob", rollout)?
        .with_log_probs("old_log_prob", old)?
        .build()?;

    let mut notes = Vec::new();
    let engine = open_engine(Backend::Auto, &mut notes)?;
    notes.iter().for_each(|n| eprintln!("{n}"));

    let stats = engine.token_stats(
        batch.rollout_log_prob().unwrap(),
        batch.old_log_prob().unwrap(),
        batch.mask(),
    )?;
    let per_seq = engine.segment_reduce(&[&stats.k2, &stats.k3], batch.segments())?;
    println!("engine: {}", engine.name());
    for s in 0..batch.num_seqs() {
        println!(
            "sequence {s}: length {}, max k2 {:.4e} (TRM-max), mean k3 {:.4e} (TRM-avg)",
            per_seq[0].count[s], per_seq[0].max[s], per_seq[1].mean[s]
        );
    }
    Ok(())
}
