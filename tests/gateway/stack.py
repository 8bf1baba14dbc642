"""A real stack on 127.0.0.1 for gateway tests: an engine, a store and a gateway.

The engine is the embedded one running the tiny random model, optionally in scripted mode (completion
texts given in order, with the model's real teacher-forced logprobs), which is what lets real harnesses
reach a deterministic end; or the scripted sglang stand-in (tests/sglang.py), which answers as sglang
0.5.13 does. Everything else is real: uvicorn servers, HTTP, SQLite.

The SDK clients a test opens through the Stack (`openai_client`, `anthropic_client`) are closed
with it, before its servers stop: a client left to the garbage collector can leave its socket to be
finalized during a later test, where the ResourceWarning fails that test instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import httpx
import openai

from agl.store import Store
from engine.batcher import Engine
from engine.server import create_app as engine_app
from gateway.app import make_app
from gateway.engine_replies import EngineInfo
from gateway.engines import EngineClient
from gateway.settings import GatewaySettings
from tests.gateway.conftest import serve
from tests.sglang import SglangStandIn

ADMIN = "admin-secret"


@dataclass
class Stack:
    url: str  # the gateway
    engine_url: str
    engine: Engine | None  # the embedded engine, when it is the one served
    store: Store
    admin: httpx.Client
    clients: ExitStack = field(default_factory=ExitStack)  # closes the SDK clients tests open

    def train_overrides(self, run_dir: Path) -> list[str]:
        """`agl train` pointed at this stack: one torch thread, quick polling, no warm-up, checkpoints and
        console metrics in `run_dir`."""
        return [
            *[f"agl.gateway={self.url}", f"agl.engine={self.engine_url}", f"agl.admin_key={ADMIN}"],
            *["agl.threads=1", "agl.poll_s=0.1", "actor_rollout_ref.actor.optim.lr_warmup_steps=0"],
            *[f"trainer.default_local_dir={run_dir}", "trainer.logger=[console]"],
        ]

    def rollout(self, group: str = "g", **body: object) -> dict:
        reply = self.admin.post("/api/rollouts", json={"task": {"q": 1}, "group": group, **body})
        reply.raise_for_status()
        return reply.json()

    def openai_client(
        self, token: str, max_retries: int = openai.DEFAULT_MAX_RETRIES, base_url: str = ""
    ) -> openai.OpenAI:
        """An OpenAI client calling this gateway (or `base_url`) with an agent `token`, closed with
        the stack."""
        client = openai.OpenAI(
            base_url=base_url or self.url + "/v1", api_key=token, max_retries=max_retries
        )
        return self.clients.enter_context(client)

    def anthropic_client(
        self, token: str, max_retries: int = anthropic.DEFAULT_MAX_RETRIES
    ) -> anthropic.Anthropic:
        """An Anthropic client calling this gateway with an agent `token`, closed with the stack."""
        client = anthropic.Anthropic(base_url=self.url, api_key=token, max_retries=max_retries)
        return self.clients.enter_context(client)


def read_engine_info(url: str, key: str = "") -> EngineInfo:
    """What the engine at `url` says of itself, read as the gateway reads it at start."""

    async def read() -> EngineInfo:
        async with EngineClient([url], api_key=key) as engines:
            return await engines.model_info()

    return asyncio.run(read())


@contextmanager
def gateway(
    engine_url: str, tmp: Path, port: int = 0, admin: str = ADMIN, **settings: object
) -> Iterator[Stack]:
    """A store and a gateway in front of the engine at `engine_url`; the Stack's `engine` is not set."""
    with ExitStack() as stack:
        cfg = GatewaySettings(admin_key=admin, engine_url=[engine_url], **settings)  # type: ignore[arg-type]
        store = stack.enter_context(Store(f"sqlite:///{tmp / 'gateway.db'}"))
        info = read_engine_info(engine_url, cfg.engine_key)
        engines = EngineClient([engine_url], attempts=2, backoff_s=0.05, api_key=cfg.engine_key)
        url = stack.enter_context(serve(make_app(cfg, store, engines, info), port))
        cfg.public_url = url
        client = stack.enter_context(
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"})
        )
        s = Stack(url=url, engine_url=engine_url, engine=None, store=store, admin=client)
        # the SDK clients tests opened close first, before the gateway they call stops
        stack.enter_context(s.clients)
        yield s


@contextmanager
def stack(
    model: Path,
    tmp: Path,
    script: list[str] | None = None,
    port: int = 0,
    admin: str = ADMIN,
    **settings: object,
) -> Iterator[Stack]:
    """The embedded engine (the tiny model, scripted if `script` is given) behind a gateway."""
    with ExitStack() as stack:
        engine = Engine(model, script=script)
        stack.callback(engine.close)
        key = str(settings.get("engine_key", ""))
        # the gateway's engine key
        engine_url = stack.enter_context(serve(engine_app(engine, api_key=key)))
        s = stack.enter_context(gateway(engine_url, tmp, port, admin, **settings))
        s.engine = engine
        yield s


@contextmanager
def sglang_stack(sglang: SglangStandIn, tmp: Path, **settings: object) -> Iterator[Stack]:
    """The scripted sglang stand-in (tests/sglang.py) behind a gateway; the Stack's `engine` is not set."""
    with sglang.served() as engine_url, gateway(engine_url, tmp, **settings) as s:
        yield s
