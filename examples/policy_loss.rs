//! A masked, importance-weighted policy-gradient loss from trmask's corrections.
//!
//! Run: `cargo run --example policy_loss`
//!
//! What to watch (see `trmask::correction` docs):
//! * decoupled mode (verl's default): the modified mask replaces `response_mask`, so a
//!   token-mean loss divides by the tokens that SURVIVE rejection;
//! * bypass mode (verl's engine path): the denominator is the token count BEFORE rejection,
//!   so rejected tokens still count and shrink the gradient;
//! * GRPO baselines are computed before rejection: rejected sequences stay in the group
//!   statistics of the advantages.

use trmask::{cpu::CpuEngine, Batch, CorrectionConfig};

fn main() -> anyhow::Result<()> {
    // 3 sequences of up to 4 tokens; the last one has drifted far from the rollout policy.
    let mask = [
        1.0, 1.0, 1.0, 1.0, //
        1.0, 1.0, 0.0, 0.0, //
        1.0, 1.0, 1.0, 0.0,
    ];
    let rollout = vec![
        -1.0, -0.7, -0.3, -2.0, //
        -0.5, -1.5, 0.0, 0.0, //
        -0.2, -0.9, -1.1, 0.0,
    ];
    let old = vec![
        -1.02, -0.69, -0.31, -1.95, //
        -0.52, -1.48, 0.0, 0.0, //
        -1.4, -0.1, -2.6, 0.0,
    ];
    let log_prob = old.iter().map(|x| x + 0.01).collect::<Vec<_>>(); // current policy π_θ
                                                                     // GRPO-style advantages, one per sequence, computed BEFORE rejection.
    let adv_seq = [1.0, -0.5, -0.5];

    let batch = Batch::padded(3, 4, &mask)?
        .with_log_probs("rollout_log_prob", rollout)?
        .with_log_probs("old_log_prob", old.clone())?
        .with_log_probs("log_prob", log_prob.clone())?
        .build()?;
    let cfg = CorrectionConfig::preset("decoupled_k3_rs_token_tis")?;
    let c = trmask::correction::correct(&CpuEngine::new(), &batch, &cfg)?;
    let w = c.weights.as_ref().expect("IS is on in this preset");

    // loss_t = −A · w_t · exp(logπθ − logπold), masked by the MODIFIED mask
    let t = 4;
    let (mut num, mut kept, mut before) = (0.0, 0.0, 0.0);
    for i in 0..mask.len() {
        before += mask[i];
        if c.mask[i] == 0.0 {
            continue;
        }
        let ratio = (log_prob[i] - old[i]).exp();
        num += -adv_seq[i / t] * w[i] * ratio;
        kept += 1.0;
    }
    println!("seq_accept = {:?}", c.seq_accept);
    println!("seq_reject_bits = {:?}", c.seq_reject_bits);
    println!(
        "decoupled token-mean loss (÷ kept tokens {kept}) = {:.6}",
        num / kept
    );
    println!(
        "bypass-style loss (÷ tokens before RS {before}) = {:.6}",
        num / before
    );
    for (k, v) in &c.metrics {
        if k.starts_with("trmask/reject") || k.ends_with("rollout_rs_masked_fraction") {
            println!("{k} = {v}");
        }
    }
    Ok(())
}
