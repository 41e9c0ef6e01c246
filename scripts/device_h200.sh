#!/usr/bin/env bash
# One run on the lent H200 for docs/performance.md's side-by-side table: the lab (native, wgpu-py on Vulkan),
# llama.cpp with CUDA (built here from .llamacpp, scripts/device_llamacpp.sh) and PyTorch + transformers, on
# the same synthetic GGUFs (lab/host/synthetic/releases.py: each model's exact shapes and quant types, random blocks).
# Carry .gl, .whl and .llamacpp (scripts/device_llamacpp_prepare.sh makes it here). Then, here:
#   tar -xzf <files_at>/all.tgz -C DIR && python3 scripts/h200_table.py DIR [--depth 2048,8192,32768]
# (--depth: the CONTEXTS less 0, as the run's first line prints them; the run writes that table as table.md too).
# The llama.cpp build (about 4 minutes) runs in the background while the kernels are timed and the files written.
# Environment: MODELS (default: the five synthetic models), CONTEXTS (0,2048: the lab's decode contexts, and the same
# less 0 as llama-bench's depths, DEPTHS of device_llamacpp.sh; a context past a model's own context_length is skipped
# on both sides, with a line each), TORCH=0 skips PyTorch, TORCH_S (its time limit, 200 s; it runs last), WARM_GPU
# (seconds of GPU work before each timed prefill and decode, default 1: llama-bench runs a warm-up before its
# repetitions too, and an idle H200 drops to 345 MHz), KV (the lab's KV cache type, f32 or f16: `lab bench --kv`;
# llama-bench's is f16 either way, its default).
# About 9 minutes in all with the default CONTEXTS; a device call allows 10.
#
# Long contexts (decode at 8,192 and 32,768 keys; estimates from the 512-token figures, not measured yet): the lab
# prefills each context as a chat prompt from an empty cache, in steps of BATCH (512), so 32,768 keys cost 64 steps:
# their GEMMs at about the prefill-512 rate (Qwen2.5 2.6 s, Llama-3.1-8B 35 s) and an attention that grows with the
# square (Qwen2.5 5-10 s, Llama-3.2-1B 5-12 s, Llama-3.1-8B 20-40 s; Gemma 3's sliding layers stay short), then 146
# decode steps of a few ms. llama-bench pays per depth one model load, one prefill of the depth and REPS + 1 decodes
# of 128 tokens there: about 5 s a depth for the small models, 15-20 s for the 8B at 32,768. SmolLM2 (8,192) skips
# 32,768 on both sides. So CONTEXTS=0,2048,8192,32768 adds about 30 s (Qwen2.5) to 2 minutes (the 8B) a model: all
# five do not fit one call. One model's long contexts, about 6 minutes with the build:
#   MODELS=qwen2.5 CONTEXTS=0,8192,32768 TORCH=0 bash scripts/device_h200.sh
# and the five in two calls: MODELS="smollm2 qwen2.5 gemma3 llama3.2-1b" (about 8 minutes), then
# MODELS=llama3.1-8b (about 3 minutes where the machine is still warm with the build, 8 on a fresh one).
# The lab's KV cache is f32 unless KV=f16: Qwen2.5 at 32,768 keys holds 809 MB (24 layers x 2 x 32,914 rows x 128 x 4 B), the 8B
# 8.6 GB; each layer's K or V buffer (135 MB at most, the 8B's) is far within the 2 GB binding limit, and the whole
# within the H200's 141 GB.
set -uo pipefail
MODELS=${MODELS:-smollm2 qwen2.5 gemma3 llama3.2-1b llama3.1-8b}
CONTEXTS=${CONTEXTS:-0,2048}
# llama-bench's depths: the lab's contexts less 0 (its -p PP -n TG run measures that one)
DEPTHS=$(tr ',' '\n' <<< "$CONTEXTS" | grep -vx '0' | paste -sd ' ')
export MODELS DEPTHS
echo "contexts $CONTEXTS; llama-bench depths ${DEPTHS:-none}; the lab's KV cache ${KV:-f32}"
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
    python3 -c "import sys; from pathlib import Path; from lab.host.synthetic import releases as synthetic
synthetic.write(sys.argv[1], Path(sys.argv[2]), vocab=True)" "$m" "$f" && touch "$f.done"
  fi
done
bash scripts/device_llamacpp.sh wait "${BUILD_WAIT:-400}" || exit 1
for m in $MODELS; do
  f=$D/models/$m.gguf
  t0=$SECONDS
  python3 -m lab.host.cli bench "$f" --prompts 128,512 --contexts "$CONTEXTS" --decode 64 --batch "${BATCH:-512}" \
    --warm-gpu "${WARM_GPU:-1}" --kv "${KV:-f32}" --json > "$OUT/bench_$m.json" 2> "$OUT/bench_$m.log"
  grep -h "skipped" "$OUT/bench_$m.log"      # the contexts past the model's own
  echo "lab $m ($((SECONDS - t0)) s): $(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
print('prefill 512', r['prefill']['512']['tok_s'], 'decode', {c: d['tok_s'] for c, d in r['decode'].items()},
      'n_ctx', r.get('n_ctx'), 'GPU MB', r.get('gpu_memory_mb'))" "$OUT/bench_$m.json" 2>&1 | tail -1)"
done
bash scripts/device_llamacpp.sh bench
table() {   # the side-by-side table of what $OUT holds, at the lab's contexts (scripts/h200_table.py)
  python3 scripts/h200_table.py "$OUT" --depth "$(tr ' ' ',' <<< "${DEPTHS:-2048}")" > "$OUT/table.md" \
    && cat "$OUT/table.md"
}
table
# Few files come back from a device call: everything in one archive as well.
tar -czf "$OUT/all.tgz" -C "$OUT" --exclude=all.tgz --exclude=run_output.txt .
if [ "${TORCH:-1}" != 0 ]; then      # last: the slowest peer, cut at TORCH_S seconds
  timeout "${TORCH_S:-200}" python3 scripts/torch_bench.py --bf16-only $MODELS 2>/dev/null > "$OUT/torch.jsonl"
  echo "torch: $(wc -l < "$OUT/torch.jsonl") configurations"
  table
  tar -czf "$OUT/all.tgz" -C "$OUT" --exclude=all.tgz --exclude=run_output.txt .    # again, with torch.jsonl
fi
