#!/usr/bin/env bash
# The GPU proof in one call: installs gputui without the network, runs what only a GPU proves,
# each part under its own time limit, and writes one Markdown report (printed last) and the raw
# logs into OUTDIR (an argument, else $OUT): at most 8 files. Exit status 1 when a part failed.
#
# Prepare (on a machine with the network, in the checkout's root):
#   ../shared/gpu/fetch-wheels.sh .whl 'plotext<6'   # the wheels the GPU machine lacks (Textual
#                                                    # and friends; plotext 6 breaks textual-plotext)
# .whl/ is ignored by git; hand it to the machine beside the checkout (the device tool: carry
# [".whl"]). Then run there, from the checkout's root, with nothing else installed:
#   PYTHONUNBUFFERED=1 scripts/gpu-check.sh "$OUT"   # sized for 9 minutes (--budget 540) on one H100
# It installs the wheels with pip --no-index --target (into $GPUCHECK_SITE, default
# /tmp/gpucheck-site, put first on PYTHONPATH) and gputui itself with pip install --no-deps -e .
# (the checkout on PYTHONPATH where that is refused). Where gputui and its dependencies already
# import (a venv made with the network: pip install -e '.[test]'), it installs nothing.
#
# Options (all passed to scripts/gpu_check.py, which does the work):
#   --cpu           the rehearsal: every part that can runs on the CPU at tiny sizes, the GPU
#                   tests must skip, NVML is read where there is one, nothing needs a GPU (CI and
#                   tests/unit/test_gpu_check.py run it; about 30 s on 2 cores)
#   --no-install    use the Python as it is (fails a part cleanly if something is missing)
#   --wheels DIR    where the wheels are (default .whl)
#   --budget S      the whole run's wall-clock limit in seconds (default 540 on a GPU, 300 --cpu)
# The Python: $GPUCHECK_PYTHON, else python3 (on the lent GPU machines the one with torch+CUDA).
# Every command runs from this checkout's root, so its own gputui is the one tested even with
# a venv made for another clone (a clean clone's rehearsal: GPUCHECK_PYTHON=../wt/.venv/bin/python
# scripts/gpu-check.sh --cpu /tmp/out, in about 30 s).
#
# The parts, in the report's order (they run in the order 3, 2, 4, 5, 1 so that the GPU test
# suite, the longest, gets what time is left):
#   1 gpu-tests    pytest -m gpu over the test files that carry the gpu mark
#   2 transformer  the gpt2-small-1gpu preset, bf16, compiled, a fixed number of steps: tokens/s,
#                  MFU against the named peak, peak memory; benchmarks/bench_lm.py: single
#                  against a plain loop of the same model in the same process
#   3 nvml         energy per sample, GPM (SM and tensor activity), the GPU topology
#   4 plan         `gputui plan`'s predicted memory and step time against part 2's measured ones
#   5 cp           gputui's context parallelism on CUDA (torch's context_parallel)
# Parts 4 and 5 skip themselves, saying so, until the code they check exists.
set -u
cd "$(dirname "$0")/.." || exit 2
exec "${GPUCHECK_PYTHON:-python3}" scripts/gpu_check.py "$@"
