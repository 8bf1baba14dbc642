"""Sample adapter throughput and the split distortion it removes (issue #6).

1,024 rollouts (`--rollouts`) of 20 calls (prompts extend the previous call: 2,000-token observations,
300-token responses; 10% with an interleaved sub-agent chain and a summarized context) through
`adapters.build_batch` in trajectory mode, on one core. Throughput counts the batch's tokens
(sum of sample lengths). Baseline in the same run: one bare `np.concatenate` of the same output
tokens, the memory-copy floor any adapter pays once per output array.

Then two rollouts with the same calls' token counts, one merged into 1 sample and one split
into 5 by context rewrites: the ratio of the total loss weight each receives, sample-level
(`seq-mean-token-mean`) vs rollout-level (should be exactly 1).

Last line: adapter_mtok_per_s=A split_weight_ratio_sample_level=B split_weight_ratio_rollout_level=C
"""

from __future__ import annotations

import argparse
import gc
import time
from array import array

import numpy as np

from adapters import AdapterSettings, build_batch
from agl.types import Call, Mode, Rollout, Status
from bench.quick import parse_args

CALLS = 20
OBS = 2000
RESP = 300
GROUP = 8
SUB_AT = (6, 8, 10, 12)  # call positions of the sub-agent in rollouts that have one
SUMMARY_AT = 14  # main call whose context is summarized
rng = np.random.default_rng(0)


def _call(rid: str, seq: int, agent: str, prompt: np.ndarray, response: np.ndarray) -> Call:
    logprobs = -rng.random(len(response), dtype=np.float32)
    return Call(
        rollout_id=rid,
        prompt_ids=array("i", prompt.tobytes()),
        response_ids=array("i", response.tobytes()),
        logprobs=array("f", logprobs.tobytes()),
        seq=seq,
        agent=agent,
        model_version=3,
    )


def tokens(n: int) -> np.ndarray:
    return rng.integers(0, 150_000, n, dtype=np.int32)


def make_rollout(i: int, with_sub: bool) -> tuple[Rollout, list[Call]]:
    rid = f"r{i}"
    chains = {"main": tokens(OBS), "sub": tokens(OBS)}
    calls = []
    for seq in range(CALLS):
        agent = "sub" if with_sub and seq in SUB_AT else "main"
        seqn = chains[agent]
        if with_sub and seq == SUMMARY_AT:
            seqn = np.concatenate([seqn[:500], tokens(OBS - 500)])  # summarized context
        elif seq:
            seqn = np.concatenate([seqn, tokens(OBS)])
        response = tokens(RESP)
        calls.append(_call(rid, seq, agent, seqn, response))
        chains[agent] = np.concatenate([seqn, response])
    reward = float(rng.integers(0, 2))
    rollout = Rollout(rid, {}, f"g{i // GROUP}", Mode.TRAIN, Status.SUCCEEDED, reward=reward)
    return rollout, calls


def split_ratio(loss_mode: str) -> float:
    """Total weight of a rollout split into 5 samples over that of one merged into 1."""
    rollouts, calls = [], {}
    for rid, reward, split in (("one", 1.0, False), ("five", 0.0, True)):
        seqn, rcalls = rng.integers(0, 1000, 100, dtype=np.int32), []
        for seq in range(5):
            if split and seq:
                # context rewritten
                seqn = rng.integers(1000, 2000, len(seqn) + 100, dtype=np.int32)
            elif seq:
                seqn = np.concatenate([seqn, rng.integers(0, 1000, 100, dtype=np.int32)])
            response = rng.integers(0, 1000, 30, dtype=np.int32)
            rcalls.append(_call(rid, seq, "main", seqn, response))
            seqn = np.concatenate([seqn, response])
        calls[rid] = rcalls
        rollouts.append(Rollout(rid, {}, "g", Mode.TRAIN, Status.SUCCEEDED, reward=reward))
    batch = build_batch(rollouts, calls, AdapterSettings(loss_mode=loss_mode))  # type: ignore[arg-type]
    assert batch.metrics["samples"] == 6, batch.metrics
    token_rollout = np.repeat(batch.sample_rollout, np.diff(batch.offsets))
    weight = np.bincount(token_rollout, weights=batch.loss_weights)
    one, five = batch.rollout_ids.index("one"), batch.rollout_ids.index("five")
    return float(weight[five] / weight[one])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1024, help="rollouts in the batch")
    rollout_count = parse_args(parser, rollouts=64).rollouts
    t0 = time.perf_counter()
    data = [make_rollout(i, with_sub=i % 10 == 0) for i in range(rollout_count)]
    rollouts = [r for r, _ in data]
    calls = {r.id: c for r, c in data}
    del data
    call_tokens = sum(len(c.prompt_ids) + len(c.response_ids) for cs in calls.values() for c in cs)
    print(
        f"generated {rollout_count} rollouts, {call_tokens / 1e6:.0f}M call tokens "
        f"in {time.perf_counter() - t0:.1f}s"
    )

    settings = AdapterSettings(max_length=65_536, dp_size=8, minibatch_rollouts=rollout_count // 4)
    best = float("inf")
    for _ in range(5):
        gc.collect()
        t = time.perf_counter()
        batch = build_batch(rollouts, calls, settings, version=3)
        best = min(best, time.perf_counter() - t)
        batch_tokens, metrics = len(batch.input_ids), batch.metrics
        del batch
    # Baseline: one np.concatenate of each rollout's last prompt (about as many tokens as the batch):
    # the memory-copy floor of writing a single output array.
    ends = [np.frombuffer(c.prompt_ids, np.int32) for cs in calls.values() for c in cs[-1:]]
    base = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        copied = len(np.concatenate(ends))
        base = min(base, time.perf_counter() - t)
    keys = (
        "samples",
        "samples_per_rollout",
        "merge_rate",
        "mismatch_new_chain",
        "mismatch_rewritten",
        "mismatch_overflow",
        "padding_samples",
    )
    print("metrics:", {k: round(float(metrics[k]), 3) for k in keys})
    adapter = batch_tokens / best / 1e6
    baseline = copied / base / 1e6
    print(
        f"adapter: {batch_tokens / 1e6:.1f}M batch tokens in {best:.2f}s = {adapter:.1f}M tok/s "
        f"({call_tokens / best / 1e6:.0f}M call tok/s); baseline concatenate: {baseline:.0f}M tok/s, "
        f"adapter/baseline = {adapter / baseline:.3f}"
    )
    sample, rollout = split_ratio("seq-mean-token-mean"), split_ratio("rollout")
    print(f"token-mean ratio (equal trained tokens): {split_ratio('token-mean'):.3f}")
    print(
        f"adapter_mtok_per_s={adapter:.1f} split_weight_ratio_sample_level={sample:.3f} "
        f"split_weight_ratio_rollout_level={rollout:.3f}"
    )


if __name__ == "__main__":
    main()
