"""The embedded engine's model loop: one thread owns the model and batches requests dynamically.

Requests from any thread are queued (`submit`) and resolved through futures; a streaming caller is
also told of each token as it is sampled (`Job.on_token`). Between decode steps the thread admits
waiting requests (continuous batching): new prompts are prefilled together, left-padded, into their
own KV cache (the HF `DynamicCache`), which is then merged into the running batch; each step feeds
one token per row with per-row positions; finished rows leave the batch. Prefix cache: a finished
request's keys and values are kept (LRU, bounded in tokens), and a new prompt that starts with a
kept sequence prefills only the rest, as sglang's radix cache does. Agent calls gain most: each
re-sends the conversation so far, and all share a system prompt. Rows may then have padding in the
middle (the attention mask covers it; positions are per row). The cache is dropped whenever the
weights change.

Control commands (release, resume, weight reload, flush) run only when no request is in flight,
and no request is admitted while one waits, so a request sees one set of weights from start to
end, like sglang's model-update lock.

Aborts (`abort`, sglang's `/abort_request`) travel the same queue as the requests, so each one
sees every request submitted before it, and act as sglang's scheduler does: a waiting request ends
at once ("Abort in waiting queue"), a running one at its next decoding step, with what it sampled.
`load` counts the requests running and waiting from any thread, as sglang's `/v1/loads`.

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
# Per layer, the keys and values of one sequence ([heads, tokens, dim] each).
KV = list[tuple[torch.Tensor, torch.Tensor]]
# sglang's `FINISH_ABORT().to_json()` (managers/schedule_batch.py): a request aborted while running
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# sglang's `_handle_abort_req` (managers/tokenizer_manager.py): one aborted before it ran
ABORTED_WAITING = {"type": "abort", "message": "Abort in waiting queue"}
# The config fields new weights must share with the served ones to be loaded in their place.
ARCHITECTURE = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")


class EngineReleased(RuntimeError):
    """The weights are released (`/release_memory_occupation`); resume before generating."""


class ScriptExhausted(RuntimeError):
    """Scripted mode ran out of completions."""


@dataclass(frozen=True)
class Sampling:
    """How one request samples (the module docstring says from which distribution)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None


@dataclass(frozen=True)
class Result:
    """A finished request: its tokens, their logprobs, why it ended (sglang's `finish_reason`),
    the weights that sampled it and how many prompt tokens came from the prefix cache.
    `aborted_waiting`: aborted before it was decoded, which sglang answers in another shape."""

    output_ids: list[int]
    logprobs: list[float]
    finish: dict[str, Any] | None  # None: not finished (a streamed chunk)
    weight_version: str
    cached_tokens: int = 0
    aborted_waiting: bool = False


@dataclass(frozen=True)
class Abort:
    """An abort, as sglang's `AbortReq`: every request with `abort_all`; else, if a request in
    flight has exactly `rid`, every one whose rid starts with it."""

    rid: str
    abort_all: bool = False


@dataclass(frozen=True)
class Load:
    """The requests in the engine at one moment, counted from any thread.

    - `running`: requests in the batch, being decoded;
    - `waiting`: requests submitted and not yet in the batch (queued, waiting or being prefilled);
      while any request is submitted and has not ended, `running + waiting` is at least 1;
    - `used_tokens`: the prompt and sampled tokens of the running requests (their keys and values);
    - `waiting_tokens`: the prompt tokens of the waiting requests.
    """

    running: int
    waiting: int
    used_tokens: int
    waiting_tokens: int


@dataclass(eq=False)
class Job:
    """A request inside the engine: what it asks, what it has sampled so far, and the future its
    caller waits on. `on_token`, when given, is called on the model thread after each sampled
    token that does not end the request, with the number of tokens sampled so far (their IDs and
    logprobs are then in `output_ids` and `logprobs`): a streaming caller's cue."""

    input_ids: list[int]
    sampling: Sampling
    on_token: Callable[[int], None] | None = None
    rid: str = ""  # the request's id, which `/abort_request` names
    cached: int = 0  # prompt tokens whose keys and values came from the prefix cache
    future: Future[Result] = field(default_factory=Future)
    cancelled: bool = False  # set from another thread when the client went away
    decoding: bool = False  # in the batch (set by the model thread)
    aborting: bool = False  # aborted while running: ends at its next step
    aborted_waiting: bool = False  # aborted before it was decoded
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    generator: torch.Generator | None = None


class PrefixCache:
    """Keys and values of finished sequences (per layer, [heads, tokens, dim]), LRU, at most
    `max_tokens` tokens in all. A sequence that another kept one extends is dropped."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        # serial -> (token IDs, keys and values), least recently used first
        self._kept: OrderedDict[int, tuple[torch.Tensor, KV]] = OrderedDict()
        self._serial = 0

    def longest(self, ids: list[int]) -> tuple[KV, int]:
        """The kept sequence sharing the longest prefix with `ids` and that length; the last
        prompt token is never taken from the cache, since its logits are needed."""
        query = torch.tensor(ids[:-1], dtype=torch.long)
        best_key: int | None = None
        best_kv: KV = []
        best_n = 0
        for key, (kept, kv) in self._kept.items():
            n = min(len(query), len(kept))
            if n <= best_n:
                continue
            differ = (kept[:n] != query[:n]).nonzero()
            if len(differ):
                n = int(differ[0, 0])
            if n > best_n:
                best_key = key
                best_kv = kv
                best_n = n
        if best_key is None:
            return [], 0
        self._kept.move_to_end(best_key)
        return best_kv, best_n

    def keep(self, ids: list[int], kv: KV) -> None:
        """Keep a finished sequence's keys and values, dropping those it extends and, past
        `max_tokens`, the least recently used."""
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
        """Forget every kept sequence (the weights changed, or `/flush_cache`)."""
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
        self.model_path = str(model_path)
        self.tokenizer_path = str(model_path)
        self.tokenizer = load_tokenizer(model_path)
        self.model: Any = load_model(model_path)
        self.vocab_size: int = self.model.config.vocab_size
        self.max_context: int = self.model.config.max_position_embeddings
        self.eos_id: int = self.tokenizer.eos_token_id
        self.eos_ids = _eos_ids(self.eos_id, self.model.generation_config.eos_token_id)
        self.weight_version = weight_version
        self.script: deque[str] | None = None
        if script is not None:
            self.script = deque(script)
        self.stats = {
            "peak_batch": 0,
            "joins": 0,
            "completed": 0,
            "aborted": 0,
            "prefilled_tokens": 0,  # prompt tokens of the requests admitted
            "cached_tokens": 0,  # of those, the ones the prefix cache held
        }
        self.prefixes = PrefixCache(prefix_cache_tokens)
        self.max_batch = max_batch
        # The most tokens the engine holds at once (sglang's `max_total_num_tokens`): a CPU engine
        # has no KV pool sized from memory; each of its `max_batch` rows may grow to the context.
        self.max_total_tokens = max_batch * self.max_context
        # sglang's `max_req_input_len` (managers/tp_worker.py): longer prompts are refused
        self.max_input_tokens = min(self.max_context - 1, self.max_total_tokens - 1) - 5
        self._live: set[Job] = set()  # submitted, not yet answered
        self._live_lock = threading.Lock()
        self._threads = threads
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: deque[Job] = deque()
        self._commands: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._rows: list[Job] = []
        self._cache: Any = None
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._thread = threading.Thread(target=self._loop, name="agl-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread

    def submit(
        self,
        input_ids: list[int],
        sampling: Sampling,
        on_token: Callable[[int], None] | None = None,
        rid: str = "",
    ) -> Job:
        """Queue a request named `rid`; its `future` gives the `Result` (`Job` says when `on_token`
        is called)."""
        job = Job(input_ids=list(input_ids), sampling=sampling, on_token=on_token, rid=rid)
        if sampling.seed is not None:
            job.generator = torch.Generator().manual_seed(sampling.seed)
        with self._live_lock:
            self._live.add(job)
        job.future.add_done_callback(lambda _: self._ended(job))
        self._queue.put(job)
        return job

    def abort(self, rid: str, abort_all: bool = False) -> None:
        """Abort requests, as sglang's `/abort_request`: every one with `abort_all`; else, when a
        request in flight is named `rid`, every one whose rid starts with it (sglang's tokenizer
        manager drops an rid it does not know; its scheduler matches by prefix). An empty `rid`
        without `abort_all` is ignored. Waiting requests end at once, running ones at their next
        step."""
        if abort_all or rid:
            self._queue.put(Abort(rid=rid, abort_all=abort_all))

    def load(self) -> Load:
        """The requests running and waiting now (`Load`); safe from any thread."""
        with self._live_lock:
            jobs = list(self._live)
        running = [job for job in jobs if job.decoding]
        waiting = [job for job in jobs if not job.decoding]
        return Load(
            running=len(running),
            waiting=len(waiting),
            used_tokens=sum(len(job.input_ids) + len(job.output_ids) for job in running),
            waiting_tokens=sum(len(job.input_ids) for job in waiting),
        )

    def command(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the model thread once no request is in flight."""
        fut: Future[Any] = Future()
        self._queue.put((fn, fut))
        return fut

    def release(self) -> Future[Any]:
        """Drop the weights (and the prefix cache) until `resume`."""

        def run() -> None:
            self.model = None
            self.prefixes.clear()
            gc.collect()

        return self.command(run)

    def resume(self) -> Future[Any]:
        """Load the weights again (the last ones updated to, if any) after `release`."""

        def run() -> None:
            if self.model is None:
                self.model = load_model(self.model_path)
                self.prefixes.clear()

        return self.command(run)

    def update_weights(self, path: str, version: str | None) -> Future[Any]:
        """Load a folder of the same architecture; while released, only remember it for resume."""

        def run() -> None:
            if self.model is not None:
                new = load_model(path)
                old = self.model.config
                if any(getattr(old, k) != getattr(new.config, k) for k in ARCHITECTURE):
                    raise ValueError(f"{path} does not have the architecture of {self.model_path}")
                self.model = new
            # keys and values of the old weights
            self.prefixes.clear()
            self.model_path = path
            self.weight_version = _next_version(self.weight_version, version)

        return self.command(run)

    def set_weight_version(self, version: str) -> Future[Any]:
        """Name the weights served `version`, without loading any, once no request is in flight."""

        def run() -> None:
            self.weight_version = version

        return self.command(run)

    def close(self) -> None:
        """Stop the model thread; requests still queued or running are aborted."""
        self._queue.put(_STOP)
        self._thread.join()

    def _ended(self, job: Job) -> None:
        """A request was answered (or failed), on whichever thread answered it."""
        with self._live_lock:
            self._live.discard(job)

    # ------------------------------------------------------------------ model thread

    def _loop(self) -> None:
        torch.set_num_threads(self._threads)
        with torch.inference_mode():
            while self._pull(block=not (self._rows or self._waiting or self._commands)):
                try:
                    self._turn()
                except Exception as e:  # a model failure fails the batch, not the engine
                    log.exception("engine step failed")
                    _fail(self._rows, e)
                    self._rows = []
                    self._cache = None
        self._shut_down()

    def _turn(self) -> None:
        """One turn of the loop: a control command once no request is in flight; else admit
        waiting requests (none while a command waits) and decode one step."""
        if self._commands and not self._rows:
            fn, fut = self._commands.popleft()
            self._run_command(fn, fut)
            return
        if not self._commands:
            self._admit()
        if self._rows:
            self._step()

    def _shut_down(self) -> None:
        """Abort every request still running or waiting, and fail waiting commands."""
        for job in [*self._rows, *self._waiting]:
            job.finish = job.finish or {"type": "abort", "message": "engine shut down"}
            self._resolve(job)
        for _, fut in self._commands:
            fut.set_exception(RuntimeError("engine shut down"))

    def _pull(self, block: bool) -> bool:
        """Move what was queued to the waiting requests and commands; False once `close` asked
        to stop."""
        items: list[Any] = []
        if block:
            items.append(self._queue.get())
        with contextlib.suppress(queue.Empty):
            while True:
                items.append(self._queue.get_nowait())
        for item in items:
            if item is _STOP:
                return False
            if isinstance(item, Job):
                self._waiting.append(item)
            elif isinstance(item, Abort):
                self._abort(item)
            else:
                self._commands.append(item)
        return True

    def _abort(self, abort: Abort) -> None:
        """End the waiting requests that `abort` names at once; mark the running ones to end at
        their next step (as sglang's scheduler `abort_request`)."""
        jobs = [*self._waiting, *self._rows]
        if not abort.abort_all and all(job.rid != abort.rid for job in jobs):
            return
        hit = [job for job in jobs if abort.abort_all or job.rid.startswith(abort.rid)]
        for job in hit:
            if job.decoding:
                job.aborting = True
                continue
            job.finish = dict(ABORTED_WAITING)
            job.aborted_waiting = True
            self._resolve(job)
        self._waiting = deque(job for job in self._waiting if job.finish is None)

    def _run_command(self, fn: Callable[[], Any], fut: Future[Any]) -> None:
        try:
            fut.set_result(fn())
        except Exception as e:  # noqa: BLE001 (handed to the caller)
            fut.set_exception(e)

    def _admit(self) -> None:
        """Take waiting requests into the batch, up to `max_batch` rows, and prefill them."""
        new: list[Job] = []
        while self._waiting and len(self._rows) + len(new) < self.max_batch:
            job = self._waiting.popleft()
            if not self._answered_at_once(job):
                new.append(job)
        if new:
            try:
                self._prefill(new)
            except Exception as e:
                _fail(new, e)
                raise

    def _answered_at_once(self, job: Job) -> bool:
        """Answer a request that needs no decoding step (cancelled, asking for no tokens, the
        weights released, scripted mode), and say whether it was one."""
        if job.cancelled:
            job.finish = {"type": "abort"}
            self._resolve(job)
        elif job.sampling.max_new_tokens == 0:
            job.finish = {"type": "length"}
            self._resolve(job)
        elif self.model is None:
            job.future.set_exception(
                EngineReleased("engine memory is released; resume it before generating")
            )
        elif self.script is not None:
            self._scripted(job)
        else:
            return False
        return True

    def _prefill(self, jobs: list[Job]) -> None:
        """Prefill new prompts together: each row holds its cached prefix (left-padded to the
        longest), then the rest of its prompt (left-padded to the longest rest)."""
        hits = [self.prefixes.longest(job.input_ids) for job in jobs]
        for job, (_, n) in zip(jobs, hits, strict=True):
            job.cached = n
        past = max(job.cached for job in jobs)
        self.stats["prefilled_tokens"] += sum(len(job.input_ids) for job in jobs)
        self.stats["cached_tokens"] += sum(job.cached for job in jobs)
        ids, mask, positions = _prompt_rows(jobs, past)
        cache = self._prefix_cache([kv for kv, _ in hits], jobs, past)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            logits_to_keep=1,
        )
        self._emit(jobs, out.logits[:, -1])
        if self._rows:
            self._join(cache, mask)
        else:
            self._cache = cache
            self._mask = mask
        self._rows += jobs
        for job in jobs:
            job.decoding = True
        self.stats["peak_batch"] = max(self.stats["peak_batch"], len(self._rows))
        self._prune()

    def _prefix_cache(self, kvs: list[KV], jobs: list[Job], past: int) -> Any:
        """A cache with one row per job: its `job.cached` tokens' keys and values from `kvs`,
        right-aligned in `past` columns."""
        cache: Any = DynamicCache(config=self.model.config)
        if not past:
            return cache
        shapes = next(kv for kv, job in zip(kvs, jobs, strict=True) if job.cached)
        for layer, (k0, v0) in enumerate(shapes):
            keys = k0.new_zeros(len(jobs), k0.shape[0], past, k0.shape[2])
            values = v0.new_zeros(len(jobs), v0.shape[0], past, v0.shape[2])
            for i, (kv, job) in enumerate(zip(kvs, jobs, strict=True)):
                n = job.cached
                if n:
                    keys[i, :, past - n :] = kv[layer][0][:, :n]
                    values[i, :, past - n :] = kv[layer][1][:, :n]
            cache.update(keys, values, layer)
        return cache

    def _join(self, cache: Any, mask: torch.Tensor) -> None:
        """Join prefilled rows to the running batch: left-pad the shorter cache, then stack."""
        self.stats["joins"] += 1
        n = max(mask.shape[1], self._mask.shape[1])
        for a, b in zip(self._cache.layers, cache.layers, strict=True):
            a.keys = torch.cat([_lpad(a.keys, n, 2), _lpad(b.keys, n, 2)])
            a.values = torch.cat([_lpad(a.values, n, 2), _lpad(b.values, n, 2)])
        self._mask = torch.cat([_lpad(self._mask, n, 1), _lpad(mask, n, 1)])

    def _step(self) -> None:
        """Decode one token for every row."""
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
        """Sample each row's next token from its last logits, and mark the rows that finish."""
        temps = torch.tensor([[j.sampling.temperature or 1.0] for j in jobs])
        scaled = logits.float() / temps
        logp = torch.log_softmax(scaled, dim=-1)
        for i, job in enumerate(jobs):
            tok = _sample(scaled[i], job)
            job.output_ids.append(tok)
            job.logprobs.append(float(logp[i, tok]))
            s = job.sampling
            if job.aborting:
                job.finish = dict(ABORTED)
            elif tok in s.stop_token_ids or (tok in self.eos_ids and not s.ignore_eos):
                job.finish = {"type": "stop", "matched": tok}
            elif (
                len(job.output_ids) >= s.max_new_tokens
                or len(job.input_ids) + len(job.output_ids) >= self.max_context
            ):
                job.finish = {"type": "length", "length": len(job.output_ids)}
            elif job.on_token is not None:
                job.on_token(len(job.output_ids))

    def _prune(self) -> None:
        """Answer the rows that finished or were cancelled, and take them out of the batch."""
        gone = [job.finish is not None or job.cancelled for job in self._rows]
        if not any(gone):
            return
        for i, job in enumerate(self._rows):
            if not gone[i]:
                continue
            if not job.cancelled:
                self._keep(i, job)
            job.finish = job.finish or {"type": "abort", "message": "client disconnected"}
            self._resolve(job)
        keep = [i for i, row_gone in enumerate(gone) if not row_gone]
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache = None
            self._mask = self._mask[:0, :0]
            return
        index = torch.tensor(keep)
        self._cache.batch_select_indices(index)
        self._mask = self._mask[index]
        self._trim_padding()

    def _trim_padding(self) -> None:
        """Drop the leading columns that are padding in every row."""
        start = int(self._mask.any(0).nonzero()[0])
        if not start:
            return
        for layer in self._cache.layers:
            layer.keys = layer.keys[:, :, start:]
            layer.values = layer.values[:, :, start:]
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
        """Answer with the script's next text and the model's logprobs of its tokens."""
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
        if len(job.output_ids) == len(out):
            job.finish = {"type": "stop", "matched": self.eos_id}
        else:
            job.finish = {"type": "length"}
        self._resolve(job)

    def _resolve(self, job: Job) -> None:
        """Count a request that ended and answer it, unless it already failed."""
        if job.finish and job.finish["type"] == "abort":
            self.stats["aborted"] += 1
        else:
            self.stats["completed"] += 1
        if not job.future.done():
            result = Result(
                output_ids=job.output_ids,
                logprobs=job.logprobs,
                finish=job.finish or {},
                weight_version=self.weight_version,
                cached_tokens=job.cached,
                aborted_waiting=job.aborted_waiting,
            )
            job.future.set_result(result)


def _eos_ids(eos_id: int, generation_eos: int | list[int] | None) -> set[int]:
    """The tokenizer's end-of-sequence token and the generation config's (none, one or a list)."""
    if generation_eos is None:
        return {eos_id}
    if isinstance(generation_eos, list):
        return {eos_id, *generation_eos}
    return {eos_id, generation_eos}


def _next_version(current: str, given: str | None) -> str:
    """The weight version after an update: the one given; else the current one plus one, when it
    is a number; else the current one."""
    if given:
        return given
    if current.isdigit():
        return str(int(current) + 1)
    return current


def _fail(jobs: list[Job], error: Exception) -> None:
    """Fail every request of `jobs` not yet answered with `error`."""
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)


def _prompt_rows(jobs: list[Job], past: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input IDs, attention mask and positions of the prompts' uncached rests, left-padded to the
    longest; the mask's first `past` columns cover each row's cached prefix, right-aligned."""
    width = max(len(job.input_ids) - job.cached for job in jobs)
    ids = torch.zeros(len(jobs), width, dtype=torch.long)
    mask = torch.zeros(len(jobs), past + width, dtype=torch.long)
    positions = torch.zeros(len(jobs), width, dtype=torch.long)
    for i, job in enumerate(jobs):
        n = job.cached
        rest = len(job.input_ids) - n
        ids[i, width - rest :] = torch.tensor(job.input_ids[n:])
        mask[i, past - n : past] = 1
        mask[i, past + width - rest :] = 1
        positions[i, width - rest :] = torch.arange(n, len(job.input_ids))
    return ids, mask, positions


def _lpad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """Left-pad `t` with zeros along `dim` (1: a mask [B, S]; 2: a cache [B, H, S, D]) to length n."""
    extra = n - t.shape[dim]
    if not extra:
        return t
    if dim == 2:
        return F.pad(t, (0, 0, extra, 0))
    return F.pad(t, (extra, 0))


def _sample(scaled: torch.Tensor, job: Job) -> int:
    """The next token from a row's temperature-scaled logits, under its sampling parameters."""
    s = job.sampling
    if s.temperature == 0 or s.top_k == 1:
        return int(scaled.argmax())
    if 0 < s.top_k < scaled.numel():
        kth = torch.topk(scaled, s.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if s.top_p < 1.0:
        values, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(values, dim=-1)
        # keep the smallest set reaching top_p
        values[probs.cumsum(-1) - probs > s.top_p] = float("-inf")
        scaled = torch.empty_like(scaled).scatter_(0, order, values)
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=job.generator))
