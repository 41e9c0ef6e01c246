#!/usr/bin/env bash
# Runs ON the lent H200 (no network): the lab page in headless Chromium on the NVIDIA adapter (WebGPU through Dawn
# on the NVIDIA Vulkan driver), benchmarked against the native engine on the same files in the same run, plus the
# worker's kernel checks and the chat parity test on that adapter. What it needs travels in pieces made here by
# scripts/device_browser_prepare.sh, one piece per device call, the calls chained back to back (the machine, and
# its /tmp, stays only while it is warm: 30 s after a call).
#
#   bash scripts/device_browser.sh piece     # calls 1..N-1: keep this call's piece in /tmp/devb
#   bash scripts/device_browser.sh all       # call N: assemble, install, then tests and benchmarks
#   bash scripts/device_browser.sh tests     # or split the work: the correctness checks only ...
#   bash scripts/device_browser.sh bench     # ... and the benchmarks only (MODELS="smollm2 qwen2.5 gemma3")
#   bash scripts/device_browser.sh retrieval # the retrieval card's page tests and its index, natively and in the page
#   bash scripts/device_browser.sh experiments # the Experiments card's page tests and a 30 x 16 patching sweep, both ways
#   bash scripts/device_browser.sh train     # LoRA training natively, in the page's Training card and (TORCH=1) in
#                                            # PyTorch eager (MODELS="smollm2 qwen2.5", CTXS, BATCH, STEPS)
#   bash scripts/device_browser.sh peer      # the browser peer (wllama) and the page, with and without Dawn's f16
#                                            # toggle, on the same files (MODELS="smollm2-real smollm2 qwen2.5 gemma3")
#
# Results in $OUT: log.txt, adapter.jsonl (Vulkan's 16-bit features, the page's adapter with and without Dawn's
# f16 toggle), tests.txt (pass counts), retrieval.jsonl (lab retrieval-eval, native and page), experiments.jsonl (lab
# patch, native and page), train.jsonl (lab train, native and page), bench.jsonl (native and browser JSON per model,
# the page's with its steps' GPU time by kernel family), profile_native.jsonl (the same steps natively), table.md,
# peer.jsonl (wllama and the page per file and flag set, and the lab's native greedy ids of the fixtures' prompt) and
# peer_table.md.
set -uo pipefail
D=/tmp/devb
OUT=${OUT:-/tmp/devb-out}
mkdir -p "$D" "$OUT"
mode=${1:-all}
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
# The same-shape file of model $1 at $2 (once): the real model's header and tokenizer over random blocks
# (lab/host/synthetic/sameshape.py, the header prefixes in the pieces), or a lab/host/synthetic/releases.py spec (the 2026 shelf:
# gemma4-e2b, qwen3.5-0.8b, ...) whose placeholder vocabulary the page chats with.
same_shape() {
  [ -e "$2" ] && return 0
  if [ -e "$D/heads/$1.head" ]; then
    python3 -m lab.host.synthetic.sameshape build "$D/heads/$1.head" "$2" | tee -a "$OUT/log.txt"
  else
    python3 -c "import sys; from pathlib import Path; from lab.host.synthetic import releases as synthetic
synthetic.write(sys.argv[1], Path(sys.argv[2]), vocab=True)" "$1" "$2"
  fi
}

cp -n .devbrowser/*/bundle.* .devbrowser/*/pieces.sha256 "$D/" 2>/dev/null
if [ "$mode" = piece ]; then ls -la "$D"; exit 0; fi

# 1. Assemble the pieces (once per machine).
if [ ! -e "$D/assembled" ]; then
  (cd "$D" && sha256sum -c pieces.sha256) || { log "pieces missing or damaged (see above): chain the calls"; exit 3; }
  cat "$D"/bundle.* | tar -x -C "$D" && tar -xJf "$D/core.tar.xz" -C "$D" && rm -f "$D"/bundle.* "$D/core.tar.xz" \
    && touch "$D/assembled" || { log "could not unpack the pieces"; exit 3; }
fi

# 2. Install (each call: the environment does not outlive it).
for f in "$D"/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$D"/whl/*.whl \
  || { log "wheel install failed"; exit 4; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=4
mkdir -p web/node_modules && rm -rf web/node_modules/pyodide && cp -r "$D/pyodide" web/node_modules/pyodide
# The browser peer's package where `npm ci` puts it (scripts/peer/node_modules is git-ignored, so it never travels).
PKG=scripts/peer/node_modules/@wllama/wllama
mkdir -p "$PKG" && rm -rf "$PKG/esm" && cp -r "$D/wllama/esm" "$D/wllama/package.json" "$PKG/"
# The NVIDIA ICD where the loader looks by default; VK_DRIVER_FILES would also work for the browser but takes
# SwiftShader away from it (shared/h200/browser/README.md).
mkdir -p /etc/vulkan/icd.d && cp /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
# Only the bundled libraries the system lacks, so the image's own stay in charge (glibc 2.39 there).
mkdir -p "$D/need" && rm -f "$D"/need/*
CHR=$D/chromium/chromium-headless-shell
for _ in 1 2 3 4 5 6; do
  miss=$(LD_LIBRARY_PATH=$D/need ldd "$CHR" "$D"/chromium/*.so "$D"/need/* 2>/dev/null | awk '/not found/{print $1}' | sort -u)
  [ -z "$miss" ] && break
  for l in $miss; do [ -e "$D/lib/$l" ] && ln -sf "$D/lib/$l" "$D/need/$l" || log "UNRESOLVED $l"; done
done
# dlopened, so ldd never asks: libpci (GPU info), and NSS's modules, which must sit beside the libnss3 in use.
ldconfig -p | grep -q "libpci.so.3 " || ln -sf "$D/lib/libpci.so.3" "$D/need/"
if [ -e "$D/need/libnss3.so" ]; then
  for l in libsoftokn3.so libfreebl3.so libfreeblpriv3.so libnssckbi.so libnssdbm3.so libsoftokn3.chk libfreebl3.chk \
           libfreeblpriv3.chk; do [ -e "$D/lib/$l" ] && ln -sf "$D/lib/$l" "$D/need/$l"; done
fi
export LD_LIBRARY_PATH=$D/need
log "bundled libraries in use: $(ls "$D/need" | wc -l)"
mkdir -p /tmp/fccache
sed "s|FONT_DIR|$D/fonts|" > "$D/fonts.conf" <<'EOF'
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>FONT_DIR</dir><cachedir>/tmp/fccache</cachedir></fontconfig>
EOF
export FONTCONFIG_FILE=$D/fonts.conf
# The browser and flags that give the page the NVIDIA adapter (tests/browser/conftest.py and lab bench read these);
# PAGE_FLAGS adds some, e.g. --enable-dawn-features=vulkan_enable_f16_on_nvidia (shader-f16: the f16 KV cache's box).
export LAB_CHROMIUM=$CHR
export LAB_CHROMIUM_FLAGS="--enable-unsafe-webgpu --ignore-gpu-blocklist --disable-gpu-sandbox --enable-features=Vulkan \
--use-vulkan=native --use-angle=vulkan --disable-vulkan-surface --no-sandbox --disable-background-networking \
--disable-component-update --no-first-run --disable-sync ${PAGE_FLAGS:-}"
export LLM_LAB_CACHE=$D/cache
mkdir -p "$D/cache/models" && ln -sf "$D/SmolLM2-135M-Instruct.Q4_1.gguf" "$D/cache/models/"

if [ ! -e "$D/adapter_done" ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/log.txt"
  timeout 60 python3 scripts/vk_f16.py | sed 's/^/{"vulkan": /; s/$/}/' | tee -a "$OUT/adapter.jsonl"
  timeout 120 python3 scripts/browser_adapter.py "" "--enable-dawn-features=vulkan_enable_f16_on_nvidia" \
    | tee -a "$OUT/adapter.jsonl" | cut -c1-400
  touch "$D/adapter_done"
fi

# 3. Correctness on the NVIDIA adapter: the worker's kernel checks (every case: --slow) and the chat parity with
#    llama.cpp's fixtures.
if [[ $mode == all || $mode == tests ]]; then
  log "kernel checks in the worker"
  timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE --slow tests/browser/test_kernels_in_worker.py 2>&1 \
    | tail -40 | tee -a "$OUT/tests.txt"
  log "the tensor-core GEMM's cases, with their errors"
  timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/browser/test_kernels_in_worker.py -k int8 2>&1 \
    | grep -E "matmul_i8|passed|failed|skipped|rror" | tail -30 | tee -a "$OUT/tests.txt"
  log "chat parity (greedy, llama.cpp fixtures) and seeded sampling equal to native, on the H200 page"
  timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE tests/browser/test_browser_chat.py \
    -k "llama_cpp or seeded" 2>&1 | tail -40 | tee -a "$OUT/tests.txt"
fi

# 3b. The retrieval card on this adapter: its page tests, then the index of tests/fixtures/constitution.txt natively and
#     in the page on the real SmolLM2 (windows per second, recall@1/@5 on the same 500 crops).
if [[ $mode == all || $mode == retrieval ]]; then
  log "retrieval card: page tests"
  timeout 400 python3 -m pytest -q -p no:cacheprovider -rfE tests/browser/test_retrieval_page.py 2>&1 | tail -20 \
    | tee -a "$OUT/tests.txt"
  for b in native browser; do
    log "retrieval index, $b"
    timeout 400 python3 -m lab.host.cli retrieval-eval "$D/SmolLM2-135M-Instruct.Q4_1.gguf" tests/fixtures/constitution.txt \
      --queries 500 --backend "$b" --json 2>>"$OUT/log.txt" | tee -a "$OUT/retrieval.jsonl" | cut -c1-400
  done
fi

# 3z. Any page tests on this adapter: `PYTEST_ARGS="tests/browser/test_arch_page.py" bash scripts/device_browser.sh pytest`
if [[ $mode == pytest ]]; then
  log "pytest ${PYTEST_ARGS:-}"
  timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE ${PYTEST_ARGS:-} 2>&1 | tail -30 | tee -a "$OUT/tests.txt"
fi

# 3t. Training in the page against natively (`train`): each of MODELS (default smollm2: the real file; qwen2.5 and the
#     others: the same-shape file, the real header and tokenizer over random blocks) over tests/fixtures/constitution.txt
#     at each CTXS, BATCH windows a step, STEPS steps: `lab train`, `lab train --backend browser` (the Training card's
#     own run) and, with TORCH=1, PyTorch eager (scripts/torch_train_bench.py) one after the other on the same windows:
#     tokens/s and losses, in train.jsonl.
if [[ $mode == train ]]; then
  mkdir -p "$D/ss"
  for m in ${MODELS:-smollm2}; do
    f=$D/SmolLM2-135M-Instruct.Q4_1.gguf
    if [ "$m" != smollm2 ]; then f=$D/ss/$m.gguf; same_shape "$m" "$f" || continue; fi
    for ctx in ${CTXS:-128 512}; do
      for b in native browser ${TORCH:+torch}; do
        log "training $m ctx $ctx, $b"
        if [ $b = torch ]; then
          timeout 280 python3 scripts/torch_train_bench.py "$f" --data tests/fixtures/constitution.txt --ctx "$ctx" \
            --batch "${BATCH:-4}" --rank 8 --alpha 16 --steps "${STEPS:-8}" --warmup-steps 1 2>>"$OUT/log.txt"
        else
          timeout 280 python3 -m lab.host.cli train "$f" --data tests/fixtures/constitution.txt --ctx "$ctx" \
            --batch "${BATCH:-4}" --steps "${STEPS:-8}" --backend "$b" --json \
            $([ $b = native ] && echo --out "$D/train.lora.gguf") 2>>"$OUT/log.txt"
        fi | python3 -c "import json,sys; d=json.load(sys.stdin); d.pop('profile', None); d.pop('adapter', None); \
d.update(name='$m', ctx=$ctx, backend='$b'); print(json.dumps(d))" | tee -a "$OUT/train.jsonl" | cut -c1-300
      done
    done
  done
fi

# 3c. The Experiments card on this adapter: its page tests, then the issue's sweep (SmolLM2's 30 layers x the 16
#     positions of an indirect-object prompt pair, the residual patched) natively and in the page, twice each.
if [[ $mode == all || $mode == experiments ]]; then
  log "experiments card: page tests"
  timeout 500 python3 -m pytest -q -p no:cacheprovider -rfE tests/browser/test_experiments_page.py 2>&1 | tail -20 \
    | tee -a "$OUT/tests.txt"
  for b in native browser; do
    log "patching sweep 30 x 16, $b"
    for rep in 1 2; do
      [ $b = browser ] && [ $rep = 2 ] && break     # the page's command runs it twice itself (cold, then warm)
      timeout 400 python3 -m lab.host.cli patch "$D/SmolLM2-135M-Instruct.Q4_1.gguf" \
        --clean "When John and Mary went to the old store, John gave a cold drink to" \
        --corrupt "When John and Mary went to the old store, Mary gave a cold drink to" \
        --target " Mary" --foil " John" --backend "$b" --json 2>>"$OUT/log.txt" \
        | tee -a "$OUT/experiments.jsonl" | python3 -c "import json,sys; d=json.load(sys.stdin); d.pop('recovery'); \
print(json.dumps(d)[:600])"
    done
  done
fi

# 4. Same-shape files of the real models (real header and tokenizer, random blocks), or of a lab/host/synthetic/releases.py
#    spec (MODELS="gemma4-e2b qwen3.5-0.8b": its placeholder vocabulary), each benchmarked natively and in the page.
if [[ $mode == all || $mode == bench ]]; then
  mkdir -p "$D/ss"
  for m in ${MODELS:-smollm2 qwen2.5 gemma3}; do
    f=$D/ss/$m.gguf
    same_shape "$m" "$f" || continue
    # RUNS picks what runs for each model (default "native page cold", plus int8 with INT8=1): native, page (each
    # turn after 1 s of GPU work, --warm-gpu, as native steps follow each other: an idle H200 drops to 345 MHz),
    # cold (the page's turns as typed, after a pause), int8 (the page with the tensor-core prefill), nochecks (the
    # page with Dawn's workgroup zero-fill and robustness checks off: a diagnostic a page cannot ask for).
    for run in ${RUNS:-native page cold ${INT8:+int8}}; do
      case $run in
        native)
          log "$m native"
          timeout 240 python3 -m lab.host.cli bench "$f" --prompts 128,512 --contexts 0,2048 --decode 64 --batch 512 \
            --json 2> >(tee -a "$OUT/log.txt" >&2) \
            | sed "s/^/{\"name\": \"$m\", \"backend\": \"native\", \"result\": /; s/\$/}/" | tee -a "$OUT/bench.jsonl" | cut -c1-300
          # the same steps by kernel family (lab/instruments/profile.py), to set beside the page's (`gpu` in its JSON)
          for pc in "512 0" "1 31" "1 2048"; do
            set -- $pc
            timeout 120 python3 -m lab.host.cli bench "$f" --profile --prompts "$1" --contexts "$2" 2>>"$OUT/log.txt" \
              | sed "s/^/{\"name\": \"$m\", \"t\": $1, \"pos\": $2, \"row\": /; s/\$/}/" >> "$OUT/profile_native.jsonl"
          done ;;
        page|cold|int8|nochecks)
          # --profile: the page's steps' GPU time too. Chromium's timestamps are exact only with the developer-features
          # flag (else rounded to 100 us), which changes nothing else the lab uses.
          extra=(--warm-gpu 1); tag=""
          [ $run = cold ] && extra=() && tag="-cold"
          [ $run = int8 ] && extra+=(--int8) && tag="-int8"
          [ $run = nochecks ] && extra+=(--chromium-flag=--enable-dawn-features=disable_workgroup_init,disable_robustness) \
            && tag="-nochecks"
          log "$m browser$tag"
          timeout 360 python3 -m lab.host.cli bench "$f" --backend browser --profile \
            --chromium-flag=--enable-webgpu-developer-features "${extra[@]}" --prompts 1,128,512,2048 --decode 64 --json \
            2> >(tee -a "$OUT/log.txt" >&2) \
            | sed "s/^/{\"name\": \"$m\", \"backend\": \"browser$tag\", \"result\": /; s/\$/}/" | tee -a "$OUT/bench.jsonl" | cut -c1-300 ;;
      esac
    done
  done
  python3 scripts/device_browser_table.py "$OUT/bench.jsonl" | tee "$OUT/table.md"
fi

# 5. The browser peer: wllama (llama.cpp's WebGPU backend in wasm, lab/host/bench/wllama.py) and the page on the same
#    file in the same Chromium, each with Dawn's f16 toggle (wllama's WebGPU path needs shader-f16: its best case) and
#    without it (what Chrome on Linux gives an NVIDIA card: wllama on its CPU path), every turn after 1 s of warm-up.
#    Files: the real SmolLM2 (smollm2-real; greedy ids against llama.cpp's fixtures) and the same-shape files.
#    A call holds 10 minutes: give MODELS one or two files a call (Qwen2.5 on wllama's CPU path is the slowest).
if [[ $mode == peer ]]; then
  mkdir -p "$D/ss"
  F16=--chromium-flag=--enable-dawn-features=vulkan_enable_f16_on_nvidia
  for m in ${MODELS:-smollm2-real smollm2 qwen2.5 gemma3}; do
    if [ "$m" = smollm2-real ]; then
      f=$D/SmolLM2-135M-Instruct.Q4_1.gguf
      log "$m: the lab's native greedy ids of the fixtures' raw prompt"
      timeout 120 python3 -m lab.host.cli generate "$f" --prompt "The capital of France is" --greedy -n 48 --json \
        2>>"$OUT/log.txt" | sed "s/^/{\"name\": \"$m\", \"run\": \"native-greedy\", \"result\": /; s/\$/}/" \
        >> "$OUT/peer.jsonl"
    else
      f=$D/ss/$m.gguf
      same_shape "$m" "$f" || continue
    fi
    # PEER_RUNS picks the runs: wllama-f16, wllama (no flag), page-f16, page (no flag).
    for run in ${PEER_RUNS:-wllama-f16 wllama page-f16 page}; do
      backend=browser; [[ $run == wllama* ]] && backend=wllama
      flag=(); [[ $run == *-f16 ]] && flag=("$F16")
      log "$m $run"
      timeout 300 python3 -m lab.host.cli bench "$f" --backend $backend "${flag[@]}" --warm-gpu 1 \
        --prompts 1,128,512,2048 --decode 64 --json 2> >(tee -a "$OUT/log.txt" >&2) \
        | sed "s/^/{\"name\": \"$m\", \"run\": \"$run\", \"result\": /; s/\$/}/" | tee -a "$OUT/peer.jsonl" \
        | cut -c1-300
    done
  done
  python3 scripts/device_peer_table.py "$OUT/peer.jsonl" | tee "$OUT/peer_table.md"
fi
log "done"
