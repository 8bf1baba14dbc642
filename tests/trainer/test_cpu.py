"""The CPU backend's update against a plain reference: same log-probs, same gradient.

No engine is needed for an update (the engine URL is never called here).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from adapters import AdapterSettings, build_batch
from tests.adapters.factory import chain, rollout
from tests.gateway.conftest import tiny_path  # noqa: F401  (session fixture)
from trainer.config import load_config
from trainer.cpu import CpuBackend

torch.set_num_threads(1)
DEMO = Path(__file__).resolve().parents[2] / "examples" / "calculator" / "train.yaml"


def backend(model: Path, tmp_path: Path, *overrides: str) -> CpuBackend:
    cfg, agl = load_config(
        DEMO,
        [
            *["agl.admin_key=k", "agl.engine=http://127.0.0.1:9", "agl.threads=1", "agl.temperature=1.0"],
            *["actor_rollout_ref.actor.optim.clip_grad=1e9", f"trainer.default_local_dir={tmp_path}", *overrides],
        ],
    )
    return CpuBackend(cfg, agl, str(model))


def make_batch(vocab: int, seed: int = 0) -> tuple:
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    calls, rollouts = {}, []
    for k in range(6):
        rid = f"r{k}"
        turns = [(ids(rng.randint(3, 9)), ids(rng.randint(2, 6))) for _ in range(rng.randint(1, 3))]
        calls[rid] = chain(rid, turns)
        rollouts.append(rollout(rid, group=f"g{k // 3}", reward=float(k % 3 == 0)))
    return rollouts, calls


def reference_gradient(model: torch.nn.Module, batch, cap: float = 2.0) -> dict[str, torch.Tensor]:
    """-sum over trained tokens of weight * tis * advantage * log p, one sample at a time, unpadded."""
    model.zero_grad()
    for i in range(batch.n_samples):
        s, e = int(batch.offsets[i]), int(batch.offsets[i + 1])
        mask = torch.from_numpy(batch.loss_mask[s:e])
        if not mask.any():
            continue
        ids = torch.from_numpy(batch.input_ids[s:e]).long()[None]
        logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        logp = torch.cat([torch.zeros(1), logp])[mask]
        behaviour = torch.from_numpy(batch.logprobs[s:e])[mask]
        tis = torch.clamp(torch.exp(logp.detach() - behaviour), max=cap)
        w = torch.from_numpy(batch.loss_weights[s:e])[mask] * tis
        adv = torch.from_numpy(batch.advantages[s:e])[mask]
        (-(w * adv * logp).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def captured_gradients(b: CpuBackend) -> list[dict[str, torch.Tensor]]:
    grads: list[dict[str, torch.Tensor]] = []
    b.optimizer.step = lambda *a, **k: grads.append(  # type: ignore[method-assign]
        {n: p.grad.clone() for n, p in b.model.named_parameters()}
    )
    return grads


@pytest.mark.parametrize(
    "overrides",
    [
        ["agl.micro_batch_tokens=100000"],  # one micro-batch; old log-probs reused from the forward
        ["agl.micro_batch_tokens=16"],  # a micro-batch per sample
        ["agl.micro_batch_tokens=40", "actor_rollout_ref.actor.ppo_epochs=2"],  # old log-probs in a pass of their own
    ],
)
def test_update_gradient_equals_the_reference(tiny_path: Path, tmp_path: Path, overrides: list[str]) -> None:  # noqa: F811
    b = backend(tiny_path, tmp_path, *overrides)
    reference = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="sdpa")
    rollouts, calls = make_batch(b.model.config.vocab_size)
    batch = build_batch(rollouts, calls, AdapterSettings(dp_size=4))
    assert batch.metrics["rollouts_trained"] == 6 and batch.metrics["padding_samples"] > 0
    want = reference_gradient(reference, batch)
    grads = captured_gradients(b)
    metrics = b.update(batch)
    assert len(grads) == int(b.actor.ppo_epochs)
    for name, g in grads[0].items():
        assert torch.allclose(g, want[name], rtol=1e-4, atol=1e-6), name
    assert metrics["actor/tis_mean"] > 0 and metrics["actor/pg_clipfrac"] == 0.0


def test_save_and_load_restore_model_and_optimizer(tiny_path: Path, tmp_path: Path) -> None:  # noqa: F811
    b = backend(tiny_path, tmp_path)
    rollouts, calls = make_batch(b.model.config.vocab_size, seed=1)
    b.update(build_batch(rollouts, calls, AdapterSettings()))
    b.save(tmp_path / "ckpt")
    fresh = backend(tiny_path, tmp_path)
    fresh.load(tmp_path / "ckpt")
    for (name, p), q in zip(b.model.named_parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    state, loaded = b.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert state.keys() == loaded.keys() and all(torch.equal(state[k]["exp_avg"], loaded[k]["exp_avg"]) for k in state)
