//! The vocabulary kernel's configurations: threads per workgroup, rows whole or cut into
//! slices (several workgroups per row, merged by a combine step), and whether pass 1 runs its
//! masked loop from the start. Rounding differs between configurations; each is deterministic
//! (the same input gives the same bits run to run). Which one a call uses:
//! `ContextOptions::vocab_kernel`, else [`VOCAB_KERNEL_ENV`], else on GPUs the tuner's choice,
//! else the default (`Context::vocab_variant` in `kernels.rs`).

use super::pipeline::MAX_WORKGROUP;
use crate::error::{Error, Result};

/// Environment variable pinning the vocabulary kernel's configuration, in the form
/// [`VocabVariant::parse`] reads (`wg=256,slice=16384,masked_first=1`).
pub const VOCAB_KERNEL_ENV: &str = "TRMASK_VOCAB_KERNEL";

/// Slice lengths (elements) the candidates cut rows into, besides whole rows.
pub const SLICE_LENGTHS: &[u32] = &[4096, 16384, 65536];

/// Workgroups a default configuration on a GPU aims to launch at least (rows × slices): enough
/// to fill a large GPU (132 multiprocessors × several resident workgroups each).
pub const FILL_WORKGROUPS: u64 = 2048;

/// One configuration of the vocabulary kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VocabVariant {
    /// Threads per workgroup (1 ..= 256).
    pub workgroup: u32,
    /// Elements per slice of a row (a multiple of 8); 0: each row in one workgroup. A slice
    /// length is raised to at least `vocab / workgroup` (the combine step merges at most one
    /// slice per thread); rows of at most one slice run whole.
    pub slice: u32,
    /// Pass 1 runs its masked loop from the start (rows holding a −inf read once); else the
    /// plain loop first and the masked one again for such rows (cheaper on CPU adapters).
    pub masked_first: bool,
}

impl VocabVariant {
    /// Slices per row of `vocab` elements (1: whole rows).
    pub fn slices(&self, vocab: u64) -> u32 {
        let len = u64::from(self.slice_len(vocab));
        match len {
            0 => 1,
            l => vocab.div_ceil(l).max(1) as u32,
        }
    }

    /// The slice length used on rows of `vocab` elements: 0 (whole rows) or the configured
    /// length raised to a multiple of 8 of at least `vocab / workgroup`, and below `vocab`.
    pub fn slice_len(&self, vocab: u64) -> u32 {
        if self.slice == 0 {
            return 0;
        }
        let wg = u64::from(self.workgroup.max(1));
        let len = u64::from(self.slice).max(vocab.div_ceil(wg)).div_ceil(8) * 8;
        if len >= vocab {
            0
        } else {
            len as u32
        }
    }

    /// A short label such as `wg256/slice16384/masked-first` (`whole` for whole rows,
    /// `plain-first` for the other pass 1).
    pub fn label(&self) -> String {
        format!(
            "wg{}/{}/{}",
            self.workgroup,
            match self.slice {
                0 => "whole".to_string(),
                s => format!("slice{s}"),
            },
            if self.masked_first {
                "masked-first"
            } else {
                "plain-first"
            }
        )
    }

    /// Reads `wg=N[,slice=N][,masked_first=0|1]` (slice 0 or absent: whole rows;
    /// masked_first absent: 1), or [`VocabVariant::label`]'s form; `what` names the source in
    /// the error.
    pub fn parse(text: &str, what: &str) -> Result<Self> {
        let bad = |why: String| Error::config(what, format!("{text:?}: {why}"));
        let mut v = VocabVariant {
            workgroup: 0,
            slice: 0,
            masked_first: true,
        };
        let sep = if text.contains('/') { '/' } else { ',' };
        for part in text.split(sep).map(str::trim).filter(|p| !p.is_empty()) {
            let (key, val) = match part.split_once('=') {
                Some(kv) => kv,
                None => match part {
                    "whole" => ("slice", "0"),
                    "masked-first" => ("masked_first", "1"),
                    "plain-first" => ("masked_first", "0"),
                    p if p.starts_with("wg") => ("wg", &p[2..]),
                    p if p.starts_with("slice") => ("slice", &p[5..]),
                    p => return Err(bad(format!("unknown part {p:?}"))),
                },
            };
            let num = || {
                val.trim()
                    .parse::<u32>()
                    .map_err(|_| bad(format!("{key}: not a whole number: {val:?}")))
            };
            match key.trim() {
                "wg" | "workgroup" => v.workgroup = num()?,
                "slice" => v.slice = num()?,
                "masked_first" => {
                    v.masked_first = match num()? {
                        0 => false,
                        1 => true,
                        _ => return Err(bad("masked_first: 0 or 1".into())),
                    }
                }
                k => return Err(bad(format!("unknown key {k:?}"))),
            }
        }
        v.check().map_err(|e| bad(e.to_string()))?;
        Ok(v)
    }

    /// An error unless the workgroup is 1 ..= 256 and the slice length a multiple of 8.
    pub fn check(&self) -> Result<()> {
        if self.workgroup == 0 || self.workgroup > MAX_WORKGROUP {
            return Err(Error::config(
                "vocab_kernel",
                format!("workgroup {} outside 1 ..= {MAX_WORKGROUP}", self.workgroup),
            ));
        }
        if !self.slice.is_multiple_of(8) {
            return Err(Error::config(
                "vocab_kernel",
                format!("slice {} is not a multiple of 8", self.slice),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_row_with_at_most_one_per_thread() {
        let v = VocabVariant {
            workgroup: 64,
            slice: 4096,
            masked_first: true,
        };
        assert_eq!(v.slices(151_936), 38);
        assert_eq!(v.slice_len(151_936), 4096);
        // 262,144 / 64 = 4096 per slice at least
        assert_eq!(v.slices(262_144), 64);
        // raised: 262,144 elements over at most 32 slices
        let small = VocabVariant { workgroup: 32, ..v };
        assert_eq!(small.slice_len(262_144), 8192);
        assert_eq!(small.slices(262_144), 32);
        // a row of one slice runs whole
        assert_eq!(v.slice_len(4096), 0);
        assert_eq!(v.slices(4000), 1);
        assert_eq!(v.slices(1), 1);
        // odd lengths: multiples of 8, the last slice shorter
        let odd = VocabVariant { slice: 8, ..v };
        assert_eq!(odd.slice_len(1001), 16);
        assert_eq!(odd.slices(1001), 63);
        for vocab in [1u64, 7, 8, 9, 1001, 65_536, 151_936, 262_144] {
            for wg in [1u32, 8, 64, 256] {
                for slice in [0u32, 8, 4096, 65_536] {
                    let v = VocabVariant {
                        workgroup: wg,
                        slice,
                        masked_first: false,
                    };
                    let (n, len) = (u64::from(v.slices(vocab)), u64::from(v.slice_len(vocab)));
                    assert!(n <= u64::from(wg).max(1), "{vocab} {wg} {slice}");
                    if len > 0 {
                        assert!(len.is_multiple_of(8) && (n - 1) * len < vocab && n * len >= vocab);
                    } else {
                        assert_eq!(n, 1);
                    }
                }
            }
        }
    }

    #[test]
    fn parses_both_forms_and_names_the_source_on_errors() {
        let v = VocabVariant::parse("wg=128,slice=16384,masked_first=0", "X").unwrap();
        assert_eq!(
            v,
            VocabVariant {
                workgroup: 128,
                slice: 16384,
                masked_first: false
            }
        );
        assert_eq!(VocabVariant::parse(&v.label(), "X").unwrap(), v);
        let w = VocabVariant::parse("wg=64", "X").unwrap();
        assert_eq!((w.slice, w.masked_first), (0, true));
        assert_eq!(VocabVariant::parse(&w.label(), "X").unwrap(), w);
        for bad in [
            "",
            "wg=0",
            "wg=512",
            "wg=64,slice=12",
            "wg=x",
            "wg=64,foo=1",
            "64",
        ] {
            let e = VocabVariant::parse(bad, "TRMASK_VOCAB_KERNEL").unwrap_err();
            assert!(e.to_string().contains("TRMASK_VOCAB_KERNEL"), "{bad}: {e}");
        }
    }
}
