//! What `trmask analyze` prints and `trmask report` renders: a one-screen summary, the
//! `warning:` lines, and a self-contained HTML report. Everything here reads an
//! [`Analysis`](crate::analysis::Analysis) and the batch it came from; nothing computes a statistic of its own beyond
//! orderings and bucketed means.

mod breakdown;
mod compare;
mod html;
mod routing;
mod subject;
mod summary;
mod svg;
mod sweep;
mod tables;
mod trend;
mod warnings;

pub use compare::render_compare_html;
pub use html::render_html;
pub use subject::Subject;
pub use summary::{bound_reading, summary};
pub use trend::{render_trend_html, render_trend_page, trend_key, TrendPage};
pub use warnings::{aggregate_warnings, kind as warning_kind, warnings, WarningInputs};
