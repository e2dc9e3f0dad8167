//! Per-token dumps that trainers already write, read as a batch — recognised by content, not
//! by name (docs/FORMAT.md, "Trainer dumps", has each format's fields and the writer code
//! they were read from):
//!
//! * **prime-rl's token export** (`token_exports/step_<N>/rank_<R>.jsonl`, schema v1; written
//!   by `src/prime_rl/trainer/rl/token_export.py`): one JSON object per sequence, prompt and
//!   completion, with aligned per-token arrays. A step directory's rank files are merged into
//!   one step, in rank order.
//! * **NeMo-RL's `train_data_step<N>.jsonl`** (`Logger.log_batched_dict_as_jsonl` in
//!   `nemo_rl/utils/logger.py`, called from `nemo_rl/algorithms/grpo.py`): one JSON object per
//!   sample, each array a batch of one (`[[…]]`), padded to the step's longest sequence.
//!
//! Each sequence keeps its tokens from its first to its last valid one (the prompt before its
//! first loss-mask token is left out, holes inside stay as mask 0): a padded `[B, T]` batch
//! with `T` the longest such span. Files are read one line at a time; a damaged or partial
//! line is a one-line error naming the file and line.

mod batch;
mod detect;
mod nemo;
mod prime;
mod values;

pub(super) use batch::read;
pub use detect::{detect, rank_files, rank_of, DumpFormat};
pub use nemo::nemo_step;
