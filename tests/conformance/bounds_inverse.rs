//! `bounds_inverse::invert`: the answer plugged back into the bounds gives the target, and a
//! δ a millionth larger exceeds it, on a grid of targets, horizons and ε (the paper's example
//! among them).

use trmask::bounds::{compute, BoundInputs};
use trmask::bounds_inverse::invert;

fn unified(t: usize, delta: f64, eps: Option<f64>) -> f64 {
    compute(&BoundInputs {
        eps,
        ..BoundInputs::new(t, delta)
    })
    .unwrap()
    .unified
}

#[track_caller]
fn check(e: f64, t: usize, eps: Option<f64>) {
    let inv = invert(e, t, eps).unwrap_or_else(|err| panic!("E={e} T={t} eps={eps:?}: {err}"));
    let at = unified(t, inv.delta, eps);
    assert!(
        ((at - e) / e).abs() <= 1e-9,
        "E={e} T={t} eps={eps:?}: B*(δ={:e}) = {at:e}",
        inv.delta
    );
    assert!(at <= e, "B* at the answer exceeds E: {at:e} > {e:e}");
    assert_eq!(at, inv.bounds.unified);
    let above = unified(t, inv.delta * (1.0 + 1e-6), eps);
    assert!(
        above > e,
        "E={e} T={t} eps={eps:?}: B*(δ(1+1e-6)) = {above:e} <= E"
    );
    match eps {
        Some(x) => assert_eq!(inv.eps, x),
        None => assert_eq!(inv.eps, (inv.delta / 2.0).sqrt()),
    }
}

#[test]
fn the_papers_example_comes_back() {
    // T = 4096, δ = 1e-4, ε = 5e-3: B* is the E, and δ = 1e-4 the answer
    let e = unified(4096, 1e-4, Some(5e-3));
    let inv = invert(e, 4096, Some(5e-3)).unwrap();
    assert!(((inv.delta - 1e-4) / 1e-4).abs() < 1e-9, "{}", inv.delta);
    check(e, 4096, Some(5e-3));
    // and with ε by Pinsker
    let e = unified(4096, 1e-4, None);
    let inv = invert(e, 4096, None).unwrap();
    assert!(((inv.delta - 1e-4) / 1e-4).abs() < 1e-9, "{}", inv.delta);
    check(e, 4096, None);
}

#[test]
fn grid_of_targets_horizons_and_eps() {
    let mut checked = 0;
    let small: &[f64] = &[1e-6, 1e-3, 0.1, 1.0, 4.096, 50.0];
    // past 2^20 terms the sums are closed forms (about 10 ms each here): fewer targets
    let large: &[f64] = &[1e-3, 4.096, 1e4];
    for &(t, targets) in &[
        (2usize, small),
        (17, small),
        (4096, small),
        (2_000_000, large),
        (1 << 53, large),
    ] {
        for &eps in &[None, Some(5e-3), Some(1e-2), Some(0.3)] {
            for &e in targets {
                let top = unified(t, 2.0, eps);
                if top <= e {
                    // no δ reaches E: an error that says so
                    let err = invert(e, t, eps).unwrap_err().to_string();
                    assert!(err.contains("never exceeded"), "{err}");
                    continue;
                }
                check(e, t, eps);
                checked += 1;
            }
        }
    }
    assert!(checked >= 60, "only {checked} grid points had an answer");
}

#[test]
fn bad_targets_name_the_flag() {
    for e in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let err = invert(e, 10, None).unwrap_err().to_string();
        assert!(err.contains("--target-error"), "{err}");
    }
    assert!(invert(1.0, 0, None)
        .unwrap_err()
        .to_string()
        .contains("--horizon"));
    assert!(invert(1.0, 10, Some(-1.0))
        .unwrap_err()
        .to_string()
        .contains("--eps"));
    // T = 1: every bound is 0
    assert!(invert(1.0, 1, None)
        .unwrap_err()
        .to_string()
        .contains("never exceeded"));
}
