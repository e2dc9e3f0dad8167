//! The vocabulary kernel's configurations: threads per row, rows whole or cut into slices
//! (several workgroups per row, merged by a combine step), whether pass 1 runs its masked loop
//! from the start, the reduction trees (workgroup memory, or subgroup shuffles then workgroup
//! memory across subgroups) and rows per workgroup (one subgroup per row, for small
//! vocabularies). Rounding differs between configurations; each is deterministic (the same
//! input gives the same bits run to run on one device). Which one a call uses:
//! `ContextOptions::vocab_kernel`, else [`VOCAB_KERNEL_ENV`], else on GPUs the tuner's choice,
//! else the default (`Context::vocab_variant` in `kernels.rs`).

use crate::error::{Error, Result};
use crate::gpu::device::capabilities::Capabilities;
use crate::gpu::device::pipeline::MAX_WORKGROUP;

/// Environment variable pinning the vocabulary kernel's configuration, in the form
/// [`VocabVariant::parse`] reads (`wg=256,slice=16384,masked_first=1,sg=1`); empty: no pin.
pub const VOCAB_KERNEL_ENV: &str = "TRMASK_VOCAB_KERNEL";

/// Slice lengths (elements) the candidates cut rows into, besides whole rows.
pub const SLICE_LENGTHS: &[u32] = &[4096, 16384, 65536];

/// Workgroups a default configuration on a GPU aims to launch at least (rows × slices): enough
/// to fill a large GPU (132 multiprocessors × several resident workgroups each).
pub const FILL_WORKGROUPS: u64 = 2048;

/// The subgroup size the vocabulary kernel's subgroup trees can use on a device: its one fixed
/// size (the minimum and maximum agree: 8 on lavapipe, 32 or 64 on GPUs), of at least 8 lanes
/// (the trees keep one partial per subgroup in workgroup memory, at most 256 / 8); `None`
/// without `SUBGROUP` or with a varying size.
pub fn subgroup_lanes(caps: &Capabilities) -> Option<u32> {
    let (lo, hi) = caps.subgroup_sizes;
    (caps.subgroups && lo == hi && (8..=MAX_WORKGROUP).contains(&lo)).then_some(lo)
}

/// Row length up to which the candidates include one subgroup per row, several rows per
/// workgroup (`rows`): the vocabularies of small models and top-K rows.
pub const ROWS_MAX_VOCAB: u64 = 16_384;

/// One configuration of the vocabulary kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VocabVariant {
    /// Threads per row (1 ..= 256): the workgroup's size when `rows` is 1.
    pub workgroup: u32,
    /// Elements per slice of a row (a multiple of 8); 0: each row in one workgroup. A slice
    /// length is raised to at least `vocab / workgroup` (the combine step merges at most one
    /// slice per thread); rows of at most one slice run whole.
    pub slice: u32,
    /// Pass 1 runs its masked loop from the start (rows holding a −inf read once); else the
    /// plain loop first and the masked one again for such rows (cheaper on CPU adapters).
    pub masked_first: bool,
    /// The trees reduce by subgroup shuffles, then workgroup memory across subgroups (one
    /// barrier per tree instead of one per level); the device needs one fixed subgroup size
    /// of at least 8 lanes dividing `workgroup` ([`subgroup_lanes`]). Else workgroup memory.
    pub subgroups: bool,
    /// Rows per workgroup: 1, or more with one subgroup per row (`subgroups`, `workgroup` the
    /// subgroup size, whole rows): small rows leave no thread of a large workgroup idle.
    pub rows: u32,
}

impl Default for VocabVariant {
    /// 256 threads per row, whole rows, pass 1 masked first, workgroup-memory trees, one row
    /// per workgroup.
    fn default() -> Self {
        VocabVariant {
            workgroup: 256,
            slice: 0,
            masked_first: true,
            subgroups: false,
            rows: 1,
        }
    }
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
    /// `plain-first` for the other pass 1), `/sg` added for subgroup trees and `/rows8` for
    /// several rows per workgroup.
    pub fn label(&self) -> String {
        format!(
            "wg{}/{}/{}{}{}",
            self.workgroup,
            match self.slice {
                0 => "whole".to_string(),
                s => format!("slice{s}"),
            },
            if self.masked_first {
                "masked-first"
            } else {
                "plain-first"
            },
            if self.subgroups { "/sg" } else { "" },
            match self.rows {
                1 => String::new(),
                r => format!("/rows{r}"),
            }
        )
    }

    /// Reads `wg=N[,slice=N][,masked_first=0|1][,sg=0|1][,rows=N]` (slice 0 or absent: whole
    /// rows; masked_first absent: 1; sg absent: 0; rows absent: 1), or
    /// [`VocabVariant::label`]'s form; `what` names the source in the error.
    pub fn parse(text: &str, what: &str) -> Result<Self> {
        let bad = |why: String| Error::config(what, format!("{text:?}: {why}"));
        let mut v = VocabVariant {
            workgroup: 0,
            ..VocabVariant::default()
        };
        let sep = if text.contains('/') { '/' } else { ',' };
        for part in text.split(sep).map(str::trim).filter(|p| !p.is_empty()) {
            let (key, val) = match part.split_once('=') {
                Some(kv) => kv,
                None => match part {
                    "whole" => ("slice", "0"),
                    "masked-first" => ("masked_first", "1"),
                    "plain-first" => ("masked_first", "0"),
                    "sg" => ("sg", "1"),
                    p if p.starts_with("rows") => ("rows", &p[4..]),
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
            let flag = || match num()? {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(bad(format!("{key}: 0 or 1"))),
            };
            match key.trim() {
                "wg" | "workgroup" => v.workgroup = num()?,
                "slice" => v.slice = num()?,
                "masked_first" => v.masked_first = flag()?,
                "sg" | "subgroups" => v.subgroups = flag()?,
                "rows" => v.rows = num()?,
                k => return Err(bad(format!("unknown key {k:?}"))),
            }
        }
        v.check().map_err(|e| bad(e.to_string()))?;
        Ok(v)
    }

    /// An error unless the workgroup is 1 ..= 256 threads in all, the slice length a multiple
    /// of 8, and several rows per workgroup come with subgroups and whole rows.
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| {
            Err(Error::config(
                "vocab_kernel",
                format!("{}: {why}", self.label()),
            ))
        };
        if self.workgroup == 0 || self.workgroup > MAX_WORKGROUP {
            return bad(format!(
                "workgroup {} outside 1 ..= {MAX_WORKGROUP}",
                self.workgroup
            ));
        }
        if !self.slice.is_multiple_of(8) {
            return bad(format!("slice {} is not a multiple of 8", self.slice));
        }
        if self.rows == 0 || self.rows.saturating_mul(self.workgroup) > MAX_WORKGROUP {
            return bad(format!(
                "{} rows of {} threads per workgroup",
                self.rows, self.workgroup
            ));
        }
        if self.rows > 1 && (!self.subgroups || self.slice != 0) {
            return bad("several rows per workgroup need subgroups (sg=1) and whole rows".into());
        }
        Ok(())
    }

    /// [`Self::check`], then an error unless the device runs this configuration: at most its
    /// threads per workgroup; for subgroup trees one fixed subgroup size of at least 8 lanes
    /// dividing the row's threads ([`subgroup_lanes`]), equal to them with several rows per
    /// workgroup.
    pub fn check_device(&self, caps: &Capabilities) -> Result<()> {
        self.check()?;
        let bad = |why: String| {
            Err(Error::config(
                "vocab_kernel",
                format!("{}: {why}", self.label()),
            ))
        };
        let cap = caps
            .max_workgroup_invocations
            .min(caps.max_workgroup_size_x)
            .clamp(1, MAX_WORKGROUP);
        let threads = self.workgroup * self.rows;
        if threads > cap {
            return bad(format!(
                "workgroups of {threads} threads exceed this device's {cap}"
            ));
        }
        if self.subgroups {
            let Some(lanes) = subgroup_lanes(caps) else {
                return bad("this device has no fixed subgroup size of at least 8".into());
            };
            if !self.workgroup.is_multiple_of(lanes) || (self.rows > 1 && self.workgroup != lanes) {
                let want = if self.rows > 1 { "equal" } else { "divide" };
                return bad(format!(
                    "subgroups of {lanes} lanes must {want} the {} threads per row",
                    self.workgroup
                ));
            }
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
            ..VocabVariant::default()
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
                        ..VocabVariant::default()
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
                masked_first: false,
                ..VocabVariant::default()
            }
        );
        assert_eq!(VocabVariant::parse(&v.label(), "X").unwrap(), v);
        let w = VocabVariant::parse("wg=64", "X").unwrap();
        assert_eq!(
            (w.slice, w.masked_first, w.subgroups, w.rows),
            (0, true, false, 1)
        );
        assert_eq!(VocabVariant::parse(&w.label(), "X").unwrap(), w);
        // subgroup trees and several rows per workgroup
        let s = VocabVariant::parse("wg=8,rows=32,sg=1,masked_first=0", "X").unwrap();
        assert_eq!(
            (s.workgroup, s.rows, s.subgroups, s.slice),
            (8, 32, true, 0)
        );
        assert_eq!(s.label(), "wg8/whole/plain-first/sg/rows32");
        assert_eq!(VocabVariant::parse(&s.label(), "X").unwrap(), s);
        let t = VocabVariant::parse("wg128/slice4096/masked-first/sg", "X").unwrap();
        assert_eq!((t.subgroups, t.rows, t.slice), (true, 1, 4096));
        assert_eq!(VocabVariant::parse(&t.label(), "X").unwrap(), t);
        for bad in [
            "",
            "wg=0",
            "wg=512",
            "wg=64,slice=12",
            "wg=x",
            "wg=64,foo=1",
            "64",
            "wg=8,rows=2",
            "wg=8,rows=0,sg=1",
            "wg=64,rows=8,sg=1",
            "wg=8,rows=4,sg=1,slice=64",
            "wg=8,sg=2",
        ] {
            let e = VocabVariant::parse(bad, "TRMASK_VOCAB_KERNEL").unwrap_err();
            assert!(e.to_string().contains("TRMASK_VOCAB_KERNEL"), "{bad}: {e}");
        }
    }

    #[test]
    fn subgroup_trees_need_a_fixed_subgroup_size_dividing_the_row() {
        let mut caps = Capabilities {
            adapter_name: String::new(),
            backend: String::new(),
            device_type: String::new(),
            driver: String::new(),
            max_storage_binding: 1 << 27,
            max_buffer_size: 1 << 31,
            max_binding_bytes: 1 << 27,
            max_workgroup_invocations: 256,
            max_workgroup_size_x: 256,
            max_workgroups_per_dim: 65_535,
            max_workgroup_storage: 16_384,
            uniform_offset_alignment: 256,
            storage_offset_alignment: 256,
            subgroups: true,
            subgroup_sizes: (32, 32),
            shader_f16: false,
            timestamp_query: false,
            loop_iterations: None,
            mapped_uploads: false,
        };
        assert_eq!(subgroup_lanes(&caps), Some(32));
        let v = |workgroup, rows| VocabVariant {
            workgroup,
            subgroups: true,
            rows,
            ..VocabVariant::default()
        };
        for ok in [v(32, 1), v(256, 1), v(32, 8)] {
            ok.check_device(&caps).unwrap();
        }
        for bad in [v(8, 1), v(48, 1), v(64, 2), v(8, 32)] {
            let e = bad.check_device(&caps).unwrap_err().to_string();
            assert!(
                e.contains("vocab_kernel") && e.contains("subgroups of 32"),
                "{e}"
            );
        }
        // no fixed size, or one under 8 lanes: no subgroup trees (workgroup memory still runs)
        for sizes in [(16, 64), (4, 4)] {
            caps.subgroup_sizes = sizes;
            assert_eq!(subgroup_lanes(&caps), None);
            assert!(v(64, 1).check_device(&caps).is_err());
            VocabVariant {
                subgroups: false,
                ..v(64, 1)
            }
            .check_device(&caps)
            .unwrap();
        }
        caps.max_workgroup_invocations = 128;
        let e = VocabVariant::default().check_device(&caps).unwrap_err();
        assert!(e.to_string().contains("exceed this device's 128"), "{e}");
    }
}
