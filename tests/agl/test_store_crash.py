"""Crash consistency: SIGKILL in the middle of a stream of writes loses nothing acknowledged."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agl.store import Store
from tests.agl.crash_writer import payload

WRITER = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("acks_before_kill", [1, 150, 600])
def test_sigkill_mid_stream_keeps_every_acknowledged_write(db_url, acks_before_kill):
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), db_url, "6"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    acked: dict[int, int] = {}
    try:
        for line in proc.stdout:
            _, seq, k = line.split()
            acked[int(seq)] = int(k)
            if len(acked) >= acks_before_kill:
                proc.send_signal(signal.SIGKILL)
                break
        for line in proc.stdout:  # acknowledgements already written before the kill landed
            _, seq, k = line.split()
            acked[int(seq)] = int(k)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(acked) >= acks_before_kill

    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with Store(db_url) as store:
        (rollout,) = store.list_rollouts(group="crash")
        stored = {c.seq: c for c in store.calls_for([rollout.id])[rollout.id]}
    assert set(acked) <= set(stored)
    for seq, k in acked.items():
        prompt, response, logprobs = payload(k)
        call = stored[seq]
        assert (call.prompt_ids, call.response_ids, call.logprobs) == (prompt, response, logprobs)
    assert sorted(c.seq for c in stored.values()) == list(range(len(stored)))
