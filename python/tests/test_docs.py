"""The Python snippets of README.md and docs/PYTHON.md run, and the verl / TRL replacement
functions of docs/PYTHON.md give what verl's function gives on a fake verl batch."""

import os
import re
import sys

import numpy as np
import pytest

import trmask
from conftest import DATA

ROOT = os.path.join(DATA, "..")


def blocks(path):
    with open(os.path.join(ROOT, path)) as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)


def test_readme_python_snippet_runs(capsys):
    (code,) = blocks("README.md")
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[[True, True, True], [False, False, False]]"
    assert float(out[1]) == pytest.approx(0.4, abs=1e-7)
    assert float(out[2]) == pytest.approx(4.096)


class _Proto:
    """verl's DataProto as the replacement uses it: a dict of tensors under `.batch`."""

    def __init__(self, **tensors):
        self.batch = dict(tensors)


def test_python_md_snippets():
    codes = blocks("docs/PYTHON.md")
    assert len(codes) == 6
    ns = {}
    for c in codes:
        exec(compile(c, "docs/PYTHON.md", "exec"), ns)
    assert sorted(os.listdir(ns["log_dir"])) == ["metrics.jsonl", "report.html", "tensorboard", "trend.html"]
    rng = np.random.default_rng(0)
    old = rng.normal(-1, 0.3, (4, 6)).astype(np.float32)
    roll = old + rng.normal(0, 0.3, (4, 6)).astype(np.float32)
    mask = np.ones((4, 6), np.float32)
    mask[3, 2:] = 0
    cfg = {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.05}
    batch, metrics = ns["rollout_correction"](_Proto(old_log_probs=old, rollout_log_probs=roll, response_mask=mask), cfg)
    w, m, met = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg)
    np.testing.assert_array_equal(batch.batch["response_mask"], m)
    np.testing.assert_array_equal(batch.batch["rollout_is_weights"], w)
    assert metrics == met and batch.batch["response_mask"].dtype == np.float32
    w2, m2, _ = ns["vllm_is_correction"](old, roll, mask, cap=2.0)
    ratio = np.minimum(np.exp(old.astype(np.float64) - roll), 2.0) * mask
    np.testing.assert_allclose(w2, ratio, rtol=1e-6)


# ---- docs/RECIPES.md: every block, as written, on stand-ins for the frameworks' objects ----


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Logprob:
    """vLLM's Logprob: `logprob` and `rank`."""

    def __init__(self, logprob, rank):
        self.logprob, self.rank = logprob, rank


def _recipe_inputs(torch, tmp_path):
    """The objects each recipe block reads: a verl DataProto, TRL's inputs dict, a prime-rl
    micro-batch, SkyRL's TrainingInputBatch, slime's rollout data, vLLM's outputs."""
    rng = np.random.default_rng(3)
    b, t = 6, 40
    old = -np.abs(rng.normal(1.0, 0.5, (b, t))).astype(np.float32)
    roll = np.minimum(old + rng.normal(0, 0.02, (b, t)).astype(np.float32), -1e-4)
    mask = np.ones((b, t), np.float32)
    mask[2, 25:] = 0
    ids = rng.integers(0, 1000, (b, t))
    adv = rng.normal(0, 1, (b, t)).astype(np.float32)
    T = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    verl = _Proto(old_log_probs=T(old), rollout_log_probs=T(roll), response_mask=T(mask), responses=T(ids), advantages=T(adv))
    trl = {"old_per_token_logps": T(old), "sampling_per_token_logps": T(roll), "completion_mask": T(mask).long(),
           "completion_ids": T(ids), "advantages": T(adv[:, 0])}
    n = int(mask.sum())
    flat = mask.ravel() > 0
    pos = np.concatenate([np.arange(int(r.sum())) for r in mask])
    micro = {"position_ids": T(pos[None]), "inference_logprobs": T(roll.ravel()[flat][None]),
             "loss_mask": T(np.ones((1, n), bool))}
    skyrl = {"action_log_probs": T(old), "rollout_logprobs": T(roll), "loss_mask": T(mask), "advantages": T(adv)}
    slime = {"log_probs": [T(old[i, : int(mask[i].sum())]) for i in range(b)],
             "rollout_log_probs": [T(roll[i, : int(mask[i].sum())]) for i in range(b)],
             "loss_masks": [T(np.ones(int(mask[i].sum()), np.int64)) for i in range(b)],
             "advantages": [T(adv[i, : int(mask[i].sum())]) for i in range(b)]}
    outs = []
    for i in range(2):
        toks = list(rng.integers(0, 50, 5))
        lps = []
        for y in toks:
            d = {int(y): _Logprob(-0.1, 1)}
            for r, k in enumerate(range(60, 64)):
                d[k] = _Logprob(-1.0 - r, r + 2)
            lps.append(d)
        outs.append(_Obj(outputs=[_Obj(token_ids=toks, logprobs=lps)]))
    # the trainer's log-probs of the vLLM responses, [2, 5] as the rollout file pads them
    vllm_old = -np.abs(rng.normal(0.1, 0.05, (2, 5))).astype(np.float32)
    return dict(
        batch=verl, out_dir=str(tmp_path), step=3, inputs=trl,
        self=_Obj(state=_Obj(global_step=3)), micro_batch=micro,
        trainer_logprobs=T(old.ravel()[flat][None]), training_input=skyrl, rollout_data=slime,
        outputs=outs, old_log_prob=T(vllm_old),
    )


def _fake_frameworks(monkeypatch, torch, step_dict):
    """`transformers.TrainerCallback` (the event methods' signature, `(self, args, state,
    control, **kwargs)`) and `trl.GRPOTrainer` (its `_generate_and_score_completions` returning
    the step's dict, `state.global_step`), enough for the TRL recipe's classes."""
    import types

    tf = types.ModuleType("transformers")

    class TrainerCallback:
        def on_train_end(self, args, state, control, **kwargs):
            pass

        def on_step_end(self, args, state, control, **kwargs):
            pass

    tf.TrainerCallback = TrainerCallback
    trl = types.ModuleType("trl")

    class GRPOTrainer:
        def __init__(self):
            self.state = _Obj(global_step=0)

        def _generate_and_score_completions(self, inputs):
            return dict(step_dict)

    trl.GRPOTrainer = GRPOTrainer
    monkeypatch.setitem(sys.modules, "transformers", tf)
    monkeypatch.setitem(sys.modules, "trl", trl)


def test_recipes_md_blocks_run(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    import warnings

    import verl_config
    from test_trainer import verl_classes

    _, RCC, yaml = verl_classes()
    codes = blocks("docs/RECIPES.md")
    assert len(codes) == 11
    ns = _recipe_inputs(torch, tmp_path)
    _fake_frameworks(monkeypatch, torch, ns["inputs"])
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dumps = []
        dump = tmp_path / "step3.safetensors"
        for c in codes:
            exec(compile(c, "docs/RECIPES.md", "exec"), ns)
            # each dump: a file trmask analyze reads under the framework's names
            if dump.exists():
                r = trmask.analyze(str(dump))
                dumps.append(r["notes"])
                assert "rollout_corr/log_ppl_diff" in r["metrics"]
                dump.unlink()
        assert len(dumps) == 6  # verl, TRL, prime-rl, SkyRL, slime, vLLM's rollout + the trainer
        assert (tmp_path / "rollout3.safetensors").exists()  # vLLM's top-K, the rollout side
        # verl: the Monitor with verl's own config object, on the DataProto
        cfg = RCC(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_max_k2", rollout_rs_threshold=2.5)
        mon = ns["make_monitor"](cfg, log_dir=str(tmp_path / "verl_logs"))
        batch = ns["batch"]
        want = trmask.compute_rollout_correction_and_rejection_mask(
            batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["response_mask"], config=cfg
        )
        out, metrics = ns["rollout_correction_logged"](mon, batch, 7)
        mon.close()
        assert torch.equal(out.batch["rollout_is_weights"], want[0]) and torch.equal(out.batch["response_mask"], want[1])
        for k, v in want[2].items():  # the full path's metrics: equal to 1e-12
            assert metrics[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k
        assert (tmp_path / "verl_logs" / "trend.html").exists()
        # TRL: the subclass puts trmask's weights and mask into the step's dict
        trainer = ns["TrmaskGRPOTrainer"]()
        trainer.trmask_monitor = trmask.Monitor(str(tmp_path / "trl_logs"), rollout_is="token", rollout_is_threshold=2.0)
        cb = ns["TrmaskCallback"](trainer.trmask_monitor)
        assert isinstance(cb, sys.modules["transformers"].TrainerCallback)
        step = trainer._generate_and_score_completions({})
        i = ns["inputs"]
        w = trmask.compute_rollout_correction_and_rejection_mask(i["old_per_token_logps"], i["sampling_per_token_logps"], i["completion_mask"], rollout_is="token", rollout_is_threshold=2.0)[0]
        assert torch.equal(step["importance_sampling_ratio"], w)
        cb.on_train_end(args=None, state=trainer.state, control=None, model=None)
        assert (tmp_path / "trl_logs" / "report.html").exists()
        # prime-rl: one sample's keep mask
        li = _Obj(trainer_logprobs=torch.tensor([-1.0, -0.5, -2.0]), inference_logprobs=torch.tensor([-1.0, -0.4, -9.0]), loss_mask=torch.tensor([True, True, True]))
        w, keep, _ = ns["trm_keep"](li, rollout_rs_threshold=0.5)
        assert keep.tolist() == [False, False, False] and w.shape == (3,)
        # SkyRL: its hook's signature, trmask's config as an OmegaConf DictConfig
        omegaconf = pytest.importorskip("omegaconf")
        opc = omegaconf.OmegaConf.create({"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.001})
        s = ns["training_input"]
        loss = torch.ones_like(s["action_log_probs"])
        new_loss, new_mask, m = ns["apply_off_policy_correction"](loss, s["action_log_probs"], s["rollout_logprobs"], s["loss_mask"], opc)
        w, mk, _ = trmask.compute_rollout_correction_and_rejection_mask(s["action_log_probs"], s["rollout_logprobs"], s["loss_mask"], config=dict(opc))
        assert torch.equal(new_loss, w) and torch.equal(new_mask, mk)
        assert ns["apply_off_policy_correction"](loss, s["action_log_probs"], None, s["loss_mask"], opc)[2] == {}
