"""The gateway's metrics: a recorded call counted, and the label values harnesses choose capped."""

from prometheus_client import generate_latest

from gateway.gate import Gate
from gateway.metrics import MAX_LABELS, Metrics


def test_label_values_a_harness_chooses_are_capped_and_the_rest_count_as_other() -> None:
    metrics = Metrics(Gate())
    for i in range(MAX_LABELS + 5):
        metrics.count_call(f"agent-{i}", "chat", 10, 2, 0.01)
        metrics.count_not_honoured(f"field-{i}")
    agents = {s.labels["agent"] for s in metrics.calls.collect()[0].samples}
    fields = {s.labels["field"] for s in metrics.not_honoured.collect()[0].samples}
    assert len(agents) == len(fields) == MAX_LABELS + 1
    assert "other" in agents and "other" in fields
    others = [
        s.value
        for s in metrics.calls.collect()[0].samples
        if s.name == "agl_calls_total" and s.labels["agent"] == "other"
    ]
    assert others == [5]


def test_a_recorded_call_counts_its_tokens_and_latency_and_the_gate_shows() -> None:
    gate = Gate()
    metrics = Metrics(gate)
    metrics.count_call("a", "messages", 10, 2, 0.01)
    exposition = generate_latest(metrics.registry).decode()
    assert 'agl_calls_total{agent="a",api="messages"} 1.0' in exposition
    assert 'agl_tokens_total{kind="prompt"} 10.0' in exposition
    assert "agl_call_latency_seconds_count 1.0" in exposition
    assert "agl_paused 0.0" in exposition and "agl_inflight_calls 0.0" in exposition
