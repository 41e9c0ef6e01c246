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
source scripts/device_pieces.sh
make_pieces .devtrain "$CHUNK" "$MODELS" scripts/device_training.sh $FILES
