//! Per-token estimators (docs/FORMAT.md, log-ratio), f64.

use crate::math::{exp_bounded, k3_from_log_ratio};
use crate::stats::{TokenStats, SAFETY_BOUND};
use rayon::prelude::*;

/// Slots per parallel task.
const CHUNK: usize = 1 << 14;

/// Per-token estimators; invalid slots hold 0 (their inputs are never read). The three slices
/// must have equal lengths (checked by [`CpuEngine::token_stats`](super::CpuEngine)). Parallel
/// over chunks of slots; every value depends on its own slot only, so the result does not
/// depend on the thread count.
pub fn token_stats(rollout: &[f64], train: &[f64], mask: &[bool]) -> TokenStats {
    let n = mask.len();
    let mut s = TokenStats {
        log_ratio: vec![0.0; n],
        rho: vec![0.0; n],
        k1: vec![0.0; n],
        k2: vec![0.0; n],
        k3: vec![0.0; n],
        abs: vec![0.0; n],
        ser: vec![0.0; n],
    };
    let TokenStats {
        log_ratio,
        rho,
        k1,
        k2,
        k3,
        abs,
        ser,
    } = &mut s;
    (
        mask.par_chunks(CHUNK),
        rollout.par_chunks(CHUNK),
        train.par_chunks(CHUNK),
        log_ratio.par_chunks_mut(CHUNK),
        rho.par_chunks_mut(CHUNK),
        k1.par_chunks_mut(CHUNK),
        k2.par_chunks_mut(CHUNK),
        k3.par_chunks_mut(CHUNK),
        abs.par_chunks_mut(CHUNK),
        ser.par_chunks_mut(CHUNK),
    )
        .into_par_iter()
        .for_each(|(mask, rollout, train, lr_o, rho, k1, k2, k3, abs, ser)| {
            for i in 0..mask.len() {
                if !mask[i] {
                    continue;
                }
                let lr = train[i] - rollout[i];
                let c = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND);
                lr_o[i] = lr;
                rho[i] = exp_bounded(c);
                k1[i] = -c;
                k2[i] = 0.5 * c * c;
                k3[i] = k3_from_log_ratio(c);
                abs[i] = c.abs();
                ser[i] = c.exp_m1().abs();
            }
        });
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3_matches_closed_form() {
        for &x in &[1e-8f64, -1e-6, 1e-3, -0.05, 0.0999, 0.1, -0.5, 3.0, -20.0] {
            let want = x.exp_m1() - x;
            let got = k3_from_log_ratio(x);
            assert!(got >= 0.0);
            if x.abs() > 1e-3 {
                assert!(
                    (got - want).abs() <= 1e-13 * want.abs(),
                    "x={x} got={got} want={want}"
                );
            }
        }
        // second-order behaviour near 0
        let x = 1e-6;
        assert!((k3_from_log_ratio(x) / (x * x / 2.0) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn every_estimator_at_one_slot() {
        // log-ratio = train − rollout = 0.25 exactly (and −0.25 the other way round)
        let c = 0.25f64;
        let s = token_stats(&[-1.5, -1.25], &[-1.25, -1.5], &[true, true]);
        assert_eq!(s.log_ratio, vec![c, -c]);
        // rho by the project's one exp (within an ulp of libm's)
        assert_eq!(s.rho, vec![exp_bounded(c), exp_bounded(-c)]);
        assert!((s.rho[0] - c.exp()).abs() <= f64::EPSILON * s.rho[0]);
        assert_eq!(s.k1, vec![-c, c]);
        assert_eq!(s.k2, vec![0.03125, 0.03125]);
        assert_eq!(s.k3, vec![k3_from_log_ratio(c), k3_from_log_ratio(-c)]);
        assert_eq!(s.abs, vec![c, c]);
        assert_eq!(s.ser, vec![c.exp_m1(), -(-c).exp_m1()]);
        // below −SAFETY_BOUND: the log-ratio is kept, the estimators use −20
        let s = token_stats(&[0.0], &[-25.0], &[true]);
        assert_eq!(s.log_ratio, vec![-25.0]);
        assert_eq!((s.k1[0], s.abs[0], s.k2[0]), (20.0, 20.0, 200.0));
        assert_eq!(s.rho, vec![exp_bounded(-20.0)]);
        assert_eq!(s.k3, vec![k3_from_log_ratio(-20.0)]);
    }

    #[test]
    fn clamps_like_verl_and_ignores_padding() {
        let s = token_stats(
            &[0.0, f64::NAN, 0.0],
            &[30.0, 1.0, -1.0],
            &[true, false, true],
        );
        assert_eq!(s.log_ratio, vec![30.0, 0.0, -1.0]);
        assert_eq!(s.k1[0], -20.0);
        assert_eq!(s.k2[0], 200.0);
        assert_eq!(s.rho[0], exp_bounded(20.0));
        assert_eq!(s.k1[1], 0.0);
        assert!((s.ser[2] - (1.0 - (-1f64).exp())).abs() < 1e-15);
    }
}
