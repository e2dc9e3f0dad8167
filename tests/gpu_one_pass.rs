//! The one-pass vocabulary kernel: rows it certifies in one read and rows it must read again
//! (its ill-conditioning test) both match the f64 reference at SPEC §9 tolerance, and the
//! fallback is counted. One test per binary, so the process-wide counters see only it.

mod common;
use common::{gpu, Rng};
use trmask::cpu::CpuEngine;
use trmask::gpu::vocab_pass_counts;
use trmask::{Engine, Logits};

fn normal(rng: &mut Rng) -> f64 {
    let (u, v) = (rng.f64().max(1e-300), rng.f64());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

fn check(engine: &dyn Engine, a: &[f32], b: &[f32], rows: usize, vocab: usize) {
    let (la, lb) = (
        Logits::from_f32(a, rows, vocab).unwrap(),
        Logits::from_f32(b, rows, vocab).unwrap(),
    );
    let ids: Vec<i64> = (0..rows).map(|r| ((r * 977) % vocab) as i64).collect();
    let mask = vec![true; rows];
    let g = engine
        .vocab_divergence(&la, &lb, Some(&ids), &mask, 1.0)
        .unwrap();
    let c = CpuEngine::new()
        .vocab_divergence(&la, &lb, Some(&ids), &mask, 1.0)
        .unwrap();
    for r in 0..rows {
        for (what, x, y) in [
            ("kl", g.kl[r], c.kl[r]),
            ("kl_rev", g.kl_rev[r], c.kl_rev[r]),
            ("tv", g.tv[r], c.tv[r]),
            ("h_p", g.rollout_entropy[r], c.rollout_entropy[r]),
            ("h_q", g.training_entropy[r], c.training_entropy[r]),
        ] {
            assert!(
                (x - y).abs() <= 2e-3 * y.abs() + 1e-7,
                "row {r} {what}: gpu {x:e} vs f64 {y:e}"
            );
        }
        for (x, y) in [
            (g.rollout_logp[r], c.rollout_logp[r]),
            (g.train_logp[r], c.train_logp[r]),
        ] {
            assert!(
                (x - y).abs() <= 2e-3 * y.abs() + 1e-5,
                "row {r} logp {x} vs {y}"
            );
        }
    }
}

#[test]
fn one_pass_rows_and_fallback_rows_match_the_reference() {
    let Some(engine) = gpu() else { return };
    let (rows, vocab) = (12usize, 2000usize);
    let mut rng = Rng::new(common::seed(41));

    // Rows that fit in the kernel's first block (2048 entries at the default workgroup size):
    // a close pair, trainer = rollout + 0.05·N; the one pass must certify them.
    let mut a = vec![0f32; rows * vocab];
    let mut b = vec![0f32; rows * vocab];
    for r in 0..rows {
        for i in 0..vocab {
            let x = 3.0 * normal(&mut rng);
            a[r * vocab + i] = x as f32;
            b[r * vocab + i] = (x + 0.05 * normal(&mut rng)) as f32;
        }
    }
    let before = vocab_pass_counts();
    check(engine.as_ref(), &a, &b, rows, vocab);
    let close = vocab_pass_counts();
    assert_eq!(close.rows - before.rows, rows as u64);
    let close_second = close.second - before.second;
    assert!(
        close_second < rows as u64,
        "every close row needed a second read ({close_second} of {rows})"
    );

    // Rows whose first block misleads: its entries carry little mass and a log-ratio shifted
    // by 3 (plus a −inf entry), so the block's centre is off by ~3 for the row's mass and the
    // certificate must send every such row through the second pass.
    let vocab = 6000;
    let mut a = vec![0f32; rows * vocab];
    let mut b = vec![0f32; rows * vocab];
    for r in 0..rows {
        for i in 0..vocab {
            let x = 3.0 * normal(&mut rng);
            let (x, y) = if i < 2048 {
                (x - 25.0, x - 25.0 - 3.0 + 0.05 * normal(&mut rng))
            } else {
                (x, x + 0.05 * normal(&mut rng))
            };
            a[r * vocab + i] = x as f32;
            b[r * vocab + i] = y as f32;
        }
        a[r * vocab + 17] = f32::NEG_INFINITY;
        b[r * vocab + 17] = f32::NEG_INFINITY;
    }
    check(engine.as_ref(), &a, &b, rows, vocab);
    let shifted = vocab_pass_counts();
    assert_eq!(
        shifted.second - close.second,
        rows as u64,
        "the ill-conditioning test let a misleading block through"
    );
    // logit scale 100 (near one-hot rows), the same two kinds
    for x in a.iter_mut().chain(b.iter_mut()) {
        *x *= 100.0 / 3.0;
    }
    check(engine.as_ref(), &a, &b, rows, vocab);
}
