//! Device-resident logits (`Logits::device`): the GPU engine binds the caller's buffer in place
//! (here at a non-zero, unaligned offset) and gives the same bits as host logits; a buffer
//! without STORAGE usage is an error naming the tensor; the CPU engine refuses device logits.

use crate::common;

use common::{gpu, Rng};
use trmask::cpu::CpuEngine;
use trmask::topk::{TopkSupport, TrainerTopk};
use trmask::wgpu::util::DeviceExt;
use trmask::{wgpu, Batch, DType, Engine, Error, Logits};

#[test]
fn topk_on_device_logits_matches_host_logits_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(77);
    let (b, t, v, k) = (2, 7, 301, 3);
    let n = b * t;
    let mask: Vec<f64> = (0..n).map(|i| if i % t < 5 { 1.0 } else { 0.0 }).collect();
    let logits: Vec<f32> = (0..n * v).map(|_| rng.range(-6.0, 6.0) as f32).collect();
    let ids: Vec<i64> = (0..n * k).map(|i| ((i * 37) % v) as i64).collect();
    let lps: Vec<f64> = (0..n * k).map(|i| -2.5 - (i % k) as f64).collect();
    let responses: Vec<i64> = (0..n).map(|_| rng.below(v) as i64).collect();
    let roll: Vec<f64> = (0..n).map(|_| rng.range(-4.0, -2.0)).collect();
    let host = Logits::from_f32(&logits, n, v).unwrap();
    let batch = Batch::padded(b, t, &mask)
        .unwrap()
        .with_responses(responses)
        .unwrap()
        .with_log_probs("rollout_log_prob", roll)
        .unwrap()
        .with_topk(ids, lps, k)
        .unwrap()
        .with_logits("old_logits", host.clone())
        .unwrap()
        .build()
        .unwrap();
    // the tensor starts 12 bytes into the caller's buffer
    let mut bytes = vec![0u8; 12];
    bytes.extend_from_slice(host.bytes());
    let device = gpu.context().device();
    let mk = |usage| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("trainer logits"),
            contents: &bytes,
            usage,
        })
    };
    let dev = Logits::device(mk(wgpu::BufferUsages::STORAGE), 12, DType::F32, n, v).unwrap();
    let run = |e: &dyn Engine, l: &Logits| {
        let tr = TrainerTopk::Logits {
            logits: l,
            temperature: 0.8,
        };
        e.topk_divergence(&batch, TopkSupport::Union, tr)
    };
    let want = run(&*gpu, &host).unwrap();
    let got = run(&*gpu, &dev).unwrap();
    assert_eq!(format!("{got:?}"), format!("{want:?}"));

    let no_storage = Logits::device(mk(wgpu::BufferUsages::COPY_SRC), 12, DType::F32, n, v);
    let err = run(&*gpu, &no_storage.unwrap()).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { tensor, problem } if tensor == "old_logits" && problem.contains("STORAGE")),
        "{err}"
    );
    let err = run(&CpuEngine::new(), &dev).unwrap_err();
    assert!(err.to_string().contains("old_logits"), "{err}");
    // a buffer too small for the shape is refused up front
    assert!(Logits::device(mk(wgpu::BufferUsages::STORAGE), 16, DType::F32, n, v).is_err());
}
