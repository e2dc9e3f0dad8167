//! A resolved config compiled once (per `Corrector`) into the one plan every executor reads:
//! the criteria as `Engine::corrections_pass` executes them ([`MaskCriterion`], their host
//! columns named by what fills them and bound to a step's columns by `correction::head`), the
//! IS rule, which metrics, and whether the fused lean pass serves it.

use crate::config::{Agg, CorrectionConfig, Resolved, Stat};
use crate::engine::plan::{MaskAgg, MaskCriterion, MaskIs, MaskSource};
use crate::error::Result;

/// Most criteria the lean pass serves (more take the full path).
pub(crate) const MAX_LEAN_CRITERIA: usize = 4;

/// What a host column of the plan holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Column {
    /// A column of the statistics table (`kl`, `train_log_prob`, …).
    Table(&'static str),
    /// LN-TRM's token weights `w_t`.
    LnTrm,
    /// OPSM's `−lr` on negative-advantage sequences.
    OpsmValue,
    /// OPSM's weights.
    OpsmWeight,
    /// M2PO's batch-global drop indicator (1 dropped).
    M2poDrop,
    /// CPPO's per-sequence decisions (1 dropped).
    CppoDrop,
    /// The recorded layers of MoE routing (`route_flip`'s sequence mean).
    Recorded,
}

/// The compiled config.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// The config as given: the kept sets' sampling, the temperature, bypass mode.
    pub(crate) config: CorrectionConfig,
    /// The config resolved: criteria, IS rule, DPPO, the token veto, legacy mode, which metrics.
    pub(crate) cfg: Resolved,
    /// The criteria in config order; their column operands index [`Plan::columns`].
    pub(crate) criteria: Vec<MaskCriterion>,
    /// Each criterion's option name.
    pub(crate) names: Vec<String>,
    pub(crate) columns: Vec<Column>,
    /// Each criterion's bounds as its metrics compare its values (k1's in log space; M2PO's and
    /// CPPO's their τ, where the engines compare a drop indicator with 0.5).
    pub(crate) metric_bounds: Vec<(Option<f64>, f64)>,
    pub(crate) is: Option<MaskIs>,
    /// trmask's own metrics too, not verl's only.
    pub(crate) diag: bool,
    /// `trmask analyze`'s table reductions too (the fused pass's `stats::TableAcc`; needs
    /// `diag`).
    pub(crate) analyze: bool,
    /// With `analyze`: the table column (`stats::COLUMNS`) and the lower bound of each token
    /// criterion whose sweep the fused pass feeds (`analysis::sweep::TokenValues`), in config
    /// order.
    pub(crate) token_sweeps: Vec<(usize, Option<f64>)>,
    /// The token veto's τ (legacy verl semantics: a sequence with any ρ_t < τ is rejected).
    pub(crate) veto: Option<f64>,
    /// Legacy mode or DPPO: finished on the host by the full path.
    host_finish: bool,
    /// The criteria the fused pass treats apart, found once.
    special: Special,
}

/// Where the plan's criteria that the fused pass treats apart are (see the accessors).
#[derive(Clone, Copy, Debug, Default)]
struct Special {
    opsm: bool,
    lntrm: Option<(Option<f64>, Option<f64>)>,
    m2po: Option<(usize, f64)>,
    cppo: Option<(usize, f64)>,
}

impl Plan {
    /// Checks, resolves and compiles `config` (an error names the bad key).
    pub(crate) fn compile(config: &CorrectionConfig) -> Result<Plan> {
        Ok(Plan::new(config.clone(), config.resolve()?))
    }

    /// Only verl's metrics (`on`), or trmask's too.
    pub(crate) fn verl_metrics_only(&mut self, on: bool) {
        self.cfg.verl_metrics_only = on;
        self.diag = !on;
    }

    pub(crate) fn histograms(&mut self, on: bool) {
        self.cfg.histograms = on;
    }

    fn new(config: CorrectionConfig, r: Resolved) -> Plan {
        let mut columns = Vec::new();
        let mut col = |c: Column| match columns.iter().position(|&k| k == c) {
            Some(j) => j,
            None => {
                columns.push(c);
                columns.len() - 1
            }
        };
        let mut criteria = Vec::with_capacity(r.criteria.len());
        let mut metric_bounds = Vec::with_capacity(r.criteria.len());
        for c in &r.criteria {
            let source = match c.stat {
                Stat::K1 => MaskSource::K1,
                Stat::K2 => MaskSource::K2,
                Stat::K3 if c.is_verl() => MaskSource::K3Verl,
                Stat::K3 => MaskSource::K3,
                Stat::Abs => MaskSource::Abs,
                Stat::Ser => MaskSource::Ser,
                Stat::LnTrm => MaskSource::SerWeighted(col(Column::LnTrm)),
                // −lr on negative-advantage sequences (column j), their weights (column j + 1)
                Stat::Opsm => {
                    let j = col(Column::OpsmValue);
                    col(Column::OpsmWeight);
                    MaskSource::Column(j)
                }
                // the host's batch-global drop indicator (1 dropped), kept iff ≤ 0.5
                Stat::M2po => MaskSource::Column(col(Column::M2poDrop)),
                // the host's per-sequence CPPO decisions (1 dropped), kept iff ≤ 0.5
                Stat::Cppo => MaskSource::Column(col(Column::CppoDrop)),
                // from both log-probs (columns j, j + 1) and the log-ratio
                Stat::BinaryKl => {
                    let j = col(Column::Table("train_log_prob"));
                    col(Column::Table("rollout_log_prob"));
                    MaskSource::BinaryKl(j)
                }
                s => MaskSource::Column(col(Column::Table(s.name()))),
            };
            let agg = match c.agg {
                Agg::Token => MaskAgg::Token,
                Agg::SeqSum => MaskAgg::Sum,
                // the fraction of the sequence's recorded tokens that flipped
                Agg::SeqMean if c.stat == Stat::RouteFlip => {
                    MaskAgg::WeightedMean(col(Column::Recorded))
                }
                Agg::SeqMean if c.is_verl() => MaskAgg::MeanVerl,
                Agg::SeqMean => MaskAgg::Mean,
                Agg::SeqMax => MaskAgg::Max,
                Agg::LnTrm => MaskAgg::WeightedMean(col(Column::LnTrm)),
                Agg::Opsm => MaskAgg::WeightedMean(col(Column::OpsmWeight)),
            };
            let bounds = if c.is_k1() {
                (c.lower.map(f64::ln), c.upper.ln())
            } else {
                (None, c.upper)
            };
            metric_bounds.push(bounds);
            let (lower, upper) = if matches!(c.stat, Stat::M2po | Stat::Cppo) {
                (None, 0.5)
            } else {
                bounds
            };
            criteria.push(MaskCriterion {
                source,
                agg,
                lower,
                upper,
            });
        }
        let mut plan = Plan {
            criteria,
            names: r.criteria.iter().map(|c| c.name.clone()).collect(),
            columns,
            metric_bounds,
            is: r.is,
            diag: !r.verl_metrics_only,
            analyze: false,
            token_sweeps: Vec::new(),
            veto: r.token_veto,
            host_finish: r.legacy.is_some() || r.dppo.is_some(),
            config,
            cfg: r,
            special: Special::default(),
        };
        plan.special = Special {
            opsm: plan
                .criteria
                .iter()
                .any(|c| plan.reads(c, Column::OpsmValue)),
            lntrm: (plan.criteria.iter())
                .any(|c| matches!(c.source, MaskSource::SerWeighted(_)))
                .then_some((plan.cfg.ln_trm.eps, plan.cfg.ln_trm.delta)),
            m2po: plan.bound_of(Column::M2poDrop),
            cppo: plan.bound_of(Column::CppoDrop),
        };
        plan
    }

    /// True where the fused lean pass serves the plan: at most [`MAX_LEAN_CRITERIA`] criteria
    /// on the sampled token's log-ratio alone (no host column but those the pass derives from
    /// the log-ratios, the advantages and the mask: OPSM's, LN-TRM's, M2PO's, CPPO's), nothing
    /// finished on the host.
    pub(crate) fn serves_lean(&self) -> bool {
        let derived = |c: &Column| {
            matches!(
                c,
                Column::OpsmValue
                    | Column::OpsmWeight
                    | Column::LnTrm
                    | Column::M2poDrop
                    | Column::CppoDrop
            )
        };
        !self.host_finish
            && self.columns.iter().all(derived)
            && self.criteria.len() <= MAX_LEAN_CRITERIA
    }

    /// A criterion is OPSM: the sequences' advantage sums are needed.
    pub(crate) fn opsm(&self) -> bool {
        self.special.opsm
    }

    /// M2PO's criterion (its index) and its τ, when a criterion is M2PO.
    pub(crate) fn m2po(&self) -> Option<(usize, f64)> {
        self.special.m2po
    }

    /// CPPO's criterion (its index) and its δ, when a criterion is CPPO.
    pub(crate) fn cppo(&self) -> Option<(usize, f64)> {
        self.special.cppo
    }

    /// The criterion whose statistic is the host column `col` (its index), and its metrics'
    /// upper bound.
    fn bound_of(&self, col: Column) -> Option<(usize, f64)> {
        let ci = self.criteria.iter().position(|c| self.reads(c, col))?;
        Some((ci, self.metric_bounds[ci].1))
    }

    /// The criterion's statistic is the host column `col`.
    fn reads(&self, c: &MaskCriterion, col: Column) -> bool {
        matches!(c.source, MaskSource::Column(j) if self.columns.get(j) == Some(&col))
    }

    /// LN-TRM's `(ε, δ)` when a criterion is LN-TRM (its token weights need each sequence's
    /// valid length before its first tile).
    pub(crate) fn lntrm(&self) -> Option<(Option<f64>, Option<f64>)> {
        self.special.lntrm
    }
}
