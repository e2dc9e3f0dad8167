//! Shared bench helpers: engines to compare and a seeded generator.

#![allow(dead_code)]

use trmask::backend::{open_engine, Backend};
use trmask::Engine;

/// The CPU reference, plus the GPU engine when an adapter exists.
pub fn engines() -> Vec<(&'static str, Box<dyn Engine>)> {
    let mut v: Vec<(&'static str, Box<dyn Engine>)> = Vec::new();
    let mut notes = Vec::new();
    match open_engine(Backend::Gpu, &mut notes) {
        Ok(e) => {
            eprintln!("bench: {}", e.name());
            v.push(("gpu", e));
        }
        Err(e) => eprintln!("bench: no GPU engine ({e}); CPU only"),
    }
    v.push(("cpu", open_engine(Backend::Cpu, &mut notes).expect("cpu")));
    v
}

/// xorshift64* in [0, 1).
pub struct Rng(pub u64);
impl Rng {
    pub fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.next_f64().max(1e-300), self.next_f64());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// `TRMASK_BENCH_FULL=1` selects LLM-sized shapes.
pub fn full() -> bool {
    std::env::var("TRMASK_BENCH_FULL").is_ok_and(|v| v == "1")
}
