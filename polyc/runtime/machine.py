"""The identity of the machine a tuning measurement belongs to.

A time measured on one processor says little about another: a record is used automatically only
on a machine with the same fingerprint (CPU model, its family/model/stepping, the instruction-set
extensions that change generated code, cache sizes, usable cores).  Two EPYCs of one model are
interchangeable; an EPYC and a Xeon, or one machine with 2 cores and one with 64, are not.

The model name alone does not tell processors apart on virtual machines: the cloud VMs polyc
is developed on report "AMD EPYC" for Zen 1, Zen 3, Zen 4 and Zen 5 alike, and a Zen 3 and a
Zen 4 of equal caches differ only in their AVX-512 flags.  So the fingerprint also holds the
processor's identity numbers (x86: vendor, family, model, stepping; ARM: implementer, part,
variant, revision), and :attr:`MachineFingerprint.microarchitecture` names the known ones, so
that a benchmark's figures say which processor they were measured on.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from polyc.target import host, instruction_set_of, usable_cores

#: The /proc/cpuinfo flags that change what polyc's C compiles to (vector width, FMA, NEON).
RELEVANT_ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "asimd",
    "sve",
    "sve2",
    "fphp",
    "asimdhp",
)


@dataclass(frozen=True)
class MachineFingerprint:
    """What must match for a tuning record to apply: see the module docstring."""

    machine: str  # platform.machine(): x86_64, aarch64, ...
    cpu_model: str  # /proc/cpuinfo "model name" (or the implementer/part on ARM)
    isa: tuple[str, ...]  # sorted subset of RELEVANT_ISA_FLAGS
    caches: tuple[int, int, int]  # L1d, L2 per core, L3, in bytes
    cores: int  # cores this process may run on
    cpu_id: str = ""  # "AuthenticAMD 25/17/1" (vendor family/model/stepping) or "arm 0x41/0xd0c/0/1"; "" unknown

    @property
    def id(self) -> str:
        """A short stable digest of all fields, used in record keys (of a fingerprint whose
        ``cpu_id`` is unknown, the digest fingerprints had before they held one)."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def instruction_set(self) -> str:
        """The instruction set polyc's contraction and convolution kernels use here (the
        names of :data:`polyc.target.INSTRUCTION_SETS`)."""
        return instruction_set_of(self.isa, self.machine)

    @property
    def microarchitecture(self) -> str:
        """The processor's microarchitecture where :data:`MICROARCHITECTURES` knows its family
        and model ("Zen 4", "Emerald Rapids"), else ""."""
        return microarchitecture(self.cpu_id)

    def describe(self) -> str:
        caches = "/".join(f"{size // 1024}K" for size in self.caches)
        identity = ", ".join(filter(None, (self.microarchitecture, self.cpu_id)))
        return (
            f"{self.cpu_model}{f' [{identity}]' if identity else ''} ({self.machine}; "
            f"{' '.join(self.isa) or 'no SIMD flags'}; caches {caches}; {self.cores} cores)"
        )

    def to_json(self) -> dict:
        data = {**asdict(self), "isa": list(self.isa), "caches": list(self.caches)}
        if not self.cpu_id:  # as fingerprints without it were written (and digested)
            del data["cpu_id"]
        return data

    @staticmethod
    def from_json(data: dict) -> MachineFingerprint:
        l1, l2, l3 = (int(c) for c in data["caches"])
        return MachineFingerprint(
            machine=str(data["machine"]),
            cpu_model=str(data["cpu_model"]),
            isa=tuple(data["isa"]),
            caches=(l1, l2, l3),
            cores=int(data["cores"]),
            cpu_id=str(data.get("cpu_id", "")),
        )


@functools.cache
def this_machine() -> MachineFingerprint:
    """The fingerprint of the machine this process runs on."""
    processor = host()
    return MachineFingerprint(
        processor.machine,
        processor.model,
        tuple(sorted(processor.flags & set(RELEVANT_ISA_FLAGS))),
        processor.caches,
        usable_cores(),
        cpu_identity(processor.cpuinfo),
    )


def cpu_identity(cpuinfo: Mapping[str, str]) -> str:
    """The processor's identity numbers from the first processor's /proc/cpuinfo fields:
    ``"<vendor> <family>/<model>/<stepping>"`` on x86, ``"arm <implementer>/<part>/<variant>/
    <revision>"`` on ARM, "" where neither is there."""
    x86 = [cpuinfo.get(name, "") for name in ("cpu family", "model", "stepping")]
    if cpuinfo.get("vendor_id") and all(x86):
        return f"{cpuinfo['vendor_id']} {'/'.join(x86)}"
    arm = [cpuinfo.get(f"CPU {name}", "") for name in ("implementer", "part", "variant", "revision")]
    if all(arm):
        return f"arm {'/'.join(arm)}"
    return ""


#: Microarchitectures by vendor and family: (first model, last model, name), from the vendors'
#: family/model tables (AMD's Processor Programming References, Intel's model numbers as Linux
#: lists them in arch/x86/include/asm/intel-family.h).  Only the server and desktop parts that
#: polyc's kernels are tuned for; others describe themselves by their numbers.
MICROARCHITECTURES: dict[tuple[str, int], tuple[tuple[int, int, str], ...]] = {
    ("AuthenticAMD", 23): ((0x00, 0x2F, "Zen/Zen+"), (0x30, 0xAF, "Zen 2")),
    ("AuthenticAMD", 25): (
        (0x00, 0x0F, "Zen 3"),
        (0x10, 0x1F, "Zen 4"),
        (0x20, 0x2F, "Zen 3"),
        (0x40, 0x5F, "Zen 3"),
        (0x60, 0x7F, "Zen 4"),
        (0xA0, 0xAF, "Zen 4"),
    ),
    ("AuthenticAMD", 26): ((0x00, 0x7F, "Zen 5"),),
    ("GenuineIntel", 6): (
        (0x3F, 0x3F, "Haswell"),
        (0x4F, 0x4F, "Broadwell"),
        (0x55, 0x55, "Skylake/Cascade Lake"),
        (0x6A, 0x6A, "Ice Lake"),
        (0x8F, 0x8F, "Sapphire Rapids"),
        (0xAD, 0xAD, "Granite Rapids"),
        (0xCF, 0xCF, "Emerald Rapids"),
    ),
}


def microarchitecture(cpu_id: str) -> str:
    """The name of the microarchitecture a ``cpu_id`` (see :func:`cpu_identity`) belongs to, or ""."""
    vendor, _, numbers = cpu_id.partition(" ")
    try:
        family, model = (int(n) for n in numbers.split("/")[:2])
    except ValueError:
        return ""
    for first, last, name in MICROARCHITECTURES.get((vendor, family), ()):
        if first <= model <= last:
            return name
    return ""
