"""mini-SWE-agent 2.4.6, unchanged, against the gateway: the real package as a subprocess on a
throwaway git repository, the engine in scripted mode (the tiny model cannot solve anything,
so it answers with given texts and their real teacher-forced logprobs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.stack import stack

MINI = str(Path(sys.executable).parent / "mini")
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def tool_call(command: str) -> str:
    return (
        "I will run a command.\n<tool_call>\n"
        + json.dumps({"name": "bash", "arguments": {"command": command}})
        + "\n</tool_call>"
    )


def text_action(command: str) -> str:
    return f"THOUGHT: one step at a time.\n\n```mswea_bash_command\n{command}\n```"


CONFIGS = {
    "tool-calling": ("mini.yaml", [], tool_call),
    "text-based": ("mini_textbased.yaml", ["--model-class", "litellm_textbased"], text_action),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
def test_mini_swe_agent_runs_to_submitted(tiny_path: Path, tmp_path: Path, config: str):
    yaml, extra, action = CONFIGS[config]
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    script = [action("cat calc.py"), action("sed -i 's/a - b/a + b/' calc.py"), action(SUBMIT)]
    with stack(tiny_path, tmp_path, script=script) as s:
        r = s.rollout()
        env = os.environ | {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENAI_API_KEY": r["agent_token"],
            "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea"),
        }
        traj = tmp_path / "traj.json"
        cmd = [
            MINI,
            "-y",
            "--exit-immediately",
            "-c",
            yaml,
            "-c",
            f"model.model_kwargs.api_base={r['base_url']}",
            "-m",
            "openai/solver",
            "-t",
            "Fix add() in calc.py",
            "-o",
            str(traj),
            *extra,
        ]
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=240)
        assert traj.exists(), done.stdout[-3000:] + done.stderr[-3000:]
        assert json.loads(traj.read_text())["info"]["exit_status"] == "Submitted", done.stdout[
            -3000:
        ]
        assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
        calls = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
        assert len(calls) == 3
        for call, text in zip(calls, script, strict=True):
            assert len(call["response_ids"]) == len(call["logprobs"])
            decoded = s.engine.tokenizer.decode(call["response_ids"], skip_special_tokens=False)
            assert decoded.removesuffix("<|im_end|>") == text
            assert call["response"]["text"] == text
        kinds = s.admin.get("/metrics").text
        assert 'agl_prefix_total{kind="extended"} 2.0' in kinds, [
            c for c in kinds.splitlines() if "prefix" in c
        ]
