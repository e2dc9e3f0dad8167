//! The docs run as written: every `trmask` line (and `cargo run --release -- …`, run as
//! `trmask …`) in a ```sh block of README.md and docs/*.md runs from the repository root and
//! exits 0. Synopses live in ```text blocks; a shell block holds no `[…]` option syntax and no
//! `INPUT...` placeholder. Each file's lines run in order in one scratch directory that sees the
//! repository's `data/` (outputs land there, not in the checkout). Unix only (bash, symlinks).

/// `(file, line number, command)` of every trmask line in a shell block, continuation lines
/// (`\` at the end) joined.
fn shell_lines(file: &str, md: &str) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    let mut shell: Option<bool> = None;
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in md.lines().enumerate() {
        let t = line.trim_start();
        if let Some(lang) = t.strip_prefix("```") {
            shell = match shell {
                None => Some(matches!(lang.trim(), "sh" | "bash" | "shell")),
                Some(_) => None,
            };
            continue;
        }
        if shell != Some(true) {
            continue;
        }
        let (start, mut text) = match pending.take() {
            Some((s, p)) => (s, p + " " + t),
            None => (n + 1, t.to_string()),
        };
        if let Some(head) = text.strip_suffix('\\') {
            text = head.trim_end().to_string();
            pending = Some((start, text));
            continue;
        }
        // a quoted argument spanning lines (`--config <(echo '{…` … `}')`)
        if text.matches('\'').count() % 2 == 1 {
            pending = Some((start, text));
            continue;
        }
        let text = match text.strip_prefix("cargo run --release -- ") {
            Some(rest) => format!("trmask {rest}"),
            None => text,
        };
        if text.starts_with("trmask ") || text.contains("| trmask ") {
            out.push((file.to_string(), start, text));
        }
    }
    out
}

#[test]
fn every_trmask_line_in_the_docs_runs_as_written() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut lines = Vec::new();
    for f in &files {
        lines.extend(shell_lines(
            f,
            &std::fs::read_to_string(root.join(f)).unwrap(),
        ));
    }
    for (f, n, l) in &lines {
        assert!(
            !l.contains("[--") && !l.contains("...") && !l.contains(" | --"),
            "{f}:{n}: synopsis syntax in a shell block (put it in a ```text block): {l}"
        );
    }
    assert!(lines.len() >= 10, "only {} lines found", lines.len());
    if !cfg!(unix) {
        eprintln!(
            "docs: {} trmask lines found; running them needs sh",
            lines.len()
        );
        return;
    }
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_trmask"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for f in &files {
        let dir = std::env::temp_dir().join(format!(
            "trmask-docs-{}-{}",
            std::process::id(),
            f.replace('/', "_")
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(root.join("data"), dir.join("data")).unwrap();
        for (_, n, l) in lines.iter().filter(|x| &x.0 == f) {
            let t = std::time::Instant::now();
            let out = std::process::Command::new("bash")
                .args(["-c", l])
                .current_dir(&dir)
                .env("PATH", &path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{f}:{n}: `{l}` exited {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!(
                "docs: {f}:{n} ok in {:.1} s: {l}",
                t.elapsed().as_secs_f64()
            );
            ran += 1;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("docs: ran {ran} trmask lines from README.md and docs/*.md, all exit 0");
}
