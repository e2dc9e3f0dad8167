//! The sequences of a batch: each one's slot range and the validity of every slot.

use crate::error::{Error, Result};

/// The sequences of a batch: slot ranges plus the validity mask of every slot.
///
/// Built by [`Batch::padded`](super::Batch::padded) / [`Batch::packed`](super::Batch::packed), or by [`Segments::new`], which checks that
/// the ranges are ascending, disjoint and inside the mask, so no engine can index past it.
#[derive(Clone, Debug, PartialEq)]
pub struct Segments {
    pub(super) ranges: Vec<(usize, usize)>,
    pub(super) mask: Vec<bool>,
}

impl Segments {
    /// Sequences `ranges` (half-open `(start, end)` slot ranges, ascending and disjoint) over
    /// slots whose validity is `mask`. Slots outside every range are ignored.
    ///
    /// ```
    /// let s = trmask::Segments::new(vec![(0, 2), (3, 5)], vec![true, true, false, true, false])?;
    /// assert_eq!(s.lengths(), vec![2, 1]);
    /// assert!(trmask::Segments::new(vec![(0, 6)], vec![true; 5]).is_err());
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn new(ranges: Vec<(usize, usize)>, mask: Vec<bool>) -> Result<Self> {
        let mut end = 0;
        for (s, &(a, b)) in ranges.iter().enumerate() {
            if a < end || b < a || b > mask.len() {
                return Err(Error::input(
                    "segments",
                    format!(
                        "sequence {s} spans slots {a}..{b}: ranges must be ascending, disjoint \
                         and within the {} slots",
                        mask.len()
                    ),
                ));
            }
            end = b;
        }
        Ok(Segments { ranges, mask })
    }
    /// `(start, end)` slot range of each sequence (half-open).
    pub fn ranges(&self) -> &[(usize, usize)] {
        &self.ranges
    }
    /// `true` where a slot holds a valid token.
    pub fn mask(&self) -> &[bool] {
        &self.mask
    }
    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }
    /// True when there is no sequence.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
    /// Number of slots (`B·T` or `N`).
    pub fn slots(&self) -> usize {
        self.mask.len()
    }
    /// Number of valid tokens of each sequence.
    pub fn lengths(&self) -> Vec<usize> {
        self.ranges
            .iter()
            .map(|&(a, b)| self.mask[a..b].iter().filter(|&&m| m).count())
            .collect()
    }
    /// Index of the sequence owning each slot (`usize::MAX` for slots outside every sequence).
    pub fn slot_owner(&self) -> Vec<usize> {
        let mut owner = vec![usize::MAX; self.slots()];
        for (s, &(a, b)) in self.ranges.iter().enumerate() {
            owner[a..b].iter_mut().for_each(|o| *o = s);
        }
        owner
    }
}
