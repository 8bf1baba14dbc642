"""The documentation stays true: links resolve, generated pages are fresh, commands run.

- Every relative link and anchor in README.md, CHANGELOG.md, bench/ and docs/ resolves (anchors as
  GitHub makes them from headings).
- `python tools/docs.py check`: the generated reference pages match the code.
- Every `agl` subcommand (the `agl.commands` entry points) answers `--help`.
- Every shell block of docs/quickstart.md is one of the README's two commands or is in `EXERCISED`,
  which names the test that runs it; `test_the_quickstart_runs_as_written` runs them.
- The metrics and training pages name every metric and every `agl.*` key the code defines.
- No file outside .ci/ points at the design notes outside the repository.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
SHELL = {"bash", "sh", "shell", "console"}
RUNS_QUICKSTART = "tests/docs/test_docs.py::test_the_quickstart_runs_as_written"

# The quickstart's shell blocks besides the README's two commands, each with the test that runs it.
# Change a block there, and its entry here, and make sure the test still runs it.
EXERCISED = {
    "source .venv/bin/activate": RUNS_QUICKSTART,
    "agl engine --model smollm2 --port 30000 &\n"
    "agl gateway --engine-url http://127.0.0.1:30000 --db sqlite:///agl.db --port 8000 "
    "--admin-key K &\n"
    "until curl -sf localhost:8000/healthz > /dev/null; do sleep 1; done": RUNS_QUICKSTART,
    'curl -s -H "Authorization: Bearer K" localhost:8000/api/rollouts \\\n'
    '  -d \'{"task": {"question": "What is 12 * 34?", "answer": 408}, "group": "quickstart"}\''
    " > rollout.json\n"
    "cat rollout.json": RUNS_QUICKSTART,
    "export OPENAI_BASE_URL=http://127.0.0.1:8000/v1 AGL_GATEWAY_URL=http://127.0.0.1:8000\n"
    "export OPENAI_API_KEY=$(python -c 'import json; "
    'print(json.load(open("rollout.json"))["agent_token"])\')\n'
    "export AGL_ROLLOUT_ID=$(python -c 'import json; "
    'print(json.load(open("rollout.json"))["id"])\')\n'
    'export AGL_TASK=\'{"question": "What is 12 * 34?", "answer": 408}\'\n'
    "python examples/calculator/harness.py": RUNS_QUICKSTART,
    'curl -s -H "Authorization: Bearer K" localhost:8000/api/rollouts/$AGL_ROLLOUT_ID/calls'
    " | python -c '\n"
    "import json, sys\n"
    "for c in json.load(sys.stdin):\n"
    '    print(c["seq"], c["agent"], "version", c["model_version"], len(c["prompt_ids"]),'
    ' "prompt tokens",\n'
    '          len(c["response_ids"]), "sampled, first logprobs",'
    ' [round(x, 2) for x in c["logprobs"][:3]])\'': RUNS_QUICKSTART,
    'curl -s -H "Authorization: Bearer K" localhost:8000/api/rollouts/$AGL_ROLLOUT_ID/status'
    ' -d \'{"status": "succeeded"}\'': RUNS_QUICKSTART,
}


# ---------------------------------------------------------------------------- Markdown


def pages() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "README.md"]
    found += sorted((ROOT / "docs").rglob("*.md")) + sorted(
        (ROOT / "bench" / "results").glob("*.md")
    )
    return [p for p in found if p.exists()]


def outside_code(text: str) -> list[str]:
    """The page's lines that are not inside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, content) of each fenced block."""
    out: list[tuple[str, str]] = []
    info: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("```"):
            if info is None:
                info, body = line[3:].strip(), []
            else:
                out.append((info, "\n".join(body)))
                info = None
        elif info is not None:
            body.append(line)
    return out


def slug(heading: str) -> str:
    """The anchor GitHub makes of a heading: its text, lowercased, no punctuation, spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in outside_code(path.read_text()):
        if m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(f"{base}-{n}" if n else base)
    return found


def links(path: Path) -> list[str]:
    out = []
    for line in outside_code(path.read_text()):
        line = re.sub(r"`[^`]*`", "", line)
        out += re.findall(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line)
    return out


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in pages():
        for target in links(page):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_slugs_are_githubs() -> None:
    assert (
        slug("Rollout- against sample-level handling") == "rollout--against-sample-level-handling"
    )
    assert slug("A `prefix_mismatch` event") == "a-prefix_mismatch-event"
    assert slug("`agl.temperature=...` matches none of the batch's calls") == (
        "agltemperature-matches-none-of-the-batchs-calls"
    )


# ---------------------------------------------------------------------------- generated pages


def test_the_generated_reference_pages_are_fresh() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "docs.py"), "check"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr


COMMANDS = sorted(ep.name for ep in entry_points(group="agl.commands"))


def test_the_commands_are_found() -> None:
    assert {"engine", "gateway", "controller", "jobs", "train"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_agl_command_answers_help(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agl.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "usage" in done.stdout.lower()


# ---------------------------------------------------------------------------- the quickstart


def readme_commands() -> set[str]:
    """The commands of the README's first shell block: `make demo` and `make test`."""
    blocks = code_blocks((ROOT / "README.md").read_text())
    block = next(body for info, body in blocks if info in SHELL)
    return {line.split("#")[0].strip() for line in block.splitlines() if line.strip()}


def quickstart_blocks() -> list[str]:
    return [body for info, body in code_blocks(QUICKSTART.read_text()) if info in SHELL]


def test_the_readme_starts_with_its_two_commands() -> None:
    assert readme_commands() == {"make demo", "make test"}


def test_every_quickstart_command_is_exercised_by_a_named_test() -> None:
    blocks = quickstart_blocks()
    loose = [b for b in blocks if b not in readme_commands() and b not in EXERCISED]
    assert not loose, "shell blocks no test is known to run:\n\n" + "\n\n".join(loose)
    stale = [command for command in EXERCISED if command not in blocks]
    assert not stale, "EXERCISED lists commands the quickstart no longer has:\n\n" + "\n\n".join(
        stale
    )
    for test in set(EXERCISED.values()):
        file, _, name = test.partition("::")
        assert re.search(rf"^def {name}\(", (ROOT / file).read_text(), re.M), f"no test {test}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(pgid: int) -> None:
    """SIGTERM the process group, then SIGKILL what is left after 20 s."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    """The quickstart's blocks (but the README's commands) as one bash script, in a fresh folder
    that has the repository's `examples/` and this interpreter's venv as `.venv`. Only this differs:
    free ports for 30000 and 8000, and the tiny model for SmolLM2 (the same engine, quicker)."""
    if shutil.which("curl") is None or sys.prefix == sys.base_prefix:
        pytest.skip("needs curl, and agl installed in a venv (the quickstart activates .venv)")
    script = "\n".join(b for b in quickstart_blocks() if b not in readme_commands())
    script = re.sub(r"\b30000\b", str(free_port()), script)
    script = re.sub(r"\b8000\b", str(free_port()), script)
    script = script.replace("--model smollm2", "--model tiny")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    log = tmp_path / "quickstart.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", "set -eo pipefail\n" + script],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the engine and gateway it starts are in its process group
        )
        try:
            code = proc.wait(timeout=480)
        finally:
            stop_group(proc.pid)
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert re.search(r"^0 calculator-agent version 0 \d+ prompt tokens", text, re.M), text[-4000:]
    assert '"status":"succeeded"' in text.replace(" ", ""), text[-4000:]


# ---------------------------------------------------------------------------- pages that list code


def test_the_metrics_page_names_every_metric() -> None:
    from adapters.batch import COUNTS
    from gateway.gate import Gate
    from gateway.metrics import Metrics

    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    families = [m.name for m in Metrics(Gate()).registry.collect()]
    missing = [name for name in families if name not in page]
    missing += [f"adapter/{key}" for key in COUNTS if f"adapter/{key}" not in page]
    assert not missing, missing


def test_the_training_page_names_every_agl_key() -> None:
    from trainer.config import AglConfig

    page = (ROOT / "docs" / "training.md").read_text()
    assert not [f for f in AglConfig.model_fields if f"`agl.{f}`" not in page]


def test_no_file_points_at_the_design_notes_outside_the_repository() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    words = ("DESIGN" + ".md", "../" + "shared")  # spelt apart, so that this file does not match
    found = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if name.startswith(".ci/") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # binary
            continue
        found += [
            f"{name}:{i}"
            for i, line in enumerate(text.splitlines(), 1)
            if any(w in line for w in words)
        ]
    assert not found, "\n".join(found)
