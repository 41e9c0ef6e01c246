#!/usr/bin/env bash
# Runs on the lent GPU machine (see docs/performance.md): Vulkan loader from .gl/, wheels from .whl/,
# then the kernel tests and the benchmarks; results land in $OUT. MODELS: the synthetic models of `models`
# (default all five of lab/host/synthetic/releases.py; the same files scripts/device_llamacpp.sh gives llama.cpp).
# BASE=.base: also bench each model with the lab of .base/, made here by
#   rm -rf .base && mkdir .base && git archive REV lab wgsl | tar -x -C .base   (git-ignored; carry .gl .whl .base)
set -uo pipefail
source scripts/device_native.sh
native_env || exit 4
python3 -m lab.host.cli selftest | tee "$OUT/selftest.json"
what=${1:-tests,kernels,models}
if [[ $what == *tests* ]]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels -x -k "not real" 2>&1 | tail -30 | tee "$OUT/kernel_tests.txt"
fi
if [[ $what == *kernels* ]]; then
  python3 -m lab.host.cli bench kernels | tee "$OUT/kernels.txt"
fi
# bench MODEL TREE FILE: the model's benchmark with the lab of TREE (the working tree, or BASE's)
bench() {
  PYTHONPATH=/tmp/site:$2 python3 -m lab.host.cli bench --synthetic "$1" --prompts 128,512 --contexts 0,512,2048 --decode 64 --batch "${BATCH:-512}" --warm-gpu "${WARM_GPU:-1}" --json \
    | tee "$3"
}
if [[ $what == *models* ]]; then
  for m in ${MODELS:-smollm2 qwen2.5 gemma3 llama3.2-1b llama3.1-8b}; do
    bench "$m" "$PWD" "$OUT/bench_$m.json"
    # BASE: an older lab beside this one (git-ignored, carried), each model run by both back to back, so that a
    # change is measured against its baseline on the same GPU in the same call
    if [[ -n ${BASE:-} ]]; then bench "$m" "$PWD/$BASE" "$OUT/bench_${m}_base.json"; fi
  done
fi
if [[ $what == *torch* ]]; then
  python3 scripts/torch_bench.py 2>&1 | grep -v Warning | tee "$OUT/torch.jsonl"
fi
if [[ $what == *profile* ]]; then
  for m in ${PROFILE_MODELS:-smollm2 qwen2.5 gemma3}; do
    for c in 0 2048; do
      python3 -m lab.host.cli bench --synthetic "$m" --profile --prompts 1 --contexts "$c" | sed "s/^/$m ctx$c /" | tee -a "$OUT/profile.txt"
    done
  done
fi
