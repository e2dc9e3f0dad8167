//! A rule that a mutation run (cargo-mutants, docs/TESTING.md) found untested: the argmax tie
//! rule (the first maximum wins), on every engine. (The other, k3's series for small
//! log-ratios, is tested in `src/math.rs` against an 80-digit reference.)

use trmask::{Engine, Segments};

use crate::common;

#[test]
fn argmax_is_the_first_maximum_on_every_engine() {
    let seg = Segments::new(
        vec![(0, 4), (4, 8), (8, 11)],
        vec![
            true, true, true, true, // 2.0 at offsets 1 and 3
            false, true, true, true, // the masked 9.0 is skipped; 5.0 at offsets 1 and 2
            true, true, true, // all equal
        ],
    )
    .unwrap();
    let v = [0.5, 2.0, 1.0, 2.0, 9.0, 5.0, 5.0, -1.0, 3.0, 3.0, 3.0];
    let cpu = trmask::cpu::CpuEngine::new();
    let gpu = common::gpu();
    let mut engines: Vec<&dyn Engine> = vec![&cpu];
    if let Some(g) = &gpu {
        engines.push(g.as_ref());
    }
    for e in engines {
        let r = e.segment_reduce(&[&v], &seg).unwrap();
        assert_eq!(r[0].argmax, vec![1, 1, 0], "{}", e.name());
        assert_eq!(r[0].max, vec![2.0, 5.0, 3.0], "{}", e.name());
    }
}

#[test]
fn argmax_of_a_sequence_of_minus_infinity_is_its_first_valid_token() {
    // every valid value −∞: the first valid token is the first maximum (it was −1 on the CPU,
    // the offset of the first valid token on the GPU)
    let ninf = f64::NEG_INFINITY;
    let seg = Segments::new(vec![(0, 3), (3, 5)], vec![false, true, true, true, true]).unwrap();
    let v = [0.0, ninf, ninf, ninf, 1.0];
    let cpu = trmask::cpu::CpuEngine::new();
    let gpu = common::gpu();
    let mut engines: Vec<&dyn Engine> = vec![&cpu];
    if let Some(g) = &gpu {
        engines.push(g.as_ref());
    }
    for e in engines {
        let r = e.segment_reduce(&[&v], &seg).unwrap();
        assert_eq!(r[0].argmax, vec![1, 1], "{}", e.name());
        assert_eq!(r[0].max, vec![ninf, 1.0], "{}", e.name());
        assert_eq!(r[0].count, vec![2, 2], "{}", e.name());
    }
}
