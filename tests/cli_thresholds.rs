//! The threshold commands through the binary: `bounds --target-error`, `check`, `calibrate`,
//! `compare`, `report --jsonl`, and the sweep in `analyze --metrics`.

use std::path::PathBuf;

mod common;

fn tmp(name: &str) -> PathBuf {
    common::scratch("cli_thresholds", name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    common::run_trmask(args)
}

#[test]
fn bounds_target_error_round_trips() {
    let (code, out, err) = run(&[
        "bounds",
        "--horizon",
        "4096",
        "--target-error",
        "4.096",
        "--eps",
        "5e-3",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let delta = v["delta"].as_f64().unwrap();
    assert_eq!(v["eps_from"], "given");
    let b = trmask::bounds::compute(&trmask::bounds::BoundInputs {
        eps: Some(5e-3),
        ..trmask::bounds::BoundInputs::new(4096, delta)
    })
    .unwrap();
    assert!((b.unified - 4.096).abs() <= 1e-9 * 4.096, "{}", b.unified);
    assert_eq!(v["bounds"]["argmin"], b.argmin);
    // the table names the answer and the bound attaining it
    let (code, out, _) = run(&["bounds", "--horizon", "4096", "--target-error", "1"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("largest delta with B* <= 1: delta = "),
        "{out}"
    );
    assert!(
        out.contains("(pinsker)") && out.contains("attained by"),
        "{out}"
    );
    // neither --delta nor --target-error; both; a target no δ reaches
    for args in [
        vec!["bounds", "--horizon", "10"],
        vec![
            "bounds",
            "--horizon",
            "10",
            "--delta",
            "1e-3",
            "--target-error",
            "1",
        ],
        vec!["bounds", "--horizon", "1", "--target-error", "1"],
        vec!["bounds", "--horizon", "10", "--target-error", "0"],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
