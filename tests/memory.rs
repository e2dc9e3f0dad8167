//! Peak memory of the CPU engine does not grow with the vocabulary (issue 14, class 6): rows
//! longer than `ROW_BLOCK` (2^19) elements are read in blocks, so the per-thread scratch stays
//! at 16 MiB instead of 32 B × V (4.3 GB per thread at V = 2^27). Alone in its test binary:
//! `getrusage(RUSAGE_CHILDREN)` reports the largest child this process has waited for.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_trmask");

fn safetensors(path: &Path, tensors: &[(&str, &str, Vec<u64>, Vec<u8>)]) {
    let mut header = String::from("{");
    let mut off = 0usize;
    for (i, (name, dtype, shape, data)) in tensors.iter().enumerate() {
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header += &format!(
            "{}\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            if i > 0 { "," } else { "" },
            shape.join(","),
            off + data.len()
        );
        off += data.len();
    }
    header += "}";
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for t in tensors {
        bytes.extend_from_slice(&t.3);
    }
    std::fs::write(path, bytes).unwrap();
}

#[cfg(unix)]
fn children_peak_rss_bytes() -> u64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) }, 0);
    u.ru_maxrss as u64 * 1024 // kilobytes on Linux
}

#[cfg(unix)]
#[test]
fn cpu_scratch_does_not_grow_with_the_vocabulary() {
    let d = std::env::temp_dir().join(format!("trmask-memory-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let (rows, v) = (2usize, 1usize << 22);
    // rollout: all 0; trainer: 1 at column 0 — closed forms below
    let bf16_one = 0x3f80u16.to_le_bytes();
    let zeros = vec![0u8; rows * v * 2];
    let mut train = zeros.clone();
    for r in 0..rows {
        train[r * v * 2..r * v * 2 + 2].copy_from_slice(&bf16_one);
    }
    let f32s = |x: &[f32]| x.iter().flat_map(|e| e.to_le_bytes()).collect::<Vec<u8>>();
    let p = d.join("wide.safetensors");
    safetensors(
        &p,
        &[
            (
                "response_mask",
                "F32",
                vec![1, rows as u64],
                f32s(&[1.0; 2]),
            ),
            ("responses", "I64", vec![1, rows as u64], vec![0u8; 16]),
            (
                "rollout_logits",
                "BF16",
                vec![1, rows as u64, v as u64],
                zeros,
            ),
            ("old_logits", "BF16", vec![1, rows as u64, v as u64], train),
        ],
    );
    let file = std::fs::metadata(&p).unwrap().len();
    let out = d.join("out.json");
    let o = Command::new(BIN)
        .args([
            "analyze",
            "wide.safetensors",
            "--backend",
            "cpu",
            "--output",
            "out.json",
        ])
        .env("RAYON_NUM_THREADS", "2")
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let peak = children_peak_rss_bytes();
    // before: 2 threads × 4 f64 rows of V = 256 MiB of scratch on top of the file
    assert!(
        peak <= file + (96 << 20),
        "peak RSS {} MiB for a {} MiB file",
        peak >> 20,
        file >> 20
    );
    // p uniform, q = e at column 0 / (e + V − 1) elsewhere: KL = ln(Z/V) − 1/V, Z = e + V − 1
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let n = v as f64;
    let z = std::f64::consts::E + n - 1.0;
    let want_kl = (z / n).ln() - 1.0 / n;
    let want_h = n.ln();
    for r in 0..rows {
        let kl = j["kl"][0][r].as_f64().unwrap();
        let h = j["rollout_entropy"][0][r].as_f64().unwrap();
        assert!(
            (kl - want_kl).abs() <= 1e-9 * want_kl,
            "kl {kl} vs {want_kl}"
        );
        assert!(
            (h - want_h).abs() <= 1e-12 * want_h,
            "entropy {h} vs {want_h}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// `trmask watch` over a 10,000-step metrics JSONL (each line the ~200 metrics `analyze
/// --metrics-jsonl` writes for a real step): the file is read a line at a time and only the
/// page's series are kept, so the peak stays far below the file's size.
#[cfg(unix)]
#[test]
fn watch_memory_stays_bounded_over_ten_thousand_steps() {
    let d = std::env::temp_dir().join(format!("trmask-memory-watch-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let one = d.join("one.jsonl");
    let o = Command::new(BIN)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "analyze",
            "data/trainer-dumps/prime-rl/token_exports/step_1",
            "--backend",
            "cpu",
            "--preset",
            "decoupled_k3_rs_token_tis",
            "--metrics-jsonl",
        ])
        .arg(&one)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&one).unwrap().trim()).unwrap();
    let run = d.join("run.jsonl");
    {
        // written a line at a time: this process stays small (a child's peak counts the
        // pages it shares with its parent at the fork)
        use std::io::Write as _;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&run).unwrap());
        for s in 0..10_000u64 {
            let mut v = line.clone();
            v["step"] = s.into();
            let k3 = v["trmask/k3_mean"].as_f64().unwrap() * (1.0 + 0.01 * (s % 13) as f64);
            v["trmask/k3_mean"] = k3.into();
            writeln!(f, "{v}").unwrap();
        }
    }
    let bytes = std::fs::metadata(&run).unwrap().len();
    let page = d.join("run.html");
    let o = Command::new(BIN)
        .arg("watch")
        .arg(&run)
        .arg("--page")
        .arg(&page)
        .arg("--once")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let peak = children_peak_rss_bytes();
    let html = std::fs::metadata(&page).unwrap().len();
    eprintln!(
        "watch --once over {} steps ({} MB of JSONL): peak RSS {:.1} MiB (of every child so \
         far), page {} kB",
        10_000,
        bytes / 1_000_000,
        peak as f64 / (1 << 20) as f64,
        html / 1000
    );
    assert!(peak < 64 << 20, "peak RSS {peak} bytes");
    assert!(html < 2_000_000, "page of {html} bytes");
    let _ = std::fs::remove_dir_all(&d);
}
