//! What merging the partials of data-parallel ranks costs over MPI: bytes per rank per step and
//! the time of one metrics merge (all-gather + decode + merge + finish), median over 200 runs.
//!
//! `mpirun -np R cargo run --features mpi --example merge_cost [SEQS_PER_RANK] [T]`

use mpi::traits::*;
use std::time::Instant;
use trmask::analysis::analyze_shard;
use trmask::distributed::MpiExchange;
use trmask::partial::{exchange, Exchange, Partial};
use trmask::{Batch, CorrectionConfig};

/// An exchange that remembers the sizes and the last buffer it sent.
struct Recording<'a, C: Communicator> {
    inner: MpiExchange<'a, C>,
    sizes: Vec<usize>,
    last: Vec<u8>,
}

impl<C: Communicator> Exchange for Recording<'_, C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_gather(&mut self, local: &[u8]) -> trmask::Result<Vec<Vec<u8>>> {
        self.sizes.push(local.len());
        self.last = local.to_vec();
        self.inner.all_gather(local)
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let (seqs, t) = (
        args.first().copied().unwrap_or(64),
        args.get(1).copied().unwrap_or(512),
    );
    let universe = mpi::initialize().ok_or_else(|| anyhow::anyhow!("MPI init failed"))?;
    let world = universe.world();
    let rank = world.rank() as u64;
    // a deterministic per-rank batch: seqs × t tokens, lengths varying, 4 responses per prompt
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (rank + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut mask = Vec::with_capacity(seqs * t);
    let (mut roll, mut old) = (Vec::new(), Vec::new());
    for _ in 0..seqs {
        let len = 1 + (next() * t as f64) as usize;
        for i in 0..t {
            mask.push((i < len.min(t)) as u8 as f64);
            let lp = -3.0 * next();
            roll.push(lp);
            old.push(lp + 0.2 * (next() - 0.5));
        }
    }
    let uid: Vec<i64> = (0..seqs)
        .map(|s| (rank as i64) * 1000 + s as i64 / 4)
        .collect();
    let batch = Batch::padded(seqs, t, &mask)?
        .with_log_probs("rollout_log_prob", roll)?
        .with_log_probs("old_log_prob", old)?
        .with_uid(uid)?
        .build()?;
    let mut cfg = CorrectionConfig::preset("decoupled_k3_rs_token_tis")?;
    cfg.rollout_is_batch_normalize = true;
    let engine = trmask::cpu::CpuEngine::new();
    let mut rec = Recording {
        inner: MpiExchange::new(&world),
        sizes: Vec::new(),
        last: Vec::new(),
    };
    analyze_shard(&engine, &batch, &cfg, &mut rec)?;
    let partial = Partial::from_bytes(&rec.last)?;
    let mut times = Vec::new();
    for _ in 0..200 {
        world.barrier();
        let t0 = Instant::now();
        let merged = exchange(&mut MpiExchange::new(&world), partial.clone())?;
        let m = merged.finish()?;
        times.push(t0.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(m);
    }
    times.sort_by(f64::total_cmp);
    // the CPU part alone (decode n buffers, merge in order, finish), for this job's size and 64
    let bytes = partial.to_bytes();
    let local = |n: usize| -> trmask::Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..20 {
            let t0 = Instant::now();
            let mut merged = Partial::new();
            for _ in 0..n {
                merged.merge(&Partial::from_bytes(&bytes)?)?;
            }
            std::hint::black_box(merged.finish()?);
            best = best.min(t0.elapsed().as_secs_f64() * 1e6);
        }
        Ok(best)
    };
    let (cpu_here, cpu_64) = (local(world.size() as usize)?, local(64)?);
    if rank == 0 {
        println!(
            "decode + merge + finish in one process: {cpu_here:.0} us for {} partials, {cpu_64:.0} us for 64",
            world.size()
        );
        println!(
            "ranks {} | {seqs} seqs x {t} per rank | exchanges per step {} | bytes per rank {:?} | metrics merge median {:.1} us (p10 {:.1}, p90 {:.1})",
            world.size(),
            rec.sizes.len(),
            rec.sizes,
            times[100],
            times[20],
            times[180]
        );
    }
    Ok(())
}
