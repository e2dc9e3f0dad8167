//! A tiny policy in burn (burn-wgpu) trained with trmask's Trust Region Masking, both on one
//! `wgpu::Device`.
//!
//! Each step the policy's logits `[B·T, V]` stay on the device: trmask binds burn's own buffers
//! (no host copy) and computes the exact per-token KL(π_roll‖π_old) from them; its response mask
//! and token IS weights then weight burn's policy-gradient loss, and burn takes an SGD step.
//! Every step is checked: trmask's f64 CPU reference, run on host copies made for that check
//! only, must take the same decisions and find the same per-sequence KL (within the GPU engine's
//! f32 tolerance), and the update must lower the masked, weighted loss.
//!
//! `cargo run -p burn-policy --release`
//! (without a GPU: `VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json`)

use std::sync::Arc;

use anyhow::{anyhow, ensure, Context as _};
use burn::backend::wgpu::{wgpu, CubeBackend, CubeTensor, WgpuSetup};
use burn::cubecl::wgpu::{AutoCompiler, WgpuServer};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Tensor, TensorData};
use trmask::cpu::CpuEngine;
use trmask::gpu::{Context, GpuEngine};
use trmask::{CorrectionConfig, Corrector, DType, Engine, Logits, Step};

/// Sequences per step, tokens per sequence, vocabulary, hidden width.
const B: usize = 8;
const T: usize = 16;
const V: usize = 256;
const H: usize = 32;
const STEPS: usize = 5;

/// A small deterministic generator (the run prints the same numbers every time).
struct Lcg(u64);
impl Lcg {
    fn uniform(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform().max(1e-7), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
    fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| scale * self.normal()).collect()
    }
    /// Standard Gumbel noise: `argmax(logits + g)` is a sample from `softmax(logits)`.
    fn gumbels(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| -(-self.uniform().clamp(1e-7, 1.0 - 1e-7).ln()).ln())
            .collect()
    }
}

/// The wgpu buffer behind a burn float tensor, kept alive (and in place) while `_held` lives.
/// burn's pending work is submitted first (`client.flush()`) on the shared queue, so trmask's
/// passes, submitted after it on the same queue, read the finished values.
struct DeviceLogits {
    logits: Logits,
    _held: Box<dyn std::any::Any>,
}

fn device_logits(t: &Tensor<2>) -> anyhow::Result<DeviceLogits> {
    let [rows, vocab] = t.dims();
    let cube: CubeTensor = t
        .clone()
        .inner()
        .try_into_primitive::<CubeBackend>()
        .map_err(|e| anyhow!("not a cubecl tensor: {e:?}"))?;
    ensure!(
        **cube.meta.strides() == [vocab, 1],
        "logits are not contiguous"
    );
    cube.client
        .flush()
        .map_err(|e| anyhow!("submitting burn's work: {e:?}"))?;
    let held = cube
        .client
        .get_resource::<WgpuServer<AutoCompiler>>(cube.handle.clone())
        .map_err(|e| anyhow!("burn's buffer: {e}"))?;
    let res = held.resource();
    let logits = Logits::device(res.buffer.clone(), res.offset, DType::F32, rows, vocab)?;
    Ok(DeviceLogits {
        logits,
        _held: Box::new(held),
    })
}

/// A (small) tensor's values on the host.
fn to_host<const D: usize>(t: Tensor<D>) -> anyhow::Result<Vec<f32>> {
    t.to_data()
        .try_to_vec::<f32>()
        .map_err(|e| anyhow!("{e:?}"))
}

fn main() -> anyhow::Result<()> {
    // One wgpu device, made here and handed to both libraries.
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("burn + trmask"),
        required_features: adapter.features(),
        required_limits: adapter.limits(),
        ..Default::default()
    }))?;
    let backend = adapter.get_info().backend;
    let trm = Context::from_wgpu(device.clone(), queue.clone());
    let dev = Device::wgpu_options()
        .setup(WgpuSetup {
            instance,
            adapter,
            device,
            queue,
            backend,
        })
        .init()
        .context("registering the shared device with burn")?
        .autodiff();

    // TRM-max on the exact KL (needs the logits) with token-level truncated IS.
    let config = CorrectionConfig::from_json_str(
        r#"{"rollout_rs": "seq_max_kl", "rollout_rs_threshold": 0.02,
            "rollout_is": "token", "rollout_is_threshold": 2.0}"#,
    )?;
    let gpu = GpuEngine::from_context(Arc::new(trm));
    println!("device: {}", gpu.name());
    let corrector = Corrector::new(Arc::new(gpu) as Arc<dyn Engine>, &config)?;
    let reference = Corrector::new(Arc::new(CpuEngine::new()) as Arc<dyn Engine>, &config)?;

    let mut rng = Lcg(7);
    let mut w: Tensor<2> =
        Tensor::from_data(TensorData::new(rng.normals(H * V, 0.3), [H, V]), &dev).require_grad();
    // The same B·T contexts every step (the hidden states of a fixed prompt batch).
    let x: Tensor<2> = Tensor::from_data(
        TensorData::new(rng.normals(B * T * H, 1.0), [B * T, H]),
        &dev,
    );
    // A: +1 on the first half of every response, −1 on the second.
    let advantages: Vec<f32> = (0..B * T)
        .map(|i| if i % T < T / 2 { 1.0 } else { -1.0 })
        .collect();
    let mask = [true; B * T];
    let lr = 0.5;

    for step in 0..STEPS {
        let logits = x.clone().matmul(w.clone()); // the trainer: π_old (= π_θ before the update)
                                                  // The rollout engine's copy of the policy lags and drifts: more on odd sequences, and
                                                  // more each step, so the trust region starts rejecting.
        let drift: Vec<f32> = (0..B * T)
            .map(|i| {
                if (i / T) % 2 == 1 {
                    0.15 * (step + 1) as f32
                } else {
                    0.01
                }
            })
            .collect();
        let noise = Tensor::<2>::from_data(
            TensorData::new(rng.normals(B * T * V, 1.0), [B * T, V]),
            &dev,
        ) * Tensor::<2>::from_data(TensorData::new(drift, [B * T, 1]), &dev);
        let rollout_logits = logits.clone().detach().inner() + noise.inner();

        // The rollout samples its tokens from π_roll on the device (Gumbel-max), and both
        // policies' log-probs of them come back to the host ([B·T] floats, small).
        let gumbel =
            Tensor::<2>::from_data(TensorData::new(rng.gumbels(B * T * V), [B * T, V]), &dev);
        let idx = (rollout_logits.clone() + gumbel.inner()).argmax(1);
        let idx_train = idx.clone().autodiff();
        let logp = log_softmax(logits.clone(), 1)
            .gather(1, idx_train.clone())
            .reshape([B * T]);
        let roll_lp = to_host(log_softmax(rollout_logits.clone(), 1).gather(1, idx))?;
        let old_lp = to_host(logp.clone().detach().inner())?;

        // trmask on burn's device buffers: exact KL, mask, weights.
        let (roll_dev, old_dev) = (device_logits(&rollout_logits)?, device_logits(&logits)?);
        let step_in = Step::padded(B, T)
            .response_mask(&mask[..])
            .rollout_log_prob(&roll_lp[..])
            .old_log_prob(&old_lp[..]);
        let out = corrector.correct(&step_in.clone().logits(&roll_dev.logits, &old_dev.logits))?;
        drop((roll_dev, old_dev));

        // The f64 CPU reference on host copies (made for this check only): the same decisions,
        // and the per-sequence max KL within the GPU engine's f32 tolerance.
        let roll_h = Logits::from_f32(&to_host(rollout_logits)?, B * T, V)?;
        let old_h = Logits::from_f32(&to_host(logits.detach().inner())?, B * T, V)?;
        let check = reference.correct(&step_in.logits(&roll_h, &old_h))?;
        ensure!(
            check.seq_accept == out.seq_accept,
            "step {step}: GPU accepts {:?}, CPU reference {:?}",
            out.seq_accept,
            check.seq_accept
        );
        let (kl, kl_ref) = (&out.criteria[0].seq_stat, &check.criteria[0].seq_stat);
        for (s, (g, c)) in kl.iter().zip(kl_ref).enumerate() {
            ensure!(
                (g - c).abs() <= 2e-3 * c.abs() + 1e-7,
                "step {step}, sequence {s}: max KL {g} on the GPU, {c} on the CPU reference"
            );
        }

        // The policy-gradient loss in burn, masked and weighted by trmask:
        // loss = −Σ w·keep·A·log π_θ / Σ keep.
        let keep = out.mask_f32();
        let weights = out.weights_f32().context("the config has token IS")?;
        let kept: f32 = keep.iter().sum::<f32>();
        let coef: Vec<f32> = (0..B * T)
            .map(|i| -weights[i] * keep[i] * advantages[i] / kept.max(1.0))
            .collect();
        let coef = Tensor::<1>::from_data(TensorData::new(coef, [B * T]), &dev);
        let loss = (logp * coef.clone()).sum();
        let grads = loss.backward();
        let g = w.grad(&grads).context("no gradient for the policy")?;
        w = (w.inner() - g * lr).autodiff().require_grad();
        // The same loss under the updated policy: SGD must have lowered it.
        let after: f32 = (log_softmax(x.clone().matmul(w.clone()), 1)
            .gather(1, idx_train)
            .reshape([B * T])
            * coef)
            .sum()
            .into_scalar();
        let before: f32 = loss.into_scalar();
        ensure!(
            after < before,
            "step {step}: the update raised the loss ({before} → {after})"
        );

        let rejected: Vec<usize> = (0..B).filter(|&s| !out.seq_accept[s]).collect();
        println!(
            "step {step}: trmask rejected {}/{B} sequences {rejected:?} ({} of {} tokens kept), \
             max KL {:.4} (threshold 0.02), mean IS weight {:.4}, loss {before:+.5} → {after:+.5}",
            rejected.len(),
            kept as usize,
            B * T,
            kl.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            out.metrics["rollout_corr/rollout_is_mean"],
        );
    }
    println!(
        "the policy's logits were bound in place on the shared device (no host copy for the KL)"
    );
    Ok(())
}
