#!/usr/bin/env bash
# Runs HERE: packs llama.cpp's source for scripts/device_llamacpp.sh, which builds it with CUDA on the lent H200
# (no network there) and benchmarks it on the lab's own synthetic GGUFs (docs/performance.md, "llama.cpp CUDA on
# the same files").
#
#   scripts/device_llamacpp_prepare.sh      # then make the device calls it prints
#
# The source is the llama.cpp that llama-cpp-python 0.3.36 vendors (the one scripts/make_fixtures.py and the
# perplexity fixture use): /root/ref/llama_cpp_python-0.3.36/vendor/llama.cpp, else (LLAMACPP_SRC unset and that
# folder missing) the sdist from `pip download`. Trimmed of what a CUDA build of llama-bench never reads: docs/,
# models/ (vocabulary files; src/models/ stays), benches/, scripts/, media/, tests/*.cpp, any build/ folder, the
# contents of the ggml backends other than ggml-cpu and ggml-cuda, and tools/ui and tools/server (added only with
# LLAMA_BUILD_SERVER). Result: .llamacpp/llama.cpp.tar.xz (git-ignored), which must stay under ~10 MB so that it
# travels in one call next to .gl and .whl.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
W=${PREP_DIR:-/tmp/lab-llamacpp-prep}
SRC=${LLAMACPP_SRC:-/root/ref/llama_cpp_python-$VERSION/vendor/llama.cpp}
XZ=${XZ:-xz -T2 -6}
mkdir -p "$W" .llamacpp

if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "== $SRC missing: llama-cpp-python==$VERSION's sdist"
  ls "$W"/llama_cpp_python-$VERSION.tar.gz >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --no-binary :all: -d "$W" "llama-cpp-python==$VERSION"
  rm -rf "$W/sdist" && mkdir "$W/sdist"
  tar -xzf "$W/llama_cpp_python-$VERSION.tar.gz" -C "$W/sdist"
  SRC=$W/sdist/llama_cpp_python-$VERSION/vendor/llama.cpp
fi
echo "== source: $SRC ($(du -sh "$SRC" | cut -f1))"

# Every backend folder but the two a CUDA build compiles (ggml/src/CMakeLists.txt adds the others only when asked).
backends=$(cd "$SRC/ggml/src" && for d in ggml-*/; do d=${d%/}; case $d in ggml-cpu|ggml-cuda) ;; *) echo "$d";; esac; done)
excl=(--exclude=./build --exclude='./build-*' --exclude=./docs --exclude=./models --exclude=./benches
      --exclude=./scripts --exclude=./media --exclude='./tests/*.cpp' --exclude=./tools/ui --exclude=./tools/server
      --exclude=./.git --exclude=./.github)
for d in $backends; do excl+=("--exclude=./ggml/src/$d/*"); done
tar -C "$SRC" --anchored "${excl[@]}" -cf - . | $XZ > .llamacpp/llama.cpp.tar.xz.tmp
mv .llamacpp/llama.cpp.tar.xz.tmp .llamacpp/llama.cpp.tar.xz
size=$(stat -c %s .llamacpp/llama.cpp.tar.xz)
echo "== .llamacpp/llama.cpp.tar.xz: $size bytes ($(tar -tJf .llamacpp/llama.cpp.tar.xz | wc -l) entries)"
if [ "$size" -gt 10000000 ]; then echo "too large for one call next to .gl and .whl: trim more" >&2; exit 1; fi
sha256sum .llamacpp/llama.cpp.tar.xz | tee .llamacpp/llama.cpp.tar.xz.sha256

# device_llamacpp.sh writes the GGUFs with lab/host/synthetic/releases.py there: gguf-py comes from .whl/ (numpy is in the
# image), as scripts/device_bench.sh installs it.
if ! ls .whl/gguf-*.whl >/dev/null 2>&1; then
  echo "== gguf wheel missing from .whl/: fetching gguf==0.19.0"
  mkdir -p .whl && python3 -m pip download -q --no-deps --only-binary=:all: -d .whl gguf==0.19.0
fi
ls .whl/gguf-*.whl
git check-ignore -q .llamacpp/llama.cpp.tar.xz || echo "warning: .llamacpp/ is not git-ignored" >&2

cat <<'EOF'

== device calls (carry .llamacpp, .whl; the machine keeps /tmp only 30 s after a call, so each call stands alone):
run(kind="nvidia-h200", carry=[".llamacpp", ".whl"], timeout_s=600, command="bash scripts/device_llamacpp.sh all")
   # build (about 4 min with -j16) and bench in one call; results in $OUT: llamacpp_*.json, build.log, log.txt
   # or split, back to back (the build in /tmp/llamacpp survives while the machine stays warm):
run(kind="nvidia-h200", carry=[".llamacpp", ".whl"], timeout_s=120, command="bash scripts/device_llamacpp.sh build")
run(kind="nvidia-h200", carry=[".llamacpp", ".whl"], timeout_s=600, command="bash scripts/device_llamacpp.sh wait 540")
run(kind="nvidia-h200", carry=[".llamacpp", ".whl"], timeout_s=600, command="bash scripts/device_llamacpp.sh bench")
   # the lab's side on the same files (all five; MODELS='smollm2 llama3.2-1b llama3.1-8b' ... for fewer):
run(kind="nvidia-h200", carry=[".gl", ".whl"], timeout_s=600, command="bash scripts/device_bench.sh models")
   # then here, with both calls' files in one folder:
python3 scripts/h200_table.py DIR
EOF
