//! Exact vocabulary divergences from full logits, f64, cancellation-free, parallel over rows.
//!
//! With `a = rollout/τ`, `b = train/τ`, `p = softmax(a)`, `q = softmax(b)` and `d = a − b`,
//! every row is reduced around a shift `c = c1 + c2` (`c1` = d at p's mode over the common
//! support, `c2 = E_p[d − c1]`), `u = d − c`:
//!
//! * `E_p[e^{−u}] = 1 + x` with `x = W − U − P_out` (`U = E_p[u] ≈ 0`,
//!   `W = E_p[w(u)]`, `w(u) = expm1(−u) + u ≥ 0`, `P_out` = p's mass where q = 0), and
//!   `KL(p‖q) = U + log1p(x) − log1p(−Q_out) = W + (log1p(x) − x) − log1p(−Q_out)`
//!   (`Q_out` = q's mass where p = 0, `−log1p(−Q_out)` by a log-sum-exp over the common support
//!   when `Q_out > ½`, where the plain sums underflow for ±1e4 logits; KL = ∞ when p > 0
//!   somewhere q = 0). Every term is second
//!   order in the mismatch, so KLs of 1e-15 survive logits of magnitude 100. Elements with
//!   `u < −30` (where `e^{−u}` would dominate) are summed in log space, so ±1e4 logits neither
//!   overflow nor lose the small-KL accuracy of the rest.
//! * `log q_i − log p_i = −u_i − λ` with `λ = log1p(x) − log1p(−Q_out)`, so
//!   `TV = ½(Σ p_i |expm1(−u_i − λ)| + P_out + Q_out)`.
//! * The same with the roles swapped gives `KL(q‖p)`; entropies are `log s − E_p[a − max a]`
//!   with `log s = log1p(Σ_{i≠mode} e^{a_i − max a})`.
//!
//! Rows without −∞ entries take a fast path (`vocab_fast.rs`): decode, a vectorised min/max, a
//! vectorised exp map (two exps per element pair), one fused branch-free pass for every sum
//! (`w(u)` by its series or as `q·K − p + p·u`, so nothing overflows) and one pass for TV
//! with the exact λ; an AVX2 + FMA build is picked at run time. Other rows take
//! the general path: four streaming passes, log-space extremes, LSE fallbacks. The GPU kernel
//! (`shaders/vocab_divergence.wgsl`) uses the same decomposition in f32.

use super::vocab_f32::{row_fast32, Scratch32};
use super::vocab_fast::row_fast;
use super::vocab_general::{decode_scaled, row_general, row_general_src, Row, RowSrc, Scratch};
use crate::error::{Error, Result};
use crate::input::logits::Logits;
use crate::input::tensors;
use crate::stats::VocabStats;
use rayon::prelude::*;

/// Checks the temperature, the shapes and the sampled ids shared by the CPU and GPU paths.
pub(crate) fn check_inputs(
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<()> {
    crate::config::check_temperature("temperature", temperature)?;
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
    if let Some(ids) = responses {
        if ids.len() != mask.len() {
            return Err(Error::input(
                "responses",
                format!("{} ids for {} slots", ids.len(), mask.len()),
            ));
        }
        let v = rollout.vocab() as i64;
        if let Some(r) = (0..mask.len()).find(|&r| mask[r] && !(0..v).contains(&ids[r])) {
            return Err(Error::input(
                "responses",
                format!(
                    "id {} at slot {r} is outside the vocabulary [0, {v})",
                    ids[r]
                ),
            ));
        }
        if let Some(r) = crate::input::logits::impossible_sample(rollout, ids, mask) {
            return Err(Error::input(
                "responses",
                format!(
                    "token id {} at slot {r} has rollout logit -inf: zero probability under \
                     the policy that sampled it",
                    ids[r]
                ),
            ));
        }
    }
    Ok(())
}

/// The first NaN / +inf of row `r` (for error messages): `(column, value)`.
pub(crate) fn first_bad(l: &Logits, r: usize) -> Option<(usize, f32)> {
    let b = l.row_bytes(r);
    (0..l.vocab())
        .map(|i| (i, l.dtype().decode(b, i)))
        .find(|(_, e)| e.is_nan() || *e == f32::INFINITY)
}

/// Per-token exact divergences (see [`VocabStats`]); invalid slots hold 0.
pub fn vocab_divergence(
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<VocabStats> {
    vocab_divergence_at(rollout, train, responses, mask, temperature, false)
}

/// [`vocab_divergence`] at the `cpu-fast` precision: rows without −∞ entries in f32
/// (`vocab_f32.rs`, the GPU engine's tolerance), the others on the f64 path.
pub fn vocab_divergence_f32(
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<VocabStats> {
    vocab_divergence_at(rollout, train, responses, mask, temperature, true)
}

fn vocab_divergence_at(
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
    fast: bool,
) -> Result<VocabStats> {
    check_inputs(rollout, train, responses, mask, temperature)?;
    let v = rollout.vocab();
    let inv_t = 1.0 / temperature;
    let rows: Vec<Result<Row>> = (0..mask.len())
        .into_par_iter()
        .map(|r| {
            if !mask[r] {
                return Ok((0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0));
            }
            let y = responses.map(|ids| ids[r] as usize);
            if fast && v <= ROW_BLOCK {
                if let Some(row) = row_f32(rollout, train, r, inv_t, y)? {
                    return Ok(row);
                }
            }
            SCRATCH.with(|cell| {
                let sc = &mut *cell.borrow_mut();
                row_of(sc, rollout, train, r, inv_t, y, ROW_BLOCK.min(v))
            })
        })
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

/// Rows longer than this many elements are read in blocks of it (the general path, a few
/// reads of the row): per-thread scratch stays at `32 B × ROW_BLOCK` = 16 MiB whatever the
/// vocabulary. Every real vocabulary (≤ 262,208 today) fits in one block and takes the fast
/// path when it has no −∞ entries.
pub(crate) const ROW_BLOCK: usize = 1 << 19;

thread_local! {
    /// Per-thread row buffers, reused across rows and calls (no allocation or page faults per
    /// row; 4 f64 rows of at most [`ROW_BLOCK`] elements per thread stay allocated).
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::new(0));
    /// The same for the `cpu-fast` precision (4 f32 rows of at most [`ROW_BLOCK`] elements).
    static SCRATCH32: std::cell::RefCell<Scratch32> = std::cell::RefCell::new(Scratch32::new(0));
}

/// One row at the `cpu-fast` precision; `Ok(None)` when the row needs the f64 path.
fn row_f32(
    rollout: &Logits,
    train: &Logits,
    r: usize,
    inv_t: f64,
    y: Option<usize>,
) -> Result<Option<Row>> {
    SCRATCH32.with(|cell| {
        let sc = &mut *cell.borrow_mut();
        if let Err(name) = sc.decode(rollout, train, r) {
            let l = if name == "old_logits" { train } else { rollout };
            return Err(bad_value(name, l, r));
        }
        Ok(row_fast32(sc, inv_t, y))
    })
}

/// The one-line error for a row of `l` that holds NaN or +∞.
fn bad_value(name: &str, l: &Logits, r: usize) -> Error {
    let (i, e) = first_bad(l, r).unwrap_or((0, f32::NAN));
    Error::input(name, format!("value {e} at row {r}, column {i}"))
}

/// One row's results, with the scratch sized to `block` elements: the whole row decoded and
/// the fast path when it fits (`block == V`), else the general path over blocks.
fn row_of(
    sc: &mut Scratch,
    rollout: &Logits,
    train: &Logits,
    r: usize,
    inv_t: f64,
    y: Option<usize>,
    block: usize,
) -> Result<Row> {
    if sc.a.len() != block {
        *sc = Scratch::new(block);
    }
    for (name, l) in tensors::logits_names().into_iter().zip([rollout, train]) {
        let bad = if block == l.vocab() {
            let out = if name == "old_logits" {
                &mut sc.b
            } else {
                &mut sc.a
            };
            (!decode_scaled(l, r, out, inv_t)).then(|| first_bad(l, r).unwrap_or((0, f32::NAN)))
        } else {
            first_bad(l, r) // a row read in blocks: one scan, which also gives the message
        };
        if let Some((i, e)) = bad {
            return Err(Error::input(
                name,
                format!("value {e} at row {r}, column {i}"),
            ));
        }
    }
    let res = if block == rollout.vocab() {
        match row_fast(sc, y) {
            Some(x) => Ok(x),
            None => row_general(sc, y),
        }
    } else {
        row_general_src(&mut RowSrc::blocked(sc, rollout, train, r, inv_t), y)
    };
    res.map_err(|(name, what)| Error::input(name, format!("row {r}: {what}")))
}

#[cfg(test)]
mod tests {
    use super::super::vocab_fast::{exp_neg, row_fast};
    use super::super::vocab_general::{row_general, Scratch};
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

    /// Uniform in [0, 1) from an xorshift state.
    fn uniform(mut seed: u64) -> impl FnMut() -> f64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn fast_path_matches_general_path() {
        let mut rnd = uniform(0x1234_5678_9abc_def1);
        for (v, scale, noise, ninf) in [
            (1000usize, 1.0, 0.05, 0.0),
            (4099, 3.0, 0.01, 0.05),
            (257, 30.0, 0.3, 0.1),
            (5000, 1.0, 1e-4, 0.0),
            (100, 0.1, 2.0, 0.2),
            (2, 1.0, 0.5, 0.0),
            // no −∞ and a large mismatch: the modes differ (K ≠ 1) and most |u| ≥ 0.1
            (600, 1.0, 1.5, 0.0),
        ] {
            let mut sc = Scratch::new(v);
            for i in 0..v {
                let x = (rnd() - 0.5) * 6.0 * scale;
                sc.a[i] = x;
                sc.b[i] = x + (rnd() - 0.5) * noise * scale + 0.37;
                if i > 1 && rnd() < ninf {
                    sc.a[i] = f64::NEG_INFINITY;
                    if rnd() < 0.7 {
                        sc.b[i] = f64::NEG_INFINITY;
                    }
                }
            }
            let Some(fast) = row_fast(&mut sc, Some(1)) else {
                assert!(ninf > 0.0, "V={v}: no fast path");
                continue;
            };
            let slow = row_general(&mut sc, Some(1)).unwrap();
            let f = [fast.0, fast.1, fast.2, fast.3, fast.4, fast.5, fast.6];
            let g = [slow.0, slow.1, slow.2, slow.3, slow.4, slow.5, slow.6];
            for k in 0..7 {
                if g[k].is_infinite() {
                    assert_eq!(f[k], g[k], "V={v} field {k}");
                } else {
                    let err = (f[k] - g[k]).abs();
                    assert!(
                        err <= 1e-11 * g[k].abs() + 1e-15,
                        "V={v} field {k}: fast {:e} general {:e}",
                        f[k],
                        g[k]
                    );
                }
            }
        }
        // a 1e-6 mismatch (KL ~ 1e-13): the fast path keeps it to 1e-9 relative (w(u) by its
        // series, u centred at the mode; the closed form p·e^{−u} − p + p·u would cancel)
        let v = 1000;
        let mut sc = Scratch::new(v);
        for i in 0..v {
            sc.a[i] = (rnd() - 0.5) * 6.0;
            sc.b[i] = sc.a[i] + (rnd() - 0.5) * 1e-6 + 0.37;
        }
        let fast = row_fast(&mut sc, None).unwrap();
        let slow = row_general(&mut sc, None).unwrap();
        for (f, g) in [(fast.0, slow.0), (fast.1, slow.1)] {
            assert!(
                g > 1e-15 && (f - g).abs() <= 1e-9 * g,
                "fast {f:e} general {g:e}"
            );
        }
        // exp_neg against std
        for i in 0..9_900 {
            let x = -(i as f64) * 0.0713;
            let (e, r) = (exp_neg::<false>(x), x.exp());
            assert!((e - r).abs() <= 1e-14 * r, "{x}: {e} vs {r}");
        }
        assert_eq!(exp_neg::<false>(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg::<false>(0.0), 1.0);
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

    #[test]
    fn rows_read_in_blocks_give_the_whole_row_results_bit_for_bit() {
        // the general path over blocks of any length equals the whole-row general path exactly
        // (same operations, same order), −∞ entries, scale and temperature included
        let mut rnd = uniform(0x0dd_ba11_5eed);
        for (v, scale, ninf, t) in [
            (1000usize, 1.0, 0.0, 1.0),
            (777, 30.0, 0.2, 0.7),
            (64, 1e3, 0.5, 1.0),
            (5, 1.0, 0.0, 2.0),
        ] {
            let (mut a, mut b) = (vec![0f32; 2 * v], vec![0f32; 2 * v]);
            for i in 0..2 * v {
                a[i] = ((rnd() - 0.5) * scale) as f32;
                b[i] = a[i] + ((rnd() - 0.5) * 0.1 * scale) as f32;
                if i % v > 0 && rnd() < ninf {
                    a[i] = f32::NEG_INFINITY;
                }
                if i % v > 0 && rnd() < ninf {
                    b[i] = f32::NEG_INFINITY;
                }
            }
            let la = Logits::from_f32(&a, 2, v).unwrap();
            let lb = Logits::from_f32(&b, 2, v).unwrap();
            for r in 0..2 {
                let mut sc = Scratch::new(v);
                assert!(decode_scaled(&la, r, &mut sc.a, 1.0 / t));
                assert!(decode_scaled(&lb, r, &mut sc.b, 1.0 / t));
                let whole = row_general(&mut sc, Some(0)).unwrap();
                for block in [1, 3, v / 2 + 1, v - 1] {
                    let mut sc = Scratch::new(0);
                    let got = row_of(&mut sc, &la, &lb, r, 1.0 / t, Some(0), block).unwrap();
                    assert_eq!(sc.a.len(), block, "scratch sized by the block, not V");
                    let (g, w) = (format!("{got:?}"), format!("{whole:?}"));
                    assert_eq!(g, w, "V={v} row {r} block {block}");
                }
            }
        }
        // a NaN in a row read in blocks is the same one-line error
        let mut a = vec![0.5f32; 40];
        a[33] = f32::NAN;
        let la = Logits::from_f32(&a, 1, 40).unwrap();
        let lb = Logits::from_f32(&[0.25f32; 40], 1, 40).unwrap();
        let e = row_of(&mut Scratch::new(0), &la, &lb, 0, 1.0, None, 8).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid input `rollout_logits`: value NaN at row 0, column 33"
        );
    }

    /// The tensor or key each bad input is named by (`check_inputs`, shared with the GPU).
    #[test]
    fn bad_inputs_name_the_tensor() {
        let l = |rows: usize, v: usize| Logits::from_f32(&vec![0.5; rows * v], rows, v).unwrap();
        let who = |e: Error| match e {
            Error::InvalidInput { tensor, .. } => tensor,
            Error::InvalidConfig { key, .. } => key,
            other => panic!("{other:?}"),
        };
        let (a, b) = (l(2, 3), l(2, 3));
        let m = [true, false];
        for t in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = vocab_divergence(&a, &b, None, &m, t).unwrap_err();
            assert_eq!(who(e), "temperature", "τ = {t}");
        }
        assert!(vocab_divergence(&a, &b, None, &m, 1e-3).is_ok());
        for (x, y, mask) in [
            (l(2, 3), l(2, 4), &m[..]),
            (l(2, 3), l(3, 3), &m[..]),
            (l(3, 3), l(2, 3), &m[..]),
            (l(2, 3), l(2, 3), &[true][..]),
        ] {
            let e = vocab_divergence(&x, &y, None, mask, 1.0).unwrap_err();
            assert_eq!(who(e), "old_logits");
        }
        // responses: one id per slot, inside the vocabulary at valid slots (any id at masked
        // ones), and not at a rollout logit of −∞
        let ok = |ids: &[i64]| vocab_divergence(&a, &b, Some(ids), &m, 1.0);
        assert!(ok(&[2, -5]).is_ok());
        for ids in [&[0][..], &[0, 0, 0], &[3, 0], &[-1, 0]] {
            assert_eq!(who(ok(ids).unwrap_err()), "responses", "{ids:?}");
        }
        let ninf = Logits::from_f32(&[0.0, f32::NEG_INFINITY, 0.0, 0.0, 0.0, 0.0], 2, 3).unwrap();
        let e = vocab_divergence(&ninf, &b, Some(&[1, 0]), &m, 1.0).unwrap_err();
        assert_eq!(who(e), "responses");
        // a row that is −∞ everywhere, with −∞ first or not
        for row in [
            [f32::NEG_INFINITY; 3],
            [0.5, f32::NEG_INFINITY, f32::NEG_INFINITY],
        ] {
            let all = [row[0], row[1], row[2], 0.0, 0.0, 0.0];
            let none = Logits::from_f32(&[f32::NEG_INFINITY; 6], 2, 3).unwrap();
            let l = Logits::from_f32(&all, 2, 3).unwrap();
            let e = vocab_divergence(&none, &l, None, &m, 1.0).unwrap_err();
            assert_eq!(who(e.clone()), "rollout_logits", "{e}");
            assert!(e.to_string().contains("every entry is -inf"), "{e}");
            let e = vocab_divergence(&l, &none, None, &m, 1.0).unwrap_err();
            let first = if row[0].is_finite() {
                "old_logits"
            } else {
                "rollout_logits"
            };
            assert_eq!(who(e), first);
        }
    }

    /// Disjoint supports (no token finite on both sides): both KLs ∞ and TV 1, whichever side
    /// has its −∞ entries first.
    #[test]
    fn disjoint_supports_are_infinitely_apart() {
        let ninf = f32::NEG_INFINITY;
        for (a, b) in [
            ([ninf, 0.0, 1.0, ninf], [2.0, ninf, ninf, 0.5]),
            ([0.0, ninf, ninf, 1.0], [ninf, 2.0, 0.5, ninf]),
        ] {
            let s = stats(&a, &b, 4);
            assert_eq!(
                (s.kl[0], s.kl_rev[0], s.tv[0]),
                (f64::INFINITY, f64::INFINITY, 1.0)
            );
            let sm = |x: &[f32]| {
                let z: f64 = x.iter().map(|&e| (e as f64).exp()).sum();
                x.iter()
                    .filter(|e| e.is_finite())
                    .map(|&e| {
                        let p = (e as f64).exp() / z;
                        -p * p.ln()
                    })
                    .sum::<f64>()
            };
            assert!((s.rollout_entropy[0] - sm(&a)).abs() < 1e-15);
            assert!((s.training_entropy[0] - sm(&b)).abs() < 1e-15);
        }
    }

    /// Logits are divided by the temperature: τ = 2 on x equals τ = 1 on x/2 (exact halves).
    #[test]
    fn the_temperature_divides_the_logits() {
        let a = [0.3f32, -1.2, 2.0, 0.7, 0.0];
        let b = [0.1f32, -1.0, 2.5, 0.2, 0.4];
        let half = |x: &[f32]| x.iter().map(|v| v / 2.0).collect::<Vec<f32>>();
        let run = |x: &[f32], y: &[f32], t: f64| {
            let (lx, ly) = (
                Logits::from_f32(x, 1, 5).unwrap(),
                Logits::from_f32(y, 1, 5).unwrap(),
            );
            vocab_divergence(&lx, &ly, Some(&[2]), &[true], t).unwrap()
        };
        let (hot, cold) = (run(&a, &b, 2.0), run(&half(&a), &half(&b), 1.0));
        assert_eq!(format!("{hot:?}"), format!("{cold:?}"));
        assert!(hot.kl[0] < run(&a, &b, 1.0).kl[0]);
    }

    /// A row on the general path (a −∞ entry) with an element 40 nats more likely under the
    /// trainer than under the rollout (`u < −30`: summed in log space) against the naive sums.
    #[test]
    fn extreme_elements_match_the_naive_sums() {
        let a = [0.3f32, -35.0, 2.0, 0.7, f32::NEG_INFINITY];
        let b = [0.1f32, 5.0, 2.5, 0.2, 0.4];
        let s = stats(&a, &b, 5);
        let sm = |x: &[f32]| {
            let z: f64 = x.iter().map(|&e| (e as f64).exp()).sum();
            x.iter().map(|&e| (e as f64).exp() / z).collect::<Vec<_>>()
        };
        let (p, q) = (sm(&a), sm(&b));
        let kl: f64 = p
            .iter()
            .zip(&q)
            .filter(|(p, _)| **p > 0.0)
            .map(|(p, q)| p * (p / q).ln())
            .sum();
        let tv: f64 = 0.5 * p.iter().zip(&q).map(|(p, q)| (p - q).abs()).sum::<f64>();
        let hq: f64 = -q.iter().map(|q| q * q.ln()).sum::<f64>();
        assert!((s.kl[0] - kl).abs() < 1e-14 * kl, "{} {kl}", s.kl[0]);
        assert!((s.tv[0] - tv).abs() < 1e-14, "{} {tv}", s.tv[0]);
        assert!((s.training_entropy[0] - hq).abs() < 1e-14);
        assert_eq!(s.kl_rev[0], f64::INFINITY);
        // the rollout's mass where the trainer's logit is −∞ (KL = ∞): TV and the reverse KL
        let (a, b) = (b, [0.1f32, f32::NEG_INFINITY, 2.5, 0.2, 0.4]);
        let s = stats(&a, &b, 5);
        let (p, q) = (sm(&a), sm(&b));
        let kr: f64 = q
            .iter()
            .zip(&p)
            .filter(|(q, _)| **q > 0.0)
            .map(|(q, p)| q * (q / p).ln())
            .sum();
        let tv: f64 = 0.5 * p.iter().zip(&q).map(|(p, q)| (p - q).abs()).sum::<f64>();
        assert_eq!(s.kl[0], f64::INFINITY);
        assert!(
            (s.kl_rev[0] - kr).abs() < 1e-14 * kr,
            "{} {kr}",
            s.kl_rev[0]
        );
        assert!((s.tv[0] - tv).abs() < 1e-14, "{} {tv}", s.tv[0]);
        // the extreme element off the trainer's mode (its weight ≠ 1), 40 and 700 nats (past
        // e^600: the log-space branch of λ) likelier under the trainer
        for lo in [-38.0f32, -700.0] {
            let a = [0.3f32, lo, 2.0, 0.7, f32::NEG_INFINITY];
            let b = [0.1f32, 2.0, 2.5, 0.2, 0.4];
            let s = stats(&a, &b, 5);
            let (p, q) = (sm(&a), sm(&b));
            let kl: f64 = p
                .iter()
                .zip(&q)
                .filter(|(p, _)| **p > 0.0)
                .map(|(p, q)| p * (p / q).ln())
                .sum();
            let tv: f64 = 0.5 * p.iter().zip(&q).map(|(p, q)| (p - q).abs()).sum::<f64>();
            assert!((s.kl[0] - kl).abs() < 1e-13 * kl, "{lo}: {} {kl}", s.kl[0]);
            assert!((s.tv[0] - tv).abs() < 1e-14, "{lo}: {} {tv}", s.tv[0]);
        }
        // 1e4-scale logits, the trainer giving the rollout's mode e^−700: a closed form
        let s = stats(&[0.0, -1e4, f32::NEG_INFINITY], &[-700.0, 0.0, 0.0], 3);
        let kl = 700.0 + 2f64.ln(); // p = (1, e^−1e4, 0), q = (e^−700/2, 1/2, 1/2)
        assert!((s.kl[0] - kl).abs() < 1e-13 * kl, "{} {kl}", s.kl[0]);
        assert!((s.tv[0] - 1.0).abs() < 1e-15, "{}", s.tv[0]);
    }

    /// `ln Σ e^x` around the maximum, f64.
    fn lse(x: &[f64]) -> f64 {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        m + x.iter().map(|&e| (e - m).exp()).sum::<f64>().ln()
    }

    /// `KL(softmax a ‖ softmax b)` from logits (log-probabilities from log-sum-exps, the
    /// log-ratio from the logit differences; terms summed smallest first), skipping a = −∞.
    fn kl_logits(a: &[f64], b: &[f64]) -> f64 {
        let (za, zb) = (lse(a), lse(b));
        let mut t: Vec<f64> = a
            .iter()
            .zip(b)
            .filter(|(x, _)| x.is_finite())
            .map(|(&x, &z)| (x - za).exp() * ((x - z) - (za - zb)))
            .collect();
        t.sort_by(|x, y| x.abs().total_cmp(&y.abs()));
        t.iter().sum()
    }

    /// Elements just past the log-space cut (`u` a little below −30): their sums `Σ p·u` and
    /// `Σ p` move the KL by ~1e-12 relative, so they are checked against a reference accurate
    /// to ~1e-15 (log-probabilities from log-sum-exps, the log-ratio from the logit
    /// differences) at 2e-14 relative, in both directions.
    #[test]
    fn elements_just_past_the_cut_keep_their_sums() {
        for k in 0..12 {
            let lo = -27.0 - 0.4 * k as f64;
            let a = [0.3f32, lo as f32, 2.0, 0.7, f32::NEG_INFINITY];
            let b = [0.1f32, 2.0, 2.5, 0.2, 0.4];
            let (a64, b64) = (a.map(|x| x as f64), b.map(|x| x as f64));
            let s = stats(&a, &b, 5);
            let want = kl_logits(&a64, &b64);
            assert!(
                (s.kl[0] - want).abs() <= 2e-14 * want,
                "lo {lo}: kl {:e} vs {want:e} ({:e} relative)",
                s.kl[0],
                (s.kl[0] - want) / want
            );
            // the reverse direction: the trainer's extreme element
            let s = stats(&b, &a, 5);
            assert_eq!(s.kl[0], f64::INFINITY);
            let want = kl_logits(&a64, &b64);
            assert!(
                (s.kl_rev[0] - want).abs() <= 2e-14 * want,
                "lo {lo}: kl_rev {:e} vs {want:e}",
                s.kl_rev[0]
            );
        }
    }

    /// More than half of one side's mass outside the other's support takes `−log(mass inside)`
    /// from a log-sum-exp over the common support pivoted at its maximum; a common support
    /// spanning 1000 nats overflows around any other pivot. Both directions.
    #[test]
    fn the_common_support_pivot_is_its_maximum() {
        let ninf = f32::NEG_INFINITY;
        for (a, b) in [
            // the common support's first and last elements 1000 nats below its maximum
            (
                [-1000.0f32, 5.0, 1.0, -999.0],
                [-1000.0, ninf, 0.5, -1000.0],
            ),
            (
                [-998.0f32, 0.3, -1000.0, 5.0],
                [-1000.0, -0.4, -1000.0, ninf],
            ),
            // the maximum outside the common support, 1000 nats above it: a pivot taken
            // outside the common support underflows every term
            (
                [-1000.0f32, 5.0, -998.0, -999.0],
                [-1000.0, ninf, 0.5, -1000.0],
            ),
        ] {
            let (a64, b64) = (a.map(|x| x as f64), b.map(|x| x as f64));
            let s = stats(&a, &b, 4);
            assert_eq!(s.kl[0], f64::INFINITY);
            let want = kl_logits(&b64, &a64);
            assert!(
                (s.kl_rev[0] - want).abs() <= 1e-13 * want,
                "{a:?} {b:?}: kl_rev {:e} vs {want:e}",
                s.kl_rev[0]
            );
            // the roles swapped: the trainer's mass outside the rollout's support
            let s = stats(&b, &a, 4);
            assert_eq!(s.kl_rev[0], f64::INFINITY);
            assert!(
                (s.kl[0] - want).abs() <= 1e-13 * want,
                "{b:?} {a:?}: kl {:e} vs {want:e}",
                s.kl[0]
            );
        }
    }

    #[test]
    fn a_small_extreme_mass_takes_the_second_order_form_with_its_extreme_sums() {
        // the trainer puts ~10 % of its mass on an element the rollout gives e^-40: that
        // element is "extreme" (u < -30) but E_p[e^-u] - 1 stays below 1/2, so the KL is
        // W + (log1p(x) - x) with the extreme sums inside x (their signs matter at 1e-1); a
        // column that is -inf on both sides sends the row to the general path
        let sm = |x: &[f32]| {
            let m = x.iter().fold(f64::NEG_INFINITY, |m, &e| m.max(e as f64));
            let z: f64 = x.iter().map(|&e| (e as f64 - m).exp()).sum();
            x.iter()
                .map(|&e| (e as f64 - m) - z.ln())
                .collect::<Vec<_>>()
        };
        let ni = f32::NEG_INFINITY;
        for (a, b) in [
            ([0.0f32, 0.0, -40.0, ni], [0.0f32, 0.0, -1.5, ni]),
            ([0.3f32, -0.2, -45.0, ni], [0.1f32, 0.0, -2.5, ni]),
            ([1.0f32, 0.5, -60.0, ni], [1.2f32, 0.4, -1.0, ni]),
            // the first finite entries 800 below the modes: the shift must be the maximum
            // (e^{800} overflows), found wherever it is
            ([-800.0f32, 0.5, 1.0, ni], [-790.0f32, 0.4, 1.2, ni]),
            ([-800.0f32, 1.0, 0.5, ni], [-805.0f32, 1.2, 0.4, ni]),
        ] {
            let s = stats(&a, &b, 4);
            let (lp, lq) = (sm(&a), sm(&b));
            let kl: f64 = (0..3).map(|i| lp[i].exp() * (lp[i] - lq[i])).sum();
            let kr: f64 = (0..3).map(|i| lq[i].exp() * (lq[i] - lp[i])).sum();
            let mut sc = Scratch::new(4);
            for i in 0..4 {
                (sc.a[i], sc.b[i]) = (a[i] as f64, b[i] as f64);
            }
            assert!(row_fast(&mut sc, None).is_none(), "the general path");
            assert!(
                (s.kl[0] - kl).abs() <= 1e-13 * kl,
                "{a:?}: {} vs {kl}",
                s.kl[0]
            );
            assert!(
                (s.kl_rev[0] - kr).abs() <= 1e-13 * kr,
                "{a:?}: {} vs {kr}",
                s.kl_rev[0]
            );
            let hp: f64 = -(0..3).map(|i| lp[i].exp() * lp[i]).sum::<f64>();
            let hq: f64 = -(0..3).map(|i| lq[i].exp() * lq[i]).sum::<f64>();
            assert!(
                (s.rollout_entropy[0] - hp).abs() <= 1e-13 * hp,
                "{a:?}: entropy"
            );
            assert!(
                (s.training_entropy[0] - hq).abs() <= 1e-13 * hq,
                "{a:?}: entropy"
            );
        }
    }

    #[test]
    fn general_path_shifts_keep_a_tiny_kl_next_to_an_offset_and_an_outlier() {
        // the trainer's logits are the rollout's + 50 (+ 1e-6 noise): KL ~ 1e-13, resolvable
        // only if u is centred at d's value at p's mode over the common support (not at the
        // first entry, an outlier 10 nats off, nor at a + b); a -inf column on both sides
        // sends the row to the general path
        let ni = f32::NEG_INFINITY;
        let v = 64;
        let mut a = vec![0f32; v];
        let mut b = vec![0f32; v];
        for i in 0..v {
            a[i] = ((i * 37) % 17) as f32 * 0.25 - 2.0;
            b[i] = a[i] + 50.0 + if i % 3 == 0 { 4e-6 } else { -4e-6 };
        }
        (a[0], b[0]) = (-30.0, 30.0); // d = -60 (the others: -50)
        (a[v - 1], b[v - 1]) = (ni, ni);
        let s = stats(&a, &b, v);
        // reference: u = d + 50 is exact in f64, KL = E_p[u] + log1p(E_p[expm1(-u)])
        let m = a.iter().fold(f64::NEG_INFINITY, |m, &e| m.max(e as f64));
        let za = m
            + (0..v - 1)
                .map(|i| (a[i] as f64 - m).exp())
                .sum::<f64>()
                .ln();
        let (mut uu, mut xx) = (0.0, 0.0);
        for i in 0..v - 1 {
            let p = (a[i] as f64 - za).exp();
            let u = (a[i] as f64 - b[i] as f64) + 50.0;
            uu += p * u;
            xx += p * (-u).exp_m1();
        }
        let kl = uu + xx.ln_1p();
        assert!(kl > 0.0 && kl < 1e-9, "{kl}");
        assert!((s.kl[0] - kl).abs() <= 1e-6 * kl, "{} vs {kl}", s.kl[0]);
    }
}
