//! Checks of the command line's output paths before any work: a known format, and no output
//! that is an input or another output.

use std::path::{Path, PathBuf};

/// Whether `p`'s extension is one of `exts` (any case; `-` has none).
fn has_extension(p: &Path, exts: &[&str]) -> bool {
    let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
    exts.iter().any(|e| ext.eq_ignore_ascii_case(e))
}

/// `--output` names a file whose extension says its format: `.safetensors` or `.json` (never
/// standard output, where the summary goes).
pub fn check_output_name(p: &Path) -> Result<(), trmask::Error> {
    if p.as_os_str() == "-" {
        return Err(trmask::Error::config(
            "--output",
            "cannot be `-`: the summary goes to standard output; give a .safetensors or .json \
             path (metrics go to standard output with --metrics -)",
        ));
    }
    if !has_extension(p, &["json", "safetensors"]) {
        return Err(trmask::Error::config(
            "--output",
            format!(
                "{}: the name must end in .safetensors or .json (the format it is written in)",
                p.display()
            ),
        ));
    }
    Ok(())
}

pub fn check_outputs(
    inputs: &[PathBuf],
    config: Option<&Path>,
    outputs: &[(&str, Option<&Path>)],
) -> Result<(), trmask::Error> {
    let mut ins: Vec<(&str, &Path)> = inputs.iter().map(|p| ("input", p.as_path())).collect();
    if let Some(c) = config {
        ins.push(("--config", c));
    }
    let outs: Vec<(&str, &Path)> = outputs
        .iter()
        .filter_map(|(f, p)| p.map(|p| (*f, p)))
        .collect();
    trmask::io::check_distinct(&ins, &outs)
}

/// `report --output` names an HTML file (`.html` / `.htm`): the page is written as such.
pub fn check_report_name(p: &Path) -> Result<(), trmask::Error> {
    if !has_extension(p, &["html", "htm"]) {
        return Err(trmask::Error::config(
            "--output",
            format!("{}: the report is HTML; name a .html file", p.display()),
        ));
    }
    Ok(())
}
