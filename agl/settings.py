"""Settings, one small group per component, read from the environment (prefix `AGL_`).

Each group is a pydantic-settings class with its own prefix (`AGL_STORE_URL`, ...); entry
points build the group they need and let command-line flags override fields. Every field
says its unit and why its default is what it is. There is deliberately no global config
file that collects every flag of every component.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class StoreSettings(BaseSettings):
    """Where rollouts, calls, events and model versions are kept (`AGL_STORE_*`)."""

    model_config = SettingsConfigDict(env_prefix="AGL_STORE_", extra="forbid")

    url: str = Field(
        "sqlite:///agl.db",
        description="SQLAlchemy URL. SQLite (WAL) is the embedded default; use "
        "postgresql+psycopg://... for real deployments.",
    )
    max_batch: int = Field(
        256,
        ge=1,
        description="Writes committed together by the writer thread (count). Group commit "
        "amortizes one fsync over many writes; 256 keeps a batch well under a second.",
    )
    group_wait_ms: float = Field(
        1.0,
        ge=0,
        description="Longest the writer waits for the rest of a group (milliseconds), and only while "
        "fewer writes are queued than the last group held; a lone writer never waits.",
    )
    max_tokens_per_array: int = Field(
        4_194_304,
        ge=1,
        description="Largest token or logprob array accepted (tokens). 4M is far beyond any "
        "context window and stops a runaway harness from filling the disk in one call.",
    )
    sqlite_checkpoint_s: float = Field(
        1.0,
        ge=0,
        description="How often a background thread copies SQLite's write-ahead log into the database "
        "(seconds). 0: SQLite's automatic checkpoint, which runs inside whichever commit takes the log "
        "past 1,000 pages and holds that write and every write queued behind it (~30 ms here).",
    )
    sqlite_synchronous: str = Field(
        "NORMAL",
        pattern="^(OFF|NORMAL|FULL|EXTRA)$",
        description="SQLite PRAGMA synchronous. With WAL, NORMAL keeps every acknowledged write "
        "through a crash of any process (no fsync per commit: a few ms less per call); FULL also "
        "through a power loss or OS crash.",
    )
