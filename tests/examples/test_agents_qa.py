"""examples/agents_qa: the OpenAI Agents SDK QA agent's tool and reward, and a few training steps of its
train.yaml on the tiny model, with AIR: a search that finds nothing costs the call that asked for it."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adapters import AdapterSettings, build_batch
from agl.store import Store
from agl.types import Call, Mode, Status
from examples.agents_qa import data
from examples.agents_qa.agent import INDEX, normalize, reward, search
from tests.examples.training import train_example
from tests.gateway.stack import stack

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "agents_qa"
ERROR = re.compile(r"^Error:")  # a tool result that failed, as agent.py's search reports it
AIR = {"air_tool_error_reward": -0.5, "air_error_pattern": ERROR}  # the gateway's AIR settings
NOTHING = "zzqx"  # a query no passage matches


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (HERE / name).read_text().splitlines()]


def tool_call(query: str) -> str:
    return f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>'


# -------------------------------------------------------------------- fast: data, tool, reward


def test_the_shipped_data_is_what_data_py_writes_and_every_answer_is_in_the_corpus() -> None:
    corpus, train, val = data.build()
    assert (rows("corpus.jsonl"), rows("tasks.jsonl"), rows("val.jsonl")) == (corpus, train, val)
    assert 20 <= len(corpus) <= 60 and 20 <= len(train) <= 40 and 10 <= len(val) <= 20
    questions = [t["question"] for t in train + val]
    # none asked twice, none both trained on and validated
    assert len(set(questions)) == len(questions)
    text = " ".join(p["text"] for p in corpus)
    assert all(t["answer"] in text for t in train + val)


def test_search_ranks_the_passage_named_first_and_reports_failures_as_errors() -> None:
    found = INDEX.search("Penfold").splitlines()
    assert found[0].startswith("[town-11] Penfold: ") and len(found) == 1
    assert INDEX.search("river Sarn mountain").splitlines()[0].startswith("[river-0] River Sarn: ")
    assert len(INDEX.search("Veldmark valley town").splitlines()) == 3  # at most three
    for query in ["", "   ", "what is the", NOTHING]:
        assert INDEX.search(query).startswith("Error: "), query
    assert search.name == "search" and search.params_json_schema["required"] == ["query"]


@pytest.mark.parametrize(
    ("final", "value"),
    [
        ("Penfold is known for its paper.\nAnswer: Paper", 1.0),  # right, formatted
        ("Answer: the  paper!", 1.0),  # normalized: case, articles, punctuation, spaces
        ("paper", 0.9),  # right, not formatted
        ("Answer: paper\nI hope this helps.", 0.9),  # the answer line is not the last
        ("Answer: glass", 0.1),  # wrong, formatted
        ("It is known for paper.", 0.0),  # no Answer: line, and the whole reply is not the answer
        ("Answer:", 0.0),
        (None, 0.0),  # no final reply (too many turns)
    ],
)
def test_reward_is_0_9_for_the_exact_answer_and_0_1_for_the_format(
    final: str | None, value: float
) -> None:
    assert reward(final, "paper") == pytest.approx(value)


def test_normalize_is_squad_s() -> None:
    assert normalize(" The  Mount-Orrin. ") == "mountorrin" and normalize("An Ember") == "ember"


# -------------------------------------------------------------------- slow: the harness, and training


@pytest.mark.slow
def test_the_harness_answers_through_the_gateway_and_air_penalizes_the_failed_search(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    task = rows("tasks.jsonl")[0]
    script = [tool_call(NOTHING), tool_call("Penfold"), f"Answer: {task['answer']}"]
    with stack(tiny_path, tmp_path, script, **AIR) as gw:
        rollout = gw.rollout(task=task)
        env = os.environ | {
            "OPENAI_BASE_URL": rollout["base_url"],
            "OPENAI_API_KEY": rollout["agent_token"],
        }
        env |= {
            "AGL_GATEWAY_URL": gw.url,
            "AGL_ROLLOUT_ID": rollout["id"],
            "AGL_TASK": json.dumps(task),
        }
        done = subprocess.run(
            [sys.executable, str(HERE / "agent.py")], env=env, capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        calls = gw.store.calls_for([rollout["id"]])[rollout["id"]]
        events = [e.data for e in gw.store.events(rollout["id"]) if e.kind == "reward"]
    assert [c.agent for c in calls] == ["qa"] * 3 and {c.temperature for c in calls} == {0.7}
    tools = [m for m in calls[1].request["messages"] if m["role"] == "tool"]
    assert tools[0]["content"].startswith("Error: no passage matches")
    assert "[town-11] Penfold:" in calls[2].request["messages"][-1]["content"]
    assert events == [
        {"value": -0.5, "source": "air:tool_error", "final": False, "call_seq": calls[0].seq},
        {"value": 1.0, "source": "agent token", "final": True, "call_seq": None},
    ]


def failed_search(call: Call) -> bool:
    """The call asked for a search that finds nothing (the gateway records the sampled text)."""
    return tool_call(NOTHING) in call.response["text"]


@pytest.mark.slow
def test_train_yaml_trains_the_qa_agent_and_air_shapes_the_failed_search_s_advantages(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    # One task (the first), so the script's answers are right or wrong for every group. Finals cycle
    # through the four rewards (1, 0, 0.9, 0.1) and searches alternate between one that fails (AIR)
    # and one that finds the passage: the two rollouts of a group, served concurrently, end with
    # different rewards.
    task = rows("tasks.jsonl")[0]
    (tmp_path / "one.jsonl").write_text(json.dumps(task) + "\n")
    finals = [
        f"Answer: {task['answer']}",
        "I could not find it.",
        task["answer"],
        "Answer: Nowhere",
    ]
    cycle = [text for final in finals for text in (tool_call(NOTHING), final, tool_call("Penfold"))]
    overrides = [f"agl.tasks={tmp_path / 'one.jsonl'}", "agl.n=2", "agl.batch_groups=2"]
    overrides += ["agl.active_groups=2", "agl.intermediate_coef=1.0"]
    script = cycle * 60
    steps, calls = train_example(
        HERE / "train.yaml", tiny_path, tmp_path, script, *overrides, gateway=AIR
    )

    assert len(steps) == 2
    trained = [m for m in steps if "timing/update_s" in m]
    assert trained and all(
        m["adapter/rollouts_trained"] > 0 and m["adapter/trained_tokens"] > 0 for m in trained
    )
    assert all(math.isfinite(m["actor/grad_norm"]) for m in trained)
    # the configured agent, and only it, is trained: `qa`, its one agent
    assert all(m["calls/qa/trained"] > 0 and m["adapter/calls_untrained"] == 0 for m in steps)
    assert all({k for k in m if k.startswith("calls/")} == {"calls/qa/trained"} for m in steps)
    assert {c.agent for cs in calls.values() for c in cs} == {"qa"}
    # AIR: the penalty reached a trained call's advantages in the run
    assert sum(m["adapter/calls_shaped"] for m in steps) > 0

    # ... and where: rebuild the batch of the recorded rollouts, with their AIR rewards as the loop
    # reads them
    with Store(f"sqlite:///{tmp_path / 'gateway.db'}") as store:
        listed = store.list_rollouts(limit=1000)
        rollouts = [r for r in listed if r.status.terminal and r.mode is Mode.TRAIN]
        rewards = {
            r.id: [
                e.data for e in store.events(r.id) if e.kind == "reward" and e.attempt == r.attempt
            ]
            for r in rollouts
        }
    shaped = {
        rid: {e["call_seq"]: e["value"] for e in es if not e["final"]}
        for rid, es in rewards.items()
    }
    # every failed search but a rollout's last call (no request followed it) has its penalty, and
    # nothing else does; rollouts the run's end cancelled may have been cut between a failed search
    # and the next call
    ended = [r.id for r in rollouts if r.status is Status.SUCCEEDED]
    failed = {(rid, c.seq) for rid in ended for c in calls[rid][:-1] if failed_search(c)}
    assert failed and {(rid, seq) for rid in ended for seq in shaped[rid]} == failed
    assert all(v == -0.5 for s in shaped.values() for v in s.values())
    settings = AdapterSettings(
        intermediate_coef=1.0, trained_agents=frozenset({"qa"}), temperature=0.7
    )
    recorded = {r.id: calls[r.id] for r in rollouts}
    batch = build_batch(rollouts, recorded, settings, intermediate=shaped)
    assert batch.metrics["calls_shaped"] > 0
    by_seq = {(r.id, c.seq): c for r in rollouts for c in calls[r.id]}
    penalized = 0
    for i in [i for i in range(batch.n_samples) if batch.sample_rollout[i] >= 0]:
        rid = batch.rollout_ids[batch.sample_rollout[i]]
        a = batch.rollout_advantages[batch.sample_rollout[i]]
        span = slice(batch.offsets[i], batch.offsets[i + 1])
        # each call's sampled tokens, in order: the rollout's advantage, -0.5 on a failed search's
        expected = [
            a + shaped[rid].get(seq, 0.0)
            for seq in batch.sample_calls[i]
            for _ in range(len(by_seq[rid, seq].response_ids))
        ]
        trained_advantages = batch.advantages[span][batch.loss_mask[span]]
        np.testing.assert_allclose(trained_advantages, expected, rtol=0, atol=1e-6)
        penalized += sum(
            len(by_seq[rid, seq].response_ids)
            for seq in batch.sample_calls[i]
            if seq in shaped[rid]
        )
    assert penalized > 0
