//! Passes composed from the [`Engine`](crate::engine::Engine) primitives, shared by both
//! engines: the f64 corrections pass (the CPU engine's implementation and the GPU engine's
//! plan checks) and the per-token statistics table every correction reads.

mod corrections;
mod table;

pub use corrections::corrections_pass;
pub(crate) use corrections::{check_plan, token_reject_fraction};
pub use table::{
    correction_table, token_table, token_table_config, token_table_for, token_table_with_support,
    topk_missing_input, training_log_prob, training_log_prob_for,
};
