"""Compiled code run as plain Python while the interception pass watches a sampler's draws.

The interception pass (:mod:`specsample.host.intercept`) wraps the libraries' Python entry points
(``torch.rand``, ``Tensor.uniform_``, ``mx.random.uniform``, ...). A draw made inside compiled code
never calls them: a TorchScript function draws in C++, an ``mx.compile``'d function in MLX's graph, a
``torch.compile``'d one (inductor) in a generated kernel. :func:`compilation_off` turns each off for the
duration of the pass, so those draws are seen and forced like any other:

- TorchScript: a ``torch.jit.ScriptFunction`` found in the sampler's module globals (or a closure's)
  is replaced, for the pass, by the Python function it was compiled from (``_torchdynamo_inline``,
  kept by torch for ``torch.compile`` to inline it);
- ``torch.compile``: ``torch.compiler.set_stance("force_eager")`` runs every compiled function eagerly;
- MLX: ``mx.disable_compile()``, then ``mx.enable_compile()``.

What stays compiled (a C extension, a custom kernel, a scripted module held elsewhere) is still caught
by the generator's state advancing beyond the draws intercepted: the pass reads "not reached", never
reached.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from typing import Iterator


def _functions(fn, depth: int = 3) -> list:
    """``fn`` and the Python functions it wraps or closes over (``__wrapped__``, partials, closure cells)."""
    out, todo, seen = [], [(fn, 0)], set()
    while todo:
        f, d = todo.pop()
        if id(f) in seen or d > depth:
            continue
        seen.add(id(f))
        if isinstance(f, functools.partial):
            todo.append((f.func, d + 1))
            continue
        inner = getattr(f, "__wrapped__", None)
        if inner is not None:
            todo.append((inner, d + 1))
        call = getattr(type(f), "__call__", None) if not isinstance(f, types.FunctionType) else None
        if isinstance(call, types.FunctionType) and d < depth:  # a callable object: its __call__ and attributes
            todo.append((call, d + 1))
            todo += [(v, d + 1) for v in vars(f).values() if callable(v)] if hasattr(f, "__dict__") else []
        if isinstance(f, types.MethodType):
            todo.append((f.__func__, d + 1))
        if isinstance(f, types.FunctionType):
            out.append(f)
            for cell in f.__closure__ or ():
                try:
                    todo.append((cell.cell_contents, d + 1))
                except ValueError:  # an empty cell
                    pass
    return out


@contextlib.contextmanager
def compilation_off(fn) -> Iterator[list]:
    """Within the block, ``fn``'s compiled code runs as Python; yields the names of what was turned off."""
    turned: list = []
    undo: list = []
    stack = contextlib.ExitStack()
    torch = sys.modules.get("torch")
    if torch is not None:
        scripted = getattr(getattr(torch, "jit", None), "ScriptFunction", None)
        spaces = {id(f.__globals__): f.__globals__ for f in _functions(fn)}
        for g in spaces.values():
            for name, obj in list(g.items()):
                original = getattr(obj, "_torchdynamo_inline", None) if scripted and isinstance(obj, scripted) else None
                if original is not None:
                    g[name] = original
                    undo.append((g, name, obj))
                    turned.append(f"TorchScript {name}")
                elif getattr(obj, "_torchdynamo_orig_callable", None) is not None:
                    turned.append(f"torch.compile {name}")
        stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
        if stance is not None:
            stack.enter_context(stance("force_eager"))
    mx = sys.modules.get("mlx.core")
    if mx is not None and hasattr(mx, "disable_compile"):
        mx.disable_compile()
        stack.callback(mx.enable_compile)
        turned.append("mx.compile")
    try:
        with stack:
            yield turned
    finally:
        for g, name, obj in undo:
            g[name] = obj
