"""The grader's pure parts: which commands are flagged, which files count as tests, how commands
are read from a recorded reply. (The whole grader runs in test_e2e_local.py and test_e2e_kube.py.)"""

from __future__ import annotations

import json

import pytest

from examples.swe.grade import commands, file_kind, scan, shaped

FLAGGED = {
    "git log -p -3": ["git_history"],
    "cd /testbed && git show HEAD~1:src/a.py": ["git_history"],
    "git -C /testbed reflog": ["git_history"],
    "cat .git/packed-refs": ["git_history"],
    "git checkout HEAD~2 -- src/a.py": ["git_history"],
    "git clone https://github.com/x/y /tmp/y": ["git_history", "network"],
    "curl -s https://pypi.org/simple/": ["network"],
    "ls; wget http://example.com/f": ["network"],
    "python -c 'import urllib.request; urllib.request.urlopen(\"http://x\")'": ["network"],
    "pip install -e .": ["package_install"],
    "python -m pip install hypothesis": ["package_install"],
    "uv pip install numpy": ["package_install"],
    "apt-get install -y jq": ["package_install"],
    "python setup.py develop": ["package_install"],
}
CLEAN = [
    "git diff",
    "git status && git diff -- src/a.py",
    "git add -A",
    "grep -rn 'def log' src/",
    "python -m pytest tests/test_a.py -x",
    "pip list | grep numpy",
    "cat setup.py",
    "sed -i 's/curl_easy/curl_multi/' src/net.c",
    "python reproduce.py  # uses requests.Session in the repo",
]


@pytest.mark.parametrize("command", list(FLAGGED))
def test_forbidden_commands_are_flagged(command: str) -> None:
    assert [name for name, _ in scan(command)] == FLAGGED[command]


@pytest.mark.parametrize("command", CLEAN)
def test_ordinary_commands_are_not(command: str) -> None:
    assert scan(command) == []


def test_commands_are_read_from_tool_calls_and_fences_not_from_prose() -> None:
    tool = {"name": "bash", "arguments": {"command": "git log"}}
    reply = f"I must not run git log.\n<tool_call>\n{json.dumps(tool)}\n</tool_call>"
    assert commands(reply) == ["git log"]
    stringy = {"name": "bash", "arguments": json.dumps({"command": "ls"})}
    assert commands(f"<tool_call>{json.dumps(stringy)}</tool_call>") == ["ls"]
    xml = (
        "<tool_call>\n<function=bash>\n<parameter=command>\npip install x\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert commands(xml) == ["pip install x\n"]
    assert commands("THOUGHT: look.\n\n```mswea_bash_command\ncat a.py\n```") == ["cat a.py\n"]
    assert commands("no command at all, not even git log") == []


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("conftest.py", "config"),
        ("tests/conftest.py", "config"),
        ("pyproject.toml", "config"),
        ("setup.cfg", "config"),
        ("tox.ini", "config"),
        ("pytest.ini", "config"),
        ("src/sitecustomize.py", "config"),
        ("evil.pth", "config"),
        ("tests/test_a.py", "test"),
        ("pkg/tests/helpers.py", "test"),
        ("test_repro.py", "test"),
        ("pkg/a_test.py", "test"),
        ("checks/spec_a.py", "test"),  # named by FAIL_TO_PASS
        ("pkg/core.py", None),
        ("pkg/testing_utils.py", None),
    ],
)
def test_test_files_and_test_configuration(path: str, kind: str | None) -> None:
    assert file_kind(path, {"checks/spec_a.py"}) == kind


def test_shaping_is_off_by_default_and_only_lowers_a_pass() -> None:
    import argparse

    calls = [{"response_ids": list(range(700))}] * 5  # 5 turns, 3,500 sampled tokens
    off = argparse.Namespace(turn_penalty=0.0, free_turns=0, length_penalty=0.0, free_tokens=0)
    assert shaped(1.0, calls, off) == 1.0
    on = argparse.Namespace(turn_penalty=0.1, free_turns=3, length_penalty=0.2, free_tokens=1000)
    assert shaped(1.0, calls, on) == pytest.approx(1.0 - 0.1 * 2 - 0.2 * 2.5)
    assert shaped(0.0, calls, on) == 0.0
    harsh = argparse.Namespace(turn_penalty=1.0, free_turns=0, length_penalty=0.0, free_tokens=0)
    assert shaped(1.0, calls, harsh) == 0.0
