"""The gateway's settings, read by the app, the routes and the proxy; `agl/settings.py` makes the flags."""

import re

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """The gateway: `AGL_GATEWAY_<FIELD>` in the environment, each overridden by its flag."""

    model_config = SettingsConfigDict(env_prefix="AGL_GATEWAY_", extra="forbid")

    host: str = Field(
        "127.0.0.1",
        description="Interface to listen on. Loopback by default: expose it on purpose.",
    )
    port: int = Field(8000, description="TCP port.")
    admin_key: str = Field(
        "", description="Key for /api (required). Harness tokens never reach /api's admin routes."
    )
    engine_url: list[str] = Field(
        ["http://127.0.0.1:30000"], description="Engine replicas (sglang or agl engine)."
    )
    engine_key: str = Field(
        "", description="The engines' API key (sglang's and agl engine's --api-key), if set."
    )
    db: str = Field("", description="Store URL; default AGL_STORE_URL, else sqlite:///agl.db.")
    engine_timeout_s: float = Field(
        600.0, gt=0, description="Longest engine request (s), then retried."
    )
    tokenizer: str = Field(
        "", description="Tokenizer folder; default: the engine's /model_info tokenizer_path."
    )
    public_url: str = Field(
        "", description="URL harnesses reach the gateway at; default http://host:port."
    )
    max_body_bytes: int = Field(
        16 * 2**20, description="Largest request body (bytes): 4x a 1M-token conversation."
    )
    max_head_bytes: int = Field(
        64 * 2**10, gt=0, description="Largest request line plus headers (bytes)."
    )
    head_timeout_s: float = Field(
        30.0, gt=0, description="A request's head must arrive within this (s): slowloris."
    )
    max_connections: int = Field(
        10_000, gt=0, description="Open connections before new requests get 503."
    )
    rollout_max_bytes: int = Field(
        2**28, gt=0, description="Request bodies a rollout's tokens may send (bytes)."
    )
    token_ttl_s: float = Field(
        7 * 86400, ge=0, description="Tokens expire this long after issue (s); 0: never."
    )
    max_hold_s: float = Field(
        600.0, description="Longest a call waits during a pause before a 503 (seconds)."
    )
    context_length: int = Field(
        0, description="Context window (tokens); 0: the engine's (its /v1/models max_model_len)."
    )
    seed_honoured: bool | None = Field(
        None,
        description="Whether the engines honour a request's seed. Default: yes for the embedded "
        "engine, no for sglang, which uses a seed only when started with "
        "--enable-deterministic-inference and --sampling-backend pytorch (then set this). A seed "
        "that is not honoured is not sent, and is named in the rollout's not_honoured event.",
    )
    default_max_tokens: int = Field(
        4096, description="Completion budget when a request gives none (tokens)."
    )
    fit_max_tokens: int = Field(
        0, ge=0, description="Cut a max_tokens to the room left if >= this (0: off)."
    )
    access_log: bool = Field(
        False, description="Log each request: method, path, status, latency, rollout (no token)."
    )
    prefix_preserving: bool = Field(
        True,
        description=(
            "Reuse the sampled token IDs of earlier replies when a later prompt repeats them"
            " (docs/architecture.md, 'Prefix preservation')."
        ),
    )
    tool_parser: str = Field(
        "hermes", description="Tool-call format of the model family (gateway/reply_parsing.py)."
    )
    air_tool_error_reward: float | None = Field(
        None, description="AIR: reward of a call whose tool call failed."
    )
    air_error_pattern: re.Pattern[str] | None = Field(
        None, description="AIR: marks a tool result's text as failed."
    )
