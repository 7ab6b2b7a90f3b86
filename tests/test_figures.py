"""Every figure renders at a tiny budget to a valid, non-empty PNG."""

import pytest

from specsample.figures import gallery as figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# the default run renders four figures of a second each (the gallery's machinery: a battery's counts, the
# exact laws, the decoder); `pytest -m long` every figure, the slowest of which compile the engine for every
# registered scheme (schemes, 7 s) or for cached and tree schemes (transformer_pair 11 s, trees 8 s)
QUICK = ["calibration", "kl_vs_samples", "greedy_vs_map", "decode_scaling"]


@pytest.mark.parametrize("names", [QUICK, pytest.param(list(figures.FIGURES), marks=[pytest.mark.long,
                                                                                     pytest.mark.heavy])],
                         ids=["quick-ones", "all"])
def test_every_figure_renders(names, tmp_path):
    rendered = figures.render_all(str(tmp_path), budget=0.02, seed=0, only=names)
    assert [p.rsplit("/", 1)[1] for p in rendered] == [f"{n}.png" for n in names]
    for path in rendered:
        with open(path, "rb") as f:
            data = f.read()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, path


def test_bad_figure_budget():
    with pytest.raises(ValueError, match="unknown budget"):
        figures.render_all("/tmp/unused", budget="huge")


def test_resample_from_p_law_is_a_distribution():
    import numpy as np

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    law = figures.resample_from_p_first_token(p, q)
    assert law.sum() == pytest.approx(1.0) and not np.allclose(law, p)
