"""An MLX speculative sampler in specsample's host-sampler convention, right and wrong.

    specsample verify --sampler examples/mlx_sampler.py:standard --budget quick
    specsample verify --sampler examples/mlx_sampler.py:le_acceptance --budget quick   # exit 1

Each takes drafts [B, k], the draft rows [B, k, V], the target rows [B, k + 1, V] (numpy) and
specsample's numpy generator, from which it seeds an MLX key; it draws with ``mlx.core.random``
(uniforms for acceptance, Gumbel noise for the token at the stop) and returns
(tokens [B, k + 1], n_emitted [B]). ``le_acceptance`` accepts when u q(x) <= p(x): a u of exactly 0,
which MLX's uniform can return, then accepts a draft the target forbids. Needs ``pip install mlx``
(Linux: ``pip install "mlx[cpu]"``).
"""

import mlx.core as mx
import numpy as np


def _round(drafts, q, p, rng, *, strict: bool):
    b, k = drafts.shape
    key_u, key_g = mx.random.split(mx.random.key(int(rng.integers(2**63))))
    qx = np.take_along_axis(q, drafts[..., None], -1)[..., 0]
    px = np.take_along_axis(p[:, :k], drafts[..., None], -1)[..., 0]
    u = np.array(mx.random.uniform(shape=(b, k), key=key_u))
    ok = u * qx < px if strict else u * qx <= px
    j = np.where(ok.all(1), k, np.argmin(ok, 1))
    rows = np.arange(b)
    q_j = np.where((j < k)[:, None], q[rows, np.minimum(j, k - 1)], 0.0)
    w = np.maximum(p[rows, j] - q_j, 0.0)  # the residual after a rejection; p for the bonus
    w = np.where(w.sum(1, keepdims=True) > 0, w, p[rows, j])
    # Gumbel-max over the tokens of positive weight; MLX's Gumbel is -inf when its uniform is 0,
    # so the noise is kept finite (else a row whose only token drew -inf would pick token 0)
    g = mx.maximum(mx.random.gumbel(shape=w.shape, key=key_g), -1e30)
    scores = mx.where(mx.array(w) > 0, mx.log(mx.array(w)) + g, -mx.inf)
    out = np.concatenate([drafts, np.zeros((b, 1), drafts.dtype)], 1)
    out[rows, j] = np.array(mx.argmax(scores, axis=-1))
    return out, j + 1


def standard(drafts, q, p, rng):
    return _round(drafts, q, p, rng, strict=True)


def le_acceptance(drafts, q, p, rng):
    return _round(drafts, q, p, rng, strict=False)
