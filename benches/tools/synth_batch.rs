//! Writes a synthetic packed batch (`rollout_logits`, `old_logits`, `responses`, `cu_seqlens`)
//! as safetensors, streaming row by row so files larger than memory can be made — for
//! benchmarks and memory checks of `trmask analyze`.
//!
//! `cargo run --release --example synth_batch -- OUT.safetensors ROWS VOCAB [f32|f16|bf16] [SEQ_LEN]`

use std::io::{BufWriter, Write};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        args.len() >= 3,
        "usage: synth_batch OUT.safetensors ROWS VOCAB [f32|f16|bf16] [SEQ_LEN]"
    );
    let (out, rows, vocab): (&str, usize, usize) = (&args[0], args[1].parse()?, args[2].parse()?);
    let dtype = args.get(3).map(String::as_str).unwrap_or("bf16");
    let seq_len: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(512);
    let (dname, width) = match dtype {
        "f32" => ("F32", 4),
        "f16" => ("F16", 2),
        "bf16" => ("BF16", 2),
        other => anyhow::bail!("dtype {other} is not f32, f16 or bf16"),
    };
    let cu: Vec<i32> = (0..rows.div_ceil(seq_len))
        .map(|s| (s * seq_len) as i32)
        .chain([rows as i32])
        .collect();
    let logits_bytes = rows * vocab * width;
    let mut off = 0usize;
    let mut entry = |name: &str, dt: &str, shape: String, len: usize| {
        let e = format!(
            "\"{name}\":{{\"dtype\":\"{dt}\",\"shape\":{shape},\"data_offsets\":[{off},{}]}}",
            off + len
        );
        off += len;
        e
    };
    let header = format!(
        "{{{},{},{},{}}}",
        entry("cu_seqlens", "I32", format!("[{}]", cu.len()), cu.len() * 4),
        entry("responses", "I32", format!("[{rows}]"), rows * 4),
        entry(
            "rollout_logits",
            dname,
            format!("[{rows},{vocab}]"),
            logits_bytes
        ),
        entry(
            "old_logits",
            dname,
            format!("[{rows},{vocab}]"),
            logits_bytes
        ),
    );
    let mut header = header.into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut w = BufWriter::with_capacity(1 << 22, std::fs::File::create(out)?);
    w.write_all(&(header.len() as u64).to_le_bytes())?;
    w.write_all(&header)?;
    cu.iter().try_for_each(|c| w.write_all(&c.to_le_bytes()))?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    for _ in 0..rows {
        w.write_all(
            &((next() * vocab as f32) as i32)
                .min(vocab as i32 - 1)
                .to_le_bytes(),
        )?;
    }
    let encode = |w: &mut BufWriter<std::fs::File>, x: f32| -> std::io::Result<()> {
        match dtype {
            "f32" => w.write_all(&x.to_le_bytes()),
            "f16" => w.write_all(&half::f16::from_f32(x).to_le_bytes()),
            _ => w.write_all(&half::bf16::from_f32(x).to_le_bytes()),
        }
    };
    // The trainer's logits are the rollout's plus a small per-row perturbation, regenerated from
    // the same seed so nothing is held in memory.
    let mut row = vec![0f32; vocab];
    for pass in 0..2 {
        let mut g = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..rows {
            for v in row.iter_mut() {
                g ^= g << 13;
                g ^= g >> 7;
                g ^= g << 17;
                let u = (g >> 40) as f32 / (1u64 << 24) as f32;
                let e = ((g & 0xFFFF) as f32 / 65536.0 - 0.5) * 0.05;
                *v = 12.0 * u - 6.0 + if pass == 1 { e } else { 0.0 };
            }
            for &x in &row {
                encode(&mut w, x)?;
            }
        }
    }
    w.flush()?;
    eprintln!(
        "wrote {out}: {rows} x {vocab} {dname} logits ({:.1} MiB each)",
        logits_bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}
