"""A rollout's credentials: its tokens, what the store keeps of them, and how they reach the caller.

- Owns making a token (random, optionally prefixed by its expiry), its stored form (SHA-256, hex)
  and `Created`, the one record that holds a rollout's tokens in plaintext.
- Does not authenticate a request or refuse an expired token: the gateway does (`gateway/auth.py`),
  with `token_expired` and the rollout and role that `Store.rollout_for_token` finds.
"""

import hashlib
import secrets
import time
from dataclasses import dataclass

from agl.types import Rollout


@dataclass(frozen=True)
class Created:
    """A new rollout and its plaintext credentials (only their hashes are stored)."""

    rollout: Rollout
    agent_token: str
    grader_token: str | None


def hash_token(token: str) -> str:
    """What the store keeps of a token: its SHA-256, hex."""
    # surrogatepass: whatever a path decoded to.
    return hashlib.sha256(token.encode(errors="surrogatepass")).hexdigest()


def new_token(ttl_s: float | None) -> str:
    """A random token; with `ttl_s`, prefixed by its expiry (Unix seconds), which its stored hash
    covers."""
    token = secrets.token_urlsafe(32)
    if not ttl_s:
        return token
    return f"{int(time.time() + ttl_s)}.{token}"


def token_expired(token: str) -> bool:
    """Whether the token carries an expiry (`new_token`) that has passed."""
    head, dot, _ = token.partition(".")
    return (
        bool(dot)
        and head.isascii()
        and head.isdigit()
        and len(head) < 20
        and int(head) < time.time()
    )
