//! `trmask devices`: the adapters, the one a GPU engine opens with its capabilities, and what
//! `--backend auto` runs on.

use trmask::backend::{open_engine, Backend};
use trmask::Engine;

pub fn devices() {
    let adapters = trmask::gpu::list_adapters();
    if adapters.is_empty() {
        say!("no GPU adapter found (WGPU_BACKEND / WGPU_ADAPTER_NAME select one)");
    }
    for a in &adapters {
        say!("adapter: {a}");
    }
    match trmask::GpuEngine::new() {
        Ok(gpu) => say!(
            "selected: {}\n{}",
            gpu.name(),
            gpu.capabilities().describe()
        ),
        Err(e) => say!("selected: none ({e})"),
    }
    say!("cpu: {}", trmask::cpu::CpuEngine::new().name());
    // what `--backend auto` (the default) runs: a software adapter is passed over
    let mut notes = Vec::new();
    match open_engine(Backend::Auto, &mut notes) {
        Ok(e) => say!("--backend auto (the default) runs on: {}", e.name()),
        Err(e) => say!("--backend auto (the default): {e}"),
    }
    for n in notes {
        say!("  {}", n.trim_start_matches("trmask: "));
    }
}
