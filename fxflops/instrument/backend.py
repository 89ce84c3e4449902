"""The ``fxflops`` torch.compile backend: analyse, let the inner backend compile, wrap.

``torch.compile(m, backend="fxflops")`` (registered through the ``torch_dynamo_backends``
entry point, ``instrument.entry_points``) or ``backend=fxflops.backend(inner=...)``:
each graph Dynamo hands over goes through ``instrument.wrap.wrap_graph`` with the inner
backend's compile (Inductor by default, ``mode=``/``options=`` passed on as Inductor's
config); a graph that needs gradients is instrumented one level down, per AOTAutograd
graph (``instrument.autograd``).
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxflops import torch_compat
from fxflops.instrument import distributed_hooks as distributed
from fxflops.instrument import provenance
from fxflops.instrument.kernel_maps import KernelSetting, kernels_setting
from fxflops.instrument.wrap import uninstrumented, wrap_graph
from fxflops.util import host_raised, warn_once

log = logging.getLogger(__name__)

_FIRST_USE: list[bool] = []


def first_use() -> None:
    """What fxflops installs when it is first used (never at import): in a
    torch.distributed job, FSDP2's collectives counted (from the backend's lookup or
    construction, before the first step's), and a DDP-wrapped model that compiled nothing
    said at exit (``instrument.distributed_hooks``). A failure is said once and goes no
    further: the backend still compiles (its hooks are extras)."""
    if _FIRST_USE:
        return
    _FIRST_USE.append(True)
    try:
        distributed.install_fsdp_counting()
        atexit.register(distributed.check_ddp_compiled)
    except Exception as e:
        if host_raised(e):
            raise
        warn_once("first-use", "fxflops: FSDP2's collectives not counted (%s: %s)",
                  type(e).__name__, e)


# inner backends whose AOTAutograd graphs (forward and backward) fxflops instruments; the
# eager inner is left as Dynamo's eager runs it (no AOTAutograd inserted: double backward
# and every other eager-mode autograd behaviour keep working)
PHASED_INNERS = ("inductor", "aot_eager")


def needs_grad(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd will make a backward for this Dynamo graph."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs) or \
        any(p.requires_grad for p in gm.parameters())


def inductor_patches(mode: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """Inductor's config for ``torch.compile``'s ``mode`` and ``options``, as
    ``backend="inductor"`` makes it (``torch._TorchCompileInductorWrapper``)."""
    if not mode and not options:
        return {}
    wrapper = torch_compat.get("inductor_options")(mode, options, None)
    return dict(wrapper.config)


def resolve_inner(inner: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(inner):
        return inner
    if inner == "fxflops":
        raise ValueError("fxflops cannot wrap itself")
    return torch_compat.get("lookup_backend")(inner)


def _eager_forward(compiled: Any) -> Any:
    """A lazily recompiled GraphModule's ``forward`` (what the eager backends return) goes
    through ``nn.Module.__call__`` on every call until recompiled: recompile it now, and
    call the generated forward, as Dynamo's own eager path ends up doing."""
    lazy = torch_compat.get("lazy_graph_module")
    owner = getattr(compiled, "__self__", None)
    if isinstance(owner, lazy) and getattr(compiled, "__func__", None) is lazy._lazy_forward:
        owner.real_recompile()
        return owner.forward
    return compiled


class FxflopsBackend:
    """A configured backend: ``fxflops.backend(inner="inductor")``."""

    def __init__(self, inner: str | Callable[..., Any] = "inductor", name: str | None = None,
                 kernels: int | None = None, workload: str | None = None,
                 **options: Any) -> None:
        first_use()
        self.inner = inner
        self.name = name
        self.kernels = kernels
        self.workload = workload
        self.options = options

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 **kwargs: Any) -> Callable[..., Any]:
        kwargs = {**self.options, **kwargs}
        try:
            compile_instrumented = self._prepare(gm, example_inputs, dict(kwargs))
        except Exception as e:
            if host_raised(e):
                raise
            # fxflops' own set-up failed before the inner compile: the graph compiles on the
            # inner backend as it would without fxflops, its calls counted, said once
            compiled = self._compile_plain(gm, example_inputs, kwargs)
            return uninstrumented(compiled, self.name or "graph{index}", e)
        # (not in the try: what the compile raises is the inner backend's, Dynamo's restarts
        # among it, which must reach Dynamo; fxflops' own failures are caught inside)
        return compile_instrumented()

    def _compile_plain(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                       kwargs: dict[str, Any]) -> Any:
        """The inner backend's compile, fxflops not involved (Inductor with ``mode=``'s
        config where it can be read; else Inductor's defaults)."""
        kwargs = dict(kwargs)
        mode, options = kwargs.pop("mode", None), kwargs.pop("options", None)
        if self.inner != "inductor":
            kwargs.update({k: v for k, v in (("mode", mode), ("options", options)) if v})
            return _eager_forward(resolve_inner(self.inner)(gm, example_inputs, **kwargs))
        try:
            patches = inductor_patches(mode, options)
        except Exception:
            patches = {}
        return torch_compat.get("compile_fx")(gm, example_inputs,
                                              config_patches=patches or None, **kwargs)

    def _prepare(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 kwargs: dict[str, Any]) -> Callable[[], Callable[..., Any]]:
        """fxflops' own decisions (a graph that needs gradients, Inductor's config, kernel
        maps, the graph's meta); returns the compile that follows them, through
        ``wrap_graph`` (or a training graph's ``compile_phases``)."""
        distributed.install_fsdp_counting()  # FSDP2 loaded since: its collectives counted
        # torch.compile's mode= and options= (passed to a custom backend as keywords):
        # Inductor takes them as its config, as it does for backend="inductor"
        mode, options = kwargs.pop("mode", None), kwargs.pop("options", None)
        patches = inductor_patches(mode, options) if self.inner == "inductor" else {}
        if self.inner != "inductor":  # another backend takes them as it would unwrapped
            kwargs.update({k: v for k, v in (("mode", mode), ("options", options)) if v})
        # kernels: Inductor's (another inner generates none to map)
        kernels = kernels_setting(self.kernels) if self.inner == "inductor" else None
        if kernels is not None:
            patches.update(provenance.inductor_patches())
        meta = self._meta(gm)
        if needs_grad(gm, example_inputs):
            if self.inner in PHASED_INNERS:
                return lambda: self._compile_phases(gm, example_inputs, kwargs, patches,
                                                    kernels, meta)
            warn_once(f"backward:{_inner_name(self.inner)}", "fxflops: inner backend %s: "
                      "only forward graphs are counted and timed (backward graphs are for "
                      "inductor and aot_eager)", _inner_name(self.inner))

        def compile_inner() -> Any:
            if self.inner == "inductor":
                return torch_compat.get("compile_fx")(gm, example_inputs,
                                                      config_patches=patches or None, **kwargs)
            return _eager_forward(resolve_inner(self.inner)(gm, example_inputs, **kwargs))

        # (the example inputs: the parameters Dynamo lifts to inputs tell whose graph it is,
        # for the layer safety net)
        return lambda: wrap_graph(compile_inner, self.name or "graph{index}", meta, gm=gm,
                                  example_inputs=example_inputs, dynamo=True, kernels=kernels)

    def _compile_phases(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                        kwargs: dict[str, Any], patches: dict[str, Any],
                        kernels: KernelSetting | None, meta: dict[str, Any]
                        ) -> Callable[..., Any]:
        """A graph that needs gradients: its forward and backward graphs, one level down."""
        from fxflops.instrument.autograd import compile_phases

        return compile_phases(gm, example_inputs, str(self.inner), self.name or "graph{index}",
                              meta, kwargs, patches, kernels)

    def _meta(self, gm: torch.fx.GraphModule) -> dict[str, Any]:
        """The inner backend, and the Python frame Dynamo compiled: graphs of one frame
        are its recompiles (another size, a failed guard), which a step runs one of. A
        graph that DDP's optimizer split at its gradient buckets is compiled piece by
        piece, and every piece runs: each has its ``piece`` number."""
        meta: dict[str, Any] = {"inner": _inner_name(self.inner)}
        if self.workload:
            meta["workload"] = self.workload
        compile_id = torch_compat.get("current_compile_id")()
        if compile_id is not None and getattr(compile_id, "frame_id", None) is not None:
            meta["frame"] = compile_id.frame_id
        reason = getattr(gm, "compile_subgraph_reason", None)
        if "DDPOptimizer" in str(getattr(reason, "reason", "")):
            key = str(compile_id)
            meta["piece"] = _DDP_PIECES[key] = _DDP_PIECES.get(key, -1) + 1
            meta["split"] = "ddp"
        return meta


# pieces of each Dynamo compile that DDP's optimizer split, numbered in compile order
_DDP_PIECES: dict[str, int] = {}


def _inner_name(inner: Any) -> str:
    return inner if isinstance(inner, str) else getattr(inner, "__name__", type(inner).__name__)


def backend(inner: str | Callable[..., Any] = "inductor", name: str | None = None,
            kernels: int | None = None, workload: str | None = None,
            **options: Any) -> FxflopsBackend:
    """A ``torch.compile`` backend that instruments ``inner`` ("inductor", "eager", a callable).

    ``name`` may use ``{index}``; ``kernels=N``: map each node to its Inductor kernel and
    profile N calls per size (0: the map only; default ``FXFLOPS_KERNELS``, off);
    ``workload``: what the graphs run for, when not the model's own forward (``"draft"``:
    a speculative decoder's drafter, kept out of the target's whole forward); extra
    ``options`` are passed to the inner backend.
    """
    return FxflopsBackend(inner, name, kernels, workload=workload, **options)


def fxflops_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                    **kwargs: Any) -> Callable[..., Any]:
    """The registered ``backend="fxflops"``: Inductor inside."""
    return FxflopsBackend("inductor")(gm, example_inputs, **kwargs)
