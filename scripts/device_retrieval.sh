#!/usr/bin/env bash
# Runs ON the lent H200: the retrieval index natively (wgpu on the NVIDIA Vulkan driver) on the three real models,
# over tests/fixtures/constitution.txt: windows embedded per second and recall@1/@5 (`lab retrieval-eval`). The model
# files travel in pieces made by scripts/device_retrieval_prepare.sh, one per call, the calls chained back to back.
#
#   bash scripts/device_retrieval.sh piece     # calls 1..N-1: keep this call's piece in /tmp/devr
#   bash scripts/device_retrieval.sh run       # call N (with .gl and .whl): assemble, install, measure
#
# Results in $OUT: gpu.txt, retrieval_<model>.json, log.txt.
set -uo pipefail
D=/tmp/devr
source scripts/device_pieces.sh
pieces_then_native .devretrieval "$D" "${1:-run}"
# the kernels against numpy, and the index against the numpy reference forward, on the NVIDIA adapter
export LLM_LAB_CACHE=$D OPENBLAS_NUM_THREADS=8
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pool.py tests/engine/test_retrieval.py \
  2>&1 | tail -5 | tee "$OUT/log.txt"
for m in SmolLM2-135M-Instruct.Q4_1 qwen2.5-coder-0.5b-instruct gemma-3-270m-q4_k_m; do
  timeout 240 python3 -m lab.host.cli retrieval-eval "$D/models/$m.gguf" tests/fixtures/constitution.txt \
    --queries "${QUERIES:-500}" --json 2>>"$OUT/log.txt" | tee "$OUT/retrieval_$m.json" | cut -c1-400
done
