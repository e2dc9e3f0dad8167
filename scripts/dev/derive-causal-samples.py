#!/usr/bin/env python3
"""Derives the small batches of data/causal-sample/ that the docs and tests run on, from the
sample's own batch.safetensors (pure Python, no dependencies; rerun from the repository root):

* stale.safetensors: the whole batch against the *stale* trainer (the same model 20 optimizer
  steps later): rollout_log_prob <- rollout_log_prob_raw, old_log_prob <- old_log_prob_stale.
  Real rejections (mean k3 0.032 per token), no top-p offset.
* run/step-00 .. step-11.safetensors: a 12-step "run", step k holding rows 5k .. 5k+4 of the
  batch (raw rollout against the up-to-date trainer), except step 07, whose trainer is the stale
  one: the spiky step of a run (an async trainer that fell behind).

Every file keeps response_mask, responses and advantages, and the padding's garbage."""

import json
import struct
from pathlib import Path

SRC = Path("data/causal-sample/batch.safetensors")
OUT = Path("data/causal-sample")
SPIKE = 7


def read(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8 : 8 + n])
    head.pop("__metadata__", None)
    body = raw[8 + n :]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in head.items()}


def rows(t, lo, hi):
    dtype, shape, data = t
    per = len(data) // shape[0]
    return dtype, [hi - lo] + shape[1:], data[lo * per : hi * per]


def write(path, tensors, meta):
    head, body, off = {"__metadata__": meta}, b"", 0
    for name, (dtype, shape, data) in tensors.items():
        head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        body += data
        off += len(data)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(struct.pack("<Q", len(h)) + h + body)
    tmp.replace(path)


def batch(t, lo, hi, stale):
    return {
        "rollout_log_prob": rows(t["rollout_log_prob_raw"], lo, hi),
        "old_log_prob": rows(t["old_log_prob_stale" if stale else "old_log_prob"], lo, hi),
        "response_mask": rows(t["response_mask"], lo, hi),
        "responses": rows(t["responses"], lo, hi),
        "advantages": rows(t["advantages"], lo, hi),
    }


def main():
    t = read(SRC)
    src = "causal-sample/batch.safetensors"
    write(OUT / "stale.safetensors", batch(t, 0, 64, True),
          {"derived_from": f"{src}: rollout_log_prob_raw, old_log_prob_stale"})
    (OUT / "run").mkdir(exist_ok=True)
    for k in range(12):
        stale = k == SPIKE
        write(OUT / "run" / f"step-{k:02d}.safetensors", batch(t, 5 * k, 5 * k + 5, stale),
              {"step": str(k), "derived_from": f"{src} rows {5 * k}..{5 * k + 4}: rollout_log_prob_raw, "
               + ("old_log_prob_stale" if stale else "old_log_prob")})


if __name__ == "__main__":
    main()
