//! The report's tables: the worst sequences as token strips, the worst tokens one by one, and
//! the bound certificate folded under one plain sentence.

use super::subject::{num, output, ranking, worst_order, Subject};
use super::summary::bound_reading;
use super::svg::{esc, strip};
use std::fmt::Write as _;

/// How many tokens the worst-tokens table lists.
pub const WORST_TOKENS: usize = 20;

/// Per valid slot: (sequence, position in the sequence among its valid tokens).
fn places(s: &Subject) -> Vec<Option<(usize, usize)>> {
    let mask = s.batch.mask();
    let mut out = vec![None; mask.len()];
    for (seq, &(a, b)) in s.batch.segments().ranges().iter().enumerate() {
        for (t, i) in (a..b).filter(|&i| mask[i]).enumerate() {
            out[i] = Some((seq, t));
        }
    }
    out
}

/// A token's text as a quoted literal (newlines and tabs visible), or "" without a tokenizer.
fn text_of(s: &Subject, slot: usize) -> Option<String> {
    let decode = s.decode?;
    let id = s.batch.responses()?.get(slot).copied()?;
    decode(id).map(|t| format!("{t:?}"))
}

/// One strip cell's tooltip: position, token id (and text), log ρ, k3.
fn cell_title(s: &Subject, slot: usize, t: usize, lr: &[f64], k3: &[f64]) -> String {
    let mut out = format!("t={t}");
    if let Some(id) = s.batch.responses().and_then(|r| r.get(slot)) {
        let _ = write!(out, " id {id}");
    }
    if let Some(text) = text_of(s, slot) {
        let _ = write!(out, " {text}");
    }
    if let Some(x) = lr.get(slot) {
        let _ = write!(out, ", log rho {}", num(*x));
    }
    if let Some(x) = k3.get(slot) {
        let _ = write!(out, ", k3 {}", num(*x));
    }
    out
}

pub(super) fn worst_sequences(s: &Subject) -> String {
    let Some(r) = ranking(s) else {
        return String::new();
    };
    let c = &s.analysis.corrections;
    let lr = output(s.analysis, "log_ratio").unwrap_or(&[]);
    let k3 = output(s.analysis, "k3").unwrap_or(&[]);
    let mask = s.batch.mask();
    let mut html = format!(
        "<table class=\"wide\"><tr><th>seq</th><th>length</th><th>{}</th><th>decision</th>\
         <th>|log &rho;| along the sequence (darker = larger; scale = batch max; hover a cell \
         for the token)</th></tr>",
        esc(&r.name)
    );
    let max = (0..lr.len())
        .filter(|&i| mask[i])
        .map(|i| lr[i].abs())
        .fold(0.0, f64::max);
    for &i in worst_order(s, &r).iter().take(10) {
        let (a, b) = s.batch.segments().ranges()[i];
        let cells: Vec<(f64, String)> = (a..b)
            .filter(|&j| mask[j])
            .enumerate()
            .map(|(t, j)| {
                (
                    lr.get(j).map_or(0.0, |x| x.abs()),
                    cell_title(s, j, t, lr, k3),
                )
            })
            .collect();
        let _ = write!(
            html,
            "<tr><td>{i}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td>\
             <td class=\"strip\">{}</td></tr>",
            c.seq_len[i],
            num(r.values[i]),
            if c.seq_accept[i] { "ok" } else { "bad" },
            if c.seq_accept[i] { "accept" } else { "reject" },
            strip(&cells, max)
        );
    }
    html.push_str("</table>");
    html
}

/// The [`WORST_TOKENS`] valid tokens with the largest k3 (|log ρ| without k3): where each sits,
/// which token it is, both log-probs, log ρ and k3.
pub(super) fn worst_tokens(s: &Subject) -> String {
    let lr = output(s.analysis, "log_ratio");
    let k3 = output(s.analysis, "k3");
    let Some(key) = k3.or(lr) else {
        return String::new();
    };
    let mask = s.batch.mask();
    let mut slots: Vec<usize> = (0..key.len())
        .filter(|&i| mask[i] && !key[i].is_nan())
        .collect();
    let score = |i: usize| if k3.is_some() { key[i] } else { key[i].abs() };
    slots.sort_by(|&x, &y| score(y).total_cmp(&score(x)).then(x.cmp(&y)));
    slots.truncate(WORST_TOKENS);
    if slots.is_empty() {
        return String::new();
    }
    let places = places(s);
    let roll = s.batch.rollout_log_prob();
    let train = crate::engine::passes::training_log_prob(s.batch);
    let text = s.decode.is_some() && s.batch.responses().is_some();
    let mut html = String::from("<table><tr><th>seq</th><th>position</th><th>token id</th>");
    if text {
        html.push_str("<th>text</th>");
    }
    html.push_str(
        "<th>rollout log-prob</th><th>trainer log-prob</th><th>log &rho;</th><th>k3</th>\
         <th>sequence</th></tr>",
    );
    let cell =
        |v: Option<&[f64]>, i: usize| v.and_then(|v| v.get(i)).map_or("-".into(), |x| num(*x));
    let c = &s.analysis.corrections;
    for &i in &slots {
        let (seq, t) = places[i].unwrap_or((0, 0));
        let id = s
            .batch
            .responses()
            .and_then(|r| r.get(i))
            .map_or("-".into(), |x| x.to_string());
        let _ = write!(html, "<tr><td>{seq}</td><td>{t}</td><td>{id}</td>");
        if text {
            let _ = write!(
                html,
                "<td><code>{}</code></td>",
                esc(&text_of(s, i).unwrap_or_default())
            );
        }
        let accepted = c.seq_accept.get(seq).copied().unwrap_or(true);
        let _ = write!(
            html,
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>",
            cell(roll, i),
            cell(train, i),
            lr.and_then(|v| v.get(i)).map_or("-".into(), |x| num(*x)),
            k3.and_then(|v| v.get(i)).map_or("-".into(), |x| num(*x)),
            if accepted { "ok" } else { "bad" },
            if accepted { "accepted" } else { "rejected" }
        );
    }
    html.push_str("</table>");
    html
}

/// One plain sentence on what the certificate guarantees (over the accepted sequences, else
/// all of them).
pub(super) fn certificate_sentence(s: &Subject) -> String {
    let Some(cert) = &s.analysis.certificate else {
        return "no certificate: the batch has no valid token or an infinite divergence".into();
    };
    let Some((set, b)) = cert
        .accepted
        .as_ref()
        .map(|b| ("accepted", b))
        .or(cert.all.as_ref().map(|b| ("all", b)))
    else {
        return "no certificate: no sequence to bound".into();
    };
    if !b.unified.is_finite() || b.unified >= 1.0 {
        format!(
            "vacuous at this length: over the {set} sequences (T = {}) the bound B* = {} \
             exceeds the whole reward range, so it guarantees nothing",
            b.inputs.horizon,
            num(b.unified)
        )
    } else {
        format!(
            "over the {set} sequences (T = {}) the surrogate objective is within B* = {} of \
             the true one, as a fraction of the reward range ({})",
            b.inputs.horizon,
            num(b.unified),
            bound_reading(b.unified)
        )
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

pub(super) fn certificate(s: &Subject) -> String {
    let Some(cert) = &s.analysis.certificate else {
        return format!("<p>{}.</p>", esc(&capitalised(&certificate_sentence(s))));
    };
    let mut html = format!(
        "<details><summary>{}.</summary>\
         <table class=\"wide\"><tr><th>set</th><th>T</th><th>&delta;</th><th>&epsilon;</th>\
         <th>classical KL</th><th>PM-KL</th><th>PM-TV</th><th>Mix-KL</th><th>Mix-TV</th>\
         <th>coupling</th><th>adaptive</th><th>B*</th><th>argmin</th></tr>",
        esc(&capitalised(&certificate_sentence(s)))
    );
    for (set, b) in [("all", &cert.all), ("accepted", &cert.accepted)] {
        let Some(b) = b else {
            let _ = write!(
                html,
                "<tr><td>{set}</td><td colspan=\"12\">no {set} sequence</td></tr>"
            );
            continue;
        };
        let _ = write!(html, "<tr><td>{set}</td><td>{}</td>", b.inputs.horizon);
        for v in [
            b.inputs.delta,
            b.inputs.eps,
            b.classical_kl,
            b.pm_kl,
            b.pm_tv,
            b.mix_kl,
            b.mix_tv,
            b.coupling,
            b.adaptive,
        ] {
            let _ = write!(html, "<td>{}</td>", num(v));
        }
        let _ = write!(
            html,
            "<td><b>{}</b></td><td>{}</td></tr>",
            num(b.unified),
            b.argmin
        );
    }
    let _ = write!(
        html,
        "</table><p class=\"note\">B* is the least of the six bounds after the classical one. \
         {}</p></details>",
        esc(crate::bounds::certificate::CAVEAT)
    );
    html
}
