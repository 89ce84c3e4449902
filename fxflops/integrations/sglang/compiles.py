"""SGLang's decode compiles under fxflops' backend, one row per compiled batch size.

SGLang (0.5.23) compiles the model's whole forward once per captured batch size, inside a
context manager its graph runners enter per size: ``patch_model(model, enable_compile,
num_tokens, tp_group)``, which calls ``torch.compile(torch.no_grad()(model.forward),
mode=..., dynamic=...)`` with no backend (``compilation/torch_compile_decoration.py`` for
the CUDA-graph runner, mode ``$SGLANG_TORCH_COMPILE_MODE`` or
``"max-autotune-no-cudagraphs"``; ``model_executor/cpu_graph_runner.py`` for the CPU one,
``dynamic=False``). Neither a server argument nor a variable names a backend, so the plugin
wraps each ``patch_model`` (``wrap_patch_model``): while SGLang's own ``patch_model``
enters, its ``torch.compile`` call is given fxflops' backend (``backend(inner="inductor")``)
and nothing else changes: SGLang's ``mode=`` and ``dynamic=`` are passed on as SGLang chose
them (torch hands ``mode=`` to a custom backend; fxflops' turns it into Inductor's config as
``backend="inductor"`` does), and the Inductor and Dynamo settings SGLang sets globally
around it (``set_torch_compile_config``: ``freezing``, ``coordinate_descent_tuning``, ...)
are read by the same Inductor compile. Each graph is named by the runner and the size SGLang
compiles it for, ``sglang-decode:size{n}`` or ``sglang-cpu:size{n}``, ``n`` the tokens the
captured batch runs (SGLang's batch size in plain decode; batch size times tokens per
request when it verifies drafts).

Only the ``torch.compile`` call made while SGLang's ``patch_model`` enters is touched: the
wrapper around ``torch.compile`` (``install_compile_gate``) reads a context variable that
only the entering sets, and passes every other call through as it was made.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

from fxflops.util import warn_once

# the compile site being entered (SGLang's ``patch_model``): the name of its graphs
_SITE: contextvars.ContextVar[str | None] = contextvars.ContextVar("fxflops_sglang_site",
                                                                   default=None)

# SGLang's two compile sites: where each ``patch_model`` lives, and its graphs' name prefix
SITES = {
    "sglang.srt.compilation.torch_compile_decoration.patch_model": "sglang-decode",
    "sglang.srt.model_executor.cpu_graph_runner.patch_model": "sglang-cpu",
}


def site_name(runner: str, num_tokens: int) -> str:
    return f"{runner}:size{int(num_tokens)}"


class SiteBackend:
    """fxflops' backend for one compile site: Inductor inside, its graphs named by the site
    (a graph break's further graphs get ``:part{k}``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.graphs = 0

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from fxflops.instrument import backend

        name = self.name if not self.graphs else f"{self.name}:part{self.graphs}"
        self.graphs += 1
        try:
            instrumented = backend.backend(inner="inductor", name=name)
        except Exception as e:  # fxflops broke: SGLang's own compile, as it asked for it
            warn_once("sglang-backend", "fxflops: SGLang's compile of %s not instrumented "
                      "(%s: %s); Inductor compiles it as SGLang asked", name,
                      type(e).__name__, e)
            return _inductor(gm, example_inputs, **kwargs)
        # (what fails inside the analysis is caught there: the graph runs uninstrumented,
        # its calls counted; what Inductor raises is SGLang's compile's, and propagates)
        return instrumented(gm, example_inputs, **kwargs)


def _inductor(gm: Any, example_inputs: Any, mode: str | None = None,
              options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Inductor as ``torch.compile(..., mode=, options=)`` runs it without fxflops."""
    from fxflops import torch_compat

    return torch_compat.get("inductor_options")(mode, options, None)(gm, example_inputs)


def _gated(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile`` as it was, but inside an SGLang compile site, where a call that names
    no backend (or Inductor, which is what naming none means) gets the site's."""

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        site = _SITE.get()
        if site is not None and kwargs.get("backend", "inductor") == "inductor":
            try:
                kwargs = {**kwargs, "backend": SiteBackend(site)}
            except Exception as e:  # fxflops broke: SGLang's compile goes on as it was
                warn_once("sglang-site", "fxflops: SGLang's compile not instrumented "
                          "(%s: %s)", type(e).__name__, e)
        return original(*args, **kwargs)

    return compile


def install_compile_gate() -> Any:
    """The wrapper around ``torch.compile`` that the sites open (idempotent); its ``Patch``."""
    import torch

    from fxflops.patching import patch_method

    return patch_method(torch, "compile", "sglang-site", _gated)


@contextlib.contextmanager
def _entered(original: Callable[..., Any], name: str, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Iterator[Any]:
    """SGLang's ``patch_model`` entered with the site open (its ``torch.compile`` call is
    fxflops'), then left as SGLang leaves it, an exception of the body included."""
    with contextlib.ExitStack() as stack:
        token = _SITE.set(name)
        try:
            forward = stack.enter_context(original(*args, **kwargs))
        finally:
            _SITE.reset(token)
        yield forward


def wrap_patch_model(runner: str) -> Callable[..., Any]:
    """An AROUND hook (SGLang's ``HookRegistry``) for one ``patch_model``: the same
    arguments, the same context manager, its compile under fxflops' backend. A size SGLang
    does not compile (``enable_compile`` false) is passed through untouched."""

    def hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            named = _arguments(original, args, kwargs)
            enable, num_tokens = bool(named["enable_compile"]), int(named["num_tokens"])
        except Exception as e:  # SGLang changed the signature: its compile as it was
            warn_once("sglang-patch-model", "fxflops: SGLang's patch_model not "
                      "instrumented (%s: %s)", type(e).__name__, e)
            return original(*args, **kwargs)
        if not enable:
            return original(*args, **kwargs)
        return _entered(original, site_name(runner, num_tokens), args, kwargs)

    return hook


def _arguments(fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> dict[str, Any]:
    import inspect

    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
