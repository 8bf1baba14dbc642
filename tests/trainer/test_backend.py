"""The backend: verl's own workers (FSDP2 on verl's `cpu` platform, gloo) against a plain
reference.

Everything but the device is what runs on GPUs: verl 0.9.1's Ray worker group of `AglWorker`,
`compute_ref_log_prob`, `compute_log_prob`, `update_actor` with our loss, checkpoints, and the
weights gathered for the engine. The reference is a transformers model, one sample at a time,
unpadded, with the objective written out token by token and `torch.optim.AdamW`. No engine is
needed for an update (the engine URL is never called here). Besides the tiny Qwen2, a tiny model
of the GPU example's own architecture (Qwen3.5: an image-text model with a vision tower and
linear- and full-attention layers) checks the export, which only that architecture tells from
the base model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from adapters import AdapterSettings, build_batch
from tests.adapters.factory import chain, rollout
from trainer.config import ConfigError, load_config
from trainer.loss import to_dataproto

torch.set_num_threads(1)
pytestmark = pytest.mark.slow
DEMO = Path(__file__).resolve().parents[2] / "examples" / "calculator" / "train.yaml"
LR, TEMPERATURE, KL, ENTROPY = 1e-5, 0.7, 0.5, 0.01
EPS = 1e-4  # Adam's epsilon, large enough that weights whose gradient is ~0 move smoothly in it
EXACT = [  # no warm-up, no clipping, a live KL and entropy term: every part of the objective shows
    f"actor_rollout_ref.actor.optim.lr={LR}",
    f"+actor_rollout_ref.actor.optim.override_optimizer_config={{eps: {EPS}}}",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
    "actor_rollout_ref.actor.optim.clip_grad=1e9",
    f"actor_rollout_ref.actor.kl_loss_coef={KL}",
    f"actor_rollout_ref.actor.entropy_coeff={ENTROPY}",
    f"agl.temperature={TEMPERATURE}",
]


def backend(model: Path, tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    from trainer.backend import Backend

    common = [
        "agl.admin_key=k",
        "agl.engine=http://127.0.0.1:9",
        "agl.threads=1",
        f"trainer.default_local_dir={tmp_path}",
    ]
    path = f"actor_rollout_ref.model.path={model}"
    return Backend(*load_config(DEMO, [*common, path, *overrides]))


def weights(b, path: Path) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    b.wg.save_weights(str(path))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


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


def per_token(
    model: torch.nn.Module, batch, i: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample i on its own, unpadded, at TEMPERATURE: (trained mask, log p of its tokens, entropy
    before each)."""
    s, e = int(batch.offsets[i]), int(batch.offsets[i + 1])
    mask = torch.from_numpy(batch.loss_mask[s:e])
    ids = torch.from_numpy(batch.input_ids[s:e]).long()[None]
    logits = model(input_ids=ids).logits[0, :-1].float() / TEMPERATURE
    logits = torch.cat([torch.zeros(1, logits.shape[-1]), logits])
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[0, :, None]).squeeze(-1)
    return mask, logp, -(logp_all.exp() * logp_all).sum(-1)


def reference_step(  # type: ignore[no-untyped-def]
    model: torch.nn.Module, ref: torch.nn.Module, optimizer, batch, minibatch: int = 0
) -> float:
    """One AdamW step on the sum over the mini-batch's trained tokens of weight * (-tis * advantage
    * log p + KL * k3(log p, ref) - ENTROPY * entropy); returns the mean entropy of the trained
    tokens."""
    optimizer.zero_grad()
    entropies = []
    for i in [i for i in range(batch.n_samples) if batch.sample_minibatch[i] == minibatch]:
        s, e = int(batch.offsets[i]), int(batch.offsets[i + 1])
        mask, logp, entropy = per_token(model, batch, i)
        if not mask.any():
            continue
        logp, entropy = logp[mask], entropy[mask]
        with torch.no_grad():
            ref_logp = per_token(ref, batch, i)[1][mask]
        behaviour = torch.from_numpy(batch.logprobs[s:e])[mask]
        tis = torch.clamp(torch.exp(logp.detach() - behaviour), max=2.0)
        w = torch.from_numpy(batch.loss_weights[s:e])[mask]
        adv = torch.from_numpy(batch.advantages[s:e])[mask]
        k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        policy = -(w * tis * adv * logp).sum()
        (policy + KL * (w * k3).sum() - ENTROPY * (w * entropy).sum()).backward()
        entropies.append(entropy.detach())
    optimizer.step()
    return float(torch.cat(entropies).mean())


@pytest.mark.parametrize(
    "ranks, epochs, minibatch", [(1, 1, None), (2, 1, None), (1, 2, None), (2, 1, 3)]
)
def test_two_updates_through_verls_workers_equal_the_reference(
    tiny_path: Path,
    tmp_path: Path,
    ranks: int,
    epochs: int,
    minibatch: int | None,
) -> None:
    """The second update has the KL to the starting weights live (the first starts from them). One
    epoch over one mini-batch takes the old log-probs from the update's own forward pass; two
    epochs, or mini-batches of 3 of the 6 rollouts (2 optimizer steps an update, each on its
    rollouts' exact weights), compute them first (the ratio to them, about 1 at this learning
    rate, changes the steps by far less than the tolerance)."""
    b = backend(
        tiny_path,
        tmp_path,
        *EXACT,
        f"trainer.n_gpus_per_node={ranks}",
        f"actor_rollout_ref.actor.ppo_epochs={epochs}",
    )
    try:
        assert b.dp_size == ranks
        fp32 = {"dtype": torch.float32, "attn_implementation": "sdpa"}
        model = AutoModelForCausalLM.from_pretrained(tiny_path, **fp32)
        ref = AutoModelForCausalLM.from_pretrained(tiny_path, **fp32)
        start = {n: p.detach().clone() for n, p in model.state_dict().items()}
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=0.0)
        for seed in (4, 5):
            settings = AdapterSettings(dp_size=ranks, minibatch_rollouts=minibatch)
            batch = build_batch(*make_batch(model.config.vocab_size, seed), settings)
            steps = int(batch.sample_minibatch.max()) + 1
            assert steps == (2 if minibatch else 1)
            got = b.update(batch)
            entropies = [
                reference_step(model, ref, optimizer, batch, m)
                for m in range(steps)
                for _ in range(epochs)
            ]
            assert got["actor/optimizer_steps"] == steps * epochs
            # over several mini-batches verl's entropy metric is a mean of per-micro-batch means
            if steps == 1:
                mean = sum(entropies) / len(entropies)
                assert got["actor/entropy"] == pytest.approx(mean, rel=2e-3)
            assert got["timing/update_s"] > 0 and got["actor/tis_max"] <= 2.0
            assert "actor/pg_loss" in got
            assert not any(k.startswith("actor/actor/") for k in got)  # prefixed once
        served = weights(b, tmp_path / "weights")
    finally:
        b.close()
    for name, p in model.state_dict().items():
        moved, verl_moved = p - start[name], served[name] - start[name]
        assert moved.abs().max() > 0.1 * LR, name  # the updates moved every tensor
        # Adam moves each weight by about lr per step: the two agree to a small fraction of that
        assert (verl_moved - moved).abs().max() < 0.02 * LR, name


def test_the_demos_warm_up_starts_at_half_the_rate_and_a_checkpoint_resumes_exactly(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    """The demo's schedule: 0.5 lr on the first update (verl's constant schedule would give it 0),
    then lr. A checkpoint holds weights, optimizer and schedule: a backend loaded from it takes
    the same next step as the one that saved it."""
    no_clip = ["actor_rollout_ref.actor.optim.clip_grad=1e9", "agl.temperature=1.0"]
    first = backend(tiny_path, tmp_path / "a", *no_clip)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_path).config.vocab_size
    batches = [build_batch(*make_batch(vocab, seed), AdapterSettings()) for seed in (6, 7)]
    start = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
    try:
        first.update(batches[0])
        after_one = weights(first, tmp_path / "one")
        first.save(tmp_path / "ckpt")
        # what the engine loads on a resume
        assert (tmp_path / "ckpt" / "model" / "config.json").is_file()
        first.update(batches[1])
        want = weights(first, tmp_path / "two")
    finally:
        first.close()
    step = max(float((after_one[n] - start[n]).abs().max()) for n in start)
    # Adam's first step: about lr x warm-up factor per weight
    assert step == pytest.approx(0.5e-5, rel=0.02)
    second = backend(tiny_path, tmp_path / "b", *no_clip)
    try:
        second.load(tmp_path / "ckpt")
        second.update(batches[1])
        got = weights(second, tmp_path / "resumed")
    finally:
        second.close()
    assert all(torch.allclose(got[n], want[n], rtol=0, atol=1e-9) for n in want)


def test_more_ranks_than_the_machine_has_fail_at_once_naming_the_field(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.n_gpus_per_node"):
        backend(tiny_path, tmp_path, "trainer.n_gpus_per_node=64")


# the tiny tokenizer's ids, rounded up to 64; the vision tokens come after them
QWEN35_TEXT_VOCAB = 640
# Export against training, in log-probs (the trained tokens' log-softmax of the logits, at
# TEMPERATURE): the export rounds each weight to bf16 (8 significant bits: at most 0.4% of a
# weight, about 1e-4 here, against the update's 1e-3 per weight), which moved them by 2e-3 at most
# when measured; verl's forward (sequences packed, one batch) and transformers' (one sample at a
# time) differ by 6e-4 on equal weights.
EXPORT_TOLERANCE = 1e-2


@pytest.fixture(scope="session")
def tiny_qwen35_path(
    tiny_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """Qwen3.5-9B's architecture, shrunk: the image-text class (verl loads Qwen3.5 as one) with its
    vision tower, a linear-attention (GatedDeltaNet) and a full-attention layer, the tiny model's
    tokenizer, random weights from seed 0, saved in bf16 as Qwen3.5's checkpoints are. The four
    vision token ids are the vocabulary's last four, which `make_batch(QWEN35_TEXT_VOCAB)` never
    samples."""
    from transformers import AutoTokenizer, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    vocab = QWEN35_TEXT_VOCAB + 4
    assert len(tokenizer) <= QWEN35_TEXT_VOCAB
    text = {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "max_position_embeddings": 4096,
        # Qwen3.5's rotary layout (a quarter of each head, interleaved multimodal sections), sized
        # to 16-dim heads
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [1, 1, 0],
            "mrope_interleaved": True,
        },
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 4,
        "num_position_embeddings": 16,
        "out_hidden_size": 64,  # the text model's hidden size
    }
    config = Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        vision_start_token_id=vocab - 4,
        vision_end_token_id=vocab - 3,
        image_token_id=vocab - 2,
        video_token_id=vocab - 1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen35")
    Qwen3_5ForConditionalGeneration(config).to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def trained_log_probs(model: torch.nn.Module, batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The log-prob of every trained token of `batch` under `model`, in verl's order (sample by
    sample)."""
    with torch.no_grad():
        parts = []
        for i in range(batch.n_samples):
            mask, logp, _ = per_token(model, batch, i)
            parts.append(logp[mask])
    return torch.cat(parts)


def test_a_qwen35_export_is_the_trained_image_text_model_in_bf16(
    tiny_qwen35_path: Path,
    tmp_path: Path,
) -> None:
    """One update at lr 1e-3, then the export: Qwen3.5's own class (its causal-LM class is
    text-only and drops every `model.language_model.*` and `model.visual.*` weight), every key of
    the checkpoint, bf16 as its config says, and reloaded with transformers it gives the trained
    actor's log-probs (verl's forward after the update), which the update moved by far more than
    the tolerance."""
    from trainer.backend import _log_probs

    b = backend(tiny_qwen35_path, tmp_path, *EXACT, "actor_rollout_ref.actor.optim.lr=1e-3")
    batch = build_batch(*make_batch(QWEN35_TEXT_VOCAB, seed=4), AdapterSettings())
    data = to_dataproto(batch, temperature=TEMPERATURE)
    trained = data.batch["response_mask"].bool()
    try:
        before = _log_probs(b.wg.compute_log_prob, data)[trained]
        b.update(batch)
        after = _log_probs(b.wg.compute_log_prob, data)[trained]
        b.wg.save_weights(str(tmp_path / "export"))
    finally:
        b.close()
    assert json.loads((tmp_path / "export" / "config.json").read_text())["dtype"] == "bfloat16"
    base = load_file(tiny_qwen35_path / "model.safetensors")
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert exported.keys() == base.keys()
    assert all(t.dtype == torch.bfloat16 for t in exported.values())
    # text batches train no vision weight
    vision = [name for name in base if name.startswith("model.visual.")]
    assert vision and all(torch.equal(exported[n], base[n]) for n in vision)
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "export", dtype=torch.float32)
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    # the update shows in the log-probs
    assert float((after - before).abs().max()) > 10 * EXPORT_TOLERANCE
    assert float((trained_log_probs(model, batch) - after).abs().max()) < EXPORT_TOLERANCE
