"""GPU runtimes: build a def's GPU code, copy its tensors to the device, run its launches.

``backend="opencl"`` runs through pyopencl on the device the usual ``PYOPENCL_CTX`` conventions
choose (on a machine without a GPU, PoCL's CPU device runs the same kernels, with work-groups,
local memory and barriers executed faithfully).  ``backend="cuda"`` runs through pycuda, which
compiles with nvcc; it needs an NVIDIA GPU and its driver.  Built programs are cached on disk
under polyc's cache directory (``opencl/``, ``cuda/``), keyed by their source and device.

A call with numpy arrays copies every tensor to the device (outputs too: a def may accumulate
into them), runs the launches in order on one queue (each launch sees the previous ones'
writes: the global barrier between them) and copies the outputs back.  A call with the
runtime's own device arrays (pyopencl's ``Array``, pycuda's ``GPUArray``) among its inputs
uses them in place and returns device arrays: no copy.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyc.codegen.gpu import GpuKernelSource
from polyc.errors import BoundsError, PolycError, SignatureError
from polyc.lang.checked import CheckedDef
from polyc.options import Options
from polyc.runtime.arguments import BoundCall, as_input_array
from polyc.runtime.cache import cache_dir
from polyc.target import DEVICE_MODELS, DeviceModel


class _SharedRuntime:
    """One runtime object per process and kind, created on first use (creating a context is slow)."""

    _shared = None
    _lock = threading.Lock()

    @classmethod
    def shared(cls):
        with cls._lock:
            if cls.__dict__.get("_shared") is None:
                cls._shared = cls()
            return cls._shared


class OpenCLRuntime(_SharedRuntime):
    """A pyopencl context and queue."""

    #: float16 tensors live on the device as float (polyc's OpenCL C rounds every float16 result
    #: without needing cl_khr_fp16); numpy arrays are converted on the way in and out
    float16_as_float = True

    def __init__(self):
        try:
            import pyopencl as cl
        except ImportError as error:
            raise PolycError(
                "backend='opencl' needs pyopencl and an OpenCL driver: pip install pyopencl "
                "(and pocl-binary-distribution to run on the CPU)"
            ) from error
        self.cl = cl
        self.context = _opencl_context(cl)
        self.queue = cl.CommandQueue(self.context)
        self.device = self.context.devices[0]
        self._programs: dict[str, object] = {}
        self._kernels: dict[tuple[int, str], object] = {}

    def describe(self) -> str:
        return f"{self.device.platform.name}: {self.device.name}"

    def device_model(self) -> DeviceModel:
        """The mapping's model of this device, from OpenCL's device queries."""
        d, cl = self.device, self.cl
        gpu = bool(d.type & cl.device_type.GPU)
        warp = 32 if gpu else max(1, d.preferred_vector_width_float)
        fill = d.max_compute_units * (2048 if gpu else warp)
        return DeviceModel(
            f"{d.platform.name}: {d.name}",
            d.max_work_group_size,
            d.local_mem_size,
            warp,
            DEVICE_MODELS["sm_80"].register_tile,
            fill,
        )

    def program(self, source: str):
        program = self._programs.get(source)
        if program is None:
            directory = cache_dir() / "opencl"
            directory.mkdir(parents=True, exist_ok=True)
            try:
                program = self.cl.Program(self.context, source).build(cache_dir=str(directory))
            except self.cl.RuntimeError as error:
                raise PolycError(f"the OpenCL compiler rejected polyc's kernel (a polyc bug):\n{error}") from error
            self._programs[source] = program
        return program

    def _kernel(self, program, name: str):
        kernel = self._kernels.get((id(program), name))
        if kernel is None:
            kernel = self._kernels[(id(program), name)] = self.cl.Kernel(program, name)
        return kernel

    def is_device_array(self, value) -> bool:
        from pyopencl.array import Array

        return isinstance(value, Array)

    def zeros(self, shape: tuple[int, ...], dtype) -> object:
        from pyopencl import array as cl_array

        return cl_array.zeros(self.queue, shape, dtype)

    def run(self, code: GpuKernelSource, arrays: Mapping[str, object], outputs: tuple[str, ...]) -> int:
        """Run ``code``'s launches on ``arrays`` (every tensor: C-contiguous numpy arrays, copied
        in, or pyopencl arrays, used in place); copy those of ``outputs`` that are numpy arrays
        back; return the status word."""
        cl = self.cl
        program = self.program(code.source)
        flags = cl.mem_flags
        buffers = {}
        for name, array in arrays.items():
            if self.is_device_array(array):
                buffers[name] = array.data if array.size else self._empty_buffer()
            else:
                host = array.astype(np.float32) if array.dtype == np.float16 else array
                buffers[name] = cl.Buffer(self.context, flags.READ_WRITE | flags.COPY_HOST_PTR, hostbuf=_nonempty(host))
        status = np.zeros(1, np.int32)
        status_buffer = cl.Buffer(self.context, flags.READ_WRITE | flags.COPY_HOST_PTR, hostbuf=status)
        arguments = [buffers[name] for name in code.tensor_arguments] + [status_buffer]
        for launch in code.launches:
            kernel = self._kernel(program, launch.function_name)
            kernel(self.queue, launch.global_size, launch.block, *arguments)
        for name in outputs:
            array = arrays[name]
            if isinstance(array, np.ndarray) and array.size:
                if array.dtype == np.float16:  # float on the device, every value a float16 one: exact
                    device_values = np.empty(array.shape, np.float32)
                    cl.enqueue_copy(self.queue, device_values, buffers[name])
                    self.queue.finish()
                    array[...] = device_values.astype(np.float16)
                else:
                    cl.enqueue_copy(self.queue, array, buffers[name])
        cl.enqueue_copy(self.queue, status, status_buffer)
        self.queue.finish()
        return int(status[0])

    def _empty_buffer(self):
        return self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, 4)


_PROBE_KERNEL = "__kernel void polyc_probe(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def _opencl_context(cl):
    """The context of the device ``PYOPENCL_CTX`` names; without it, the first device (GPUs
    before CPUs) whose compiler builds a probe kernel.  Probing matters where a driver cannot
    compile for the machine it runs on: PoCL 3.0's LLVM, for one, rejects CPUs newer than itself
    ('unknown target CPU'), while another installed PoCL may build for them."""
    # PoCL's automatic choice of work-group method fails an assertion in Debian's PoCL 3.1 on some
    # one-thread blocks with barriers in loops ('Multiple outgoing edges from exit block'), and
    # its loop-vectorising method miscompiled a one-thread block with a register tile (checked
    # against oclgrind); its plain work-item loops compile both correctly.  A user's own setting
    # is kept.
    os.environ.setdefault("POCL_WORK_GROUP_METHOD", "loops")
    if os.environ.get("PYOPENCL_CTX"):
        try:
            return cl.create_some_context(interactive=False)
        except (cl.Error, RuntimeError) as error:
            raise PolycError(
                f"backend='opencl': PYOPENCL_CTX={os.environ['PYOPENCL_CTX']!r} names no usable OpenCL device ({error})"
            ) from error
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    devices = [device for platform in platforms for device in platform.get_devices()]
    devices.sort(key=lambda device: not device.type & cl.device_type.GPU)
    failures = []
    for device in devices:
        context = cl.Context([device])
        try:
            cl.Program(context, _PROBE_KERNEL).build()
            return context
        except cl.Error as error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            reason = next((line for line in lines if line.startswith("error:")), lines[0] if lines else "")
            failures.append(f"{device.platform.name}: {device.name}: {reason}")
    if not devices:
        raise PolycError(
            "backend='opencl': no OpenCL device found; install a driver, or "
            "pocl-binary-distribution (or Debian's pocl-opencl-icd) to run on the CPU"
        )
    raise PolycError(
        "backend='opencl': no OpenCL device could build a kernel:\n  "
        + "\n  ".join(failures)
        + "\n(Debian's pocl-opencl-icd builds for CPUs that PoCL 3.0's LLVM does not know)"
    )


class CudaRuntime(_SharedRuntime):
    """pycuda on the first CUDA device; fails with a PolycError saying what is missing."""

    def __init__(self):
        try:
            import pycuda.driver as driver

            driver.init()
            if driver.Device.count() == 0:
                raise PolycError("backend='cuda': no CUDA device is present")
            importlib.import_module("pycuda.autoinit")  # imported for its effect: it creates the context
            from pycuda.compiler import SourceModule
        except ImportError as error:
            raise PolycError(
                f"backend='cuda' needs pycuda (pip install pycuda), the CUDA toolkit (nvcc) and an NVIDIA GPU: {error}"
            ) from error
        except PolycError:
            raise
        except Exception as error:  # pycuda.driver.Error: no driver, no device
            raise PolycError(f"backend='cuda' needs an NVIDIA GPU and its driver: {error}") from error
        self.driver, self.source_module = driver, SourceModule
        self._modules: dict[str, object] = {}

    def device_model(self) -> DeviceModel:
        """The mapping's model of the current CUDA device, from its attributes."""
        attribute = self.driver.device_attribute
        device = self.driver.Context.get_device()
        major, minor = device.compute_capability()
        return DeviceModel(
            f"sm_{major}{minor}: {device.name()}",
            device.get_attribute(attribute.MAX_THREADS_PER_BLOCK),
            device.get_attribute(attribute.MAX_SHARED_MEMORY_PER_BLOCK),
            device.get_attribute(attribute.WARP_SIZE),
            DEVICE_MODELS["sm_80"].register_tile,
            device.get_attribute(attribute.MULTIPROCESSOR_COUNT)
            * device.get_attribute(attribute.MAX_THREADS_PER_MULTIPROCESSOR),
        )

    def is_device_array(self, value) -> bool:
        from pycuda.gpuarray import GPUArray

        return isinstance(value, GPUArray)

    def zeros(self, shape: tuple[int, ...], dtype) -> object:
        from pycuda import gpuarray

        return gpuarray.zeros(shape, dtype)

    def run(self, code: GpuKernelSource, arrays: Mapping[str, object], outputs: tuple[str, ...]) -> int:
        """As :meth:`OpenCLRuntime.run`, with pycuda's GPUArrays as the device arrays."""
        module = self._modules.get(code.source)
        if module is None:
            directory = cache_dir() / "cuda"
            directory.mkdir(parents=True, exist_ok=True)
            module = self.source_module(code.source, no_extern_c=True, cache_dir=str(directory))
            self._modules[code.source] = module
        driver = self.driver
        device = {
            name: array.gpudata if self.is_device_array(array) else driver.to_device(_nonempty(array))
            for name, array in arrays.items()
        }
        status = np.zeros(1, np.int32)
        status_device = driver.to_device(status)
        arguments = [device[name] for name in code.tensor_arguments] + [status_device]
        for launch in code.launches:
            function = module.get_function(launch.function_name)
            function(*arguments, block=_three(launch.block), grid=_three(launch.grid))
        for name in outputs:
            if isinstance(arrays[name], np.ndarray) and arrays[name].size:
                driver.memcpy_dtoh(arrays[name], device[name])
        driver.memcpy_dtoh(status, status_device)
        return int(status[0])


@dataclass(frozen=True)
class CudaResources:
    """What ptxas reports for one kernel function (``nvcc -Xptxas -v``)."""

    function: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


#: GPU architectures CUDA code is compiled for in the tests and reports (Ampere, Hopper).
CUDA_ARCHITECTURES = ("sm_80", "sm_90")


def find_nvcc() -> str | None:
    """``$POLYC_NVCC``, else nvcc on the PATH, else the CUDA toolkit's default place, else the nvcc
    of the ``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin`` in site-packages)."""
    candidates = [os.environ.get("POLYC_NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    candidates += [str(path) for path in sorted(_nvidia_wheel_bins(), reverse=True)]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def _nvidia_wheel_bins() -> list[Path]:
    """nvcc of the NVIDIA wheels on ``sys.path`` (the ``nvidia`` namespace package), one per CUDA major."""
    try:
        namespace = importlib.import_module("nvidia")
    except ImportError:
        return []
    return [path for root in getattr(namespace, "__path__", []) for path in Path(root).glob("cu*/bin/nvcc")]


def cuda_resources(source: str, archs: tuple[str, ...] = CUDA_ARCHITECTURES) -> dict[str, dict[str, CudaResources]]:
    """Compile CUDA ``source`` for each architecture in ``archs`` with nvcc (no GPU needed, one
    nvcc run) and return ptxas's resource report: arch -> kernel function -> registers, shared
    memory, stack, spills."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise PolycError("nvcc was not found (set $POLYC_NVCC or put the CUDA toolkit's bin on the PATH)")
    targets = [flag for arch in archs for flag in ("-gencode", f"arch=compute_{arch[3:]},code={arch}")]
    with tempfile.TemporaryDirectory(prefix="polyc-nvcc-") as directory:
        path = Path(directory) / "kernel.cu"
        path.write_text(source)
        done = subprocess.run(
            [nvcc, "-fatbin", *targets, "-Xptxas", "-v", "-o", str(path.with_suffix(".fatbin")), str(path)],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise PolycError(
            f"nvcc rejected polyc's CUDA code for {', '.join(archs)} (a polyc bug):\n{done.stderr[-4000:]}"
        )
    return _parse_ptxas(done.stderr)


def _parse_ptxas(report: str) -> dict[str, dict[str, CudaResources]]:
    found: dict[str, dict[str, CudaResources]] = {}
    function = arch = None
    fields: dict[str, int] = {}
    for line in report.splitlines():
        start = re.search(r"Compiling entry function '(\w+)' for '(\w+)'", line)
        if start:
            function, arch, fields = start.group(1), start.group(2), {}
            continue
        if function is None:
            continue
        for key, pattern in (
            ("stack_bytes", r"(\d+) bytes stack frame"),
            ("spill_stores", r"(\d+) bytes spill stores"),
            ("spill_loads", r"(\d+) bytes spill loads"),
            ("registers", r"Used (\d+) registers"),
            ("shared_bytes", r"(\d+) bytes smem"),
        ):
            match = re.search(pattern, line)
            if match:
                fields[key] = int(match.group(1))
        if "Used" in line and "registers" in line:
            found.setdefault(arch, {})[function] = CudaResources(
                function,
                fields.get("registers", 0),
                fields.get("shared_bytes", 0),
                fields.get("stack_bytes", 0),
                fields.get("spill_stores", 0),
                fields.get("spill_loads", 0),
            )
            function = None
    return found


def _check_device_array(definition: CheckedDef, name: str, role: str, value, dtype, shape) -> None:
    where = f"{definition.name}: {role} '{name}'"
    if np.dtype(value.dtype) != dtype or tuple(value.shape) != tuple(shape):
        raise SignatureError(
            f"{where} must be a {dtype.name} device array of shape {tuple(shape)}, not "
            f"{np.dtype(value.dtype).name} {tuple(value.shape)}"
        )
    if not value.flags.c_contiguous or getattr(value, "offset", 0):
        raise SignatureError(f"{where} must be a C-contiguous device array starting at its buffer's start")
    pointer = getattr(value, "gpudata", None)  # pycuda: a view's data pointer may lie inside a buffer
    if pointer is not None and int(pointer) % 16:
        raise SignatureError(
            f"{where} must start at a 16-byte aligned address (polyc's copies load 4 floats "
            f"at a time); this view starts at {int(pointer):#x}"
        )


def _three(sizes: tuple[int, ...]) -> tuple[int, int, int]:
    return tuple(sizes) + (1,) * (3 - len(sizes))


def _nonempty(array: np.ndarray) -> np.ndarray:
    """Device buffers cannot be empty: a zero-size tensor gets a one-element stand-in."""
    return array if array.size else np.zeros(1, array.dtype)


RUNTIMES = {"opencl": OpenCLRuntime, "cuda": CudaRuntime}


def cuda_missing() -> str | None:
    """None when pycuda can launch on a GPU here, else what is missing (for skips and reports)."""
    try:
        import pycuda.driver as driver

        driver.init()
        return None if driver.Device.count() else "no CUDA device"
    except ImportError:
        return "pycuda is not installed"
    except Exception as error:  # pycuda.driver.Error: no driver
        return f"no CUDA driver ({error})"


def opencl_missing() -> str | None:
    """None when polyc's OpenCL runtime has a device that builds kernels here, else why not."""
    try:
        OpenCLRuntime.shared()
        return None
    except PolycError as error:
        return str(error)


class GpuCompiledKernel:
    """Calls a def through a GPU back end; generates (with ``generate``: sizes -> the launches'
    code, :func:`polyc.driver.gpu_code_generator`) and builds its code on first use per size
    signature (the API's backend for ``backend="opencl"`` and ``"cuda"``)."""

    def __init__(
        self, definition: CheckedDef, options: Options, generate: Callable[[Mapping[str, int]], GpuKernelSource]
    ):
        self.definition = definition
        self.options = options
        self._generate = generate
        self._code: dict[tuple, GpuKernelSource] = {}
        self._lock = threading.Lock()

    def runtime(self):
        return RUNTIMES[self.options.backend].shared()

    def code_for(self, sizes: Mapping[str, int]) -> GpuKernelSource:
        key = tuple(sizes[s] for s in self.definition.sizes)
        code = self._code.get(key)
        if code is None:
            with self._lock:
                code = self._code.get(key)
                if code is None:
                    code = self._code[key] = self._generate(sizes)
        return code

    def device_call(self, args: tuple, outputs, check_sizes) -> tuple:
        """Run on arguments of which some are the runtime's device arrays (pyopencl or pycuda):
        they are used in place, and the outputs are device arrays (given in ``outputs``, or
        new ones).  Host arrays and scalars among the inputs are copied in.  ``check_sizes``
        checks the sizes inferred (the kernel's bounds precondition)."""
        definition = self.definition
        runtime = self.runtime()
        if getattr(runtime, "float16_as_float", False) and any(t.dtype == np.float16 for t in definition.tensors):
            raise SignatureError(
                f"{definition.name} has float16 tensors, which the OpenCL back end keeps as float "
                "on the device: call it with numpy arrays (they are converted), not device arrays"
            )
        if len(args) != len(definition.inputs):
            raise SignatureError(
                f"{definition.name} takes {len(definition.inputs)} input(s) "
                f"({', '.join(definition.inputs) or 'none'}), got {len(args)}"
            )
        given = dict(zip(definition.inputs, args))
        sizes = {}
        for binding in definition.size_bindings:
            value = given[binding.tensor]
            sizes[binding.size] = int(np.asarray(value)) if binding.dim is None else int(value.shape[binding.dim])
        check_sizes(sizes)
        shapes = {tensor.name: tensor.concrete_shape(sizes) for tensor in definition.tensors}
        arrays: dict[str, object] = {}
        for name, value in given.items():
            tensor = definition.tensor(name)
            if runtime.is_device_array(value):
                _check_device_array(definition, name, "input", value, tensor.dtype, shapes[name])
                arrays[name] = value
            else:
                arrays[name] = np.ascontiguousarray(as_input_array(definition, tensor, value))
                if arrays[name].shape != shapes[name]:
                    raise SignatureError(
                        f"{definition.name}: input '{name}' has shape {arrays[name].shape}, expected {shapes[name]}"
                    )
        if outputs is not None:
            outputs = tuple(outputs)
            if len(outputs) != len(definition.outputs):
                raise SignatureError(
                    f"{definition.name} has {len(definition.outputs)} output(s), got {len(outputs)} in outputs="
                )
            for name, value in zip(definition.outputs, outputs):
                if not runtime.is_device_array(value):
                    raise SignatureError(
                        f"{definition.name}: with device inputs, output '{name}' must be a device "
                        f"array too, not {type(value).__name__}"
                    )
                _check_device_array(definition, name, "output", value, definition.tensor(name).dtype, shapes[name])
                arrays[name] = value
        for tensor in definition.tensors:
            if tensor.name not in arrays:
                arrays[tensor.name] = runtime.zeros(shapes[tensor.name], tensor.dtype)
        code = self.code_for(sizes)
        status = runtime.run(code, arrays, ()) if code.launches else 0
        if status:
            raise BoundsError(
                f"{definition.name}: a data-dependent subscript fell outside its tensor "
                f"(an index array holds a value out of range)"
            )
        return tuple(arrays[name] for name in definition.outputs)

    def __call__(self, call: BoundCall) -> tuple[np.ndarray, ...]:
        definition = self.definition
        runtime = self.runtime()  # before compiling: a missing driver is said first
        code = self.code_for(call.sizes)
        arrays = {}
        for tensor in definition.tensors:
            array = call.arrays.get(tensor.name)
            if array is None:
                array = call.new_array(tensor)
            arrays[tensor.name] = np.ascontiguousarray(array)
        status = runtime.run(code, arrays, tuple(definition.outputs)) if code.launches else 0
        if status:
            raise BoundsError(
                f"{definition.name}: a data-dependent subscript fell outside its tensor "
                f"(an index array holds a value out of range)"
            )
        results = []
        for name in definition.outputs:
            given = call.arrays[name]
            if arrays[name] is not given:
                given[...] = arrays[name]
            results.append(given)
        return tuple(results)


def query_device(dialect: str) -> DeviceModel | None:
    """The model of the device ``dialect``'s runtime runs on, or None when there is none here."""
    runtime = OpenCLRuntime if dialect == "opencl" else CudaRuntime
    try:
        return runtime.shared().device_model()
    except PolycError:
        return None
