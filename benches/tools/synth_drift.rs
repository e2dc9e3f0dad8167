//! Writes a synthetic padded batch whose mismatch drifts upward towards the end of long
//! responses (the pattern TRM's sequence masks are for): `rollout_logits`, `old_logits`
//! (bf16), `responses`, `rollout_log_prob`, `old_log_prob`, `response_mask`, `[B, T, V]`.
//!
//! `cargo run --release --example synth_drift -- OUT.safetensors [B=64] [T=2048] [V=64] [SEED=1]`
//!
//! Every sequence has a length in [T/8, T]; the trainer's logits differ from the rollout's by
//! Gaussian noise of scale `0.03 + 0.6·(t/T)^3` in every fourth sequence (a drifting tail) and
//! `0.03` elsewhere.

use safetensors::tensor::TensorView;
use safetensors::Dtype;

struct Rng(u64);
impl Rng {
    fn u(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (a, b) = (self.u().max(1e-300), self.u());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }
}

fn log_softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = x.iter().map(|v| (v - m).exp()).sum();
    x.iter().map(|v| v - m - s.ln()).collect()
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        !args.is_empty(),
        "usage: synth_drift OUT.safetensors [B] [T] [V] [SEED]"
    );
    let arg = |i: usize, d: usize| -> anyhow::Result<usize> {
        Ok(args.get(i).map(|s| s.parse()).transpose()?.unwrap_or(d))
    };
    let (b, t, v) = (arg(1, 64)?, arg(2, 2048)?, arg(3, 64)?);
    let mut rng = Rng((arg(4, 1)? as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (mut ra, mut oa) = (Vec::with_capacity(b * t * v), Vec::with_capacity(b * t * v));
    let (mut ids, mut rlp, mut olp, mut mask) = (vec![], vec![], vec![], vec![]);
    for s in 0..b {
        let len = t / 8 + (rng.u() * (t - t / 8) as f64) as usize;
        for pos in 0..t {
            let drift = if s % 4 == 0 {
                0.6 * (pos as f64 / t as f64).powi(3)
            } else {
                0.0
            };
            let a: Vec<f64> = (0..v).map(|_| 2.0 * rng.normal()).collect();
            let o: Vec<f64> = a
                .iter()
                .map(|x| x + (0.03 + drift) * rng.normal())
                .collect();
            // bf16 logits, log-probs from the rounded values
            let a: Vec<f64> = a
                .iter()
                .map(|x| half::bf16::from_f64(*x).to_f64())
                .collect();
            let o: Vec<f64> = o
                .iter()
                .map(|x| half::bf16::from_f64(*x).to_f64())
                .collect();
            let (la, lo) = (log_softmax(&a), log_softmax(&o));
            let mut u = rng.u();
            let mut y = v - 1;
            for (i, l) in la.iter().enumerate() {
                u -= l.exp();
                if u <= 0.0 {
                    y = i;
                    break;
                }
            }
            ra.extend(a.iter().map(|x| half::bf16::from_f64(*x)));
            oa.extend(o.iter().map(|x| half::bf16::from_f64(*x)));
            ids.push(y as i64);
            rlp.push(la[y] as f32);
            olp.push(lo[y] as f32);
            mask.push((pos < len) as u8 as f32);
        }
    }
    let bytes = |x: &[u8]| x.to_vec();
    let f32b = |x: &[f32]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let bf = |x: &[half::bf16]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let data = [
        ("rollout_logits", Dtype::BF16, vec![b, t, v], bf(&ra)),
        ("old_logits", Dtype::BF16, vec![b, t, v], bf(&oa)),
        (
            "responses",
            Dtype::I64,
            vec![b, t],
            bytes(
                &ids.iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        ),
        ("rollout_log_prob", Dtype::F32, vec![b, t], f32b(&rlp)),
        ("old_log_prob", Dtype::F32, vec![b, t], f32b(&olp)),
        ("response_mask", Dtype::F32, vec![b, t], f32b(&mask)),
    ];
    let views: Vec<(&str, TensorView)> = data
        .iter()
        .map(|(n, d, s, x)| Ok((*n, TensorView::new(*d, s.clone(), x)?)))
        .collect::<anyhow::Result<_>>()?;
    safetensors::serialize_to_file(views, None, std::path::Path::new(&args[0]))?;
    Ok(())
}
