//! The engine layer: the [`Engine`] trait both engines implement, the mask plan a config
//! compiles to, the corrections pass composed from the trait, and the backend choice.

pub mod backend;
#[doc(hidden)]
pub mod passes;
pub mod plan;

mod interface;
pub use interface::*;
