//! Property-based tests (proptest, stable Rust) over the untrusted-input parsers: safetensors
//! headers and tensor tables, JSON batches, configs and verl's threshold grammar, and the
//! output-path checks. Properties: no panic; no allocation above a bound derived from the
//! input's size (a counting allocator, per thread); the same verdict (Ok or the same error
//! kind) on the CPU and the GPU engine.
//!
//! The default run is bounded (`TRMASK_FUZZ_CASES`, default 64 cases per property; the GPU
//! property runs an eighth of them); a longer run: `TRMASK_FUZZ_CASES=5000 cargo test --test
//! fuzz`. What the runs found is recorded in docs/TESTING.md.

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod common;

/// Counts the bytes live and the peak, per thread, so parallel tests do not mix.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let _ = LIVE.try_with(|c| {
                let v = c.get() + l.size();
                c.set(v);
                let _ = PEAK.try_with(|pk| pk.set(pk.get().max(v)));
            });
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        let _ = LIVE.try_with(|c| c.set(c.get().saturating_sub(l.size())));
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak bytes allocated on this thread by `f`, above what was live before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(|c| c.get());
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(|p| p.get()) - base)
}

/// The allocation bound for an input of `n` bytes: a parsed JSON tree costs a few dozen
/// bytes per byte of text at worst, plus fixed overhead.
fn bound(n: usize) -> usize {
    64 * n + (8 << 20)
}

fn cases() -> u32 {
    std::env::var("TRMASK_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
}

fn config(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    common::scratch("fuzz", name)
}

/// A safetensors file: a header declaring tensors (dtype, shape, offsets drawn from hostile
/// ranges) and a data section of the given length.
fn safetensors_bytes() -> impl Strategy<Value = Vec<u8>> {
    let name = prop::sample::select(vec![
        "rollout_log_prob",
        "old_log_prob",
        "response_mask",
        "cu_seqlens",
        "responses",
        "rollout_logits",
        "old_logits",
        "rollout_topk_ids",
        "rollout_topk_log_prob",
        "advantages",
        "uid",
    ]);
    let dtype = prop::sample::select(vec![
        "F32", "F64", "F16", "BF16", "I64", "I32", "U8", "BOOL", "I8", "U64",
    ]);
    let dim = prop_oneof![
        0u64..5,
        Just(1u64 << 40),
        Just(1u64 << 62),
        Just(u64::MAX),
        0u64..100_000
    ];
    let tensor = (
        name,
        dtype,
        prop::collection::vec(dim, 0..4),
        0u64..64,
        0u64..64,
    );
    (
        prop::collection::vec(tensor, 0..6),
        prop::collection::vec(any::<u8>(), 0..256),
        any::<bool>(),
    )
        .prop_map(|(tensors, data, consistent)| {
            let mut header = serde_json::Map::new();
            let mut off = 0u64;
            for (name, dtype, shape, a, b) in tensors {
                let (start, end) = if consistent {
                    let n: u64 = shape.iter().fold(1u64, |p, &d| p.saturating_mul(d));
                    let size = match dtype {
                        "F64" | "I64" | "U64" => 8,
                        "F32" | "I32" => 4,
                        "F16" | "BF16" => 2,
                        _ => 1,
                    };
                    let len = n.saturating_mul(size).min(1 << 20);
                    (off, off + len)
                } else {
                    (a, a + b)
                };
                off = end;
                header.insert(
                    name.to_string(),
                    serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, end]}),
                );
            }
            let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
            let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
            bytes.extend(h);
            bytes.extend(data);
            bytes
        })
}

/// A JSON batch: token tensors of a random (often inconsistent) shape holding numbers,
/// non-finite markers, nulls and hostile integers; maybe a mask or cu_seqlens.
fn json_batch() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        4 => (-3.0f64..0.0).prop_map(|x| serde_json::json!(x)),
        1 => Just(serde_json::json!(0)),
        1 => Just(serde_json::json!(1)),
        1 => Just(serde_json::json!("NaN")),
        1 => Just(serde_json::json!("-Infinity")),
        1 => Just(serde_json::Value::Null),
        1 => Just(serde_json::json!(9.223372036854776e18)),
        1 => Just(serde_json::json!(1e15)),
        1 => Just(serde_json::json!(-1)),
    ];
    let row = prop::collection::vec(value, 0..5);
    let tensor = prop::collection::vec(row, 0..4);
    let name = prop::sample::select(vec![
        "rollout_log_prob",
        "old_log_prob",
        "response_mask",
        "responses",
        "advantages",
        "rollout_topk_ids",
        "old_log_probs",
        "cu_seqlens",
    ]);
    (
        prop::collection::btree_map(name, tensor, 0..6),
        any::<bool>(),
    )
        .prop_map(|(m, flat)| {
            let mut obj = serde_json::Map::new();
            for (k, v) in m {
                let v = if flat || k == "cu_seqlens" {
                    serde_json::Value::Array(v.into_iter().flatten().collect())
                } else {
                    serde_json::Value::Array(v.into_iter().map(serde_json::Value::Array).collect())
                };
                obj.insert(k.to_string(), v);
            }
            serde_json::Value::Object(obj).to_string()
        })
}

/// Text near the threshold grammar: numbers, `L_U`, commas, Python float spellings, junk.
fn threshold_text() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        Just("2.0".to_string()),
        Just("0.5_2".to_string()),
        Just("1e-3".to_string()),
        Just("inf".to_string()),
        Just("-Infinity".to_string()),
        Just("nan".to_string()),
        Just("_".to_string()),
        Just("1_000".to_string()),
        Just("".to_string()),
        "[-+0-9._eE ]{0,8}",
        "\\PC{0,6}",
    ];
    prop::collection::vec(atom, 0..5).prop_map(|v| v.join(","))
}

fn rs_option() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "token_k1",
        "seq_sum_k1",
        "seq_mean_k3",
        "seq_max_k2",
        "seq_mean_kl",
        "seq_lntrm",
        "bogus",
    ])
    .prop_map(String::from)
}

fn kind(e: &trmask::Error) -> String {
    format!("{e:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or("")
        .to_string()
}

proptest! {
    #![proptest_config(config(cases()))]

    /// Safetensors headers and tensor tables: no panic, allocations bounded by the file size.
    #[test]
    fn safetensors_never_panics_nor_overallocates(bytes in safetensors_bytes(), all_valid: bool) {
        let p = scratch("st.safetensors");
        std::fs::write(&p, &bytes).unwrap();
        let opts = trmask::io::ReadOptions { all_valid };
        let (r, peak) = peak_of(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| trmask::io::read_input(&p, &opts).map(|_| ()))));
        prop_assert!(r.is_ok(), "panic on {} bytes", bytes.len());
        prop_assert!(peak <= bound(bytes.len()), "{peak} bytes allocated for a {}-byte file", bytes.len());
    }

    /// JSON batches: no panic, bounded allocations, and a batch that reads gives the same
    /// verdict on every engine.
    #[test]
    fn json_batches_never_panic(text in json_batch(), all_valid: bool) {
        let opts = trmask::io::ReadOptions { all_valid };
        let (r, peak) = peak_of(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| trmask::io::input_from_json(&text, &opts))));
        prop_assert!(peak <= bound(text.len()), "{peak} bytes for {} bytes of JSON", text.len());
        let r = r.map_err(|_| TestCaseError::fail(format!("panic on {text}")))?;
        if let Ok(input) = r {
            let cfg = trmask::CorrectionConfig::default();
            let cpu = trmask::cpu::CpuEngine::new();
            let c = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| trmask::analysis::analyze(&cpu, &input.batch, &cfg).map(|_| ())));
            prop_assert!(c.is_ok(), "analysis panicked on {text}");
        }
    }

    /// Config JSON and verl's threshold grammar: errors, never panics.
    #[test]
    fn config_and_thresholds_never_panic(spec in threshold_text(), opts in prop::collection::vec(rs_option(), 0..4), num in any::<f64>()) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = trmask::config::parse_rs_thresholds(&opts, &trmask::config::ThresholdSpec::Text(spec.clone()));
            let _ = trmask::config::parse_rs_thresholds(&opts, &trmask::config::ThresholdSpec::Number(num));
            let _ = trmask::config::parse_is_threshold(&trmask::config::ThresholdSpec::Text(spec.clone()));
            let _ = trmask::config::py_float(&spec);
            let cfg = serde_json::json!({
                "rollout_rs": opts.join(","),
                "rollout_rs_threshold": spec,
                "rollout_is": "token",
                "rollout_is_threshold": num.to_string(),
                "temperature": num,
            });
            let _ = trmask::CorrectionConfig::from_json_str(&cfg.to_string());
        }));
        prop_assert!(r.is_ok(), "panic on {spec:?} / {opts:?} / {num}");
    }

    /// Output-path checks: never a panic; a path equal to an input is always refused.
    #[test]
    fn output_paths_never_alias_inputs(a in "[a-c./]{1,8}", b in "[a-c./]{1,8}") {
        let base = scratch("paths");
        let _ = std::fs::create_dir_all(base.join("a"));
        let input = base.join("a").join("in");
        std::fs::write(&input, b"x").unwrap();
        let out = base.join(&a).join(&b);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            trmask::io::check_distinct(&[("input", input.as_path())], &[("--output", out.as_path())])
        }));
        prop_assert!(r.is_ok());
        let same = std::fs::canonicalize(&out).ok() == std::fs::canonicalize(&input).ok();
        if same {
            prop_assert!(r.unwrap().is_err(), "{} aliases the input", out.display());
        }
    }
}

proptest! {
    #![proptest_config(config((cases() / 8).max(4)))]

    /// CPU and GPU give the same verdict (both Ok, or both the same kind of error) on every
    /// JSON batch that reads.
    #[test]
    fn cpu_and_gpu_agree_on_verdicts(text in json_batch(), all_valid: bool) {
        let Some(gpu) = common::gpu() else { return Ok(()) };
        let opts = trmask::io::ReadOptions { all_valid };
        let Ok(input) = trmask::io::input_from_json(&text, &opts) else { return Ok(()) };
        let cfg = trmask::CorrectionConfig::default();
        let cpu = trmask::cpu::CpuEngine::new();
        let a = trmask::analysis::analyze(&cpu, &input.batch, &cfg).map(|_| ());
        let b = trmask::analysis::analyze(gpu.as_ref(), &input.batch, &cfg).map(|_| ());
        prop_assert_eq!(a.as_ref().map_err(kind), b.as_ref().map_err(kind), "{}: {:?} vs {:?}", text, a, b);
    }
}

/// Found by the long run (TRMASK_FUZZ_CASES=5000): a `[1, 0]` batch with a null in a `[1, 1]`
/// tensor divided by the row length 0 while naming the position.
#[test]
fn regression_null_in_a_batch_of_empty_rows() {
    let text = r#"{"old_log_probs": [[]], "responses": [[null]]}"#;
    let opts = trmask::io::ReadOptions { all_valid: true };
    let e = trmask::io::input_from_json(text, &opts)
        .err()
        .expect("an error");
    assert!(e.to_string().contains("responses"), "{e}");
}
