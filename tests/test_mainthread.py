"""User callables run on the main thread (libraries such as MLX keep their state there).

The command line works in a thread of its own for a fast Ctrl-C; a sampler, generate or
next_token that insists on the main thread must still work, with the right exit code.
"""

import inspect
import threading

import numpy as np
import pytest

from specsample import cli
from specsample.host import mainthread
from test_host import standard_np

GLUE = '''
import threading
import numpy as np

CALLS = {"off_main": 0}


def _here():
    if threading.current_thread() is not threading.main_thread():
        CALLS["off_main"] += 1
        raise RuntimeError("this library keeps its random state on the main thread")


def sampler(drafts, q, p, rng):
    _here()
    return standard_np(drafts, q, p, rng)


TABLE = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]])


def next_token(tokens):
    _here()
    return TABLE[tokens]


def generate(prompt, n, seed):
    _here()
    rng = np.random.default_rng(seed)
    out, last = [], int(prompt[-1])
    for _ in range(n):
        last = int(rng.choice(3, p=TABLE[last]))
        out.append(last)
    return np.array(out)
'''


@pytest.fixture
def glue(tmp_path):
    path = tmp_path / "mainonly.py"
    path.write_text(GLUE + "\n" + inspect.getsource(standard_np))
    return path


def test_a_main_thread_only_sampler_passes_through_the_cli(glue):
    args = ["verify", "--sampler", f"{glue}:sampler", "--budget", "2000", "--k", "4", "--cases", "dirichlet/V8/k4",
            "--no-progress"]
    assert cli.main(args) == 0


def test_a_main_thread_only_generate_loop_passes_through_the_cli(glue):
    args = ["verify", "--generate", f"{glue}:generate", "--next-token", f"{glue}:next_token", "--sequences", "300",
            "--length", "2", "--seed", "3"]
    assert cli.main(args) == 0


def test_errors_come_back_to_the_caller_thread():
    box = {}

    def worker():
        try:
            mainthread.call(lambda: 1 / 0)
        except ZeroDivisionError as e:
            box["error"] = e
        box["value"] = mainthread.call(lambda: threading.current_thread() is threading.main_thread())

    mainthread.serve(threading.Thread(target=worker))
    assert isinstance(box["error"], ZeroDivisionError) and box["value"] is True
    assert mainthread._posted is None  # nothing serves afterwards: calls run where they are made
    assert mainthread.call(np.add, 1, 2) == 3
