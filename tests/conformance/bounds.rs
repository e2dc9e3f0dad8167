//! Bounds of docs/FORMAT.md (Bound certificate) and the LN-TRM / SER certificates: the spec's check values, filling of
//! missing inputs, validation, and a brute-force cross-check of every sum.

use trmask::bounds::{
    self, compute, lntrm_score, lntrm_weights, ser_score, BoundInputs, Bounds, Dbar,
    UNIFIED_CANDIDATES,
};
use trmask::Error;

fn rel_close(got: f64, want: f64, rtol: f64) -> bool {
    if want == 0.0 {
        got.abs() <= rtol
    } else {
        ((got - want) / want).abs() <= rtol
    }
}

#[track_caller]
fn assert_rel(got: f64, want: f64, rtol: f64, what: &str) {
    assert!(
        rel_close(got, want, rtol),
        "{what}: got {got:e}, want {want:e} (rtol {rtol:e})"
    );
}

fn spec_inputs() -> BoundInputs {
    BoundInputs {
        horizon: 4096,
        delta: 1e-4,
        eps: Some(5e-3),
        kl_seq: Some(0.01),
        tv_seq: Some(0.05),
        dbar: None,
    }
}

#[test]
fn spec_classical_kl() {
    let b = compute(&BoundInputs::new(4096, 1e-4)).unwrap();
    assert_rel(b.classical_kl, 1677.312, 1e-9, "classical_kl");
    // ε filled by Pinsker: the TV form equals the KL form.
    assert_rel(b.classical_tv, b.classical_kl, 1e-12, "classical_tv");
}

#[test]
fn spec_unified_and_components() {
    let b = compute(&spec_inputs()).unwrap();
    assert_rel(b.unified, 4.096, 1e-12, "unified");
    assert_eq!(b.argmin, "mix_tv");
    assert_eq!(b.unified, b.mix_tv);
    assert_rel(b.coupling, 79.91, 1e-9, "coupling");
    assert_rel(b.pm_kl, 34.94609188629668, 1e-12, "pm_kl");
    assert_rel(b.classical_kl, 1677.312, 1e-9, "classical_kl");
    assert_rel(
        b.classical_tv,
        2.0 * 4096.0 * 4095.0 * 25e-6,
        1e-12,
        "classical_tv",
    );
    assert_eq!(b.filled, vec!["dbar"]);
    assert_eq!(b.inputs.dbar, Dbar::Constant(5e-3));
}

#[test]
fn lntrm_and_ser_scores() {
    let rho = [1.0, 1.1, 0.9, 2.0, 0.5];
    assert_rel(
        lntrm_score(&rho, Some(0.1), Some(0.02)),
        0.21389031741350378,
        1e-12,
        "lntrm",
    );
    assert_rel(ser_score(&rho), 0.34, 1e-12, "ser");

    let w = lntrm_weights(5, Some(0.1), Some(0.02));
    let want = [0.04f64.sqrt(), 0.03f64.sqrt(), 0.02f64.sqrt(), 0.1, 0.0];
    for (g, e) in w.iter().zip(want) {
        assert_rel(*g, e, 1e-15, "weight");
    }
    // A missing parameter drops its term.
    assert_eq!(lntrm_weights(4, Some(0.5), None), vec![1.0, 1.0, 0.5, 0.0]);
    let w = lntrm_weights(3, None, Some(0.5));
    assert_eq!(w[0], 0.5f64.sqrt());
    assert_eq!(w[1], 0.25f64.sqrt());
    assert_eq!(w[2], 0.0);
    assert_eq!(lntrm_weights(3, None, None), vec![1.0; 3]);
    assert!(lntrm_weights(0, Some(0.1), Some(0.1)).is_empty());
    // Both missing: plain mean of |ρ − 1|, i.e. SER.
    assert_rel(
        lntrm_score(&rho, None, None),
        0.34,
        1e-12,
        "lntrm unweighted",
    );
    // Z = 0: single token, ε = 0, empty sequence.
    assert_eq!(lntrm_score(&[3.0], Some(0.1), Some(0.02)), 0.0);
    assert_eq!(lntrm_score(&rho, Some(0.0), Some(0.02)), 0.0);
    assert_eq!(lntrm_score(&[], Some(0.1), Some(0.02)), 0.0);
    assert_eq!(ser_score(&[]), 0.0);
}

#[test]
fn filled_lists() {
    let all = compute(&BoundInputs::new(10, 0.02)).unwrap();
    assert_eq!(all.filled, vec!["eps", "kl_seq", "tv_seq", "dbar"]);
    assert_eq!(all.inputs.eps, 0.1);
    assert_rel(all.inputs.kl_seq, 0.2, 1e-15, "kl_seq fill");
    assert_rel(all.inputs.tv_seq, 0.1f64.sqrt(), 1e-15, "tv_seq fill");
    assert_eq!(all.inputs.dbar, Dbar::Constant(0.1));

    // tv_seq is filled from the given kl_seq; dbar from the given ε.
    let b = compute(&BoundInputs {
        eps: Some(0.05),
        kl_seq: Some(0.08),
        ..BoundInputs::new(10, 0.02)
    })
    .unwrap();
    assert_eq!(b.filled, vec!["tv_seq", "dbar"]);
    assert_eq!(b.inputs.tv_seq, 0.2);
    assert_eq!(b.inputs.dbar, Dbar::Constant(0.05));

    // dbar fill is capped at 1.
    let b = compute(&BoundInputs {
        eps: Some(3.0),
        ..BoundInputs::new(4, 8.0)
    })
    .unwrap();
    assert_eq!(b.inputs.dbar, Dbar::Constant(1.0));

    let none = compute(&BoundInputs {
        horizon: 3,
        delta: 0.02,
        eps: Some(0.1),
        kl_seq: Some(0.01),
        tv_seq: Some(0.05),
        dbar: Some(vec![0.1, 0.2, 0.0]),
    })
    .unwrap();
    assert!(none.filled.is_empty());
    assert_eq!(none.inputs.dbar, Dbar::Profile(vec![0.1, 0.2, 0.0]));
}

fn config_key(err: Error) -> String {
    assert!(err.is_user_error());
    match err {
        Error::InvalidConfig { key, .. } => key,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn invalid_inputs_name_the_flag() {
    let base = spec_inputs();
    let cases: Vec<(BoundInputs, &str)> = vec![
        (
            BoundInputs {
                horizon: 0,
                ..base.clone()
            },
            "--horizon",
        ),
        (
            BoundInputs {
                delta: -1e-3,
                ..base.clone()
            },
            "--delta",
        ),
        (
            BoundInputs {
                delta: f64::NAN,
                ..base.clone()
            },
            "--delta",
        ),
        (
            BoundInputs {
                delta: f64::INFINITY,
                ..base.clone()
            },
            "--delta",
        ),
        (
            BoundInputs {
                eps: Some(-0.1),
                ..base.clone()
            },
            "--eps",
        ),
        (
            BoundInputs {
                eps: Some(f64::NAN),
                ..base.clone()
            },
            "--eps",
        ),
        (
            BoundInputs {
                eps: Some(f64::INFINITY),
                ..base.clone()
            },
            "--eps",
        ),
        (
            BoundInputs {
                kl_seq: Some(-1.0),
                ..base.clone()
            },
            "--kl-seq",
        ),
        (
            BoundInputs {
                kl_seq: Some(f64::NAN),
                ..base.clone()
            },
            "--kl-seq",
        ),
        (
            BoundInputs {
                tv_seq: Some(1.5),
                ..base.clone()
            },
            "--tv-seq",
        ),
        (
            BoundInputs {
                tv_seq: Some(-0.5),
                ..base.clone()
            },
            "--tv-seq",
        ),
        (
            BoundInputs {
                tv_seq: Some(f64::NAN),
                ..base.clone()
            },
            "--tv-seq",
        ),
        (
            BoundInputs {
                dbar: Some(vec![0.1; 3]),
                ..base.clone()
            },
            "--dbar",
        ),
        (
            BoundInputs {
                horizon: 2,
                dbar: Some(vec![0.1, 1.5]),
                ..base.clone()
            },
            "--dbar",
        ),
        (
            BoundInputs {
                horizon: 2,
                dbar: Some(vec![f64::NAN, 0.5]),
                ..base.clone()
            },
            "--dbar",
        ),
        // Finite inputs whose classical bound overflows f64.
        (
            BoundInputs {
                delta: 1e308,
                ..base.clone()
            },
            "--delta",
        ),
        (
            BoundInputs {
                eps: Some(1e200),
                ..base.clone()
            },
            "--eps",
        ),
    ];
    for (inputs, flag) in cases {
        let err = inputs.validate().and_then(|_| compute(&inputs).map(|_| ()));
        let err = err.expect_err(&format!("{inputs:?} should be rejected"));
        assert!(err.to_string().contains(flag), "{err}");
        assert_eq!(config_key(err), flag);
    }
    // Edges that are valid.
    assert!(compute(&BoundInputs {
        tv_seq: Some(1.0),
        eps: Some(0.0),
        ..base.clone()
    })
    .is_ok());
    assert!(compute(&BoundInputs::new(1, 0.0)).is_ok());
    // T = 1 with a huge ε: T(T−1) = 0, no overflow.
    let b = compute(&BoundInputs {
        horizon: 1,
        eps: Some(1e200),
        ..base.clone()
    })
    .unwrap();
    assert_eq!(b.classical_tv, 0.0);
}

#[test]
fn json_keys_and_table() {
    let b = compute(&spec_inputs()).unwrap();
    let v = serde_json::to_value(&b).unwrap();
    let obj = v.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
    keys.sort_unstable();
    let mut want = vec![
        "classical_kl",
        "classical_tv",
        "pm_kl",
        "pm_tv",
        "mix_kl",
        "mix_tv",
        "coupling",
        "adaptive_kl",
        "adaptive_tv",
        "adaptive",
        "unified",
        "argmin",
        "filled",
        "inputs",
    ];
    want.sort_unstable();
    assert_eq!(keys, want);
    assert_eq!(obj["argmin"], "mix_tv");
    assert_eq!(obj["filled"], serde_json::json!(["dbar"]));
    assert_eq!(obj["unified"].as_f64().unwrap(), b.unified);
    assert_eq!(obj["inputs"]["horizon"], 4096);
    assert_eq!(obj["inputs"]["eps"].as_f64().unwrap(), 5e-3);

    let t = b.table();
    for (name, _) in b.entries() {
        assert!(t.contains(name), "{t}");
    }
    assert!(t.contains("mix_tv") && t.contains("<- argmin"), "{t}");
    assert!(t.contains("1677.312"), "{t}");
    assert!(t.contains("filled: dbar"), "{t}");
    let argmin_line = t.lines().find(|l| l.contains("<- argmin")).unwrap();
    assert!(argmin_line.trim_start().starts_with("mix_tv"), "{t}");

    let all = compute(&BoundInputs::new(8, 0.01)).unwrap().table();
    assert!(all.contains("filled: eps, kl_seq, tv_seq, dbar"), "{all}");
}

// ---------------------------------------------------------------------------------------------
// Brute force: each sum written independently (1-based t, descending loops, powf instead of
// sqrt, explicit branches instead of min), compared on a grid.

fn clip1(x: f64) -> f64 {
    if x > 1.0 {
        1.0
    } else {
        x
    }
}

fn ref_pm_sum(t_max: usize, delta: f64) -> f64 {
    let mut acc = 0.0;
    let mut t = t_max;
    while t >= 1 {
        acc += clip1(((t - 1) as f64 * 0.5 * delta).powf(0.5));
        t -= 1;
    }
    acc
}

fn ref_coupling(t_max: usize, eps: f64) -> f64 {
    let mut acc = 0.0;
    for t in 1..=t_max {
        acc += clip1(eps * (t as f64 - 1.0));
    }
    4.0 * clip1(eps) * acc
}

/// Adaptive with a chosen weight rule; `which`: 0 = min form, 1 = KL only, 2 = TV only.
fn ref_adaptive(dbar: &[f64], eps: f64, delta: f64, which: u8) -> f64 {
    let big_t = dbar.len();
    let mut acc = 0.0;
    for t in 1..=big_t {
        let rem = (big_t - t) as f64;
        let kl_w = clip1((rem * delta * 0.5).powf(0.5));
        let tv_w = clip1(rem * eps);
        let w = match which {
            1 => kl_w,
            2 => tv_w,
            _ => {
                if kl_w < tv_w {
                    kl_w
                } else {
                    tv_w
                }
            }
        };
        acc += dbar[t - 1] * w;
    }
    4.0 * acc
}

fn check_against_reference(b: &Bounds, inp: &BoundInputs) {
    let big_t = inp.horizon;
    let tf = big_t as f64;
    let d = inp.delta;
    let e = inp.eps.unwrap_or((d / 2.0).powf(0.5));
    let kl = inp.kl_seq.unwrap_or(tf * d);
    let tv = inp.tv_seq.unwrap_or((kl / 2.0).powf(0.5));
    let fill = clip1(if e < (d / 2.0).powf(0.5) {
        e
    } else {
        (d / 2.0).powf(0.5)
    });
    let dbar = inp.dbar.clone().unwrap_or(vec![fill; big_t]);
    let ctx = format!("{inp:?}");
    let r = 1e-12;

    assert_rel(
        b.classical_kl,
        tf * (tf - 1.0) * d,
        r,
        &format!("classical_kl {ctx}"),
    );
    assert_rel(
        b.classical_tv,
        2.0 * tf * (tf - 1.0) * e * e,
        r,
        &format!("classical_tv {ctx}"),
    );
    let pm = ref_pm_sum(big_t, d);
    assert_rel(
        b.pm_kl,
        4.0 * clip1((d / 2.0).powf(0.5)) * pm,
        r,
        &format!("pm_kl {ctx}"),
    );
    assert_rel(b.pm_tv, 4.0 * clip1(e) * pm, r, &format!("pm_tv {ctx}"));
    let mk = 4.0 * tf * clip1((d / 2.0).powf(0.5)) * clip1((kl / 2.0).powf(0.5));
    assert_rel(b.mix_kl, mk, r, &format!("mix_kl {ctx}"));
    assert_rel(
        b.mix_tv,
        4.0 * tf * clip1(e) * clip1(tv),
        r,
        &format!("mix_tv {ctx}"),
    );
    assert_rel(
        b.coupling,
        ref_coupling(big_t, e),
        r,
        &format!("coupling {ctx}"),
    );
    assert_rel(
        b.adaptive,
        ref_adaptive(&dbar, e, d, 0),
        r,
        &format!("adaptive {ctx}"),
    );
    assert_rel(
        b.adaptive_kl,
        ref_adaptive(&dbar, e, d, 1),
        r,
        &format!("adaptive_kl {ctx}"),
    );
    assert_rel(
        b.adaptive_tv,
        ref_adaptive(&dbar, e, d, 2),
        r,
        &format!("adaptive_tv {ctx}"),
    );

    // The free functions agree with compute().
    assert_eq!(b.pm_kl, bounds::pm_kl(big_t, d));
    assert_eq!(b.coupling, bounds::coupling(big_t, e));
    assert_eq!(b.adaptive, bounds::adaptive(e, d, &dbar));

    // Structure: the min form is below both one-sided forms; B* is the min of the six.
    assert!(
        b.adaptive <= b.adaptive_kl && b.adaptive <= b.adaptive_tv,
        "{ctx}"
    );
    let six = [b.pm_kl, b.pm_tv, b.mix_kl, b.mix_tv, b.coupling, b.adaptive];
    let min = six.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(b.unified, min, "{ctx}");
    let pos = UNIFIED_CANDIDATES
        .iter()
        .position(|n| *n == b.argmin)
        .unwrap();
    assert_eq!(six[pos], min, "{ctx}");
    assert!(
        six[..pos].iter().all(|v| *v > min),
        "first argmin on ties {ctx}"
    );
}

#[test]
fn brute_force_grid() {
    let mut n = 0;
    for &big_t in &[1usize, 2, 3, 17, 256] {
        for &delta in &[1e-6, 1e-3, 0.5, 3.0] {
            // A profile that rises, touches 0 and 1, then decays.
            let profile: Vec<f64> = (0..big_t)
                .map(|i| match i % 5 {
                    0 => 0.0,
                    1 => 1.0,
                    k => 0.1 * k as f64 / (1.0 + i as f64 / 16.0),
                })
                .collect();
            for eps in [None, Some(0.0), Some(1e-3), Some(0.3), Some(2.0)] {
                for (kl_seq, tv_seq) in [(None, None), (Some(0.02), None), (Some(5.0), Some(0.7))] {
                    for dbar in [None, Some(profile.clone())] {
                        let inp = BoundInputs {
                            horizon: big_t,
                            delta,
                            eps,
                            kl_seq,
                            tv_seq,
                            dbar,
                        };
                        let b = compute(&inp).unwrap();
                        check_against_reference(&b, &inp);
                        n += 1;
                    }
                }
            }
        }
    }
    assert_eq!(n, 5 * 4 * 5 * 3 * 2);
}

#[test]
fn lntrm_brute_force() {
    for &big_t in &[1usize, 2, 3, 17, 256] {
        let rho: Vec<f64> = (0..big_t)
            .map(|i| 1.0 + ((i * 7 % 11) as f64 - 5.0) / 10.0)
            .collect();
        for &delta in &[1e-6, 1e-3, 0.5, 3.0] {
            for eps in [None, Some(1e-3), Some(0.3)] {
                let w = lntrm_weights(big_t, eps, Some(delta));
                let (mut num, mut den) = (0.0, 0.0);
                for t in 1..=big_t {
                    let rem = (big_t - t) as f64;
                    let mut wt = clip1((rem * delta / 2.0).powf(0.5));
                    if let Some(e) = eps {
                        if rem * e < wt {
                            wt = rem * e;
                        }
                    }
                    assert_rel(w[t - 1], wt, 1e-15, "weight");
                    num += (rho[t - 1] - 1.0).abs() * wt;
                    den += wt;
                }
                let want = if den == 0.0 { 0.0 } else { num / den };
                assert_rel(
                    lntrm_score(&rho, eps, Some(delta)),
                    want,
                    1e-12,
                    "lntrm score",
                );
            }
        }
        let ser = rho.iter().map(|r| (r - 1.0).abs()).sum::<f64>() / big_t as f64;
        assert_rel(ser_score(&rho), ser, 1e-12, "ser");
    }
}

/// Neumaier sum of `f(r)` for `r = 0..n`, the brute-force reference of the closed forms.
fn brute(n: usize, f: impl Fn(f64) -> f64) -> f64 {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for r in 0..n {
        let v = f(r as f64);
        let t = s + v;
        c += if s.abs() >= v.abs() {
            (s - t) + v
        } else {
            (v - t) + s
        };
        s = t;
    }
    s + c
}

/// Past 2^20 positions the sums are closed forms (O(1) memory); they match the term-by-term
/// sums to 1e-12 across the linear, square-root and saturated pieces.
#[test]
fn closed_forms_match_brute_force_past_2_20() {
    for big_t in [(1usize << 20) + 3, 3_000_017] {
        for delta in [1e-9, 1e-5, 0.5] {
            for eps in [None, Some(1e-7), Some(3e-4), Some(0.3)] {
                let inp = BoundInputs {
                    horizon: big_t,
                    delta,
                    eps,
                    ..Default::default()
                };
                let b = compute(&inp).unwrap();
                let e = b.inputs.eps;
                let Dbar::Constant(fill) = b.inputs.dbar else {
                    panic!("filled profile expected")
                };
                let pm = brute(big_t, |k| (k * delta / 2.0).sqrt().min(1.0));
                let co = brute(big_t, |k| (k * e).min(1.0));
                let w = |r: f64| (r * e).min((r * delta / 2.0).sqrt()).min(1.0);
                let ctx = format!("T={big_t} δ={delta} ε={e}");
                assert_rel(
                    b.pm_kl,
                    4.0 * (delta / 2.0).sqrt().min(1.0) * pm,
                    1e-12,
                    &ctx,
                );
                assert_rel(b.coupling, 4.0 * e.min(1.0) * co, 1e-12, &ctx);
                let ad = 4.0 * fill * brute(big_t, w);
                assert_rel(b.adaptive, ad, 1e-12, &ctx);
                let ad_kl = 4.0 * fill * brute(big_t, |r| (r * delta / 2.0).sqrt().min(1.0));
                assert_rel(b.adaptive_kl, ad_kl, 1e-12, &ctx);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rules a mutation run (docs/TESTING.md) found untested.

/// `adaptive_kl` / `adaptive_tv` as free functions agree with the term-by-term reference (they
/// were only checked through `compute`, which has its own path).
#[test]
fn adaptive_one_sided_free_functions_match_the_reference() {
    let dbar = [0.3, 0.05, 0.2, 0.0, 0.11, 0.4, 0.07];
    for (eps, delta) in [(0.4, 0.02), (0.01, 0.5), (2.0, 3.0)] {
        let kl = bounds::adaptive_kl(delta, &dbar);
        let tv = bounds::adaptive_tv(eps, &dbar);
        assert_rel(kl, ref_adaptive(&dbar, eps, delta, 1), 1e-14, "adaptive_kl");
        assert_rel(tv, ref_adaptive(&dbar, eps, delta, 2), 1e-14, "adaptive_tv");
        assert!(kl > 0.0 && tv > 0.0);
    }
}

/// The largest value of a `D̄` profile, as the table reports it.
#[test]
fn dbar_max_is_the_largest_value() {
    assert_eq!(Dbar::Constant(0.25).max(), 0.25);
    assert_eq!(Dbar::Profile(vec![0.1, 0.7, 0.3]).max(), 0.7);
    assert_eq!(Dbar::Profile(vec![]).max(), 0.0);
    let inp = BoundInputs {
        dbar: Some(vec![0.01, 0.375, 0.125]),
        ..BoundInputs::new(3, 0.01)
    };
    let t = compute(&inp).unwrap().table();
    let line = t
        .lines()
        .find(|l| l.trim_start().starts_with("dbar"))
        .unwrap();
    assert!(
        line.contains("0.3750000") && line.contains("(max of 3 values)"),
        "{t}"
    );
}

/// The horizon limit is 2^53 inclusive: 2^53 itself computes (in closed form), 2^53 + 1 is
/// refused naming `--horizon`.
#[test]
fn horizon_of_exactly_2_pow_53_is_accepted() {
    let top = 1usize << 53;
    let b = compute(&BoundInputs::new(top, 1e-30)).unwrap();
    assert!(b.unified.is_finite() && b.unified > 0.0);
    let err = compute(&BoundInputs::new(top + 1, 1e-30)).unwrap_err();
    assert_eq!(config_key(err), "--horizon");
}

/// Past 2^20 positions the Pinsker-Marginal and coupling sums are closed forms, O(1) in time:
/// a horizon of 2^50 returns at once and matches the integral approximation of the sum.
#[test]
fn pm_and_coupling_take_constant_time_at_huge_horizons() {
    let t = 1usize << 50;
    let tf = t as f64;
    // δ tiny enough that no term saturates: Σ_{k<T} √(kδ/2) ≈ √(δ/2)·(2/3)T^{3/2}
    let delta = 1e-40;
    let pm = bounds::pm_kl(t, delta);
    let want = 4.0 * (delta / 2.0f64).sqrt() * (delta / 2.0f64).sqrt() * (2.0 / 3.0) * tf.powf(1.5);
    assert_rel(pm, want, 1e-6, "pm_kl at 2^50");
    // ε tiny: Σ_{k<T} kε = εT(T−1)/2
    let eps = 1e-30;
    let co = bounds::coupling(t, eps);
    assert_rel(
        co,
        4.0 * eps * eps * tf * (tf - 1.0) / 2.0,
        1e-12,
        "coupling at 2^50",
    );
}

/// The table writes every value with 7 significant digits: fixed notation in [1e-4, 1e7),
/// scientific outside it.
#[test]
fn table_values_have_seven_significant_digits() {
    let inp = BoundInputs {
        horizon: 123_457,
        delta: 3.3e-3,
        eps: Some(0.0123),
        kl_seq: Some(45.678),
        tv_seq: Some(2.5e-6),
        dbar: None,
    };
    let b = compute(&inp).unwrap();
    let t = b.table();
    let mut seen = 0;
    for (name, v) in b
        .entries()
        .into_iter()
        .chain([("kl_seq", 45.678), ("tv_seq", 2.5e-6)])
    {
        let line = t
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap();
        let s = line.split_whitespace().nth(1).unwrap();
        let got: f64 = s.parse().unwrap();
        assert!((got - v).abs() <= 5e-7 * v.abs(), "{name}: {s} vs {v:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((s, ""));
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        assert_eq!(digits.trim_start_matches('0').len(), 7, "{name}: {s}");
        assert_eq!(
            exp.is_empty(),
            (1e-4..1e7).contains(&v.abs()),
            "{name}: {s}"
        );
        seen += 1;
    }
    assert_eq!(seen, 13);
    assert!(t.contains("45.67800") && t.contains("2.500000e-6"), "{t}");
}
