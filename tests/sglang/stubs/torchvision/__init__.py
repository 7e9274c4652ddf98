"""A stand-in for torchvision in the CPU test environment of the SGLang engine.

PyPI's torchvision wheels link libtorch_cuda and do not load against the CPU torch build.
SGLang imports torchvision at module level (multimodal configs) but the cache, allocator, pool,
scheduler and plugin code under test never calls it: every ``torchvision.*`` module is made up
on import and every name in it is an inert class.
"""

import enum
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.28.0"


class InterpolationMode(enum.Enum):
    """The enum SGLang's image processors read at import."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Inert:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("torchvision is a stub in the SGLang CPU test environment")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "InterpolationMode":
        return InterpolationMode
    return type(name, (_Inert,), {})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        return __getattr__(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__path__ = []
