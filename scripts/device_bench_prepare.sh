#!/usr/bin/env bash
# Runs HERE (Debian, with network): what scripts/device_bench.sh and scripts/device_h200.sh need on the lent H200,
# which has no network: the Vulkan loader debs (.gl/, the device README's recipe) and the Python 3.12 wheels the
# image lacks (.whl/: the native engine's wgpu and its needs, gguf for the synthetic models). Both folders are
# git-ignored (.git/info/exclude) and travel with `carry`:
#   scripts/device_bench_prepare.sh
#   run(carry=[".gl", ".whl"], timeout_s=600, command="bash scripts/device_bench.sh tests,kernels,models")
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="wgpu==0.32.0 cffi==1.17.1 pycparser==3.12 rendercanvas==2.7.2 gguf==0.19.0"
GL_DEBS="libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2"
mkdir -p .git/info
for d in /.gl/ /.whl/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
mkdir -p .gl .whl /tmp/amd64/partial
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
ls /tmp/amd64/*Packages* >/dev/null 2>&1 || apt-get $o update -q
(cd .gl && for p in $GL_DEBS; do ls "${p}"_*.deb >/dev/null 2>&1 || apt-get $o download "$p"; done)
for p in $WHEELS; do
  ls ".whl/${p%%==*}-${p##*==}-"*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$p"
done
du -sh .gl .whl
