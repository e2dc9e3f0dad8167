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

impl Axis {
    /// An axis covering `values` (finite ones; positive ones for a log axis).
    pub fn fit(values: impl Iterator<Item = f64>, log: bool) -> Axis {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        let mut nonpositive = false;
        for v in values.filter(|v| v.is_finite()) {
            if log && v <= 0.0 {
                nonpositive = true;
                continue;
            }
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = if log { (1e-6, 1.0) } else { (0.0, 1.0) };
        }
        if log {
            // values ≤ 0 sit on the floor (hollow, see `Frame::point`): a decade below the rest
            lo = 10f64.powf(lo.log10().floor() - if nonpositive { 1.0 } else { 0.0 });
            hi = 10f64.powf(hi.log10().ceil().max(lo.log10() + 1.0));
        } else {
            if hi == lo {
                hi = lo + 1.0;
            }
            lo = lo.min(0.0);
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
            hi: (a.hi * 1.04).ceil().max(1.0),
            integer: true,
            ..a
        }
    }
    fn t(&self, v: f64) -> f64 {
        let (a, b, v) = if self.log {
            (self.lo.log10(), self.hi.log10(), v.max(self.lo).log10())
        } else {
            (self.lo, self.hi, v)
        };
        ((v - a) / (b - a)).clamp(0.0, 1.0)
    }
    fn ticks(&self) -> Vec<f64> {
        if self.categorical {
            Vec::new()
        } else if self.log {
            let (a, b) = (self.lo.log10() as i32, self.hi.log10() as i32);
            let step = ((b - a) / 6).max(1);
            (a..=b)
                .step_by(step as usize)
                .map(|e| 10f64.powi(e))
                .collect()
        } else {
            let raw = (self.hi - self.lo) / 5.0;
            let raw = if self.integer { raw.max(1.0) } else { raw };
            let mag = 10f64.powf(raw.log10().floor());
            let step = [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * mag)
                .find(|s| *s >= raw)
                .unwrap_or(raw);
            let first = (self.lo / step).ceil() as i64;
            let last = (self.hi / step).floor() as i64;
            (first..=last).map(|k| k as f64 * step).collect()
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
