//! `trmask compare -o compare.html`: both batches' distributions of every compared statistic
//! on one plot (empirical CDFs of the sequence means), the quantile table and the verdict.

use super::subject::{file_name, num};
use super::svg::{esc, Axis, Frame};
use crate::analysis::compare::Comparison;
use std::fmt::Write as _;

fn ecdf(v: &[f64]) -> Vec<(f64, f64)> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    s.iter()
        .enumerate()
        .flat_map(|(i, &x)| [(x, i as f64 / n), (x, (i + 1) as f64 / n)])
        .collect()
}

/// The whole page for inputs named `a` and `b` as given (shown by their file names).
pub fn render_compare_html(c: &Comparison, a: &str, b: &str) -> String {
    let mut h = super::html::page_start("trmask compare");
    let _ = write!(
        h,
        "<h1>trmask compare: A = {} vs B = {}</h1><p class=\"lead\">{}</p>",
        esc(&file_name(a)),
        esc(&file_name(b)),
        esc(&c.verdict)
    );
    h.push_str(
        "<h2>Statistics (per-sequence means)</h2><table class=\"wide\"><tr><th>statistic</th><th>A p10</th>\
         <th>A p50</th><th>A p90</th><th>B p10</th><th>B p50</th><th>B p90</th>\
         <th>shift of the median</th><th>Mann-Whitney p</th></tr>",
    );
    for s in &c.stats {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{:+.3e}</td><td>{:.2e}</td></tr>",
            esc(&s.statistic),
            num(s.a.p10),
            num(s.a.p50),
            num(s.a.p90),
            num(s.b.p10),
            num(s.b.p50),
            num(s.b.p90),
            s.shift,
            s.p_value
        );
    }
    h.push_str("</table>");
    if !c.rejected.is_empty() {
        h.push_str(
            "<h2>Rejected sequences</h2><table><tr><th>criterion</th><th>A</th><th>B</th>\
             <th>B &minus; A</th></tr>",
        );
        for r in &c.rejected {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{:.2} %</td><td>{:.2} %</td><td>{:+.2} points</td></tr>",
                esc(&r.criterion),
                100.0 * r.a,
                100.0 * r.b,
                100.0 * r.delta
            );
        }
        h.push_str("</table>");
    }
    h.push_str("<h2>Distributions</h2><div class=\"grid\">");
    for s in &c.stats {
        let (x, y) = (&s.values.0, &s.values.1);
        let log = s.statistic != "log_ratio" && x.iter().chain(y).all(|v| *v > 0.0);
        let xa = Axis::fit(x.iter().chain(y).copied(), log);
        let ya = Axis::fit([0.0, 1.0].into_iter(), false);
        let mut f = Frame::new(
            xa,
            ya,
            &format!("sequence mean of {}", s.statistic),
            "fraction of sequences",
        );
        f.line(&ecdf(x), "#1f6fb4", false);
        f.line(&ecdf(y), "#d1741f", true);
        f.legend(0, "#1f6fb4", "A");
        f.legend(1, "#d1741f", "B (dashed)");
        let _ = write!(
            h,
            "<figure>{}<figcaption>{}: median shift {:+.3e}, p = {:.2e}</figcaption></figure>",
            f.finish(),
            esc(&s.statistic),
            s.shift,
            s.p_value
        );
    }
    h.push_str("</div></body></html>\n");
    h
}
