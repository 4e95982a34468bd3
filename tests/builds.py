"""The C builds that the hand-structured kernels (contractions, convolutions, segments) are
checked in, one per instruction-set branch of their code: ``native`` as users get it (the
default flags, ``-march=native``: AVX-512 on an Intel Xeon here), ``avx2`` (``-mavx2 -mfma``)
and ``portable`` C, both at ``-O2``, which compiles in a fraction of ``-O3``'s time.

On a CPU whose native build is the AVX2 one (x86 without AVX-512, the default flags), the
``avx2`` build compiles the same branches as ``native``: it is skipped beside a ``native``
case, which saves about a twentieth of the suite's time on an AMD EPYC.
"""

from __future__ import annotations

import os
import platform

import pytest

from polyc.target import get_target

CFLAGS = {"native": None, "avx2": "-O2 -mavx2 -mfma", "portable": "-O2"}

#: Whether this machine's native build takes the AVX2 branches (see the module docstring).
NATIVE_IS_AVX2 = (
    platform.machine() in ("x86_64", "AMD64")
    and not os.environ.get("POLYC_CFLAGS", "").strip()
    and get_target("host").vector_bits == 256
)

SAME_AS_NATIVE = (
    "this CPU's native build (-march=native, no AVX-512) takes the AVX2 branches: "
    "the [native] case checks the same code"
)


def builds(*names: str):
    """``@pytest.mark.parametrize("cflags", ...)`` over the named builds, with their names as
    ids; ``avx2`` is skipped where it would repeat ``native`` (also named)."""
    skip_avx2 = NATIVE_IS_AVX2 and "native" in names
    return pytest.mark.parametrize(
        "cflags",
        [
            pytest.param(
                CFLAGS[name],
                id=name,
                marks=[pytest.mark.skip(reason=SAME_AS_NATIVE)] if name == "avx2" and skip_avx2 else [],
            )
            for name in names
        ],
    )


def sanitizer_flag_sets(sanitizer_flags: str) -> tuple[str, ...]:
    """Sanitized builds for each instruction-set branch: the host's, AVX2 (not where the host's
    is AVX2, as above) and portable C."""
    native = f"{sanitizer_flags} -march=native"
    avx2 = () if NATIVE_IS_AVX2 else (f"{sanitizer_flags} -mavx2 -mfma",)
    return (native, *avx2, sanitizer_flags)
