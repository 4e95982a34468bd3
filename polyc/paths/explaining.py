"""Sentences the dedicated kernel paths explain themselves with, from what their code generator
recorded (:attr:`polyc.codegen.pattern_kernel.DedicatedKernel.decisions`) and the options the
kernel was compiled with, never from the C text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyc.runtime.compiler import built_instruction_set
from polyc.target import INSTRUCTION_SETS, InstructionSet


def decisions_of(stages) -> Mapping[str, Any]:
    """The choices the code generator recorded for ``stages``' kernel (empty for a kernel that
    records none)."""
    return getattr(stages.kernel, "decisions", None) or {}


def built_for(stages, sets: Mapping[str, InstructionSet] = INSTRUCTION_SETS) -> str | None:
    """The instruction set among ``sets`` whose code the kernel's build runs (the C compiler's
    flags for ``stages``' options), or None when the compiler cannot be asked."""
    return built_instruction_set(stages.options, sets) if stages.options is not None else None


def built_for_sentence(stages, decisions: Mapping[str, Any], isa: str | None) -> str:
    """Which instruction set's code the build runs, of those the source holds."""
    held = ", ".join(decisions.get("instruction_sets", ()))
    if isa is None:
        return f"the source holds code for {held}; the C preprocessor keeps the one the compiler's flags enable"
    why = (
        "vectorize=False selects the portable code"
        if stages.options is not None and not stages.options.vectorize
        else "the C compiler's flags enable it"
    )
    return f"built for {isa} ({why}); the source holds code for {held}, the C preprocessor keeps one"


def threads_sentence(stages, decisions: Mapping[str, Any], work: int | None, how: str) -> str:
    """Whether and how the threads share the work (``how``: how the kernel shares it)."""
    options = stages.options
    if options is None or not decisions.get("parallel", False):
        return "threads: one (parallel=False)"
    threshold = int(decisions.get("parallel_threshold", 0))
    if work is not None and work < threshold:
        return (
            f"threads: one: {work} multiply-adds are fewer than {threshold}, below which a parallel region costs more"
        )
    count = f"up to {options.threads} threads (threads={options.threads})" if options.threads else "the OpenMP threads"
    above = (
        f"{work} multiply-adds, at least {threshold}: "
        if work is not None
        else f"in a call of at least {threshold} multiply-adds, "
    )
    return f"threads: {above}{count}; {how}"


def kib(size: int) -> str:
    """A cache size in KiB or MiB."""
    return f"{size // (1 << 20)} MiB" if size >= 1 << 20 and size % (1 << 20) == 0 else f"{size // 1024} KiB"
