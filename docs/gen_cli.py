"""Write docs/cli.md from the command line's own parser (tests/test_docs.py checks it is current).

Run: python docs/gen_cli.py
"""

import contextlib
import io
import os
import pathlib

os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal; the page is fixed at 100 columns

from specsample import cli  # noqa: E402

INTRO = """# Command line reference

`specsample` has one entry point with subcommands. Exit codes: 0 no deviation found, 1 a deviation
(or a hard check) failed, 2 bad usage or input (one line on stderr saying what to change), 130
interrupted; `measure --tolerance`: 0 within it, 1 beyond it, 3 undecided at this budget. Each section below is the subcommand's `--help`, generated from the parser
(`python docs/gen_cli.py`; a test fails when the page and the parser disagree).
"""


def help_text(name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli.main([name, "--help"])
    return out.getvalue().strip()


def page() -> str:
    names = cli._parser()._subparsers._group_actions[0].choices
    parts = [INTRO]
    for name in names:
        parts.append(f"## specsample {name}\n\n```text\n{help_text(name)}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    path = pathlib.Path(__file__).with_name("cli.md")
    path.write_text(page())
    print(f"wrote {path}")
