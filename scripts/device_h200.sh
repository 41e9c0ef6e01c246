#!/usr/bin/env bash
# One run on the lent H200 for docs/performance.md's side-by-side table: the lab (native, wgpu-py on Vulkan),
# llama.cpp with CUDA (built here from .llamacpp, scripts/device_llamacpp.sh) and PyTorch + transformers, on
# the same synthetic GGUFs (lab/host/synthetic.py: each model's exact shapes and quant types, random blocks).
# Carry .gl, .whl and .llamacpp (scripts/device_llamacpp_prepare.sh makes it here). Then, here:
#   tar -xzf <files_at>/all.tgz -C DIR && python3 scripts/h200_table.py DIR
# The llama.cpp build (about 4 minutes) runs in the background while the kernels are timed and the files written.
# Environment: MODELS (default: the five synthetic models), CONTEXTS (0,2048), TORCH=0 skips PyTorch,
# TORCH_S (its time limit, 200 s; it runs last), WARM_GPU (seconds of GPU work before each timed prefill and decode,
# default 1: llama-bench runs a warm-up before its repetitions too, and an idle H200 drops to 345 MHz).
# About 9 minutes in all; a device call allows 10.
set -uo pipefail
MODELS=${MODELS:-smollm2 qwen2.5 gemma3 llama3.2-1b llama3.1-8b}
export MODELS
D=${LLAMACPP_DIR:-/tmp/llamacpp}
bash scripts/device_llamacpp.sh build
# While it builds: what the build's load cannot skew. Kernels are timed on the GPU (timestamp queries); the files
# are only written. The models' decode is partly CPU-bound (about 1.2 ms of encoding per SmolLM2 token), so it waits
# for the build: the first such run measured the lab under a -j16 build and lost 25-40% of small models' decode.
bash scripts/device_bench.sh kernels > /dev/null      # the Vulkan loader and wheels; kernels.txt, gpu.txt in $OUT
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
mkdir -p "$D/models"
for m in $MODELS; do
  f=$D/models/$m.gguf      # the file device_llamacpp.sh benches (it skips writing where $f.done exists)
  if [ ! -e "$f.done" ]; then
    python3 -c "import sys; from pathlib import Path; from lab.host import synthetic
synthetic.write(sys.argv[1], Path(sys.argv[2]), vocab=True)" "$m" "$f" && touch "$f.done"
  fi
done
bash scripts/device_llamacpp.sh wait "${BUILD_WAIT:-400}" || exit 1
for m in $MODELS; do
  f=$D/models/$m.gguf
  python3 -m lab.host.cli bench "$f" --prompts 128,512 --contexts ${CONTEXTS:-0,2048} --decode 64 --batch "${BATCH:-512}" \
    --warm-gpu "${WARM_GPU:-1}" --json > "$OUT/bench_$m.json" 2> "$OUT/bench_$m.log"
  echo "lab $m: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('prefill 512', r['prefill']['512']['tok_s'], 'decode', {c: d['tok_s'] for c, d in r['decode'].items()}, 'GPU MB', r.get('gpu_memory_mb'))" "$OUT/bench_$m.json" 2>&1 | tail -1)"
done
bash scripts/device_llamacpp.sh bench
# Few files come back from a device call: everything in one archive as well.
tar -czf "$OUT/all.tgz" -C "$OUT" --exclude=all.tgz --exclude=run_output.txt .
if [ "${TORCH:-1}" != 0 ]; then      # last: the slowest peer, cut at TORCH_S seconds
  timeout "${TORCH_S:-200}" python3 scripts/torch_bench.py --bf16-only $MODELS 2>/dev/null > "$OUT/torch.jsonl"
  echo "torch: $(wc -l < "$OUT/torch.jsonl") configurations"
  tar -czf "$OUT/all.tgz" -C "$OUT" --exclude=all.tgz --exclude=run_output.txt .    # again, with torch.jsonl
fi
