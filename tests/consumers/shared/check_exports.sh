#!/bin/sh
# The shared library exports only our API: the bridge's C++ functions (safetensors::), the C++ half
# of cxx's runtime the headers call (rust::cxxbridge1::), the version symbol, and the C API's
# functions (st_*). Nothing of Rust's std, serde, or cxx's Rust-side runtime (cxxbridge1$...),
# which would collide with other Rust libraries in the same program. Also checks the soname, and,
# given the C header, that the st_* functions exported are exactly those it declares.
#   check_exports.sh LIBRARY [include/safetensors.h]
set -eu
lib="$1"
header="${2:-}"
exports=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//')
count=$(printf '%s\n' "$exports" | grep -c .)
others=$(printf '%s\n' "$exports" | c++filt | grep -v -e '^safetensors::' -e '^rust::cxxbridge1::' \
  -e '^safetensors_library_v' -e '^typeinfo for rust::cxxbridge1::' -e '^typeinfo name for rust::cxxbridge1::' \
  -e '^vtable for rust::cxxbridge1::' -e '^SAFETENSORS_0$' -e '^st_[a-z0-9_]*$' || true)
if [ -n "$others" ]; then
  echo "unexpected exports:"; printf '%s\n' "$others" | head -20; exit 1
fi
printf '%s\n' "$exports" | grep -q '^safetensors_library_v' || { echo "the version symbol is not exported"; exit 1; }
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
case "$soname" in
  libsafetensors.so.*) ;;
  *) echo "unexpected soname '$soname'"; exit 1 ;;
esac
c_api=""
if [ -n "$header" ]; then
  # Declarations start a line with their return type; the header's static inline helpers are
  # defined there, not exported.
  declared=$(grep -v '^static' "$header" | sed -n 's/^[a-z][a-z0-9_ *]*[ *]\(st_[a-z0-9_]*\)(.*/\1/p' | sort -u)
  exported=$(printf '%s\n' "$exports" | grep '^st_' | sort -u || true)
  missing=$(printf '%s\n' "$declared" | grep -vxF -e "$exported" || true)
  extra=$(printf '%s\n' "$exported" | grep -vxF -e "$declared" || true)
  if [ -n "$missing" ] || [ -n "$extra" ]; then
    echo "the C API's exports and $header disagree"
    [ -z "$missing" ] || { echo "declared, not exported:"; printf '%s\n' "$missing"; }
    [ -z "$extra" ] || { echo "exported, not declared:"; printf '%s\n' "$extra"; }
    exit 1
  fi
  c_api=", $(printf '%s\n' "$declared" | grep -c .) of them the C API's st_* functions, as declared"
fi
echo "ok: $count exports, all ours$c_api; soname $soname"
