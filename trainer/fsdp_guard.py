"""A guard for torch FSDP2's gradient accumulation over parameters that took no part in the forward
pass.

With a `reduce_dtype` other than the parameters' compute dtype (bf16 compute, fp32 gradient
reduction), a backward that does not reduce (gradient accumulation:
`set_requires_gradient_sync(False)`) ends in `FSDPParam.to_accumulated_grad_if_needed` for every
parameter of every FSDP module, which reads the parameter's unsharded copy unguarded. A module never
run forward (a vision tower on text-only batches, where the model's forward skips it) was never
all-gathered, has no unsharded copy, and the backward fails with `AttributeError: 'FSDPParam'
object has no attribute '_unsharded_param'`. `install` makes such a parameter skip the step: it has
no unsharded gradient to keep. (verl 0.9.1's own Qwen3.5 forward runs the vision tower on a blank
image for text-only batches, so there it is gathered; other models and versions need not.)

It changes nothing else in FSDP, and does not decide which modules run or which dtypes are used
(verl's config does).
"""

from typing import Any

from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

_unguarded = FSDPParam.to_accumulated_grad_if_needed


def _to_accumulated_grad_if_needed(self: Any) -> None:
    """torch's step, for parameters that were all-gathered at least once (the others have no
    gradient)."""
    if not hasattr(self, "_unsharded_param"):
        return
    _unguarded(self)


def install() -> None:
    """Guard FSDP2 in this process (every process that runs a backward: verl's workers). Calling
    it again changes nothing."""
    FSDPParam.to_accumulated_grad_if_needed = _to_accumulated_grad_if_needed  # type: ignore[method-assign]


def installed() -> bool:
    """Whether `install` has guarded FSDP2 in this process."""
    return FSDPParam.to_accumulated_grad_if_needed is _to_accumulated_grad_if_needed
