//! Mixture-of-experts routing: the experts the rollout engine routed each token to
//! (`rollout_routed_experts`) and the trainer's own choice without routing replay
//! (`old_routed_experts`), `[slots, L, K]` each; `-1` marks a (token, layer) row that was not
//! recorded.
//!
//! [`Routing::new`] is the one place both sides are read: in one pass it checks the ids at
//! valid slots (integers ≥ −1 that fit 32 bits, no id twice in a row; padding is never read)
//! and computes the per-token outputs and the per-layer counts ([`Routing::token_stats`]) that
//! every engine and every metric use:
//!
//! * a layer l of a valid token t is *recorded* when neither side's row holds a −1; its
//!   overlap is `o = |S_roll ∩ S_train| / K` (sets: order ignored);
//! * `route_overlap` = the mean of `o` over the token's recorded layers (1 with none),
//!   `route_flip` = 1 iff some recorded layer has `o < 1`, `route_first_layer` = the smallest
//!   such layer (−1 if none), `route_recorded` = 1 iff the token has a recorded layer.
//!
//! ```
//! use trmask::routing::Routing;
//! // 2 slots (the second is padding), L = 2 layers, K = 2
//! let mask = [true, false];
//! let roll = [3, 1, 0, 2, /* padding */ -7, -7, 5, 5];
//! let old = [1, 3, 2, 4, 0, 0, 0, 0];
//! let r = Routing::new(&roll, &old, 2, 2, &mask, &|i| format!("[{i}]"))?;
//! let t = r.token_stats().clone();
//! assert_eq!((t.overlap[0], t.flip[0], t.first_layer[0]), (0.75, 1.0, 1.0));
//! assert_eq!(t.layer_intersections, vec![2, 1]);
//! # Ok::<(), trmask::Error>(())
//! ```

use crate::error::{Error, Result};
use rayon::prelude::*;

/// The rollout side's tensor name.
pub const ROLLOUT: &str = "rollout_routed_experts";
/// The trainer side's tensor name.
pub const OLD: &str = "old_routed_experts";

/// Slots per parallel task.
const BLOCK: usize = 2048;

/// One side's routed experts as the caller holds them: int32 (what engines record) or int64.
#[derive(Clone, Copy, Debug)]
pub enum ExpertIds<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl<'a> From<&'a [i32]> for ExpertIds<'a> {
    fn from(v: &'a [i32]) -> Self {
        ExpertIds::I32(v)
    }
}

impl<'a> From<&'a [i64]> for ExpertIds<'a> {
    fn from(v: &'a [i64]) -> Self {
        ExpertIds::I64(v)
    }
}

impl<'a> From<&'a Vec<i32>> for ExpertIds<'a> {
    fn from(v: &'a Vec<i32>) -> Self {
        ExpertIds::I32(v)
    }
}

impl<'a> From<&'a Vec<i64>> for ExpertIds<'a> {
    fn from(v: &'a Vec<i64>) -> Self {
        ExpertIds::I64(v)
    }
}

/// Both sides' routed experts, validated, reduced to what every output and metric reads: the
/// per-token outputs and per-layer counts ([`RouteTokens`]), computed in the same pass that
/// checks the ids (the ids themselves are not kept).
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    layers: usize,
    top_k: usize,
    tokens: RouteTokens,
}

/// The per-token routing outputs of a batch (one value per slot, the documented neutral value
/// at padding: overlap 1, flip 0, first layer −1, recorded 0) and its per-layer counts over
/// valid tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteTokens {
    /// `route_overlap`: mean `o_{t,l}` over the token's recorded layers (1 with none).
    pub overlap: Vec<f64>,
    /// `route_flip`: 1 iff a recorded layer has `o_{t,l} < 1`.
    pub flip: Vec<f64>,
    /// `route_first_layer`: the smallest layer with `o_{t,l} < 1`, −1 if none.
    pub first_layer: Vec<f64>,
    /// 1 iff the token has at least one recorded layer (the denominator of
    /// `seq_mean_route_flip`).
    pub recorded: Vec<f64>,
    /// Per layer: `Σ |S_roll ∩ S_train|` over recorded (token, layer) pairs.
    pub layer_intersections: Vec<u64>,
    /// Per layer: the number of recorded (token, layer) pairs.
    pub layer_pairs: Vec<u64>,
    /// Valid tokens.
    pub valid_tokens: u64,
    /// Experts per row (K).
    pub top_k: usize,
}

impl RouteTokens {
    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.layer_pairs.len()
    }
}

/// The exact check of one (token, layer) row (the fast path's fallback): the first id below
/// −1, beyond i32, or seen twice, as an error naming `name` and `at`.
fn check_row<T: Copy + Into<i64>>(name: &str, row: &[T], at: &dyn Fn() -> String) -> Result<()> {
    for (i, &v) in row.iter().enumerate() {
        let v: i64 = v.into();
        let problem = if v < -1 {
            "is below -1 (-1 marks a layer that was not recorded)"
        } else if v > i64::from(i32::MAX) {
            "is beyond 2^31 - 1"
        } else if v >= 0 && row[..i].iter().any(|&w| w.into() == v) {
            "appears twice"
        } else {
            continue;
        };
        return Err(Error::input(
            name,
            format!("expert id {v} at {} {problem}", at()),
        ));
    }
    Ok(())
}

/// One row in one branch-free pass: its ids below 256 as a 256-bit set, whether an id ≥ 0
/// met its own bit already set (a duplicate, or two ids ≥ 256 sharing low bits), and its
/// extrema. The row is clean (no id below −1 or twice, none ≥ 256) iff `lo ≥ −1`, `hi < 256`
/// and no such collision; recorded iff `lo ≥ 0`.
struct RowSet {
    bits: [u64; 4],
    collided: u64,
    lo: i64,
    hi: i64,
}

impl RowSet {
    #[inline]
    fn of<T: Copy + Into<i64>>(row: &[T]) -> RowSet {
        let (mut bits, mut collided) = ([0u64; 4], 0u64);
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        for &v in row {
            let v: i64 = v.into();
            lo = lo.min(v);
            hi = hi.max(v);
            let bit = u64::from(v >= 0) << (v & 63);
            let w = &mut bits[((v >> 6) & 3) as usize];
            collided |= *w & bit;
            *w |= bit;
        }
        RowSet {
            bits,
            collided,
            lo,
            hi,
        }
    }
    #[inline]
    fn clean(&self) -> bool {
        self.lo >= -1 && self.hi < 256 && self.collided == 0
    }
    #[inline]
    fn has(&self, v: i64) -> bool {
        self.bits[((v >> 6) & 3) as usize] >> (v & 63) & 1 == 1
    }
}

/// `|a ∩ b|` of two checked rows without −1 (sets: no id twice): `K` when the sets are equal
/// (the common case), else each id of `a` looked up in `b`'s set (or, with ids ≥ 256, in `b`).
#[inline]
fn intersection<R: Copy + Into<i64>, O: Copy + Into<i64>>(
    a: (&RowSet, &[R]),
    b: (&RowSet, &[O]),
) -> u32 {
    if a.0.hi < 256 && b.0.hi < 256 {
        if a.0.bits == b.0.bits {
            return a.1.len() as u32;
        }
        return a.1.iter().map(|&x| u32::from(b.0.has(x.into()))).sum();
    }
    a.1.iter()
        .filter(|&&x| b.1.iter().any(|&y| y.into() == x.into()))
        .count() as u32
}

impl Routing {
    /// Both sides' routed experts over `mask.len()` slots, `[slots, layers, top_k]` each
    /// (row-major; any integer type). Ids at padding slots are never read. Errors name the
    /// tensor: a length that is not `slots · L · K`, `L` or `K` of 0, an id below −1 or beyond
    /// 2^31 − 1, an id twice in one (token, layer) row.
    pub fn new<R: Copy + Into<i64> + Sync, O: Copy + Into<i64> + Sync>(
        rollout: &[R],
        old: &[O],
        layers: usize,
        top_k: usize,
        mask: &[bool],
        position: &(dyn Fn(usize) -> String + Sync),
    ) -> Result<Self> {
        if layers == 0 || top_k == 0 {
            return Err(Error::input(
                ROLLOUT,
                format!(
                    "has {layers} layers of {top_k} experts: routing needs at least one MoE \
                     layer and one expert per token"
                ),
            ));
        }
        let row = layers
            .checked_mul(top_k)
            .ok_or_else(|| Error::input(ROLLOUT, "shape overflows"))?;
        let want = mask.len().checked_mul(row);
        for (name, v) in [(ROLLOUT, rollout.len()), (OLD, old.len())] {
            if Some(v) != want {
                return Err(Error::input(
                    name,
                    format!(
                        "has {v} values, expected {} token slots x {layers} layers x {top_k} \
                         experts",
                        mask.len()
                    ),
                ));
            }
        }
        let tokens = scan(rollout, old, layers, top_k, mask, position)?;
        Ok(Routing {
            layers,
            top_k,
            tokens,
        })
    }

    /// [`Routing::new`] for ids in either integer width, as [`ExpertIds`].
    pub fn from_ids(
        rollout: ExpertIds<'_>,
        old: ExpertIds<'_>,
        layers: usize,
        top_k: usize,
        mask: &[bool],
        position: &(dyn Fn(usize) -> String + Sync),
    ) -> Result<Self> {
        use ExpertIds::{I32, I64};
        let (l, k) = (layers, top_k);
        match (rollout, old) {
            (I32(r), I32(o)) => Routing::new(r, o, l, k, mask, position),
            (I32(r), I64(o)) => Routing::new(r, o, l, k, mask, position),
            (I64(r), I32(o)) => Routing::new(r, o, l, k, mask, position),
            (I64(r), I64(o)) => Routing::new(r, o, l, k, mask, position),
        }
    }

    /// Number of MoE layers (L).
    pub fn layers(&self) -> usize {
        self.layers
    }
    /// Experts per token and layer (K).
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    /// Number of token slots.
    pub fn slots(&self) -> usize {
        self.tokens.overlap.len()
    }

    /// The per-token outputs and per-layer counts over the batch's valid slots.
    pub fn token_stats(&self) -> &RouteTokens {
        &self.tokens
    }
}

/// Checks both sides' ids at the valid slots of `mask` and computes the per-token outputs and
/// per-layer counts, one pass over both tensors (blocks of slots in parallel; counts are
/// integers, so the order of the blocks does not matter).
fn scan<R: Copy + Into<i64> + Sync, O: Copy + Into<i64> + Sync>(
    rollout: &[R],
    old: &[O],
    l: usize,
    k: usize,
    mask: &[bool],
    position: &(dyn Fn(usize) -> String + Sync),
) -> Result<RouteTokens> {
    let n = mask.len();
    let mut t = RouteTokens {
        overlap: vec![1.0; n],
        flip: vec![0.0; n],
        first_layer: vec![-1.0; n],
        recorded: vec![0.0; n],
        top_k: k,
        ..RouteTokens::default()
    };
    // per block: [intersections | pairs] per layer, then valid tokens
    #[cfg(target_arch = "x86_64")]
    let fast = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("popcnt");
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    let ids = Ids {
        rollout,
        old,
        l,
        k,
        mask,
        position,
    };
    let counts: Vec<u64> = t
        .overlap
        .par_chunks_mut(BLOCK)
        .zip(t.flip.par_chunks_mut(BLOCK))
        .zip(t.first_layer.par_chunks_mut(BLOCK))
        .zip(t.recorded.par_chunks_mut(BLOCK))
        .enumerate()
        .map(|(c, (((ov, fl), first), rec))| {
            let out = [ov, fl, first, rec];
            #[cfg(target_arch = "x86_64")]
            if fast {
                // SAFETY: the CPU has AVX2 and POPCNT (checked above)
                return unsafe { block_avx2(&ids, c * BLOCK, out) };
            }
            let _ = fast;
            block(&ids, c * BLOCK, out)
        })
        .try_reduce(
            || vec![0u64; 2 * l + 1],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                Ok(a)
            },
        )?;
    t.layer_intersections = counts[..l].to_vec();
    t.layer_pairs = counts[l..2 * l].to_vec();
    t.valid_tokens = counts[2 * l];
    Ok(t)
}

/// Both sides' ids and what a block of slots needs to read them.
struct Ids<'a, R, O> {
    rollout: &'a [R],
    old: &'a [O],
    l: usize,
    k: usize,
    mask: &'a [bool],
    position: &'a (dyn Fn(usize) -> String + Sync),
}

/// [`block`] built with AVX2 and POPCNT (the sets' counts and compares in a few instructions).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn block_avx2<R: Copy + Into<i64>, O: Copy + Into<i64>>(
    ids: &Ids<'_, R, O>,
    start: usize,
    out: [&mut [f64]; 4],
) -> Result<Vec<u64>> {
    block(ids, start, out)
}

/// The slots `start..start + out[0].len()`: their outputs (`out`: overlap, flip, first layer,
/// recorded) and counts (`[intersections | pairs]` per layer, then valid tokens).
#[inline(always)]
fn block<R: Copy + Into<i64>, O: Copy + Into<i64>>(
    ids: &Ids<'_, R, O>,
    start: usize,
    out: [&mut [f64]; 4],
) -> Result<Vec<u64>> {
    let (l, k) = (ids.l, ids.k);
    let row = l * k;
    let [ov, fl, first, rec] = out;
    let mut acc = vec![0u64; 2 * l + 1];
    for j in 0..ov.len() {
        let slot = start + j;
        if !ids.mask[slot] {
            continue;
        }
        acc[2 * l] += 1;
        let (mut inter, mut pairs, mut flipped) = (0u64, 0u64, None);
        let (rt, ot) = (
            &ids.rollout[slot * row..(slot + 1) * row],
            &ids.old[slot * row..(slot + 1) * row],
        );
        for (layer, (ra, oa)) in rt.chunks_exact(k).zip(ot.chunks_exact(k)).enumerate() {
            let (rs, os) = (RowSet::of(ra), RowSet::of(oa));
            if !(rs.clean() && os.clean()) {
                let at = || format!("valid position {}, layer {layer}", (ids.position)(slot));
                check_row(ROLLOUT, ra, &at)?;
                check_row(OLD, oa, &at)?;
            }
            if rs.lo < 0 || os.lo < 0 {
                continue; // a -1 on either side: not recorded
            }
            let x = intersection((&rs, ra), (&os, oa));
            inter += u64::from(x);
            pairs += 1;
            acc[layer] += u64::from(x);
            acc[l + layer] += 1;
            if (x as usize) < k {
                flipped.get_or_insert(layer);
            }
        }
        if pairs > 0 {
            ov[j] = inter as f64 / (k as u64 * pairs) as f64;
            rec[j] = 1.0;
        }
        if let Some(f) = flipped {
            fl[j] = 1.0;
            first[j] = f as f64;
        }
    }
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(i: usize) -> String {
        format!("[{i}]")
    }

    #[test]
    fn overlap_flip_and_first_layer() {
        // 3 valid tokens, L = 3, K = 2
        let mask = [true, true, true];
        let roll = [
            1, 2, 3, 4, 5, 6, // token 0: same sets, other order in layer 1
            1, 2, 3, 4, -1, 6, // token 1: layer 2 unrecorded, layer 1 differs by one
            -1, -1, -1, -1, -1, -1, // token 2: nothing recorded
        ];
        let old = [
            2, 1, 4, 3, 5, 6, //
            1, 2, 3, 9, 5, 6, //
            1, 2, 3, 4, 5, 6,
        ];
        let r = Routing::new(&roll, &old, 3, 2, &mask, &pos).unwrap();
        let t = r.token_stats().clone();
        assert_eq!(t.overlap, [1.0, 0.75, 1.0]);
        assert_eq!(t.flip, [0.0, 1.0, 0.0]);
        assert_eq!(t.first_layer, [-1.0, 1.0, -1.0]);
        assert_eq!(t.recorded, [1.0, 1.0, 0.0]);
        assert_eq!(t.layer_pairs, [2, 2, 1]);
        assert_eq!(t.layer_intersections, [4, 3, 2]);
        assert_eq!(t.valid_tokens, 3);
    }

    #[test]
    fn wide_ids_take_the_general_path() {
        let mask = [true];
        // 100 and 164 share their low 6 bits; 300 and 44 their low 8
        let r = Routing::new(&[100i64, 3], &[3i64, 164], 1, 2, &mask, &pos).unwrap();
        let t = r.token_stats().clone();
        assert_eq!((t.overlap[0], t.flip[0]), (0.5, 1.0));
        let r = Routing::new(&[100i64, 3], &[3i64, 100], 1, 2, &mask, &pos).unwrap();
        assert_eq!(r.token_stats().clone().flip[0], 0.0);
        let r = Routing::new(&[300i64, 3], &[3i64, 44], 1, 2, &mask, &pos).unwrap();
        assert_eq!(r.token_stats().clone().overlap[0], 0.5);
        let r = Routing::new(&[300i64, 3, 255], &[255i64, 3, 300], 1, 3, &mask, &pos).unwrap();
        assert_eq!(r.token_stats().clone().overlap[0], 1.0);
        let e = Routing::new(&[300i64, 300], &[1i64, 2], 1, 2, &mask, &pos).unwrap_err();
        assert!(e.to_string().contains("twice"));
        let e = Routing::new(&[200i64, 200], &[1i64, 2], 1, 2, &mask, &pos).unwrap_err();
        assert!(e.to_string().contains("twice"));
    }

    #[test]
    fn padding_is_never_read() {
        let mask = [true, false];
        let roll = [1i64, 2, -5, i64::MAX];
        let old = [2i64, 1, 7, 7];
        let t = Routing::new(&roll, &old, 1, 2, &mask, &pos)
            .unwrap()
            .token_stats()
            .clone();
        assert_eq!((t.overlap, t.flip), (vec![1.0, 1.0], vec![0.0, 0.0]));
    }

    #[test]
    fn bad_input_names_the_tensor() {
        let mask = [true];
        let err = |r: &[i64], o: &[i64], l, k| {
            Routing::new(r, o, l, k, &mask, &pos)
                .unwrap_err()
                .to_string()
        };
        let e = err(&[1, 1], &[1, 2], 1, 2);
        assert!(e.contains(ROLLOUT) && e.contains("twice"), "{e}");
        let e = err(&[1, 2], &[70, 70], 1, 2);
        assert!(e.contains(OLD) && e.contains("twice"), "{e}");
        let e = err(&[1, 2], &[-2, 1], 1, 2);
        assert!(e.contains(OLD) && e.contains("below -1"), "{e}");
        let e = err(&[1, 2], &[1, 2, 3], 1, 2);
        assert!(
            e.contains(OLD) && e.contains("expected 1 token slots"),
            "{e}"
        );
        let e = err(&[1, 1i64 << 40], &[1, 2], 1, 2);
        assert!(e.contains("2^31"), "{e}");
        assert!(err(&[], &[], 0, 2).contains("at least one"));
        // two -1s are an unrecorded row, not a duplicate
        assert!(Routing::new(&[-1i64, -1], &[1, 2], 1, 2, &mask, &pos).is_ok());
    }
}
