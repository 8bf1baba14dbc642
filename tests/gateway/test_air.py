"""AIR's contract: which tool results failed, what they give and to which call; a real store
(SQLite). End to end, through each wire format and a refused request: test_app.py."""

import asyncio
import re
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from agl.store import Store
from agl.types import Call, Status
from gateway.air import SOURCE, Air, Penalty, failed
from gateway.settings import GatewaySettings
from gateway.types import Ask, Message, ToolCall

ERROR = re.compile(r"(?i)\berror\b")
ASKED = Message(role="assistant", tool_calls=(ToolCall(name="bash", arguments="{}"),))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'air.db'}") as store:
        yield store


def test_only_the_results_sent_back_after_the_last_assistant_message_count() -> None:
    messages = [
        Message(role="user", content="go"),
        ASKED,
        Message(role="tool", content="Error: an earlier turn's"),
        ASKED,
        Message(role="tool", content="a.txt"),
        Message(role="tool", content="Traceback: error"),
        Message(role="tool", content="done", is_error=True),
    ]
    assert failed(messages, ERROR) == 2
    assert failed(messages, None) == 1  # marked so, without a pattern
    assert failed([Message(role="tool", content="error", is_error=True)], ERROR) == 0


def test_the_penalty_goes_to_the_agent_s_last_call_and_is_posted_as_intermediate(
    store: Store,
) -> None:
    rollout = store.create_rollout({}, "g").result().rollout
    store.transition(rollout.id, Status.RUNNING).result()
    for agent in ("planner", "coder"):  # seq 0, then 1
        ids = array("i", [1, 2])
        logprobs = array("f", [-0.5, -0.5])
        call = Call(
            rollout_id=rollout.id, prompt_ids=ids, response_ids=ids, logprobs=logprobs, agent=agent
        )
        store.append_call(call).result()
    messages = [ASKED, Message(role="tool", content="error"), Message(role="tool", content="error")]
    settings = GatewaySettings(air_tool_error_reward=-0.5, air_error_pattern=ERROR)

    def penalty(air: Air, agent: str) -> Penalty | None:
        ask = Ask(rollout=rollout, agent=agent, api="chat", body={})
        return asyncio.run(air.penalty(ask, messages))

    air = Air(settings, store)
    assert penalty(air, "planner") == Penalty(reward=-1.0, call_seq=0)
    assert penalty(air, "nobody") is None  # the agent made no call
    assert penalty(Air(GatewaySettings(), store), "planner") is None  # AIR off
    asyncio.run(air.post(rollout.id, Penalty(reward=-1.0, call_seq=1)))
    rewards = [e.data for e in store.events(rollout.id) if e.kind == "reward"]
    assert rewards == [{"value": -1.0, "source": SOURCE, "final": False, "call_seq": 1}]
