#!/bin/sh
# include/safetensors.h is exactly what cbindgen makes of rust/capi (rust/capi/cbindgen.toml):
# regenerates it into a temporary file and compares. The header is generated with the cbindgen
# version below (other versions lay it out differently), which .ci/run installs; without it the
# test is skipped (exit 77), except under CI (CI=true).
#   check_header.sh SOURCE_DIR
set -eu
cbindgen_version=0.29.4
src="$1"
cbindgen="$(command -v cbindgen || true)"
[ -n "$cbindgen" ] || [ ! -x "$HOME/.cargo/bin/cbindgen" ] || cbindgen="$HOME/.cargo/bin/cbindgen"
have="$([ -n "$cbindgen" ] && "$cbindgen" --version 2>/dev/null || true)"
if [ "$have" != "cbindgen $cbindgen_version" ]; then
  echo "skipped: needs cbindgen $cbindgen_version (cargo install --locked cbindgen --version $cbindgen_version); found '${have:-none}'"
  [ "${CI:-}" = true ] && exit 1
  exit 77
fi
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
"$cbindgen" --quiet --config "$src/rust/capi/cbindgen.toml" --crate safetensors-capi --output "$out" "$src/rust/capi"
if ! diff -u "$src/include/safetensors.h" "$out"; then
  echo "include/safetensors.h is stale: regenerate it with"
  echo "  cbindgen --config rust/capi/cbindgen.toml --crate safetensors-capi --output include/safetensors.h rust/capi"
  exit 1
fi
echo "ok: include/safetensors.h is what $have makes of rust/capi"
