//! The kept sets of a truncated sampler (vLLM's `SamplingMask`, slime's top-p replay): for
//! every valid token, the ids that survived top-p / top-k / min-p, in CSR form
//! (`rollout_sampling_mask_ids` sliced by `rollout_sampling_mask_offsets`), and their
//! validation — the one place it happens: offsets start at 0, never decrease and end at the
//! number of ids; one span per valid token (or one per token slot, spans at padding ignored);
//! every valid token's set non-empty, its ids in `[0, V)` and distinct, and holding the
//! sampled token. Each failure is a one-line error naming the tensor.

use crate::error::{Error, Result};

/// The ids tensor's name.
pub const IDS: &str = "rollout_sampling_mask_ids";
/// The offsets tensor's name.
pub const OFFSETS: &str = "rollout_sampling_mask_offsets";

/// Kept ids per token slot (validated CSR; spans at padding are empty).
#[derive(Clone, Debug, PartialEq)]
pub struct KeptSets {
    ids: Vec<i64>,
    /// `slots + 1` offsets into `ids`, one span per slot.
    offsets: Vec<usize>,
}

impl KeptSets {
    /// The kept sets from CSR `ids` and `offsets` over slots whose validity is `mask`:
    /// `offsets` holds one span per valid token (valid tokens + 1 values, vLLM's layout) or one
    /// per slot (slots + 1, slime's per-response-token layout; spans at padding are ignored).
    /// `position` names a slot in errors.
    pub fn new(
        ids: Vec<i64>,
        offsets: &[i64],
        mask: &[bool],
        position: &dyn Fn(usize) -> String,
    ) -> Result<Self> {
        let valid = mask.iter().filter(|&&m| m).count();
        let slots = mask.len();
        let per_slot = match offsets.len() {
            n if n == valid + 1 => false,
            n if n == slots + 1 => true,
            n => {
                return Err(Error::input(
                    OFFSETS,
                    format!(
                        "has {n} values; expected valid tokens + 1 = {} (one span per valid \
                         token) or token slots + 1 = {} (one per slot)",
                        valid + 1,
                        slots + 1
                    ),
                ))
            }
        };
        if offsets[0] != 0 {
            return Err(Error::input(
                OFFSETS,
                format!("starts at {}, not 0", offsets[0]),
            ));
        }
        if let Some(i) = (1..offsets.len()).find(|&i| offsets[i] < offsets[i - 1]) {
            return Err(Error::input(
                OFFSETS,
                format!(
                    "decreases at index {i} ({} then {}); offsets must be non-decreasing",
                    offsets[i - 1],
                    offsets[i]
                ),
            ));
        }
        let last = offsets[offsets.len() - 1];
        if last != ids.len() as i64 {
            return Err(Error::input(
                OFFSETS,
                format!(
                    "ends at {last}, but {IDS} holds {} ids (the last offset is their count)",
                    ids.len()
                ),
            ));
        }
        let mut per = Vec::new();
        per.try_reserve_exact(slots + 1)
            .map_err(|_| Error::OutOfMemory(format!("{} offsets of {OFFSETS}", slots + 1)))?;
        per.push(0usize);
        let mut k = 0usize; // the span read next
        let mut kept: Vec<i64> = Vec::new();
        for (slot, &m) in mask.iter().enumerate() {
            let span = if per_slot || m {
                let s = (offsets[k] as usize, offsets[k + 1] as usize);
                k += 1;
                Some(s)
            } else {
                None
            };
            if let (true, Some((a, b))) = (m, span) {
                if a == b {
                    return Err(Error::input(
                        OFFSETS,
                        format!(
                            "gives the valid token at {} an empty kept set (span {k} is empty)",
                            position(slot)
                        ),
                    ));
                }
                if let Some(id) = ids[a..b].iter().find(|&&id| id < 0) {
                    return Err(Error::input(
                        IDS,
                        format!("id {id} at valid position {} is negative", position(slot)),
                    ));
                }
                kept.try_reserve(b - a)
                    .map_err(|_| Error::OutOfMemory(format!("{} kept ids", b - a)))?;
                kept.extend_from_slice(&ids[a..b]);
            }
            per.push(kept.len());
        }
        Ok(KeptSets {
            ids: kept,
            offsets: per,
        })
    }

    /// The kept ids of slot `slot` (empty at padding).
    pub fn row(&self, slot: usize) -> &[i64] {
        &self.ids[self.offsets[slot]..self.offsets[slot + 1]]
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Checks every valid token's set: ids below `vocab` (when known), distinct, and holding
    /// the sampled token `responses[slot]` (when given).
    pub fn check(
        &self,
        vocab: Option<usize>,
        responses: Option<&[i64]>,
        mask: &[bool],
        position: &dyn Fn(usize) -> String,
    ) -> Result<()> {
        let mut scratch = Vec::new();
        for (slot, _) in mask.iter().enumerate().filter(|(_, &m)| m) {
            let row = self.row(slot);
            check_row(row, vocab, &mut scratch).map_err(|p| {
                Error::input(IDS, format!("{p} at valid position {}", position(slot)))
            })?;
            if let Some(y) = responses.map(|r| r[slot]) {
                if !row.contains(&y) {
                    return Err(Error::input(
                        IDS,
                        format!(
                            "the kept set at valid position {} lacks the sampled token {y} \
                             (responses): the sets are misaligned with the tokens",
                            position(slot)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Checks one step's kept ids: non-empty, in `[0, vocab)` when `vocab` is known, distinct;
/// `Err` holds the problem (the caller names the tensor and the position).
pub(crate) fn check_row(
    ids: &[i64],
    vocab: Option<usize>,
    scratch: &mut Vec<i64>,
) -> std::result::Result<(), String> {
    if ids.is_empty() {
        return Err("the kept set is empty".into());
    }
    if let Some(v) = vocab {
        if let Some(id) = ids.iter().find(|&&id| id < 0 || id as u64 >= v as u64) {
            return Err(format!("id {id} is outside the vocabulary [0, {v})"));
        }
    }
    scratch.clear();
    scratch.extend_from_slice(ids);
    scratch.sort_unstable();
    if let Some(w) = scratch.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("id {} is repeated in one step's kept set", w[0]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(i: usize) -> String {
        format!("[{i}]")
    }

    #[test]
    fn both_layouts_and_every_error() {
        let mask = [true, false, true];
        // one span per valid token
        let k = KeptSets::new(vec![3, 1, 2], &[0, 2, 3], &mask, &pos).unwrap();
        assert_eq!(
            (k.row(0), k.row(1), k.row(2)),
            (&[3, 1][..], &[][..], &[2][..])
        );
        // one per slot: the padding span (id 9) is ignored
        let s = KeptSets::new(vec![3, 1, 9, 2], &[0, 2, 3, 4], &mask, &pos).unwrap();
        assert_eq!(s, k);
        k.check(Some(4), Some(&[1, 0, 2]), &mask, &pos).unwrap();
        let err = |r: Result<KeptSets>| r.unwrap_err().to_string();
        assert!(err(KeptSets::new(vec![1], &[0, 1], &mask, &pos)).contains(OFFSETS));
        assert!(err(KeptSets::new(vec![1, 2], &[1, 1, 2], &mask, &pos)).contains("starts at 1"));
        assert!(err(KeptSets::new(vec![1, 2], &[0, 2, 1], &mask, &pos)).contains("decreases"));
        assert!(err(KeptSets::new(vec![1, 2], &[0, 1, 3], &mask, &pos)).contains("ends at 3"));
        assert!(err(KeptSets::new(vec![1], &[0, 0, 1], &mask, &pos)).contains("empty kept set"));
        assert!(err(KeptSets::new(vec![-1, 2], &[0, 1, 2], &mask, &pos)).contains("negative"));
        let c = |v: Option<usize>, r: Option<&[i64]>| {
            k.check(v, r, &mask, &pos).unwrap_err().to_string()
        };
        assert!(c(Some(3), None).contains("outside the vocabulary [0, 3)"));
        assert!(c(None, Some(&[0, 0, 2])).contains("lacks the sampled token 0"));
        let dup = KeptSets::new(vec![1, 1, 2], &[0, 2, 3], &mask, &pos).unwrap();
        let e = dup.check(None, None, &mask, &pos).unwrap_err().to_string();
        assert!(e.starts_with(IDS) || e.contains(IDS), "{e}");
        assert!(e.contains("repeated") && e.contains("[0]"), "{e}");
    }
}
