#!/usr/bin/env bash
# The checks that need a GPU, as one short script (run from the repository root on a machine with
# an NVIDIA GPU, JAX's CUDA build and a CUDA torch installed):
#   1. the engine on the GPU: `specsample bench` at V = 64, k = 4 and V = 1024, k = 8;
#   2. a torch sampler verified with its rows, inputs and generator on cuda (quick budget, 4 cases);
#   3. the audit's recorder: compact fields computed on cuda equal numpy's, then audited.
# Each prints its numbers; the script stops at the first failure.
set -euo pipefail
python -c "import jax, torch; print('jax', jax.__version__, jax.devices()); print('torch', torch.__version__, torch.cuda.is_available())"
python -m specsample bench --grid 64:4,1024:8 --neural 0 --json "${OUT:-.}/bench_gpu.json"
time python -m specsample verify --sampler examples/torch_sampler.py:standard --rng torch --arrays torch \
  --device cuda --budget quick --k 4 --cases 'dirichlet/V8/k4,zeros-in-p/V8/k4,ngram-2/V4/k4,large-vocab/*' \
  --no-progress --json "${OUT:-.}/verify_cuda.json"
python - <<'PY'
import numpy as np, torch
from specsample.audit import compact_fields, compact_fields_torch
rng = np.random.default_rng(0)
b, k, v = 4096, 4, 32768
ql, pl = rng.normal(size=(b, k, v)), rng.normal(size=(b, k + 1, v))
drafts, n = rng.integers(0, v, (b, k)), rng.integers(1, k + 2, b)
tokens = rng.integers(0, v, (b, k + 1))
tokens[:, :k] = np.where(np.arange(k)[None] < (n - 1)[:, None], drafts, tokens[:, :k])
ref = compact_fields(drafts, tokens, n, ql, pl, logits=True)
got = compact_fields_torch(drafts, tokens, n, torch.tensor(ql, device="cuda"), torch.tensor(pl, device="cuda"))
print("compact fields on cuda, max |diff| against numpy:",
      max(float(np.abs(got[key].cpu().numpy() - ref[key]).max()) for key in ref))
PY
