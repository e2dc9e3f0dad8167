//! The default output of `trmask analyze`: one screen (at most 40 lines) saying what was
//! configured, what was read, how large the mismatch is, what was rejected, which sequences
//! are worst, and what the bound certificate says.

use super::subject::{config_words, num, ranking, worst_order, Subject};

/// How many of the worst sequences the summary lists.
pub const WORST: usize = 5;

/// The one-line reading of the unified bound B* (R ∈ [0, 1], so B* ≥ 1 says nothing).
pub fn bound_reading(b: f64) -> &'static str {
    if !b.is_finite() || b >= 1.0 {
        "vacuous: no guarantee at this horizon and divergence"
    } else if b >= 0.1 {
        "loose: the surrogate's error may be a sizeable part of the reward range"
    } else {
        "tight: the surrogate objective tracks the true one within this fraction of the reward range"
    }
}

/// The IS weights the config applies, in one line (verl's own `rollout_is_*` metrics): their
/// mean and largest value before truncation, the share of weights truncated (and, with a lower
/// bound, masked), and the effective sample size of the truncated weights.
fn is_line(s: &Subject) -> Option<String> {
    let r = s.config.resolve().ok()?;
    let is = r.is.as_ref()?;
    let m = |k: &str| {
        s.analysis
            .metrics
            .get(&format!("rollout_corr/rollout_is_{k}"))
            .copied()
    };
    let pct = |x: f64| format!("{} %", num((1000.0 * x).round() / 10.0));
    let mut line = format!(
        "IS weights ({}, truncated at {}): mean {}, max {}, {} truncated",
        is.level.name(),
        num(is.upper),
        num(m("mean")?),
        num(m("max")?),
        pct(m("ratio_fraction_high")?)
    );
    if let (Some(lo), Some(f)) = (is.lower, m("ratio_fraction_low")) {
        line.push_str(&format!(", {} below {} masked", pct(f), num(lo)));
    }
    if let Some(e) = m("eff_sample_size") {
        line.push_str(&format!(", ESS {}", num(e)));
    }
    Some(line)
}

/// The summary text (no trailing newline); `written` lists the files written.
pub fn summary(s: &Subject, written: &[String]) -> String {
    let a = s.analysis;
    let c = &a.corrections;
    let b = s.batch;
    let mut out = Vec::new();
    out.push(format!(
        "trmask analyze {}  (engine: {})",
        s.input, s.engine
    ));
    out.extend(config_words(s.config, s.preset));
    let f = &a.findings;
    let valid = f.valid as usize;
    let shape = b.token_shape();
    let names: Vec<String> = s
        .sources
        .iter()
        .map(|(n, src, dt)| {
            if n == src {
                format!("{n} ({dt})")
            } else {
                format!("{n} <- {src} ({dt})")
            }
        })
        .collect();
    out.push(format!(
        "input: {} {:?}, {} sequences, {} valid tokens of {} slots",
        if matches!(b.layout(), crate::input::batch::Layout::Padded { .. }) {
            "padded"
        } else {
            "packed"
        },
        shape,
        b.num_seqs(),
        valid,
        b.slots()
    ));
    out.push(format!("  tensors: {}", names.join(", ")));
    let m = |k: &str| a.metrics.get(k).copied();
    let mut mis = Vec::new();
    if let Some(x) = m("trmask/k3_mean") {
        mis.push(format!("k3 mean {}", num(x)));
    }
    // the batch's largest |log rho|: the last of equal ones, as each sequence's worst token
    let best = f.worst.iter().flatten().max_by(|x, y| x.2.total_cmp(&y.2));
    if let Some(&(_, slot, v)) = best {
        mis.push(format!("max |log rho| {} at {}", num(v), b.position(slot)));
    }
    for (k, label) in [
        ("trmask/kl_mean", "exact KL mean"),
        ("trmask/tv_mean", "TV mean"),
    ] {
        if let Some(x) = m(k) {
            mis.push(format!("{label} {}", num(x)));
        }
    }
    if let Some(x) = m("trmask/topk_kl_mean") {
        mis.push(format!("top-K KL mean {}", num(x)));
    }
    out.push(format!("mismatch: {}", mis.join(", ")));
    out.extend(super::routing::routing_line(&a.metrics));
    // the sampler's truncation (top-p / top-k / min-p configured with the raw top-K)
    if let (Some(ls), Some(known), Some(before), Some(after)) = (
        m("trmask/log_kept_mass_mean"),
        m("trmask/kept_set_known_fraction"),
        m("trmask/k3_mean_raw_trainer"),
        m("trmask/k3_mean_kept_trainer"),
    ) {
        let share = if before > 0.0 {
            format!(
                ", {}% of the mismatch is truncation",
                num((1000.0 * (1.0 - after / before)).round() / 10.0)
            )
        } else {
            String::new()
        };
        out.push(format!(
            "truncation: log kept mass mean {} (min {}), kept set known on {}% of tokens; k3 mean \
             {} against the raw trainer, {} against the kept-set trainer{share}",
            num(ls),
            num(m("trmask/log_kept_mass_min").unwrap_or(ls)),
            num((1000.0 * known).round() / 10.0),
            num(before),
            num(after),
        ));
    }
    // M2PO's batch-global drop, when the batch has tokens in its active quadrants
    let pre = "rollout_corr/rollout_rs_m2po";
    if let (Some(act), Some(m2), Some(after), Some(drop)) = (
        m(&format!("{pre}_active_fraction")),
        m(&format!("{pre}_m2")),
        m(&format!("{pre}_m2_after")),
        m(&format!("{pre}_masked_fraction")),
    ) {
        let tau = s.config.resolve().ok().and_then(|r| {
            r.criteria
                .iter()
                .find(|c| c.stat == crate::config::Stat::M2po)
                .map(|c| c.upper)
        });
        let count = |f: f64| (f * valid as f64).round() as usize;
        out.push(format!(
            "m2po: {} of {} active tokens dropped ({}% of valid), mean (log rho)^2 over them {} -> \
             {}{}",
            count(drop),
            count(act),
            num((1000.0 * drop).round() / 10.0),
            num(m2),
            num(after),
            tau.map(|t| format!(" (tau {})", num(t)))
                .unwrap_or_default()
        ));
    }
    // CPPO's drops, split by the rule that made them
    let pre = "rollout_corr/rollout_rs_cppo";
    if let (Some(tok), Some(pfx)) = (
        m(&format!("{pre}_token_masked_fraction")),
        m(&format!("{pre}_prefix_masked_fraction")),
    ) {
        let count = |f: f64| (f * valid as f64).round() as usize;
        out.push(format!(
            "cppo: {} tokens dropped ({}% of valid): {} over the token threshold, {} by the prefix \
             budget",
            count(tok) + count(pfx),
            num((1000.0 * (tok + pfx)).round() / 10.0),
            count(tok),
            count(pfx)
        ));
    }
    out.extend(super::breakdown::breakdown_lines(&a.metrics));
    let n = c.seq_accept.len();
    let acc = c.seq_accept.iter().filter(|&&x| x).count();
    let kept = f.kept as usize;
    let mean_len = |want: bool| {
        let l: Vec<f64> = (0..n)
            .filter(|&i| c.seq_accept[i] == want)
            .map(|i| c.seq_len[i] as f64)
            .collect();
        (!l.is_empty()).then(|| l.iter().sum::<f64>() / l.len() as f64)
    };
    let plural = |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
    let mut line = format!(
        "accepted: {acc} of {}, {kept} of {}; rejected {}, {}",
        plural(n, "sequence"),
        plural(valid, "token"),
        plural(n - acc, "sequence"),
        plural(valid - kept, "token")
    );
    if let (Some(r), Some(k)) = (mean_len(false), mean_len(true)) {
        line.push_str(&format!(
            " (mean length rejected {} vs accepted {})",
            num((r * 10.0).round() / 10.0),
            num((k * 10.0).round() / 10.0)
        ));
    }
    out.push(line);
    if let Some(is) = is_line(s) {
        out.push(is);
    }
    for sw in &a.sweeps {
        out.push(super::sweep::sweep_line(sw));
    }
    if let Some(r) = ranking(s) {
        let order = worst_order(s, &r);
        if !order.is_empty() {
            let thr = match r.bounds {
                Some((Some(lo), hi)) => format!(" (keep if {} <= stat <= {})", num(lo), num(hi)),
                Some((None, hi)) => format!(" (threshold {})", num(hi)),
                None => String::new(),
            };
            out.push(format!("worst sequences by {}{thr}:", r.name));
            out.push(format!(
                "  {:>6} {:>7} {:>12}  {:<8} {}",
                "seq", "length", "statistic", "decision", "worst token (|log rho|)"
            ));
            for &i in order.iter().take(WORST) {
                let pos = f
                    .worst
                    .get(i)
                    .copied()
                    .flatten()
                    .map(|(t, _, lr)| format!("t={t} ({})", num(lr)))
                    .unwrap_or_default();
                out.push(format!(
                    "  {:>6} {:>7} {:>12}  {:<8} {}",
                    i,
                    c.seq_len[i],
                    num(r.values[i]),
                    if c.seq_accept[i] { "accept" } else { "reject" },
                    pos
                ));
            }
        }
    }
    if let Some(cert) = &a.certificate {
        let pick = match (&cert.accepted, &cert.all) {
            (Some(x), _) => Some(("accepted sequences", x)),
            (None, Some(x)) => Some(("all sequences", x)),
            _ => None,
        };
        if let Some((set, bounds)) = pick {
            out.push(format!(
                "bound certificate: B* = {} over {set} ({}, T = {}{}) - {}",
                num(bounds.unified),
                bounds.argmin,
                bounds.inputs.horizon,
                if cert.exact {
                    ""
                } else {
                    ", delta from k3 samples"
                },
                bound_reading(bounds.unified)
            ));
        }
    }
    if !written.is_empty() {
        out.push(format!("written: {}", written.join(", ")));
    }
    out.join("\n")
}
