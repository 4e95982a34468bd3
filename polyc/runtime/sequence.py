"""One C call for a sequence of compiled kernel calls.

A caller that runs the same kernels on the same memory again and again (an ONNX plan) pays for
each ctypes call a few microseconds (converting the arguments, releasing and taking the GIL), a
visible share of a small model's run at batch 1 (``python -m benchmarks.onnx_bench --models
mobilenet_v2 --batches 1``).  Here a small C function calls them
in order from tables::

    functions[i]   the kernel's address
    kinds[i]       its signature: T pointer arguments then S int64 sizes (every polyc kernel
                   function is ``int f(void *, ..., int64_t, ...)``), one case of a switch
    arguments      the calls' arguments, one after the other, as 64-bit integers

and stops at the first call that returns a nonzero status, saying which.  Its C depends only on
the signatures it serves, so it is built once per set of signatures into the kernel cache.

The same runner calls one kernel whose arguments are more than ctypes can pass (a def with
thousands of tensors, such as an ONNX Concat of thousands of inputs): :class:`TableCall`.
"""

from __future__ import annotations

import ctypes

import numpy as np

from polyc.runtime.cache import load_kernel_library
from polyc.runtime.compiler import CompilerOptions
from polyc.runtime.loader import get_function

#: The runner's name in its library.
RUNNER = "polyc_run_calls"

#: The most arguments ctypes passes to a C function (CTYPES_MAX_ARGCOUNT in CPython's _ctypes);
#: a call with more raises ctypes.ArgumentError.
CTYPES_MAX_ARGUMENTS = 1024


def runner_source(signatures: tuple[tuple[int, int], ...]) -> str:
    """The C of the runner for ``signatures`` ((T pointers, S sizes) per kind, in kind order)."""
    cases = []
    for kind, (pointers, sizes) in enumerate(signatures):
        parameters = ["void *"] * pointers + ["int64_t"] * sizes
        values = [f"(void *)(intptr_t)a[{j}]" for j in range(pointers)] + [f"a[{pointers + j}]" for j in range(sizes)]
        cases.append(
            f"        case {kind}:\n"
            f"            status = ((int (*)({', '.join(parameters) or 'void'}))functions[i])({', '.join(values)});\n"
            f"            a += {pointers + sizes};\n"
            f"            break;"
        )
    return f"""/* polyc: one call running a sequence of kernel calls (polyc/runtime/sequence.py) */
#include <stdint.h>

int {RUNNER}(void *const *functions, const int64_t *kinds, const int64_t *arguments, int64_t count,
                    int64_t *failed)
{{
    const int64_t *a = arguments;
    for (int64_t i = 0; i < count; i++) {{
        int status;
        switch (kinds[i]) {{
{chr(10).join(cases)}
        default:
            *failed = i;
            return -1;
        }}
        if (status) {{
            *failed = i;
            return status;
        }}
    }}
    return 0;
}}
"""


def sequence_runner(signatures: tuple[tuple[int, int], ...], cc: str | None = None):
    """The runner for ``signatures``, built by ``cc`` (None: the default C compiler) or found in
    the kernel cache, and loaded: a ctypes function of (functions, kinds, arguments, count,
    failed) addresses and the count, returning 0, the failing call's status, or -1 for an
    unknown kind."""
    options = CompilerOptions(cc=cc, flags=("-O2",), openmp=False)
    library = load_kernel_library(runner_source(signatures), options, name="the call sequence runner")
    return get_function(
        library,
        RUNNER,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p],
        ctypes.c_int,
    )


class TableCall:
    """Calls one kernel function of ``pointers`` pointer and ``sizes`` int64 arguments through
    the runner, which reads them from a table: for kernels with more arguments than ctypes
    passes (:data:`CTYPES_MAX_ARGUMENTS`).  Called like the ctypes function it stands for,
    ``call(*pointers, *sizes)``, it returns the kernel's status."""

    def __init__(self, address: int, pointers: int, sizes: int, cc: str | None = None):
        self.address = address
        self.count = pointers + sizes
        self._runner = sequence_runner(((pointers, sizes),), cc)
        self._functions = (ctypes.c_void_p * 1)(address)
        self._kinds = (ctypes.c_int64 * 1)(0)

    def __call__(self, *arguments: int) -> int:
        if len(arguments) != self.count:
            raise TypeError(f"the kernel takes {self.count} arguments, got {len(arguments)}")
        table = np.array(arguments, dtype=np.int64)  # addresses and sizes: each fits in 63 bits
        failed = ctypes.c_int64(0)
        return int(self._runner(self._functions, self._kinds, table.ctypes.data, 1, ctypes.byref(failed)))
