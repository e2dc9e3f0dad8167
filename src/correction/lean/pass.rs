//! The per-sequence kernel of the lean pass and its parallel driver.

use super::cppo::CppoTask;
use super::finish::{batch_norm_factor, chunk_partial, diag_partial, SeqRec};
use super::inputs::{LeanInputs, LeanLayout};
use super::m2po;
use super::outputs::{details, vetoes};
use super::stats::{Accs, TableAcc};
use super::tasks::{run_tasks, split_tasks, Task};
use super::tile::{Cols, SeqLanes, TILE};
use crate::config::IsLevel;
use crate::correction::cppo;
use crate::correction::m2po::M2poTask;
use crate::correction::plan::Plan;
use crate::engine::plan::MaskAgg;
use crate::error::Result;
use crate::input::values::{Outputs, WeightsOut};
use crate::math::{exp_bounded, LANES};
use crate::metrics::diag::{DiagAcc, Feeds, SeqDiag};
use crate::partial::{Exchange, Partial};
use crate::stats::{Corrections, SAFETY_BOUND};
use rayon::prelude::*;
use std::sync::Mutex;

/// A task and the per-task state of the criteria decided outside the tiles (M2PO's rule,
/// CPPO's sequences).
type Host<'t, 'o> = (&'t mut Task<'o>, Option<M2poTask>, Option<&'t mut CppoTask>);

/// Runs the lean pass: this shard's decisions (metrics left empty), its metric partial (to be
/// exchanged and finished by the caller) and, where `plan.analyze`, `trmask analyze`'s table
/// reductions; or `Ok(None)` when it steps aside (the caller runs the full path, which
/// overwrites every output slot). `ex` carries the batch-norm factor between ranks.
pub(crate) fn run(
    plan: &Plan,
    inp: &LeanInputs<'_>,
    out: &mut Outputs<'_>,
    ex: &mut dyn Exchange,
) -> Result<Option<(Corrections, Partial, Option<TableAcc>)>> {
    let Some(ranges) = inp.ranges() else {
        return Ok(None);
    };
    if (plan.opsm() || plan.m2po().is_some() || plan.cppo().is_some()) && inp.adv.is_none() {
        return Ok(None); // the full path names the missing advantages
    }
    let slots = ranges.last().map_or(0, |r| r.1);
    let slots = match inp.layout {
        LeanLayout::Padded { .. } => inp.mask.map_or(slots, |m| m.len()),
        LeanLayout::Packed(_) => slots,
    };
    // `trmask analyze` keeps no weights: it passes no buffer, and none is written
    let weights = out.weights.as_ref().map(|w| w.len());
    let weights_fit = weights == plan.is.map(|_| slots) || (plan.analyze && weights.is_none());
    if out.mask.len() != slots || !weights_fit {
        return Ok(None);
    }
    let deferred = plan.is.is_some_and(|is| is.batch_normalize);
    let tasks = split_tasks(&ranges, slots, out);
    // M2PO's batch-global rule, decided before the tiles apply it
    let m2po = match plan.m2po() {
        Some(spec) => {
            let spans = tasks.iter().map(|t| t.seqs.clone()).collect();
            match m2po::plan_tasks(spec, inp, &ranges, spans, ex)? {
                Some(m) => Some(m),
                None => return Ok(None),
            }
        }
        None => None,
    };
    let per_task: Vec<Option<M2poTask>> = match &m2po {
        Some((ts, _)) => ts.iter().copied().map(Some).collect(),
        None => vec![None; tasks.len()],
    };
    let feeds = Feeds {
        prob: true,
        entropy: false,
        adv: inp.adv.is_some(),
        weights: plan.is.is_some(),
    };
    let certs = Mutex::default();
    let work = tasks.into_iter().zip(per_task).collect();
    let chunks = run_tasks(work, |(mut t, mp)| {
        let mut diag = plan.diag.then(|| DiagAcc::new(plan.cfg.histograms));
        let mut st = plan.analyze.then(|| TableAcc::new(&plan.token_sweeps));
        let mut cp = plan.cppo().map(|c| CppoTask::new(c, plan.cfg.cppo));
        let acc = (diag.as_mut(), st.as_mut());
        let host = (&mut t, mp, cp.as_mut());
        let recs = kernel(plan, inp, &ranges, host, deferred, &feeds, acc);
        st.iter_mut().for_each(|s| s.shed(&certs));
        recs.map(|r| (r, diag, st, cp.map_or((0, 0), |c| c.drops)))
    });
    let mut recs = Vec::with_capacity(ranges.len());
    let mut diag = plan.diag.then(|| DiagAcc::new(plan.cfg.histograms));
    let mut table = plan.analyze.then(|| TableAcc::new(&plan.token_sweeps));
    let mut cppo_drops = (0, 0);
    for c in chunks {
        let Some(Some((r, d, st, drops))) = c else {
            return Ok(None);
        };
        recs.extend(r);
        cppo_drops = (cppo_drops.0 + drops.0, cppo_drops.1 + drops.1);
        if let (Some(all), Some(d)) = (diag.as_mut(), d) {
            all.merge(&d);
        }
        if let (Some(all), Some(st)) = (table.as_mut(), st) {
            all.merge(st);
        }
    }
    if let Some(t) = table.as_mut() {
        t.absorb(certs);
    }
    // this shard's metrics: one partial of every sequence's record, in order
    let mut merged = chunk_partial(plan, &recs);
    let n_tok: u64 = recs.iter().map(|r| r.n).sum();
    if let (Some((_, summary)), Some((ci, _))) = (&m2po, plan.m2po()) {
        let pre = format!("rollout_corr/rollout_rs_{}", plan.names[ci]);
        summary.metrics(n_tok as usize, &pre, &mut merged);
    }
    if let Some((ci, _)) = plan.cppo() {
        let pre = format!("rollout_corr/rollout_rs_{}", plan.names[ci]);
        cppo::metrics(cppo_drops, n_tok as usize, &pre, &mut merged);
    }
    if n_tok == 0 && ex.size() <= 1 {
        return Ok(None); // the full path's "no valid token" error
    }
    if let (Some(is), true) = (plan.is, deferred) {
        let wmean = batch_norm_factor(&mut merged, is, ex)?;
        let tasks = split_tasks(&ranges, slots, out);
        tasks
            .into_par_iter()
            .for_each(|mut t| write_normalised(plan, inp, &ranges, &recs, &mut t, wmean));
        if let Some(d) = diag.as_mut() {
            d.ess_scale = Some(1.0 / wmean);
        }
    }
    let c = details(plan, &recs);
    if let Some(d) = &diag {
        let n_rej: u64 = recs.iter().map(SeqRec::n_dropped).sum();
        diag_partial(&c, (n_tok, n_tok - n_rej), d, &feeds, inp.uid, &mut merged);
    }
    Ok(Some((c, merged, table)))
}

/// One task: every sequence's record, its weights (unless `deferred`) and mask written;
/// `None` on an input the pass does not vouch for. On x86-64 CPUs with AVX2 the same code runs
/// compiled for it (wider vectors, no FMA: the same bits as without).
#[allow(clippy::too_many_arguments)]
fn kernel(
    plan: &Plan,
    inp: &LeanInputs<'_>,
    ranges: &[(usize, usize)],
    t: Host<'_, '_>,
    deferred: bool,
    feeds: &Feeds,
    acc: Accs<'_>,
) -> Option<Vec<SeqRec>> {
    let mut cols = Cols::take();
    let c = &mut cols;
    let recs = 'run: {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above).
                break 'run unsafe { kernel_avx512(plan, inp, ranges, t, deferred, c, feeds, acc) };
            }
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                break 'run unsafe { kernel_avx2(plan, inp, ranges, t, deferred, c, feeds, acc) };
            }
        }
        kernel_body(plan, inp, ranges, t, deferred, c, feeds, acc)
    };
    Cols::give(cols);
    recs
}

/// [`kernel_body`] compiled for a CPU feature (callers check that the CPU has it).
macro_rules! kernel_for {
    ($name:ident, $feature:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            plan: &Plan,
            inp: &LeanInputs<'_>,
            ranges: &[(usize, usize)],
            t: Host<'_, '_>,
            deferred: bool,
            cols: &mut Cols,
            feeds: &Feeds,
            acc: Accs<'_>,
        ) -> Option<Vec<SeqRec>> {
            kernel_body(plan, inp, ranges, t, deferred, cols, feeds, acc)
        }
    };
}
kernel_for!(kernel_avx512, "avx512f");
kernel_for!(kernel_avx2, "avx2");

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn kernel_body(
    plan: &Plan,
    inp: &LeanInputs<'_>,
    ranges: &[(usize, usize)],
    (t, mut m2po, mut cppo): Host<'_, '_>,
    deferred: bool,
    cols: &mut Cols,
    feeds: &Feeds,
    (mut diag, mut stats): Accs<'_>,
) -> Option<Vec<SeqRec>> {
    if inp.mask.is_none() {
        cols.m.fill(1); // every slot valid (the columns may hold an earlier call's mask)
    }
    let mut lanes = SeqLanes::default();
    let nc = plan.criteria.len();
    let token_is = plan.is.filter(|is| is.level == IsLevel::Token);
    // the advantages: OPSM's sign, the diagnostics' breakdown
    let host_cols = plan.m2po().is_some() || plan.cppo().is_some();
    let read_adv = plan.opsm() || host_cols || diag.is_some();
    let mut recs = Vec::with_capacity(t.seqs.len());
    // the first slot of the tile whose mask `cols.m_next` holds, and that tile's used length
    let mut have_next: Option<(usize, usize)> = None;
    // slots before the first sequence / between sequences: padding of nobody
    let mut cursor = t.start;
    for s in t.seqs.clone() {
        let (a, e) = ranges[s];
        if a > cursor {
            t.mask.clear(cursor - t.start, a - cursor);
            if let Some(wo) = t.weights.as_mut() {
                wo.fill(cursor - t.start, a - cursor, 0.0);
            }
        }
        let mut rec = SeqRec::default();
        lanes.start(plan, &mut rec);
        if plan.lntrm().is_some() {
            lanes.ln_len = valid_len(inp, (a, e));
        }
        if let Some(cp) = cppo.as_deref_mut() {
            cp.start(inp, (a, e))?;
        }
        let mut sd = SeqDiag::default();
        let mut k = a;
        while k < e {
            let len = TILE.min(e - k);
            let off = k - t.start;
            // the next tile (this sequence's, or the next sequence's first): its mask read
            // now, its log-probs and outputs prefetched only when it holds a valid slot (a
            // padding-only tile is never read), the mask of the tile after it prefetched
            let next = if k + len < e {
                Some((k + len, TILE.min(e - k - len)))
            } else {
                t.seqs
                    .end
                    .gt(&(s + 1))
                    .then(|| ranges[s + 1])
                    .map(|(a2, e2)| (a2, TILE.min(e2 - a2)))
            };
            // the tile up to its last valid (or bad) slot; right padding after it is only
            // cleared (a sum skipping it has the same bits: its terms are 0)
            let used = match &inp.mask {
                Some(mv) => {
                    let used = match have_next {
                        Some((k2, used2)) if k2 == k => {
                            std::mem::swap(&mut cols.m, &mut cols.m_next);
                            used2
                        }
                        _ => {
                            mv.load(k, &mut cols.m[..len]);
                            last_nonzero(&cols.m[..len]).map_or(0, |j| j + 1)
                        }
                    };
                    have_next = None;
                    if let Some((k2, len2)) = next.filter(|&(_, l)| l > 0) {
                        mv.prefetch(k2 + len2, k2 + len2 + TILE);
                        mv.load(k2, &mut cols.m_next[..len2]);
                        let used2 = last_nonzero(&cols.m_next[..len2]).map_or(0, |j| j + 1);
                        if used2 > 0 {
                            prefetch_tile(inp, t, token_is.is_some(), k2, used2);
                        }
                        have_next = Some((k2, used2));
                    }
                    used
                }
                None => {
                    if let Some((k2, len2)) = next {
                        prefetch_tile(inp, t, token_is.is_some(), k2, len2);
                    }
                    len
                }
            };
            // a tile of padding only (0 everywhere, no bad value): nothing to read or add
            if used == 0 {
                sd.gap();
                t.mask.clear(off, len);
                if let (Some(wo), Some(_), false) = (t.weights.as_mut(), &token_is, deferred) {
                    wo.fill(off, len, 0.0);
                }
                k += len;
                continue;
            }
            inp.roll.load(k, &mut cols.r[..used]);
            inp.train.load(k, &mut cols.o[..used]);
            if let (Some(av), true) = (&inp.adv, read_adv) {
                av.load(k, &mut cols.a[..used]);
            }
            // whole octets: the slots up to the next multiple of LANES count as padding (their
            // terms are 0 in every sum; nothing of them is read or written)
            let used8 = used.next_multiple_of(LANES);
            cols.m[used..used8].fill(0);
            cols.tile(
                used8,
                plan,
                token_is.as_ref(),
                (m2po.as_mut(), cppo.as_deref_mut()),
                &mut rec,
                &mut lanes,
            )?;
            if let Some(acc) = diag.as_deref_mut() {
                cols.feed_diag(used, feeds, token_is.is_some(), &mut sd, acc);
                if let Some(st) = stats.as_deref_mut() {
                    st.tile(cols, used, k, inp.adv.is_some());
                }
                if used < len {
                    sd.gap();
                }
            }
            if inp.mask.is_none() {
                cols.m[used..used8].fill(1);
            }
            t.mask.store(off, &cols.keep[..used]);
            let weights = (t.weights.as_mut(), &token_is, deferred);
            if let (Some(wo), Some(_), false) = weights {
                wo.store(off, &cols.w[..used]);
                wo.fill(off + used, len - used, 0.0);
            }
            t.mask.clear(off + used, len - used);
            k += len;
        }
        lanes.finish(plan, &mut rec);
        // sequence decisions
        let mut seq_rejected = false;
        for (ci, cr) in plan.criteria.iter().enumerate().take(nc) {
            if cr.agg != MaskAgg::Token && rec.finish_seq_criterion(ci, cr) {
                seq_rejected = true;
            }
        }
        if seq_rejected {
            rec.n_rej_any = rec.n;
        }
        // the token veto drops the sequence from the mask; verl's metrics do not count it
        rec.vetoed = plan
            .veto
            .is_some_and(|tau| vetoes(tau, (rec.n > 0).then_some(rec.rho_min)));
        let dropped = seq_rejected || rec.vetoed;
        if dropped {
            t.mask.clear(a - t.start, e - a);
        }
        if let Some(is) = plan.is.filter(|is| is.level == IsLevel::Sequence) {
            let ws = rec.finish_seq_weight(&is);
            sd.seq_weight(ws);
            if !deferred {
                if let Some(wo) = t.weights.as_mut() {
                    write_seq_weight(inp, wo, (a, e), t.start, ws, &mut cols.m, &mut cols.w)?;
                }
            }
        }
        let token_rejected = plan
            .criteria
            .iter()
            .zip(&rec.crit)
            .any(|(c, r)| c.agg == MaskAgg::Token && r.rej > 0);
        if let Some(d) = diag.as_deref_mut() {
            d.fold(&sd, dropped, dropped || token_rejected);
        }
        if let Some(st) = stats.as_deref_mut() {
            st.end_seq(rec.n, rec.n_dropped(), !(dropped || token_rejected));
        }
        recs.push(rec);
        cursor = e;
    }
    let end = t.start + t.mask.len();
    if end > cursor {
        t.mask.clear(cursor - t.start, end - cursor);
        if let Some(wo) = t.weights.as_mut() {
            wo.fill(cursor - t.start, end - cursor, 0.0);
        }
    }
    Some(recs)
}

/// The valid slots of the sequence at `a..e` (LN-TRM's weights need them before its tiles).
fn valid_len(inp: &LeanInputs<'_>, (a, e): (usize, usize)) -> u64 {
    let Some(mv) = &inp.mask else {
        return (e - a) as u64;
    };
    let mut m = [0u8; TILE];
    (a..e)
        .step_by(TILE)
        .map(|k| {
            let l = TILE.min(e - k);
            mv.load(k, &mut m[..l]);
            m[..l].iter().filter(|&&x| x == 1).count() as u64
        })
        .sum()
}

/// The index of the last nonzero byte of `m` (eight bytes at a time).
#[inline(always)]
fn last_nonzero(m: &[u8]) -> Option<usize> {
    let mut end = m.len();
    while end >= 8 {
        let w = u64::from_le_bytes(m[end - 8..end].try_into().ok()?);
        if w != 0 {
            return Some(end - 1 - (w.leading_zeros() / 8) as usize);
        }
        end -= 8;
    }
    m[..end].iter().rposition(|&x| x != 0)
}

/// Starts loading the log-probs of slots `k..k + len` and their output slots.
#[inline(always)]
fn prefetch_tile(inp: &LeanInputs<'_>, t: &Task<'_>, weights: bool, k: usize, len: usize) {
    inp.roll.prefetch(k, k + len);
    inp.train.prefetch(k, k + len);
    let off = k - t.start;
    t.mask.prefetch(off, off + len);
    if let (Some(wo), true) = (t.weights.as_ref(), weights) {
        wo.prefetch(off, off + len);
    }
}

/// Writes a sequence's weight `ws` at its valid slots (0 at its padding).
fn write_seq_weight(
    inp: &LeanInputs<'_>,
    wo: &mut WeightsOut<'_>,
    (a, e): (usize, usize),
    start: usize,
    ws: f64,
    m: &mut [u8; TILE],
    w: &mut [f64; TILE],
) -> Option<()> {
    let mut k = a;
    while k < e {
        let len = TILE.min(e - k);
        match &inp.mask {
            Some(mv) => {
                mv.load(k, &mut m[..len]);
                for j in 0..len {
                    w[j] = if m[j] == 1 { ws } else { 0.0 };
                }
                wo.store(k - start, &w[..len]);
            }
            None => wo.fill(k - start, len, ws),
        }
        k += len;
    }
    Some(())
}

/// Batch normalisation's phase 2: this task's weights recomputed and divided by `wmean`.
fn write_normalised(
    plan: &Plan,
    inp: &LeanInputs<'_>,
    ranges: &[(usize, usize)],
    recs: &[SeqRec],
    t: &mut Task<'_>,
    wmean: f64,
) {
    let (Some(is), Some(wo)) = (plan.is, t.weights.as_mut()) else {
        return;
    };
    let mut r = [0f64; TILE];
    let mut o = [0f64; TILE];
    let mut m = [1u8; TILE];
    let mut w = [0f64; TILE];
    for s in t.seqs.clone() {
        let (a, e) = ranges[s];
        let ws = recs[s].seq_weight / wmean;
        let mut k = a;
        while k < e {
            let len = TILE.min(e - k);
            if let Some(mv) = &inp.mask {
                mv.load(k, &mut m[..len]);
            }
            if is.level == IsLevel::Token {
                inp.roll.load(k, &mut r[..len]);
                inp.train.load(k, &mut o[..len]);
            }
            for j in 0..len {
                w[j] = if m[j] != 1 {
                    0.0
                } else if is.level == IsLevel::Token {
                    let c = (o[j] - r[j]).clamp(-SAFETY_BOUND, SAFETY_BOUND);
                    is.weight(exp_bounded(c)) / wmean
                } else {
                    ws
                };
            }
            wo.store(k - t.start, &w[..len]);
            k += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CorrectionConfig;
    use crate::input::values::{MaskOut, MaskValues, Values};

    /// Every build of the kernel the CPU can run (baseline, AVX2, AVX-512) writes the same
    /// bits: masks, weights and per-sequence sums.
    #[test]
    fn every_simd_build_gives_the_same_bits() {
        let (b, t) = (7usize, 1500usize);
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let old: Vec<f32> = (0..b * t).map(|_| (-4.0 * rnd()) as f32).collect();
        // a few ratios far past the ±20 clamp, the rest small
        let roll: Vec<f32> = old
            .iter()
            .map(|&x| {
                x + if rnd() < 0.01 {
                    30.0
                } else {
                    0.3 * (rnd() as f32 - 0.5)
                }
            })
            .collect();
        let mask: Vec<f32> = (0..b * t)
            .map(|i| f32::from(i % t < (i / t + 1) * 190 && i % 97 != 3))
            .collect();
        let cfgs = [
            r#"{"rollout_is":"token","rollout_is_threshold":"0.5_2.0","rollout_rs":"token_k1,seq_mean_k3,seq_max_k2","rollout_rs_threshold":"0.8_1.25,0.01,2.5"}"#,
            r#"{"rollout_is":"sequence","rollout_is_threshold":2.0,"rollout_rs":"seq_sum_k3","rollout_rs_threshold":3.0}"#,
        ];
        for cj in cfgs {
            let cfg =
                CorrectionConfig::from_json_value(&serde_json::from_str(cj).unwrap()).unwrap();
            let mut plan = Plan::compile(&cfg).unwrap();
            plan.verl_metrics_only(true);
            assert!(plan.serves_lean());
            let inp = LeanInputs {
                layout: LeanLayout::Padded {
                    batch: b,
                    seq_len: t,
                },
                mask: Some(MaskValues::F32(&mask)),
                roll: Values::F32(&roll),
                train: Values::F32(&old),
                adv: None,
                uid: None,
            };
            let ranges = inp.ranges().unwrap();
            type Kernel = fn(
                &Plan,
                &LeanInputs<'_>,
                &[(usize, usize)],
                Host<'_, '_>,
                bool,
                &mut Cols,
                &Feeds,
                Accs<'_>,
            ) -> Option<Vec<SeqRec>>;
            let mut builds: Vec<(&str, Kernel)> = vec![("baseline", kernel_body)];
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 is there (checked).
                    builds.push(("avx2", |p, i, r, t, d, c, f, g| unsafe {
                        kernel_avx2(p, i, r, t, d, c, f, g)
                    }));
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: AVX-512F is there (checked).
                    builds.push(("avx512", |p, i, r, t, d, c, f, g| unsafe {
                        kernel_avx512(p, i, r, t, d, c, f, g)
                    }));
                }
            }
            let mut first: Option<(Vec<f32>, Vec<f32>, Vec<String>)> = None;
            for (name, k) in builds {
                let (mut w, mut m) = (vec![9f32; b * t], vec![9f32; b * t]);
                let mut out = Outputs {
                    weights: Some(WeightsOut::F32(&mut w)),
                    mask: MaskOut::F32(&mut m),
                };
                let mut recs = Vec::new();
                for mut task in split_tasks(&ranges, b * t, &mut out) {
                    let mut cols = Cols::take();
                    let f = Feeds::default();
                    recs.extend(
                        k(
                            &plan,
                            &inp,
                            &ranges,
                            (&mut task, None, None),
                            false,
                            &mut cols,
                            &f,
                            (None, None),
                        )
                        .unwrap(),
                    );
                    Cols::give(cols);
                }
                let sums: Vec<String> = recs.iter().map(|r| format!("{r:?}")).collect();
                match &first {
                    None => first = Some((w, m, sums)),
                    Some((w0, m0, s0)) => {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&w), bits(w0), "{name}: weights");
                        assert_eq!(bits(&m), bits(m0), "{name}: mask");
                        assert_eq!(&sums, s0, "{name}: per-sequence sums");
                    }
                }
            }
        }
    }
}
