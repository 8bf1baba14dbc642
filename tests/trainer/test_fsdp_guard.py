"""trainer/fsdp_guard.py against torch's own FSDP2 on the CPU: a gloo process group of one rank in
a subprocess (the process group and the patch are process-wide), a model with a submodule that
never runs forward, bf16 compute with fp32 gradient reduction, and gradient accumulation over two
micro-batches (the first one without reducing, as verl's `use_no_sync_for_gradient_accumulation`
does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(8, 8)
        self.unused = torch.nn.Linear(8, 8)  # as a vision tower on text-only batches

    def forward(self, x):
        return self.used(x)


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
if sys.argv[1] == "guarded":
    from trainer import fsdp_guard

    fsdp_guard.install()
    fsdp_guard.install()  # a second call changes nothing
    assert fsdp_guard.installed()
torch.manual_seed(0)
model = Model()
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for module in (model.used, model.unused, model):
    fully_shard(module, mp_policy=policy)
batches = [torch.randn(4, 8), torch.randn(4, 8)]
model.set_requires_gradient_sync(False)
model(batches[0]).float().sum().backward()
model.set_requires_gradient_sync(True)
model(batches[1]).float().sum().backward()
grad = model.used.weight.grad.full_tensor()
# d(sum of outputs)/dW of a linear layer: each row is the sum of the inputs, over both micro-batches
want = torch.cat(batches).sum(0).expand(8, 8)
print(json.dumps({
    "dtype": str(grad.dtype),
    "error": float((grad - want).abs().max() / want.abs().max()),
    "unused_grad": model.unused.weight.grad is not None,
}))
"""


def run(mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_the_guard_torch_fails_on_the_module_that_never_ran() -> None:
    """torch's bug, shown here so that a torch release that fixes it shows too (then the guard
    can go)."""
    done = run("unguarded")
    assert done.returncode != 0
    assert "'FSDPParam' object has no attribute '_unsharded_param'" in done.stderr


def test_with_the_guard_the_used_modules_gradient_accumulates_over_both_micro_batches() -> None:
    """The gradient is reduced in fp32 and holds both micro-batches (bf16 compute: 8 significant
    bits, so within 2% of the exact sum; a lost micro-batch would leave it off by that
    micro-batch's whole sum); the module that never ran has none."""
    done = run("guarded")
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["dtype"] == "torch.float32"
    assert got["error"] < 0.02
    assert got["unused_grad"] is False
