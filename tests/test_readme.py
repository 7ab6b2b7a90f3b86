"""The README's scheme example is real: extract it, verify it, and check the README's commands."""

import pathlib
import re

import specsample

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text.split("## Writing a scheme", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_scheme_passes(tmp_path):
    path = tmp_path / "my_scheme.py"
    path.write_text(_example())
    report = specsample.verify(f"{path}:my_scheme", budget="quick", k=4,
                               cases="dirichlet/V8/k4,zeros-in-p/V8/k4,ngram-2/V4/k4")
    assert report.passed, report.table()
    assert report.scheme == "my-scheme"


def test_readme_opens_with_the_two_commands():
    lines = README.read_text().split("\n")[:6]
    main_cmd = next(ln for ln in lines if ln.rstrip().split("#")[0].strip().endswith("specsample verify"))
    test_cmd = next(ln for ln in lines if ln.split("#")[0].strip().endswith("&& pytest"))
    assert 'pip install -e ".[dev]"' in main_cmd
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert test_cmd.split("#")[0].strip() in [ln.strip() for ln in ci]
