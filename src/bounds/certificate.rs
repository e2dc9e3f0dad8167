//! The TRM paper's bounds as a per-batch certificate (docs/FORMAT.md, Bound certificate).
//!
//! From one batch trmask estimates the bound inputs and reports the unified bound B* over all
//! sequences and over the accepted ones:
//!
//! * `δ̂` = batch max of the exact per-token KL(π_roll‖π_train) and `ε̂` = batch max of the exact
//!   per-token TV, when logits are given. From sampled log-probs alone no maximum over the
//!   vocabulary can be certified: `δ̂` is then the batch max of the k3 estimator and `ε̂` is left
//!   to Pinsker (`√(δ̂/2)`), and `trmask/bound_certified` is 0.
//! * `D_KL^seq` = the largest per-sequence sum of exact KL (or of k3 without logits);
//!   `D_TV^seq` is filled by the paper's relaxation `√(D_KL^seq/2)`.
//! * `D̄_t` = the largest `½|ρ_t − 1|` at response position t over the sequences (t counts valid
//!   tokens from 1), capped at 1.
//! * `T` = the longest sequence considered.
//!
//! **Limits.** The theorems need the *global* maximum divergence over every context the policy
//! can reach; a batch maximum only estimates it from below. The certificate says what the bound
//! would be if the batch were representative — it is a diagnostic, not a proof.

use crate::bounds::{compute, BoundInputs, Bounds};
use crate::error::Result;
use crate::input::batch::Segments;
use crate::partial::{Acc, CertAcc, Partial};
use crate::stats::StatTable;
use std::collections::BTreeMap;

/// The bound names in the order `trmask/bound_<set>_argmin` indexes them.
pub const ARGMIN_ORDER: [&str; 6] = ["pm_kl", "pm_tv", "mix_kl", "mix_tv", "coupling", "adaptive"];

/// Certificates over all sequences and over the accepted ones.
#[derive(Clone, Debug)]
pub struct Certificate {
    /// True when δ̂ and ε̂ come from exact vocabulary divergences (logits were given).
    pub exact: bool,
    /// Bounds over every non-empty sequence (`None` when the batch has no token).
    pub all: Option<Bounds>,
    /// Bounds over the accepted non-empty sequences (`None` when none is accepted).
    pub accepted: Option<Bounds>,
}

/// The plain statement printed beside the numbers.
pub const CAVEAT: &str = "bound certificate: a batch maximum only estimates the global maximum divergence the theorem needs; B* is a diagnostic, not a proof";

/// The certificate's inputs over the sequences `keep` selects, as a mergeable accumulator
/// (`None` when the table has neither `kl` nor `k3`).
fn partial_for(
    table: &StatTable,
    segments: &Segments,
    keep: &dyn Fn(usize) -> bool,
) -> Option<CertAcc> {
    let exact = table.stats.contains_key("kl") && table.stats.contains_key("tv");
    let kl = table.stats.get("kl").or_else(|| table.stats.get("k3"))?;
    let tv = if exact { table.stats.get("tv") } else { None };
    let ser = table.stats.get("ser");
    let mut c = CertAcc {
        exact,
        has_eps: tv.is_some(),
        ..CertAcc::default()
    };
    for (s, &(a, b)) in segments.ranges().iter().enumerate() {
        if !keep(s) {
            continue;
        }
        let mut t = 0usize;
        let mut sum = 0.0;
        for i in a..b {
            if !segments.mask()[i] {
                continue;
            }
            c.delta = c.delta.max(kl[i]);
            sum += kl[i];
            if let Some(tv) = tv {
                c.eps = c.eps.max(tv[i]);
            }
            if let Some(ser) = ser {
                if c.dbar.len() <= t {
                    c.dbar.push(0.0);
                }
                c.dbar[t] = c.dbar[t].max((0.5 * ser[i]).min(1.0));
            }
            t += 1;
        }
        c.kl_seq = c.kl_seq.max(sum);
        c.horizon = c.horizon.max(t as u64);
    }
    Some(c)
}

/// The bound inputs of a (merged) accumulator; `None` without a token or with an infinite KL
/// (p > 0 where q = 0 leaves nothing to bound).
fn inputs_of(c: &CertAcc) -> Option<BoundInputs> {
    let horizon = c.horizon as usize;
    if horizon == 0 || !c.delta.is_finite() || !c.kl_seq.is_finite() {
        return None;
    }
    Some(BoundInputs {
        horizon,
        delta: c.delta,
        eps: c.has_eps.then(|| c.eps.min(1.0)),
        kl_seq: Some(c.kl_seq),
        tv_seq: None,
        dbar: (c.dbar.len() == horizon).then(|| c.dbar.clone()),
    })
}

/// Keys of the certificate's accumulators in a partial.
pub(crate) const CERT_ALL: &str = "#cert_all";
pub(crate) const CERT_ACCEPTED: &str = "#cert_accepted";

/// One shard's certificate inputs, over all sequences and over the accepted ones.
pub(crate) fn certificate_partial(
    table: &StatTable,
    segments: &Segments,
    accept: &[bool],
    p: &mut Partial,
) {
    p.put(CERT_ALL, Acc::Cert(partial_for(table, segments, &|_| true)));
    let acc = partial_for(table, segments, &|s| accept.get(s).copied().unwrap_or(true));
    p.put(CERT_ACCEPTED, Acc::Cert(acc));
}

/// The certificate of a (merged) partial holding [`certificate_partial`]'s accumulators.
pub(crate) fn certificate_finish(p: &Partial) -> Result<Option<Certificate>> {
    let get = |k: &str| match p.get(k) {
        Some(Acc::Cert(Some(c))) => Some(c),
        _ => None,
    };
    let Some(all) = get(CERT_ALL) else {
        return Ok(None);
    };
    let Some(all_in) = inputs_of(all) else {
        return Ok(None);
    };
    let accepted = match get(CERT_ACCEPTED).and_then(inputs_of) {
        Some(inp) => Some(compute(&inp)?),
        None => None,
    };
    Ok(Some(Certificate {
        exact: all.exact,
        all: Some(compute(&all_in)?),
        accepted,
    }))
}

/// Computes the certificate from per-token statistics and the per-sequence accept flags.
#[cfg(test)]
pub fn certificate(
    table: &StatTable,
    segments: &Segments,
    accept: &[bool],
) -> Result<Option<Certificate>> {
    let mut p = Partial::new();
    certificate_partial(table, segments, accept, &mut p);
    certificate_finish(&p)
}

impl Certificate {
    /// The `trmask/bound_*` metrics: for `all` and `accepted`, every bound value
    /// (`trmask/bound_all_unified`, `trmask/bound_all_pm_kl`, …), the inputs used
    /// (`…_horizon`, `…_delta`, `…_eps`, `…_kl_seq`, `…_tv_seq`) and the argmin as an index into
    /// `ARGMIN_ORDER` (`…_argmin`); plus `trmask/bound_certified` (1 with exact divergences).
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        m.insert(
            "trmask/bound_certified".to_string(),
            self.exact as u8 as f64,
        );
        for (set, b) in [("all", &self.all), ("accepted", &self.accepted)] {
            let Some(b) = b else { continue };
            for (name, v) in b.entries() {
                m.insert(format!("trmask/bound_{set}_{name}"), v);
            }
            let i = &b.inputs;
            for (name, v) in [
                ("horizon", i.horizon as f64),
                ("delta", i.delta),
                ("eps", i.eps),
                ("kl_seq", i.kl_seq),
                ("tv_seq", i.tv_seq),
            ] {
                m.insert(format!("trmask/bound_{set}_{name}"), v);
            }
            let idx = ARGMIN_ORDER
                .iter()
                .position(|&n| n == b.argmin)
                .map_or(f64::NAN, |p| p as f64);
            m.insert(format!("trmask/bound_{set}_argmin"), idx);
        }
        m
    }

    /// A few human-readable lines for the CLI.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for (set, b) in [
            ("all sequences", &self.all),
            ("accepted sequences", &self.accepted),
        ] {
            if let Some(b) = b {
                s.push_str(&format!(
                    "B* over {set}: {:.6e} (argmin {}, T = {}, delta = {:.3e}, eps = {:.3e})\n",
                    b.unified, b.argmin, b.inputs.horizon, b.inputs.delta, b.inputs.eps
                ));
            }
        }
        if !self.exact {
            s.push_str("no logits: the per-token maximum cannot be certified from samples (delta from the k3 estimator)\n");
        }
        s.push_str(CAVEAT);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_from_exact_stats() {
        // Two sequences: [0.01, 0.02] and [0.04]; TV alongside; ser gives D̄.
        let segments = Segments::new(vec![(0, 3), (3, 4)], vec![true, true, false, true]).unwrap();
        let mut table = StatTable::default();
        table
            .stats
            .insert("kl".into(), vec![0.01, 0.02, f64::NAN, 0.04]);
        table
            .stats
            .insert("tv".into(), vec![0.05, 0.1, f64::NAN, 0.2]);
        table
            .stats
            .insert("ser".into(), vec![0.2, 0.4, f64::NAN, 0.6]);
        let c = certificate(&table, &segments, &[true, false])
            .unwrap()
            .unwrap();
        assert!(c.exact);
        let all = c.all.as_ref().unwrap();
        assert_eq!(all.inputs.horizon, 2);
        assert_eq!(all.inputs.delta, 0.04);
        assert_eq!(all.inputs.eps, 0.2);
        assert!((all.inputs.kl_seq - 0.04).abs() < 1e-15);
        assert_eq!(
            all.inputs.dbar,
            crate::bounds::Dbar::Profile(vec![0.3, 0.2])
        );
        let acc = c.accepted.as_ref().unwrap();
        assert_eq!(acc.inputs.delta, 0.02);
        assert!((acc.inputs.kl_seq - 0.03).abs() < 1e-15);
        let want = compute(&BoundInputs {
            horizon: 2,
            delta: 0.02,
            eps: Some(0.1),
            kl_seq: Some(0.03),
            tv_seq: None,
            dbar: Some(vec![0.1, 0.2]),
        })
        .unwrap();
        assert_eq!(acc.unified, want.unified);
        let m = c.metrics();
        assert_eq!(m["trmask/bound_certified"], 1.0);
        assert_eq!(m["trmask/bound_accepted_unified"], want.unified);
        assert!(c.summary().contains("global maximum"));
    }

    #[test]
    fn samples_only_are_not_certified_and_empty_is_none() {
        let segments = Segments::new(vec![(0, 2)], vec![true, true]).unwrap();
        let mut table = StatTable::default();
        table.stats.insert("k3".into(), vec![0.001, 0.003]);
        table.stats.insert("ser".into(), vec![0.05, 0.08]);
        let c = certificate(&table, &segments, &[true]).unwrap().unwrap();
        assert!(!c.exact);
        assert_eq!(c.all.as_ref().unwrap().inputs.delta, 0.003);
        assert!(c.all.as_ref().unwrap().filled.contains(&"eps"));
        let empty = Segments::new(vec![(0, 0)], vec![]).unwrap();
        assert!(certificate(&table, &empty, &[true]).unwrap().is_none());
    }
}
