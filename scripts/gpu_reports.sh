#!/usr/bin/env bash
# The GPU figures in one command, on a CUDA machine:
#   scripts/gpu_reports.sh [diffusion] [act] [smolvla]      (default: all three)
# For each policy kind: build the real-size random-weight policy (robotserve make-policy
# --size real), profile it on cuda as eager fp32 beside bf16, torch.compile and CUDA graphs
# (robotserve profile --variants), and time LeRobot's own policy server against the batched
# engine (robotserve bench peer). Reports go to reports/gpu/<gpu>/ (the GPU's name, e.g.
# nvidia_h100_80gb_hbm3), each JSON naming the GPU, driver and torch/CUDA versions.
# Without CUDA it stops at once: exit 2, one line.
# Env: PY (python with the project installed; default .venv/bin/python, else python3),
# OUT (default reports/gpu), POLICIES (build dir; default $TMPDIR/robotserve_gpu_policies),
# BATCHES (profile batch sizes; default 1,2,4,8,16,32,64), MAX_BATCH (peer sweep; default 64).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
GPU=$("$PY" - <<'PYEOF' 2>/dev/null || true
from robotserve_ros.engines.torch_env import import_torch
torch = import_torch()
if torch.cuda.is_available():
    import re
    print(re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(0).lower()).strip("_"))
PYEOF
)
if [ -z "$GPU" ]; then
    echo "gpu_reports.sh: no CUDA device visible to torch ($PY); run it on a CUDA machine" >&2
    exit 2
fi
KINDS=("$@")
[ ${#KINDS[@]} -eq 0 ] && KINDS=(diffusion act smolvla)
OUT=${OUT:-reports/gpu}/$GPU
POLICIES=${POLICIES:-${TMPDIR:-/tmp}/robotserve_gpu_policies}
BATCHES=${BATCHES:-1,2,4,8,16,32,64}
MAX_BATCH=${MAX_BATCH:-64}
mkdir -p "$OUT" "$POLICIES"
for kind in "${KINDS[@]}"; do
    dir="$POLICIES/$kind"
    [ -f "$dir/model.safetensors" ] || "$PY" -m robotserve_ros.cli make-policy --kind "$kind" --size real --out "$dir"
    "$PY" -m robotserve_ros.cli profile --engine lerobot \
        --engine-params "{\"policy_dir\": \"$dir\", \"device\": \"cuda\"}" --batch-sizes "$BATCHES" \
        --warmup 2 --repeats 5 --variants fp32,bf16,compile,graphs --out "$OUT/${kind}_real_profile.json" --force \
        --title "$kind (real size, random weights) on $GPU"
    "$PY" -m robotserve_ros.cli bench peer --policy-dir "$dir" --device cuda --max-batch "$MAX_BATCH" \
        --warmup 2 --repeats 5 --time-cap 540 --out "$OUT/${kind}_real_peer.json" --force
done
echo "gpu_reports.sh: reports in $OUT"
