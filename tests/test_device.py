"""verify --sampler ... --device DEV: rows, inputs and the generator on a torch device.

Tested on the CPU device (the code path a GPU takes, short of the kernels); the GPU check is
``benchmarks/gpu_check.sh`` on a machine that has one.
"""

import importlib.util
import json
import os
import pathlib

import pytest

torch = pytest.importorskip("torch")

from specsample import cli  # noqa: E402

CASES = "dirichlet/V8/k4,ngram-2/V4/k4"
EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "torch_sampler.py"


def on_device(drafts, q, p, generator):
    """The torch standard rule, refusing inputs or a generator anywhere but on the expected device."""
    where = {q.device.type, p.device.type, drafts.device.type, generator.device.type}
    if where != {os.environ.get("SPECSAMPLE_TEST_DEVICE", "cpu")}:
        raise RuntimeError(f"inputs on {where}")
    spec = importlib.util.spec_from_file_location("torch_sampler_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.standard(drafts, q, p, generator)


def _json(path):
    doc = json.loads(path.read_text())
    doc.pop("seconds")
    doc.pop("engine")
    for c in doc["cases"]:
        c.pop("seconds")
    return doc


def test_the_cpu_device_gives_the_counts_of_no_device(tmp_path, monkeypatch):
    args = ["verify", "--sampler", f"{__file__}:on_device", "--rng", "torch", "--arrays", "torch",
            "--budget", "4000", "--k", "4", "--cases", CASES, "--no-progress"]
    monkeypatch.setenv("SPECSAMPLE_TEST_DEVICE", "cpu")
    assert cli.main([*args, "--json", str(tmp_path / "plain.json")]) == 0
    assert cli.main([*args, "--device", "cpu", "--json", str(tmp_path / "cpu.json")]) == 0
    assert _json(tmp_path / "plain.json") == _json(tmp_path / "cpu.json")
    monkeypatch.setenv("SPECSAMPLE_TEST_DEVICE", "elsewhere")  # the sampler's own check can fire
    assert cli.main([*args, "--device", "cpu"]) == 2


@pytest.mark.parametrize("extra, says", [
    (["--device", "cuda", "--arrays", "numpy"], "give arrays='torch'"),
    (["--device", "nonsense", "--arrays", "torch"], "unknown torch device 'nonsense'"),
    pytest.param(["--device", "cuda", "--arrays", "torch"], "no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_bad_devices_get_one_line(extra, says, capsys):
    code = cli.main(["verify", "--sampler", f"{EXAMPLE}:standard", "--rng", "torch", *extra])
    assert code == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
