"""The documented scheme examples are real (docs/writing-a-scheme.md), and the README opens with the
two commands CI runs. tests/test_docs.py runs every other block."""

import pathlib
import re

import specsample

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
WRITING = README.parent / "docs" / "writing-a-scheme.md"


def _example(which: int = 0) -> str:
    return re.findall(r"```python\n(.*?)```", WRITING.read_text(), re.S)[which]


def test_readme_example_scheme_passes(tmp_path):
    path = tmp_path / "my_scheme.py"
    path.write_text(_example())
    report = specsample.verify(f"{path}:my_scheme", budget="quick", k=4,
                               cases="dirichlet/V8/k4,zeros-in-p/V8/k4,ngram-2/V4/k4")
    assert report.passed, report.table()
    assert report.scheme == "my-scheme"


def test_readme_cached_scheme_passes_and_its_rollback_matters(tmp_path):
    good, bad = tmp_path / "my_cached.py", tmp_path / "no_rollback.py"
    code = _example(1)
    good.write_text(code)
    assert "tcache.rollback(keep)" in code
    bad.write_text(code.replace("tcache.rollback(keep)", "tcache"))
    for path, ok in ((good, True), (bad, False)):
        report = specsample.verify(f"{path}:my_cached", budget="quick", k=4, cases="transformer-far/V8/k4")
        assert report.passed == ok, report.table()


def test_readme_opens_with_the_two_commands():
    lines = README.read_text().split("\n")[:6]
    main_cmd = next(ln for ln in lines if ln.rstrip().split("#")[0].strip().endswith("specsample verify"))
    test_cmd = next(ln for ln in lines if ln.split("#")[0].strip().endswith("&& pytest"))
    assert 'pip install -e ".[dev]"' in main_cmd
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert test_cmd.split("#")[0].strip() in [ln.strip() for ln in ci]
