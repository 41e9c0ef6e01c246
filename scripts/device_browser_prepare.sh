#!/usr/bin/env bash
# Runs HERE (Debian, with network): builds everything scripts/device_browser.sh needs on the lent H200, which has
# no network, and splits it into pieces that fit one device call each (64 MiB per call for the whole working tree).
#
#   scripts/device_browser_prepare.sh            # then make the device calls it prints, back to back
#
# What travels (docs/performance.md, "The page on the H200"):
#   - Chromium: Debian's chromium-headless-shell + chromium-common (the same 156.x as /usr/bin/chromium here),
#     unpacked, without the Vulkan validation layer, the mock ICD and the UI locales;
#   - the shared libraries of its dependency closure (ldd of every ELF in it, resolved on this machine, glibc
#     itself left out) plus what Chromium dlopens and ldd cannot see: libpci.so.3 (GPU info) and NSS's modules;
#   - one TTF (fonts-dejavu-core): the headless shell dies at its first page without a font configuration;
#   - Python 3.12 manylinux wheels the image lacks (native engine, page server, Playwright);
#   - the Vulkan loader debs (the device README's recipe), the Pyodide core (web/node_modules/pyodide);
#   - the header prefixes of the three real models (lab/host/synthetic/sameshape.py rebuilds same-shape files there),
#     and the real SmolLM2 file for the chat parity test against the llama.cpp fixtures;
#   - the browser peer's package (npm @wllama/wllama, installed in scripts/peer by `npm ci`): its esm/ folder, the
#     module and its wasm, all the peer bench page loads (`device_browser.sh peer`).
# Pieces land in .devbrowser/N/ (git-ignored through .git/info/exclude, never committed).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
W=${PREP_DIR:-/tmp/lab-devbrowser-prep}
# bytes per piece: the 64 MiB a call carries less the tracked working tree (23 MB on 2026-12-03) and a 4 MB margin
CHUNK=${CHUNK:-$(( 67108864 - $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) - 4000000 ))}
XZ=${XZ:-xz -T2 -1}               # -1: minutes on a busy 2-core machine (-6 took 4x longer); 123 MB of Chromium etc.
MODELS=${LLM_LAB_CACHE:-$HOME/.cache/llm-lab}/models
SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
WHEELS="wgpu==0.32.0 cffi==1.17.1 pycparser==3.12 rendercanvas==2.7.2 gguf==0.19.0 playwright==1.64.1 greenlet==3.5.6
        pyee==13.0.0 starlette==1.10.0 uvicorn==0.54.0 sniffio==1.3.1"
GL_DEBS="libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2"

mkdir -p "$W/debs" "$W/whl" "$W/gl"
rm -rf "$W/stage" && mkdir -p "$W/stage/lib" "$W/stage/fonts" "$W/stage/heads" "$W/outer/whl" "$W/outer/gl"

echo "== Chromium (Debian packages)"
(cd "$W/debs" && ls chromium-headless-shell_*.deb chromium-common_*.deb libpci3_*.deb >/dev/null 2>&1 ||
  apt-get download chromium-headless-shell chromium-common libpci3)
rm -rf "$W/x" && mkdir "$W/x"
for d in "$W"/debs/chromium-headless-shell_*.deb "$W"/debs/chromium-common_*.deb "$W"/debs/libpci3_*.deb; do dpkg -x "$d" "$W/x"; done
mv "$W/x/usr/lib/chromium" "$W/stage/chromium"
# Not needed to run pages: Vulkan's validation layer (23 MB), the mock ICD, the full browser's UI locales.
rm -f "$W"/stage/chromium/libVkLayer_khronos_validation.so* "$W"/stage/chromium/libVkICD_mock_icd.so*
find "$W/stage/chromium/locales" -type f ! -name 'en-US*' -delete 2>/dev/null || true

echo "== library closure"
# libpci (dlopened for GPU info) and NSS's modules (dlopened by libnss3) are invisible to ldd of the binary.
cp -L "$W"/x/usr/lib/x86_64-linux-gnu/libpci.so.3 "$W/stage/lib/"
for l in libsoftokn3.so libfreebl3.so libfreeblpriv3.so libnssckbi.so libnssdbm3.so libsoftokn3.chk \
         libfreebl3.chk libfreeblpriv3.chk libsqlite3.so.0; do
  for dir in /usr/lib/x86_64-linux-gnu/nss /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu; do
    if [ -e "$dir/$l" ]; then cp -L "$dir/$l" "$W/stage/lib/"; break; fi
  done
done
# glibc's own libraries stay behind: the device's (2.39) is newer than this machine's, which built these.
skip='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|linux-vdso)\.so'
elfs=$(find "$W/stage/chromium" "$W/stage/lib" -type f \( -name '*.so*' -o -perm -u+x \) | xargs file | grep ELF | cut -d: -f1)
ldd $elfs 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  [ -e "$W/stage/chromium/$name" ] && continue        # Chromium's own (libvulkan, ANGLE's libEGL/libGLESv2)
  [ -e "$W/stage/lib/$name" ] || cp -L "$path" "$W/stage/lib/$name"
done
echo "libraries: $(ls "$W/stage/lib" | wc -l), $(du -sh "$W/stage/lib" | cut -f1)"

echo "== fonts"
cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf "$W/stage/fonts/"

echo "== Pyodide core, header prefixes"
cp -r web/node_modules/pyodide "$W/stage/pyodide"
for m in smollm2 qwen2.5 gemma3; do
  PYTHONPATH=$ROOT .venv/bin/python -c "
import sys; from lab.host import models; from lab.host.synthetic import sameshape
open(sys.argv[2], 'wb').write(sameshape.header_prefix(models.path(sys.argv[1])))" "$m" "$W/stage/heads/$m.head"
done
ls -la "$W/stage/heads"

echo "== the browser peer (scripts/peer's package, esm/ only)"
[ -e scripts/peer/node_modules/@wllama/wllama/esm/wasm/wllama.wasm ] || (cd scripts/peer && npm ci --no-audit --no-fund)
mkdir -p "$W/stage/wllama"
cp -r scripts/peer/node_modules/@wllama/wllama/esm scripts/peer/node_modules/@wllama/wllama/package.json "$W/stage/wllama/"

echo "== compressing ($XZ)"
tar -C "$W/stage" -cf - chromium lib fonts pyodide heads wllama | $XZ > "$W/outer/core.tar.xz"
ls -la "$W/outer/core.tar.xz"

echo "== wheels (Python 3.12, manylinux x86_64) and the Vulkan loader debs"
for p in $WHEELS; do
  ls "$W/whl/${p%%==*}-${p##*==}-"*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$W/whl" "$p"
done
cp "$W"/whl/*.whl "$W/outer/whl/"
(cd "$W/gl" && for p in $GL_DEBS; do ls ${p}_*.deb >/dev/null 2>&1 || apt-get download "$p"; done)
cp "$W"/gl/*.deb "$W/outer/gl/"
cp "$MODELS/$SMOL" "$W/outer/$SMOL"

echo "== pieces"
grep -qx '/.devbrowser/' .git/info/exclude 2>/dev/null || echo '/.devbrowser/' >> .git/info/exclude
rm -rf .devbrowser && mkdir .devbrowser
tar -C "$W/outer" -cf - core.tar.xz whl gl "$SMOL" | split -b "$CHUNK" -d -a 2 - "$W/bundle."
n=0
for f in "$W"/bundle.*; do
  n=$((n + 1)); mkdir -p ".devbrowser/$n"; mv "$f" ".devbrowser/$n/"
done
(cd .devbrowser && sha256sum */bundle.* | sed 's| [0-9]*/| |' > "$W/pieces.sha256")
for i in $(seq 1 $n); do cp "$W/pieces.sha256" ".devbrowser/$i/"; done
du -sh .devbrowser/*
git status --porcelain --ignored .devbrowser | head -3

echo
echo "== device calls: make them back to back (the machine keeps /tmp only while it is warm, 30 s after a call)"
for i in $(seq 1 $((n - 1))); do
  echo "run(kind=nvidia-h200, carry=[\".devbrowser/$i\"], timeout_s=120, command=\"bash scripts/device_browser.sh piece\")"
done
echo "run(kind=nvidia-h200, carry=[\".devbrowser/$n\"], timeout_s=600, command=\"bash scripts/device_browser.sh all\")"
echo "   (or, to split the work: ... command=\"bash scripts/device_browser.sh tests\", then \"... bench\")"
echo "   (the browser peer: ... command=\"MODELS=smollm2-real bash scripts/device_browser.sh peer\", one call per file;"
echo "    then python3 scripts/device_peer_table.py peer.jsonl)"
