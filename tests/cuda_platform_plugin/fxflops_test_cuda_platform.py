"""A vLLM platform plugin for the tests: vLLM's CUDA platform on a machine without a GPU.

vLLM's GPU package (0.33) picks its platform by asking NVML for a device; without one it
picks none, and ``VllmConfig()`` fails ("Failed to infer device type"). With
``TEST_VLLM_CUDA_PLATFORM=1`` this plugin (entry point group ``vllm.platform_plugins``)
answers with a subclass of vLLM's own ``NonNvmlCudaPlatform`` whose device queries describe
one H200: vLLM then resolves its configuration as a GPU user's (mode 3, CUDA graphs
``FULL_AND_PIECEWISE``, the V2 model runner where Triton imports), and its compilation and
runner code run on CPU tensors, their CUDA calls going to the tests' simulator
(``tests/cuda_sim.py``) where a test installs it. Off (the variable unset), it answers None
and vLLM picks its platform as usual.

``import vllm.platforms.cuda`` loads vLLM's CUDA extensions, which link the CUDA driver: a
stand-in ``libcuda.so.1`` that reports no device (``libcuda_stub.c``, built by
``stub_libcuda``) must be on ``LD_LIBRARY_PATH`` or loaded first.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIABLE = "TEST_VLLM_CUDA_PLATFORM"
NAME = "NVIDIA H200 (fxflops test platform, no device)"
TOTAL_MEMORY = 141 * 2**30
SMS = 132
CAPABILITY = (9, 0)


def platform() -> str | None:
    """The entry point: this module's platform class where the tests ask for it."""
    if os.environ.get(VARIABLE) != "1":
        return None
    load_libcuda()
    triton_sees_a_gpu()
    return f"{__name__}.TestCudaPlatform"


def triton_sees_a_gpu() -> None:
    """Triton's CUDA driver reports itself active, as on a GPU host: vLLM imports the real
    Triton (its kernels are defined, never launched here) instead of its placeholder, whose
    stand-in ``triton.Config`` breaks imports such as the Mamba kernels' (0.33), and picks
    the V2 model runner as on a GPU. (vLLM asks while it resolves its platform, after this
    plugin has answered.)"""
    try:
        from triton.backends import backends
    except Exception:  # no Triton: vLLM uses its placeholder, as on a host without one
        return
    nvidia = backends.get("nvidia")
    if nvidia is not None and nvidia.driver is not None:
        nvidia.driver.is_active = staticmethod(lambda: True)


def stub_libcuda(folder: str | os.PathLike[str] | None = None) -> Path:
    """The stand-in ``libcuda.so.1``, built with ``cc`` into ``folder`` (once)."""
    folder = Path(folder or os.environ.get("TEST_LIBCUDA_DIR")
                  or Path(os.environ.get("TMPDIR", "/tmp")) / "fxflops-test-libcuda")
    lib = folder / "libcuda.so.1"
    if not lib.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"libcuda.so.1.{os.getpid()}"
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                        str(partial), str(HERE / "libcuda_stub.c")], check=True, timeout=120)
        partial.replace(lib)  # atomic: another process may be building it too
    return lib


def load_libcuda() -> None:
    """Load the stand-in into this process (a library loaded under the soname
    ``libcuda.so.1`` satisfies every later dependency on it), unless a driver is here."""
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        ctypes.CDLL(str(stub_libcuda()), mode=ctypes.RTLD_GLOBAL)


def _platform_class() -> type:
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class TestCudaPlatform(NonNvmlCudaPlatform):
        """vLLM's CUDA platform, its device queries answered as one H200 would."""

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*CAPABILITY)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return NAME

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return TOTAL_MEMORY

        @classmethod
        def device_count(cls) -> int:
            return 1

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return SMS

    TestCudaPlatform.__module__ = __name__
    TestCudaPlatform.__qualname__ = "TestCudaPlatform"
    return TestCudaPlatform


def __getattr__(name: str) -> type:
    # the class is made where vLLM resolves it (importing vLLM's CUDA platform needs the
    # stand-in driver loaded first)
    if name == "TestCudaPlatform":
        cls = _platform_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
