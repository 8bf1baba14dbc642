"""Does every module agl's GPU path imports resolve with the bundle's wheels and the GPU machine's own?

Usage: python -m bench.gpu_kit.check [--ray] [MODULE ...]

Run it with the Python that stands in for the GPU machine's, with the kit's env.sh sourced
(`make gpu-bundle-check` does both: check_venv.sh). Each module of `MODULES` (or those named) is
imported in a fresh interpreter. When an import stops on a module that is not installed, the
check records the name, puts a stand-in module in its place and imports again, so one run lists
every missing module a target reaches, not only the first. One line per target:

    ok       trainer.backend
    MISSING  sglang.srt.entrypoints.http_server: foo (from .../bar.py), baz (from ...)
    GPU      sgl_kernel: ImportError: ... No GPU detected ...
    ERROR    ...: any other exception, with its message

`GPU` marks what fails only for want of a GPU (no driver, no device): the check cannot see past
it, and the modules behind it are checked on the GPU machine only. A first line, `versions`,
says whether the bundle's wheels' requirements hold against what is installed (`--versions`:
that line alone, in seconds; install.sh runs it on the GPU machine). Three more lines: agl's
subcommands are found (its wheel's entry points: gpu_smoke.sh starts `agl.cli train`);
sgl_kernel's sm90 library finds every library it links to but the driver's; with `--ray`, a
local Ray (one CPU) starts from the same wheels and runs a task that imports verl's workers.
Last line: `gpu_bundle_check targets=N ok=K missing=M gpu=G error=E`; exit status 1 when a module
is missing or anything fails but for the missing GPU.

It does not check versions (the bundle's pins are wheels.txt) nor run anything on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import Distribution, distributions, entry_points
from importlib.util import find_spec
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# What agl's GPU path imports: the trainer's own modules (which import verl's workers, Ray and
# torch), the modules verl loads by name (its sglang server, the FSDP engine, the checkpoint
# engines), sglang's server, scheduler and Qwen3 model, Ray's worker entry, the gateway and the
# controller.
MODULES = [
    "trainer.backend",
    "trainer.engines",
    "trainer.doctor",
    "trainer.loop",
    "hydra",  # imported when a config loads (trainer.config.load_config)
    "alembic.config",  # imported when the store migrates (agl.store)
    "transformers",
    "verl.workers.engine_workers",
    "verl.workers.engine.fsdp",
    "verl.workers.rollout.llm_server",
    "verl.workers.rollout.sglang_rollout.sglang_rollout",
    "verl.workers.rollout.sglang_rollout.async_sglang_server",
    "verl.checkpoint_engine",
    "verl.utils.tracking",
    "torch.utils.tensorboard",
    "ray",
    "ray._private.workers.default_worker",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.models.qwen3",
    "sgl_kernel",
    "gateway.app",
    "controller.loop",
    "agl.cli",
]
COMMANDS = {"train", "gateway", "controller", "doctor"}  # what gpu_smoke.sh and run.sh start
GPU_WORDS = ("libcuda", "no gpu detected", "nvidia driver", "no cuda gpus", "cudagetdevicecount")

# Run in a fresh interpreter: import MODULE with the names in STUBS replaced by stand-ins; print
# one JSON line: {"ok": true} or {"missing": name, "by": importer} or {"error": "Type: message"}.
PROBE = textwrap.dedent(
    """
    import importlib, importlib.abc, importlib.machinery, json, sys, traceback, types

    module, stubs = sys.argv[1], set(json.loads(sys.argv[2]))

    class Anything(type):
        def __getattr__(cls, name):
            return Anything(name, (), {})
        def __call__(cls, *args, **kwargs):
            return Anything("result", (), {})

    class Stub(types.ModuleType):
        __path__ = []
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Anything(name, (), {})

    class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".")[0] in stubs:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        def create_module(self, spec):
            return Stub(spec.name)
        def exec_module(self, m):
            pass

    sys.meta_path.insert(0, StubFinder())
    def cause(e):  # the ModuleNotFoundError behind an error (pandas wraps its own in an ImportError)
        while e is not None and not isinstance(e, ModuleNotFoundError):
            e = e.__cause__ or e.__context__
        return e

    try:
        importlib.import_module(module)
        print(json.dumps({"ok": True}))
    except BaseException as e:
        missing = cause(e)
        if missing is None:
            text = " ".join(str(e).split())
            print(json.dumps({"error": f"{type(e).__name__}: {text[:2000]}"}))
        else:
            frames = traceback.extract_tb(missing.__traceback__)
            by = next((f.filename for f in reversed(frames) if "importlib" not in f.filename), "?")
            print(json.dumps({"missing": (missing.name or str(missing)).split(".")[0], "by": by}))
    """
)


def probe(module: str, stubs: list[str], timeout_s: float) -> dict[str, str]:
    """One import of `module` in a fresh interpreter, with `stubs` standing in."""
    command = [sys.executable, "-c", PROBE, module, json.dumps(stubs)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    result: dict[str, str] = json.loads(lines[-1])
    return result


def check(module: str, timeout_s: float) -> tuple[str, str]:
    """A status (ok, MISSING, GPU, ERROR) for `module` and what it found."""
    stubs: list[str] = []  # the missing modules found so far, standing in from the next try on
    notes: list[str] = []
    while True:
        found = probe(module, stubs, timeout_s)
        if "missing" in found and found["missing"] not in stubs:
            stubs.append(found["missing"])
            notes.append(f"{found['missing']} (from {found['by']})")
            continue
        if notes:
            return "MISSING", ", ".join(notes)
        if found.get("ok"):
            return "ok", ""
        error = found.get("error", str(found))
        if any(word in error.lower() for word in GPU_WORDS):
            return "GPU", error
        return "ERROR", error


RAY_TASK = textwrap.dedent(
    """
    import ray
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    @ray.remote
    def where():
        import verl.workers.engine_workers  # what verl's worker actors import first
        return "ok"
    print("ray task:", ray.get(where.remote(), timeout=240))
    ray.shutdown()
    """
)


def check_ray(timeout_s: float) -> tuple[str, str]:
    """Start a local Ray, run one task that imports verl's workers, stop it."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    command = [sys.executable, "-c", RAY_TASK]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return "ERROR", f"timed out after {timeout_s:.0f} s"
    finally:
        stop = [sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"]
        subprocess.run(stop, capture_output=True, check=False)
    if "ray task: ok" in done.stdout:
        return "ok", ""
    return "ERROR", (done.stderr.strip() or done.stdout.strip())[-500:]


def check_kernel_links() -> tuple[str, str]:
    """sgl_kernel's sm90 library (what an H100 or H200 loads) finds every shared library it links
    to but the CUDA driver's, with torch's and the nvidia-* libraries beside it (as `import torch`
    loads them first)."""
    import torch

    kernel = find_spec("sgl_kernel")
    if kernel is None or not kernel.submodule_search_locations:
        return "ERROR", "sgl_kernel is not installed"
    library = Path(kernel.submodule_search_locations[0]) / "sm90" / "common_ops.abi3.so"
    torch_lib = Path(torch.__file__).parent / "lib"
    paths = [torch_lib, *sorted(torch_lib.parent.parent.glob("nvidia/*/lib"))]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(map(str, paths))}
    done = subprocess.run(["ldd", str(library)], capture_output=True, text=True, env=env)
    missing = [line.split()[0] for line in done.stdout.splitlines() if "not found" in line]
    if done.returncode != 0 or set(missing) - {"libcuda.so.1"}:
        return "ERROR", f"{library.name} links to libraries not found: {missing or done.stderr}"
    return "ok", "every library found but libcuda.so.1 (the driver's, on the GPU machine)"


def check_requirements(site: Path) -> tuple[str, str]:
    """Each requirement of a distribution installed in `site` (the bundle's) holds wherever it
    names an installed distribution: the first of a name on sys.path, as imports find it (a
    machine's own transformers stays behind the bundle's). A requirement on what is not installed
    at all is the import check's business (the bundle leaves out much of what sglang lists)."""
    found: dict[str, Distribution] = {}
    for dist in distributions():  # in sys.path order
        found.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
    conflicts = []
    checked = 0
    bundled = [
        d for d in found.values() if Path(str(d.locate_file(""))).resolve() == site.resolve()
    ]
    for dist in bundled:
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            other = found.get(canonicalize_name(req.name))
            if other is None:
                continue
            checked += 1
            if not req.specifier.contains(other.version, prereleases=True):
                wanted = f"{req.name}{req.specifier}"
                conflicts.append(f"{dist.metadata['Name']} needs {wanted}, found {other.version}")
    if conflicts:
        return "ERROR", "; ".join(conflicts)
    return "ok", f"{checked} requirements of the bundle's {len(bundled)} distributions hold"


def check_commands() -> tuple[str, str]:
    """agl's wheel is installed: `agl` finds its subcommands (entry points) from its metadata."""
    found = {ep.name for ep in entry_points(group="agl.commands")}
    missing = sorted(COMMANDS - found)
    if missing:
        return "ERROR", f"no entry point for {missing}: agl's wheel is not installed"
    return "ok", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=MODULES)
    parser.add_argument("--ray", action="store_true", help="also start Ray and run one task")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per import")
    parser.add_argument("--versions", action="store_true", help="only the versions (seconds)")
    args = parser.parse_args(argv)
    site = Path(os.environ.get("GPU_KIT_SITE", "."))  # env.sh sets it
    results = [("versions", *check_requirements(site))]
    if not args.versions:
        results += [(module, *check(module, args.timeout)) for module in args.modules]
        results.append(("agl's subcommands", *check_commands()))
        results.append(("sgl_kernel/sm90 links", *check_kernel_links()))
    if args.ray:
        results.append(("ray.init and one task", *check_ray(args.timeout)))
    counts = dict.fromkeys(("ok", "MISSING", "GPU", "ERROR"), 0)
    for module, status, detail in results:
        counts[status] += 1
        print(f"{status:8} {module}" + (f": {detail[:300]}" if detail else ""), flush=True)
    print(
        f"gpu_bundle_check targets={len(results)} ok={counts['ok']} missing={counts['MISSING']} "
        f"gpu={counts['GPU']} error={counts['ERROR']}"
    )
    return 1 if counts["MISSING"] or counts["ERROR"] else 0


if __name__ == "__main__":
    sys.exit(main())
