//! The lean pass's compiled plan: which criteria and IS weights it executes.

use crate::config::{Agg, IsSpec, Resolved, Stat};

/// Most criteria the lean pass serves (more take the full path).
pub(crate) const MAX_CRITERIA: usize = 4;

/// The per-token statistic of a lean criterion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Src {
    K1,
    K2,
    K3,
    K3Verl,
    Abs,
    Ser,
}

/// How a lean criterion aggregates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum LAgg {
    Token,
    Sum,
    MeanVerl,
    Mean,
    Max,
}

/// One criterion of a [`LeanPlan`]: keep iff `lower ≤ stat ≤ upper` (log space for k1).
#[derive(Clone, Debug)]
pub(crate) struct LCrit {
    pub(crate) src: Src,
    pub(crate) agg: LAgg,
    pub(crate) lower: Option<f64>,
    pub(crate) upper: f64,
    pub(crate) name: String,
}

impl LCrit {
    pub(crate) fn keep(&self, x: f64) -> bool {
        self.lower.is_none_or(|l| x >= l) && x <= self.upper
    }
}

/// What the lean pass executes for a config.
#[derive(Clone, Debug)]
pub struct LeanPlan {
    pub(crate) criteria: Vec<LCrit>,
    pub(crate) is: Option<IsSpec>,
    /// trmask's own metrics too (the diagnostics fed from each tile), not verl's only.
    pub(crate) diag: bool,
    /// `trmask analyze`'s table reductions too (`stats::TableAcc`; needs `diag`).
    pub(crate) analyze: bool,
}

/// The lean pass's plan for `r`, `None` where it does not serve the config.
pub(crate) fn plan(r: &Resolved) -> Option<LeanPlan> {
    if r.legacy.is_some()
        || r.dppo.is_some()
        || r.token_veto.is_some()
        || r.criteria.len() > MAX_CRITERIA
    {
        return None;
    }
    let mut criteria = Vec::with_capacity(r.criteria.len());
    for c in &r.criteria {
        let src = match c.stat {
            Stat::K1 => Src::K1,
            Stat::K2 => Src::K2,
            Stat::K3 if c.is_verl() => Src::K3Verl,
            Stat::K3 => Src::K3,
            Stat::Abs => Src::Abs,
            Stat::Ser => Src::Ser,
            _ => return None,
        };
        let agg = match c.agg {
            Agg::Token => LAgg::Token,
            Agg::SeqSum => LAgg::Sum,
            Agg::SeqMean if c.is_verl() => LAgg::MeanVerl,
            Agg::SeqMean => LAgg::Mean,
            Agg::SeqMax => LAgg::Max,
            Agg::LnTrm | Agg::Opsm => return None,
        };
        let (lower, upper) = if c.is_k1() {
            (c.lower.map(f64::ln), c.upper.ln())
        } else {
            (None, c.upper)
        };
        criteria.push(LCrit {
            src,
            agg,
            lower,
            upper,
            name: c.name.clone(),
        });
    }
    Some(LeanPlan {
        criteria,
        is: r.is,
        diag: !r.verl_metrics_only,
        analyze: false,
    })
}

/// IS weight of a raw ratio: TIS `min(raw, U)` or IcePop (`raw` inside `[L, U]`, else 0).
#[inline]
pub(crate) fn is_weight(is: &IsSpec, raw: f64) -> f64 {
    match is.lower {
        None => raw.min(is.upper),
        Some(l) if raw >= l && raw <= is.upper => raw,
        Some(_) => 0.0,
    }
}
