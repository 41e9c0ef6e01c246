#!/usr/bin/env bash
# Runs HERE: what scripts/device_retrieval.sh needs on the lent H200 (no network) to measure the retrieval index
# natively on the three real models: the Vulkan loader debs and wheels (scripts/device_bench_prepare.sh makes .gl and
# .whl) and the real model files, split into pieces that fit one device call each (64 MiB per call for the whole
# working tree: 11 MB of it is the tree). Pieces land in .devretrieval/N/ (git-ignored, never committed).
#
#   scripts/device_retrieval_prepare.sh           # then make the device calls it prints, back to back
set -euo pipefail
cd "$(dirname "$0")/.."
CHUNK=${CHUNK:-50000000}
MODELS=${LLM_LAB_CACHE:-$HOME/.cache/llm-lab}/models
FILES="SmolLM2-135M-Instruct.Q4_1.gguf qwen2.5-coder-0.5b-instruct.gguf gemma-3-270m-q4_k_m.gguf"
bash scripts/device_bench_prepare.sh
grep -qx '/.devretrieval/' .git/info/exclude 2>/dev/null || echo '/.devretrieval/' >> .git/info/exclude
W=$(mktemp -d)
rm -rf .devretrieval && mkdir .devretrieval
tar -C "$MODELS" -cf - $FILES | split -b "$CHUNK" -d -a 2 - "$W/bundle."
n=0
for f in "$W"/bundle.*; do n=$((n + 1)); mkdir -p ".devretrieval/$n"; mv "$f" ".devretrieval/$n/"; done
(cd .devretrieval && sha256sum */bundle.* | sed 's| [0-9]*/| |' > "$W/pieces.sha256")
for i in $(seq 1 $n); do cp "$W/pieces.sha256" ".devretrieval/$i/"; done
rm -rf "$W"
du -sh .devretrieval
echo "== device calls: back to back (the machine keeps /tmp only while it is warm, 30 s after a call)"
for i in $(seq 1 $((n - 1))); do
  echo "run(kind=nvidia-h200, carry=[\".devretrieval/$i\"], timeout_s=60, command=\"bash scripts/device_retrieval.sh piece\")"
done
echo "run(kind=nvidia-h200, carry=[\".devretrieval/$n\", \".gl\", \".whl\"], timeout_s=600, command=\"bash scripts/device_retrieval.sh run\")"
