//! A dump's sequences as a padded batch of trmask tensors, and the note stderr prints.

use super::detect::{prime, rank_files, DumpFormat};
use super::values::Collected;
use crate::error::{Error, Result};
use crate::io::names::Renames;
use crate::io::raw::{Dense, Raw};
use std::path::Path;

/// A trmask tensor name, as the tensor table spells it.
fn trmask(name: &'static str) -> &'static str {
    crate::input::tensors::spec(name).map_or(name, |t| t.name)
}

/// Reads a trainer dump as [`Raw`] tensors under trmask names, with the note stderr prints.
pub(in crate::io) fn read(path: &Path, format: DumpFormat) -> Result<Raw> {
    let p = path.display().to_string();
    let mut c = Collected {
        seqs: Vec::new(),
        step: None,
        empty: 0,
        has_adv: false,
        has_ids: false,
        bytes: 0,
    };
    let mut what = String::new();
    match format {
        DumpFormat::PrimeRl if path.is_dir() => {
            let files = rank_files(path)?;
            for f in &files {
                super::prime::prime_file(f, &mut c)?;
            }
            let names: Vec<String> = files
                .iter()
                .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            what = format!(
                "{} rank file{} merged ({})",
                files.len(),
                if files.len() == 1 { "" } else { "s" },
                names.join(", ")
            );
        }
        DumpFormat::PrimeRl => super::prime::prime_file(path, &mut c)?,
        DumpFormat::NemoRl => super::nemo::nemo_file(path, &mut c)?,
    }
    if c.seqs.is_empty() {
        return Err(Error::file(
            &p,
            format!(
                "holds no sequence with a valid token ({} record{} read)",
                c.empty,
                if c.empty == 1 { "" } else { "s" }
            ),
        ));
    }
    // (trmask name, the dump's key): prime-rl's keys are the tensor table's prime-rl aliases
    let (rollout_src, trainer_dst, mask_src) = match format {
        DumpFormat::PrimeRl => (
            prime("rollout_log_prob"),
            "log_prob",
            prime("response_mask"),
        ),
        DumpFormat::NemoRl => (
            "generation_logprobs",
            "old_log_prob",
            "token_loss_mask × sample_loss_mask",
        ),
    };
    let trainer_src = match format {
        DumpFormat::PrimeRl => prime(trainer_dst),
        DumpFormat::NemoRl => "prev_logprobs",
    };
    let b = c.seqs.len();
    let t = c.seqs.iter().map(|s| s.mask.len()).max().unwrap_or(0);
    let slots = b * t;
    // one tensor at a time, in the order of the rows below (rollout, trainer, mask, …)
    let mut tensors: Vec<(&str, &str, Vec<f64>)> = Vec::new();
    tensors.push((
        trmask("rollout_log_prob"),
        rollout_src,
        vec![f64::NAN; slots],
    ));
    tensors.push((trainer_dst, trainer_src, vec![f64::NAN; slots]));
    tensors.push((trmask("response_mask"), mask_src, vec![0.0; slots]));
    if c.has_adv {
        let adv = trmask("advantages");
        tensors.push((adv, adv, vec![0.0; slots]));
    }
    if c.has_ids {
        tensors.push((trmask("responses"), "token_ids", vec![0.0; slots]));
    }
    for (i, s) in c.seqs.iter().enumerate() {
        let row = i * t;
        for (k, (_, _, data)) in tensors.iter_mut().enumerate() {
            let src: Vec<f64> = match k {
                0 => s.rollout.clone(),
                1 => s.trainer.clone(),
                2 => s.mask.iter().map(|&v| v as u8 as f64).collect(),
                _ if k == 3 && c.has_adv => s.adv.clone(),
                _ => s.ids.clone(),
            };
            // a record without this field (mixed files) leaves its row at the default
            let n = src.len().min(t);
            data[row..row + n].copy_from_slice(&src[..n]);
        }
    }
    let mut raw = Raw {
        keys: tensors.iter().map(|x| x.1.to_string()).collect(),
        step: c.step.map(|s| s as f64),
        bytes: c.bytes,
        ..Raw::default()
    };
    let mut pairs = Vec::new();
    for (name, src, data) in tensors {
        raw.sources
            .push((name.to_string(), src.to_string(), "jsonl".to_string()));
        pairs.push((src.to_string(), name.to_string()));
        raw.dense.insert(
            name.to_string(),
            Dense {
                shape: vec![b, t],
                data,
                nulls: Vec::new(),
            },
        );
    }
    let mut about = vec![format!("{b} sequences")];
    if !what.is_empty() {
        about.insert(0, what);
    }
    if let Some(s) = c.step {
        about.push(format!("step {s}"));
    }
    if c.empty > 0 {
        about.push(format!(
            "{} record{} without a valid token left out",
            c.empty,
            if c.empty == 1 { "" } else { "s" }
        ));
    }
    about.push("each sequence from its first to its last valid token".into());
    raw.renames = Renames {
        applied: pairs,
        format: Some(format!("{}, {}", format.name(), about.join(", "))),
    };
    Ok(raw)
}
