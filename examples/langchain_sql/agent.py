"""Text-to-SQL with three LangChain agents: a writer, a checker and a rewriter, over a small SQLite shop.

It knows nothing about agl. Each agent is a LangChain chain (prompt | ChatOpenAI | StrOutputParser) with
its own model name, which is what a deployment would route on and what agl calls the agent; ChatOpenAI
reads OPENAI_BASE_URL / OPENAI_API_KEY from the environment like any deployment. The task comes from
AGL_TASK ({"question", "gold", "ordered"}).

The loop, as in the Agent Lightning paper's SQL agent: the `writer` writes a query for the question; the
query runs on the shop database (shop.sql, created in memory for each rollout, read-only); the `checker`
sees the query and its result (or error) and answers OK or WRONG with what is wrong; on WRONG the
`rewriter` writes a corrected query from that feedback, which is checked again, at most MAX_ROUNDS times
(the last rewrite is not checked: it is the answer). The reward, posted to AGL_GATEWAY_URL with the
rollout's own token, is 1 when the final query's rows equal the gold query's (as a multiset, or as a list
when the question asks for an order; numbers rounded to 2 decimals), else 0. Exit code 0 means it ran to
the end, whatever the answer.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import httpx
import openai
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable
from langchain_openai import ChatOpenAI

DATABASE = Path(__file__).resolve().parent / "shop.sql"
MAX_ROUNDS = 2  # checks (each followed by a rewrite on WRONG)
SHOWN_ROWS = 10  # result rows the checker sees
# SQLite virtual-machine steps before a query is stopped (a cross join of everything)
MAX_STEPS = 2_000_000

WRITE = ChatPromptTemplate.from_messages(
    [
        (
            "system",
            "You write SQLite queries. Database schema:\n{schema}\n"
            "Reply with one query in a ```sql block.",
        ),
        ("human", "{question}"),
    ]
)
CHECK = ChatPromptTemplate.from_messages(
    [
        (
            "system",
            "You check SQLite queries. Database schema:\n{schema}\n"
            "Given a question, a query and its result, reply OK if the query answers the question; "
            "otherwise reply WRONG: and say what is wrong.",
        ),
        ("human", "Question: {question}\nQuery:\n```sql\n{query}\n```\nResult: {result}"),
    ]
)
REWRITE = ChatPromptTemplate.from_messages(
    [
        (
            "system",
            "You fix SQLite queries. Database schema:\n{schema}\n"
            "Reply with one query in a ```sql block.",
        ),
        (
            "human",
            "Question: {question}\nQuery:\n```sql\n{query}\n```\nResult: {result}\n"
            "Review: {feedback}\nWrite the corrected query.",
        ),
    ]
)


def agent(prompt: ChatPromptTemplate, name: str, temperature: float, max_tokens: int) -> Runnable:
    """One agent: its prompt, its own model name, its text reply."""
    model = ChatOpenAI(model=name, temperature=temperature, max_tokens=max_tokens, max_retries=2)
    return prompt | model | StrOutputParser()


def open_database() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.executescript(DATABASE.read_text())
    db.execute("PRAGMA query_only = ON")  # the agents' queries read, never write
    return db


def schema(db: sqlite3.Connection) -> str:
    tables = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table'")
    return "\n".join(row[0] + ";" for row in tables)


def run(db: sqlite3.Connection, query: str) -> list[tuple]:
    """The query's rows; raises sqlite3.Error (sqlite3.OperationalError "interrupted" past MAX_STEPS)."""
    steps = iter(range(MAX_STEPS // 1000))
    db.set_progress_handler(lambda: next(steps, None) is None, 1000)
    try:
        return db.execute(query).fetchall()
    finally:
        db.set_progress_handler(None, 0)


def extract_sql(text: str) -> str:
    """The last ```sql (or ```) block of a reply, else from its first SELECT/WITH to its end, else
    the reply."""
    blocks = re.findall(r"```(?:sql)?\s*\n?(.*?)```", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1].strip()
    found = re.search(r"\b(SELECT|WITH)\b.*", text, re.DOTALL | re.IGNORECASE)
    return (found.group(0) if found else text).strip()


def describe(db: sqlite3.Connection, query: str) -> str:
    """The query's result as the checker and rewriter see it: the first rows and the count, or the error."""
    try:
        rows = run(db, query)
    except (sqlite3.Error, sqlite3.Warning) as e:
        return f"error: {e}"
    more = f" (first {SHOWN_ROWS} shown)" if len(rows) > SHOWN_ROWS else ""
    return f"{len(rows)} rows{more}: {rows[:SHOWN_ROWS]}"


def approved(review: str) -> bool:
    """The checker said OK and not WRONG."""
    said_ok = re.search(r"\bOK\b", review) is not None
    said_wrong = re.search(r"\bWRONG\b", review, re.IGNORECASE) is not None
    return said_ok and not said_wrong


def normalized(rows: list[tuple]) -> list[tuple]:
    return [tuple(round(v, 2) if isinstance(v, float) else v for v in row) for row in rows]


def reward(db: sqlite3.Connection, query: str, task: dict) -> float:
    """1 when the query's rows equal the gold query's (in order when the task says `ordered`), else 0."""
    try:
        got = normalized(run(db, query))
    except (sqlite3.Error, sqlite3.Warning):
        return 0.0
    gold = normalized(run(db, task["gold"]))
    same = got == gold if task.get("ordered") else Counter(got) == Counter(gold)
    return 1.0 if same else 0.0


def solve(db: sqlite3.Connection, question: str) -> tuple[str, list[dict]]:
    """The final query and the trace of rounds (query, result, review)."""
    writer = agent(WRITE, "writer", temperature=0.7, max_tokens=160)
    # a judge, greedy; it is not trained
    checker = agent(CHECK, "checker", temperature=0.0, max_tokens=120)
    rewriter = agent(REWRITE, "rewriter", temperature=0.7, max_tokens=160)
    context = {"schema": schema(db), "question": question}
    query = extract_sql(writer.invoke(context))
    trace: list[dict] = []
    for _ in range(MAX_ROUNDS):
        result = describe(db, query)
        review = checker.invoke({**context, "query": query, "result": result})
        trace.append({"query": query, "result": result, "review": review})
        if approved(review):
            break
        rewrite = {**context, "query": query, "result": result, "feedback": review}
        query = extract_sql(rewriter.invoke(rewrite))
    return query, trace


def main() -> int:
    task = json.loads(os.environ["AGL_TASK"])
    db = open_database()
    try:
        query, trace = solve(db, task["question"])
    except openai.PermissionDeniedError:
        return 0  # the rollout was ended from outside (e.g. cancelled): stop at once
    report(reward(db, query, task), query, trace)
    return 0


def report(value: float, query: str, trace: list[dict]) -> None:
    """Post the reward with the rollout's own token, and print it."""
    url = f"{os.environ['AGL_GATEWAY_URL']}/api/rollouts/{os.environ['AGL_ROLLOUT_ID']}/reward"
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    httpx.post(url, json={"reward": value}, headers=headers)
    print(json.dumps({"query": query, "rounds": trace, "reward": value}))


if __name__ == "__main__":
    sys.exit(main())
