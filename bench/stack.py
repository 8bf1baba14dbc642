"""Real processes for the benches and their tests: the engine stand-in of bench/gateway.py (an
instant sglang `/generate`), `agl gateway` (one process on SQLite, or replicas on one PostgreSQL
database behind HAProxy, Debian's package, round-robining as a cluster's Service would) and
`agl controller`. Each is started on 127.0.0.1 and killed when its stack closes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.gateway import ADMIN, free_port, wait
from bench.postgres import database

ROOT = Path(__file__).resolve().parents[1]


def tiny_tokenizer() -> str:
    from engine import models

    cache = Path(os.environ.get("AGL_ENGINE_CACHE_DIR", "~/.cache/agl/models")).expanduser()
    return str(models.resolve("tiny", cache))


# --------------------------------------------------------------------------- processes


class Stack:
    """The stand-in engine and a gateway (and later a controller), each a real process."""

    def __init__(self, tmp: Path, tokenizer: str) -> None:
        self.tmp, self.tokenizer = tmp, tokenizer
        self.db = f"sqlite:///{tmp / 'soak.db'}"
        self.engine_port, self.gateway_port = free_port(), free_port()
        self.engine = f"http://127.0.0.1:{self.engine_port}"
        self.url = f"http://127.0.0.1:{self.gateway_port}"
        self.env = os.environ | {
            "OMP_NUM_THREADS": "1",
            "AGL_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # generous: 1,000 calls at once queue at the one-process stand-in
        self.engine_timeout_s = 60.0

    def start_engine(self) -> None:
        argv = [sys.executable, "-m", "bench.gateway", "--stand-in", str(self.engine_port)]
        self._start("engine", [*argv, "--tokenizer", self.tokenizer], self.engine + "/model_info")

    def start_gateway(self) -> None:
        self.start_gateway_process("gateway", self.gateway_port)

    def start_gateway_process(self, name: str, port: int) -> None:
        """An `agl gateway` on the store and the stand-in, listening on `port`, named `name`."""
        argv = [sys.executable, "-m", "agl.cli", "gateway", "--engine-url", self.engine]
        argv += ["--db", self.db, "--port", str(port), "--admin-key", ADMIN]
        env = {"AGL_GATEWAY_ENGINE_TIMEOUT_S": str(self.engine_timeout_s)}
        self._start(name, argv, f"http://127.0.0.1:{port}/healthz", env)

    def start_controller(self, state_dir: Path, max_running: int) -> None:
        argv = [sys.executable, "-m", "agl.cli", "controller", "--gateway", self.url]
        argv += ["--admin-key", ADMIN, "--state-dir", str(state_dir)]
        argv += ["--max-running", str(max_running), "--poll-s", "0.1"]
        self._start("controller", argv, None, {"AGL_LOG_LEVEL": "INFO"})

    def _start(
        self, name: str, argv: list[str], health: str | None, env: dict[str, str] | None = None
    ) -> None:
        log = (self.tmp / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            argv, env=self.env | (env or {}), stdout=log, stderr=log, cwd=ROOT
        )
        log.close()
        if health:
            wait(health)

    def gateway_url(self) -> str:
        """The URL of the process named "gateway" itself (`url` may be a load balancer's)."""
        return self.url

    def kill_gateways(self) -> None:
        """An outage: every gateway SIGKILLed."""
        self.kill("gateway")

    def start_gateways(self) -> None:
        """Every gateway started again after an outage."""
        self.start_gateway()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait()

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def close(self) -> None:
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                proc.terminate()
            self.kill(name, signal.SIGKILL)


@contextlib.contextmanager
def running(tmp: Path | None = None, env: dict[str, str] | None = None) -> Iterator[Stack]:
    """Engine stand-in and gateway up (`env` added to their environment); everything started is
    killed on exit."""
    with contextlib.ExitStack() as exits:
        if tmp is None:
            tmp = Path(exits.enter_context(tempfile.TemporaryDirectory()))
        stack = Stack(tmp, tiny_tokenizer())
        stack.env |= env or {}
        exits.callback(stack.close)
        stack.start_engine()
        stack.start_gateway()
        yield stack


HAPROXY = """\
global
    maxconn 4000
defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    # a refused connection goes to another replica (nothing was sent yet)
    retries 3
    option redispatch
frontend agl
    bind 127.0.0.1:{port}
    default_backend gateways
backend gateways
{balance}
    # A replica is out after 3 failed checks a second apart (a refused connection meanwhile goes
    # to another: `retries`); a check may take 5 s, as /healthz does under 1,000 harnesses at once.
    option httpchk GET /healthz
    http-check expect status 200
    timeout check 5s
    default-server inter 1s fall 3 rise 1
{servers}
"""


class Balanced(Stack):
    """The stand-in engine, gateway replicas on one PostgreSQL, and HAProxy in front of them."""

    def __init__(self, tmp: Path, db: str) -> None:
        super().__init__(tmp, tiny_tokenizer())
        self.db = db
        self.balancer_port = free_port()
        self.url = f"http://127.0.0.1:{self.balancer_port}"
        self.ports: list[int] = []

    def replica(self, i: int) -> str:
        """Replica `i`'s own URL (past the balancer)."""
        return f"http://127.0.0.1:{self.ports[i]}"

    @staticmethod
    def name(i: int) -> str:
        """Replica `i`'s process name; replica 0 is "gateway", the one bench/soak.py's phases kill."""
        if i == 0:
            return "gateway"
        return f"gateway{i}"

    def gateway_url(self) -> str:
        return self.replica(0)

    def kill_gateways(self) -> None:
        for i in range(len(self.ports)):
            if self.name(i) in self.procs:
                self.kill(self.name(i))

    def start_gateways(self) -> None:
        for i in range(len(self.ports)):
            self.start_replica(i)

    def start_gateway(self) -> None:
        """(Re)starts replica 0: what bench/soak.py's phases call after killing "gateway"."""
        self.start_replica(0)

    def start_replica(self, i: int) -> None:
        """Starts replica `i` (again, on its port, after a kill)."""
        while len(self.ports) <= i:
            self.ports.append(free_port())
        self.start_gateway_process(self.name(i), self.ports[i])

    def start_balancer(self, replicas: int, *, sticky: bool = False) -> None:
        """HAProxy over replicas 0 .. `replicas` - 1 (restarted if running): round-robin, or with
        `sticky` a consistent hash of the `Authorization` header (a rollout's calls stay on one
        replica while it is up)."""
        if "balancer" in self.procs:
            self.kill("balancer")
        servers = "\n".join(
            f"    server g{i} 127.0.0.1:{self.ports[i]} check" for i in range(replicas)
        )
        config = self.tmp / "haproxy.cfg"
        balance = "    balance roundrobin"
        if sticky:
            balance = "    balance hdr(Authorization)\n    hash-type consistent"
        config.write_text(HAPROXY.format(port=self.balancer_port, servers=servers, balance=balance))
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self._start("balancer", [haproxy, "-db", "-f", str(config)], self.url + "/healthz")


@contextlib.contextmanager
def balanced(server_url: str, replicas: int, *, sticky: bool = False) -> Iterator[Balanced]:
    """The stand-in, `replicas` gateways on a fresh database, and the balancer; all killed on exit."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        database(server_url) as db,
        contextlib.ExitStack() as exits,
    ):
        stack = Balanced(Path(tmp), db)
        exits.callback(stack.close)
        stack.start_engine()
        for i in range(replicas):
            stack.start_replica(i)
        stack.start_balancer(replicas, sticky=sticky)
        yield stack
