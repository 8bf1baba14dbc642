"""Random weights for the tiny Qwen3 of the GPU bundle: `python -m bench.gpu_kit.weights MODEL_DIR`.

The bundle carries the model's config and tokenizer only (its weights, 130 MB in bf16, would be two
more parts). This writes `model.safetensors` beside them, seeded, with transformers from
config.json, unless it is there already. The weights are noise: the run checks the stack
(training steps, weight pushes, versions), not what the model learns.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(folder: Path) -> int:
    if (folder / "model.safetensors").exists():
        return 0
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(folder), dtype=torch.bfloat16
    )
    model.save_pretrained(folder)
    print(f"weights: {sum(p.numel() for p in model.parameters()):,} parameters in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
