#!/usr/bin/env bash
# The GPU checks, on a machine with a CUDA GPU whose python3 holds torch and which has no network:
# tests/test_gpu.py, then benchmarks/bench_gpu.py, each bounded; logs and figures into $1.
#
#   bash tools/gpu_check.sh OUT_DIR        (run in the checkout's root; TEST_S / BENCH_S bound the two parts:
#                                           the 17 tests took ~290 s on one H200 on 2026-11-28;
#                                           BENCH_S=0 skips the benchmark, TESTS=EXPR picks tests by -k)
#
# What python3 lacks travels as wheels in .whl/ (an ignored folder): jdist's dependencies for Python
# 3.12, Optuna and DeepSpeed (py3-none-any; no ops prebuilt: DeepSpeed builds what it needs there), and
# jdist's own wheel, for its entry points (the tests import the checkout's jdist first; the kernels and
# ranks the installed one, built from the same tree). ../shared/notes/gpu.md says how to fetch them.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
base=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m venv --system-site-packages /tmp/v || exit
/tmp/v/bin/pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit
site=$(/tmp/v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$base')" > "$site/zz-torchenv.pth"  # python3 is itself a venv
export JUPYTER_PATH=/tmp/v/share/jupyter JDIST_RUN_DIR=/tmp/jdist-runs PYTHONUNBUFFERED=1 PATH=/tmp/v/bin:$PATH
{ nvidia-smi -L
  python -c "import torch, deepspeed, optuna, jdist; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(),
'deepspeed', deepspeed.__version__, 'optuna', optuna.__version__, 'jdist', jdist.__version__)"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
timeout "${TEST_S:-330}" python -m pytest tests/test_gpu.py -v -rfEs --tb=short --durations=0 -p no:cacheprovider \
  --timeout 150 ${TESTS:+-k "$TESTS"} > "$out/test_gpu.txt" 2>&1
echo "test_gpu rc=$?"
grep -E "passed|failed|PASSED|FAILED|SKIPPED|ERROR" "$out/test_gpu.txt" | tail -30
[ "${BENCH_S:-220}" = 0 ] && exit
timeout "${BENCH_S:-220}" python benchmarks/bench_gpu.py --repeats 2 --steps 200 --json "$out/bench_gpu.json" \
  > "$out/bench_gpu.txt" 2>&1
echo "bench_gpu rc=$?"
tail -40 "$out/bench_gpu.txt"
