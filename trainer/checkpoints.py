"""A run's checkpoints on disk: what they keep of the run, and their folders.

- `TrainerState` (with its `Group`s) is what a checkpoint keeps of the run: its `state.json`.
- `Checkpoints` writes `step_N/{actor, model, state.json}` aside and renames it, points `latest`
  at it, keeps the newest few, and reads the latest back.
- It does not decide when a checkpoint is due, and loads no weights into the trainer or the
  engines: the loop (`trainer/loop.py`) does both.
"""

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Protocol


@dataclasses.dataclass
class Group:
    """One task's rollouts, launched together: `agl.n` of them, or a validation round's share."""

    id: str
    rollouts: list[str]
    version: int  # the model version when it was launched


@dataclasses.dataclass
class TrainerState:
    """What a checkpoint keeps of a run: its `state.json`, one key per field, in this order."""

    step: int = 0
    version: int = 0  # the model version the engines serve
    cursor: int = 0  # the next task's index, which names its group
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    # the group IDs of each step: none trained twice, none lost
    trained: list[list[str]] = dataclasses.field(default_factory=list)
    best: float | None = None  # the best validation reward so far (the guard's)
    # launched, not yet trained on, in launch order
    groups: list[Group] = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        """The text of `state.json`."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "TrainerState":
        """The state a `state.json` holds; a key it lacks keeps its default, others are ignored."""
        saved = json.loads(text)
        known = {f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved}
        known["groups"] = [Group(**g) for g in known.get("groups", [])]
        return cls(**known)


class Model(Protocol):
    """What writes the trainer's weights into a checkpoint (`trainer.backend.Backend`)."""

    def save(self, path: Path) -> None: ...


class Checkpoints:
    """The checkpoints of one run in `root`: `step_N` folders, `latest` naming the newest, and
    named ones (the guard's `best`). `keep`: the `step_N` folders kept, at least 2 (the engine
    serves the newest)."""

    def __init__(self, root: Path, model: Model, keep: int) -> None:
        self.root = root
        self.model = model
        self.keep = max(keep, 2)

    def path(self, name: str) -> Path:
        """The folder of the checkpoint `name`."""
        return self.root / name

    def save(self, state: TrainerState, name: str = "") -> Path:
        """step_N/{actor, model, state.json} for the state's step, written aside and renamed;
        `latest` names it. With a `name` (the guard's `best`), that folder instead, and `latest`
        stays."""
        path = self.path(name or f"step_{state.step}")
        tmp = self.root / f".{path.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.model.save(tmp)
        (tmp / "state.json").write_text(state.to_json())
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        if not name:
            (self.root / "latest.tmp").write_text(path.name)
            os.replace(self.root / "latest.tmp", self.root / "latest")
            self.prune()
        return path

    def prune(self) -> None:
        """Remove all but the newest `keep` step folders."""
        steps = sorted(self.root.glob("step_*"), key=lambda p: int(p.name.removeprefix("step_")))
        for old in steps[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def latest(self) -> Path | None:
        """The folder `latest` names; None before the first checkpoint."""
        latest = self.root / "latest"
        if not latest.is_file():
            return None
        return self.path(latest.read_text().strip())

    @staticmethod
    def state(path: Path) -> TrainerState:
        """The state the checkpoint at `path` keeps."""
        return TrainerState.from_json((path / "state.json").read_text())
