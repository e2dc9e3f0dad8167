//! The threshold sweeps in the summary (one sentence per criterion) and the report (the
//! rejected fractions against the threshold, the configured one marked).

use super::subject::num;
use super::svg::{esc, Axis, Frame};
use crate::analysis::sweep::Sweep;
use std::fmt::Write as _;

fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

/// "threshold seq_mean_k3 = 0.01 rejects 3.1 % of sequences; at 2× (0.02) 1.6 % would be
/// rejected, at ½× (0.005) 9.4 %" (for `k1`, ratio thresholds: at U² and √U).
pub fn sweep_line(s: &Sweep) -> String {
    let c = s.configured;
    let (now, _) = s.rejected_at(c);
    let (up, down, up_name, down_name) = if s.ratio_space() {
        (c * c, c.sqrt(), "U^2", "sqrt(U)")
    } else {
        (2.0 * c, 0.5 * c, "2x", "1/2x")
    };
    format!(
        "sweep: {} = {} rejects {} of sequences; at {up_name} ({}) {} would be rejected, at \
         {down_name} ({}) {}",
        s.criterion,
        num(c),
        pct(now),
        num(up),
        pct(s.rejected_at(up).0),
        num(down),
        pct(s.rejected_at(down).0)
    )
}

/// One chart per sweep: sequences and tokens rejected against the threshold (log axis).
pub fn sweep_charts(sweeps: &[Sweep]) -> String {
    let mut html = String::new();
    for s in sweeps {
        if s.threshold.len() < 2 {
            continue;
        }
        // k1 thresholds are ratios near 1: a linear axis
        let x = Axis::fit(
            s.threshold.iter().copied().chain([s.configured]),
            !s.ratio_space(),
        );
        let y = Axis::fit([0.0, 1.0].into_iter(), false);
        let mut f = Frame::new(
            x,
            y,
            &format!("{} threshold", s.criterion),
            "rejected fraction",
        );
        let seqs: Vec<(f64, f64)> = s
            .threshold
            .iter()
            .copied()
            .zip(s.rejected_seq_fraction.iter().copied())
            .collect();
        let toks: Vec<(f64, f64)> = s
            .threshold
            .iter()
            .copied()
            .zip(s.rejected_token_fraction.iter().copied())
            .collect();
        // a wide pale band under the thin dashed tokens line: both stay visible where they
        // coincide
        f.line_width(&seqs, "#c0392b", false, 6.0);
        f.line(&toks, "#1f6fb4", true);
        f.legend(0, "#c0392b", "sequences");
        f.legend(1, "#1f6fb4", "tokens (dashed)");
        let (now, _) = s.rejected_at(s.configured);
        f.vline(
            s.configured,
            &format!("configured {} ({})", num(s.configured), pct(now)),
        );
        let _ = write!(
            html,
            "<figure>{}<figcaption>{}</figcaption></figure>",
            f.finish(),
            esc(&sweep_line(s))
        );
    }
    html
}
