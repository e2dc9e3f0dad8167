//! The tensor table (`src/input/tensors.rs`) is the only list of tensor names in `src/` and
//! `python/`: no other source holds two tensor-name string literals as neighbours of one list
//! (`["old_log_prob", "rollout_log_prob"]`, `[("responses", ..), ("uid", ..)]`,
//! `x in ("a", "b")`). Single names (an error naming its tensor, a lookup) are fine.

use std::path::{Path, PathBuf};
use trmask::tensors::{aliases, PYTHON_NAMES, TENSORS};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if name != "tests" && name != "bench" && name != "__pycache__" {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") || name.ends_with(".py") || name.ends_with(".pyi") {
            out.push(p);
        }
    }
}

/// The code of a source file: comments dropped, a Rust file cut at its test module.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let rust = path.extension().is_some_and(|e| e == "rs");
    let text = match (rust, text.find("\n#[cfg(test)]")) {
        (true, Some(i)) => text[..i].to_string(),
        _ => text,
    };
    let marker = if rust { "//" } else { "#" };
    text.lines()
        .map(|l| match l.find(marker) {
            // a marker inside a string (`"#"`) is rare; a quote before it keeps the line
            Some(i) if l[..i].matches('"').count() % 2 == 0 => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Pairs of distinct tensor-name literals separated only by list punctuation and the
/// expressions of one list's elements (no statement or block boundary, no assignment).
fn lists(code: &str, names: &[&str]) -> Vec<(usize, String, String)> {
    let mut hits = Vec::new();
    for name in names {
        let lit = format!("\"{name}\"");
        let mut from = 0;
        while let Some(i) = code[from..].find(&lit) {
            let (start, end) = (from + i, from + i + lit.len());
            // `get("uid")`, `contains_key("cu_seqlens")`: a lookup of one name, not a list
            let lookup = code[..start].ends_with('(') && code[end..].starts_with(')');
            if !lookup {
                hits.push((start, end, *name));
            }
            from = end;
        }
    }
    hits.sort();
    let mut found = Vec::new();
    for w in hits.windows(2) {
        let ((_, end, a), (start, _, b)) = (w[0], w[1]);
        let between = &code[end..start];
        let boundary = between.contains([';', '{', '}'])
            || between.contains(" = ")
            || between.contains("=>")
            || between.len() > 80;
        if a != b && !boundary {
            let line = code[..start].matches('\n').count() + 1;
            found.push((line, a.to_string(), b.to_string()));
        }
    }
    found
}

#[test]
fn the_tensor_table_is_the_only_list_of_tensor_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<&str> = TENSORS.iter().map(|t| t.name).collect();
    names.extend(aliases().map(|(a, _)| a.source));
    names.extend(PYTHON_NAMES.iter().map(|p| p.0));
    names.sort();
    names.dedup();
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    sources(&root.join("python"), &mut files);
    assert!(files.len() > 50, "found only {} sources", files.len());
    let table = root.join("src").join("input").join("tensors.rs");
    let mut bad = Vec::new();
    for f in files.iter().filter(|f| **f != table) {
        for (line, a, b) in lists(&code(f), &names) {
            bad.push(format!(
                "{}:{line}: `{a}` and `{b}` listed together (derive the list from trmask::tensors)",
                f.strip_prefix(root).unwrap().display()
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_check_finds_a_list() {
    let names = ["old_log_prob", "rollout_log_prob", "uid"];
    let found = lists(
        "for n in [\"old_log_prob\", \"rollout_log_prob\"] {}",
        &names,
    );
    assert_eq!(found.len(), 1);
    let found = lists("x = [(\"uid\", a.uid), (\"old_log_prob\", b)]", &names);
    assert_eq!(found.len(), 1);
    // one name per statement, or lookups of one name each, are not a list
    assert!(lists("err(\"uid\");\nlet x = get(\"old_log_prob\");", &names).is_empty());
    assert!(lists("match (m.get(\"uid\"), m.get(\"old_log_prob\"))", &names).is_empty());
}
