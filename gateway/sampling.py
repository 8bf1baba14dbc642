"""What the engine is asked to sample for one choice of a call, and where its reply stops.

- Owns: the completion's token budget (`max_tokens`: the request's or the default, against the
  engine's `Room`, lowered or refused when it does not fit), the engine's sampling parameters
  (the request's, overridden by the rollout's own), and cutting a generation after its first stop
  string (engines see only token IDs, so stop strings are found here, in the decoded text).
- Does not: call the engine, record the call or hold the pause gate (`gateway/proxy.py`), nor
  render prompts (`gateway/render.py`).
"""

import bisect
from dataclasses import dataclass

from agl.store import Store
from agl.types import JSON
from gateway.engine_replies import Generation
from gateway.engines import Room
from gateway.render import Renderer
from gateway.settings import GatewaySettings
from gateway.types import Ask, ContextOverflow, Params


@dataclass(frozen=True)
class Sampled:
    """A generation through its first stop string: the tokens and logprobs kept, why it finished,
    the stop string that ended it ("" if none), its visible text, and that text before the cut."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "stop_sequence"
    stop_sequence: str
    text: str
    sampled_text: str


class Sampler:
    """The sampling of each choice: its budget, the engine's parameters, its stop string."""

    def __init__(
        self,
        renderer: Renderer,
        room: Room,
        settings: GatewaySettings,
        store: Store,
        *,
        honours_seed: bool,
    ) -> None:
        self.renderer = renderer
        self.room = room  # what the engine takes of one request
        self.settings = settings
        self.store = store  # where a lowered budget is recorded, as an event of its rollout
        # the engines use a request's seed (sglang: only in deterministic mode)
        self.honours_seed = honours_seed

    def max_tokens(self, ask: Ask, prompt_tokens: int, params: Params) -> int:
        """The completion's budget: the request's, else the default as far as the engine has room
        (`Room`: sglang's sizes). One past the room is lowered to it where `fit_max_tokens`
        allows (an event says so), else refused; so is a prompt longer than the engine takes."""
        room = self.room
        if prompt_tokens > room.max_prompt:
            raise ContextOverflow(
                f"This model's maximum context length is {room.context_length} tokens, and a "
                f"prompt may have at most {room.max_prompt} of them. However, your messages "
                f"resulted in {prompt_tokens} tokens."
            )
        left = room.completion(prompt_tokens)
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = min(self.settings.default_max_tokens, left)
        if max_tokens > left and 0 < self.settings.fit_max_tokens <= left:
            lowered = {"asked": max_tokens, "to": left}
            self.store.append_event(ask.rollout.id, "max_tokens_lowered", lowered)
            max_tokens = left
        if max_tokens > left:
            raise ContextOverflow(
                f"This model's maximum context length is {room.context_length} tokens. However, "
                f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                f"messages, {max_tokens} in the completion); the messages leave room for {left}."
            )
        return max_tokens

    def sampling(self, ask: Ask, params: Params, max_tokens: int, index: int) -> JSON:
        """The engine's sampling parameters: the request's, overridden by the rollout's own
        (set by whoever made the rollout: greedy validation)."""
        sampling: JSON = {
            "max_new_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "stop_token_ids": sorted(self.renderer.end_ids),
        }
        if params.seed is not None and self.honours_seed:
            sampling["sampling_seed"] = params.seed + index
        sampling |= ask.rollout.metadata.get("sampling") or {}
        # "no top-k" in OpenAI-style APIs; sglang refuses 0 and spells it -1
        if sampling["top_k"] == 0:
            sampling["top_k"] = -1
        return sampling

    def through_stop(self, generation: Generation, stops: list[str]) -> Sampled:
        """The generation cut after its first stop string, if it holds one (`_stop_at`)."""
        ids = generation.output_ids
        logprobs = generation.logprobs
        finish = "stop"
        if generation.finish_reason == "length":
            finish = "length"
        stop_sequence = ""
        if stops:
            kept, stop_sequence = self._stop_at(ids, stops)
            ids = ids[:kept]
            logprobs = logprobs[:kept]
        sampled_text = self.renderer.reply_text(ids)
        text = sampled_text
        if stop_sequence:
            finish = "stop_sequence"
            text = sampled_text[: sampled_text.find(stop_sequence)]
        return Sampled(
            ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            stop_sequence=stop_sequence,
            text=text,
            sampled_text=sampled_text,
        )

    def _stop_at(self, ids: list[int], stops: list[str]) -> tuple[int, str]:
        """How many sampled tokens to keep, and the stop string they end with: the fewest whose
        text holds the first stop string whole. The tokens kept are exactly what was sampled."""
        text = self.renderer.decode(ids)
        found = [(text.find(s), s) for s in stops if s and s in text]
        if not found:
            return len(ids), ""
        pos, stop = min(found)
        # The text of ids[:k] grows with k: a binary search for the first k that reaches past the
        # stop string.
        kept = bisect.bisect_left(
            range(len(ids)), pos + len(stop), lo=1, key=lambda k: len(self.renderer.decode(ids[:k]))
        )
        return kept, stop
