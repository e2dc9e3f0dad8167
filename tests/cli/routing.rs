//! MoE routing on the command line (issue 42): `analyze` prints the routing line and writes
//! the routing outputs, `compare` gives the flip fraction's delta with its p-value (the sample
//! against a copy whose trainer routing replays the rollout's, R3 emulated), and bad routing
//! tensors exit 2 with one line naming the tensor.

use crate::common::{run_trmask, scratch};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::BTreeMap;

const SAMPLE: &str = "data/moe-sample/batch.safetensors";

/// The sample's tensors as (dtype, shape, bytes), by name.
fn tensors() -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(SAMPLE).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

fn write(t: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>, name: &str) -> String {
    let views: Vec<(String, TensorView)> = t
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let p = scratch("routing-cli", name);
    std::fs::write(&p, safetensors::serialize(views, None).unwrap()).unwrap();
    p.display().to_string()
}

#[test]
fn analyze_prints_the_routing_line() {
    let (code, out, err) = run_trmask(&["analyze", SAMPLE, "--backend", "cpu"]);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.starts_with("routing:")).unwrap();
    assert_eq!(
        line,
        "routing: overlap 0.9982, 1.34% of recorded tokens flipped, carrying 69.06% of k3, \
         worst layer 3 (overlap 0.9976), 1.45% of (token, layer) pairs unrecorded"
    );
}

#[test]
fn compare_with_replay_gives_the_flip_delta_and_its_p_value() {
    let mut t = tensors();
    let roll = t["rollout_routed_experts"].clone();
    t.insert("old_routed_experts".into(), roll);
    let replay = write(&t, "replay.safetensors");
    let (code, out, err) = run_trmask(&["compare", SAMPLE, &replay, "--backend", "cpu"]);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.starts_with("routing:")).unwrap();
    assert!(
        line.starts_with("routing: flipped tokens A 1.340 %, B 0.000 % (-1.340 points, p = "),
        "{line}"
    );
    let p: f64 = line
        .split("p = ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(p < 1e-6, "{line}");
    let verdict = out.lines().find(|l| l.starts_with("verdict:")).unwrap();
    assert!(
        verdict.contains("the routing differs: it flips on 0.00 % of B's"),
        "{verdict}"
    );
    // a batch against itself: no delta, p = 1
    let (_, out, _) = run_trmask(&["compare", SAMPLE, SAMPLE, "--backend", "cpu", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["routing"]["delta"], 0.0);
    assert_eq!(v["routing"]["p_value"], 1.0);
}

fn bad(t: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>, name: &str, want: &[&str]) {
    let p = write(t, name);
    let (code, out, err) = run_trmask(&["analyze", &p, "--backend", "cpu"]);
    assert_eq!(code, 2, "{name}: {out}{err}");
    assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
    for w in want {
        assert!(err.contains(w), "{name}: {err}");
    }
}

#[test]
fn bad_routing_tensors_exit_2_naming_the_tensor() {
    let base = tensors();
    // the trainer's side with one layer fewer
    let mut t = base.clone();
    let (d, s, b) = t["old_routed_experts"].clone();
    let keep = s[3] * 4;
    let fewer: Vec<u8> = b
        .chunks(s[2] * s[3] * 4)
        .flat_map(|row| row[keep..].to_vec())
        .collect();
    t.insert(
        "old_routed_experts".into(),
        (d, vec![s[0], s[1], s[2] - 1, s[3]], fewer),
    );
    bad(
        &t,
        "layers.safetensors",
        &["old_routed_experts", "disagrees"],
    );
    // one side alone
    let mut t = base.clone();
    t.remove("old_routed_experts");
    bad(
        &t,
        "one_side.safetensors",
        &["old_routed_experts", "missing"],
    );
    // a duplicate id at a valid slot: [0, 0], layer 0
    let mut t = base.clone();
    let e = t.get_mut("rollout_routed_experts").unwrap();
    let first: [u8; 4] = e.2[0..4].try_into().unwrap();
    e.2[4..8].copy_from_slice(&first);
    bad(
        &t,
        "dup.safetensors",
        &["rollout_routed_experts", "twice", "[0, 0], layer 0"],
    );
    // an id below -1 at a valid slot
    let mut t = base.clone();
    t.get_mut("old_routed_experts").unwrap().2[8..12].copy_from_slice(&(-2i32).to_le_bytes());
    bad(&t, "neg.safetensors", &["old_routed_experts", "below -1"]);
    // a token shape that is not the batch's
    let mut t = base;
    let (d, s, b) = t["rollout_routed_experts"].clone();
    let row = s[1] * s[2] * s[3] * 4;
    t.insert(
        "rollout_routed_experts".into(),
        (d, vec![s[0] - 1, s[1], s[2], s[3]], b[row..].to_vec()),
    );
    bad(&t, "rows.safetensors", &["rollout_routed_experts", "shape"]);
}
