#!/usr/bin/env bash
# Runs ON the lent GPU: training natively (wgpu on the NVIDIA Vulkan driver). The model file travels in pieces made by
# scripts/device_training_prepare.sh, one per call, the calls chained back to back.
#
#   bash scripts/device_training.sh piece     # calls 1..N-1: keep this call's piece in /tmp/devt
#   bash scripts/device_training.sh run       # call N (with .gl and .whl): assemble, install, check, measure
#
# WHAT (default tests,gradcheck,train,torch): the training's kernel and engine tests, `lab gradcheck` on the
# synthetic Llama 3 and on SmolLM2, `lab train` on SmolLM2 over tests/fixtures/constitution.txt at each CTXS x BATCH,
# and PyTorch eager on the same (scripts/torch_train_bench.py, where present); `attn` adds the attention backward's
# variants (scripts/bench_attention_back.py); `full` (WHAT=full alone: a call brings back at most 8 files) full
# fine-tuning of SmolLM2's F32 copy (`lab f32-copy`, then `lab train --full`, and torch_train_bench.py --full beside
# it) at each CTXS, and `lab gradcheck --full` on the synthetic Llama 3. Results in $OUT (gpu.txt, tests.txt,
# gradcheck.json, train_*.json, torch_*.json, attention_back.json, full_*.json, torch_full_*.json,
# gradcheck_full.json); `scratch` (WHAT=scratch alone) the 16M preset trained from scratch on README.md and docs/*.md by
# the lab and by PyTorch eager from the same start (scripts/bench_scratch.py: scratch_16m.json); `embedder` the retrieval
# embedder tuned contrastively (`lab train-embedder`, both stages: STEPS a stage, BATCH pairs a step, QUERIES crops)
# on SmolLM2 over each of CORPORA (constitution: tests/fixtures/constitution.txt, the default; docs: README.md and
# docs/*.md), one a call (embedder_CORPUS.json and .log; `tests` runs its engine tests too); `grounded` (alone) the
# LoRA that answers from the sources or declines (grounded_data.json, grounded_stock.json, grounded_train.json,
# grounded_lora.json).
set -uo pipefail
D=/tmp/devt
source scripts/device_pieces.sh
pieces_then_native .devtrain "$D" "${1:-run}"
export LLM_LAB_CACHE=$D OPENBLAS_NUM_THREADS=8
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
what=${WHAT:-tests,gradcheck,train,torch}
SMOL=$D/models/SmolLM2-135M-Instruct.Q4_1.gguf
DATA=tests/fixtures/constitution.txt
if [[ $what == *tests* ]]; then
  # --slow for the kernels; the engine's default set (its slow files take qwen2.5's and gemma3's tokenizers, which
  # do not travel)
  timeout 300 python3 -m pytest -q -p no:cacheprovider --slow tests/kernels/test_optimizer.py \
    tests/kernels/test_backward_norm.py tests/kernels/test_elementwise.py tests/kernels/test_backward_attention.py \
    tests/kernels/test_backward_lora.py tests/kernels/test_backward_matmul.py tests/kernels/test_backward_bias.py 2>&1 | tail -8 | tee "$OUT/tests.txt"
  # (less the synthetic qwen3's cases: its vocabulary is copied from Qwen2.5's, which does not travel either)
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/test_training.py tests/engine/test_lora_engine.py \
    tests/engine/test_train_cli.py tests/engine/test_full_finetune.py tests/engine/test_scratch.py \
    tests/engine/test_contrastive.py tests/engine/test_scratch_card.py tests/engine/test_full_finetune_qwen2.py \
    tests/engine/test_chat_training.py \
    -k "not qwen3" \
    2>&1 | tail -8 | tee -a "$OUT/tests.txt"
fi
if [[ $what == *gradcheck* ]]; then
  # both reports in one file: at most 8 files come back from a call
  timeout 120 python3 -m lab.host.cli gradcheck "$D/synthetic/synthetic-llama3-f32.gguf" --json > "$D/gc_llama3.json"
  timeout 300 python3 -m lab.host.cli gradcheck "$SMOL" --samples 1 --json > "$D/gc_smollm2.json"
  python3 -c "import json,sys; r = {k: json.load(open(f)) for k, f in zip(('llama3', 'smollm2'), sys.argv[2:])}
json.dump(r, open(sys.argv[1], 'w'), indent=1); [print(k, v['worst_rel_err']) for k, v in r.items()]" \
    "$OUT/gradcheck.json" "$D/gc_llama3.json" "$D/gc_smollm2.json"
fi
if [[ $what == *full* ]]; then
  timeout 120 python3 -m lab.host.cli gradcheck "$D/synthetic/synthetic-llama3-f32.gguf" --full --json \
    > "$OUT/gradcheck_full.json"
  SMOL32=$D/smollm2-f32.gguf
  [ -e "$SMOL32" ] || timeout 200 python3 -m lab.host.cli f32-copy "$SMOL" --out "$SMOL32"
fi
if [[ $what == *scratch* ]]; then
  timeout 500 python3 scripts/bench_scratch.py --corpus README.md docs/*.md --preset 16m --ctx "${SCRATCH_CTX:-256}" \
    --batch "${BATCH:-8}" --steps "${STEPS:-300}" --lr 1e-3 --torch-python python3 --out "$D/scratch" \
    | tee "$OUT/scratch.txt" && cp "$D/scratch/scratch.json" "$OUT/scratch_16m.json"
fi
if [[ $what == *embedder* ]]; then
  # one corpus a call (CORPORA=constitution, then CORPORA=docs): the docs' run takes about 7 minutes on an H100 (3
  # indexes of ~2,500 windows, 200 steps of 32 windows forward and back, ~1.3 s a step)
  for corpus in ${CORPORA:-constitution}; do
    files=(README.md docs/*.md)
    [ $corpus = constitution ] && files=("$DATA")
    timeout "${EMB_TIMEOUT:-560}" python3 -m lab.host.cli train-embedder "$SMOL" "${files[@]}" --steps "${STEPS:-100}" \
      --batch "${BATCH:-16}" --queries "${QUERIES:-500}" --out "$D/embedder_$corpus.lora.gguf" --json \
      > "$OUT/embedder_$corpus.json" 2> "$OUT/embedder_$corpus.log"
    tail -c 400 "$OUT/embedder_$corpus.log"; cut -c1-600 "$OUT/embedder_$corpus.json"
  done
fi
if [[ $what == *grounded* ]]; then
  # issue #44 part 4 (WHAT=grounded alone): the grounded set from README.md and docs/*.md, stock SmolLM2's replies to
  # its held-out rows, a rank-16 LoRA on every projection (3.5% of the model, the reference's 4.9M) trained on the
  # assistant's tokens for GROUNDED_STEPS steps of 8 conversations (~4 passes), then its replies to the same rows
  timeout 60 python3 -m lab.host.cli grounded-data README.md docs/*.md --out "$D/grounded.jsonl" --json \
    | tee "$OUT/grounded_data.json"
  timeout 250 python3 -m lab.host.cli grounded-eval "$SMOL" --set "$D/grounded.heldout.jsonl" --json \
    > "$OUT/grounded_stock.json"
  timeout 400 python3 -m lab.host.cli train "$SMOL" --data "$D/grounded.jsonl" --ctx 576 --batch 8 \
    --steps "${GROUNDED_STEPS:-80}" --warmup 5 --lr "${GROUNDED_LR:-5e-4}" --lora-rank 16 --held-out 0.1 \
    --out "$D/grounded.lora.gguf" --json > "$OUT/grounded_train.json"
  timeout 250 python3 -m lab.host.cli grounded-eval "$SMOL" --set "$D/grounded.heldout.jsonl" \
    --lora "$D/grounded.lora.gguf" --json > "$OUT/grounded_lora.json"
  for f in stock lora; do python3 -c "import json,sys; r = json.load(open(sys.argv[1])); print(sys.argv[2], {k: r[k] for k in
    ('refuses_when_it_should', 'refuses_when_it_should_not', 'grounding')})" "$OUT/grounded_$f.json" $f; done
fi
if [[ $what == *attn* ]]; then
  timeout 200 python3 scripts/bench_attention_back.py > "$OUT/attention_back.json"
fi
for ctx in ${CTXS:-128 512}; do
  if [[ $what == *train* ]]; then
    timeout 200 python3 -m lab.host.cli train "$SMOL" --data "$DATA" --ctx "$ctx" --batch "${BATCH:-4}" \
      --steps "${STEPS:-12}" --out "$D/smol.lora.gguf" --profile --json | tee "$OUT/train_smollm2_ctx$ctx.json" | cut -c1-300
  fi
  if [[ $what == *torch* && -f scripts/torch_train_bench.py ]]; then
    timeout 200 python3 scripts/torch_train_bench.py "$SMOL" --data "$DATA" --ctx "$ctx" --batch "${BATCH:-4}" \
      --rank 8 --alpha 16 --steps "${STEPS:-12}" --warmup-steps 1 | tee "$OUT/torch_smollm2_ctx$ctx.json" | cut -c1-300
  fi
  if [[ $what == *full* ]]; then
    timeout 200 python3 -m lab.host.cli train "$SMOL32" --full --data "$DATA" --ctx "$ctx" --batch "${BATCH:-4}" \
      --steps "${STEPS:-12}" --out "$D/smol.trained.gguf" --profile --json | tee "$OUT/full_smollm2_ctx$ctx.json" \
      | cut -c1-300
    timeout 200 python3 scripts/torch_train_bench.py "$SMOL32" --full --data "$DATA" --ctx "$ctx" \
      --batch "${BATCH:-4}" --steps "${STEPS:-12}" --warmup-steps 1 | tee "$OUT/torch_full_smollm2_ctx$ctx.json" \
      | cut -c1-300
  fi
done
