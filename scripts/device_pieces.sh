# Sourced by the device scripts whose files are too large for one call (64 MiB a call for the whole working tree):
# files cut into pieces here, one piece a call there, the calls chained back to back (the machine keeps /tmp only
# while it is warm: 30 s after a call).
#
#   make_pieces DIR CHUNK SRC FILES...   here: FILES of folder SRC as one tar cut into DIR/1, DIR/2, ... (git-ignored),
#                                        each piece with the checksums of all; then the .gl and .whl folders
#                                        (scripts/device_bench_prepare.sh) and the device calls to make, printed
#   take_pieces DIR D                    there: keep this call's piece of DIR in D; with all of them, unpack into
#                                        D/models (returns 3 while pieces are missing)

make_pieces() {
  local dir=$1 chunk=$2 src=$3 script=$4
  shift 4
  bash scripts/device_bench_prepare.sh
  grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
  local w n=0
  w=$(mktemp -d)
  rm -rf "$dir" && mkdir "$dir"
  tar -C "$src" -cf - "$@" | split -b "$chunk" -d -a 2 - "$w/bundle."
  for f in "$w"/bundle.*; do n=$((n + 1)); mkdir -p "$dir/$n"; mv "$f" "$dir/$n/"; done
  (cd "$dir" && sha256sum */bundle.* | sed 's| [0-9]*/| |' > "$w/pieces.sha256")
  for i in $(seq 1 $n); do cp "$w/pieces.sha256" "$dir/$i/"; done
  rm -rf "$w"
  du -sh "$dir"
  echo "== device calls: back to back (the machine keeps /tmp only while it is warm, 30 s after a call)"
  for i in $(seq 1 $((n - 1))); do
    echo "run(carry=[\"$dir/$i\"], timeout_s=60, command=\"bash $script piece\")"
  done
  echo "run(carry=[\"$dir/$n\", \".gl\", \".whl\"], timeout_s=600, command=\"bash $script run\")"
}

take_pieces() {
  local dir=$1 d=$2
  mkdir -p "$d"
  cp -n "$dir"/*/bundle.* "$dir"/*/pieces.sha256 "$d/" 2>/dev/null
  (cd "$d" && sha256sum -c --quiet pieces.sha256 2>/dev/null) || return 3
  [ -d "$d/models" ] || { mkdir -p "$d/models" && cat "$d"/bundle.* | tar -x -C "$d/models"; } || return 3
}

# On the lent GPU, the start of a chained native run (device_training.sh, device_retrieval.sh): with MODE `piece`,
# keep this call's piece and exit; otherwise assemble the pieces and make the native set-up (device_native.sh), or
# exit saying why.
#   pieces_then_native FOLDER DIR MODE
pieces_then_native() {
  if [ "$3" = piece ]; then take_pieces "$1" "$2"; ls -la "$2"; exit 0; fi
  take_pieces "$1" "$2" || { echo "pieces missing or damaged: chain the calls"; exit 3; }
  source scripts/device_native.sh
  native_env || exit 4
}
