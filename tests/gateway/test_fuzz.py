"""Every endpoint of the gateway's OpenAPI schema fuzzed with schemathesis, on SQLite and
PostgreSQL: no input earns a 5xx.

The gateway parses its bodies itself (to answer bad input in the caller's wire format), so its
schema has no request bodies; the test adds each route's pydantic schema (`gateway.wire`,
`gateway.routes`) so that bodies are generated from what the gateway really accepts, and
schemathesis also sends ones that break it. Real gateway and store on 127.0.0.1; the
engine is the instant stand-in of bench/gateway.py (a fake, so that valid calls cost nothing).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from agl.store import Store
from bench.gateway import stand_in_app
from gateway import routes, wire
from gateway.app import make_app
from gateway.engines import EngineClient
from gateway.settings import GatewaySettings
from tests.conftest import _postgres_database
from tests.gateway.conftest import serve
from tests.gateway.stack import read_engine_info

ADMIN = "fuzz-admin"
# per operation: about 450 requests in all
EXAMPLES = int(os.environ.get("AGL_FUZZ_EXAMPLES", "25"))
BODIES: dict[tuple[str, str], Any] = {
    ("post", "/v1/chat/completions"): wire.ChatRequest,
    ("post", "/v1/completions"): wire.CompletionRequest,
    ("post", "/v1/responses"): wire.ResponsesRequest,
    ("post", "/v1/messages"): wire.AnthropicRequest,
    ("post", "/api/rollouts"): routes.RolloutIn,
    ("post", "/api/rollouts/{rollout_id}/events"): routes.EventIn,
    ("post", "/api/rollouts/{rollout_id}/reward"): routes.RewardIn,
    ("post", "/api/rollouts/{rollout_id}/status"): routes.StatusIn,
    ("post", "/api/models"): routes.ModelIn,
    ("post", "/api/resume"): routes.ResumeIn,
}


def with_bodies(schema: dict) -> dict:
    """The gateway's OpenAPI schema plus the request body each route parses."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for (method, path), model in BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        schema["paths"][path][method]["requestBody"] = {
            "content": {"application/json": {"schema": body}}
        }
    return schema


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def gateway(
    request: pytest.FixtureRequest, tiny_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        db = iter([f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}"])
    else:
        db = _postgres_database()  # the same inputs must be refused alike on both databases
    with serve(stand_in_app(str(tiny_path))) as engine, Store(next(db)) as store:
        info = read_engine_info(engine)
        cfg = GatewaySettings(admin_key=ADMIN, engine_url=[engine], max_body_bytes=200_000)
        with serve(make_app(cfg, store, EngineClient([engine], attempts=1), info)) as url:
            yield url


def fuzz(
    operation: Any, url: str, token: str, rollout_id: str, statuses: Counter[int]
) -> list[str]:
    """`EXAMPLES` generated requests to one operation; the ones answered with a 5xx."""
    failures: list[str] = []
    count = iter(range(10**6))

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        if "rollout_id" in (case.path_parameters or {}) and next(count) % 2:
            case.path_parameters["rollout_id"] = rollout_id  # half of them at a real rollout
        response = case.call(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            failures.append(
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
            )

    run()
    return failures


def test_no_input_earns_a_5xx(gateway: str) -> None:
    url, admin = gateway, {"Authorization": f"Bearer {ADMIN}"}
    schema = schemathesis.openapi.from_dict(
        with_bodies(httpx.get(url + "/openapi.json", timeout=60).json())
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 19  # every route of the gateway
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    for operation in operations:
        if operation.path == "/api/pause":
            continue  # it would hold every later call (tested in test_app.py)
        # a fresh rollout per route, whose token gets past auth to the parsing
        rollout = httpx.post(url + "/api/rollouts", json={"group": "fuzz"}, headers=admin).json()
        token = rollout["agent_token"] if operation.path.startswith("/v1") else ADMIN
        failures += fuzz(operation, url, token, rollout["id"], statuses)
    assert not failures, failures[:5]
    # it reached past the parsing too
    assert statuses[200] and statuses[400] and statuses[404], statuses
