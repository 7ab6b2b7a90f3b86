"""Every figure renders at a tiny budget to a valid, non-empty PNG."""

import pytest

from specsample.figures import gallery as figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# the schemes figure compiles the engine for every registered scheme (about 10 s), the transformer
# pair's for four cached schemes (about 15 s): the default run renders the others, `pytest -m long` every figure
QUICK = [n for n in figures.FIGURES if n not in ("schemes", "transformer_pair")]


@pytest.mark.parametrize("names", [QUICK, pytest.param(list(figures.FIGURES), marks=pytest.mark.long)],
                         ids=["all-but-schemes", "all"])
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
