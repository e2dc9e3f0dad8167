//! `trmask report`: one self-contained HTML page, rendered in headless Chromium (not blank,
//! no console errors, no network). Without Chromium the rendering check is skipped with a
//! message, except under CI (`CI` set), where it fails.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|c| {
            let out = Command::new("which").arg(c).output().ok()?;
            out.status
                .success()
                .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
}

/// A [16, 256] batch whose last quarter of every other sequence drifts.
fn drifting_batch() -> serde_json::Value {
    let mut r = common::Rng::new(3);
    let (b, t) = (16, 256);
    let (mut roll, mut old, mut mask) = (vec![], vec![], vec![]);
    for s in 0..b {
        let len = 64 + r.below(t - 64);
        let (mut a, mut o, mut m) = (vec![], vec![], vec![]);
        for p in 0..t {
            let x = r.range(-5.0, -0.01);
            let drift = if s % 2 == 0 {
                4.0 * (p as f64 / t as f64).powi(3)
            } else {
                0.0
            };
            a.push(x);
            o.push(x + (0.02 + drift) * r.range(-1.0, 1.0));
            m.push((p < len) as u8);
        }
        roll.push(a);
        old.push(o);
        mask.push(m);
    }
    serde_json::json!({"rollout_log_prob": roll, "old_log_prob": old, "response_mask": mask})
}

fn render(input: &Path, tag: &str, preset: &str) -> PathBuf {
    let html = common::scratch("report", &format!("{tag}.html"));
    let (code, out, err) = common::run_trmask(&[
        "report",
        input.to_str().unwrap(),
        "--backend",
        "cpu",
        "--preset",
        preset,
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wrote"), "{out}");
    let text = std::fs::read_to_string(&html).unwrap();
    // self-contained: inline SVG, no script, nothing fetched
    assert!(text.matches("<svg").count() >= 4, "charts missing");
    assert!(!text.contains("<script"), "no scripts");
    for bad in ["src=\"http", "href=\"http", "url(http", "<link", "<img"] {
        assert!(!text.contains(bad), "external resource {bad}");
    }
    for section in [
        "Divergence by token position",
        "Sequence length vs sequence statistic",
        "Criteria: statistic vs threshold",
        "Rejections by criterion",
        "Worst sequences",
        "Bound certificate",
        "B*",
        "<th>PM-TV</th>",
        "<th>Mix-TV</th>",
    ] {
        assert!(text.contains(section), "{section} missing");
    }
    html
}

fn check_in_browser(html: &Path, tag: &str) {
    let Some(chrome) = chromium() else {
        if std::env::var_os("CI").is_some() {
            panic!("chromium is required under CI (apt-get install -y chromium)");
        }
        eprintln!("skipping the headless-browser check: no chromium on PATH");
        return;
    };
    let png = common::scratch("report", &format!("{tag}.png"));
    let _ = std::fs::remove_file(&png);
    let url = format!("file://{}", html.display());
    let profile = common::scratch("report", &format!("profile-{tag}"));
    let out = Command::new(&chrome)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,2000",
            &url,
        ])
        .output()
        .expect("run chromium");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chromium failed: {log}");
    for line in log.lines() {
        assert!(
            !(line.contains("CONSOLE") || line.contains("Uncaught") || line.contains("net::ERR")),
            "browser console: {line}"
        );
    }
    // a blank 1280x2000 page compresses to a few kB; charts and tables do not
    let size = std::fs::metadata(&png).expect("screenshot written").len();
    assert!(
        size > 40_000,
        "screenshot of {tag} looks blank ({size} bytes)"
    );
    let dom = Command::new(&chrome)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
            &url,
        ])
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("<polyline") && dom.contains("<circle"),
        "charts not in the DOM"
    );
    if let Some(dir) = std::env::var_os("TRMASK_SCREENS") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(&png, Path::new(&dir).join(format!("{tag}.png"))).unwrap();
    }
}

#[test]
fn sample_report_renders() {
    let html = render(
        Path::new("data/sample/real-small.safetensors"),
        "sample",
        "decoupled_k3_rs",
    );
    check_in_browser(&html, "sample");
}

#[test]
fn drifting_batch_report_renders() {
    let p = common::scratch("report", "drift.json");
    std::fs::write(&p, drifting_batch().to_string()).unwrap();
    let html = render(&p, "drift", "trm_max");
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(
        text.contains("class=\"bad\">reject"),
        "the drifting tails are rejected"
    );
    check_in_browser(&html, "drift");
}

/// The report shows the `warning:` lines the command line prints (here the causal sample's
/// constant offset from top-p sampling), says so when nothing was rejected instead of an empty
/// chart, and is written only under an HTML name.
#[test]
fn causal_report_shows_the_warnings() {
    let html = render(
        Path::new("data/causal-sample/batch.safetensors"),
        "causal",
        "decoupled_k3_rs",
    );
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("<h2>Warnings</h2>"), "no warnings section");
    assert!(
        text.contains("a constant offset"),
        "the offset warning is missing"
    );
    assert!(text.contains("No sequence was rejected by any criterion."));
    // the headline: the decision, then the dominant warning's first clause
    assert!(text.contains("Nothing rejected: all 64 sequences and 24560 tokens pass seq_mean_k3."));
    assert!(text.contains(
        "<p class=\"bad\">Warning: log_ratio has mean -0.05056 but spread only 0.01048: a \
         constant offset, not token-level mismatch (more under Warnings)</p>"
    ));
    let pdf = common::scratch("report", "causal.pdf");
    let out = common::trmask_bin()
        .args([
            "report",
            "data/causal-sample/batch.safetensors",
            "--backend",
            "cpu",
            "-o",
        ])
        .arg(&pdf)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("name a .html file"));
    assert!(!pdf.exists());
}

/// A multi-turn batch (two tool-output holes per row: three turns), half the rows with a
/// negative advantage and a drifting last turn: the summary and the report break the mismatch
/// down by advantage sign, rollout probability and turn; the single-turn batch without
/// advantages above shows neither the turn nor the sign breakdown.
#[test]
fn multi_turn_report_shows_the_breakdowns() {
    let mut r = common::Rng::new(30);
    let (b, t) = (12, 60);
    let (mut roll, mut old, mut mask, mut adv) = (vec![], vec![], vec![], vec![]);
    for s in 0..b {
        let (mut a, mut o, mut m) = (vec![], vec![], vec![]);
        for p in 0..t {
            let x = r.range(-4.0, -0.01);
            let drift = if s % 2 == 1 && p >= 40 { 3.0 } else { 0.02 };
            a.push(x);
            o.push(x + drift * r.range(-1.0, 1.0));
            m.push(!(18..22).contains(&p) && !(38..42).contains(&p) && p < 56);
        }
        roll.push(a);
        old.push(o);
        mask.push(m.iter().map(|&v| v as u8).collect::<Vec<_>>());
        adv.push(vec![if s % 2 == 1 { -1.0 } else { 1.0 }; t]);
    }
    let p = common::scratch("report", "turns.json");
    let batch = serde_json::json!({"rollout_log_prob": roll, "old_log_prob": old,
        "response_mask": mask, "advantages": adv});
    std::fs::write(&p, batch.to_string()).unwrap();
    let (code, out, err) = common::run_trmask(&[
        "analyze",
        p.to_str().unwrap(),
        "--backend",
        "cpu",
        "--preset",
        "trm_max",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("turns: mean 3, max 3 per sequence"), "{out}");
    assert!(
        out.contains("rejections by advantage sign (k3 mean): A > 0"),
        "{out}"
    );
    assert!(out.contains("k3 mean by p(y):"), "{out}");
    let html = render(&p, "turns", "trm_max");
    let text = std::fs::read_to_string(&html).unwrap();
    for section in [
        "<h2>Rejections by advantage sign</h2>",
        "<h2>Mismatch by the sampled token's rollout probability</h2>",
        "<h2>Mismatch and rejections by turn</h2>",
    ] {
        assert!(text.contains(section), "{section} missing");
    }
    // the drifting turn 3 of the negative-advantage rows carries the mismatch
    assert!(text.contains("<td>A &lt; 0</td>") || text.contains("<td>A < 0</td>"));
    check_in_browser(&html, "turns");
    let d = common::scratch("report", "drift-plain.json");
    std::fs::write(&d, drifting_batch().to_string()).unwrap();
    let (code, out, err) = common::run_trmask(&[
        "analyze",
        d.to_str().unwrap(),
        "--backend",
        "cpu",
        "--preset",
        "trm_max",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("turns:") && !out.contains("advantage sign"),
        "{out}"
    );
}

/// The page as laid out by Chromium at `width` px: `(scrollWidth, clientWidth, smallest chart
/// text in px, figures)`, measured by a script added to a copy of the page (the page itself has
/// none).
fn measure(html: &Path, width: u32, tag: &str) -> Option<(f64, f64, f64, usize)> {
    let chrome = chromium()?;
    let probe = common::scratch("report", &format!("{tag}-{width}-probe.html"));
    let text = std::fs::read_to_string(html).unwrap().replace(
        "</body>",
        "<script>const d=document.documentElement;let m=1e9;\
         for(const t of document.querySelectorAll('figure svg text')){\
         const c=t.getScreenCTM();\
         const s=parseFloat(getComputedStyle(t).fontSize)*Math.hypot(c.a,c.b);if(s<m)m=s;}\
         document.body.insertAdjacentHTML('beforeend','<p id=\"probe\">'+d.scrollWidth+' '+\
         d.clientWidth+' '+m+' '+document.querySelectorAll('figure').length+'</p>');</script></body>",
    );
    std::fs::write(&probe, text).unwrap();
    let profile = common::scratch("report", &format!("profile-{tag}-{width}"));
    let out = Command::new(&chrome)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--window-size={width},1200"),
            "--dump-dom",
            &format!("file://{}", probe.display()),
        ])
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    // the last match: the first is the script's own text
    let at = dom.rfind("<p id=\"probe\">").expect("the probe ran") + 14;
    let v: Vec<f64> = dom[at..dom[at..].find('<').unwrap() + at]
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    Some((v[0], v[1], v[2], v[3] as usize))
}

/// A batch with real rejections (the causal sample against its stale trainer) with the
/// sample's tokenizer: the headline states the decision, the certificate is folded, the worst
/// tokens carry their text, the strips' cells their tooltips, the page names the file without
/// its directories; at 1000 px nothing scrolls sideways and no chart text is under 12 px.
#[test]
fn stale_report_leads_with_the_decision_and_fits_1000px() {
    let html = common::scratch("report", "stale.html");
    let (code, _, err) = common::run_trmask(&[
        "report",
        "data/causal-sample/stale.safetensors",
        "--backend",
        "cpu",
        "--preset",
        "decoupled_k3_rs_token_tis",
        "--config",
        "data/causal-sample/stale.yaml",
        "--tokenizer",
        "data/causal-sample/tokenizer.json",
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(
        text.contains("Rejected 29.7 % of sequences (19 of 64) and 28.5 % of tokens (6991 of 24560) by seq_mean_k3 (19)."),
        "headline"
    );
    assert!(
        text.contains("<details><summary>Vacuous at this length"),
        "certificate"
    );
    assert!(text.contains("<h2>Worst tokens</h2>") && text.contains("<th>text</th>"));
    // token 199 of the sample's byte-level BPE is a newline
    assert!(
        text.contains("<td>199</td><td><code>&quot;\\n&quot;</code></td>"),
        "decoded text"
    );
    assert!(text.contains("<title>t=0 id "), "strip tooltips");
    assert!(
        !text.contains("data/causal-sample/stale"),
        "directories shown"
    );
    assert!(
        text.contains("IS weights (token, truncated at 2): mean "),
        "IS line"
    );
    // a tokenizer that is not one is an error naming the file
    let (code, _, err) = common::run_trmask(&[
        "report",
        "data/causal-sample/stale.safetensors",
        "--backend",
        "cpu",
        "--tokenizer",
        "data/causal-sample/stale.yaml",
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("stale.yaml") && err.contains("tokenizer.json"),
        "{err}"
    );
    for width in [1000, 1400] {
        let Some((scroll, client, font, figures)) = measure(&html, width, "stale") else {
            if std::env::var_os("CI").is_some() {
                panic!("chromium is required under CI (apt-get install -y chromium)");
            }
            eprintln!("skipping the layout check: no chromium on PATH");
            return;
        };
        assert!(figures >= 4, "{figures} figures");
        assert!(
            scroll <= client,
            "horizontal scroll at {width} px: {scroll} > {client}"
        );
        assert!(font >= 12.0, "chart text of {font} px at {width} px");
        eprintln!("{width} px: scrollWidth {scroll}, clientWidth {client}, smallest chart text {font:.1} px, {figures} figures");
    }
}
