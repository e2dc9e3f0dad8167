//! Segmented per-sequence reductions, f64.

use crate::input::batch::Segments;
use crate::math::LaneSum;
use crate::stats::SegmentStats;

/// Sum (a [`LaneSum`] over the slots), mean, max, min, argmax and count of `values` over the
/// valid slots of each sequence.
/// See [`SegmentStats`] for the definitions on empty sequences.
#[allow(clippy::needless_range_loop)]
pub fn segment_reduce(values: &[f64], segments: &Segments) -> SegmentStats {
    let s = segments.len();
    let mut out = SegmentStats {
        sum: vec![0.0; s],
        mean: vec![0.0; s],
        max: vec![0.0; s],
        min: vec![0.0; s],
        argmax: vec![-1; s],
        count: vec![0; s],
    };
    for (k, &(a, b)) in segments.ranges().iter().enumerate() {
        // in lanes by slot (the lean pass sums the same way: equal bits)
        let mut lanes = LaneSum::default();
        lanes.add_where(&values[a..b], &segments.mask()[a..b]);
        let sum = lanes.value();
        let mut max = f64::NEG_INFINITY;
        let mut min = f64::INFINITY;
        let mut arg = 0i64; // set by the first valid token
        let mut n = 0u32;
        for (i, (&v, &m)) in values[a..b].iter().zip(&segments.mask()[a..b]).enumerate() {
            if !m {
                continue;
            }
            // the first valid token, then a strictly larger one: the first maximum (as the GPU
            // does, also when every valid value is −∞)
            if n == 0 || v > max {
                max = v;
                arg = i as i64;
            }
            min = min.min(v);
            n += 1;
        }
        if n > 0 {
            out.sum[k] = sum;
            out.mean[k] = sum / n as f64;
            out.max[k] = max;
            out.min[k] = min;
            out.argmax[k] = arg;
            out.count[k] = n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_and_defines_empty() {
        let seg = Segments::new(
            vec![(0, 3), (3, 3), (3, 6)],
            vec![true, true, false, false, false, true],
        )
        .unwrap();
        let v = [1.0, 3.0, f64::NAN, 9.0, 9.0, -2.0];
        let r = segment_reduce(&v, &seg);
        assert_eq!(r.sum, vec![4.0, 0.0, -2.0]);
        assert_eq!(r.mean, vec![2.0, 0.0, -2.0]);
        assert_eq!(r.max, vec![3.0, 0.0, -2.0]);
        assert_eq!(r.min, vec![1.0, 0.0, -2.0]);
        assert_eq!(r.argmax, vec![1, -1, 2]);
        assert_eq!(r.count, vec![2, 0, 1]);
    }
}
