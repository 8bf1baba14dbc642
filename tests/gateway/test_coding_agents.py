"""Claude Code and Codex, the real npm packages at the versions examples/harnesses/install.sh pins,
against the gateway: each CLI runs as a subprocess, offline (a temporary HOME, no telemetry, no
update checks, no login), in a temporary folder, set up as examples/harnesses/README.md shows.
The engine is in scripted mode: the first call answers with a shell tool call in hermes format,
the second with a final text. Each test checks that the harness ran the command and sent its
output back, that every call it made is recorded with the scripted tokens, and that the second
call's prompt extends the first call's prompt and response (one token chain, no split)."""

import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.gateway.stack import Stack, sglang_stack, stack
from tests.sglang import SglangStandIn, fake_logprob

INSTALL = Path(__file__).resolve().parents[2] / "examples" / "harnesses" / "install.sh"
COMMAND = "echo hi | tee out.txt"


@pytest.fixture(scope="session")
def npm_bin() -> Path:
    """The folder with `claude` and `codex`, installed at their pins on first use."""
    if shutil.which("npm") is None:
        pytest.skip("needs Node and npm (CI installs them)")
    done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip())


def tool_call(name: str, arguments: dict) -> str:
    return (
        "I will run it.\n<tool_call>\n"
        + json.dumps({"name": name, "arguments": arguments})
        + "\n</tool_call>"
    )


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Runs a harness with only `env` (nothing of the caller's API keys or config leaks in)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **env}
    done = subprocess.run(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (cwd / "out.txt").read_text() == "hi\n"  # the scripted command ran, in the work folder
    return done.stdout


def check_one_chain(s: Stack, rollout_id: str, script: list[str], agent: str) -> list[dict]:
    """Every call recorded, with the scripted text as its response tokens; each prompt starts
    with the previous call's prompt and response (adapters/merge.py's rule), no split classified."""
    calls = s.admin.get(f"/api/rollouts/{rollout_id}/calls").json()
    assert [c["seq"] for c in calls] == list(range(len(script)))
    for call, text in zip(calls, script, strict=True):
        assert call["agent"] == agent
        assert len(call["response_ids"]) == len(call["logprobs"])
        decoded = s.engine.tokenizer.decode(call["response_ids"], skip_special_tokens=False)
        assert decoded.removesuffix("<|im_end|>") == text
    for prev, call in itertools.pairwise(calls):
        chain = prev["prompt_ids"] + prev["response_ids"]
        assert call["prompt_ids"][: len(chain)] == chain, (
            f"call {call['seq']} does not extend call {prev['seq']}"
        )
    events = s.admin.get(f"/api/rollouts/{rollout_id}/events").json()
    assert not [e for e in events if e["kind"] in ("error", "prefix_mismatch")], events
    return calls


@pytest.mark.slow
def test_claude_code_runs_a_shell_command_in_one_token_chain(
    tiny_path: Path, tmp_path: Path, npm_bin: Path
):
    script = [tool_call("Bash", {"command": COMMAND}), "Done."]
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(), home.mkdir()
    # Claude Code asks for 32,000 output tokens on every call: fit_max_tokens lowers that to the room left.
    with stack(tiny_path, tmp_path, script=script, fit_max_tokens=256) as s:
        r = s.rollout()
        env = {
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": r["anthropic_base_url"],
            "ANTHROPIC_API_KEY": r["agent_token"],
            "ANTHROPIC_CUSTOM_HEADERS": "x-agl-agent: solver",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        cmd = [str(npm_bin / "claude"), "-p", "Write hi to out.txt", "--output-format", "json"]
        cmd += ["--model", "claude-sonnet-4-5", "--tools", "Bash", "--allowedTools", "Bash"]
        cmd += [
            "--system-prompt",
            "You are a coding agent. Use the Bash tool.",
            "--no-session-persistence",
        ]
        out = json.loads(run(cmd, work, env))
        assert out["result"] == "Done." and out["num_turns"] == 2, out
        first, second = check_one_chain(s, r["id"], script, agent="solver")
        used, result = second["request"]["messages"][-2:]
        (tool_use,) = [b for b in used["content"] if b["type"] == "tool_use"]
        assert tool_use["name"] == "Bash" and tool_use["input"] == {"command": COMMAND}
        (block,) = [b for b in result["content"] if b["type"] == "tool_result"]
        assert block["tool_use_id"] == tool_use["id"] and not block["is_error"], block
        assert block["content"].startswith("hi"), block
        assert first["request"]["max_tokens"] == 32000
        events = s.admin.get(f"/api/rollouts/{r['id']}/events").json()
        assert [e["data"]["asked"] for e in events if e["kind"] == "max_tokens_lowered"] == [
            32000,
            32000,
        ]


@pytest.mark.slow
def test_codex_runs_a_shell_command_in_one_token_chain(
    tiny_path: Path, tmp_path: Path, npm_bin: Path
):
    script = [tool_call("exec_command", {"cmd": COMMAND}), "Done."]
    work, codex_home = tmp_path / "work", tmp_path / "home" / ".codex"
    work.mkdir(), codex_home.mkdir(parents=True)
    with stack(tiny_path, tmp_path, script=script) as s:
        r = s.rollout()
        config = (
            (INSTALL.parent / "codex.toml")
            .read_text()
            .replace("http://127.0.0.1:8000/v1", r["base_url"])
        )
        (codex_home / "config.toml").write_text(config)
        env = {
            "HOME": str(codex_home.parent),
            "CODEX_HOME": str(codex_home),
            "AGL_AGENT_TOKEN": r["agent_token"],
        }
        cmd = [
            str(npm_bin / "codex"),
            "exec",
            "--strict-config",
            "--skip-git-repo-check",
            "--ephemeral",
            "--json",
        ]
        events = [
            json.loads(line) for line in run([*cmd, "Write hi to out.txt"], work, env).splitlines()
        ]
        items = [e["item"] for e in events if e["type"] == "item.completed"]
        assert [i["text"] for i in items if i["type"] == "agent_message"] == [
            "I will run it.",
            "Done.",
        ], items
        (ran,) = [i for i in items if i["type"] == "command_execution"]
        assert ran["exit_code"] == 0 and ran["aggregated_output"] == "hi\n", ran
        _, second = check_one_chain(s, r["id"], script, agent="solver")
        called, output = second["request"]["input"][-2:]
        assert called["type"] == "function_call" and json.loads(called["arguments"]) == {
            "cmd": COMMAND
        }
        assert output["type"] == "function_call_output" and output["call_id"] == called["call_id"]
        assert output["output"].endswith("Output:\nhi\n"), output


@pytest.mark.slow
def test_claude_code_sees_text_stream_in_as_it_is_sampled(
    tiny_path: Path, tmp_path: Path, npm_bin: Path
):
    """Claude Code printing its stream events as they come (`stream-json` with partial messages),
    against the sglang stand-in sampling a token every 50 ms: its first text delta arrives before
    the engine has sampled the reply's last token; the text it assembles and its tool call are the
    recorded reply's, and the recorded tokens and logprobs are what the engine sampled."""
    script = [tool_call("Bash", {"command": COMMAND}), "Done."]
    sglang = SglangStandIn(tiny_path, script, context_len=32_768, token_delay_s=0.05)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(), home.mkdir()
    with sglang_stack(sglang, tmp_path, fit_max_tokens=256) as s:
        r = s.rollout()
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": r["anthropic_base_url"],
            "ANTHROPIC_API_KEY": r["agent_token"],
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        cmd = [str(npm_bin / "claude"), "-p", "Write hi to out.txt", "--verbose"]
        cmd += ["--output-format", "stream-json", "--include-partial-messages"]
        cmd += ["--model", "claude-sonnet-4-5", "--tools", "Bash", "--allowedTools", "Bash"]
        cmd += ["--system-prompt", "You are a coding agent.", "--no-session-persistence"]
        seen: list[tuple[float, dict]] = []  # (time.monotonic() when it came, event)
        stderr = tmp_path / "stderr.txt"
        with (
            stderr.open("w") as errors,
            subprocess.Popen(
                cmd,
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            ) as claude,
        ):
            assert claude.stdout is not None
            for line in claude.stdout:
                seen.append((time.monotonic(), json.loads(line)))
            code = claude.wait(timeout=90)
        assert code == 0, (seen[-1][1].get("result"), stderr.read_text()[-3000:])
        calls = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
    assert (work / "out.txt").read_text() == "hi\n"
    events = [(t, e["event"]) for t, e in seen if e["type"] == "stream_event"]
    deltas = [(t, e["delta"]) for t, e in events if e["type"] == "content_block_delta"]
    # the first message's text reached Claude Code before the engine sampled its last token
    first_text = min(t for t, d in deltas if d["type"] == "text_delta")
    assert first_text < sglang.log.finished_at[0], (first_text, sglang.log.finished_at)
    texts = "".join(d["text"] for _, d in deltas if d["type"] == "text_delta")
    assert texts == "I will run it.Done."
    arguments = "".join(d["partial_json"] for _, d in deltas if d["type"] == "input_json_delta")
    assert json.loads(arguments) == {"command": COMMAND}
    assert len(calls) == 2
    for call, text in zip(calls, script, strict=True):
        sampled = [*sglang.tokenizer.encode(text, add_special_tokens=False), sglang.end_id]
        assert call["response_ids"] == sampled
        assert call["logprobs"] == pytest.approx([fake_logprob(i) for i in range(len(sampled))])
