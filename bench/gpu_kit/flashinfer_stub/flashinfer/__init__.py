"""A stand-in for flashinfer, which the GPU bundle does not carry (its kernels are a 427 MB wheel).

sglang 0.5.13 imports `flashinfer.sampling` and `flashinfer.prefill` at module level on CUDA: with
this package any `flashinfer.X` module and any name in it imports, and calling one raises. It
refuses `flashinfer.norm`, so that sgl_kernel uses its own RMSNorm. sglang must then not pick
flashinfer for anything: the kit runs it with `attention_backend: triton`, `sampling_backend:
pytorch` and SGLANG_IS_FLASHINFER_AVAILABLE=false (run.sh). It computes nothing.
"""

import importlib.abc
import importlib.machinery
import sys
import types


def _missing(name: str):
    def call(*args, **kwargs):
        raise NotImplementedError(f"flashinfer stub: {name} is not in the GPU bundle")

    return call


class _Anything(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "flashinfer.norm" or fullname.startswith("flashinfer.norm."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (stub: sgl_kernel's own)")
        if fullname.startswith("flashinfer."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Anything(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.insert(0, _Finder())


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(f"flashinfer.{name}")
