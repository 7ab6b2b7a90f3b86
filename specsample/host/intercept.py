"""Intercepted randomness: record what a torch or numpy sampler draws, then set each drawn value
to its extremes, whatever the function, dtype, draw order or batch layout.

A generator-state search (:mod:`specsample.host.boundary`) assumes the sampler's first draws are
float32 uniforms from the generator it was given; a sampler drawing float64 uniforms, exponentials
for an exponential race, or multinomial drafts first is not reached by it. Inside
:class:`Interceptor` the library's random entry points are wrapped for the duration of one call:

- torch: ``torch.rand``, ``torch.rand_like``, ``Tensor.uniform_``, ``Tensor.exponential_``,
  ``torch.multinomial`` / ``Tensor.multinomial`` (generator-passing forms included);
- numpy: the ``Generator`` specsample passes to the sampler, and any a loop makes with
  ``np.random.default_rng``, is wrapped (:func:`wrap_numpy`): ``random``, ``uniform``,
  ``exponential``, ``standard_exponential``, ``choice``;
- MLX (when ``mlx.core`` is imported): ``mlx.core.random.uniform`` and ``gumbel`` (forced),
  ``categorical`` and ``bernoulli`` (recorded: their noise is drawn inside MLX's C++).

In *record* mode each draw is logged (function, dtype, shape). In *force* mode draw ``i``'s
flat element ``j`` is replaced by a value after the real draw (so every other value, and the
generator's state, are those of the recorded call): uniforms by 0 and the largest value below 1
*in their dtype*, exponentials by 0 and a huge value. Multinomial draws are recorded, not forced
(their extremes are not values). A pass counts how many (draw, element, value) settings it
applied; none is "not reached".
"""

from __future__ import annotations

import contextlib
import sys
from typing import NamedTuple, Optional

import numpy as np

UNIFORM, EXPONENTIAL, GUMBEL, DISCRETE = "uniform", "exponential", "gumbel", "discrete"
HUGE = 1e30  # an exponential "at infinity" that stays finite in float32
KEPT = 64  # values of each draw kept in record mode: what a check of the values it set reads


class Draw(NamedTuple):
    """One intercepted draw: what function, kind, dtype and shape, and the line of the user's code it came from."""

    function: str
    kind: str
    dtype: str
    shape: tuple
    where: str = ""  # file:line of the innermost caller outside torch, numpy, MLX and specsample

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def site(self) -> str:
        """Where from, as the reports count settings: ``torch.rand float32 (1, 4) at sampler.py:12``. Two
        draws of one function and dtype at different lines (a draft's Gumbel noise and the acceptance
        uniforms) are two sites, each given its share of the settings (:func:`settings`)."""
        shape = "x".join(str(s) for s in self.shape) or "scalar"
        return f"{self.function} {self.dtype.replace('torch.', '')} [{shape}]" + (f" at {self.where}" if self.where else "")


def extremes(kind: str, dtype: str) -> tuple:
    """The extreme values of a draw of ``kind`` in ``dtype`` (empty for discrete draws)."""
    if kind == UNIFORM:
        if dtype in ("bfloat16", "torch.bfloat16"):
            below_one = 1.0 - 2.0**-8
        else:
            name = dtype.replace("torch.", "")
            t = np.dtype({"half": "float16", "float": "float32", "double": "float64"}.get(name, name))
            below_one = float(np.nextafter(t.type(1.0), t.type(0.0)))
        return (0.0, below_one)
    if kind == EXPONENTIAL:
        return (0.0, HUGE)
    if kind == GUMBEL:  # -log(-log(u)) at u's extremes (MLX draws u in [0, below one]): -inf, and about 16.6 in float32
        below_one = extremes(UNIFORM, dtype)[1]
        return (-np.inf, float(-np.log(-np.log(below_one))))
    return ()


class Interceptor(contextlib.AbstractContextManager):
    """Record (``force=None``) or force one element: ``force = (draw index, flat element, value)``.

    Use one per sampler call; ``draws`` lists what was drawn, ``applied`` whether the forced
    setting met its draw (the call drew as many values again).
    """

    def __init__(self, force: Optional[tuple] = None):
        self.force = force
        self.draws: list = []
        self.applied = False
        self._undo: list = []
        self.replays: list = []  # record mode: each torch or numpy draw again, for unseen_draws
        self.values: list = []  # record mode: the first KEPT values of each draw (None: not kept), as drawn

    # -- bookkeeping shared by torch and numpy -------------------------------------------
    def _keep(self, values) -> None:
        """Record mode: the first :data:`KEPT` values of the draw just logged, as float64 (None if unreadable)."""
        if self.force is None:
            if values is None:
                self.values.append(None)
                return
            try:
                self.values.append(np.asarray(values, np.float64).reshape(-1)[:KEPT].copy())
            except (TypeError, ValueError, RuntimeError):
                self.values.append(None)

    def _seen(self, function: str, kind: str, dtype: str, shape: tuple) -> Optional[tuple]:
        """Log a draw; the (element, value) to set in it, when this is the forced draw."""
        i = len(self.draws)
        self.draws.append(Draw(function, kind, dtype, tuple(int(s) for s in shape), _caller()))
        if self.force is not None and self.force[0] == i and kind != DISCRETE:
            j, value = self.force[1], self.force[2]
            if j < self.draws[-1].size:
                self.applied = True
                return j, value
        return None

    # -- torch ------------------------------------------------------------------------------
    def _patch_torch(self, torch):
        me = self

        def set_flat(t, hit):
            if hit is not None:
                with torch.no_grad():
                    t.view(-1)[hit[0]] = hit[1]
            return t

        def fresh(name, kind, orig):
            def wrapper(*args, **kwargs):
                out = orig(*args, **kwargs)
                if me.force is None:
                    me.replays.append(lambda: orig(*args, **kwargs))
                out = set_flat(out, me._seen(name, kind, str(out.dtype), tuple(out.shape)))
                me._keep(_first(out))
                return out
            return wrapper

        def inplace(name, kind, orig):
            def wrapper(self_t, *args, **kwargs):
                if me.force is None:
                    blank = torch.empty_like(self_t)  # every element is drawn: the old values do not matter
                    me.replays.append(lambda: orig(blank, *args, **kwargs))
                out = orig(self_t, *args, **kwargs)
                out = set_flat(out, me._seen(name, kind, str(out.dtype), tuple(out.shape)))
                me._keep(_first(out))
                return out
            return wrapper

        def discrete(name, orig):
            def wrapper(*args, **kwargs):
                if me.force is None:
                    first = args[0].clone() if args and hasattr(args[0], "clone") else None
                    rest = args[1:]
                    me.replays.append(lambda: orig(first, *rest, **kwargs) if first is not None else orig(*args, **kwargs))
                out = orig(*args, **kwargs)
                me._seen(name, DISCRETE, str(out.dtype), tuple(out.shape))
                me._keep(_first(out))
                return out
            return wrapper

        patches = [
            (torch, "rand", fresh("torch.rand", UNIFORM, torch.rand)),
            (torch, "rand_like", fresh("torch.rand_like", UNIFORM, torch.rand_like)),
            (torch.Tensor, "uniform_", inplace("Tensor.uniform_", UNIFORM, torch.Tensor.uniform_)),
            (torch.Tensor, "exponential_", inplace("Tensor.exponential_", EXPONENTIAL, torch.Tensor.exponential_)),
            (torch, "multinomial", discrete("torch.multinomial", torch.multinomial)),
            (torch.Tensor, "multinomial", discrete("Tensor.multinomial", torch.Tensor.multinomial)),
        ]
        for owner, name, new in patches:
            self._undo.append((owner, name, getattr(owner, name)))
            setattr(owner, name, new)

    # -- MLX -----------------------------------------------------------------------------------
    def _patch_mlx(self, mx):
        me = self

        def forced(out, hit, low=0.0, high=1.0):
            """``out`` with flat element j at ``low + (high - low) u`` (u itself where not finite)."""
            if hit is None:
                return out
            try:
                arr = np.array(out)  # MLX arrays are immutable: set the element on a copy
            except (ValueError, RuntimeError):  # traced by mx.compile: a value set now would stay in its graph
                me.applied = False
                return out
            j, u = hit
            lo, hi = (float(np.broadcast_to(np.array(x, np.float64), arr.shape).reshape(-1)[j]) for x in (low, high))
            arr.reshape(-1)[j] = u if not np.isfinite(u) else lo + (hi - lo) * u
            return mx.array(arr, dtype=out.dtype)

        def uniform(orig):
            def wrapper(low=0.0, high=1.0, shape=(), *args, **kwargs):
                out = orig(low, high, shape, *args, **kwargs)
                hit = me._seen("mlx.random.uniform", UNIFORM, str(out.dtype).replace("mlx.core.", ""), out.shape)
                me._keep_mlx(out)
                return forced(out, hit, low, high)
            return wrapper

        def gumbel(orig):
            def wrapper(*args, **kwargs):
                out = orig(*args, **kwargs)
                hit = me._seen("mlx.random.gumbel", GUMBEL, str(out.dtype).replace("mlx.core.", ""), out.shape)
                me._keep_mlx(out)
                return forced(out, hit)  # the value itself (low 0, high 1)
            return wrapper

        def discrete(name, orig):
            def wrapper(*args, **kwargs):
                out = orig(*args, **kwargs)
                me._seen(name, DISCRETE, str(out.dtype).replace("mlx.core.", ""), out.shape)
                me._keep_mlx(out)
                return out
            return wrapper

        r = mx.random
        for name, new in (("uniform", uniform(r.uniform)), ("gumbel", gumbel(r.gumbel)),
                          ("categorical", discrete("mlx.random.categorical", r.categorical)),
                          ("bernoulli", discrete("mlx.random.bernoulli", r.bernoulli))):
            self._undo.append((r, name, getattr(r, name)))
            setattr(r, name, new)

    def _keep_mlx(self, out) -> None:
        try:  # a traced array (inside mx.compile) has no values yet
            self._keep(np.array(out))
        except (ValueError, RuntimeError, TypeError):
            if self.force is None:
                self.values.append(None)

    def __enter__(self):
        torch = sys.modules.get("torch")
        if torch is not None:
            self._patch_torch(torch)
        mx = sys.modules.get("mlx.core")
        if mx is not None:
            self._patch_mlx(mx)
        # a loop that makes its own numpy generator gets one whose draws come through here
        box = {"interceptor": self}
        real = np.random.default_rng
        self._undo.append((np.random, "default_rng", real))
        np.random.default_rng = lambda *a, **kw: wrap_numpy(real(*a, **kw), box)
        return self

    def __exit__(self, *exc):
        for owner, name, old in reversed(self._undo):
            setattr(owner, name, old)
        self._undo.clear()
        return False

    # -- numpy ------------------------------------------------------------------------------
    def numpy_draw(self, name: str, kind: str, out, low: float = 0.0):
        """Log a numpy draw and apply the forced value (numpy draws come through :class:`_NumpyProxy`)."""
        arr = np.asarray(out)
        hit = self._seen(name, kind, str(arr.dtype), arr.shape)
        self._keep(arr)
        if hit is None:
            return out
        if arr.ndim == 0:
            return type(out)(hit[1]) if np.isscalar(out) else np.asarray(hit[1], arr.dtype)
        arr = arr.copy()
        arr.reshape(-1)[hit[0]] = hit[1]
        return arr


def _first(t):
    """The first :data:`KEPT` values of a torch tensor, as numpy (on the host), or None."""
    try:
        return t.detach().reshape(-1)[:KEPT].double().cpu().numpy()
    except (AttributeError, RuntimeError, TypeError):
        return None


def unseen_draws(run, torch_generators: list, numpy_generators: list = ()) -> tuple:
    """``(result, interceptor, unseen)``: ``run(interceptor)`` makes one call under a recording
    :class:`Interceptor`; ``unseen`` names the kinds of generator (``"torch"``, ``"numpy"``) it drew
    from more than its intercepted draws account for: draws inside TorchScript or other compiled
    code, which the Python-level wrappers never see, or numpy ``Generator`` methods specsample does
    not wrap (``normal``, ``permutation``, ...). The intercepted draws are replayed from the states
    before the call; a generator whose state then differs from its state after the call advanced
    unseen. The states after the call are restored."""
    gens = [(g, "torch", g.get_state, g.set_state) for g in torch_generators]
    gens += [(g, "numpy", lambda g=g: g.bit_generator.state, lambda s, g=g: setattr(g.bit_generator, "state", s))
             for g in numpy_generators]
    before = [get() for _, _, get, _ in gens]
    icpt = Interceptor()
    result = run(icpt)
    after = [get() for _, _, get, _ in gens]
    for (_, _, _, put), st in zip(gens, before):
        put(st)
    for replay in icpt.replays:
        replay()
    replayed = [get() for _, _, get, _ in gens]
    for (_, _, _, put), st in zip(gens, after):
        put(st)
    unseen = []
    for (_, kind, _, _), a, b in zip(gens, after, replayed):
        same = _torch_equal(a, b) if kind == "torch" else _same_state(a, b)
        if not same and kind not in unseen:
            unseen.append(kind)
    return result, icpt, unseen


def _torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def _same_state(a, b) -> bool:
    """Two numpy bit-generator states (nested dicts of ints and arrays) are equal."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    return bool(np.array_equal(a, b))


class _NumpyProxy:
    """A numpy ``Generator`` whose draws go through an :class:`Interceptor`; everything else delegates."""

    def __init__(self, gen: np.random.Generator, box: dict):
        self._gen, self._box = gen, box

    def _icpt(self) -> Optional[Interceptor]:
        return self._box.get("interceptor")

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def _replayed(self, draw) -> Optional[Interceptor]:
        """The interceptor, after noting how to draw this call again (record mode: unseen_draws)."""
        i = self._icpt()
        if i is not None and i.force is None:
            i.replays.append(draw)
        return i

    def random(self, size=None, dtype=np.float64, out=None):
        r = self._gen.random(size, dtype=dtype, out=out)
        i = self._replayed(lambda: self._gen.random(size, dtype=dtype))
        return r if i is None else i.numpy_draw("Generator.random", UNIFORM, r)

    def uniform(self, low=0.0, high=1.0, size=None):
        # drawn as random() scaled, so the extremes are low and the largest value below high
        i = self._replayed(lambda: self._gen.random(size))
        u = self._gen.random(size)
        if i is not None:
            u = i.numpy_draw("Generator.uniform", UNIFORM, u)
        return low + (high - low) * np.asarray(u) if np.ndim(u) else low + (high - low) * float(u)

    def exponential(self, scale=1.0, size=None):
        r = self._gen.exponential(scale, size)
        i = self._replayed(lambda: self._gen.exponential(scale, size))
        return r if i is None else i.numpy_draw("Generator.exponential", EXPONENTIAL, r)

    def standard_exponential(self, size=None, dtype=np.float64, method="zig", out=None):
        r = self._gen.standard_exponential(size, dtype=dtype, method=method, out=out)
        i = self._replayed(lambda: self._gen.standard_exponential(size, dtype=dtype, method=method))
        return r if i is None else i.numpy_draw("Generator.standard_exponential", EXPONENTIAL, r)

    def choice(self, *args, **kwargs):
        return self._discrete("choice", args, kwargs)

    def integers(self, *args, **kwargs):  # seeds a key (an MLX or JAX sampler's), or draws ids: recorded
        return self._discrete("integers", args, kwargs)

    def _discrete(self, name, args, kwargs):
        r = getattr(self._gen, name)(*args, **kwargs)
        i = self._replayed(lambda: getattr(self._gen, name)(*args, **kwargs))
        if i is not None:
            i._seen(f"Generator.{name}", DISCRETE, str(np.asarray(r).dtype), np.shape(r))
        return r


def wrap_numpy(gen: np.random.Generator, box: dict) -> _NumpyProxy:
    """``gen`` with its draws intercepted by ``box["interceptor"]`` (when set)."""
    return _NumpyProxy(gen, box)


def settings(draws: list, max_elements: int = 64) -> list:
    """Every (draw, element, value) to force, at most ``max_elements`` elements, shared among draw sites.

    The elements are taken from each site in turn (its draws' elements in draw order), so that a
    site of many values (a draft's Gumbel noise over the vocabulary) does not use the share of one of
    few (the acceptance uniforms); the settings come back in draw order."""
    by_site: dict = {}
    for i, d in enumerate(draws):
        if extremes(d.kind, d.dtype):
            by_site.setdefault(d.site, []).append((i, d.size))
    queues = [iter([(i, j) for i, size in items for j in range(size)]) for items in by_site.values()]
    picked: list = []
    while queues and len(picked) < max_elements:
        alive = []
        for q in queues:
            if len(picked) >= max_elements:
                break
            nxt = next(q, None)
            if nxt is not None:
                picked.append(nxt)
                alive.append(q)
        queues = alive
    return [(i, j, v) for i, j in sorted(picked) for v in extremes(draws[i].kind, draws[i].dtype)]


def _caller() -> str:
    """``file:line`` of the innermost frame outside the libraries and specsample: where the user drew."""
    import os

    f = sys._getframe(2)
    skip = (os.sep + "torch" + os.sep, os.sep + "numpy" + os.sep, os.sep + "mlx" + os.sep, os.sep + "specsample" + os.sep,
            os.sep + "contextlib.py", os.sep + "functools.py")
    while f is not None:
        name = f.f_code.co_filename
        if not any(s in name for s in skip) and not name.startswith("<frozen"):
            return f"{os.path.basename(name)}:{f.f_lineno}"
        f = f.f_back
    return ""


def describe(draws: list) -> str:
    """``torch.rand float64 (1, 4); torch.multinomial int64 (1, 1)`` (repeated draws merged)."""
    seen: dict = {}
    for d in draws:
        key = d.site
        seen[key] = seen.get(key, 0) + 1
    return "; ".join(k + (f" x{n}" if n > 1 else "") for k, n in seen.items()) or "no draw seen"
