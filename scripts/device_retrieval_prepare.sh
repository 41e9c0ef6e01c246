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
source scripts/device_pieces.sh
make_pieces .devretrieval "$CHUNK" "$MODELS" scripts/device_retrieval.sh $FILES
