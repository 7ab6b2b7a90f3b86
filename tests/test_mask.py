"""specsample.loops.mask: a target that forbids tokens, so that a loop's `<=` is reached."""

import re

import numpy as np
import pytest

from specsample.loops import verify as e2e
from specsample.loops.boundary import generate_boundary_check
from specsample.loops.mask import mask_logits, mask_module


def test_numpy_logits_and_probs():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]))
    top2 = mask_logits(lambda: logits, top_k=2)()
    assert np.isneginf(top2).sum(1).tolist() == [2, 2] and np.isneginf(top2[0, :2]).all()
    probs = mask_logits(lambda: np.exp(logits), remove=[3], inputs="probs")()
    np.testing.assert_allclose(probs[0], [1 / 6, 2 / 6, 3 / 6, 0])
    with pytest.raises(ValueError, match="give top_k"):
        mask_logits(lambda: logits)
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        mask_logits(lambda: logits, top_k=0)


def test_torch_module_hook_and_removal():
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(3, 6)
    x = torch.randn(2, 3)
    with mask_module(lin, top_k=2, remove=[0]):
        out = lin(x)
        assert (torch.isinf(out).sum(-1) >= 4).all() and torch.isinf(out[:, 0]).all()
    assert torch.isfinite(lin(x)).all()  # the hook is gone


def test_tuple_named_and_mapping_outputs_are_masked_and_others_refused_in_one_line():
    torch = pytest.importorskip("torch")
    import collections

    Out = collections.namedtuple("Out", "logits hidden")

    class Model(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.lin, self.kind = torch.nn.Linear(3, 6), kind

        def forward(self, x):
            y = self.lin(x)
            return {"tuple": (y, x), "list": [y, x], "named": Out(y, x), "dict": {"logits": y, "h": x},
                    "str": "logits"}[self.kind]

    x = torch.randn(2, 3)
    for kind, logits in (("tuple", lambda o: o[0]), ("list", lambda o: o[0]), ("named", lambda o: o.logits),
                         ("dict", lambda o: o["logits"])):
        m = Model(kind)
        with mask_module(m, top_k=2):
            out = m(x)
            assert (torch.isinf(logits(out)).sum(-1) == 4).all(), kind
            assert torch.equal((out[1] if kind in ("tuple", "list", "named") else out["h"]), x)  # the rest kept
    m = Model("str")
    with mask_module(m, top_k=2), pytest.raises(TypeError, match="mask_module: the module returned a str; .*mask_logits"):
        m(x)


def test_hugging_face_model_logits_are_masked():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[1, 2, 3]])
    with mask_module(model, top_k=3):
        logits = model(ids).logits
        assert torch.isinf(logits).sum(-1).eq(5).all()
        out = model.generate(ids, max_new_tokens=4, do_sample=True, pad_token_id=0)
    assert out.shape == (1, 7)
    assert torch.isfinite(model(ids).logits).all()


def _le_loop(target, k: int = 3, le: bool = True, q=None, draft=None):
    """A torch loop over rows ``target(ctx)`` that accepts with u <= p / q (``le=False``: u < p / q); it drafts
    by ``draft(q_row, generator) -> token`` (default ``torch.multinomial``) and draws its acceptance uniforms
    with ``torch.rand`` float64 (``torch.empty(k).uniform_`` float32 when ``draft`` is given)."""
    torch = pytest.importorskip("torch")
    q = torch.tensor(np.random.default_rng(1).dirichlet(np.ones(6), size=6)) if q is None else q

    def uniforms(g):
        return torch.rand(k, generator=g, dtype=torch.float64) if draft is None else \
            torch.empty(k).uniform_(generator=g).double()  # the acceptance uniforms

    def drafted(row, g):
        return int(torch.multinomial(row, 1, generator=g)) if draft is None else draft(row, g)

    def generate(prompt, n, seed):
        g = torch.Generator().manual_seed(int(seed))
        out, last = [], int(prompt[-1])
        while len(out) < n:
            drafts, ctx = [], last
            for _ in range(k):
                ctx = drafted(q[ctx], g)
                drafts.append(ctx)
            u = uniforms(g)
            ctx, emitted = last, []
            for i, x in enumerate(drafts):
                p = torch.as_tensor(target(ctx))
                if (u[i] <= p[x] / q[ctx, x]) if le else (u[i] < p[x] / q[ctx, x]):
                    emitted.append(x)
                    ctx = x
                    continue
                w = torch.clamp(p - q[ctx], min=0)
                emitted.append(int(torch.multinomial(w if w.sum() > 0 else p, 1, generator=g)))
                break
            else:
                emitted.append(int(torch.multinomial(torch.as_tensor(target(ctx)), 1, generator=g)))
            out += emitted
            last = out[-1]
        return np.array(out[:n])

    return generate


def test_a_le_loop_is_reached_only_under_a_masked_target():
    p = np.random.default_rng(2).dirichlet(np.ones(6), size=6)  # positive everywhere: forbids nothing

    def full(tokens):  # a bigram: the row after each token ([N, T] -> [N, T, V]; one token -> [V])
        return p[np.asarray(tokens)]

    masked = mask_logits(full, top_k=3, inputs="probs")
    unreached = generate_boundary_check(e2e._TeacherForced(full, "probs", np.array([2]), None), _le_loop(full),
                                        [2], 6, seed=1)
    assert unreached.violations == 0  # nothing to expose: a zero of p is what `<=` needs
    caught = generate_boundary_check(e2e._TeacherForced(masked, "probs", np.array([2]), None), _le_loop(masked),
                                     [2], 6, seed=1)
    assert caught.violations > 0 and "probability 0" in caught.detail


def test_a_target_that_forbids_nothing_reads_not_reached():
    """Whole-loop verification over a target positive everywhere: the statistics pass, and the table and
    headline say that the boundary pass reached nothing (and what to do), rather than a plain pass."""
    p = np.random.default_rng(2).dirichlet(np.ones(6), size=6)

    def full(tokens):
        return p[np.asarray(tokens)]

    report = e2e.verify_generate(full, _le_loop(full), [2], length=3, sequences=2000)
    case = report.cases[0]
    assert report.passed and case.verdict == "pass°" and case.boundary_unreached == ["boundary-intercepted"]
    assert "specsample.loops.mask" in case.test("boundary-intercepted").detail
    assert "NOT REACHED" in report.headline() and "boundary pass reached nothing" in report.table()


def test_a_loop_of_few_draws_is_caught_at_the_default_seed():
    """k = 1, two tokens: 2-4 draws a sequence, a forbidden draft now and then. One sequence's settings
    caught it at 11 of 20 seeds; drawing sequences until 64 settings are tried catches it at each."""
    p = np.random.default_rng(2).dirichlet(np.ones(6), size=6)
    masked = mask_logits(lambda t: p[np.asarray(t)], top_k=4, inputs="probs")
    model = e2e._TeacherForced(masked, "probs", np.array([2]), None)
    for seed in range(3):
        bad = generate_boundary_check(model, _le_loop(masked, k=1), [2], 2, seed=seed)
        assert bad.violations > 0 and int(re.search(r"(\d+) settings tried", bad.detail).group(1)) >= 64, bad.detail
    ok = generate_boundary_check(model, _le_loop(masked, k=1, le=False), [2], 2, seed=0)
    assert ok.violations == 0 and int(re.search(r"(\d+) settings tried over", ok.detail).group(1)) >= 64, ok.detail
    # reached counts the settings that could fire (changed the sequence): not the forbidden drafts' uniforms
    assert 0 < ok.reached and f"{ok.reached} of which changed the sequence" in ok.detail, ok.detail


def _gumbel_loop(target, q, k: int = 3, le: bool = True):
    """A torch loop that drafts by Gumbel-max, its noise and its acceptance uniforms both ``Tensor.uniform_``
    float32 (one function and dtype, two lines of code), and accepts with u <= p / q (``le=False``: <)."""
    torch = pytest.importorskip("torch")

    def gumbel_max(row, g):
        noise = torch.empty(row.shape[0]).uniform_(generator=g)  # Gumbel noise over the vocabulary
        return int(torch.argmax(torch.log(row) - torch.log(-torch.log(noise.double()))))

    return _le_loop(target, k, le, q=q, draft=gumbel_max)


def test_draw_sites_are_lines_of_code_and_each_gets_its_share():
    # the draft's Gumbel noise (128 values a draft, 384 before the first acceptance uniform) and the acceptance
    # uniforms (3 a round) are one function and dtype; as one site, in draw order, the noise used every setting
    # (256 a sequence) and the `<=` went unforced at every seed. As two sites, each has its share
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(128), size=128)
    q = torch.tensor(rng.dirichlet(np.ones(128), size=128))
    masked = mask_logits(lambda t: p[np.asarray(t)], top_k=16, inputs="probs")
    model = e2e._TeacherForced(masked, "probs", np.array([2]), None)
    bad = generate_boundary_check(model, _gumbel_loop(masked, q), [2], 4, seed=0)
    assert bad.violations > 0 and "probability 0" in bad.detail, bad.detail
    sites = re.findall(r"Tensor.uniform_ float32 \[(\d+)\] at test_mask.py:\d+", bad.detail)
    assert set(sites) == {"128", "3"}, bad.detail  # two sites, counted apart
    ok = generate_boundary_check(model, _gumbel_loop(masked, q, le=False), [2], 4, seed=0)
    assert ok.violations == 0 and ok.reached > 0, ok.detail


def test_a_token_both_models_forbid_reaches_nothing():
    # a glue that bans id 0 in both models: the target forbids a token, but no draft can draft it, so no
    # forced uniform can expose `<=`; with the draft's rows the pass says so instead of reading reached
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.ones(6), size=6)
    p[:, 0] = 0.0
    p /= p.sum(1, keepdims=True)
    qn = rng.dirichlet(np.ones(6), size=6)
    qn[:, 0] = 0.0
    qn /= qn.sum(1, keepdims=True)

    def target(t):
        return p[np.asarray(t)]

    def draft_rows(t):
        return qn[np.asarray(t)]

    model = e2e._TeacherForced(target, "probs", np.array([2]), None)
    draft = e2e._TeacherForced(draft_rows, "probs", np.array([2]), None)
    loop = _le_loop(target, q=torch.tensor(qn))
    r = generate_boundary_check(model, loop, [2], 4, seed=0, draft=draft)
    assert r.reached == 0 and "forbids no token the draft can draft" in r.detail and "the draft forbids too" in r.detail
    without = generate_boundary_check(model, loop, [2], 4, seed=0)  # target rows only: counted, and said so
    assert without.reached > 0 and "tokens both models forbid count too" in without.detail
