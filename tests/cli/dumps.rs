//! The dumps trainers already write, read by `trmask analyze` (and `watch`): prime-rl's token
//! export (schema v1), NeMo-RL's `train_data_step<N>.jsonl` and verl's `file` logger, in files
//! generated here from data/causal-sample in each writer's shape (the writers' code was read,
//! not run: docs/FORMAT.md names the commits). The small samples under data/trainer-dumps/ are
//! built by the same code and checked here (`TRMASK_WRITE_SAMPLE=1` rewrites them).

use crate::common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const SAMPLE_DIR: &str = "data/trainer-dumps";

fn tmp(name: &str) -> PathBuf {
    common::scratch("dumps", name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    common::run_trmask(args)
}

/// Python's `repr` of a float (what `json.dumps` writes): the shortest round-trip digits,
/// an exponent below 1e-4 and from 1e16, integral values with `.0`.
pub fn py(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e16 {
        return format!("{x:.1}");
    }
    let sci = format!("{x:e}");
    let (m, e) = sci.split_once('e').unwrap();
    let e: i32 = e.parse().unwrap();
    if (-4..16).contains(&e) {
        format!("{x}")
    } else {
        format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    }
}

fn py_opt(x: Option<f64>) -> String {
    x.map_or("null".into(), py)
}

/// data/causal-sample's batch and prompts.
pub struct Causal {
    pub rollout_raw: Vec<f64>,
    pub old: Vec<f64>,
    pub stale: Vec<f64>,
    pub adv: Vec<f64>,
    pub ids: Vec<i64>,
    pub len: Vec<usize>,
    pub prompts: Vec<i64>,
    pub uid: Vec<i64>,
}

pub const T: usize = 512;
const PROMPT: usize = 32;

impl Causal {
    pub fn load() -> Causal {
        let b = common::causal_sample("batch.safetensors");
        let b = safetensors::SafeTensors::deserialize(&b).unwrap();
        let e = common::causal_sample("extras.safetensors");
        let e = safetensors::SafeTensors::deserialize(&e).unwrap();
        let uid = b
            .tensor("uid")
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Causal {
            rollout_raw: common::tensor_f32s(&b, "rollout_log_prob_raw"),
            old: common::tensor_f32s(&b, "old_log_prob"),
            stale: common::tensor_f32s(&b, "old_log_prob_stale"),
            adv: common::tensor_f32s(&b, "advantages"),
            ids: common::tensor_i32s(&b, "responses"),
            len: common::tensor_i32s(&e, "response_length")
                .into_iter()
                .map(|l| l as usize)
                .collect(),
            prompts: common::tensor_i32s(&e, "prompts"),
            uid,
        }
    }

    fn trainer(&self, stale: bool) -> &[f64] {
        if stale {
            &self.stale
        } else {
            &self.old
        }
    }

    fn prompt(&self, row: usize) -> &[i64] {
        let g = self.uid[row] as usize;
        &self.prompts[g * PROMPT..(g + 1) * PROMPT]
    }
}

fn list<T>(xs: impl IntoIterator<Item = T>, f: impl Fn(T) -> String, sep: &str) -> String {
    format!("[{}]", xs.into_iter().map(f).collect::<Vec<_>>().join(sep))
}

/// One prime-rl token-export record (schema v1), as `TokenExporter.export` writes it
/// (src/prime_rl/trainer/rl/token_export.py: `json.dumps(record, separators=(",", ":"),
/// allow_nan=False)`): prompt + completion, every column aligned; float32 values; a
/// non-finite value as null. What data/causal-sample does not hold — the trainer's log-probs
/// and entropy over the prompt, entropy anywhere — is written as null (trmask reads neither).
fn prime_record(c: &Causal, row: usize, step: u64, rank: u64, k: usize, stale: bool) -> String {
    let l = c.len[row];
    let base = row * T;
    let trainer = c.trainer(stale);
    let n = PROMPT + l;
    let at = |t: usize| -> Option<usize> { (t >= PROMPT).then(|| base + t - PROMPT) };
    let ids: Vec<i64> = c
        .prompt(row)
        .iter()
        .copied()
        .chain((0..l).map(|t| c.ids[base + t]))
        .collect();
    let inf = |t: usize| at(t).map_or(0.0, |i| c.rollout_raw[i]);
    let tr = |t: usize| at(t).map(|i| trainer[i]);
    let adv = c.adv[base];
    // token_export.py's derived columns, in float32 as torch computes them
    let lr = |t: usize| tr(t).map(|x| x as f32 - inf(t) as f32);
    let ratio = |t: usize| lr(t).map(|x| x.exp());
    let delta = |t: usize| tr(t).map(|x| (x as f32).exp() - (inf(t) as f32).exp());
    let (hi, lo) = (0.2f32, 0.2f32); // DefaultLossConfig.dppo_mask_high / _low
    let masked = |t: usize, which: u8| -> bool {
        let (lm, d) = (t >= PROMPT, delta(t).unwrap_or(0.0));
        let (ih, il) = (d > hi, d < -lo);
        lm && match which {
            0 => {
                if adv > 0.0 {
                    ih
                } else {
                    il
                }
            }
            1 => adv > 0.0 && ih,
            _ => adv < 0.0 && il,
        }
    };
    let f32o = |x: Option<f32>| py_opt(x.map(|v| v as f64));
    let mut s = format!(
        "{{\"schema_version\":1,\"step\":{step},\"rank\":{rank},\"micro_step\":{},\
         \"micro_sequence_idx\":{},\"export_sequence_idx\":{k},\"env_name\":\"causal-sample\",",
        k / 4,
        k % 4
    );
    let _ = write!(
        s,
        "\"token_ids\":{},\"position_ids\":{},\"loss_mask\":{},\"advantages\":{},\
         \"inference_logprobs\":{},\"trainer_logprobs\":{},\"entropy\":{},\"mismatch_kl\":{},\
         \"log_importance_ratio\":{},\"importance_ratio\":{},\"prob_delta\":{},\
         \"is_masked\":{},\"is_masked_high\":{},\"is_masked_low\":{},\"rl_weights\":{},\
         \"ce_weights\":{},\"ref_kl_weights\":{}}}",
        list(&ids, |x| x.to_string(), ","),
        list(0..n, |t| t.to_string(), ","),
        list(0..n, |t| (t >= PROMPT).to_string(), ","),
        list(0..n, |_| py(adv), ","),
        list(0..n, |t| py(inf(t)), ","),
        list(0..n, |t| py_opt(tr(t)), ","),
        list(0..n, |_| "null".to_string(), ","),
        list(
            0..n,
            |t| f32o(ratio(t).zip(lr(t)).map(|(r, l)| r - l - 1.0)),
            ","
        ),
        list(0..n, |t| f32o(lr(t)), ","),
        list(0..n, |t| f32o(ratio(t)), ","),
        list(0..n, |t| f32o(delta(t)), ","),
        list(0..n, |t| masked(t, 0).to_string(), ","),
        list(0..n, |t| masked(t, 1).to_string(), ","),
        list(0..n, |t| masked(t, 2).to_string(), ","),
        list(0..n, |_| "null".to_string(), ","),
        list(0..n, |_| "null".to_string(), ","),
        list(0..n, |_| "null".to_string(), ","),
    );
    s
}

/// `token_exports/step_<step>/rank_<r>.jsonl` for each rank's rows, then `STABLE` (written
/// after every rank flushed, as `mark_stable` does).
pub fn write_prime_step(root: &Path, step: u64, ranks: &[Vec<usize>], stale: bool) -> PathBuf {
    let c = causal();
    let dir = root.join("token_exports").join(format!("step_{step}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (r, rows) in ranks.iter().enumerate() {
        let mut text = String::new();
        for (k, &row) in rows.iter().enumerate() {
            text += &prime_record(c, row, step, r as u64, k, stale);
            text.push('\n');
        }
        std::fs::write(dir.join(format!("rank_{r}.jsonl")), text).unwrap();
    }
    std::fs::write(dir.join("STABLE"), b"").unwrap();
    dir
}

/// A NeMo-RL `train_data_step<N>.jsonl`, as `Logger.log_batched_dict_as_jsonl` writes the
/// GRPO log_data (nemo_rl/utils/logger.py, nemo_rl/algorithms/grpo.py): one line per sample,
/// each value a batch of one, `json.dumps` with its default separators, `idx` last; rows
/// padded to the longest sequence rounded up to a multiple of 8 (ids with 0, the rest with
/// 0). `content` holds placeholders (data/causal-sample ships ids, not text); the
/// trainer's log-probs over the prompt, which it does not hold either, are 0.
pub fn write_nemo(path: &Path, rows: &[usize], stale: bool) {
    let c = causal();
    let trainer = c.trainer(stale);
    let width = rows
        .iter()
        .map(|&r| PROMPT + c.len[r])
        .max()
        .unwrap()
        .div_ceil(8)
        * 8;
    let mut text = String::new();
    for (i, &row) in rows.iter().enumerate() {
        let (l, base) = (c.len[row], row * T);
        let n = PROMPT + l;
        let resp = |t: usize| (PROMPT..n).contains(&t).then(|| base + t - PROMPT);
        let ids: Vec<i64> = (0..width)
            .map(|t| {
                if t < PROMPT {
                    c.prompt(row)[t]
                } else {
                    resp(t).map_or(0, |i| c.ids[i])
                }
            })
            .collect();
        let reward = 0.0; // not in the batch file; trmask does not read it
        let _ = writeln!(
            text,
            "{{\"content\": [[\"<prompt: {PROMPT} tokens>\", \"<response: {l} tokens>\"]], \
             \"rewards\": [{}], \"input_lengths\": [{n}], \"token_ids\": [{}], \
             \"token_loss_mask\": [{}], \"sample_loss_mask\": [1.0], \"advantages\": [{}], \
             \"generation_logprobs\": [{}], \"prev_logprobs\": [{}], \"idx\": {i}}}",
            py(reward),
            list(&ids, |x| x.to_string(), ", "),
            list(0..width, |t| (resp(t).is_some() as u8).to_string(), ", "),
            list(
                0..width,
                |t| py(if t < n { c.adv[base] } else { 0.0 }),
                ", "
            ),
            list(
                0..width,
                |t| py(resp(t).map_or(0.0, |i| c.rollout_raw[i])),
                ", "
            ),
            list(0..width, |t| py(resp(t).map_or(0.0, |i| trainer[i])), ", "),
        );
    }
    std::fs::write(path, text).unwrap();
}

/// The same rows as a trmask safetensors batch, in the layout the readers give (each row
/// from its first to its last valid token, padded to the longest): `rollout_log_prob`,
/// the trainer's log-probs under `trainer_name`, `response_mask`, `advantages`, `responses`.
pub fn write_twin(path: &Path, rows: &[usize], stale: bool, trainer_name: &str) {
    let c = causal();
    let trainer = c.trainer(stale);
    let b = rows.len();
    let t = rows.iter().map(|&r| c.len[r]).max().unwrap();
    let mut f = vec![vec![0f32; b * t]; 4];
    let mut ids = vec![0i32; b * t];
    for (i, &row) in rows.iter().enumerate() {
        for j in 0..c.len[row] {
            let (s, d) = (row * T + j, i * t + j);
            f[0][d] = c.rollout_raw[s] as f32;
            f[1][d] = trainer[s] as f32;
            f[2][d] = 1.0;
            f[3][d] = c.adv[s] as f32;
            ids[d] = c.ids[s] as i32;
        }
    }
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let id_bytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    let data: Vec<(&str, Vec<u8>, safetensors::Dtype)> = vec![
        ("rollout_log_prob", bytes(&f[0]), safetensors::Dtype::F32),
        (trainer_name, bytes(&f[1]), safetensors::Dtype::F32),
        ("response_mask", bytes(&f[2]), safetensors::Dtype::F32),
        ("advantages", bytes(&f[3]), safetensors::Dtype::F32),
        ("responses", id_bytes, safetensors::Dtype::I32),
    ];
    let views: Vec<(&str, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, d, dt)| {
            (
                *n,
                safetensors::tensor::TensorView::new(*dt, vec![b, t], d).unwrap(),
            )
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn causal() -> &'static Causal {
    static C: std::sync::OnceLock<Causal> = std::sync::OnceLock::new();
    C.get_or_init(Causal::load)
}

/// The short rows of data/causal-sample (length ≤ 133): prompt group 0, and four others.
const POOL: [usize; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 20, 22, 23, 33];
/// The stale step of the committed six-step export.
pub const STALE_STEP: u64 = 5;

/// Rank 0's and rank 1's rows of step `s` (1-based) of the committed export: eight rows of
/// the pool, rotated by two each step.
pub fn sample_rows(s: u64) -> Vec<Vec<usize>> {
    let rows: Vec<usize> = (0..8)
        .map(|j| POOL[(2 * s as usize + j) % POOL.len()])
        .collect();
    vec![rows[..4].to_vec(), rows[4..].to_vec()]
}

/// Writes the committed samples under `root` (data/trainer-dumps/ or a scratch copy).
pub fn write_samples(root: &Path) {
    let prime = root.join("prime-rl");
    for s in 1..=6u64 {
        write_prime_step(&prime, s, &sample_rows(s), s == STALE_STEP);
    }
    let rows: Vec<usize> = sample_rows(1).concat();
    write_twin(
        &root.join("prime-rl-step_1.safetensors"),
        &rows,
        false,
        "log_prob",
    );
    let nemo = root.join("nemo-rl");
    std::fs::create_dir_all(&nemo).unwrap();
    for s in 1..=3u64 {
        write_nemo(
            &nemo.join(format!("train_data_step{s}.jsonl")),
            &sample_rows(s).concat(),
            false,
        );
    }
    write_twin(
        &root.join("nemo-rl-step1.safetensors"),
        &rows,
        false,
        "old_log_prob",
    );
}

/// Every file under `dir`, relative, with its bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn committed_samples_are_what_the_generator_writes() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join(SAMPLE_DIR);
    if std::env::var("TRMASK_WRITE_SAMPLE").is_ok_and(|v| v == "1") {
        write_samples(&repo);
    }
    let fresh = tmp("fresh");
    let _ = std::fs::remove_dir_all(&fresh);
    write_samples(&fresh);
    let (a, b) = (tree(&fresh), tree(&repo));
    for (k, v) in &a {
        assert!(
            b.get(k) == Some(v),
            "{SAMPLE_DIR}/{k} is stale: rerun with TRMASK_WRITE_SAMPLE=1"
        );
    }
}

/// `analyze INPUT --metrics M.json` with the stderr: (metrics, stderr).
fn metrics(input: &str, tag: &str, preset: &str) -> (serde_json::Value, String) {
    let m = tmp(&format!("{tag}.json"));
    let (code, _, err) = run(&[
        "analyze",
        input,
        "--backend",
        "cpu",
        "--preset",
        preset,
        "--metrics",
        m.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{input}: {err}");
    (common::load_json(&m), err)
}

/// Two `--metrics` files of one batch agree: the same keys and values, numbers to 1e-12
/// relative, absolute below 1 (a safetensors step on the CPU runs the fused pass, a dump the
/// full path: their sums agree to rounding, and `chi2_token = E[ρ²] − 1` cancels).
fn same_metrics(a: &serde_json::Value, b: &serde_json::Value, what: &str) {
    let (a, b) = (a.as_object().unwrap(), b.as_object().unwrap());
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{what}: keys"
    );
    for (k, x) in a {
        match (x, &b[k]) {
            (serde_json::Value::Number(_), y @ serde_json::Value::Number(_)) => {
                let (x, y) = (common::json_num(x), common::json_num(y));
                let tol = 1e-12 * x.abs().max(y.abs()).max(1.0);
                assert!(
                    common::same(x, y) || (x - y).abs() <= tol,
                    "{what}: {k}: {x} vs {y}"
                );
            }
            (x, y) => assert_eq!(x, y, "{what}: {k}"),
        }
    }
}

#[test]
fn a_prime_rl_step_of_two_ranks_equals_the_same_batch_as_safetensors() {
    let root = tmp("prime-full");
    let _ = std::fs::remove_dir_all(&root);
    // the whole batch: rows 0–31 on rank 0, 32–63 on rank 1
    let ranks = vec![(0..32).collect::<Vec<_>>(), (32..64).collect()];
    let dir = write_prime_step(&root, 3, &ranks, false);
    let twin = root.join("twin.safetensors");
    write_twin(&twin, &(0..64).collect::<Vec<_>>(), false, "log_prob");
    for preset in ["decoupled_k3_rs_token_tis", "decoupled_geo_rs_seq_tis"] {
        let (a, err) = metrics(dir.to_str().unwrap(), "prime-dir", preset);
        assert!(
            err.contains(
                "input: prime-rl token export (schema v1), 2 rank files merged \
                          (rank_0.jsonl, rank_1.jsonl), 64 sequences, step 3"
            ),
            "{err}"
        );
        assert!(
            err.contains("inference_logprobs → rollout_log_prob"),
            "{err}"
        );
        assert!(err.contains("trainer_logprobs → log_prob"), "{err}");
        let (b, _) = metrics(twin.to_str().unwrap(), "prime-twin", preset);
        same_metrics(&a, &b, preset);
    }
    // one rank file alone is one step of its rows
    let (one, err) = metrics(
        dir.join("rank_1.jsonl").to_str().unwrap(),
        "prime-one",
        "decoupled_k3_rs_token_tis",
    );
    assert!(err.contains("32 sequences, step 3"), "{err}");
    let twin1 = root.join("twin1.safetensors");
    write_twin(&twin1, &(32..64).collect::<Vec<_>>(), false, "log_prob");
    let (b, _) = metrics(
        twin1.to_str().unwrap(),
        "prime-twin1",
        "decoupled_k3_rs_token_tis",
    );
    same_metrics(&one, &b, "one rank");
}

#[test]
fn a_nemo_rl_step_equals_the_same_batch_as_safetensors() {
    let root = tmp("nemo-full");
    let _ = std::fs::create_dir_all(&root);
    let rows: Vec<usize> = (0..64).collect();
    let file = root.join("train_data_step7.jsonl");
    write_nemo(&file, &rows, false);
    let twin = root.join("twin.safetensors");
    write_twin(&twin, &rows, false, "old_log_prob");
    let (a, err) = metrics(file.to_str().unwrap(), "nemo", "decoupled_k3_rs_token_tis");
    assert!(
        err.contains("input: NeMo-RL train_data_step*.jsonl, 64 sequences, step 7"),
        "{err}"
    );
    assert!(err.contains("prev_logprobs → old_log_prob"), "{err}");
    let (b, _) = metrics(
        twin.to_str().unwrap(),
        "nemo-twin",
        "decoupled_k3_rs_token_tis",
    );
    same_metrics(&a, &b, "nemo");
}

#[test]
fn damaged_and_partial_lines_are_one_line_errors_naming_file_and_line() {
    let root = tmp("damaged");
    let _ = std::fs::remove_dir_all(&root);
    let dir = write_prime_step(&root, 2, &sample_rows(2), false);
    let rank = dir.join("rank_1.jsonl");
    let text = std::fs::read_to_string(&rank).unwrap();
    // the writer killed mid-line: the last line cut in half
    let cut = text.len() - text.lines().last().unwrap().len() / 2;
    std::fs::write(&rank, &text[..cut]).unwrap();
    let (code, _, err) = run(&["analyze", dir.to_str().unwrap(), "--backend", "cpu"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("rank_1.jsonl: line 4: a partial line"),
        "{err}"
    );
    // a damaged line in the middle
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[1] = lines[1].replacen("\"trainer_logprobs\":[", "\"trainer_logprobs\":[\"x\",", 1);
    std::fs::write(&rank, lines.join("\n") + "\n").unwrap();
    let (code, _, err) = run(&["analyze", dir.to_str().unwrap(), "--backend", "cpu"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("rank_1.jsonl: line 2: not a prime-rl token-export record"),
        "{err}"
    );
    // misaligned arrays, a null at a valid token, another schema
    lines[1] = text
        .lines()
        .nth(1)
        .unwrap()
        .replacen("\"loss_mask\":[false,", "\"loss_mask\":[", 1);
    std::fs::write(&rank, lines.join("\n") + "\n").unwrap();
    let (_, _, err) = run(&["analyze", dir.to_str().unwrap(), "--backend", "cpu"]);
    assert!(err.contains("line 2: `inference_logprobs` holds"), "{err}");
    let mut tl = text.lines().nth(1).unwrap().to_string();
    let at = tl.find("\"trainer_logprobs\":[").unwrap() + 20;
    // token 32 is the first completion token: null there is refused
    let commas: Vec<usize> = tl[at..]
        .match_indices(',')
        .map(|(i, _)| at + i)
        .take(33)
        .collect();
    tl.replace_range(commas[31] + 1..commas[32], "null");
    lines[1] = tl;
    std::fs::write(&rank, lines.join("\n") + "\n").unwrap();
    let (_, _, err) = run(&["analyze", dir.to_str().unwrap(), "--backend", "cpu"]);
    assert!(
        err.contains("line 2: `trainer_logprobs` is null at token 32, a valid (loss-mask) token"),
        "{err}"
    );
    lines[1] =
        text.lines()
            .nth(1)
            .unwrap()
            .replacen("\"schema_version\":1", "\"schema_version\":2", 1);
    std::fs::write(&rank, lines.join("\n") + "\n").unwrap();
    let (_, _, err) = run(&["analyze", dir.to_str().unwrap(), "--backend", "cpu"]);
    assert!(err.contains("schema_version 2"), "{err}");
    // NeMo-RL: a partial last line
    let nemo = root.join("train_data_step1.jsonl");
    write_nemo(&nemo, &[0, 1, 2], false);
    let t = std::fs::read_to_string(&nemo).unwrap();
    std::fs::write(&nemo, &t[..t.len() - 100]).unwrap();
    let (code, _, err) = run(&["analyze", nemo.to_str().unwrap(), "--backend", "cpu"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("train_data_step1.jsonl: line 3: a partial line"),
        "{err}"
    );
    // a run directory is not one step
    let (code, _, err) = run(&["analyze", root.to_str().unwrap(), "--backend", "cpu"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is a directory of prime-rl steps"), "{err}");
}

#[test]
fn the_other_commands_read_the_dumps_too() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join(SAMPLE_DIR);
    let s1 = repo.join("prime-rl/token_exports/step_1");
    let s5 = repo.join("prime-rl/token_exports/step_5");
    let nemo = repo.join("nemo-rl/train_data_step1.jsonl");
    let (s1, s5, nemo) = (
        s1.to_str().unwrap(),
        s5.to_str().unwrap(),
        nemo.to_str().unwrap(),
    );
    let page = tmp("report.html");
    let (code, _, err) = run(&[
        "report",
        s1,
        "--backend",
        "cpu",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("input: prime-rl token export"), "{err}");
    let (code, out, err) = run(&["compare", s1, s5, "--backend", "cpu"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("verdict: "), "{out}");
    let (code, out, err) = run(&[
        "check",
        nemo,
        s5,
        "--backend",
        "cpu",
        "--max-mean-k3",
        "1e-3",
    ]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.contains("violation: ") && out.contains("step_5"),
        "{out}"
    );
    let (code, _, err) = run(&[
        "calibrate",
        s1,
        nemo,
        "--backend",
        "cpu",
        "--criterion",
        "seq_mean_k3",
        "--target-reject-rate",
        "0.25",
    ]);
    assert_eq!(code, 0, "{err}");
}

/// Lines of verl's `file` logger (verl/utils/tracking.py, `FileLogger.log`: `orjson.dumps(
/// {"step": step, "data": data})` and a newline; NaN and ±inf as null): each step's
/// `rollout_corr/*` metrics as trmask computes them for verl, plus verl's own step counters.
pub fn verl_lines(metrics: &[(u64, serde_json::Value)]) -> String {
    let mut out = String::new();
    for (step, m) in metrics {
        let mut data = serde_json::Map::new();
        data.insert("training/global_step".into(), (*step).into());
        data.insert("training/epoch".into(), 0.into());
        for (k, v) in m.as_object().unwrap() {
            if k.starts_with("rollout_corr/") {
                data.insert(
                    k.clone(),
                    if v.is_number() {
                        v.clone()
                    } else {
                        serde_json::Value::Null
                    },
                );
            }
        }
        let line = serde_json::json!({"step": step, "data": data});
        out += &serde_json::to_string(&line).unwrap();
        out.push('\n');
    }
    out
}

#[test]
fn verl_file_logger_lines_draw_a_trend() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join(SAMPLE_DIR);
    let mut ms = Vec::new();
    for s in 1..=6u64 {
        let dir = repo.join(format!("prime-rl/token_exports/step_{s}"));
        let (m, _) = metrics(
            dir.to_str().unwrap(),
            &format!("verl{s}"),
            "decoupled_k3_rs_token_tis",
        );
        ms.push((s, m));
    }
    let log = tmp("verl.jsonl");
    std::fs::write(&log, verl_lines(&ms)).unwrap();
    let page = tmp("verl.html");
    let (code, out, err) = run(&[
        "report",
        "--jsonl",
        log.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(6 steps)"), "{out}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("6 steps (1 to 6)"));
    assert!(html.contains("IS weight max") && html.contains("<h2>Jumps</h2>"));
}
