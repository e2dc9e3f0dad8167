//! Hostile inputs through the binary (issue 14): one test per class. Every run is capped at a
//! 4 GiB address space (`prlimit`, where present) and must end with exit code 2 and one line
//! naming the problem (bad input), 1 (the machine: disk full, file-size limit, an input
//! rewritten underneath), or 0 with a correct result — never a signal, a panic or an abort,
//! never an overwritten input, never a half-written output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_trmask");

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("trmask-hostile-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `trmask ARGS` under a 4 GiB address-space cap (when `prlimit` exists), in `cwd`.
fn capped(cwd: &Path, args: &[&str]) -> Command {
    let mut c = if Path::new("/usr/bin/prlimit").exists() {
        let mut c = Command::new("/usr/bin/prlimit");
        c.arg("--as=4294967296").arg(BIN);
        c
    } else {
        Command::new(BIN)
    };
    c.args(args).current_dir(cwd).stdin(Stdio::null());
    c
}

fn run_in(cwd: &Path, args: &[&str]) -> (i32, String) {
    let out = capped(cwd, args).output().unwrap();
    (
        code(&out),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The exit code; a death by signal `s` is `-s` (the test then fails on the code).
fn code(out: &Output) -> i32 {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(s) = out.status.signal() {
            return -s;
        }
    }
    out.status.code().unwrap_or(-1000)
}

fn assert_exit(got: (i32, String), want: i32, needles: &[&str], what: &str) {
    let (c, err) = got;
    assert_eq!(c, want, "{what}: exit {c}, stderr: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{what}: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{what}: one line: {err}");
    for n in needles {
        assert!(err.contains(n), "{what}: stderr lacks {n:?}: {err}");
    }
}

/// Exit 0 with every needle on stdout.
fn assert_ok(out: &Output, needles: &[&str], what: &str) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(out), 0, "{what}: {out:?}");
    for n in needles {
        assert!(text.contains(n), "{what}: stdout lacks {n:?}: {text}");
    }
}

/// A safetensors file from `(name, dtype, shape, bytes)`.
fn safetensors(path: &Path, tensors: &[(&str, &str, Vec<u64>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + data.len()]}),
        );
        off += data.len();
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(h);
    for t in tensors {
        bytes.extend(&t.3);
    }
    std::fs::write(path, bytes).unwrap();
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const GOOD: &str = r#"{"rollout_log_prob": [[-1.0, -1.0]], "old_log_prob": [[-1.2, -0.9]],
    "response_mask": [[1, 1]]}"#;

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_default()
}

/// Class 1: counts declared by the file are checked against the bytes that exist before
/// anything is allocated from them.
#[test]
fn declared_counts_never_size_an_allocation() {
    let d = dir("alloc");
    for (name, rows) in [("r40", 1u64 << 40), ("r62", 1u64 << 62)] {
        let p = d.join(format!("{name}.safetensors"));
        let t = |n| (n, "F32", vec![rows, 0], Vec::new());
        safetensors(
            &p,
            &[t("rollout_log_prob"), t("old_log_prob"), t("response_mask")],
        );
        let r = run_in(&d, &["analyze", p.to_str().unwrap(), "--backend", "cpu"]);
        assert_exit(r, 2, &["out of range"], name);
    }
    let p = d.join("cu.safetensors");
    safetensors(
        &p,
        &[
            ("rollout_log_prob", "F32", vec![4], f32s(&[-1.0; 4])),
            ("old_log_prob", "F32", vec![4], f32s(&[-1.1; 4])),
            ("cu_seqlens", "I64", vec![2], i64s(&[0, 1 << 40])),
        ],
    );
    let r = run_in(&d, &["analyze", "cu.safetensors", "--backend", "cpu"]);
    assert_exit(r, 2, &["cu_seqlens", "4 token slots"], "cu_seqlens 2^40");
    std::fs::write(
        d.join("cu.json"),
        r#"{"rollout_log_prob": [-1, -1, -1, -1], "old_log_prob": [-1, -1, -1, -1],
            "cu_seqlens": [0, 2, 1e15]}"#,
    )
    .unwrap();
    let r = run_in(&d, &["analyze", "cu.json", "--backend", "cpu"]);
    assert_exit(r, 2, &["cu_seqlens"], "cu_seqlens 1e15");
    // a declared shape that its data_offsets cannot hold, or that no address fits: the
    // message names the tensor (the safetensors crate's own error does not)
    for (what, shape, needle) in [
        (
            "2^40 x 3",
            vec![1u64 << 40, 3],
            "needs 13194139533312 bytes",
        ),
        (
            "2^31 x 2^31",
            vec![1 << 31, 1 << 31],
            "too large to address",
        ),
    ] {
        let p = d.join("shape.safetensors");
        safetensors(
            &p,
            &[
                ("rollout_log_prob", "F32", vec![2, 3], f32s(&[-1.0; 6])),
                ("old_log_prob", "F32", shape, f32s(&[-1.0; 6])),
            ],
        );
        let r = run_in(&d, &["analyze", "shape.safetensors", "--backend", "cpu"]);
        assert_exit(r, 2, &["shape.safetensors", "`old_log_prob`", needle], what);
    }
}

/// Class 2: `trmask bounds` runs in O(1) memory and rejects horizons past 2^53.
#[test]
fn bounds_horizon_costs_no_memory() {
    let d = dir("bounds");
    for h in ["1000000000", "1e9", "9007199254740992"] {
        let out = capped(&d, &["bounds", "--horizon", h, "--delta", "1e-4", "--json"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "--horizon {h}: {:?}", out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["pm_kl"].as_f64().unwrap().is_finite(), "{v}");
    }
    for h in [
        "9007199254740993",
        "1000000000000000000",
        "9223372036854775808",
    ] {
        let r = run_in(&d, &["bounds", "--horizon", h, "--delta", "1e-4"]);
        assert_exit(r, 2, &["--horizon", "out of range", "2^53"], h);
    }
}

/// Class 3: an output that is an input (by path, `./x/../`, symlink, hard link), the config,
/// or another output is refused before anything is written.
#[test]
fn outputs_never_overwrite_inputs() {
    let d = dir("alias");
    std::fs::write(d.join("in.json"), GOOD).unwrap();
    std::fs::write(d.join("cfg.json"), "{}").unwrap();
    std::fs::create_dir_all(d.join("x")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink("in.json", d.join("link.json")).unwrap();
    std::fs::hard_link(d.join("in.json"), d.join("hard.json")).unwrap();
    let cases: &[&[&str]] = &[
        &["--output", "in.json"],
        &["--output", "./x/../in.json"],
        &["--output", "link.json"],
        &["--output", "hard.json"],
        &["--metrics", "in.json"],
        &["--metrics-jsonl", "in.json"],
        &["--config", "cfg.json", "--output", "cfg.json"],
        &["--output", "o.json", "--metrics", "./o.json"],
    ];
    for extra in cases {
        let mut args = vec!["analyze", "in.json", "--backend", "cpu"];
        args.extend_from_slice(extra);
        let r = run_in(&d, &args);
        assert_exit(r, 2, &["same file"], &format!("{extra:?}"));
        assert_eq!(read(&d.join("in.json")), GOOD.as_bytes(), "{extra:?}");
        assert_eq!(read(&d.join("cfg.json")), b"{}", "{extra:?}");
        assert!(!d.join("o.json").exists(), "{extra:?}");
    }
    let r = run_in(
        &d,
        &["report", "in.json", "--backend", "cpu", "-o", "hard.json"],
    );
    assert_exit(r, 2, &["same file"], "report");
    assert_eq!(read(&d.join("in.json")), GOOD.as_bytes());
}

/// Class 4: outputs are all-or-nothing — an unwritable metrics path, a full device or a
/// file-size limit leaves every target as it was, and no temporary file behind.
#[test]
fn outputs_are_all_or_nothing() {
    let d = dir("atomic");
    std::fs::write(d.join("in.json"), GOOD).unwrap();
    std::fs::write(d.join("out.json"), "previous").unwrap();
    let r = run_in(
        &d,
        &[
            "analyze",
            "in.json",
            "--backend",
            "cpu",
            "--output",
            "out.json",
            "--metrics",
            "missing/m.json",
        ],
    );
    assert_exit(r, 2, &["missing/m.json"], "unwritable metrics");
    assert_eq!(read(&d.join("out.json")), b"previous");
    if Path::new("/dev/full").exists() {
        let r = run_in(
            &d,
            &[
                "analyze",
                "in.json",
                "--backend",
                "cpu",
                "--output",
                "out.json",
                "--metrics",
                "/dev/full",
            ],
        );
        assert_exit(r, 1, &["/dev/full"], "metrics to /dev/full");
        assert_eq!(read(&d.join("out.json")), b"previous");
    }
    // A file-size limit of 1 KiB: the outputs do not fit.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f 1 && exec {BIN} analyze in.json --backend cpu --output out.json \
             --metrics m.json"
        ))
        .current_dir(&d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_exit((code(&out), err), 1, &["too large"], "ulimit -f");
    assert_eq!(read(&d.join("out.json")), b"previous");
    assert!(!d.join("m.json").exists());
    let left: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("trmask-tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    // And a good run replaces the target completely.
    let r = run_in(
        &d,
        &[
            "analyze",
            "in.json",
            "--backend",
            "cpu",
            "--output",
            "out.json",
        ],
    );
    assert_eq!(r.0, 0, "{}", r.1);
    let v: serde_json::Value = serde_json::from_slice(&read(&d.join("out.json"))).unwrap();
    assert!(v.get("log_ratio").is_some());
}

/// Class 5: an input truncated while trmask reads it (a producer re-saving it in place) is a
/// clean exit (0 if it was done, 2 if the file was already short, 1 with one line otherwise),
/// never SIGBUS, and never leaves an output.
#[test]
fn input_truncated_under_the_map_is_a_clean_exit() {
    let d = dir("sigbus");
    let (rows, v) = (1024usize, 8192usize);
    let logits: Vec<f32> = (0..rows * v)
        .map(|i| ((i * 7919) % 1000) as f32 / 300.0)
        .collect();
    let ids: Vec<i64> = (0..rows as i64).map(|i| i % v as i64).collect();
    let p = d.join("big.safetensors");
    let write = || {
        safetensors(
            &p,
            &[
                ("responses", "I64", vec![rows as u64], i64s(&ids)),
                ("cu_seqlens", "I64", vec![2], i64s(&[0, rows as i64])),
                (
                    "rollout_logits",
                    "F32",
                    vec![rows as u64, v as u64],
                    f32s(&logits),
                ),
                (
                    "old_logits",
                    "F32",
                    vec![rows as u64, v as u64],
                    f32s(&logits),
                ),
            ],
        )
    };
    write();
    let args = [
        "analyze",
        "big.safetensors",
        "--backend",
        "cpu",
        "--output",
        "o.safetensors",
    ];
    let t0 = std::time::Instant::now();
    let out = capped(&d, &args).output().unwrap();
    assert_eq!(code(&out), 0, "{out:?}");
    let full = t0.elapsed();
    std::fs::remove_file(d.join("o.safetensors")).unwrap();
    let mut cut = 0;
    for k in 1..=12u32 {
        write();
        let child = capped(&d, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(full * k / 14);
        // Re-saved in place: truncated to the header, as `open(O_TRUNC)` + a slow write does.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(256)
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let c = code(&out);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(c >= 0, "killed by signal {}: {err}", -c);
        assert!([0, 1, 2].contains(&c), "exit {c}: {err}");
        if c != 0 {
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert!(
                !d.join("o.safetensors").exists(),
                "output left after exit {c}"
            );
        }
        if c == 1 {
            assert!(err.contains("shrank"), "{err}");
            cut += 1;
        }
        let _ = std::fs::remove_file(d.join("o.safetensors"));
    }
    eprintln!("{cut} of 12 runs were cut by the truncation (full run {full:?})");
    // The truncation times span the run, so some land while the logits are being read.
    assert!(
        cut >= 1,
        "no run was cut: the test did not exercise the truncation"
    );
}

/// Class 7: with XDG_RUNTIME_DIR unset, a planted symlink in TMPDIR is neither followed nor
/// chmod'ed, and the private directory trmask makes is gone after the run.
#[cfg(unix)]
#[test]
fn runtime_dir_is_private_and_fresh() {
    use std::os::unix::fs::PermissionsExt as _;
    let d = dir("xdg");
    let victim = d.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&victim, d.join("trmask-xdg-runtime")).unwrap();
    let out = Command::new(BIN)
        .arg("devices")
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", &d)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{out:?}");
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755, "the planted symlink's target was chmod'ed");
    let extra: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "victim" && n != "trmask-xdg-runtime")
        .collect();
    assert!(extra.is_empty(), "left behind: {extra:?}");
}

/// Class 8: ids are read only where the mask is 1: garbage at padding (2^63 − 1, NaN in a
/// float-typed id tensor, 2^62) changes nothing.
#[test]
fn garbage_ids_at_padding_never_matter() {
    let d = dir("padding");
    let logits: Vec<f32> = (0..12).map(|i| (i % 5) as f32 * 0.3).collect();
    let ltrain: Vec<f32> = (0..12).map(|i| (i % 4) as f32 * 0.25).collect();
    let mk = |name: &str, responses: Vec<u8>, dtype: &str, topk: Vec<i64>| {
        safetensors(
            &d.join(name),
            &[
                (
                    "response_mask",
                    "F32",
                    vec![2, 2],
                    f32s(&[1.0, 0.0, 1.0, 1.0]),
                ),
                ("responses", dtype, vec![2, 2], responses),
                ("rollout_logits", "F32", vec![2, 2, 3], f32s(&logits)),
                ("old_logits", "F32", vec![2, 2, 3], f32s(&ltrain)),
                ("rollout_topk_ids", "I64", vec![2, 2, 2], i64s(&topk)),
                (
                    "rollout_topk_log_prob",
                    "F32",
                    vec![2, 2, 2],
                    f32s(&[-0.5, -1.5, f32::NAN, f32::NAN, -0.6, -1.4, -0.7, -1.3]),
                ),
            ],
        )
    };
    mk(
        "clean.safetensors",
        i64s(&[1, 0, 2, 0]),
        "I64",
        vec![1, 0, 0, 0, 2, 1, 0, 2],
    );
    mk(
        "i64.safetensors",
        i64s(&[1, i64::MAX, 2, 0]),
        "I64",
        vec![1, 0, 1 << 62, i64::MAX, 2, 1, 0, 2],
    );
    mk(
        "nan.safetensors",
        f32s(&[1.0, f32::NAN, 2.0, 0.0]),
        "F32",
        vec![1, 0, -5, 1 << 62, 2, 1, 0, 2],
    );
    let mut want = None;
    for name in ["clean", "i64", "nan"] {
        let out = format!("{name}.out.json");
        let r = run_in(
            &d,
            &[
                "analyze",
                &format!("{name}.safetensors"),
                "--backend",
                "cpu",
                "--output",
                &out,
            ],
        );
        assert_eq!(r.0, 0, "{name}: {}", r.1);
        let got = read(&d.join(&out));
        match &want {
            None => want = Some(got),
            Some(w) => assert_eq!(&got, w, "{name}: padding changed the outputs"),
        }
    }
}

fn backends() -> Vec<&'static str> {
    let gpu = std::env::var_os("TRMASK_REQUIRE_GPU").is_some()
        || Command::new(BIN)
            .arg("devices")
            .output()
            .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).contains("selected: none"));
    if gpu {
        vec!["cpu", "gpu"]
    } else {
        vec!["cpu"]
    }
}

/// Class 9: degenerate inputs get one verdict on both engines, exit code 2 naming the cause:
/// a trainer logit of −inf at the sampled token, a temperature whose `logits / T` overflows.
#[test]
fn degenerate_inputs_same_verdict_on_both_engines() {
    let d = dir("degenerate");
    let ni = f32::NEG_INFINITY;
    safetensors(
        &d.join("ninf.safetensors"),
        &[
            ("response_mask", "F32", vec![1, 2], f32s(&[1.0, 1.0])),
            ("responses", "I64", vec![1, 2], i64s(&[1, 2])),
            (
                "rollout_logits",
                "F32",
                vec![1, 2, 3],
                f32s(&[0., 1., 2., 0., 1., 2.]),
            ),
            (
                "old_logits",
                "F32",
                vec![1, 2, 3],
                f32s(&[0., ni, 2., 0., 1., 2.]),
            ),
        ],
    );
    safetensors(
        &d.join("ok.safetensors"),
        &[
            ("response_mask", "F32", vec![1, 2], f32s(&[1.0, 1.0])),
            ("responses", "I64", vec![1, 2], i64s(&[1, 2])),
            (
                "rollout_logits",
                "F32",
                vec![1, 2, 3],
                f32s(&[0., 1., 2., 0., 1., 2.]),
            ),
            (
                "old_logits",
                "F32",
                vec![1, 2, 3],
                f32s(&[0., 0.5, 2., 0., 1., 2.5]),
            ),
        ],
    );
    for b in backends() {
        let r = run_in(&d, &["analyze", "ninf.safetensors", "--backend", b]);
        assert_exit(r, 2, &["old_logits", "[0, 0]", "-inf"], b);
        for t in ["1e-300", "0", "-1", "inf"] {
            let r = run_in(
                &d,
                &[
                    "analyze",
                    "ok.safetensors",
                    "--backend",
                    b,
                    "--temperature",
                    t,
                ],
            );
            assert_exit(
                r,
                2,
                &["--temperature", "out of range"],
                &format!("{b} T={t}"),
            );
        }
        let r = run_in(
            &d,
            &[
                "analyze",
                "ok.safetensors",
                "--backend",
                b,
                "--temperature",
                "1e-5",
            ],
        );
        assert_eq!(r.0, 0, "{b}: {}", r.1);
    }
}

/// Class 10: a failed stdout write other than a closed pipe is exit code 1.
#[test]
fn stdout_failures_are_exit_1() {
    let d = dir("stdout");
    std::fs::write(d.join("in.json"), GOOD).unwrap();
    if Path::new("/dev/full").exists() {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = capped(&d, &["analyze", "in.json", "--backend", "cpu"])
            .stdout(full)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_exit((code(&out), err), 1, &["stdout"], "> /dev/full");
        // the summary is written before the outputs are renamed into place: none is left
        for args in [
            &[
                "analyze",
                "in.json",
                "--backend",
                "cpu",
                "--output",
                "out.json",
            ][..],
            &[
                "analyze",
                "in.json",
                "--backend",
                "cpu",
                "--metrics",
                "m.json",
            ][..],
            &["report", "in.json", "--backend", "cpu", "-o", "r.html"][..],
        ] {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap();
            let out = capped(&d, args).stdout(full).output().unwrap();
            assert_eq!(code(&out), 1, "{args:?} > /dev/full: {out:?}");
            let left: Vec<_> = std::fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != "in.json")
                .collect();
            assert!(left.is_empty(), "{args:?} > /dev/full left {left:?}");
        }
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = capped(&d, &["bounds", "--horizon", "10", "--delta", "1e-4"])
            .stdout(full)
            .output()
            .unwrap();
        assert_eq!(code(&out), 1, "bounds > /dev/full: {out:?}");
    }
    // A closed pipe is fine.
    let mut child = capped(&d, &["analyze", "in.json", "--backend", "cpu"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{out:?}");
}

/// Class 11: messages say what is wrong: "out of range" with the limit, a directory or FIFO
/// or device input says so, a negative number in scientific notation is a value, and a JSON
/// input over the limit stops before it is read.
#[test]
fn messages_name_the_problem() {
    let d = dir("messages");
    let r = run_in(
        &d,
        &[
            "bounds",
            "--horizon",
            "99999999999999999999",
            "--delta",
            "1e-4",
        ],
    );
    assert_exit(
        r,
        2,
        &["--horizon", "out of range", "9007199254740992"],
        "big int",
    );
    let r = run_in(&d, &["bounds", "--horizon", "10", "--delta", "-1e-4"]);
    assert_exit(r, 2, &["--delta", ">= 0", "-0.0001"], "--delta -1e-4");
    let r = run_in(
        &d,
        &[
            "bounds",
            "--horizon",
            "10",
            "--delta",
            "1e-4",
            "--eps",
            "-1E-3",
        ],
    );
    assert_exit(r, 2, &["--eps"], "--eps -1E-3");
    std::fs::create_dir(d.join("dir.json")).unwrap();
    let r = run_in(&d, &["analyze", "dir.json", "--backend", "cpu"]);
    assert_exit(r, 2, &["dir.json", "directory"], "directory");
    #[cfg(unix)]
    {
        let ok = Command::new("mkfifo")
            .arg(d.join("fifo.json"))
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            // A FIFO is read as a stream of JSON, like `--config` reads one (bounded: a
            // reader that waits for more than the writer sends would hang).
            std::fs::write(d.join("good.json"), GOOD).unwrap();
            for (input, needles) in [
                ("good.json", &["1 sequences"][..]),
                (
                    "st.safetensors",
                    &["fifo.json", "pipe", "safetensors", "regular file"][..],
                ),
            ] {
                if input == "st.safetensors" {
                    safetensors(
                        &d.join(input),
                        &[("rollout_log_prob", "F32", vec![1, 2], f32s(&[-1.0; 2]))],
                    );
                }
                let writer = Command::new("sh")
                    .args(["-c", &format!("cat {input} > fifo.json")])
                    .current_dir(&d)
                    .spawn()
                    .unwrap();
                let out = Command::new("timeout")
                    .args(["20", BIN, "analyze", "fifo.json", "--backend", "cpu"])
                    .current_dir(&d)
                    .output()
                    .unwrap();
                let mut writer = writer;
                let _ = writer.kill();
                let _ = writer.wait();
                if input == "good.json" {
                    assert_ok(&out, needles, input);
                } else {
                    let err = String::from_utf8_lossy(&out.stderr).into_owned();
                    assert_exit((code(&out), err), 2, needles, input);
                }
            }
            // process substitution, the way a shell user pipes a batch in
            if Command::new("bash").arg("--version").output().is_ok() {
                let out = Command::new("timeout")
                    .args([
                        "20",
                        "bash",
                        "-c",
                        &format!("{BIN} analyze <(cat good.json) --backend cpu"),
                    ])
                    .current_dir(&d)
                    .output()
                    .unwrap();
                assert_ok(&out, &["1 sequences"], "<(cat good.json)");
            }
        }
        std::os::unix::fs::symlink("/dev/zero", d.join("zero.json")).unwrap();
        let r = run_in(&d, &["analyze", "zero.json", "--backend", "cpu"]);
        assert_exit(r, 2, &["zero.json", "not a regular file"], "/dev/zero");
    }
    // A sparse 300 MiB JSON file: refused from its size, nothing read.
    let f = std::fs::File::create(d.join("huge.json")).unwrap();
    f.set_len(300 << 20).unwrap();
    let r = run_in(&d, &["analyze", "huge.json", "--backend", "cpu"]);
    assert_exit(r, 2, &["huge.json", "limit"], "huge JSON");
}
