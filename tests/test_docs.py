"""No page can drift from the code: every code block of the README and of docs/ is run here.

Conventions a page follows (docs/contributing.md says the same):

- ```python blocks run, in page order, in one namespace per page, in a scratch folder that holds
  a link to ``examples/``. A block right after ``<!-- file: NAME -->`` is written to ``NAME`` there
  instead (a scheme or sampler file that a later command names).
- ```bash blocks hold commands only, one a line (``\\`` continues a line, ``#`` starts a comment).
  Every ``specsample`` command is parsed by the command line's own parser here, so a renamed flag
  or choice fails at once; the quick ones (``list``, ``decode``, ``--help``, ``--budget quick`` on
  named ``--cases``) also run, in process, and must exit 0, or the code a trailing ``# exit N`` states. The others run under
  ``pytest -m long`` with ``SPECSAMPLE_LONG=full`` (they are the minutes-long batteries).
- ```text blocks are output or usage synopses and are not run.
- A block that needs torch or transformers is skipped when they are not installed.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import shlex
import textwrap

import pytest
from conftest import LONG_BOUNDED

from specsample import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"(?:<!-- file: (?P<file>\S+) -->\n)?[ ]*```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
QUICK_SUBCOMMANDS = {"list", "decode"}
OPTIONAL = {"torch": ("torch", "--arrays torch", "--rng torch", "examples/torch_sampler"),
            "transformers": ("transformers", "hf_assisted", "hf_processors")}


def blocks(page: pathlib.Path) -> list:
    """``(language, body, file)`` of each fenced block; bodies inside a list item are dedented."""
    return [(m.group("lang"), textwrap.dedent(m.group("body")), m.group("file"))
            for m in FENCE.finditer(page.read_text())]


def commands(body: str) -> list:
    """The command lines of a bash block: continuations joined, comments kept apart."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        code, _, comment = line.partition("#")
        if code.strip():
            want = re.search(r"exit (\d+)", comment)
            out.append((shlex.split(code), int(want.group(1)) if want else 0))
    return out


def _needs(text: str) -> list:
    return [mod for mod, marks in OPTIONAL.items() if any(m in text for m in marks)]


def _skip_without_optional(text: str) -> None:
    for mod in _needs(text):
        pytest.importorskip(mod)


def _quick(argv: list) -> bool:
    """Seconds, not minutes: a cheap subcommand, or a quick budget on named cases."""
    return (argv[1] in QUICK_SUBCOMMANDS or "--help" in argv
            or ("--budget" in argv and argv[argv.index("--budget") + 1] == "quick" and "--cases" in argv))


@contextlib.contextmanager
def _scratch(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


def _run_cli(argv: list) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv[1:] + (["--no-progress"] if argv[1] == "verify" else []))
        except SystemExit as e:  # argparse
            code = e.code
    return code, out.getvalue() + err.getvalue()


def _play(page: pathlib.Path, tmp_path, run_slow: bool) -> int:
    """Run a page's blocks in order; returns how many were run."""
    ran = 0
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    with _scratch(tmp_path):
        for lang, body, file in blocks(page):
            if lang == "python":
                _skip_without_optional(body)
                if file:
                    pathlib.Path(file).write_text(body)
                else:
                    exec(compile(body, f"{page.name}", "exec"), namespace)
                ran += 1
            elif lang == "bash":
                for argv, want in commands(body):
                    if argv[0] != "specsample":
                        continue  # pip, pytest, mkdocs: the README's two commands are CI's own
                    _skip_without_optional(" ".join(argv))
                    if run_slow or _quick(argv):
                        code, text = _run_cli(argv)
                        assert code == want, f"{page.name}: {' '.join(argv)} exited {code}\n{text[-3000:]}"
                    else:
                        cli._parser().parse_args(argv[1:])  # flags and choices still exist
                    ran += 1
    return ran


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run(page, tmp_path):
    _play(page, tmp_path, run_slow=False)


@pytest.mark.long
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_commands_run_in_full(page, tmp_path):
    if LONG_BOUNDED:
        pytest.skip("the docs' minutes-long commands run in the full long run (SPECSAMPLE_LONG=full)")
    _play(page, tmp_path, run_slow=True)


def test_every_block_says_what_it_is():
    """An untagged fence would escape the runner: each is python, bash or text."""
    for page in PAGES:
        for lang, body, _ in blocks(page):
            assert lang in ("python", "bash", "text", "ini", "toml", "yaml"), f"{page.name}: ```{lang} {body[:60]!r}"


def test_cli_reference_is_the_parser(monkeypatch):
    """docs/cli.md shows each subcommand's --help as the parser prints it today."""
    monkeypatch.setenv("COLUMNS", "100")  # as docs/gen_cli.py
    page = (ROOT / "docs" / "cli.md").read_text()
    for name in cli._parser()._subparsers._group_actions[0].choices:
        code, text = _run_cli(["specsample", name, "--help"])
        assert code == 0
        assert f"```text\n{text.strip()}\n```" in page, f"docs/cli.md: `specsample {name} --help` changed; " \
                                                         f"regenerate with python docs/gen_cli.py"
