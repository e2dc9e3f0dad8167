//! The borrowed inputs of one fused call and how its slots form sequences.

use crate::input::values::{MaskValues, Values};

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
