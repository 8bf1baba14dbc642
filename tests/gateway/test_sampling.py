"""What the engine is asked to sample, and where a reply stops: a real tokenizer (Qwen's
vocabulary) and a real store (SQLite, for the events); no engine, the generations are made up."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from agl.store import Store
from gateway.engine_replies import Generation
from gateway.engines import Room
from gateway.render import Renderer
from gateway.sampling import Sampler
from gateway.settings import GatewaySettings
from gateway.types import Ask, ContextOverflow, Params
from tests.gateway.qwen import CHATML_TOOLS, qwen_tokenizer

ROOM = Room(context_length=2048)  # a prompt of at most 2041 tokens; 2046 tokens in all


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = CHATML_TOOLS
    return Renderer(tokenizer)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'sampling.db'}") as store:
        yield store


def ask_of(store: Store, metadata: dict | None = None) -> Ask:
    rollout = store.create_rollout({}, "g", metadata=metadata or {}).result().rollout
    return Ask(rollout=rollout, agent="a", api="chat", body={})


def sampler(renderer: Renderer, store: Store, **settings: int) -> Sampler:
    return Sampler(renderer, ROOM, GatewaySettings(**settings), store, honours_seed=True)


def test_the_budget_is_what_the_room_leaves_and_one_past_it_is_lowered_or_refused(
    renderer: Renderer, store: Store
) -> None:
    ask = ask_of(store)
    plain = sampler(renderer, store)
    assert plain.max_tokens(ask, 2000, Params()) == 46  # the default, as far as there is room
    with pytest.raises(ContextOverflow, match="leave room for 46"):
        plain.max_tokens(ask, 2000, Params(max_tokens=100))
    with pytest.raises(ContextOverflow, match="at most 2041"):
        plain.max_tokens(ask, 2042, Params(max_tokens=1))
    fitting = sampler(renderer, store, fit_max_tokens=10)
    assert fitting.max_tokens(ask, 2000, Params(max_tokens=100)) == 46
    assert lowered(store, ask) == [{"asked": 100, "to": 46}]  # the refusals recorded none


def lowered(store: Store, ask: Ask) -> list[dict]:
    """The rollout's `max_tokens_lowered` events, once the writes before now are committed (the
    store commits in order; the sampler does not wait for its event)."""
    store.append_event(ask.rollout.id, "flushed").result()
    return [e.data for e in store.events(ask.rollout.id) if e.kind == "max_tokens_lowered"]


def test_the_rollout_s_sampling_overrides_the_request_s(renderer: Renderer, store: Store) -> None:
    s = sampler(renderer, store)
    params = Params(temperature=0.7, top_k=0, seed=3)
    sampling = s.sampling(ask_of(store), params, 16, index=1)
    assert sampling["top_k"] == -1  # sglang's "no top-k"
    assert sampling["sampling_seed"] == 4 and sampling["temperature"] == 0.7
    assert sampling["stop_token_ids"] == sorted(renderer.end_ids)
    greedy = ask_of(store, {"sampling": {"temperature": 0.0}})
    assert s.sampling(greedy, params, 16, index=0)["temperature"] == 0.0
    unseeded = Sampler(renderer, ROOM, GatewaySettings(), store, honours_seed=False)
    assert "sampling_seed" not in unseeded.sampling(greedy, params, 16, index=0)


def test_a_generation_is_cut_after_its_first_stop_string(renderer: Renderer, store: Store) -> None:
    s = sampler(renderer, store)
    ids = renderer.encode("The answer is 42. DONE and then some more words")
    generation = Generation(
        output_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="length", replica="r"
    )
    sampled = s.through_stop(generation, ["then", "DONE"])
    assert sampled.finish_reason == "stop_sequence" and sampled.stop_sequence == "DONE"
    assert sampled.text == "The answer is 42. "
    assert sampled.sampled_text.endswith("DONE") and sampled.ids == ids[: len(sampled.ids)]
    assert len(sampled.logprobs) == len(sampled.ids) < len(ids)
    whole = s.through_stop(generation, ["nowhere"])
    assert whole.finish_reason == "length" and whole.ids == ids and whole.stop_sequence == ""
