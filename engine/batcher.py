"""The embedded engine's model loop: one thread owns the model and batches requests dynamically.

Requests from any thread are queued (`submit`) and resolved through futures. Between decode
steps the thread admits waiting requests (continuous batching): new prompts are prefilled
together, left-padded, into their own KV cache (the HF `DynamicCache`), which is then merged into
the running batch; each step feeds one token per row with per-row positions; finished rows leave
the batch. Prefix cache: a finished request's keys and values are kept (LRU, bounded in tokens),
and a new prompt that starts with a kept sequence prefills only the rest, as sglang's radix cache
does. Agent calls gain most: each re-sends the conversation so far, and all share a system prompt.
Rows may then have padding in the middle (the attention mask covers it; positions are per row).
The cache is dropped whenever the weights change.

Control commands (release, resume, weight reload, flush) run only when no request is in flight,
and no request is admitted while one waits, so a request sees one set of weights from start to
end, like sglang's model-update lock.

Which distribution the logprobs come from (the trainer must recompute them): with T the request's
temperature, or 1 when it is 0 (greedy), a token's logprob is `log_softmax(logits / T)` at its
position, taken before top-k/top-p filtering, as sglang returns it. The token is the argmax when
the temperature is 0, else drawn from `softmax(logits / T)` restricted to the top-k tokens, then to
the top-p nucleus, renormalized, with the request's `seed` when given.

Scripted mode (a test facility): the engine answers with the given texts in order, tokenized and
closed by the end-of-turn token, and records the model's own logprobs of those tokens (teacher
forcing), so a real harness can run to completion against a tiny random model.

It does not speak HTTP, validate requests beyond what decoding needs, or load models from names.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from engine.models import load_model, load_tokenizer

log = logging.getLogger(__name__)
_STOP = object()


class EngineReleased(RuntimeError):
    """The weights are released (`/release_memory_occupation`); resume before generating."""


class ScriptExhausted(RuntimeError):
    """Scripted mode ran out of completions."""


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None


@dataclass(frozen=True)
class Result:
    output_ids: list[int]
    logprobs: list[float]
    finish: dict[str, Any]
    weight_version: str
    cached_tokens: int = 0


@dataclass(eq=False)
class Job:
    input_ids: list[int]
    sampling: Sampling
    cached: int = 0  # prompt tokens whose keys and values came from the prefix cache
    future: Future[Result] = field(default_factory=Future)
    cancelled: bool = False  # set from another thread when the client went away
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    generator: torch.Generator | None = None


class PrefixCache:
    """Keys and values of finished sequences (per layer, [heads, tokens, dim]), LRU, at most
    `max_tokens` tokens in all. A sequence that another kept one extends is dropped."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens, self.tokens = max_tokens, 0
        self._kept: OrderedDict[
            int, tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]
        ] = OrderedDict()
        self._serial = 0

    def longest(self, ids: list[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
        """The kept sequence sharing the longest prefix with `ids` and that length; the last
        prompt token is never taken from the cache, since its logits are needed."""
        query = torch.tensor(ids[:-1], dtype=torch.long)
        best: tuple[int, Any] = (0, None)
        for key, (kept, kv) in self._kept.items():
            n = min(len(query), len(kept))
            if n > best[0]:
                differ = (kept[:n] != query[:n]).nonzero()
                n = int(differ[0, 0]) if len(differ) else n
                if n > best[0]:
                    best = (n, (key, kv))
        if best[1] is None:
            return [], 0
        self._kept.move_to_end(best[1][0])
        return best[1][1], best[0]

    def keep(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if not 0 < len(ids) <= self.max_tokens:
            return
        new = torch.tensor(ids, dtype=torch.long)
        for key, (kept, _) in list(self._kept.items()):
            if len(kept) <= len(new) and torch.equal(kept, new[: len(kept)]):
                del self._kept[key]
                self.tokens -= len(kept)
        self._serial += 1
        self._kept[self._serial] = (new, kv)
        self.tokens += len(new)
        while self.tokens > self.max_tokens:
            _, (old, _) = self._kept.popitem(last=False)
            self.tokens -= len(old)

    def clear(self) -> None:
        self._kept.clear()
        self.tokens = 0


class Engine:
    """One model, one thread, many concurrent requests."""

    def __init__(
        self,
        model_path: Path,
        *,
        max_batch: int = 16,
        threads: int = 1,
        prefix_cache_tokens: int = 8192,
        script: list[str] | None = None,
        weight_version: str = "0",
    ) -> None:
        self.model_path = self.tokenizer_path = str(model_path)
        self.tokenizer = load_tokenizer(model_path)
        self.model: Any = load_model(model_path)
        self.vocab_size: int = self.model.config.vocab_size
        self.max_context: int = self.model.config.max_position_embeddings
        self.eos_id: int = self.tokenizer.eos_token_id
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = {
            self.eos_id,
            *(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        }
        self.weight_version = weight_version
        self.script = deque(script) if script is not None else None
        self.stats = {"peak_batch": 0, "joins": 0, "completed": 0, "aborted": 0}
        self.prefixes = PrefixCache(prefix_cache_tokens)
        self._max_batch, self._threads = max_batch, threads
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: deque[Job] = deque()
        self._commands: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._rows: list[Job] = []
        self._cache: Any = None
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._thread = threading.Thread(target=self._loop, name="agl-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread

    def submit(self, input_ids: list[int], sampling: Sampling) -> Job:
        job = Job(list(input_ids), sampling)
        if sampling.seed is not None:
            job.generator = torch.Generator().manual_seed(sampling.seed)
        self._queue.put(job)
        return job

    def command(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the model thread once no request is in flight."""
        fut: Future[Any] = Future()
        self._queue.put((fn, fut))
        return fut

    def release(self) -> Future[Any]:
        def run() -> None:
            self.model = None
            self.prefixes.clear()
            gc.collect()

        return self.command(run)

    def resume(self) -> Future[Any]:
        def run() -> None:
            if self.model is None:
                self.model = load_model(self.model_path)
                self.prefixes.clear()

        return self.command(run)

    def update_weights(self, path: str, version: str | None) -> Future[Any]:
        """Load a folder of the same architecture; while released, only remember it for resume."""

        def run() -> None:
            new = load_model(path) if self.model is not None else None
            if new is not None:
                old, cfg = self.model.config, new.config
                keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")
                if any(getattr(old, k) != getattr(cfg, k) for k in keys):
                    raise ValueError(f"{path} does not have the architecture of {self.model_path}")
                self.model = new
            self.prefixes.clear()  # keys and values of the old weights
            self.model_path = path
            old_version = self.weight_version
            self.weight_version = (
                version
                if version
                else str(int(old_version) + 1)
                if old_version.isdigit()
                else old_version
            )

        return self.command(run)

    def set_weight_version(self, version: str) -> Future[Any]:
        """Name the weights served `version`, without loading any, once no request is in flight."""

        def run() -> None:
            self.weight_version = version

        return self.command(run)

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()

    # ------------------------------------------------------------------ model thread

    def _loop(self) -> None:
        torch.set_num_threads(self._threads)
        with torch.inference_mode():
            while self._pull(block=not (self._rows or self._waiting or self._commands)):
                try:
                    if self._commands and not self._rows:
                        fn, fut = self._commands.popleft()
                        self._run_command(fn, fut)
                        continue
                    if not self._commands:
                        self._admit()
                    if self._rows:
                        self._step()
                except Exception as e:  # a model failure fails the batch, not the engine
                    log.exception("engine step failed")
                    for job in self._rows:
                        if not job.future.done():
                            job.future.set_exception(e)
                    self._rows, self._cache = [], None
        for job in [*self._rows, *self._waiting]:
            job.finish = job.finish or {"type": "abort", "message": "engine shut down"}
            self._resolve(job)
        for _, fut in self._commands:
            fut.set_exception(RuntimeError("engine shut down"))

    def _pull(self, block: bool) -> bool:
        items = [self._queue.get()] if block else []
        with contextlib.suppress(queue.Empty):
            while True:
                items.append(self._queue.get_nowait())
        for item in items:
            if item is _STOP:
                return False
            (self._waiting if isinstance(item, Job) else self._commands).append(item)
        return True

    def _run_command(self, fn: Callable[[], Any], fut: Future[Any]) -> None:
        try:
            fut.set_result(fn())
        except Exception as e:  # noqa: BLE001 (handed to the caller)
            fut.set_exception(e)

    def _admit(self) -> None:
        new: list[Job] = []
        while self._waiting and len(self._rows) + len(new) < self._max_batch:
            job = self._waiting.popleft()
            if job.cancelled or job.sampling.max_new_tokens == 0:
                job.finish = {"type": "abort" if job.cancelled else "length"}
                self._resolve(job)
            elif self.model is None:
                job.future.set_exception(
                    EngineReleased("engine memory is released; resume it before generating")
                )
            elif self.script is not None:
                self._scripted(job)
            else:
                new.append(job)
        if new:
            try:
                self._prefill(new)
            except Exception as e:
                for job in new:
                    if not job.future.done():
                        job.future.set_exception(e)
                raise

    def _prefill(self, jobs: list[Job]) -> None:
        """Prefill new prompts together: each row holds its cached prefix (left-padded to the
        longest), then the rest of its prompt (left-padded to the longest rest)."""
        hits = [self.prefixes.longest(job.input_ids) for job in jobs]
        past = max(n for _, n in hits)
        width = max(len(job.input_ids) - n for job, (_, n) in zip(jobs, hits, strict=True))
        ids = torch.zeros(len(jobs), width, dtype=torch.long)
        mask = torch.zeros(len(jobs), past + width, dtype=torch.long)
        positions = torch.zeros(len(jobs), width, dtype=torch.long)
        for i, (job, (_, n)) in enumerate(zip(jobs, hits, strict=True)):
            job.cached = n
            rest = len(job.input_ids) - n
            ids[i, width - rest :] = torch.tensor(job.input_ids[n:])
            mask[i, past - n : past] = 1
            mask[i, past + width - rest :] = 1
            positions[i, width - rest :] = torch.arange(n, len(job.input_ids))
        cache: Any = DynamicCache(config=self.model.config)
        if past:
            shapes = next(kv for kv, n in hits if n)
            for layer, (k0, v0) in enumerate(shapes):
                keys = k0.new_zeros(len(jobs), k0.shape[0], past, k0.shape[2])
                values = v0.new_zeros(len(jobs), v0.shape[0], past, v0.shape[2])
                for i, (kv, n) in enumerate(hits):
                    if n:
                        keys[i, :, past - n :] = kv[layer][0][:, :n]
                        values[i, :, past - n :] = kv[layer][1][:, :n]
                cache.update(keys, values, layer)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            logits_to_keep=1,
        )
        self._emit(jobs, out.logits[:, -1])
        if not self._rows:
            self._cache, self._mask = cache, mask
        else:  # join the running batch: left-pad the shorter cache, then stack the rows
            self.stats["joins"] += 1
            n = max(mask.shape[1], self._mask.shape[1])
            for a, b in zip(self._cache.layers, cache.layers, strict=True):
                a.keys = torch.cat([_lpad(a.keys, n, 2), _lpad(b.keys, n, 2)])
                a.values = torch.cat([_lpad(a.values, n, 2), _lpad(b.values, n, 2)])
            self._mask = torch.cat([_lpad(self._mask, n, 1), _lpad(mask, n, 1)])
        self._rows += jobs
        self.stats["peak_batch"] = max(self.stats["peak_batch"], len(self._rows))
        self._prune()

    def _step(self) -> None:
        last = torch.tensor([[job.output_ids[-1]] for job in self._rows])
        mask = torch.cat([self._mask, torch.ones(len(self._rows), 1, dtype=torch.long)], dim=1)
        positions = mask.sum(1, keepdim=True) - 1
        out = self.model(
            input_ids=last, attention_mask=mask, position_ids=positions, past_key_values=self._cache
        )
        self._mask = mask
        self._emit(self._rows, out.logits[:, -1])
        self._prune()

    def _emit(self, jobs: list[Job], logits: torch.Tensor) -> None:
        temps = torch.tensor([[j.sampling.temperature or 1.0] for j in jobs])
        scaled = logits.float() / temps
        logp = torch.log_softmax(scaled, dim=-1)
        for i, job in enumerate(jobs):
            tok = _sample(scaled[i], job)
            job.output_ids.append(tok)
            job.logprobs.append(float(logp[i, tok]))
            s = job.sampling
            if tok in s.stop_token_ids or (tok in self.eos_ids and not s.ignore_eos):
                job.finish = {"type": "stop", "matched": tok}
            elif (
                len(job.output_ids) >= s.max_new_tokens
                or len(job.input_ids) + len(job.output_ids) >= self.max_context
            ):
                job.finish = {"type": "length", "length": len(job.output_ids)}

    def _prune(self) -> None:
        keep = [i for i, job in enumerate(self._rows) if job.finish is None and not job.cancelled]
        if len(keep) == len(self._rows):
            return
        for i, job in enumerate(self._rows):
            if job.finish is not None or job.cancelled:
                if not job.cancelled:
                    self._keep(i, job)
                job.finish = job.finish or {"type": "abort", "message": "client disconnected"}
                self._resolve(job)
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, self._mask[:0, :0]
            return
        index = torch.tensor(keep)
        self._cache.batch_select_indices(index)
        self._mask = self._mask[index]
        start = int(self._mask.any(0).nonzero()[0])  # columns that are padding in every row go
        if start:
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
            self._mask = self._mask[:, start:]

    def _keep(self, row: int, job: Job) -> None:
        """Put a finished row's keys and values in the prefix cache: its prompt and all but the
        last sampled token (never fed back)."""
        if not self.prefixes.max_tokens:
            return
        columns = self._mask[row].nonzero()[:, 0]
        ids = job.input_ids + job.output_ids[:-1]
        if len(columns) == len(ids):
            kv = [
                (layer.keys[row][:, columns], layer.values[row][:, columns])
                for layer in self._cache.layers
            ]
            self.prefixes.keep(ids, kv)

    def _scripted(self, job: Job) -> None:
        if not self.script:
            job.future.set_exception(ScriptExhausted("the engine's script has no completions left"))
            return
        text = self.script.popleft()
        room = min(job.sampling.max_new_tokens, self.max_context - len(job.input_ids))
        out = [*self.tokenizer.encode(text, add_special_tokens=False), self.eos_id]
        job.output_ids = out[:room]
        full = torch.tensor([job.input_ids + job.output_ids])
        logits = self.model(input_ids=full).logits[0, len(job.input_ids) - 1 : -1].float()
        logp = torch.log_softmax(logits / (job.sampling.temperature or 1.0), dim=-1)
        job.logprobs = logp.gather(1, full[0, len(job.input_ids) :, None])[:, 0].tolist()
        full_length = len(job.output_ids) == len(out)
        job.finish = {"type": "stop", "matched": self.eos_id} if full_length else {"type": "length"}
        self._resolve(job)

    def _resolve(self, job: Job) -> None:
        self.stats["aborted" if job.finish and job.finish["type"] == "abort" else "completed"] += 1
        if not job.future.done():
            result = Result(
                job.output_ids, job.logprobs, job.finish or {}, self.weight_version, job.cached
            )
            job.future.set_result(result)


def _lpad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """Left-pad `t` with zeros along `dim` (1: a mask [B, S]; 2: a cache [B, H, S, D]) to length n."""
    extra = n - t.shape[dim]
    return F.pad(t, (0, 0, extra, 0) if dim == 2 else (extra, 0)) if extra else t


def _sample(scaled: torch.Tensor, job: Job) -> int:
    s = job.sampling
    if s.temperature == 0 or s.top_k == 1:
        return int(scaled.argmax())
    if 0 < s.top_k < scaled.numel():
        kth = torch.topk(scaled, s.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if s.top_p < 1.0:
        values, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(values, dim=-1)
        values[probs.cumsum(-1) - probs > s.top_p] = float(
            "-inf"
        )  # keep the smallest set reaching top_p
        scaled = torch.empty_like(scaled).scatter_(0, order, values)
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=job.generator))
