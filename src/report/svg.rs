//! Minimal inline-SVG charts for the HTML report: axes with ticks, lines, points, bars,
//! a horizontal or vertical threshold line, and a colour strip. No scripts, no network.

use std::fmt::Write as _;

pub const W: f64 = 560.0;
pub const H: f64 = 290.0;
const L: f64 = 72.0; // left margin
const R: f64 = 16.0;
const T: f64 = 32.0; // top margin: the legend row
const B: f64 = 48.0;
/// Text size in viewBox units. A chart is drawn at 100 % of its box (at least 440 px wide in
/// the pages' grid), so text is never smaller than 16 × 440 / 560 ≈ 12.6 px.
pub const FONT: f64 = 16.0;

/// Escapes text for HTML / SVG.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An axis: data range, optionally log10.
#[derive(Clone, Copy)]
pub struct Axis {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    /// No tick labels (bar positions of categories; the legend names them).
    pub categorical: bool,
    /// Whole-number ticks only (counts).
    pub integer: bool,
}

/// The largest magnitude an axis spans: a value beyond it (or a non-finite one) sits at the
/// frame's edge, where [`Frame::clip_mark`] marks it. Far enough below `f64::MAX` that spans and
/// tick steps stay finite.
pub const AXIS_LIMIT: f64 = 1e300;

/// Most ticks an axis draws.
const MAX_TICKS: usize = 12;

impl Axis {
    /// An axis covering `values` (finite ones, at most [`AXIS_LIMIT`] in magnitude; positive
    /// ones for a log axis). Its bounds are always finite and ordered, whatever the values.
    pub fn fit(values: impl Iterator<Item = f64>, log: bool) -> Axis {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        let mut nonpositive = false;
        for v in values.filter(|v| v.is_finite()) {
            if log && v <= 0.0 {
                nonpositive = true;
                continue;
            }
            let v = v.clamp(-AXIS_LIMIT, AXIS_LIMIT);
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = if log { (1e-6, 1.0) } else { (0.0, 1.0) };
        }
        if log {
            // decades within ±300 (10^e stays a normal, finite f64); values ≤ 0 sit on the
            // floor (hollow, see `Frame::point`): a decade below the rest
            let floor = (lo.max(1e-300).log10().floor() - if nonpositive { 1.0 } else { 0.0 })
                .clamp(-300.0, 299.0);
            let ceil = hi.log10().ceil().clamp(floor + 1.0, 300.0);
            lo = 10f64.powf(floor);
            hi = 10f64.powf(ceil);
        } else {
            lo = lo.min(0.0);
            if hi <= lo {
                // a span that stays nonzero next to a huge value (1e300 + 1 == 1e300)
                hi = lo + lo.abs().max(1.0);
            }
        }
        Axis {
            lo,
            hi,
            log,
            categorical: false,
            integer: false,
        }
    }
    /// A linear axis for counts: from 0, at least to 1, whole-number ticks, and a little room
    /// past the largest value so that a dot there is not cut by the frame.
    pub fn counts(values: impl Iterator<Item = f64>) -> Axis {
        let a = Axis::fit(values, false);
        Axis {
            hi: (a.hi * 1.04).ceil().clamp(1.0, AXIS_LIMIT),
            integer: true,
            ..a
        }
    }
    /// Where `v` falls on the axis, from 0 (low end) to 1 (high end); a value beyond the
    /// bounds (±∞ included) is clipped to the nearer end, NaN to the low end.
    fn t(&self, v: f64) -> f64 {
        let (a, b, v) = if self.log {
            (self.lo.log10(), self.hi.log10(), v.max(self.lo).log10())
        } else {
            (self.lo, self.hi, v)
        };
        let t = (v - a) / (b - a);
        if t.is_nan() {
            0.0
        } else {
            t.clamp(0.0, 1.0)
        }
    }
    /// Whether `v` lies outside the axis (it is drawn clipped at an end): non-finite, or beyond
    /// a bound. On a log axis, values ≤ 0 are not clipped but drawn hollow on the floor.
    pub fn clips(&self, v: f64) -> bool {
        if !v.is_finite() {
            return true;
        }
        if self.log && v <= 0.0 {
            return false;
        }
        v < self.lo || v > self.hi
    }
    /// The tick values: at most [`MAX_TICKS`], computed without a loop over the range (an
    /// axis may span 600 decades).
    fn ticks(&self) -> Vec<f64> {
        if self.categorical || !(self.lo.is_finite() && self.hi.is_finite() && self.hi > self.lo) {
            return Vec::new();
        }
        if self.log {
            let (a, b) = (
                self.lo.log10().round().clamp(-330.0, 330.0) as i32,
                self.hi.log10().round().clamp(-330.0, 330.0) as i32,
            );
            let step = ((b - a) / 6).max(1);
            (a..=b)
                .step_by(step as usize)
                .take(MAX_TICKS)
                .map(|e| 10f64.powi(e))
                .collect()
        } else {
            // the span halved first: hi − lo may overflow where hi/2 − lo/2 does not
            let raw = (self.hi / 2.0 - self.lo / 2.0) / 2.5;
            let raw = if self.integer { raw.max(1.0) } else { raw };
            if !(raw.is_finite() && raw > 0.0) {
                return vec![self.lo, self.hi];
            }
            let mag = 10f64.powf(raw.log10().floor());
            let step = [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * mag)
                .find(|s| *s >= raw)
                .unwrap_or(raw);
            let (first, last) = ((self.lo / step).ceil(), (self.hi / step).floor());
            if !(first.is_finite() && last.is_finite()) || last - first > MAX_TICKS as f64 {
                return vec![self.lo, self.hi];
            }
            (0..=(last - first) as usize)
                .map(|k| (first + k as f64) * step)
                .collect()
        }
    }
}

fn label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e4 || v.abs() < 1e-2 {
        format!("{v:.0e}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A chart frame: owns the SVG text and maps data to pixels.
pub struct Frame {
    pub x: Axis,
    pub y: Axis,
    svg: String,
    /// Where the next legend entry starts in the row above the plot.
    legend_x: f64,
}

impl Frame {
    pub fn new(x: Axis, y: Axis, xlabel: &str, ylabel: &str) -> Frame {
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100%\" \
             viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"{FONT}\">\
             <rect x=\"{L}\" y=\"{T}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" stroke=\"#999\"/>",
            W - L - R,
            H - T - B
        );
        let f = Frame {
            x,
            y,
            svg: String::new(),
            legend_x: L,
        };
        for v in x.ticks() {
            let px = f.px(v);
            let _ = write!(
                svg,
                "<line x1=\"{px:.1}\" y1=\"{}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"#ddd\"/>\
                 <text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                T,
                H - B,
                H - B + FONT + 2.0,
                label(v)
            );
        }
        for v in y.ticks() {
            let py = f.py(v);
            let _ = write!(
                svg,
                "<line x1=\"{L}\" y1=\"{py:.1}\" x2=\"{}\" y2=\"{py:.1}\" stroke=\"#ddd\"/>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                W - R,
                L - 4.0,
                py + 4.0,
                label(v)
            );
        }
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>",
            (L + W - R) / 2.0,
            H - 6.0,
            esc(xlabel),
            (T + H - B) / 2.0,
            (T + H - B) / 2.0,
            esc(ylabel)
        );
        Frame {
            x,
            y,
            svg,
            legend_x: L,
        }
    }
    pub fn px(&self, v: f64) -> f64 {
        L + self.x.t(v) * (W - L - R)
    }
    pub fn py(&self, v: f64) -> f64 {
        H - B - self.y.t(v) * (H - T - B)
    }
    /// A polyline through the finite points.
    pub fn line(&mut self, pts: &[(f64, f64)], color: &str, dash: bool) {
        self.line_width(pts, color, dash, 1.6);
    }
    /// A polyline of a given stroke width (a wide pale band under a thin line keeps both
    /// visible where two series coincide).
    pub fn line_width(&mut self, pts: &[(f64, f64)], color: &str, dash: bool, width: f64) {
        let d: Vec<String> = pts
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", self.px(x), self.py(y)))
            .collect();
        let _ = write!(
            self.svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\"{}{} \
             points=\"{}\"/>",
            if dash {
                " stroke-dasharray=\"4 3\""
            } else {
                ""
            },
            if width > 2.0 {
                " stroke-opacity=\"0.45\""
            } else {
                ""
            },
            d.join(" ")
        );
    }
    /// A dot; on a log axis a value ≤ 0 is a hollow ring on the axis floor (it has no place
    /// on the scale, and a filled dot there would read as the floor's value).
    pub fn point(&mut self, x: f64, y: f64, color: &str) {
        if x.is_finite() && y.is_finite() {
            let fill = if self.y.log && y <= 0.0 {
                format!("fill=\"none\" stroke=\"{color}\"")
            } else {
                format!("fill=\"{color}\" fill-opacity=\"0.7\"")
            };
            let _ = write!(
                self.svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" {fill}/>",
                self.px(x),
                self.py(y)
            );
        }
    }
    /// A value the y axis clips ([`Axis::clips`]), marked at the edge it is clipped to: a
    /// triangle pointing out of the frame (up for +∞ or above the axis, down for −∞ or below),
    /// a cross on the floor for NaN; `title` is its tooltip (the value as written).
    pub fn clip_mark(&mut self, x: f64, y: f64, color: &str, title: &str) {
        if !x.is_finite() {
            return;
        }
        let px = self.px(x);
        let shape = if y.is_nan() {
            let py = self.py(self.y.lo);
            format!(
                "<path d=\"M{:.1},{:.1}l8,-8m0,8l-8,-8\" stroke=\"{color}\" stroke-width=\"2\"/>",
                px - 4.0,
                py
            )
        } else {
            // the tip on the edge, the base 9 px inside the frame
            let up = y > self.y.hi;
            let py = self.py(if up { self.y.hi } else { self.y.lo });
            format!(
                "<path d=\"M{px:.1},{py:.1}l5,{}l-10,0z\" fill=\"{color}\"/>",
                if up { 9 } else { -9 }
            )
        };
        let _ = write!(
            self.svg,
            "<g class=\"clipped\"><title>{}</title>{shape}</g>",
            esc(title)
        );
    }
    /// A bar from y = axis bottom to `y` over `[x0, x1]`.
    pub fn bar(&mut self, x0: f64, x1: f64, y: f64, color: &str) {
        let (a, b) = (self.px(x0), self.px(x1));
        let top = self.py(y);
        let base = self.py(self.y.lo);
        let _ = write!(
            self.svg,
            "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\"/>",
            a + 0.5,
            (b - a - 1.0).max(0.5),
            (base - top).max(0.0)
        );
    }
    /// A text centred above the data point `(x, y)` (a bar's count).
    pub fn note(&mut self, x: f64, y: f64, text: &str) {
        let _ = write!(
            self.svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            self.px(x),
            self.py(y) - 4.0,
            esc(text)
        );
    }
    pub fn hline(&mut self, y: f64, text: &str) {
        let py = self.py(y);
        let _ = write!(
            self.svg,
            "<line x1=\"{L}\" y1=\"{py:.1}\" x2=\"{}\" y2=\"{py:.1}\" stroke=\"#c00\" \
             stroke-dasharray=\"6 3\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" \
             fill=\"#c00\">{}</text>",
            W - R,
            W - R - 4.0,
            py - 4.0,
            esc(text)
        );
    }
    pub fn vline(&mut self, x: f64, text: &str) {
        let px = self.px(x);
        let right = px > L + 0.6 * (W - L - R);
        let _ = write!(
            self.svg,
            "<line x1=\"{px:.1}\" y1=\"{T}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"#c00\" \
             stroke-dasharray=\"6 3\"/><text x=\"{:.1}\" y=\"{}\" fill=\"#c00\" \
             text-anchor=\"{}\">{}</text>",
            H - B,
            if right { px - 4.0 } else { px + 4.0 },
            T + FONT,
            if right { "end" } else { "start" },
            esc(text)
        );
    }
    /// A legend entry: in the row above the plot, left to right (never over the data); entries
    /// that do not fit there stack in the plot's top-left corner on a white box (row `i`).
    pub fn legend(&mut self, i: usize, color: &str, text: &str) {
        let width = 14.0 + 0.56 * FONT * text.chars().count() as f64;
        if self.legend_x + width <= W - R {
            let x = self.legend_x;
            let _ = write!(
                self.svg,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                T - 21.0,
                x + 14.0,
                T - 10.0,
                esc(text)
            );
            self.legend_x += width + 14.0;
            return;
        }
        let y = T + FONT + 4.0 + (FONT + 4.0) * i as f64;
        let _ = write!(
            self.svg,
            "<rect x=\"{}\" y=\"{:.1}\" width=\"{width:.0}\" height=\"{}\" fill=\"#fff\" \
             fill-opacity=\"0.85\"/>",
            L + 4.0,
            y - FONT + 2.0,
            FONT + 4.0
        );
        let _ = write!(
            self.svg,
            "<rect x=\"{}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/>\
             <text x=\"{}\" y=\"{:.1}\">{}</text>",
            L + 8.0,
            y - 10.0,
            L + 22.0,
            y,
            esc(text)
        );
    }
    pub fn finish(mut self) -> String {
        self.svg.push_str("</svg>");
        self.svg
    }
}

/// A one-row colour strip as wide as its box: one cell per token, darker red for larger
/// `value / max`, each cell with a `<title>` tooltip (the token's position, id and values).
pub fn strip(cells: &[(f64, String)], max: f64) -> String {
    let n = cells.len().max(1);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100%\" height=\"18\" \
         viewBox=\"0 0 {n} 18\" preserveAspectRatio=\"none\">\
         <rect width=\"{n}\" height=\"18\" fill=\"#fff\" stroke=\"#ccc\" \
         vector-effect=\"non-scaling-stroke\"/>"
    );
    for (i, (v, title)) in cells.iter().enumerate() {
        let a = if max > 0.0 {
            (v / max).clamp(0.0, 1.0)
        } else {
            0.0
        };
        // every cell is drawn (transparent when faint) so that each has its tooltip
        let _ = write!(
            s,
            "<rect x=\"{i}\" y=\"1\" width=\"1\" height=\"16\" fill=\"#b00\" \
             fill-opacity=\"{:.2}\"><title>{}</title></rect>",
            if a > 0.01 { a } else { 0.0 },
            esc(title)
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values that made `Axis::ticks` allocate 16 GiB (a log axis up to 1.1e308: 10^309 is
    /// infinite) or loop for minutes: every axis stays finite, ordered, with few ticks.
    #[test]
    fn axes_from_huge_tiny_and_infinite_values_have_finite_bounds_and_few_ticks() {
        let cases: [&[f64]; 7] = [
            &[1e-3, 1.1e308],
            &[1.1e308],
            &[f64::INFINITY, 1.0],
            &[5e-324, 1.0],
            &[-1.1e308, 1.1e308],
            &[f64::MAX, f64::MIN_POSITIVE],
            &[f64::NAN],
        ];
        for vals in cases {
            for log in [false, true] {
                let a = Axis::fit(vals.iter().copied(), log);
                assert!(
                    a.lo.is_finite() && a.hi.is_finite() && a.lo < a.hi,
                    "{vals:?} {log}"
                );
                let t = a.ticks();
                assert!(
                    !t.is_empty() && t.len() <= MAX_TICKS,
                    "{vals:?} {log}: {t:?}"
                );
                assert!(t.iter().all(|x| x.is_finite()), "{vals:?} {log}: {t:?}");
                let c = Axis::counts(vals.iter().copied());
                assert!(c.ticks().len() <= MAX_TICKS);
                for v in vals {
                    let p = a.t(*v);
                    assert!((0.0..=1.0).contains(&p), "{v} → {p}");
                }
            }
        }
        // a hand-made axis with infinite bounds draws no tick rather than loop
        let inf = Axis {
            hi: f64::INFINITY,
            ..Axis::fit([1.0].into_iter(), true)
        };
        assert!(inf.ticks().is_empty());
    }
}
