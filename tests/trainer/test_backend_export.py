"""The backend's weight export on its own (`trainer/backend.py`: `gather`, `checkpoint_dtype`,
`export`), without verl's workers: state dicts in the shape verl's `get_per_tensor_param` yields
(checkpoint key names, full tensors). `tests/trainer/test_backend.py` runs the same export through
verl's workers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen3_5Config

from trainer.backend import ExportError, checkpoint_dtype, export, gather


def test_every_rank_walks_every_tensor_and_only_the_keeping_one_holds_them() -> None:
    """Each tensor of verl's generator is a collective (`full_tensor()`): a rank that stopped early
    would hang the others. Floating-point tensors take the export's dtype; integer ones keep
    theirs."""
    walked: list[str] = []

    def params() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in [("w", torch.ones(2, dtype=torch.float32)), ("n", torch.arange(3))]:
            walked.append(name)
            yield name, tensor

    assert gather(params(), keep=False, dtype=torch.bfloat16) == {}
    assert walked == ["w", "n"]
    kept = gather(params(), keep=True, dtype=torch.bfloat16)
    assert kept["w"].dtype == torch.bfloat16 and kept["n"].dtype == torch.int64
    # no dtype named: the parameters'
    assert gather(params(), keep=True, dtype=None)["w"].dtype == torch.float32


def test_the_export_dtype_is_the_one_the_checkpoint_names() -> None:
    assert checkpoint_dtype(Qwen2Config(dtype="bfloat16")) == torch.bfloat16
    in_its_text_part = Qwen3_5Config(text_config={"dtype": "bfloat16"})
    assert checkpoint_dtype(in_its_text_part) == torch.bfloat16
    assert checkpoint_dtype(Qwen2Config()) is None


def test_weights_that_do_not_fit_the_checkpoints_class_fail_naming_them(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    """What Qwen3.5's causal-LM class did silently (it lacks `model.language_model.*` and
    `model.visual.*`)."""
    config = AutoConfig.from_pretrained(tiny_path)
    state = AutoModelForCausalLM.from_pretrained(tiny_path).state_dict()
    state["model.visual.proj.weight"] = state.pop("model.norm.weight")
    named = r"1 missing \(such as \['model\.norm\.weight'\]\).*model\.visual\.proj"
    with pytest.raises(ExportError, match=named):
        export(state, config, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_a_tied_model_exports_and_reloads_equal(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    """The tiny Qwen2 ties its output head to its embeddings: the export writes one tensor for
    both, and the rotary buffers (never written) are computed again on load: the reloaded model
    computes what a model holding the same weights does."""
    config = AutoConfig.from_pretrained(tiny_path)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    state = {name: t.detach().clone() + 0.5 for name, t in base.state_dict().items()}
    export(state, config, tmp_path / "export")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32)
    assert back.lm_head.weight is back.get_input_embeddings().weight
    assert all(torch.equal(back.state_dict()[name], state[name]) for name in state)
    base.load_state_dict(state)
    ids = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(
        back(input_ids=ids).logits, base(input_ids=ids).logits, rtol=0, atol=0
    )
