//! Choosing a backend: `Auto` uses the GPU when an adapter exists and says so, else the CPU.

use crate::cpu::CpuEngine;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::gpu::GpuEngine;

/// Which engine to run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The GPU when a hardware adapter exists, else the CPU reference (a software adapter such
    /// as Mesa's lavapipe is used only with [`Backend::Gpu`]).
    #[default]
    Auto,
    /// The GPU engine; an error when no adapter exists.
    Gpu,
    /// The f64 CPU reference.
    Cpu,
    /// The CPU engine with the vocabulary divergences in f32 (`cpu-fast`): faster, at the GPU
    /// engine's tolerance instead of the reference's (everything else as [`Backend::Cpu`]).
    CpuFast,
}

impl Backend {
    /// Every backend's name, as `--backend` and Python's `backend=` spell it.
    pub const NAMES: [&'static str; 4] = ["auto", "gpu", "cpu", "cpu-fast"];

    /// This backend's name (one of [`Backend::NAMES`]).
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Whether this backend may open a GPU device (`auto` and `gpu`).
    pub fn may_use_gpu(self) -> bool {
        matches!(self, Backend::Auto | Backend::Gpu)
    }
}

/// Parses a backend name; the error names the key `backend` (the CLI's `--backend` and
/// Python's `backend=` both parse through this).
///
/// ```
/// use trmask::backend::Backend;
/// assert_eq!("cpu-fast".parse::<Backend>()?, Backend::CpuFast);
/// let e = "tpu".parse::<Backend>().unwrap_err().to_string();
/// assert!(e.contains("backend") && e.contains("auto, gpu, cpu, cpu-fast"), "{e}");
/// # Ok::<(), trmask::Error>(())
/// ```
impl std::str::FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        [Backend::Auto, Backend::Gpu, Backend::Cpu, Backend::CpuFast]
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                Error::config(
                    "backend",
                    format!("{s:?} is not one of {}", Self::NAMES.join(", ")),
                )
            })
    }
}

/// Opens an engine. `notes` receives a line saying what `Auto` chose and why.
pub fn open_engine(backend: Backend, notes: &mut Vec<String>) -> Result<Box<dyn Engine>> {
    match backend {
        Backend::Cpu => Ok(Box::new(CpuEngine::new())),
        Backend::CpuFast => Ok(Box::new(CpuEngine::fast())),
        Backend::Gpu => Ok(Box::new(GpuEngine::new()?)),
        Backend::Auto => match GpuEngine::new_unless_software() {
            // A software rasterizer (Mesa lavapipe / llvmpipe, WARP) runs on the same CPU cores
            // as the reference path, in f32: the f64 reference is then both exact and faster
            // (and no device is opened for it).
            Ok(Err(adapter)) => {
                notes.push(format!(
                    "trmask: backend auto chose the CPU reference (the best adapter, {adapter}, is a software rasterizer; --backend gpu uses it anyway)"
                ));
                Ok(Box::new(CpuEngine::new()))
            }
            Ok(Ok(gpu)) => {
                notes.push(format!("trmask: backend auto chose {}", gpu.name()));
                Ok(Box::new(gpu))
            }
            Err(e) => {
                notes.push(format!(
                    "trmask: backend auto chose the CPU reference ({e})"
                ));
                Ok(Box::new(CpuEngine::new()))
            }
        },
    }
}
