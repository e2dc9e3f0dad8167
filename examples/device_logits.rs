//! Logits that already live on a wgpu device (e.g. produced by a wgpu-based model): trmask
//! shares the caller's device and computes the exact KL from those buffers in place — the
//! logits are never read back to the host (only 8 floats per row of results are).
//!
//! Run: `cargo run --example device_logits`
//! (on a machine without a GPU: `VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json`).

use std::sync::Arc;
use trmask::gpu::{Context, GpuEngine};
use trmask::wgpu;
use trmask::{cpu::CpuEngine, DType, Engine, Logits};

fn main() -> anyhow::Result<()> {
    // The caller's own device (trmask re-exports the wgpu it is built on).
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))?;
    let (device, queue) = pollster::block_on(adapter.request_device(&Default::default()))?;

    // Two [rows, vocab] f32 logits tensors, written on the device (a model would produce them
    // there; here queue.write_buffer stands in for it).
    let (rows, vocab) = (4usize, 1000usize);
    let rollout: Vec<f32> = (0..rows * vocab)
        .map(|i| ((i * 7919) % 1013) as f32 / 100.0 - 5.0)
        .collect();
    let train: Vec<f32> = rollout
        .iter()
        .enumerate()
        .map(|(i, x)| x + 0.05 * (((i * 31) % 17) as f32 / 17.0 - 0.5))
        .collect();
    let make = |values: &[f32]| {
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("logits"),
            size: (values.len() * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&buffer, 0, bytemuck::cast_slice(values));
        buffer
    };
    let (rollout_buf, train_buf) = (make(&rollout), make(&train));

    // Share the device with trmask; wrap the buffers as device-resident logits.
    let gpu = GpuEngine::from_context(Arc::new(Context::from_wgpu(device, queue)));
    let roll_dev = Logits::device(rollout_buf, 0, DType::F32, rows, vocab)?;
    let train_dev = Logits::device(train_buf, 0, DType::F32, rows, vocab)?;
    let mask = vec![true; rows];
    let on_device = gpu.vocab_divergence(&roll_dev, &train_dev, None, &mask, 1.0)?;

    // The f64 CPU reference on the same values (host copies made here for the check only).
    let reference = CpuEngine::new().vocab_divergence(
        &Logits::from_f32(&rollout, rows, vocab)?,
        &Logits::from_f32(&train, rows, vocab)?,
        None,
        &mask,
        1.0,
    )?;
    println!("row  KL(roll‖train) GPU (device logits)  CPU reference (f64)");
    for r in 0..rows {
        let (g, c) = (on_device.kl[r], reference.kl[r]);
        println!("{r:>3}  {g:>30.9e}  {c:>19.9e}");
        anyhow::ensure!(
            (g - c).abs() <= 2e-3 * c.abs() + 1e-7,
            "row {r}: GPU {g} vs CPU {c}"
        );
    }
    println!(
        "{} — device logits bound in place, no read-back",
        gpu.name()
    );
    Ok(())
}
