"""AIR (automatic intermediate rewards): a reward for each tool call whose result came back failed.

- Owns: which tool results count as failed (sent back after the request's last assistant
  message, and marked `is_error` or matching `air_error_pattern`), the reward they give
  (`air_tool_error_reward` each) and the call it goes to: the agent's last recorded call, the one
  that asked for the tools.
- Does not: decide when the reward is posted (`Proxy.chat` reads the call before the request's
  own call is recorded, and posts once it is, so a refused request changes nothing stored), nor
  read wire formats (each format's tool results arrive as `tool` messages).
"""

import asyncio
import re
from dataclasses import dataclass

from agl.store import Store
from gateway.settings import GatewaySettings
from gateway.types import Ask, Message

SOURCE = "air:tool_error"  # the reward's source, as the store records it


@dataclass(frozen=True)
class Penalty:
    """The intermediate reward of the agent's call that asked for tools whose results failed."""

    reward: float
    call_seq: int


class Air:
    """AIR's rewards of a rollout's calls; off while `air_tool_error_reward` is unset."""

    def __init__(self, settings: GatewaySettings, store: Store) -> None:
        self.reward = settings.air_tool_error_reward
        self.pattern = settings.air_error_pattern
        self.store = store

    async def penalty(self, ask: Ask, messages: list[Message]) -> Penalty | None:
        """The reward of each failed tool result this request sends back, for the agent's call
        that asked for the tools (read now: before this request's call is recorded); None when
        none failed, the agent made no call, or AIR is off."""
        if self.reward is None:
            return None
        count = failed(messages, self.pattern)
        if not count:
            return None
        seq = await asyncio.to_thread(self.store.last_seq, ask.rollout.id, ask.agent)
        if seq is None:
            return None
        return Penalty(reward=count * self.reward, call_seq=seq)

    async def post(self, rollout_id: str, penalty: Penalty) -> None:
        """Records `penalty` as an intermediate reward (not final) of the rollout's call."""
        posted = self.store.set_reward(
            rollout_id, penalty.reward, call_seq=penalty.call_seq, source=SOURCE, final=False
        )
        await asyncio.wrap_future(posted)


def failed(messages: list[Message], pattern: re.Pattern[str] | None) -> int:
    """How many tool results after the last assistant message report an error: marked so
    (`is_error`), or with `pattern` in their text; none without an assistant message."""
    last = (i for i in reversed(range(len(messages))) if messages[i].role == "assistant")
    start = next(last, None)
    if start is None:
        return 0
    results = [m for m in messages[start + 1 :] if m.role == "tool"]
    return sum(m.is_error or bool(pattern and pattern.search(m.content)) for m in results)
