//! A [`Partial`] as a flat byte buffer (little-endian), so any transport — MPI, a
//! `torch.distributed` uint8 tensor, a file — can carry it.
//!
//! Layout: `b"TRMP"`, version `u8` (1), entry count `u32`, then per entry: key length `u16`,
//! the key (UTF-8), a tag `u8` and the payload (f64 and u64 as 8 bytes, vectors as a `u64`
//! length then their elements). Decoding checks every length against the bytes left, so a bad
//! buffer is an error naming `partial`, never an allocation sized by an untrusted number.

use super::acc::{Acc, CertAcc, Empty, FracMode, Sum};
use super::set::Partial;
use crate::error::{Error, Result};
use std::collections::BTreeMap;

const MAGIC: &[u8; 4] = b"TRMP";
const VERSION: u8 = 1;

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, x: u8) {
        self.0.push(x);
    }
    fn u64(&mut self, x: u64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn f64(&mut self, x: f64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn sum(&mut self, s: Sum) {
        self.f64(s.hi);
        self.f64(s.lo);
    }
    fn empty(&mut self, e: Empty) {
        self.u8(match e {
            Empty::Compute => 0,
            Empty::Absent => 1,
            Empty::Zero => 2,
        });
    }
}

struct R<'a> {
    b: &'a [u8],
}

fn bad(what: impl Into<String>) -> Error {
    Error::input("partial", what.into())
}

impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(bad("is truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_bits(self.u64()?))
    }
    fn sum(&mut self) -> Result<Sum> {
        Ok(Sum {
            hi: self.f64()?,
            lo: self.f64()?,
        })
    }
    fn empty(&mut self) -> Result<Empty> {
        match self.u8()? {
            0 => Ok(Empty::Compute),
            1 => Ok(Empty::Absent),
            2 => Ok(Empty::Zero),
            t => Err(bad(format!("has an unknown empty rule {t}"))),
        }
    }
    /// A vector length whose `width`-byte elements fit in the bytes left.
    fn len(&mut self, width: usize) -> Result<usize> {
        let n = self.u64()?;
        if n > (self.b.len() / width) as u64 {
            return Err(bad(format!(
                "claims {n} elements, more than its bytes hold"
            )));
        }
        Ok(n as usize)
    }
}

impl Partial {
    /// The flat byte buffer of this partial (see the module's layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(64 * self.accs.len() + 9));
        w.0.extend_from_slice(MAGIC);
        w.u8(VERSION);
        w.0.extend_from_slice(&(self.accs.len() as u32).to_le_bytes());
        for (k, a) in &self.accs {
            let kb = &k.as_bytes()[..k.len().min(u16::MAX as usize)];
            w.0.extend_from_slice(&(kb.len() as u16).to_le_bytes());
            w.0.extend_from_slice(kb);
            encode(&mut w, a);
        }
        w.0
    }

    /// Decodes [`to_bytes`](Self::to_bytes)'s buffer (an error naming `partial` when it is not
    /// one).
    pub fn from_bytes(bytes: &[u8]) -> Result<Partial> {
        let mut r = R { b: bytes };
        if r.take(4).ok() != Some(&MAGIC[..]) {
            return Err(bad("is not a trmask partial (no TRMP header)"));
        }
        let v = r.u8()?;
        if v != VERSION {
            return Err(bad(format!(
                "has version {v}, this trmask reads version {VERSION}"
            )));
        }
        let mut c = [0u8; 4];
        c.copy_from_slice(r.take(4)?);
        let count = u32::from_le_bytes(c);
        let mut accs = BTreeMap::new();
        for _ in 0..count {
            let mut l = [0u8; 2];
            l.copy_from_slice(r.take(2)?);
            let key = std::str::from_utf8(r.take(u16::from_le_bytes(l) as usize)?)
                .map_err(|_| bad("has a key that is not UTF-8"))?
                .to_string();
            let acc = decode(&mut r).map_err(|e| bad(format!("entry {key}: {e}")))?;
            accs.insert(key, acc);
        }
        if !r.b.is_empty() {
            return Err(bad(format!("has {} bytes after its last entry", r.b.len())));
        }
        Ok(Partial { accs })
    }
}

fn encode(w: &mut W, a: &Acc) {
    match a {
        Acc::MaskedMean { sum, n, offset } => {
            w.u8(0);
            w.sum(*sum);
            w.u64(*n);
            w.f64(*offset);
        }
        Acc::Mean {
            sum,
            n,
            offset,
            empty,
        } => {
            w.u8(1);
            w.sum(*sum);
            w.u64(*n);
            w.f64(*offset);
            w.empty(*empty);
        }
        Acc::Frac { k, n, mode, empty } => {
            w.u8(2);
            w.u64(*k);
            w.u64(*n);
            w.u8(*mode as u8);
            w.empty(*empty);
        }
        Acc::Max { v, empty } | Acc::Min { v, empty } => {
            w.u8(if matches!(a, Acc::Max { .. }) { 3 } else { 4 });
            w.f64(*v);
            w.empty(*empty);
        }
        Acc::VerlStd { s1, s2, n } | Acc::Ess { s1, s2, n } => {
            w.u8(if matches!(a, Acc::VerlStd { .. }) {
                5
            } else {
                9
            });
            w.sum(*s1);
            w.sum(*s2);
            w.u64(*n);
        }
        Acc::VerlEss { s1, s2, n, key } => {
            w.u8(6);
            w.sum(*s1);
            w.sum(*s2);
            w.u64(*n);
            w.u8(*key);
        }
        Acc::Moments { n, mean, m2 } => {
            w.u8(7);
            w.u64(*n);
            w.f64(*mean);
            w.f64(*m2);
        }
        Acc::CoMoments {
            n,
            mx,
            my,
            cxx,
            cyy,
            cxy,
        } => {
            w.u8(8);
            w.u64(*n);
            for x in [mx, my, cxx, cyy, cxy] {
                w.f64(*x);
            }
        }
        Acc::Quantiles(v) => {
            w.u8(10);
            w.u64(v.len() as u64);
            v.iter().for_each(|&x| w.f64(x));
        }
        Acc::Groups(g) => {
            w.u8(11);
            w.u64(g.len() as u64);
            for (&uid, &(n, k)) in g {
                w.u64(uid as u64);
                w.u64(n);
                w.u64(k);
            }
        }
        Acc::Const(v) => {
            w.u8(12);
            w.f64(*v);
        }
        Acc::Cert(c) => {
            w.u8(13);
            match c {
                None => w.u8(0),
                Some(c) => {
                    w.u8(1 | (c.exact as u8) << 1 | (c.has_eps as u8) << 2);
                    w.f64(c.delta);
                    w.f64(c.eps);
                    w.f64(c.kl_seq);
                    w.u64(c.horizon);
                    w.u64(c.dbar.len() as u64);
                    c.dbar.iter().for_each(|&x| w.f64(x));
                }
            }
        }
        Acc::Count(c) => {
            w.u8(14);
            w.u64(*c);
        }
        Acc::Hist(h) => {
            w.u8(15);
            w.u64(h.counts.len() as u64);
            h.counts.iter().for_each(|&c| w.u64(c));
        }
        Acc::Ratio { num, den } => {
            w.u8(16);
            w.sum(*num);
            w.sum(*den);
        }
    }
}

fn decode(r: &mut R) -> Result<Acc> {
    let tag = r.u8()?;
    Ok(match tag {
        0 => Acc::MaskedMean {
            sum: r.sum()?,
            n: r.u64()?,
            offset: r.f64()?,
        },
        1 => Acc::Mean {
            sum: r.sum()?,
            n: r.u64()?,
            offset: r.f64()?,
            empty: r.empty()?,
        },
        2 => Acc::Frac {
            k: r.u64()?,
            n: r.u64()?,
            mode: match r.u8()? {
                0 => FracMode::F64,
                1 => FracMode::F32,
                2 => FracMode::Complement,
                m => return Err(bad(format!("unknown fraction mode {m}"))),
            },
            empty: r.empty()?,
        },
        3 => Acc::Max {
            v: r.f64()?,
            empty: r.empty()?,
        },
        4 => Acc::Min {
            v: r.f64()?,
            empty: r.empty()?,
        },
        5 => Acc::VerlStd {
            s1: r.sum()?,
            s2: r.sum()?,
            n: r.u64()?,
        },
        6 => Acc::VerlEss {
            s1: r.sum()?,
            s2: r.sum()?,
            n: r.u64()?,
            key: r.u8()?,
        },
        7 => Acc::Moments {
            n: r.u64()?,
            mean: r.f64()?,
            m2: r.f64()?,
        },
        8 => Acc::CoMoments {
            n: r.u64()?,
            mx: r.f64()?,
            my: r.f64()?,
            cxx: r.f64()?,
            cyy: r.f64()?,
            cxy: r.f64()?,
        },
        9 => Acc::Ess {
            s1: r.sum()?,
            s2: r.sum()?,
            n: r.u64()?,
        },
        10 => {
            let n = r.len(8)?;
            Acc::Quantiles((0..n).map(|_| r.f64()).collect::<Result<_>>()?)
        }
        11 => {
            let n = r.len(24)?;
            let mut g = BTreeMap::new();
            for _ in 0..n {
                let uid = r.u64()? as i64;
                g.insert(uid, (r.u64()?, r.u64()?));
            }
            Acc::Groups(g)
        }
        12 => Acc::Const(r.f64()?),
        13 => match r.u8()? {
            0 => Acc::Cert(None),
            f => {
                let (delta, eps, kl_seq, horizon) = (r.f64()?, r.f64()?, r.f64()?, r.u64()?);
                let n = r.len(8)?;
                let dbar = (0..n).map(|_| r.f64()).collect::<Result<_>>()?;
                Acc::Cert(Some(CertAcc {
                    exact: f & 2 != 0,
                    has_eps: f & 4 != 0,
                    delta,
                    eps,
                    kl_seq,
                    horizon,
                    dbar,
                }))
            }
        },
        14 => Acc::Count(r.u64()?),
        15 => {
            let n = r.len(8)?;
            let counts = (0..n).map(|_| r.u64()).collect::<Result<_>>()?;
            Acc::Hist(super::hist::Hist { counts })
        }
        16 => Acc::Ratio {
            num: r.sum()?,
            den: r.sum()?,
        },
        t => return Err(bad(format!("unknown accumulator tag {t}"))),
    })
}
