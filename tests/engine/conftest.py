"""The engine's tests share the gateway's fixtures: uvicorn on 127.0.0.1 and the tiny model."""

from tests.gateway.conftest import tiny_path  # noqa: F401  (session fixture)
