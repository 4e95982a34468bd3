"""Build, cache and load compiled kernels: generated C text -> shared library -> ctypes function.

path = get_or_build(c_source, CompilerOptions())
axpy = get_function(load_library(path), "axpy", [c_long, c_float, FLOAT_P, FLOAT_P])
"""

from polyc.runtime.cache import cache_dir, cache_key, get_or_build
from polyc.runtime.compiler import CompilerOptions, compile_shared_library
from polyc.runtime.loader import get_function, load_library

__all__ = [
    "CompilerOptions",
    "cache_dir",
    "cache_key",
    "compile_shared_library",
    "get_function",
    "get_or_build",
    "load_library",
]
