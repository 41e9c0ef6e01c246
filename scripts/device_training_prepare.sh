#!/usr/bin/env bash
# Runs HERE: what scripts/device_training.sh needs on the lent GPU (no network): the Vulkan loader debs and wheels
# (scripts/device_bench_prepare.sh makes .gl and .whl) and SmolLM2-135M-Instruct Q4_1, the model the training
# benchmark runs and whose tokenizer the synthetic test files copy, in pieces that fit one device call each (64 MiB a
# call for the whole working tree). Pieces land in .devtrain/N/ (git-ignored, never committed).
#
#   scripts/device_training_prepare.sh           # then make the device calls it prints, back to back
set -euo pipefail
cd "$(dirname "$0")/.."
CHUNK=${CHUNK:-38000000}     # the working tree is ~24 MB of the 64 MiB a call carries
MODELS=${LLM_LAB_CACHE:-$HOME/.cache/llm-lab}/models
FILES="SmolLM2-135M-Instruct.Q4_1.gguf"
bash scripts/device_bench_prepare.sh
grep -qx '/.devtrain/' .git/info/exclude 2>/dev/null || echo '/.devtrain/' >> .git/info/exclude
W=$(mktemp -d)
rm -rf .devtrain && mkdir .devtrain
tar -C "$MODELS" -cf - $FILES | split -b "$CHUNK" -d -a 2 - "$W/bundle."
n=0
for f in "$W"/bundle.*; do n=$((n + 1)); mkdir -p ".devtrain/$n"; mv "$f" ".devtrain/$n/"; done
(cd .devtrain && sha256sum */bundle.* | sed 's| [0-9]*/| |' > "$W/pieces.sha256")
for i in $(seq 1 $n); do cp "$W/pieces.sha256" ".devtrain/$i/"; done
rm -rf "$W"
du -sh .devtrain
echo "== device calls: back to back (the machine keeps /tmp only while it is warm, 30 s after a call)"
for i in $(seq 1 $((n - 1))); do
  echo "run(carry=[\".devtrain/$i\"], timeout_s=60, command=\"bash scripts/device_training.sh piece\")"
done
echo "run(carry=[\".devtrain/$n\", \".gl\", \".whl\"], timeout_s=600, command=\"bash scripts/device_training.sh run\")"
