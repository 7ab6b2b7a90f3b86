"""Make ``figures/report.png``, the README's screenshot of a failing HTML report.

Runs ``specsample verify --html`` on a negative control and photographs the page's first screen
with headless Chromium (Debian: ``apt-get install chromium-headless-shell``)::

    python docs/gen_report_png.py
"""

import os
import shutil
import subprocess
import sys
import tempfile

COMMAND = ["verify", "--scheme", "control:resample-from-p", "--budget", "quick", "--k", "4",
           "--cases", "dirichlet/V8/k4,zeros-in-p/V8/k4,ngram-2/V4/k4", "--no-progress"]
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def main(out: str = "figures/report.png") -> None:
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        sys.exit("no headless Chromium: apt-get install chromium-headless-shell")
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "report.html")
        subprocess.run([sys.executable, "-m", "specsample", *COMMAND, "--html", "report.html"], cwd=tmp, check=False)
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1200,1450", f"--screenshot={os.path.abspath(out)}", f"file://{page}"],
                       check=True, capture_output=True)
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:])
