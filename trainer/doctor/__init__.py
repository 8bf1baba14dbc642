"""`agl doctor`: a preflight of the training stack that takes `agl train`'s config, before a long run.

It runs eight checks in order, each relying on the ones before, prints a table and, for the first
failure, what to do; it stops there:
- versions: the installed versions against agl's pins (the `gpu` extra on `trainer.device: cuda`,
  `train` on `cpu`);
- cuda: CUDA sees the GPUs the config asks for;
- backend: it starts (Ray, verl's worker group and, on cuda, verl's sglang servers);
- v1/models: each engine serves the context the config names;
- generate: one `/generate` with logprobs comes back as the gateway records it;
- stream: a streamed `/generate` chunks at the cadence the config gives sglang (on cuda), and
  `/abort_request` ends another by its rid, as the gateway ends a stream it leaves;
- left stream: a stream left without an abort (a harness gone behind a gateway that
  crashed), then the trainer's sleep and wake: the sequence that killed sglang on an H200;
- weight push: one push through the trainer's own path (sleep, push, wake) reaches every engine.
`--skip-versions` skips the first check, for an install that leaves a pin out on purpose
(bench/gpu_kit's bundle, without flash-attn).

The checks are about the stack, not the model's size: a small model of the same architecture
family (`actor_rollout_ref.model.path=...`) checks a large run's stack in minutes. It never reads
`/server_info` (sglang answers 500 there on the servers verl launches). It trains nothing and
leaves nothing behind: the pushed weights go to `trainer.default_local_dir/doctor`, removed at the
end, and on `cpu` the engine at `agl.engine` is given back the weights and version it served.

The modules, in reading order:
- `cli`: the command line (`main`);
- `checkup`: `Doctor`, the eight checks in order and the shutdown after them;
- `install`, `replies`: the checks' logic on plain data (versions and CUDA; an engine's replies);
- `probes`: the requests the checks send an engine;
- `report`: the checks' names and fixes, one check's row, and the table.
This package re-exports the command and `Doctor`; everything else is imported from its module.
"""

from trainer.doctor.checkup import Doctor
from trainer.doctor.cli import main

__all__ = ["Doctor", "main"]
