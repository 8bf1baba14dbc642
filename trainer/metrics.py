"""A training step's metrics and the run's progress output (docs/reference/metrics.md).

- `step_metrics`: a step's figures from its batch: the adapter's counts, rewards, lengths,
  staleness, pace and calls per agent.
- `Pace`: the seconds between steps.
- `Progress`: the progress bar, with a line per step and per validation round under it.
- Metric names are read by docs/reference/metrics.md and by bench/: renaming one changes them.
- It keeps no history (the loop's `TrainerState` does) and logs to no tracker.
"""

import time
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from tqdm import tqdm

from adapters import AdapterSettings, Batch
from agl.types import Call, Rollout


def mean(values: Sequence[float]) -> float:
    """The values' mean; 0.0 when there are none."""
    if not values:
        return 0.0
    return float(np.mean(values))


class Pace:
    """The seconds between steps: each `lap` is the time since the previous one (the first: since
    the run began)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def lap(self) -> float:
        """Seconds since the previous lap; a new lap starts."""
        now = time.monotonic()
        elapsed = now - self.last
        self.last = now
        return elapsed


def step_metrics(
    rollouts: Sequence[Rollout],
    calls: Mapping[str, Sequence[Call]],
    batch: Batch,
    settings: AdapterSettings,
    *,
    base: int,
    version: int,
    elapsed: float,
) -> dict[str, float]:
    """The adapter's metrics, and the batch's rewards, lengths, staleness (against `base`, the
    version trained against) and pace over the `elapsed` seconds since the last step."""
    rewards = [r.reward or 0.0 for r in rollouts]
    staleness = [base - min((c.model_version for c in calls[r.id]), default=base) for r in rollouts]
    lengths = [len(c.response_ids) for cs in calls.values() for c in cs]
    metrics = {f"adapter/{k}": float(v) for k, v in batch.metrics.items()}
    if batch.loss_mask.any():  # the behaviour policy's entropy, estimated from what it sampled
        metrics["rollout/sampled_entropy"] = -float(batch.logprobs[batch.loss_mask].mean())
    calls_per_rollout = 0.0
    if rollouts:
        calls_per_rollout = len(lengths) / len(rollouts)
    metrics |= {
        "reward/mean": mean(rewards),
        "response_length/mean": mean(lengths),
        "rollout/calls_per_rollout": calls_per_rollout,
        "staleness/mean": mean(staleness),
        "staleness/max": float(max(staleness, default=0)),
        "rollout/calls_per_s": len(lengths) / max(elapsed, 1e-9),
        "timing/step_s": elapsed,
        "version": float(version),
    }
    metrics |= calls_per_agent(calls, settings)
    return metrics | {
        f"staleness/count_{k}": float(staleness.count(k)) for k in sorted(set(staleness))
    }


def calls_per_agent(
    calls: Mapping[str, Sequence[Call]], settings: AdapterSettings
) -> dict[str, float]:
    """The calls of each agent: `calls/NAME/trained` when the adapter trains NAME's calls
    (`agl.trained_agents`), else `calls/NAME/untrained`."""
    per_agent = Counter((c.agent, settings.trains(c.agent)) for cs in calls.values() for c in cs)
    return {
        f"calls/{agent}/{'trained' if trained else 'untrained'}": float(n)
        for (agent, trained), n in per_agent.items()
    }


class Progress:
    """The progress bar over a run's `steps`, and a line under it per step and validation round."""

    def __init__(self, steps: int) -> None:
        self.bar = tqdm(total=steps, desc="train", unit="step", dynamic_ncols=True)

    def at(self, step: int) -> None:
        """The bar moved to `step` (a restored run's, or the last one trained)."""
        self.bar.update(step - self.bar.n)

    def step(self, step: int, m: Mapping[str, float]) -> None:
        """The step's line under the progress bar, and the bar moved on."""
        self.at(step)
        shown = {
            "reward": m["reward/mean"],
            "stale": m["staleness/mean"],
            "calls/s": m["rollout/calls_per_s"],
        }
        self.bar.set_postfix({k: f"{v:.2f}" for k, v in shown.items()})
        learned = ""
        update = "(no samples: no update)"
        if "timing/update_s" in m:
            learned = f"entropy {m['actor/entropy']:.3f}, kl {m['actor/kl_k3']:.4f}, "
            learned += f"grad norm {m['actor/grad_norm']:.2f}, "
            update = f"(update {m['timing/update_s']:.1f} s)"
        self.bar.write(
            f"step {step}: reward {m['reward/mean']:.3f} "
            f"over {int(m['adapter/rollouts'])} rollouts "
            f"({m['adapter/degenerate_rate']:.0%} of groups degenerate), {learned}"
            f"staleness mean {m['staleness/mean']:.2f} max {int(m['staleness/max'])}, "
            f"{m['rollout/calls_per_s']:.1f} calls/s, step {m['timing/step_s']:.1f} s {update}"
        )

    def validation(self, step: int, version: int, reward: float, rollouts: int) -> None:
        """A validation round's line."""
        self.bar.write(
            f"validation at step {step} (version {version}): reward {reward:.3f} "
            f"({rollouts} rollouts)"
        )

    def close(self) -> None:
        self.bar.close()
