//! What a step is made of: the tensor table (names, aliases, shapes), the validated [`Batch`]
//! with its layout, the typed value views, full logits, and the trainer's top-K support.

pub(crate) mod batch;
pub(crate) mod derive;
pub(crate) mod logits;
pub mod routing;
pub(crate) mod segments;
pub(crate) mod support;
pub mod tensors;
pub(crate) mod values;

pub use batch::{Batch, BatchBuilder, Layout, Segments};
pub use logits::{DType, Logits};
pub use routing::{RouteTokens, Routing};
