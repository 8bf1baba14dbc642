"""examples/langchain_sql: the reward and the SQL helpers, and a few training steps of its train.yaml.

The training test runs the unchanged LangChain harness on a real stack with the tiny model in scripted mode
(tests/examples/training.py). Every scripted text serves whichever agent asks: a ```sql block (what the
writer and the rewriter answer) followed by a review (what the checker answers). Every review says WRONG,
so every rollout makes the same five calls (writer, checker, rewriter, checker, rewriter) and its answer is
its last text. One group runs at a time (agl.active_groups=1, hence batch_groups=1), so a group's two
rollouts take ten consecutive texts in some interleaving, and whichever rollout ends last ends on the tenth:
the tenth is the gold query and the other nine are wrong, so every group has one reward of 1 and one of 0,
by construction rather than by the luck of the interleaving (with two groups at once, half the groups of a
run came out degenerate). The checks: writer and rewriter calls are trained, the checker's are recorded and
served but not trained, and training happened.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from examples.langchain_sql import agent
from tests.examples.training import ROOT, train_example

EXAMPLE = ROOT / "examples" / "langchain_sql"
TASKS = [json.loads(line) for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines()]
VAL = [json.loads(line) for line in (EXAMPLE / "val.jsonl").read_text().splitlines()]
MARKETING = next(
    t for t in TASKS if t["question"] == "Which employees work in the Marketing department?"
)


@pytest.fixture
def db() -> sqlite3.Connection:
    return agent.open_database()


def test_every_gold_query_runs_and_scores_one(db: sqlite3.Connection) -> None:
    assert 20 <= len(TASKS) <= 40 and 10 <= len(VAL) <= 20
    assert not {t["question"] for t in TASKS} & {t["question"] for t in VAL}
    for task in TASKS + VAL:
        assert agent.run(db, task["gold"]), task["question"]
        assert agent.reward(db, task["gold"], task) == 1.0, task["question"]


def test_reward_compares_result_sets(db: sqlite3.Connection) -> None:
    # the same rows in another order, with other column names: right unless the question asks for an order
    shuffled = "SELECT e.name AS who FROM departments d JOIN employees e ON d.id = e.department_id "
    assert agent.reward(db, shuffled + "WHERE d.id = 3 ORDER BY e.name DESC", MARKETING) == 1.0
    ordered = next(t for t in TASKS if t["question"] == "List all employees ordered by name.")
    assert agent.reward(db, "SELECT name FROM employees ORDER BY name DESC", ordered) == 0.0
    # rows missing, duplicated, extra columns, an error, a write: all wrong
    missing = "SELECT name FROM employees WHERE department_id = 3 LIMIT 2"
    assert agent.reward(db, missing, MARKETING) == 0.0
    twice = (
        "SELECT e.name FROM employees e JOIN sales s ON s.employee_id = e.id OR 1 "
        "WHERE e.department_id = 3"
    )
    assert agent.reward(db, twice, MARKETING) == 0.0
    extra_column = "SELECT name, salary FROM employees WHERE department_id = 3"
    assert agent.reward(db, extra_column, MARKETING) == 0.0
    assert agent.reward(db, "SELECT name FROM staff", MARKETING) == 0.0
    assert agent.reward(db, "DELETE FROM employees", MARKETING) == 0.0
    assert agent.run(db, "SELECT COUNT(*) FROM employees") == [(18,)]  # the write did not happen
    # averages compare to 2 decimals
    average = next(
        t for t in TASKS if t["question"].startswith("What is the average salary in each")
    )
    rounded = (
        "SELECT d.name, ROUND(AVG(e.salary), 2) FROM departments d "
        "JOIN employees e ON e.department_id = d.id"
    )
    assert agent.reward(db, rounded + " GROUP BY d.id", average) == 1.0


def test_runaway_queries_are_stopped(db: sqlite3.Connection) -> None:
    endless = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"
    )
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        agent.run(db, endless)
    assert agent.describe(db, endless) == "error: interrupted"
    assert agent.run(db, "SELECT 1") == [(1,)]  # the connection is usable afterwards


def test_replies_are_parsed() -> None:
    two_blocks = "Here:\n```sql\nSELECT 1\n```\nand better:\n```SQL\nSELECT 2;\n```"
    assert agent.extract_sql(two_blocks) == "SELECT 2;"
    query = "SELECT name FROM departments"
    assert agent.extract_sql(f"```\n{query}\n```") == query
    assert agent.extract_sql(f"The query is {query}") == query
    assert agent.extract_sql("no idea") == "no idea"
    assert agent.approved("OK") and agent.approved("The query is right. OK.")
    assert not agent.approved("WRONG: it counts the wrong table. Otherwise OK")
    assert not agent.approved("Looks fine to me")  # neither: the rewriter gets another look


def test_the_checker_sees_rows_or_the_error(db: sqlite3.Connection) -> None:
    lisbon = "SELECT name FROM departments WHERE city = 'Lisbon'"
    assert agent.describe(db, lisbon) == "1 rows: [('Support',)]"
    first_ten = "18 rows (first 10 shown): [(1,), (2,)"
    assert agent.describe(db, "SELECT id FROM employees").startswith(first_ten)
    assert agent.describe(db, "SELECT x FROM employees") == "error: no such column: x"
    assert "CREATE TABLE sales" in agent.schema(db)


def script(groups: int) -> list[str]:
    """Blocks of ten texts, one a group (see the module): nine wrong queries, then the gold one, all
    WRONG."""
    wrong = ["SELECT name FROM employees WHERE department_id = 2", "SELECT name FROM staff"]
    review = "WRONG: match the department by its name."
    block = [f"```sql\n{wrong[i % 2]}\n```\n{review}" for i in range(9)]
    block.append(f"```sql\n{MARKETING['gold']}\n```\n{review}")
    return block * groups


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_writer_and_rewriter_train_and_the_checker_does_not(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    # one question, which the scripted queries are about
    tasks.write_text(json.dumps(MARKETING) + "\n")
    small = ["agl.n=2", "agl.batch_groups=1", "agl.active_groups=1", f"agl.tasks={tasks}"]
    steps, calls = train_example(EXAMPLE / "train.yaml", tiny_path, tmp_path, script(40), *small)

    assert len(steps) == 2
    for cs in calls.values():  # each rollout: the writer, then two rounds of check and rewrite
        agents = [c.agent for c in sorted(cs, key=lambda c: c.seq)]
        assert agents == ["writer", *["checker", "rewriter"] * 2]
        assert all(c.temperature == (0.0 if c.agent == "checker" else 0.7) for c in cs)
    for m in steps:
        # the checker's calls are recorded and served, and they are exactly the untrained ones
        assert "calls/checker/trained" not in m and m["calls/checker/untrained"] == 4, m
        assert m["adapter/calls_untrained"] == m["calls/checker/untrained"], m
        # the writer's and the rewriter's are trained: both rollouts of the mixed group, one sample per call
        assert m["calls/writer/trained"] == 2 and m["calls/rewriter/trained"] == 4, m
        assert "calls/writer/untrained" not in m and "calls/rewriter/untrained" not in m, m
        assert m["reward/mean"] == 0.5 and m["adapter/rollouts_trained"] == 2, m
        assert m["adapter/samples"] == 6 and m["adapter/trained_tokens"] > 0, m
        assert math.isfinite(m["actor/grad_norm"]), m
