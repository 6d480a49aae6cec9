#!/usr/bin/env bash
# Run the distributed suite (ddp, fsdp, the launcher, sweeps, resume, every equivalence, the
# plan's tracer, the measured collectives of predict and plan, every pp schedule) on the
# oldest torch gputui supports, in a venv of its own (default .venv-oldest; several GB: the
# registry's torch build carries its CUDA libraries, which import fine without a GPU).
#   usage: scripts/test-oldest-torch.sh [VENV] [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-oldest}; shift || true
oldest=$(sed -n 's/.*"torch>=\([0-9.]*\)".*/\1/p' pyproject.toml)
vision=$(sed -n 's/.*"torchvision>=\([0-9.]*\)".*/\1/p' pyproject.toml)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "torch==$oldest.*" "torchvision==$vision.*"
"$venv/bin/pip" install -q -e '.[test]'
"$venv/bin/python" -c "import torch; print('torch', torch.__version__)"
exec "$venv/bin/python" -m pytest -q tests/unit/test_equivalence_ddp.py tests/unit/test_ddp_runs.py \
    tests/unit/test_ddp_config.py tests/unit/test_sweep.py tests/unit/test_bench_comm.py \
    tests/unit/test_equivalence_dp_mp.py tests/unit/test_equivalence_scratch.py \
    tests/unit/test_resume.py tests/unit/test_forecast.py tests/unit/test_predict.py \
    tests/unit/test_equivalence_pp.py "$@"
