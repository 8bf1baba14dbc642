"""The gateway's Prometheus metrics: what `/metrics` shows.

- Owns: the metrics, in a registry of their own; counting a recorded call and a request field
  not honoured; capping the label values harnesses choose (agent names, request fields) at
  `MAX_LABELS`, later ones counted as "other".
- Does not: serve `/metrics` (`gateway/routes.py`), count rollouts by status itself (the route
  sets `rollouts` from the store), nor decide what is counted when (`gateway/proxy.py`).
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.gate import Gate

# Distinct values a label takes from harnesses (agents, tool types); later ones count as "other".
MAX_LABELS = 100
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)  # latency (s)


class Metrics:
    """The gateway's Prometheus metrics, in a registry of their own (what `/metrics` shows)."""

    def __init__(self, gate: Gate) -> None:
        registry = CollectorRegistry()
        self.registry = registry
        self.calls = Counter(
            "agl_calls", "Recorded model calls", ["agent", "api"], registry=registry
        )
        self.errors = Counter(
            "agl_call_errors",
            "Harness calls answered with an error",
            ["status", "kind"],
            registry=registry,
        )
        self.tokens = Counter("agl_tokens", "Tokens of recorded calls", ["kind"], registry=registry)
        self.latency = Histogram(
            "agl_call_latency_seconds",
            "Time from receiving a call to recording it",
            buckets=BUCKETS,
            registry=registry,
        )
        inflight = Gauge("agl_inflight_calls", "Calls being served", registry=registry)
        inflight.set_function(lambda: gate.inflight)
        paused = Gauge("agl_paused", "1 while the gateway is paused", registry=registry)
        paused.set_function(lambda: gate.paused)
        self.rollouts = Gauge("agl_rollouts", "Rollouts by status", ["status"], registry=registry)
        about = "Prompts by how they extend the rollout's calls"
        self.prefix = Counter("agl_prefix", about, ["kind"], registry=registry)
        about = "Requests refused: the rollout's storage budget"
        self.over_budget = Counter("agl_over_budget", about, registry=registry)
        about = "Rollouts that asked for what no prompt shows, by request field"
        self.not_honoured = Counter("agl_not_honoured", about, ["field"], registry=registry)
        self._agents: set[str] = set()  # the agent labels of agl_calls
        self._fields: set[str] = set()  # the field labels of agl_not_honoured

    def count_call(
        self, agent: str, api: str, prompt_tokens: int, response_tokens: int, latency_s: float
    ) -> None:
        """Counts a recorded call of `agent` through `api`: its tokens and its latency."""
        self.calls.labels(_label(self._agents, agent), api).inc()
        self.tokens.labels("prompt").inc(prompt_tokens)
        self.tokens.labels("response").inc(response_tokens)
        self.latency.observe(latency_s)

    def count_not_honoured(self, field: str) -> None:
        """Counts a rollout that asked for request field `field`, which could not be honoured."""
        self.not_honoured.labels(_label(self._fields, field)).inc()


def _label(values: set[str], value: str) -> str:
    """`value` as a metric label: harnesses name agents and tool types, so a label's values
    are capped."""
    if value not in values and len(values) >= MAX_LABELS:
        return "other"
    values.add(value)
    return value
