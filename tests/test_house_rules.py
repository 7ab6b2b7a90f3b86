"""House rules the project keeps: it speaks of itself (measurements are dated, never placed by a period
of work), its version has a changelog entry, and times live in one table."""

import pathlib
import re

import specsample

ROOT = pathlib.Path(__file__).resolve().parent.parent

# a numbered or deictic period of work (the word, a number after it; "this" or "that" before it; its
# possessive): a reader cannot place it; a date, a machine and a commit they can. pytest's test session is
# no diary.
DIARY = re.compile(r"\bsessions?\s+\d|\b(this|that|same|each|every|earlier|previous|next|last|one|whole)\s+session\b"
                   r"|\bsession's\b|\bsession by session\b", re.IGNORECASE)


def _texts():
    for folder in ("docs", "specsample", "tests", "stats", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".md", ".py", ".sh", ".yml", ".toml", ".txt"} and ".venv" not in path.parts:
                yield path
    yield from (ROOT / name for name in ("README.md", "CHANGELOG.md", "mkdocs.yml", "pyproject.toml", "conftest.py"))


def test_no_diary_words():
    hits = []
    for path in _texts():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DIARY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "date it (and name the machine and commit) instead:\n" + "\n".join(hits)


def test_the_rule_itself_catches_what_it_names():
    w = "sess" + "ion"  # spelled apart, so this file states no period of work itself
    for bad in (f"{w} 12", f"{w.title()}s 28-36 ran", f"this {w}'s flags", f"at the {w}'s end",
                f"Speed work, {w} by {w}"):
        assert DIARY.search(bad), bad
    for fine in ("a test session", "pytest's session fixture", "2026-12-05, commit 9eb5acc"):
        assert not DIARY.search(fine), fine


def test_the_version_has_a_changelog_entry():
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    assert specsample.__version__ == version
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d\d-\d\d$", (ROOT / "CHANGELOG.md").read_text(),
                     re.MULTILINE), f"CHANGELOG.md has no entry for {version}"


# a measured time: "15-18 s", "3 min 20 s", "4.5 s": the engine page's table is their one home
TIME = re.compile(r"\b\d+(\.\d+)?(-\d+(\.\d+)?)? ?(s|min)\b(?! x)")


def test_times_live_in_one_table():
    for page in ("README.md", "docs/getting-started.md", "docs/index.md"):
        text = (ROOT / page).read_text()
        found = [m.group(0) for m in TIME.finditer(text)]
        assert not found, f"{page} repeats measured times {found}: link to docs/engine.md#the-times-now instead"
        assert "engine.md#the-times-now" in text, f"{page} does not link to the table of times"


def test_the_site_builds_offline_and_fails_on_a_broken_anchor():
    # the theme's web fonts would be fetched from Google by every reader; an anchor that no heading makes is
    # only an INFO line unless validation raises it to a warning, which the strict build turns into a failure
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^  font: false\b", config, re.MULTILINE)
    assert re.search(r"^strict: true$", config, re.MULTILINE)
    assert re.search(r"^validation:.*(\n  .*)*\n  anchors: warn$", config, re.MULTILINE)
