"""A real stack on 127.0.0.1 for gateway tests: embedded engine (tiny model), store, gateway.

The engine runs the tiny random model, optionally in scripted mode (completion texts given in
order, with the model's real teacher-forced logprobs), which is what lets real harnesses reach
a deterministic end. Everything is real: uvicorn servers, HTTP, SQLite.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from agl.store import Store
from engine.batcher import Engine
from engine.server import create_app as engine_app
from gateway.app import make_app
from gateway.engines import EngineClient
from gateway.settings import GatewaySettings
from tests.gateway.conftest import serve

ADMIN = "admin-secret"


@dataclass
class Stack:
    url: str  # the gateway
    engine_url: str
    engine: Engine
    store: Store
    admin: httpx.Client

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


@contextmanager
def stack(
    model: Path, tmp: Path, script: list[str] | None = None, port: int = 0, admin: str = ADMIN, **settings: object
) -> Iterator[Stack]:
    with ExitStack() as stack:
        engine = Engine(model, script=script)
        stack.callback(engine.close)
        cfg = GatewaySettings(admin_key=admin, **settings)  # type: ignore[arg-type]
        engine_url = stack.enter_context(serve(engine_app(engine, api_key=cfg.engine_key)))  # the same key
        store = stack.enter_context(Store(f"sqlite:///{tmp / 'gateway.db'}"))
        key = {"Authorization": f"Bearer {cfg.engine_key}"} if cfg.engine_key else {}
        info = httpx.get(engine_url + "/model_info", headers=key).json()
        cfg.engine_url = [engine_url]
        app = make_app(cfg, store, EngineClient([engine_url], attempts=2, backoff_s=0.05, api_key=cfg.engine_key), info)
        url = stack.enter_context(serve(app, port))
        cfg.public_url = url
        client = stack.enter_context(httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}))
        yield Stack(url, engine_url, engine, store, client)
