#!/usr/bin/env bash
# Installs the pinned coding-agent CLIs (Claude Code, Codex) from the npm registry into
# .npm-harnesses/ at the repository root (gitignored), unless the pinned versions are already
# there. tests/gateway/test_coding_agents.py runs it; so can you. Needs Node and npm.
# Prints the folder that holds the `claude` and `codex` commands.
set -euo pipefail
CLAUDE_CODE=2.1.332
CODEX=0.171.0
prefix="${AGL_HARNESSES_PREFIX:-$(cd "$(dirname "$0")/../.." && pwd)/.npm-harnesses}"
bin="$prefix/node_modules/.bin"

installed() {  # the pinned versions answer --version (run with a throwaway HOME: no config is written)
  local home
  home=$(mktemp -d)
  trap 'rm -rf "$home"' RETURN
  [[ "$(HOME=$home "$bin/claude" --version 2>/dev/null)" == "$CLAUDE_CODE (Claude Code)" ]] &&
    [[ "$(HOME=$home CODEX_HOME=$home "$bin/codex" --version 2>/dev/null)" == "codex-cli $CODEX" ]]
}

if ! installed; then
  # Claude Code's package is a native binary (its postinstall copies the platform's build into
  # place), so the Node >= 22 it declares is not needed to run it: --engine-strict stays off.
  npm install --prefix "$prefix" --no-save --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX" >&2
  installed || { echo "install.sh: claude $CLAUDE_CODE / codex $CODEX do not run from $bin" >&2; exit 1; }
fi
echo "$bin"
