//! The `trmask` command line: subcommands, exit codes, hostile inputs, warnings, the HTML report, recipes.
//!
//! One test binary per suite (`cargo test --test cli`), so CI builds and links a few
//! binaries instead of one per file; each file below is a module.

#[path = "../common/mod.rs"]
mod common;

mod bad_shapes;
mod cli;
mod cli_thresholds;
mod cli_topk;
mod compare;
mod docs_run;
mod dumps;
mod flags;
mod fused;
mod hostile;
mod recipes;
mod report_html;
mod routing;
mod sweep;
mod warnings;
mod watch;
