#!/usr/bin/env bash
# The checks that need a GPU, as one short script (run from the repository root on a machine with
# an NVIDIA GPU, JAX's CUDA build and a CUDA torch installed):
#   1. the engine on the GPU: `specsample bench` at V = 64, k = 4 and V = 1024, k = 8;
#   2. the quick battery on the GPU, compiled anew (a fresh machine's first run);
#   3. a torch sampler verified with its rows, inputs and generator on cuda (quick budget, 4 cases);
#   4. the audit's recorder: compact fields computed on cuda equal numpy's;
#   5. the engine's rate against the block's width (benchmarks/bench_lanes.py; table rounds, then
#      rounds over transformers), the quick battery again (warm), and the `cached` and `tree` quick
#      batteries.
# The step limits add up to 585 s: one device call of at most 600 s.
# Each step runs under its own time limit and prints its numbers and wall time; a failing step is
# reported and the next one still runs; the script exits 1 if any failed. Outputs go to $OUT (or .).
set -uo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-.}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1  # JAX and torch share the card
failed=()
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2 t0 rc
  shift 2
  echo "=== $name (limit ${limit}s)"
  t0=${EPOCHREALTIME/./}
  timeout "$limit" "$@"
  rc=$?
  t0=$(( (${EPOCHREALTIME/./} - t0) / 100000 ))
  echo "=== $name: rc $rc, $((t0 / 10)).$((t0 % 10)) s"
  [ "$rc" -eq 0 ] || failed+=("$name")
}
nvidia-smi -L || true
$PY -c "import jax, torch; print('jax', jax.__version__, jax.devices())
print('torch', torch.__version__, torch.cuda.is_available())"
step bench 90 $PY -m specsample bench --grid 64:4,1024:8 --neural 0 --json "$OUT/bench_gpu.json"
step verify-cold 75 $PY -m specsample verify --budget quick --no-progress --json "$OUT/verify_gpu.json"
step torch-cuda 60 $PY -m specsample verify --sampler examples/torch_sampler.py:standard --rng torch \
  --arrays torch --device cuda --budget quick --k 4 --no-progress --json "$OUT/verify_cuda.json" \
  --cases 'dirichlet/V8/k4,zeros-in-p/V8/k4,ngram-2/V4/k4,large-vocab/*'
step compact-fields 60 $PY - <<'PY'
import numpy as np, torch
from specsample.audit import compact_fields, compact_fields_torch
rng = np.random.default_rng(0)
b, k, v = 1024, 4, 32768
ql, pl = rng.normal(size=(b, k, v)), rng.normal(size=(b, k + 1, v))
drafts, n = rng.integers(0, v, (b, k)), rng.integers(1, k + 2, b)
tokens = rng.integers(0, v, (b, k + 1))
tokens[:, :k] = np.where(np.arange(k)[None] < (n - 1)[:, None], drafts, tokens[:, :k])
ref = compact_fields(drafts, tokens, n, ql, pl, logits=True)
got = compact_fields_torch(drafts, tokens, n, torch.tensor(ql, device="cuda"), torch.tensor(pl, device="cuda"))
print("compact fields on cuda, max |diff| against numpy:",
      max(float(np.abs(got[key].cpu().numpy() - ref[key]).max()) for key in ref))
PY
step lanes 75 $PY benchmarks/bench_lanes.py --grid 64:4,32768:4 --lanes 4096,65536,262144
step lanes-cached 60 $PY benchmarks/bench_lanes.py --schemes cached --grid 32:4 --lanes 64,1024,8192
step verify-warm 45 $PY -m specsample verify --budget quick --no-progress
step cached-quick 60 $PY -m specsample verify --scheme cached --budget quick --no-progress
step tree-quick 60 $PY -m specsample verify --scheme tree --budget quick --no-progress
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
echo "all steps passed"
