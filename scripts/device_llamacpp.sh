#!/usr/bin/env bash
# Runs ON the lent H200 (no network; Python 3.12 with numpy, nvcc in /usr/local/cuda/bin, cmake, 16 cores): builds
# llama.cpp's llama-bench with CUDA from .llamacpp/llama.cpp.tar.xz (made here by scripts/device_llamacpp_prepare.sh)
# and runs it on the lab's own synthetic GGUFs (lab/host/synthetic/releases.py, with its placeholder vocabulary: llama.cpp
# refuses a file without one), the files `lab bench --synthetic NAME` runs (scripts/device_bench.sh models).
#
#   bash scripts/device_llamacpp.sh all        # build (unless built) and wait for it, then bench: one call
#   bash scripts/device_llamacpp.sh build      # unpack, configure, start the build in the background, return
#   bash scripts/device_llamacpp.sh wait [N]   # poll up to N seconds (default 540) for the build to end
#   bash scripts/device_llamacpp.sh bench      # write the GGUFs, run llama-bench on each
#
# Every call stands alone (the machine keeps its /tmp only while warm, 30 s after a call): it unpacks the source
# when /tmp/llamacpp lacks it, and skips the build when a finished llama-bench is already there. The build runs in
# its own session (setsid) writing build.log and a done-file with its exit status, so a call that ends or times out
# leaves it running; `all` starts it the same way and polls, so it can also continue in a later call.
#
# Results in $OUT: llamacpp_<model>.json (-p PP -n TG) and llamacpp_<model>_d<depth>.json (-p 0 -n TG -d depth, one
# llama-bench run and file per depth of DEPTHS), llama-bench's JSON (-o json, REPS repetitions each: samples_ts has
# every one); their stderr in llamacpp_<model>.log; build.log, configure.log, log.txt, gpu.txt.
# A depth past the model's own context ({arch}.context_length, read with gguf-py) is skipped with a log line, as
# `lab bench --contexts` skips it: llama-bench would not fail there (llama.cpp warns that n_ctx > n_ctx_train and
# runs), it would measure a context the model was not made for. A depth at the limit runs (its context is depth + TG).
# A depth costs one model load, one prefill of the depth (llama-bench keeps that state for the repetitions) and
# REPS + 1 decodes of TG tokens at it.
# Environment: MODELS (default "smollm2 qwen2.5 gemma3 llama3.2-1b llama3.1-8b"), PP (512), TG (128), DEPTHS
# (space-separated, default "2048"; DEPTH, one value, is the older name; DEPTHS="" runs none), REPS (3), NGL (99),
# THREADS (llama-bench -t, unset: its default), JOBS (16), BUILD_WAIT (seconds `all` waits for the build, 420),
# LLAMACPP_DIR (/tmp/llamacpp), SITE (where gguf-py goes, /tmp/site), LLAMACPP_CUDA=0 (a CPU build: the dry run on a
# machine without CUDA; then NGL does nothing).
set -uo pipefail
ROOT=$PWD
D=${LLAMACPP_DIR:-/tmp/llamacpp}
OUT=${OUT:-/tmp/llamacpp-out}
TAR=$ROOT/.llamacpp/llama.cpp.tar.xz
BIN=$D/build/bin/llama-bench
mkdir -p "$D" "$OUT"
mode=${1:-all}
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }

built() { [ -x "$BIN" ] && [ "$(cat "$D/build.done" 2>/dev/null)" = 0 ]; }
running() { [ -e "$D/build.pid" ] && [ ! -e "$D/build.done" ] && kill -0 "$(cat "$D/build.pid")" 2>/dev/null; }

unpack() {
  [ -f "$TAR" ] || { log "no $TAR: run scripts/device_llamacpp_prepare.sh here and carry .llamacpp"; exit 3; }
  local sum; sum=$(sha256sum "$TAR" | cut -d' ' -f1)
  if [ "$(cat "$D/src.sha256" 2>/dev/null)" != "$sum" ]; then
    log "unpacking $(stat -c %s "$TAR") bytes of source"
    rm -rf "$D/src" "$D/build" "$D/build.done" "$D/build.pid" && mkdir -p "$D/src"
    tar -xJf "$TAR" -C "$D/src" || { log "could not unpack $TAR"; exit 3; }
    echo "$sum" > "$D/src.sha256"
  fi
}

configure() {
  [ -f "$D/build/CMakeCache.txt" ] && return 0
  local cuda=(-DGGML_CUDA=OFF)
  if [ "${LLAMACPP_CUDA:-1}" != 0 ]; then
    export PATH=/usr/local/cuda/bin:$PATH
    cuda=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  fi
  log "configure: ${cuda[*]}"
  # llama-bench lives in tools/ (LLAMA_BUILD_TOOLS, which needs LLAMA_BUILD_COMMON); the unified `llama` app
  # links the server, which is not built, so it is off.
  cmake -S "$D/src" -B "$D/build" -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DGGML_NATIVE=OFF > "$D/configure.log" 2>&1
  local rc=$?
  cp "$D/configure.log" "$OUT/"
  if [ $rc != 0 ]; then rm -rf "$D/build"; log "configure failed (configure.log)"; tail -30 "$OUT/configure.log"; exit 4; fi
}

start_build() {
  if running; then log "build already running (pid $(cat "$D/build.pid"))"; return 0; fi
  unpack            # a different source tarball than the one built drops the old build
  if built; then log "llama-bench already built: $BIN"; return 0; fi
  configure
  rm -f "$D/build.done"
  [ "${LLAMACPP_CUDA:-1}" != 0 ] && export PATH=/usr/local/cuda/bin:$PATH
  setsid bash -c 'echo $$ > "$1/build.pid"; cmake --build "$1/build" -j "$2" --target llama-bench > "$1/build.log" 2>&1
                  echo $? > "$1/build.done"' _ "$D" "${JOBS:-16}" < /dev/null > /dev/null 2>&1 &
  sleep 1
  log "build started in the background (pid $(cat "$D/build.pid" 2>/dev/null)), -j ${JOBS:-16}"
}

wait_build() {   # $1: seconds at most; returns 0 once llama-bench is built
  local limit=$1 t0=$SECONDS
  while ! built; do
    if [ -e "$D/build.done" ]; then
      log "build failed (status $(cat "$D/build.done")), build.log:"; cp "$D/build.log" "$OUT/"; tail -40 "$D/build.log"
      return 1
    fi
    if ! running; then log "no build running: call build (or all)"; return 1; fi
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      log "still building after ${limit} s: $(grep -o '^\[ *[0-9]*%\]' "$D/build.log" | tail -1); call wait again"
      cp "$D/build.log" "$OUT/"
      return 2
    fi
    sleep 5
  done
  log "llama-bench built ($((SECONDS - t0)) s waited here)"
  cp "$D/build.log" "$OUT/" 2>/dev/null
  return 0
}

context_length() {   # $1: a GGUF; prints its {arch}.context_length (gguf-py), nothing when it cannot be read
  python3 -c "import sys
from gguf import GGUFReader
f = GGUFReader(sys.argv[1]).fields
arch = f['general.architecture'].contents()
print(int(f[arch + '.context_length'].contents()))" "$1" 2>/dev/null
}

bench() {
  built || { log "llama-bench is not built: call build (or all)"; return 1; }
  # the writer needs numpy (the image's) and gguf-py (.whl/, as scripts/device_bench.sh installs it)
  local site=${SITE:-/tmp/site}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$ROOT"/.whl/gguf-*.whl \
    || { log "gguf wheel install failed (carry .whl)"; return 1; }
  export PYTHONPATH=$site:$ROOT PYTHONUNBUFFERED=1
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
  "$BIN" --version > "$OUT/llamacpp_version.txt" 2>&1
  local pp=${PP:-512} tg=${TG:-128} depths=${DEPTHS-${DEPTH:-2048}} reps=${REPS:-3} ngl=${NGL:-99}
  local threads=(); [ -n "${THREADS:-}" ] && threads=(-t "$THREADS")
  mkdir -p "$D/models"
  for m in ${MODELS:-smollm2 qwen2.5 gemma3 llama3.2-1b llama3.1-8b}; do
    f=$D/models/$m.gguf
    if [ ! -e "$f.done" ]; then
      local t0=$SECONDS
      python3 -c "import sys; from pathlib import Path; from lab.host.synthetic import releases as synthetic
synthetic.write(sys.argv[1], Path(sys.argv[2]), vocab=True)" "$m" "$f" || { log "$m: writing the GGUF failed"; continue; }
      touch "$f.done"
      log "$m: $(stat -c %s "$f") bytes written in $((SECONDS - t0)) s"
    fi
    local t1=$SECONDS n_ctx_train; n_ctx_train=$(context_length "$f")
    [ -n "$n_ctx_train" ] || log "$m: its context_length could not be read: every depth runs"
    local files=("$OUT/llamacpp_$m.json")
    "$BIN" -m "$f" -ngl "$ngl" -p "$pp" -n "$tg" -r "$reps" "${threads[@]}" -o json \
      > "$OUT/llamacpp_$m.json" 2> "$OUT/llamacpp_$m.log" || log "$m: llama-bench -p $pp -n $tg failed (llamacpp_$m.log)"
    for depth in $depths; do
      case $depth in ''|*[!0-9]*) log "$m: depth '$depth' is not a token count, skipped"; continue ;; esac
      [ "$depth" -gt 0 ] || continue      # depth 0 is the -p $pp -n $tg run's tg row
      if [ -n "$n_ctx_train" ] && [ "$depth" -gt "$n_ctx_train" ]; then
        log "$m: depth $depth skipped: past the model's own context of $n_ctx_train (its context_length)"; continue
      fi
      local t2=$SECONDS
      "$BIN" -m "$f" -ngl "$ngl" -p 0 -n "$tg" -d "$depth" -r "$reps" "${threads[@]}" -o json \
        > "$OUT/llamacpp_${m}_d$depth.json" 2>> "$OUT/llamacpp_$m.log" \
        || log "$m: llama-bench -d $depth failed (llamacpp_$m.log)"
      [ "$depth" -ge 8192 ] && log "$m: llama-bench -d $depth took $((SECONDS - t2)) s"
      files+=("$OUT/llamacpp_${m}_d$depth.json")
    done
    log "$m: llama-bench done in $((SECONDS - t1)) s: $(python3 -c "
import json, sys
for p in sys.argv[1:]:
    try:
        rows = json.load(open(p))
    except Exception as exc:
        print(p.rsplit('/', 1)[-1], 'unreadable', exc); continue
    print(' '.join(f\"pp{r['n_prompt']}/tg{r['n_gen']}@{r.get('n_depth', 0)}={r['avg_ts']:.1f}\" for r in rows), end=' ')
" "${files[@]}")"
  done
}

case $mode in
  build) start_build ;;
  wait) wait_build "${2:-540}" ;;
  bench) bench ;;
  all) start_build && wait_build "${BUILD_WAIT:-420}" && bench ;;
  *) echo "usage: $0 all|build|wait [seconds]|bench" >&2; exit 2 ;;
esac
