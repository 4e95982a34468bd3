"""The identity of the machine a tuning measurement belongs to.

A time measured on one processor says little about another: a record is used automatically only
on a machine with the same fingerprint (CPU model, the instruction-set extensions that change
generated code, cache sizes, usable cores).  Two EPYCs of one model are interchangeable; an EPYC
and a Xeon, or one machine with 2 cores and one with 64, are not.
"""
from __future__ import annotations

import functools
import hashlib
import json
import platform
from dataclasses import asdict, dataclass

from polyc.schedule.tiling import machine_cache_sizes, usable_cores

#: The /proc/cpuinfo flags that change what polyc's C compiles to (vector width, FMA, NEON).
RELEVANT_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                      "avx512_bf16", "avx512_fp16", "amx_tile", "asimd", "sve", "sve2", "fphp", "asimdhp")


@dataclass(frozen=True)
class MachineFingerprint:
    """What must match for a tuning record to apply: see the module docstring."""

    machine: str            # platform.machine(): x86_64, aarch64, ...
    cpu_model: str          # /proc/cpuinfo "model name" (or the implementer/part on ARM)
    isa: tuple[str, ...]    # sorted subset of RELEVANT_ISA_FLAGS
    caches: tuple[int, int, int]  # L1d, L2 per core, L3, in bytes
    cores: int              # cores this process may run on

    @property
    def id(self) -> str:
        """A short stable digest of all fields, used in record keys."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def instruction_set(self) -> str:
        """The instruction set polyc's contraction and convolution kernels use here (the
        names of :data:`polyc.codegen.gemm.ISA_GUARDS`)."""
        flags = set(self.isa)
        if "avx512f" in flags:
            return "avx512"
        if {"avx2", "fma"} <= flags:
            return "avx2"
        return "neon" if self.machine in ("aarch64", "arm64") and "asimd" in flags else "portable"

    def describe(self) -> str:
        caches = "/".join(f"{size // 1024}K" for size in self.caches)
        return f"{self.cpu_model} ({self.machine}; {' '.join(self.isa) or 'no SIMD flags'}; " \
               f"caches {caches}; {self.cores} cores)"

    def to_json(self) -> dict:
        return {**asdict(self), "isa": list(self.isa), "caches": list(self.caches)}

    @staticmethod
    def from_json(data: dict) -> "MachineFingerprint":
        return MachineFingerprint(machine=str(data["machine"]), cpu_model=str(data["cpu_model"]),
                                  isa=tuple(data["isa"]), caches=tuple(int(c) for c in data["caches"]),
                                  cores=int(data["cores"]))


@functools.lru_cache(maxsize=None)
def this_machine() -> MachineFingerprint:
    """The fingerprint of the machine this process runs on."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:  # not Linux
        fields["model name"] = platform.processor() or "unknown"
    model = fields.get("model name") or " ".join(
        f"{key} {fields[key]}" for key in ("CPU implementer", "CPU part") if key in fields) or "unknown"
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    caches = machine_cache_sizes()
    return MachineFingerprint(platform.machine(), model, tuple(sorted(flags & set(RELEVANT_ISA_FLAGS))),
                              (caches.get(1, 0), caches.get(2, 0), caches.get(3, 0)), usable_cores())
