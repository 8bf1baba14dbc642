"""Checks 1 and 2 on plain data: agl's pins installed, and CUDA seeing the GPUs the config asks for.

- Owns reading agl's requirements for the device's extra (`gpu` on cuda, `train` on cpu),
  comparing them with what is installed, and the pip command that fixes a difference; and
  counting CUDA's devices against `trainer.n_gpus_per_node`.
- Imports no torch and starts nothing: `checkup.Doctor` asks torch and passes the counts here.
"""

from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import Requirement

from trainer.doctor.report import CheckFailed


def extra_for(device: str) -> str:
    """The extra whose pins an install for `trainer.device` must hold."""
    if device == "cpu":
        return "train"
    return "gpu"


def agl_requirements() -> list[str]:
    """The requirement lines of the installed `agl` distribution, with their extras' markers."""
    return requires("agl") or []


def pins(extra: str, lines: Iterable[str]) -> list[Requirement]:
    """The requirements an install of `agl[extra]` must hold: agl's own and those of `extra`."""
    wanted = []
    for line in lines:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            wanted.append(req)
    return wanted


def installed(name: str) -> str | None:
    """The installed version of distribution `name`, or None if it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check_versions(
    extra: str, wanted: list[Requirement], have: Callable[[str], str | None] = installed
) -> str:
    """Each requirement installed at a version it allows, else the pip command that fixes it."""
    wrong = []
    found = []
    for req in wanted:
        got = have(req.name)
        if got is None:
            found.append(f"{req.name} missing (want {req.specifier or 'any'})")
            wrong.append(req)
        elif not req.specifier.contains(got, prereleases=True):
            found.append(f"{req.name} {got} (want {req.specifier})")
            wrong.append(req)
    if not wrong:
        return f"{len(wanted)} requirements of agl[{extra}] hold"
    specs = " ".join(f"'{pip_spec(req)}'" for req in wrong)
    # flash-attn compiles against the installed torch (README, Install)
    isolation = "--no-build-isolation " if extra == "gpu" else ""
    command = f"pip install {isolation}{specs}"
    raise CheckFailed(", ".join(found), f"Install the pinned versions: {command}")


def pip_spec(req: Requirement) -> str:
    """The requirement as pip takes it on a command line: extras and versions, no marker."""
    bare = Requirement(str(req))
    bare.marker = None
    return str(bare)


def check_cuda(available: bool, count: int, wanted: int) -> str:
    """CUDA sees at least the `wanted` GPUs (`trainer.n_gpus_per_node`)."""
    if not available or count == 0:
        raise CheckFailed(
            "no CUDA device visible: this machine cannot run the GPU path; "
            "run agl doctor on the GPU node",
            "Run agl doctor on the GPU node (there, check nvidia-smi and CUDA_VISIBLE_DEVICES); "
            "on a machine without GPUs, trainer.device=cpu checks the CPU path.",
        )
    if count < wanted:
        raise CheckFailed(
            f"{count} CUDA devices visible, trainer.n_gpus_per_node asks for {wanted}",
            f"Set trainer.n_gpus_per_node={count}, or free the GPUs CUDA_VISIBLE_DEVICES hides.",
        )
    return f"{count} CUDA devices visible, {wanted} used"
