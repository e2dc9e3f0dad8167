//! CPPO in the fused pass: each sequence's decisions made before its tiles, from one read of
//! its valid tokens, by the full path's function (`correction::cppo::Decisions::sequence`: the
//! P90 budget needs the whole sequence); the tiles then read them by valid token.

use super::inputs::{Chunk, LeanInputs, CHUNK};
use crate::config::Cppo;
use crate::correction::cppo::{divergence, outward, Decisions};

/// A task's CPPO criterion: its index, δ, the config's `{w_min, delta_b}`, the current
/// sequence's `Z_t` and drops by valid token, and the task's counts of drops by δ and by the
/// prefix budget alone.
#[derive(Debug)]
pub(crate) struct CppoTask {
    pub(crate) ci: usize,
    pub(crate) delta: f64,
    params: Cppo,
    seq: Decisions,
    /// The next valid token of the sequence.
    t: usize,
    d: Vec<f64>,
    out: Vec<bool>,
    pub(crate) drops: (usize, usize),
}

impl CppoTask {
    pub(crate) fn new((ci, delta): (usize, f64), params: Cppo) -> Self {
        CppoTask {
            ci,
            delta,
            params,
            seq: Decisions::default(),
            t: 0,
            d: Vec::new(),
            out: Vec::new(),
            drops: (0, 0),
        }
    }

    /// The sequence at `a..e`: its valid tokens' `D_t` and update directions read, its
    /// decisions made. `None` where the pass steps aside (as its tiles would: a mask value
    /// other than 0/1, a non-finite valid log-prob; no advantages, which the full path names).
    pub(crate) fn start(&mut self, inp: &LeanInputs<'_>, (a, e): (usize, usize)) -> Option<()> {
        let adv = inp.adv.as_ref()?;
        let mut c = Chunk::new();
        self.d.clear();
        self.out.clear();
        self.t = 0;
        for k in (a..e).step_by(CHUNK) {
            let len = CHUNK.min(e - k);
            c.load(inp, adv, k, len);
            for j in 0..len {
                match c.check(j) {
                    (_, true) => return None,
                    (true, false) => {
                        self.d.push(divergence(c.o[j], c.r[j]));
                        self.out.push(outward(c.a[j], c.o[j] - c.r[j]));
                    }
                    (false, false) => {}
                }
            }
        }
        let (token, prefix) = self
            .seq
            .sequence(&self.d, &self.out, self.delta, self.params);
        self.drops.0 += token;
        self.drops.1 += prefix;
        Some(())
    }

    /// The tile's values (`x`: `Z_t`, 0 at padding; `v` all ones at a valid slot) and drops
    /// (`dd`: 1 dropped), the sequence's next valid tokens in order.
    pub(crate) fn tile(&mut self, v: &[u64], x: &mut [f64], dd: &mut [f64]) {
        for j in 0..x.len() {
            (x[j], dd[j]) = (0.0, 0.0);
            if v[j] != 0 {
                x[j] = self.seq.z.get(self.t).copied().unwrap_or(0.0);
                dd[j] = f64::from(u8::from(self.seq.drop.get(self.t).is_some_and(|&k| k > 0)));
                self.t += 1;
            }
        }
    }
}
