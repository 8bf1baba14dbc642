"""Every process a benchmark starts: on 127.0.0.1, logged to a folder, killed when its stack closes.

- `Stack`: the engine (bench/gateway.py's instant stand-in of sglang's `/generate`, or `agl
  engine` with a model), `agl gateway` on a SQLite store, `agl controller` with the local
  launcher, or any other server (`Stack.start`); each waited for until it answers.
- `processes`: an empty stack in a folder of its own; `running`: the stand-in and a gateway up.
- `Balanced`, `balanced`: gateway replicas on one PostgreSQL database behind HAProxy (Debian's
  package), round-robining as a cluster's Service would.
- `run_logged`: a command run to its end, such as `examples/demo.py` (which starts its own engine,
  gateway, controller and trainer); `busy_core`: a process keeping one core busy meanwhile.
- Not here: what a benchmark measures, or the processes a controller launches (its runs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.postgres import database

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "bench-admin"  # every benchmark's gateway admin key
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_tokenizer() -> str:
    from engine import models

    cache = Path(os.environ.get("AGL_ENGINE_CACHE_DIR", "~/.cache/agl/models")).expanduser()
    return str(models.resolve("tiny", cache))


# --------------------------------------------------------------------------- processes


class Stack:
    """An engine, a gateway and a controller (or others), each a real process named in `procs`."""

    def __init__(self, tmp: Path, tokenizer: str | None = None) -> None:
        self.tmp = tmp
        self.tokenizer = tokenizer  # the stand-in's; None: the tiny model's, found when it starts
        self.db = f"sqlite:///{tmp / 'agl.db'}"
        self.engine_port, self.gateway_port = free_port(), free_port()
        self.engine = f"http://127.0.0.1:{self.engine_port}"
        self.url = f"http://127.0.0.1:{self.gateway_port}"
        self.env = os.environ | {
            "OMP_NUM_THREADS": "1",
            "AGL_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # The gateway's engine timeout (s): generous, as 1,000 calls at once queue at the
        # one-process stand-in; None (a model's engine) leaves the gateway's default.
        self.engine_timeout_s: float | None = 60.0

    def start(
        self,
        name: str,
        argv: list[str],
        ready: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = 60.0,
        cwd: Path = ROOT,
    ) -> None:
        """Starts `argv` in `cwd` (the repository's root) as process `name`, its output appended
        to `tmp`/NAME.log, and waits until the URL `ready` (if any) answers."""
        with (self.tmp / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, env=self.env | (env or {}), stdout=log, stderr=log, cwd=cwd
            )
        if ready:
            self.wait_ready(name, ready, timeout_s)

    def wait_ready(self, name: str, url: str, timeout_s: float) -> None:
        """Until `url` answers with a status under 500; an error naming the log if process `name`
        exits first, or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.procs[name].poll()
            if code is not None:
                raise RuntimeError(f"{name} exited with {code}; see {self.tmp / f'{name}.log'}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url, timeout=1).status_code < 500:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {url} did not answer in {timeout_s:.0f} s")
            time.sleep(0.1)

    def start_engine(self) -> None:
        """The stand-in engine (bench/gateway.py): instant replies, the tiny model's tokenizer."""
        if self.tokenizer is None:
            self.tokenizer = tiny_tokenizer()
        argv = [sys.executable, "-m", "bench.gateway", "--stand-in", str(self.engine_port)]
        self.start("engine", [*argv, "--tokenizer", self.tokenizer], self.engine + "/model_info")

    def start_model_engine(self, model: str, *flags: str) -> None:
        """`agl engine --model MODEL` with `flags` (`--max-batch 8`, ...): a real model on the
        CPU, so the gateway started after it keeps its own engine timeout."""
        argv = [sys.executable, "-m", "agl.cli", "engine", "--model", model]
        argv += ["--port", str(self.engine_port), *flags]
        self.engine_timeout_s = None
        # a model's first start converts its weights (SmolLM2's GGUF): minutes
        self.start("engine", argv, self.engine + "/model_info", timeout_s=600)

    def start_gateway(self) -> None:
        self.start_gateway_process("gateway", self.gateway_port)

    def start_gateway_process(self, name: str, port: int) -> None:
        """An `agl gateway` on the store and the engine, listening on `port`, named `name`."""
        argv = [sys.executable, "-m", "agl.cli", "gateway", "--engine-url", self.engine]
        argv += ["--db", self.db, "--port", str(port), "--admin-key", ADMIN]
        env = {}
        if self.engine_timeout_s is not None:
            env["AGL_GATEWAY_ENGINE_TIMEOUT_S"] = str(self.engine_timeout_s)
        self.start(name, argv, f"http://127.0.0.1:{port}/healthz", env)

    def start_controller(self, state_dir: Path, *flags: str, log_level: str = "INFO") -> None:
        """`agl controller` on the gateway (`url`) with the local launcher, its runs' state and
        logs in `state_dir`, and `flags` (`--max-running 16`, ...); not waited for."""
        argv = [sys.executable, "-m", "agl.cli", "controller", "--gateway", self.url]
        argv += ["--admin-key", ADMIN, "--launcher", "local", "--state-dir", str(state_dir)]
        self.start("controller", [*argv, *flags], env={"AGL_LOG_LEVEL": log_level})

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
        """Every process still in `procs` killed, the last started first."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                proc.terminate()
            self.kill(name, signal.SIGKILL)


@contextlib.contextmanager
def processes(tmp: Path | None = None) -> Iterator[Stack]:
    """A stack with nothing started yet, in `tmp` (None: a temporary folder, removed on exit);
    everything started in it is killed on exit."""
    with contextlib.ExitStack() as exits:
        if tmp is None:
            tmp = Path(exits.enter_context(tempfile.TemporaryDirectory()))
        stack = Stack(tmp)
        exits.callback(stack.close)
        yield stack


@contextlib.contextmanager
def running(tmp: Path | None = None, env: dict[str, str] | None = None) -> Iterator[Stack]:
    """Engine stand-in and gateway up (`env` added to their environment); everything started is
    killed on exit."""
    with processes(tmp) as stack:
        stack.env |= env or {}
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
        super().__init__(tmp)
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
        self.start("balancer", [haproxy, "-db", "-f", str(config)], self.url + "/healthz")


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


# --------------------------------------------------------------------------- commands


def run_logged(argv: list[str], log: Path) -> int:
    """`argv` run to its end from the repository's root, its output written to `log`; its exit
    status. For a command that starts and stops its own processes (examples/demo.py)."""
    with log.open("wb") as out:
        return subprocess.run(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """Another process keeping one core busy while the block runs, as on a shared machine."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        busy.kill()
        busy.wait()
