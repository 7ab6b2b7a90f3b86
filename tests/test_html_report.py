"""The HTML report (``verify --html``): self-contained, and rendered by a real browser.

The browser tests use headless Chromium from the distribution (Debian: ``chromium-headless-shell``
or ``chromium``) and skip cleanly where none is installed. Each browser check is first shown to
fire: a page with a script error is caught, a blank page is caught.
"""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import specsample
from specsample.figures.html import render, write_html

CASE = "dirichlet/V8/k4"
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def reports():
    ok = specsample.verify("standard", budget=4096, cases=CASE, k=4, seed=3)
    bad = specsample.verify("control:resample-from-p", budget=4096, cases=CASE, k=4, seed=3)
    assert ok.passed and not bad.passed
    return ok, bad


def test_page_is_self_contained(reports):
    for r in reports:
        page = render(r, command="specsample verify")
        # nothing fetched: no external scripts, styles, images or fonts (xmlns names are not fetched)
        assert not re.search(r'(src|href)="(https?:)?//', page)
        assert "@import" not in page and not re.search(r"url\((?!#)", page)  # url(#clip) is in-page
        assert page.count("<svg") >= 1 and "<script>" in page


def test_failing_page_shows_the_case_its_tokens_and_stages(reports):
    _, bad = reports
    page = render(bad)
    assert '<header class="fail"' in page and ">FAIL<" in page
    assert f'id="case-{CASE.replace("/", "-")}"' in page  # the failing case's section, linked from the table
    assert "over- or under-represented" in page and "Each stage of the round" in page
    assert "position[0]" in page and "stage:rejection" in page
    assert page.count("<svg") == 3  # positions, stages, the whole run


def test_passing_page_has_no_failing_section(reports):
    ok, _ = reports
    page = render(ok)
    assert '<header class="pass"' in page and 'class="case"' not in page
    assert "p-values of" in page and "min detectable TV" in page


@pytest.mark.parametrize("mode", ["host sampler", "host tree sampler", "generate loop"])
def test_every_mode_gives_a_page(mode):
    """A host sampler's, a tree sampler's and a whole loop's failing runs draw their failing case."""
    if mode == "host tree sampler":
        pytest.importorskip("torch")  # a host tree sampler is called with torch tensors
        from specsample.host.tree import tree_reference
        from specsample.host.tree_verify import verify_tree_host

        report = verify_tree_host(tree_reference("topk", "no-renorm"), budget="quick", seed=0)
    elif mode == "host sampler":
        from test_host import residual_from_p_np

        report = specsample.host.verify_host(residual_from_p_np, budget=4000, k=4, cases=CASE)
    else:
        from test_e2e import next_token_of, speculative_generate

        from specsample.loops import verify as e2e

        p = np.random.default_rng(1).dirichlet(np.ones(5), size=5)
        q = np.random.default_rng(2).dirichlet(np.ones(5), size=5)
        report = e2e.verify_generate(next_token_of(p), speculative_generate(p, q, from_p=True), [3], length=3,
                                     sequences=3000, inputs="probs")
    assert not report.passed
    page = render(report)
    assert '<header class="fail"' in page and 'class="case"' in page and "over- or under-represented" in page


def test_position_laws_are_not_in_the_json(reports):
    _, bad = reports
    t = bad.cases[0].test("position[0]")
    assert t.law is not None and t.law[0].sum() == bad.cases[0].sequences
    assert "law" not in t.to_dict() and '"law"' not in bad.to_json()


def test_cli_writes_the_page(tmp_path, capsys):
    from specsample.cli import main

    path = tmp_path / "run.html"
    code = main(["verify", "--scheme", "control:resample-from-p", "--budget", "4096", "--cases", CASE, "--k", "4",
                 "--no-progress", "--html", str(path)])
    assert code == 1 and path.exists()
    assert "specsample verify --scheme control:resample-from-p" in path.read_text()
    assert f"HTML report: {path}" in capsys.readouterr().out


def test_cli_refuses_an_unwritable_page_before_work(tmp_path, capsys):
    from specsample.cli import main

    assert main(["verify", "--html", str(tmp_path / "missing" / "r.html")]) == 2
    assert main(["verify", "--html", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--html" in err and "does not exist" in err and "is a folder" in err


# --- in a real browser --------------------------------------------------------------------------

def _browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no headless Chromium (Debian: apt-get install chromium-headless-shell)")


def _run(browser, *args):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    console = [ln for ln in out.stderr.splitlines() if ":CONSOLE" in ln]
    return out.stdout, console


def _load(browser, path):
    """The DOM after scripts ran, and every console message the page logged."""
    return _run(browser, "--virtual-time-budget=3000", "--dump-dom", f"file://{path}")


def _screenshot(browser, path, png, height=1400):
    _run(browser, "--hide-scrollbars", f"--window-size=1280,{height}", f"--screenshot={png}", f"file://{path}")
    import matplotlib.image

    return matplotlib.image.imread(png)[..., :3]


def _share(img, rgb, tol=0.06):
    """The share of pixels within ``tol`` of colour ``rgb`` (0-255)."""
    return float(np.mean(np.all(np.abs(img - np.asarray(rgb) / 255.0) < tol, axis=-1)))


def test_browser_checks_can_fire(reports, tmp_path):
    browser = _browser()
    broken = tmp_path / "broken.html"  # a report page with a script error after its own script
    broken.write_text(render(reports[1]).replace("</body>", "<script>notDefined();</script></body>"))
    dom, console = _load(browser, broken)
    assert any("notDefined" in ln for ln in console)  # seen on the console
    assert re.search(r"<body[^>]*data-errors=\"[^\"]*notDefined", dom)  # and by the page's own listener
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    img = _screenshot(browser, blank, tmp_path / "blank.png", height=400)
    assert img.std() < 0.01  # a blank page is told from a drawn one


@pytest.mark.parametrize("which", ["pass", "fail"])
def test_report_renders_in_chromium(reports, tmp_path, which):
    browser = _browser()
    report = reports[which == "fail"]
    page = write_html(report, str(tmp_path / f"{which}.html"))
    dom, console = _load(browser, os.path.abspath(page))
    assert console == [], console  # no console errors (or messages of any kind)
    assert re.search(r'<body[^>]*data-ready="1"', dom), "the page's script did not finish"
    assert not re.search(r"<body[^>]*data-errors", dom), "a script error"
    img = _screenshot(browser, page, tmp_path / f"{which}.png")
    assert img.std() > 0.1, "blank screenshot"
    top = img[:60]  # the verdict banner: green for a pass, red for a fail, across the top
    colour = (0xB4, 0x23, 0x18) if which == "fail" else (0x1A, 0x7F, 0x37)
    assert _share(top, colour) > 0.5
    if which == "fail":  # the failing case's section (red left border) is on the first screen
        assert CASE in dom and _share(img[60:], (0xB4, 0x23, 0x18)) > 0.001
