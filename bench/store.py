"""Store write throughput: calls of 4,096 prompt + 512 response tokens from 32 concurrent writers.

Baseline, in the same run: the same bytes written with plain `sqlite3` `executemany` in
transactions of 256 rows, with the store's pragmas (WAL, AGL_STORE_SQLITE_SYNCHRONOUS). Prints
both rates; the last line is `store_calls_per_s=N baseline_ratio=R`. Targets: N >= 1000,
R >= 0.5.

With `--postgres URL` (a server; default AGL_TEST_POSTGRES_URL), the same on a fresh PostgreSQL
database first, against psycopg's `executemany` into a table of the same database, printed as
`postgres: store_calls_per_s=N baseline_ratio=R` before the SQLite figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
import threading
import time
from array import array
from pathlib import Path

import sqlalchemy as sa

from agl.settings import StoreSettings
from agl.store import Store
from agl.types import Call, Status
from bench.postgres import database
from bench.quick import parse_args

PROMPT, RESPONSE = 4096, 512


def make_call(rollout_id: str, k: int) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_ids=array("i", [(k + i) % 151_000 for i in range(PROMPT)]),
        response_ids=array("i", [(k * 7 + i) % 151_000 for i in range(RESPONSE)]),
        logprobs=array("f", [-(i % 50) / 10 for i in range(RESPONSE)]),
        agent="bench",
        request={"messages": [{"role": "user", "content": "x" * 200}]},
        response={"choices": [{"message": {"content": "y" * 200}}]},
    )


def bench_store(url: str, writers: int, per_writer: int) -> float:
    with Store(url) as store:
        rollouts = []
        for _ in range(writers):
            rid = store.create_rollout({}, "bench").result().rollout.id
            store.transition(rid, Status.RUNNING).result()
            rollouts.append(rid)
        calls = [[make_call(rid, k) for k in range(per_writer)] for rid in rollouts]
        start = threading.Barrier(writers + 1)

        def writer(mine: list[Call]) -> None:
            start.wait()
            for call in mine:
                store.append_call(call).result()

        threads = [threading.Thread(target=writer, args=(mine,)) for mine in calls]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        assert sum(len(v) for v in store.calls_for(rollouts).values()) == writers * per_writer
    return writers * per_writer / elapsed


def baseline_rows(n: int) -> list[tuple]:
    """The bytes `bench_store` writes, as plain rows."""
    rows = []
    for k in range(n):
        c = make_call("r", k)
        rows.append(
            (
                "r",
                k,
                json.dumps(c.request),
                json.dumps(c.response),
                c.prompt_ids.tobytes(),
                c.response_ids.tobytes(),
                c.logprobs.tobytes(),
            )
        )
    return rows


def bench_baseline(path: Path, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={StoreSettings().sqlite_synchronous}")
    conn.execute(
        "CREATE TABLE calls (id INTEGER PRIMARY KEY, rollout_id TEXT, seq INT, request TEXT, response TEXT, "
        "prompt_ids BLOB, response_ids BLOB, logprobs BLOB)"
    )
    rows = baseline_rows(n)
    t0 = time.perf_counter()
    for i in range(0, n, 256):
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO calls (rollout_id, seq, request, response, prompt_ids, response_ids, logprobs) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows[i : i + 256],
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return n / elapsed


def bench_postgres_baseline(url: str, n: int) -> float:
    """psycopg's `executemany` of the same rows into a table of the database `url` names, in
    transactions of 256 rows."""
    import psycopg

    conninfo = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as conn:
        conn.execute(
            "CREATE TABLE baseline_calls (id SERIAL PRIMARY KEY, rollout_id TEXT, seq INT, "
            "request JSON, response JSON, prompt_ids BYTEA, response_ids BYTEA, logprobs BYTEA)"
        )
        conn.commit()
        rows = baseline_rows(n)
        t0 = time.perf_counter()
        with conn.cursor() as cursor:
            for i in range(0, n, 256):
                cursor.executemany(
                    "INSERT INTO baseline_calls (rollout_id, seq, request, response, prompt_ids, "
                    "response_ids, logprobs) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    rows[i : i + 256],
                )
                conn.commit()
        return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--per-writer", type=int, default=125)
    parser.add_argument(
        "--postgres",
        default=os.environ.get("AGL_TEST_POSTGRES_URL", ""),
        help="a PostgreSQL server's URL, measured too (default: AGL_TEST_POSTGRES_URL)",
    )
    args = parse_args(parser, writers=4, per_writer=25)
    n = args.writers * args.per_writer
    if args.postgres:
        with database(args.postgres) as url:
            pg_baseline = bench_postgres_baseline(url, n)
            pg_rate = bench_store(url, args.writers, args.per_writer)
        print(
            f"PostgreSQL: agl store {pg_rate:,.0f} calls/s, psycopg executemany {pg_baseline:,.0f}"
        )
        print(
            f"postgres: store_calls_per_s={pg_rate:.0f} baseline_ratio={pg_rate / pg_baseline:.2f}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        baseline = bench_baseline(Path(tmp) / "baseline.db", n)
        rate = bench_store(f"sqlite:///{Path(tmp) / 'store.db'}", args.writers, args.per_writer)
    print(f"calls: {n} from {args.writers} writers, {PROMPT}+{RESPONSE} tokens each")
    print(f"agl store: {rate:,.0f} calls/s")
    print(f"plain sqlite3 executemany: {baseline:,.0f} calls/s")
    print(f"store_calls_per_s={rate:.0f} baseline_ratio={rate / baseline:.2f}")


if __name__ == "__main__":
    main()
