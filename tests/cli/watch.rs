//! `trmask watch` (one pass with --once, and live: steps copied in one at a time, Ctrl-C),
//! and the trend page of `report --jsonl` on real runs: resumed (steps repeated), a metric of
//! 1.1e308, a file whose last line lacked its newline. The steps are data/trainer-dumps/
//! (tests/cli/dumps.rs builds them from data/causal-sample): a six-step prime-rl export whose
//! step 5 has the stale trainer.

use crate::common;
use crate::dumps;

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PRIME: &str = "data/trainer-dumps/prime-rl";

fn tmp(name: &str) -> PathBuf {
    common::scratch("watch", name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    common::run_trmask(args)
}

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = tmp(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(from)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    // STABLE last, as prime-rl marks a step once every rank has flushed
    names.sort_by_key(|p| p.file_name().unwrap() == "STABLE");
    for p in names {
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

fn lines(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn watch_once_alerts_on_the_stale_step_of_a_prime_rl_export() {
    let d = fresh_dir("once");
    let (page, out, alerts) = (
        d.join("run.html"),
        d.join("run.jsonl"),
        d.join("alerts.txt"),
    );
    let hook = format!("printf '%s\\n' \"$TRMASK_ALERT\" >> {}", alerts.display());
    let (code, stdout, err) = run(&[
        "watch",
        PRIME,
        "--page",
        page.to_str().unwrap(),
        "--preset",
        "decoupled_k3_rs_token_tis",
        "--metrics-jsonl",
        out.to_str().unwrap(),
        "--once",
        "--on-alert",
        &hook,
    ]);
    assert_eq!(code, 3, "{stdout}{err}");
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(steps.len(), 6, "{stdout}");
    assert!(
        steps[0].starts_with("step 1: k3 mean 5.908e-5, rejected 0.0% of sequences"),
        "{stdout}"
    );
    let alert: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("alert: "))
        .collect();
    assert!(!alert.is_empty(), "{stdout}");
    assert!(
        alert.iter().all(|l| l.starts_with("alert: step 5: ")),
        "{stdout}"
    );
    assert!(
        alert[0].starts_with("alert: step 5: k3 mean 0.0349 jumped"),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(&alerts).unwrap(),
        alert.iter().map(|l| format!("{l}\n")).collect::<String>(),
        "--on-alert ran once per alert with TRMASK_ALERT"
    );
    // the metrics lines are analyze --metrics-jsonl's, value for value
    let watched = lines(&out);
    assert_eq!(watched.len(), 6);
    let inputs: Vec<String> = (1..=6)
        .map(|s| format!("{PRIME}/token_exports/step_{s}"))
        .collect();
    let direct = d.join("direct.jsonl");
    let mut args = vec!["analyze", "--preset", "decoupled_k3_rs_token_tis"];
    args.extend(inputs.iter().map(String::as_str));
    args.extend(["--metrics-jsonl", direct.to_str().unwrap()]);
    let (code, _, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(watched, lines(&direct));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("6 steps (1 to 6)"));
    assert!(
        !html.contains("http-equiv=\"refresh\""),
        "a --once page is final"
    );
    // the jumps table names the step's input by its file name, never its directories
    assert!(html.contains("<h2>Jumps</h2>") && html.contains("<td>step_5</td>"));
    assert!(!html.contains("token_exports/step_5"));
    // nothing new: no alert, exit 0 (the stale step is left out)
    let calm = fresh_dir("calm");
    for s in [1, 2, 3, 4, 6] {
        copy_dir(
            &repo(&format!("{PRIME}/token_exports/step_{s}")),
            &calm.join(format!("token_exports/step_{s}")),
        );
    }
    let (code, stdout, err) = run(&[
        "watch",
        calm.to_str().unwrap(),
        "--page",
        calm.join("p.html").to_str().unwrap(),
        "--once",
    ]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(!stdout.contains("alert:"), "{stdout}");
}

/// A running `trmask watch`, its stdout lines arriving on a channel.
struct Live {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Live {
    fn start(args: &[&str]) -> Live {
        let mut child = common::trmask_bin()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Live { child, lines: rx }
    }

    /// The next line starting with `prefix`, within `secs` seconds.
    fn expect(&self, prefix: &str, secs: u64) -> String {
        let until = Instant::now() + Duration::from_secs(secs);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        panic!("no line `{prefix}…` within {secs} s");
    }

    /// Ctrl-C, and the exit code.
    #[cfg(unix)]
    fn interrupt(mut self) -> i32 {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(unix)]
#[test]
fn a_live_watch_picks_up_steps_copied_into_an_empty_directory() {
    let d = fresh_dir("live");
    let run_dir = d.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let (page, alerts) = (d.join("live.html"), d.join("alerts.txt"));
    let hook = format!("printf '%s\\n' \"$TRMASK_ALERT\" >> {}", alerts.display());
    let live = Live::start(&[
        "watch",
        run_dir.to_str().unwrap(),
        "--page",
        page.to_str().unwrap(),
        "--preset",
        "decoupled_k3_rs_token_tis",
        "--every",
        "0.5",
        "--on-alert",
        &hook,
    ]);
    // the page exists before any step
    let until = Instant::now() + Duration::from_secs(20);
    while !page.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("no step yet") && html.contains("http-equiv=\"refresh\""));
    for s in 1..=6 {
        let t0 = Instant::now();
        copy_dir(
            &repo(&format!("{PRIME}/token_exports/step_{s}")),
            &run_dir.join(format!("token_exports/step_{s}")),
        );
        let l = live.expect(&format!("step {s}: "), 30);
        eprintln!(
            "step {s} seen {:.2} s after its copy: {l}",
            t0.elapsed().as_secs_f64()
        );
        if s == 5 {
            live.expect("alert: step 5: k3 mean", 10);
        }
    }
    // a step dump of another kind in the same directory: a safetensors step file
    let t0 = Instant::now();
    std::fs::copy(
        repo("data/trainer-dumps/prime-rl-step_1.safetensors"),
        run_dir.join("step7.safetensors"),
    )
    .unwrap();
    live.expect("step 7: ", 30);
    eprintln!(
        "step7.safetensors seen {:.2} s after its copy",
        t0.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_millis(1200));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("7 steps (1 to 7)"), "the page follows");
    assert_eq!(live.interrupt(), 130);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.ends_with("</html>\n") && !html.contains("http-equiv=\"refresh\""));
    assert!(html.contains("watch ended"));
    let fired = std::fs::read_to_string(&alerts).unwrap();
    assert!(fired.starts_with("alert: step 5: k3 mean"), "{fired}");
}

#[cfg(unix)]
#[test]
fn a_live_watch_follows_a_metrics_file_a_trainer_appends_to() {
    let d = fresh_dir("follow");
    // verl's file logger over the six steps' metrics
    let mut ms = Vec::new();
    for s in 1..=6u64 {
        let m = d.join(format!("m{s}.json"));
        let input = format!("{PRIME}/token_exports/step_{s}");
        let (code, _, err) = run(&[
            "analyze",
            &input,
            "--preset",
            "decoupled_k3_rs_token_tis",
            "--metrics",
            m.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        ms.push((s, common::load_json(&m)));
    }
    let text = dumps::verl_lines(&ms);
    let all: Vec<&str> = text.lines().collect();
    let log = d.join("experiment.jsonl");
    std::fs::write(&log, format!("{}\n{}\n", all[0], all[1])).unwrap();
    let (page, out) = (d.join("f.html"), d.join("f.jsonl"));
    let live = Live::start(&[
        "watch",
        log.to_str().unwrap(),
        "--page",
        page.to_str().unwrap(),
        "--metrics-jsonl",
        out.to_str().unwrap(),
        "--every",
        "0.5",
    ]);
    live.expect("step 1: k3 mean 5.908e-5", 20);
    live.expect("step 2: ", 5);
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    for l in &all[2..] {
        // half a line first: nothing is read until its newline arrives
        let (a, b) = l.split_at(l.len() / 2);
        f.write_all(a.as_bytes()).unwrap();
        f.flush().unwrap();
        std::thread::sleep(Duration::from_millis(700));
        f.write_all(format!("{b}\n").as_bytes()).unwrap();
        f.flush().unwrap();
    }
    live.expect("step 5: k3 mean 0.0349", 10);
    live.expect("alert: step 5: k3 mean", 10);
    live.expect("step 6: ", 10);
    assert_eq!(live.interrupt(), 130);
    let written = lines(&out);
    assert_eq!(written.len(), 6);
    assert_eq!(
        written[4]["rollout_corr/k3_kl"],
        ms[4].1["rollout_corr/k3_kl"]
    );
    // --preset applies to step dumps only
    let (code, _, err) = run(&[
        "watch",
        log.to_str().unwrap(),
        "--page",
        page.to_str().unwrap(),
        "--preset",
        "trm_avg",
        "--once",
    ]);
    assert_eq!(code, 2, "{err}");
}

/// Metrics lines of the six sample steps (analyze --metrics-jsonl), step numbers rewritten.
fn run_lines(steps: &[u64]) -> Vec<String> {
    static BASE: std::sync::OnceLock<Vec<serde_json::Value>> = std::sync::OnceLock::new();
    let base = BASE.get_or_init(|| {
        let t = fresh_dir("base").join("base.jsonl");
        let inputs: Vec<String> = (1..=6)
            .map(|s| format!("{PRIME}/token_exports/step_{s}"))
            .collect();
        let mut args = vec!["analyze", "--preset", "decoupled_k3_rs_token_tis"];
        args.extend(inputs.iter().map(String::as_str));
        args.extend(["--metrics-jsonl", t.to_str().unwrap()]);
        let (code, _, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        lines(&t)
    });
    steps
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let mut v = base[i % 6].clone();
            v["step"] = s.into();
            v.to_string()
        })
        .collect()
}

/// `report --jsonl FILE` within a time limit: (code, stdout, stderr, page).
fn report(file: &Path, tag: &str) -> (i32, String, String, String) {
    let page = tmp(&format!("{tag}.html"));
    let mut child = common::trmask_bin()
        .args([
            "report",
            "--jsonl",
            file.to_str().unwrap(),
            "-o",
            page.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("report --jsonl {} ran past 60 s", file.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        std::fs::read_to_string(&page).unwrap_or_default(),
    )
}

/// The x coordinates of the first polyline of the page.
fn first_polyline_xs(html: &str) -> Vec<f64> {
    let at = html.find("<polyline").unwrap();
    let pts = &html[at..];
    let pts = &pts[pts.find("points=\"").unwrap() + 8..];
    let pts = &pts[..pts.find('"').unwrap()];
    pts.split_whitespace()
        .map(|p| p.split(',').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn a_resumed_run_is_drawn_by_step_with_its_repeated_steps_named() {
    let d = fresh_dir("resumed");
    let f = d.join("resumed.jsonl");
    // steps 0–5, then a resume appending 0–3 again
    let steps = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3];
    std::fs::write(&f, run_lines(&steps).join("\n") + "\n").unwrap();
    let (code, out, err, html) = report(&f, "resumed");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(6 steps)"), "{out}");
    assert!(
        err.contains("warning: ") && err.contains("steps 0, 1, 2, 3 appear more than once"),
        "{err}"
    );
    assert!(html.contains("6 steps (0 to 5)"), "the header's range");
    assert!(html.contains("steps 0, 1, 2, 3 appear more than once"));
    let xs = first_polyline_xs(&html);
    assert_eq!(xs.len(), 6);
    assert!(
        xs.windows(2).all(|w| w[0] < w[1]),
        "the line goes back: {xs:?}"
    );
}

#[test]
fn a_metric_of_1e308_or_infinity_is_drawn_clipped() {
    let d = fresh_dir("huge");
    let mut ls = run_lines(&[0, 1, 2, 3, 4, 5, 6]);
    for (i, v) in [(3, "1.1e308"), (5, "\"Infinity\"")] {
        let mut j: serde_json::Value = serde_json::from_str(&ls[i]).unwrap();
        for k in [
            "trmask/k3_mean",
            "trmask/bound_all_unified",
            "rollout_corr/rollout_is_max",
        ] {
            j[k] = serde_json::from_str(v).unwrap();
        }
        ls[i] = j.to_string();
    }
    let f = d.join("huge.jsonl");
    std::fs::write(&f, ls.join("\n") + "\n").unwrap();
    let (code, _, err, html) = report(&f, "huge");
    assert_eq!(code, 0, "{err}");
    assert!(html.contains("Values drawn clipped") && html.contains("1.100e308"));
    assert!(html.contains("class=\"clipped\""));
    // every single value of 1.1e308 (the crash) and of a tiny one beside it (the hang)
    for v in ["1.1e308", "1e-320", "-1.1e308", "\"-Infinity\""] {
        let f = d.join("one.jsonl");
        std::fs::write(
            &f,
            format!("{{\"step\": 0, \"trmask/k3_mean\": 1e-3, \"trmask/bound_all_unified\": {v}}}\n\
                     {{\"step\": 1, \"trmask/k3_mean\": {v}, \"trmask/bound_all_unified\": 1e-300}}\n"),
        )
        .unwrap();
        let (code, _, err, html) = report(&f, "one");
        assert_eq!(code, 0, "{v}: {err}");
        assert!(html.contains("<svg"), "{v}");
    }
}

#[test]
fn an_append_to_a_file_without_its_last_newline_starts_a_line() {
    let d = fresh_dir("newline");
    let f = d.join("run.jsonl");
    let ls = run_lines(&[0, 1]);
    // a file whose last line lacks its newline (an editor, a writer killed after the record)
    std::fs::write(&f, format!("{}\n{}", ls[0], ls[1])).unwrap();
    let (code, _, err) = run(&[
        "analyze",
        &format!("{PRIME}/token_exports/step_3"),
        "--metrics-jsonl",
        f.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&f).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
    let (code, out, err, _) = report(&f, "newline");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(3 steps)"), "{out}");
    // a file glued by the old append (two records on one line) is read too
    let glued = d.join("glued.jsonl");
    std::fs::write(&glued, format!("{}{}\n", ls[0], ls[1])).unwrap();
    let (code, out, err, _) = report(&glued, "glued");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(2 steps)"), "{out}");
}

#[test]
fn watch_refuses_what_it_cannot_follow() {
    let d = fresh_dir("refuse");
    let page = d.join("p.html");
    let p = page.to_str().unwrap();
    assert_eq!(run(&["watch", "/nonexistent", "--page", p, "--once"]).0, 2);
    assert_eq!(
        run(&[
            "watch",
            d.to_str().unwrap(),
            "--page",
            d.join("p.txt").to_str().unwrap(),
            "--once"
        ])
        .0,
        2
    );
    assert_eq!(
        run(&[
            "watch",
            d.to_str().unwrap(),
            "--page",
            p,
            "--every",
            "0",
            "--once"
        ])
        .0,
        2
    );
    assert_eq!(
        run(&[
            "watch",
            d.to_str().unwrap(),
            "--page",
            p,
            "--preset",
            "nope",
            "--once"
        ])
        .0,
        2
    );
    // an empty directory: an empty page, exit 0
    let (code, out, err) = run(&["watch", d.to_str().unwrap(), "--page", p, "--once"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("wrote ")
            && std::fs::read_to_string(&page)
                .unwrap()
                .contains("no step yet")
    );
    // a NeMo-RL log directory, a damaged step among them: a warning, the others read
    let nemo = repo("data/trainer-dumps/nemo-rl");
    for s in 1..=3 {
        let name = format!("train_data_step{s}.jsonl");
        std::fs::copy(nemo.join(&name), d.join(&name)).unwrap();
    }
    std::fs::write(
        d.join("train_data_step4.jsonl"),
        "{\"token_loss_mask\": [[1, 1",
    )
    .unwrap();
    let (code, out, err) = run(&["watch", d.to_str().unwrap(), "--page", p, "--once"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("step ")).count(),
        3,
        "{out}"
    );
    assert!(
        err.contains("train_data_step4.jsonl") && err.contains("skipped"),
        "{err}"
    );
}
