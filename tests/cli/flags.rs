//! Flags parsed once where they enter: `--backend` and `--distributed` by clap (the choices in
//! `--help`, a bad value one line naming the flag, exit 2, before any input is read), and the
//! sampling temperature by its one rule, with the same message from the CLI, the config and
//! the Rust API (python/tests/test_api.py pins the same text for Python).

use crate::common;

fn run(args: &[&str]) -> (i32, String, String) {
    common::run_trmask(args)
}

/// Exit 2 with one line holding every needle.
fn assert_usage_error((code, _, err): (i32, String, String), needles: &[&str]) {
    assert_eq!(code, 2, "expected exit 2, stderr: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn backend_and_distributed_are_parsed_by_clap() {
    let (code, out, err) = run(&["analyze", "-h"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("[possible values: auto, gpu, cpu, cpu-fast]"),
        "{out}"
    );
    assert!(out.contains("[possible values: mpi]"), "{out}");
    let (code, out, err) = run(&["calibrate", "-h"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("[possible values: auto, gpu, cpu, cpu-fast]"),
        "{out}"
    );
    // the inputs do not exist: the flag is refused before anything is read
    let missing = "does/not/exist.json";
    for args in [
        &["analyze", missing, "--backend", "tpu"][..],
        &["analyze", missing, "--backend", "CPU"],
        &["report", missing, "-o", "x.html", "--backend", "cuda"],
        &["compare", missing, missing, "--backend", ""],
        &[
            "calibrate",
            missing,
            "--criterion",
            "seq_mean_k3",
            "--target-reject-rate",
            "0.1",
            "--backend",
            "metal",
        ],
    ] {
        assert_usage_error(run(args), &["--backend", "auto, gpu, cpu, cpu-fast"]);
    }
    for bad in ["nccl", "MPI", ""] {
        assert_usage_error(
            run(&["analyze", missing, "--distributed", bad]),
            &["--distributed", "mpi"],
        );
    }
}

/// The library's own parse of a backend name: the key `backend` and the choices.
#[test]
fn a_backend_name_parses_once_into_the_enum() {
    use trmask::backend::Backend;
    for b in [Backend::Auto, Backend::Gpu, Backend::Cpu, Backend::CpuFast] {
        assert_eq!(b.name().parse::<Backend>().unwrap(), b);
    }
    let e = "tpu".parse::<Backend>().unwrap_err().to_string();
    assert_eq!(
        e,
        "invalid config `backend`: \"tpu\" is not one of auto, gpu, cpu, cpu-fast"
    );
}

/// Temperature 0, negative and NaN: one message, naming `--temperature` on the command line
/// and `temperature` in a config or an engine call, whichever entry point gets it.
#[test]
fn a_bad_temperature_is_one_error_everywhere() {
    use trmask::{cpu::CpuEngine, CorrectionConfig, Engine, Logits};
    let input = "data/verl-golden/inputs/mild.json";
    let logits = Logits::from_f32(&[0.5, 1.0, -1.0, 0.0, 2.0, 1.0], 2, 3).unwrap();
    for (arg, t, shown) in [
        ("0", 0.0, "0"),
        ("-1", -1.0, "-1"),
        ("nan", f64::NAN, "NaN"),
    ] {
        let rule = format!("{shown} is out of range (a finite temperature >= 0.00001)");
        // the CLI flag
        let (code, _, err) = run(&["analyze", input, "--backend", "cpu", "--temperature", arg]);
        assert_eq!(code, 2, "{err}");
        let api = CorrectionConfig::default()
            .set_temperature("--temperature", t)
            .unwrap_err();
        assert_eq!(err.trim(), format!("trmask: {api}"));
        assert_eq!(
            api.to_string(),
            format!("invalid config `--temperature`: {rule}")
        );
        // the config's key, in a file and through the Rust API
        let cfg = common::scratch("flags", &format!("temperature-{arg}.json"));
        std::fs::write(&cfg, format!("{{\"temperature\": {shown}}}")).unwrap();
        let (code, _, err) = run(&[
            "analyze",
            input,
            "--backend",
            "cpu",
            "--config",
            cfg.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{err}");
        let expected = format!("invalid config `temperature`: {rule}");
        assert_eq!(err.trim(), format!("trmask: {expected}"));
        let from_text = CorrectionConfig::from_json_str(&format!("{{\"temperature\": {shown}}}"));
        assert_eq!(from_text.unwrap_err().to_string(), expected);
        let literal = CorrectionConfig {
            temperature: t,
            ..Default::default()
        };
        assert_eq!(literal.resolve().unwrap_err().to_string(), expected);
        // an engine call
        let e = CpuEngine::new()
            .vocab_divergence(&logits, &logits, None, &[true, true], t)
            .unwrap_err();
        assert_eq!(e.to_string(), expected);
    }
}
