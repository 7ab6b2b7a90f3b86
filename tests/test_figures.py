"""Every figure renders at a tiny budget to a valid, non-empty PNG."""

import pytest

from specsample import figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("figs")
    return figures.render_all(str(out), budget=0.02, seed=0)


def test_every_figure_renders(rendered):
    assert [p.rsplit("/", 1)[1] for p in rendered] == [f"{n}.png" for n in figures.FIGURES]
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
