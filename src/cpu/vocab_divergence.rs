//! Exact vocabulary divergences from full logits, f64, cancellation-free, parallel over rows.
//!
//! With `a = rollout/τ`, `b = train/τ`, `p = softmax(a)`, `q = softmax(b)`, `δ = a − b` and
//! `z = E_p[δ] − δ`: `KL(p‖q) = log1p(E_p[expm1(z) − z] + E_p[z]) − E_p[z] − log1p(−Q_out)`
//! (`Q_out` = q's mass where p = 0),
//! `p − q = −p·expm1(z − KL)`, so `TV = ½ E_p|expm1(z − KL)|`. No first-order cancellation
//! anywhere, so KLs of 1e-15 survive logits of magnitude 100.

use super::token_stats::k3_from_log_ratio;
use crate::batch::Logits;
use crate::engine::VocabStats;
use crate::error::{Error, Result};
use rayon::prelude::*;

/// One row's results: `(kl, kl_rev, tv, h_p, h_q, logp_y, logq_y)`.
type Row = (f64, f64, f64, f64, f64, f64, f64);

/// Per-token exact divergences (see [`VocabStats`]); invalid slots hold 0.
pub fn vocab_divergence(
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<VocabStats> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::config(
            "temperature",
            format!("{temperature} must be finite and > 0"),
        ));
    }
    if rollout.vocab() != train.vocab()
        || rollout.rows() != train.rows()
        || rollout.rows() != mask.len()
    {
        return Err(Error::input(
            "old_logits",
            format!(
                "shape [{}, {}] does not match rollout_logits [{}, {}] / {} slots",
                train.rows(),
                train.vocab(),
                rollout.rows(),
                rollout.vocab(),
                mask.len()
            ),
        ));
    }
    let v = rollout.vocab();
    let inv_t = 1.0 / temperature;
    let rows: Vec<Result<Row>> = (0..mask.len())
        .into_par_iter()
        .map_init(
            || (vec![0f64; v], vec![0f64; v]),
            |(a, b), r| {
                if !mask[r] {
                    return Ok((0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0));
                }
                rollout.row_f64(r, a);
                train.row_f64(r, b);
                for (name, x) in [("rollout_logits", &mut *a), ("old_logits", &mut *b)] {
                    for (i, e) in x.iter_mut().enumerate() {
                        if e.is_nan() || *e == f64::INFINITY {
                            return Err(Error::input(
                                name,
                                format!("value {e} at row {r}, column {i}"),
                            ));
                        }
                        *e *= inv_t;
                    }
                }
                let y = responses.map(|ids| ids[r] as usize);
                row(a, b, y).map_err(|(name, what)| Error::input(name, format!("row {r}: {what}")))
            },
        )
        .collect();
    let n = mask.len();
    let mut s = VocabStats {
        kl: vec![0.0; n],
        kl_rev: vec![0.0; n],
        tv: vec![0.0; n],
        rollout_entropy: vec![0.0; n],
        training_entropy: vec![0.0; n],
        rollout_logp: vec![0.0; n],
        train_logp: vec![0.0; n],
    };
    for (r, res) in rows.into_iter().enumerate() {
        let (kl, kr, tv, hp, hq, lp, lq) = res?;
        s.kl[r] = kl;
        s.kl_rev[r] = kr;
        s.tv[r] = tv;
        s.rollout_entropy[r] = hp;
        s.training_entropy[r] = hq;
        s.rollout_logp[r] = lp;
        s.train_logp[r] = lq;
    }
    Ok(s)
}

/// Log-partition pieces of one row: `(max, Σ e^{x−max})`.
fn lse(x: &[f64]) -> (f64, f64) {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s = x.iter().map(|&e| (e - m).exp()).sum();
    (m, s)
}

/// KL(p‖q) and TV with p = softmax(a), q = softmax(b), given p's normaliser. Returns
/// `(kl, tv, entropy_p)`.
fn directed(a: &[f64], b: &[f64], ma: f64, sa: f64) -> (f64, f64, f64) {
    let lsa = sa.ln();
    // Centre δ on its value at p's mode so that E_p[δ] carries no large constant.
    let mode = a.iter().position(|&x| x == ma).unwrap_or(0);
    let c = a[mode] - b[mode];
    // E_p[δ − c] over the support of p; p_i > 0 and q_i = 0 gives KL = ∞.
    let mut e_delta = 0.0;
    let mut e_a = 0.0;
    let mut infinite = false;
    for (&ai, &bi) in a.iter().zip(b) {
        if ai == f64::NEG_INFINITY {
            continue;
        }
        let p = (ai - ma).exp() / sa;
        e_a += p * (ai - ma);
        if bi == f64::NEG_INFINITY {
            infinite = true;
            continue;
        }
        e_delta += p * ((ai - bi) - c);
    }
    let entropy = lsa - e_a;
    if infinite {
        return (f64::INFINITY, f64::NAN, entropy);
    }
    let mut e_w = 0.0; // E_p[expm1(z) − z]
    let mut e_z = 0.0;
    for (&ai, &bi) in a.iter().zip(b) {
        if ai == f64::NEG_INFINITY {
            continue;
        }
        let p = (ai - ma).exp() / sa;
        let z = e_delta - ((ai - bi) - c);
        e_w += p * k3_from_log_ratio(z);
        e_z += p * z;
    }
    // q's mass where p = 0: it enters the normaliser ratio and the TV.
    let q_outside: f64 = {
        let (mb, sb) = lse(b);
        a.iter()
            .zip(b)
            .filter(|(&ai, _)| ai == f64::NEG_INFINITY)
            .map(|(_, &bi)| (bi - mb).exp() / sb)
            .sum()
    };
    let x = e_w + e_z;
    let kl = (x.ln_1p() - e_z - (-q_outside).ln_1p()).max(0.0);
    let mut tv = 0.0;
    for (&ai, &bi) in a.iter().zip(b) {
        if ai == f64::NEG_INFINITY {
            continue;
        }
        let p = (ai - ma).exp() / sa;
        let z = e_delta - ((ai - bi) - c);
        tv += p * (z - kl).exp_m1().abs();
    }
    (kl, 0.5 * (tv + q_outside), entropy)
}

fn row(a: &[f64], b: &[f64], y: Option<usize>) -> std::result::Result<Row, (&'static str, String)> {
    let (ma, sa) = lse(a);
    let (mb, sb) = lse(b);
    if ma == f64::NEG_INFINITY {
        return Err(("rollout_logits", "every entry is -inf".into()));
    }
    if mb == f64::NEG_INFINITY {
        return Err(("old_logits", "every entry is -inf".into()));
    }
    let (kl, tv, hp) = directed(a, b, ma, sa);
    let (kl_rev, _, hq) = directed(b, a, mb, sb);
    let tv = if tv.is_nan() {
        directed(b, a, mb, sb).1
    } else {
        tv
    };
    let (lp, lq) = match y {
        Some(y) => (a[y] - ma - sa.ln(), b[y] - mb - sb.ln()),
        None => (0.0, 0.0),
    };
    Ok((kl, kl_rev, tv, hp, hq, lp, lq))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(a: &[f32], b: &[f32], v: usize) -> VocabStats {
        let rows = a.len() / v;
        let la = Logits::from_f32(a, rows, v).unwrap();
        let lb = Logits::from_f32(b, rows, v).unwrap();
        vocab_divergence(&la, &lb, None, &vec![true; rows], 1.0).unwrap()
    }

    #[test]
    fn closed_forms() {
        // KL(p‖p) = 0, shift invariance
        let a = [1.0f32, 2.0, 3.0, -1.0];
        let b = [101.0f32, 102.0, 103.0, 99.0];
        let s = stats(&a, &b, 4);
        assert!(s.kl[0].abs() < 1e-15 && s.tv[0].abs() < 1e-15 && s.kl_rev[0].abs() < 1e-15);
        // KL(one-hot ‖ uniform) = log V ; entropy of uniform = log V
        let a = [
            0.0f32,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
        ];
        let b = [5.0f32; 4];
        let s = stats(&a, &b, 4);
        assert!((s.kl[0] - 4f64.ln()).abs() < 1e-14);
        assert!((s.training_entropy[0] - 4f64.ln()).abs() < 1e-14);
        assert_eq!(s.rollout_entropy[0], 0.0);
        assert!((s.tv[0] - 0.75).abs() < 1e-15);
        assert_eq!(s.kl_rev[0], f64::INFINITY);
    }

    #[test]
    fn matches_naive_on_moderate_values() {
        let a = [0.3f32, -1.2, 2.0, 0.7, 0.0];
        let b = [0.1f32, -1.0, 2.5, 0.2, 0.4];
        let s = stats(&a, &b, 5);
        let sm = |x: &[f32]| {
            let z: f64 = x.iter().map(|&e| (e as f64).exp()).sum();
            x.iter().map(|&e| (e as f64).exp() / z).collect::<Vec<_>>()
        };
        let (p, q) = (sm(&a), sm(&b));
        let kl: f64 = p.iter().zip(&q).map(|(p, q)| p * (p / q).ln()).sum();
        let kr: f64 = p.iter().zip(&q).map(|(p, q)| q * (q / p).ln()).sum();
        let tv: f64 = 0.5 * p.iter().zip(&q).map(|(p, q)| (p - q).abs()).sum::<f64>();
        let h: f64 = -p.iter().map(|p| p * p.ln()).sum::<f64>();
        assert!((s.kl[0] - kl).abs() < 1e-14, "{} {}", s.kl[0], kl);
        assert!((s.kl_rev[0] - kr).abs() < 1e-14);
        assert!((s.tv[0] - tv).abs() < 1e-14);
        assert!((s.rollout_entropy[0] - h).abs() < 1e-14);
    }
}
