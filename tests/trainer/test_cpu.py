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


def per_token(model: torch.nn.Module, batch, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample i on its own, unpadded: (trained mask, log p of its tokens, entropy of the distribution before each)."""
    s, e = int(batch.offsets[i]), int(batch.offsets[i + 1])
    mask = torch.from_numpy(batch.loss_mask[s:e])
    ids = torch.from_numpy(batch.input_ids[s:e]).long()[None]
    logits = torch.cat([torch.zeros(1, model.config.vocab_size), model(input_ids=ids).logits[0, :-1].float()])
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[0, :, None]).squeeze(-1)
    return mask, logp, -(logp_all.exp() * logp_all).sum(-1)


def reference_gradient(
    model: torch.nn.Module,
    batch,
    cap: float = 2.0,
    ref: torch.nn.Module | None = None,
    kl: float = 0.0,
    ent: float = 0.0,
) -> dict[str, torch.Tensor]:
    """The sum over trained tokens of weight * (-tis * advantage * log p + kl * k3(log p, ref) - ent * entropy),
    one sample at a time, unpadded."""
    model.zero_grad()
    for i in range(batch.n_samples):
        s, e = int(batch.offsets[i]), int(batch.offsets[i + 1])
        mask, logp, entropy = per_token(model, batch, i)
        if not mask.any():
            continue
        logp, entropy = logp[mask], entropy[mask]
        behaviour = torch.from_numpy(batch.logprobs[s:e])[mask]
        tis = torch.clamp(torch.exp(logp.detach() - behaviour), max=cap)
        w = torch.from_numpy(batch.loss_weights[s:e])[mask]
        adv = torch.from_numpy(batch.advantages[s:e])[mask]
        loss = -(w * tis * adv * logp).sum() - ent * (w * entropy).sum()
        if ref is not None:
            with torch.no_grad():
                ref_logp = per_token(ref, batch, i)[1][mask]
            loss = loss + kl * (w * (torch.exp(ref_logp - logp) - (ref_logp - logp) - 1)).sum()
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def captured_gradients(b: CpuBackend) -> list[dict[str, torch.Tensor]]:
    """The gradients each optimizer step is about to apply."""
    grads: list[dict[str, torch.Tensor]] = []
    b.optimizer.register_step_pre_hook(
        lambda *_: grads.append({n: p.grad.clone() for n, p in b.model.named_parameters()})
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
    b = backend(
        tiny_path, tmp_path, *overrides, "actor_rollout_ref.actor.optim.lr=0"
    )  # every epoch sees the same weights
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


def test_kl_to_the_starting_weights_and_the_entropy_bonus_add_their_weighted_gradients(
    tiny_path: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    kl, ent = "actor_rollout_ref.actor.kl_loss_coef=0.5", "actor_rollout_ref.actor.entropy_coeff=0.1"
    b = backend(tiny_path, tmp_path, "actor_rollout_ref.actor.optim.lr=0", kl, ent, "agl.micro_batch_tokens=40")
    assert b.ref is not None  # the demo's KL loss: k3 (low_var_kl) to the weights training started from
    with torch.no_grad():  # the policy has moved away from the reference
        g = torch.Generator().manual_seed(0)
        for p in b.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    moved = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="sdpa")
    moved.load_state_dict(b.model.state_dict())
    rollouts, calls = make_batch(b.model.config.vocab_size, seed=2)
    batch = build_batch(rollouts, calls, AdapterSettings())
    want = reference_gradient(moved, batch, ref=b.ref, kl=0.5, ent=0.1)
    without = reference_gradient(moved, batch)
    grads = captured_gradients(b)
    metrics = b.update(batch)
    for name, g in grads[0].items():
        assert torch.allclose(g, want[name], rtol=1e-4, atol=1e-6), name
    assert any(not torch.allclose(want[n], without[n], rtol=1e-3) for n in want)  # the terms mattered
    # the metrics: the policy's entropy and the KL loss are weighted means over trained tokens
    mask = torch.from_numpy(batch.loss_mask)
    entropies = torch.cat([per_token(moved, batch, i)[2] for i in range(batch.n_samples)]).detach()
    assert metrics["actor/entropy"] == pytest.approx(float(entropies[mask].mean()), rel=1e-4)
    assert metrics["actor/kl_loss"] > 0 and metrics["actor/entropy_loss"] > 0


def test_learning_rate_warms_up_and_kl_k3_measures_the_step(tiny_path: Path, tmp_path: Path) -> None:  # noqa: F811
    b = backend(tiny_path, tmp_path, "actor_rollout_ref.actor.optim.lr_warmup_steps=2")
    rollouts, calls = make_batch(b.model.config.vocab_size, seed=3)
    batch = build_batch(rollouts, calls, AdapterSettings())
    lrs = [b.update(batch)["actor/lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-5 / 3, 2e-5 / 3, 1e-5, 1e-5])
    # with lr 0 the policy stays: kl_k3 is then the k3 estimate of KL(behaviour || policy) on the batch
    still = backend(tiny_path, tmp_path, "actor_rollout_ref.actor.optim.lr=0")
    metrics = still.update(batch)
    mask = torch.from_numpy(batch.loss_mask)
    logp = torch.cat([per_token(still.model, batch, i)[1] for i in range(batch.n_samples)])[mask].detach()
    log_ratio = logp - torch.from_numpy(batch.logprobs)[mask]
    assert metrics["actor/kl_k3"] == pytest.approx(float((log_ratio.exp() - 1 - log_ratio).mean()), rel=1e-4)
    assert metrics["actor/tis_max"] <= 2.0 and metrics["actor/tis_max"] >= metrics["actor/tis_mean"]


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
    assert fresh.scheduler.last_epoch == b.scheduler.last_epoch == 1  # the warm-up goes on where it was
