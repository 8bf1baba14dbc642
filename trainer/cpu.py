"""The CPU backend: one process, a transformers model and AdamW, weights pushed through disk.

Does what verl's actor does on GPUs, in the same order and with the same loss from verl's
registry: reference log-probs when the KL loss is on, old log-probs of the whole batch under
the current weights, then per mini-batch (whole rollouts, from the adapter) forward/backward
over token-budgeted micro-batches with the `agl` loss plus KL and entropy terms summed,
gradient clipping and one optimizer step; the learning rate warms up linearly over verl's
`lr_warmup_steps`. Log-probs are computed only
at trained positions (the LM head over a 49k vocabulary is most of the cost otherwise). The
engine it feeds is the embedded one (`agl engine`): sleep and wake are sglang's
release/resume calls, a push is `update_weights_from_disk`. No data parallelism.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import torch
import transformers
from omegaconf import DictConfig
from transformers import AutoModelForCausalLM
from verl import DataProto
from verl.trainer.ppo.core_algos import get_policy_loss_fn

from adapters import Batch
from trainer.config import LOSS, AglConfig, warmup_steps
from trainer.loss import regularizers, set_old_log_probs, to_dataproto

log = logging.getLogger(__name__)


class CpuBackend:
    """Trains `model_path` in this process and serves each new version from the engine at `agl.engine`."""

    dp_size = 1

    def __init__(self, cfg: DictConfig, agl: AglConfig, model_path: str) -> None:
        self.actor, self.agl = cfg.actor_rollout_ref.actor, agl
        torch.manual_seed(agl.seed)
        transformers.utils.logging.disable_progress_bar()  # one bar per save otherwise
        self.model = _load(model_path).train()
        # the reference policy of the KL loss: the weights training started from, frozen
        self.ref = _load(model_path).eval().requires_grad_(False) if self.actor.use_kl_loss else None
        optim = self.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
        )
        warmup = warmup_steps(optim)  # linear warm-up over the first updates, then constant
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: min(1.0, (k + 1) / (warmup + 1)))
        self.loss = get_policy_loss_fn(LOSS)
        self.engine = httpx.Client(base_url=agl.engine, timeout=600)
        self.weights = Path(cfg.trainer.default_local_dir) / "weights"  # pushed between checkpoints

    # ------------------------------------------------------------------ the engine

    def _engine(self, path: str, body: dict[str, Any] | None = None) -> None:
        reply = self.engine.post(path, json=body or {})
        if reply.status_code != 200 or reply.json().get("success") is False:
            raise RuntimeError(f"engine {path}: {reply.status_code} {reply.text[:300]}")

    def sleep(self) -> None:
        self._engine("/release_memory_occupation")

    def push(self, path: Path | None, version: int) -> None:
        """Serve the weights saved at `path` (else saved now) as `version`; loaded by the engine on wake."""
        if path is None:
            path = self.weights / f"v{version}"
            self.model.save_pretrained(path / "model")
            for old in self.weights.glob("v*"):
                if old != path and old.name != f"v{version - 1}":  # the engine may still serve the previous one
                    shutil.rmtree(old, ignore_errors=True)
        self._engine("/update_weights_from_disk", {"model_path": str(path / "model"), "weight_version": str(version)})

    def wake(self) -> None:
        self._engine("/resume_memory_occupation")

    def endpoints(self) -> list[str]:
        return [self.agl.engine]

    # ------------------------------------------------------------------ training

    def _micro_batches(self, rows: list[int], lengths: torch.Tensor) -> list[list[int]]:
        """Rows by length, cut into runs whose padded size stays within the token budget."""
        rows = sorted(rows, key=lambda r: int(lengths[r]))
        out: list[list[int]] = [[]]
        for r in rows:
            if out[-1] and (len(out[-1]) + 1) * int(lengths[r]) > self.agl.micro_batch_tokens:
                out.append([])
            out[-1].append(r)
        return [m for m in out if m]

    def _forward(
        self, model: Any, data: DataProto, rows: list[int], entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(len(rows), R) log-probs of the response tokens at trained positions (0 elsewhere), at the
        trained temperature, and with `entropy` the policy's entropy there (differentiable)."""
        b = data.batch
        idx = torch.tensor(rows)
        attention = b["attention_mask"][idx]
        P, R = b["prompts"].shape[1], b["responses"].shape[1]
        used = attention.nonzero()[:, 1]
        lo, hi = int(used.min()), int(used.max()) + 1  # trim columns that are padding in every row
        hidden = model.get_decoder()(
            input_ids=b["input_ids"][idx, lo:hi],
            attention_mask=attention[:, lo:hi],
            position_ids=b["position_ids"][idx, lo:hi],
            use_cache=False,
        ).last_hidden_state
        mask = b["response_mask"][idx].bool()
        where = mask.nonzero()
        # the state before response token j (column P + j) predicts it
        states = hidden[where[:, 0], P + where[:, 1] - 1 - lo]
        logits = model.get_output_embeddings()(states).float() / data.meta_info["temperature"]
        targets = b["responses"][idx][where[:, 0], where[:, 1]]
        log_z = logits.logsumexp(-1)
        out = torch.zeros(len(rows), R, dtype=torch.float32)
        out[where[:, 0], where[:, 1]] = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
        if not entropy:
            return out, None
        with torch.set_grad_enabled(torch.is_grad_enabled() and bool(self.actor.entropy_coeff)):
            h = log_z - (logits.softmax(-1) * logits).sum(-1)
        ent = torch.zeros(len(rows), R, dtype=torch.float32)
        ent[where[:, 0], where[:, 1]] = h
        return out, ent

    def _all(self, model: Any, data: DataProto, lengths: torch.Tensor) -> torch.Tensor:
        """Log-probs of the whole batch under `model`, without gradients."""
        out = torch.zeros_like(data.batch["rollout_log_probs"])
        with torch.no_grad():
            for rows in self._micro_batches(list(range(len(out))), lengths):
                out[rows] = self._forward(model, data, rows)[0]
        return out

    def update(self, batch: Batch) -> dict[str, float]:
        """One training step on `batch`: `ppo_epochs` passes, one optimizer step per mini-batch,
        then one more forward to measure how far the step moved the policy (`actor/kl_k3`)."""
        started = time.monotonic()
        torch.set_num_threads(self.agl.threads or os.cpu_count() or 1)  # the engine sleeps meanwhile
        data = to_dataproto(batch, temperature=self.agl.temperature, pad_token_id=0)
        b = data.batch
        lengths = b["attention_mask"].sum(-1)
        trained = b["response_mask"].bool()
        n_mb, epochs = int(b["minibatch"].max()) + 1, int(self.actor.ppo_epochs)
        minibatches = [torch.nonzero(b["minibatch"] == m).flatten().tolist() for m in range(n_mb)]
        if self.ref is not None:
            b["ref_log_prob"] = self._all(self.ref, data, lengths)
        reuse = n_mb == 1 and epochs == 1  # the only forward runs on the old weights: reuse its log-probs
        if not reuse:
            set_old_log_probs(data, self._all(self.model, data, lengths), self.agl.is_cap)
        sums: dict[str, float] = defaultdict(float)  # sums over optimizer steps, or over tokens, averaged below
        lr = self.scheduler.get_last_lr()[0]
        entropy = 0.0
        for _ in range(epochs):
            for rows in minibatches:
                for micro in self._micro_batches(rows, lengths):
                    log_prob, ent = self._forward(self.model, data, micro, entropy=True)
                    if reuse:
                        set_old_log_probs(data, log_prob.detach(), self.agl.is_cap, micro)
                    weights = b["loss_weights"][micro] * trained[micro]
                    loss, info = self.loss(
                        old_log_prob=b["old_log_probs"][micro],
                        log_prob=log_prob,
                        advantages=b["advantages"][micro],
                        response_mask=b["response_mask"][micro],
                        loss_agg_mode="token-sum",
                        config=self.actor,
                        rollout_is_weights=b["rollout_is_weights"][micro],
                    )
                    extra, parts = regularizers(
                        self.actor, log_prob, weights, ent, b["ref_log_prob"][micro] if self.ref is not None else None
                    )
                    (loss + extra).backward()
                    n = int(trained[micro].sum())
                    for k, v in {"actor/pg_loss": float(loss.detach()), **parts}.items():
                        sums[k] += v
                    for k in ("actor/pg_clipfrac", "actor/ppo_kl"):
                        sums[k] += info[k] * n
                    entropy += float((ent.detach() * trained[micro]).sum())  # type: ignore[union-attr]
                sums["actor/grad_norm"] += float(
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.actor.optim.clip_grad)
                )
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        tokens, steps = max(int(trained.sum()), 1) * epochs, n_mb * epochs
        out = {k: v / (tokens if k in ("actor/pg_clipfrac", "actor/ppo_kl") else steps) for k, v in sums.items()}
        out["actor/entropy"] = entropy / tokens
        out["actor/lr"] = float(lr)
        tis = (b["rollout_is_weights"] / b["loss_weights"].clamp(min=1e-30))[trained]
        out["actor/tis_mean"], out["actor/tis_max"] = float(tis.mean()), float(tis.max())
        # k3 estimate of KL(behaviour || updated policy) on the batch's sampled tokens
        log_ratio = (self._all(self.model, data, lengths) - b["rollout_log_probs"])[trained].clamp(-20, 20)
        out["actor/kl_k3"] = float((log_ratio.exp() - 1 - log_ratio).mean())
        out["timing/update_s"] = time.monotonic() - started
        return out

    # ------------------------------------------------------------------ checkpoints

    def save(self, path: Path) -> None:
        """The model as a Hugging Face folder (`path/model`, what the engine loads), the optimizer and its schedule."""
        self.model.save_pretrained(path / "model")
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        torch.save(state, path / "optim.pt")

    def load(self, path: Path) -> None:
        self.model.load_state_dict(_load(path / "model").state_dict())
        state = torch.load(path / "optim.pt", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def close(self) -> None:
        self.engine.close()


def _load(path: str | Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
