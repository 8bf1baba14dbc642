"""The rollout spec: what to run for one rollout, validated before anything is launched.

YAML or JSON; unknown fields are errors, and messages name the bad field. Both launchers take it
(`image`, `resources` and the Job fields: Kubernetes only). It neither launches nor knows the env.
"""

import json
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, field_validator

from agl.settings import Strict, problems

# A Kubernetes resource quantity: 500m, 2, 512Mi.
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]


class SpecError(ValueError):
    """An invalid spec; the message names each bad field (`harness.resources.cpu: ...`)."""


class Resources(Strict):
    """What a container requests (and is limited to), Kubernetes only."""

    cpu: str | None = Field(
        None, pattern=QUANTITY, description="Kubernetes quantity, e.g. '500m' or '2'."
    )
    memory: str | None = Field(
        None, pattern=QUANTITY, description="Kubernetes quantity, e.g. '512Mi'."
    )


class Process(Strict):
    """One program: the harness, or its grader."""

    command: list[str] = Field(min_length=1, description="argv; no shell unless you name one.")
    env: dict[EnvName, str] = Field(
        default_factory=dict, description="Extra environment (the injected keys win)."
    )
    cwd: str | None = Field(
        None, description="Working directory; default: a fresh workspace per attempt."
    )
    timeout_s: float = Field(
        3600.0, gt=0, description="Wall-clock limit (seconds); then the run is killed."
    )
    image: str = Field(
        "python:3.11-slim", min_length=1, description="Container image (Kubernetes only)."
    )
    resources: Resources = Field(default_factory=Resources)

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("the program name is empty")
        return value


class Spec(Strict):
    """How to run every attempt of a rollout."""

    harness: Process
    grader: Process | None = Field(
        None, description="Runs after the harness exits 0, with the grader token."
    )
    max_attempts: int = Field(
        3, ge=1, le=100, description="Attempts in all, counting infra failures only."
    )
    retry_backoff_s: float = Field(
        2.0, ge=0, description="Delay before attempt 2; doubles per attempt (seconds)."
    )
    namespace: str = Field(
        "default", min_length=1, description="Kubernetes namespace of the Jobs and Secrets."
    )
    workspace: str = Field(
        "/workspace", description="Where harness and grader share files in a Pod (emptyDir)."
    )
    ttl_after_finished_s: int = Field(
        3600, ge=0, description="Kubernetes keeps a finished Job this long (s)."
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels on Jobs and their Pods."
    )
    service_account: str | None = None
    report_image: str = Field(
        "python:3.11-slim", description="Rendered Jobs: the reporter's image (with python3)."
    )
    node_selector: dict[str, str] = Field(default_factory=dict)


def parse_spec(data: Any, where: str = "spec") -> Spec:
    """Validate a spec given as a mapping; raise `SpecError` naming the bad fields."""
    try:
        return Spec.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"{where}: {problems(e)}") from e


def load_spec(path: str | Path) -> Spec:
    """Read a YAML or JSON spec file (JSON if its name ends in `.json`)."""
    try:
        text = Path(path).read_text()
        if str(path).endswith(".json"):
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: cannot read the spec: {e}") from e
    return parse_spec(data, str(path))
