//! Which trainer dump a path is, by content; prime-rl's rank files of a step directory.

use crate::error::{Error, Result};
use serde::de;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A trainer dump format trmask reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    /// prime-rl's token export, schema v1.
    PrimeRl,
    /// NeMo-RL's `train_data_step<N>.jsonl`.
    NemoRl,
}

impl DumpFormat {
    pub fn name(self) -> &'static str {
        match self {
            DumpFormat::PrimeRl => "prime-rl token export (schema v1)",
            DumpFormat::NemoRl => "NeMo-RL train_data_step*.jsonl",
        }
    }
}

/// prime-rl's key for the trmask tensor `target`, from the tensor table's aliases.
pub(super) fn prime(target: &str) -> &'static str {
    crate::input::tensors::alias_of("prime-rl", target).unwrap_or("")
}

/// The keys that mark each format's records (all must be present in the first record).
fn prime_keys() -> [&'static str; 4] {
    let mut k = ["schema_version"; 4];
    k[1] = prime("rollout_log_prob");
    k[2] = prime("log_prob");
    k[3] = prime("response_mask");
    k
}
const NEMO_KEYS: &[&str] = &["generation_logprobs", "prev_logprobs", "token_loss_mask"];

/// The number in a prime-rl rank file's name (`rank_<R>.jsonl`).
pub fn rank_of(name: &str) -> Option<u64> {
    name.strip_prefix("rank_")?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

/// The prime-rl rank files of a step directory, in rank order.
pub fn rank_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let p = dir.display().to_string();
    let mut ranks: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(&p, &e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            rank_of(&name).map(|r| (r, e.path()))
        })
        .collect();
    ranks.sort();
    Ok(ranks.into_iter().map(|(_, p)| p).collect())
}

/// The first key of the JSON object a file starts with, from its first bytes (`None` when it
/// does not start with an object or the key is longer than what was read).
fn first_key(head: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(head)
        .unwrap_or_else(|e| std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default());
    let rest = s.trim_start().strip_prefix('{')?.trim_start();
    let mut de = serde_json::Deserializer::from_str(rest);
    String::deserialize(&mut de).ok()
}

/// Which trainer dump `path` is, by content: a directory holding prime-rl rank files, or a
/// JSON-lines file whose first record carries one format's keys. `None`: neither (a batch).
pub fn detect(path: &Path) -> Result<Option<DumpFormat>> {
    use std::io::Read as _;
    let p = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| Error::io(&p, &e))?;
    if meta.is_dir() {
        if !rank_files(path)?.is_empty() {
            return Ok(Some(DumpFormat::PrimeRl));
        }
        let steps = std::fs::read_dir(path)
            .map_err(|e| Error::io(&p, &e))?
            .filter_map(|e| e.ok())
            .any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n == "token_exports" || n.starts_with("step_")
            });
        return Err(Error::file(
            &p,
            if steps {
                "is a directory of prime-rl steps: give one step directory \
                 (token_exports/step_<N>) or a rank file, or follow the run with `trmask watch`"
            } else {
                "is a directory, not a batch file or a prime-rl step directory (rank_<R>.jsonl)"
            },
        ));
    }
    if !meta.is_file() {
        return Ok(None);
    }
    let mut head = Vec::with_capacity(4096);
    let f = std::fs::File::open(path).map_err(|e| Error::io(&p, &e))?;
    f.take(4096)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(&p, &e))?;
    // A batch's first key is a tensor name: decided without reading on.
    let Some(key) = first_key(&head) else {
        return Ok(None);
    };
    let known = crate::io::raw::known();
    if known.contains(&key.as_str())
        || crate::input::tensors::aliases().any(|(a, _)| a.source == key)
    {
        return Ok(None);
    }
    let mut keys: Vec<String> = Vec::new();
    if let Some(line) = crate::io::files::first_line(path)? {
        let mut de = serde_json::Deserializer::from_str(&line);
        if let Ok(m) = std::collections::BTreeMap::<String, de::IgnoredAny>::deserialize(&mut de) {
            keys = m.into_keys().collect();
        }
    }
    let has = |want: &[&str]| want.iter().all(|k| keys.iter().any(|x| x == k));
    Ok(if has(&prime_keys()) {
        Some(DumpFormat::PrimeRl)
    } else if has(NEMO_KEYS) {
        Some(DumpFormat::NemoRl)
    } else {
        None
    })
}
