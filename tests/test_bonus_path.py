"""The bonus path under forced draws: a round whose drafts are all accepted emits its bonus, so the
interception pass forces the bonus sampler's draws where they can show.

Serving engines draw tokens by an exponential race, argmax(p / E) with E ~ Exp(1). An E of exactly 0
at a token with p = 0 gives 0 / 0 = NaN there, and argmax returns the NaN's index: a token of
probability 0. Before bonus rounds, every forced round drafted the forbidden token and rejected, and
this bonus never ran under a forced value.
"""

import pytest

torch = pytest.importorskip("torch")

from specsample.host.boundary import host_intercept_check  # noqa: E402


def _race(w, generator, guard: bool):
    e = torch.empty_like(w).exponential_(1.0, generator=generator)
    score = w / e
    if guard:  # a token of weight 0 never wins, whatever E is
        score = torch.where(w > 0, score, torch.full_like(score, -float("inf")))
    return torch.argmax(score, dim=-1)


def _sampler(guard: bool):
    """The standard rule; the residual's race guarded, the bonus's race guarded or not."""

    def sample(drafts, q, p, generator):
        b, k = drafts.shape
        qx = q.gather(-1, drafts[..., None])[..., 0]
        px = p[:, :k].gather(-1, drafts[..., None])[..., 0]
        u = torch.rand(b, k, generator=generator, dtype=q.dtype)
        ok = u * qx < px
        j = torch.where(ok.all(1), torch.full((b,), k), torch.argmin(ok.int(), 1))
        rows = torch.arange(b)
        jq = j.clamp(max=k - 1)
        resid = torch.clamp(p[rows, j] - torch.where((j < k)[:, None], q[rows, jq], torch.zeros_like(p[:, 0])), min=0)
        resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p[rows, j])
        out = torch.cat([drafts, torch.zeros(b, 1, dtype=drafts.dtype)], 1)
        rejected = _race(resid, generator, guard=True)
        bonus = _race(p[:, k], generator, guard)
        out[rows, j] = torch.where(j < k, rejected, bonus)
        return out, j + 1

    return sample


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "unguarded"])
def test_an_unguarded_exponential_race_bonus_fails_the_interception_pass(guard):
    from specsample.host import HostSampler

    s = HostSampler(_sampler(guard), name=f"race-{'guarded' if guard else 'unguarded'}", rng="torch",
                    arrays="torch")
    r = host_intercept_check(s, k=3, seed=0)
    if guard:
        assert r.violations == 0 and r.reached > 0, r.detail
    else:
        assert r.violations > 0, r.detail
        assert "a round of safe drafts (its bonus)" in r.detail and "probability 0" in r.detail
