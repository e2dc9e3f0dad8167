"""Fake framework objects for docs/RECIPES.md: the same keys, shapes and methods the
snippets touch, filled with random data. Each `setup_<name>()` returns the globals a recipe
runs in; `finish_<name>` (when present) completes the file for `trmask analyze`."""
import types
import numpy as np

rng = np.random.default_rng(0)
B, T = 4, 12


class FakeTensor:
    def __init__(self, a):
        self.a = np.asarray(a)

    def detach(self):
        return self

    def cpu(self):
        return self

    def float(self):
        return FakeTensor(self.a.astype(np.float32))

    def is_floating_point(self):
        return self.a.dtype.kind == "f"

    def numpy(self):
        return self.a

    @property
    def shape(self):
        return self.a.shape


class Keys(dict):
    """TensorDict-like: `keys()`, `[k]`, `in`."""


def padded():
    lens = rng.integers(3, T + 1, size=B)
    mask = (np.arange(T)[None, :] < lens[:, None]).astype(np.int64)
    roll = rng.uniform(-4, -0.01, size=(B, T))
    old = roll + rng.normal(0, 0.05, size=(B, T))
    ids = rng.integers(0, 1000, size=(B, T))
    adv = np.repeat(rng.normal(size=(B, 1)), T, axis=1) * mask
    return mask, roll, old, ids, adv


def base(out_dir):
    return {"out_dir": out_dir, "step": 3, "np": np}


def setup_verl(out_dir):
    mask, roll, old, ids, adv = padded()
    batch = types.SimpleNamespace(batch=Keys(
        old_log_probs=FakeTensor(old), rollout_log_probs=FakeTensor(roll),
        response_mask=FakeTensor(mask), responses=FakeTensor(ids), advantages=FakeTensor(adv)))
    return dict(base(out_dir), batch=batch)


def setup_trl(out_dir):
    mask, roll, old, ids, adv = padded()
    inputs = {"old_per_token_logps": FakeTensor(old), "sampling_per_token_logps": FakeTensor(roll),
              "completion_mask": FakeTensor(mask), "completion_ids": FakeTensor(ids),
              "advantages": FakeTensor(adv[:, 0]), "prompt_ids": FakeTensor(ids)}
    me = types.SimpleNamespace(state=types.SimpleNamespace(global_step=3))
    return dict(base(out_dir), inputs=inputs, self=me)


def setup_prime_rl(out_dir):
    lens = [5, 9, 7]
    S = sum(lens)
    pos = np.concatenate([np.arange(n) for n in lens])[None, :]
    roll = rng.uniform(-4, -0.01, size=(1, S))
    micro = {"position_ids": FakeTensor(pos), "inference_logprobs": FakeTensor(roll),
             "loss_mask": FakeTensor((pos >= 2).astype(bool)),
             "input_ids": FakeTensor(rng.integers(0, 1000, size=(1, S)))}
    return dict(base(out_dir), micro_batch=micro,
                trainer_logprobs=FakeTensor(roll + rng.normal(0, 0.05, size=(1, S))))


def setup_skyrl(out_dir):
    mask, roll, old, ids, adv = padded()
    ti = Keys(action_log_probs=FakeTensor(old), rollout_logprobs=FakeTensor(roll),
              loss_mask=FakeTensor(mask), advantages=FakeTensor(adv), response_mask=FakeTensor(mask))
    return dict(base(out_dir), training_input=ti)


def setup_slime(out_dir):
    lens = [4, 9, 6]
    data = {"log_probs": [], "rollout_log_probs": [], "loss_masks": [], "advantages": []}
    for n in lens:
        r = rng.uniform(-4, -0.01, size=n)
        data["rollout_log_probs"].append(FakeTensor(r))
        data["log_probs"].append(FakeTensor(r + rng.normal(0, 0.05, size=n)))
        data["loss_masks"].append(FakeTensor(np.ones(n, np.int64)))
        data["advantages"].append(FakeTensor(np.full(n, rng.normal())))
    return dict(base(out_dir), rollout_data=data)


def setup_vllm(out_dir):
    outputs = []
    lens = [5, 8]
    old = np.zeros((len(lens), max(lens)))
    for i, n in enumerate(lens):
        c = types.SimpleNamespace(token_ids=[], logprobs=[])
        for t in range(n):
            lp = np.log(rng.dirichlet(np.ones(50)))
            order = np.argsort(-lp)
            y = int(rng.integers(0, 50))
            d = {int(k): types.SimpleNamespace(logprob=float(lp[k]), rank=r + 1)
                 for r, k in enumerate(order[:4])}
            d.setdefault(y, types.SimpleNamespace(logprob=float(lp[y]), rank=int(np.where(order == y)[0][0]) + 1))
            c.token_ids.append(y)
            c.logprobs.append(d)
            # the trainer's recompute of the sampled token: the engine's log-prob plus noise
            old[i, t] = lp[y] + rng.normal(0, 0.05)
        outputs.append(types.SimpleNamespace(outputs=[c]))
    return dict(base(out_dir), outputs=outputs, old_log_prob=FakeTensor(old))
