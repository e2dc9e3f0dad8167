//! The borrowed inputs of one fused call and how its slots form sequences.

use crate::input::values::{MaskValues, Values, MASK_BAD};

/// How the lean pass's slots form sequences.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LeanLayout<'a> {
    Padded { batch: usize, seq_len: usize },
    Packed(&'a [i64]),
}

/// The borrowed inputs of one lean call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeanInputs<'a> {
    pub(crate) layout: LeanLayout<'a>,
    pub(crate) mask: Option<MaskValues<'a>>,
    pub(crate) roll: Values<'a>,
    pub(crate) train: Values<'a>,
    /// Per-token advantages (trmask's diagnostics only).
    pub(crate) adv: Option<Values<'a>>,
    /// Each sequence's group id (trmask's diagnostics only).
    pub(crate) uid: Option<&'a [i64]>,
}

impl LeanInputs<'_> {
    /// The sequences' slot ranges, `None` when the layout or a length does not fit (the full
    /// path names the problem).
    pub(super) fn ranges(&self) -> Option<Vec<(usize, usize)>> {
        let (slots, ranges): (usize, Vec<(usize, usize)>) = match self.layout {
            LeanLayout::Padded { batch, seq_len } => {
                let n = batch.checked_mul(seq_len)?;
                if self.mask?.len() != n {
                    return None;
                }
                (
                    n,
                    (0..batch)
                        .map(|b| (b * seq_len, (b + 1) * seq_len))
                        .collect(),
                )
            }
            LeanLayout::Packed(cu) => {
                if self.mask.is_some() || cu.first() != Some(&0) {
                    return None;
                }
                if cu.windows(2).any(|w| w[1] < w[0]) {
                    return None;
                }
                let n = usize::try_from(*cu.last()?).ok()?;
                (
                    n,
                    cu.windows(2)
                        .map(|w| (w[0] as usize, w[1] as usize))
                        .collect(),
                )
            }
        };
        let fits = self.roll.len() == slots
            && self.train.len() == slots
            && self.adv.is_none_or(|a| a.len() == slots)
            && self.uid.is_none_or(|u| u.len() == ranges.len());
        fits.then_some(ranges)
    }
}

/// Slots a host pre-pass (M2PO's, CPPO's) reads at a time.
pub(crate) const CHUNK: usize = 512;

/// A chunk of slots as the host pre-passes read it: the mask (1 valid, 0 padding,
/// [`MASK_BAD`]), both log-probs and the advantages.
pub(crate) struct Chunk {
    pub(crate) m: [u8; CHUNK],
    pub(crate) o: [f64; CHUNK],
    pub(crate) r: [f64; CHUNK],
    pub(crate) a: [f64; CHUNK],
}

impl Chunk {
    pub(crate) fn new() -> Self {
        Chunk {
            m: [1; CHUNK],
            o: [0.0; CHUNK],
            r: [0.0; CHUNK],
            a: [0.0; CHUNK],
        }
    }

    /// Slots `k..k + len` (`len` ≤ [`CHUNK`]) of `inp` (every slot valid without a mask) and
    /// of the advantages `adv`.
    #[inline]
    pub(crate) fn load(&mut self, inp: &LeanInputs<'_>, adv: &Values<'_>, k: usize, len: usize) {
        if let Some(mv) = &inp.mask {
            mv.load(k, &mut self.m[..len]);
        }
        inp.roll.load(k, &mut self.r[..len]);
        inp.train.load(k, &mut self.o[..len]);
        adv.load(k, &mut self.a[..len]);
    }

    /// [`check_slot`] of slot `j`.
    #[inline(always)]
    pub(crate) fn check(&self, j: usize) -> (bool, bool) {
        check_slot(self.m[j], self.o[j], self.r[j])
    }
}

/// A slot of mask value `m` and log-probs `o`, `r` is valid, and the fused pass must step
/// aside there (a mask value other than 0/1, a non-finite valid log-prob): the one test of
/// the tiles and the host pre-passes (branch-free).
#[inline(always)]
pub(crate) fn check_slot(m: u8, o: f64, r: f64) -> (bool, bool) {
    let valid = m == 1;
    (
        valid,
        (m == MASK_BAD) | (valid & !(o.is_finite() & r.is_finite())),
    )
}
