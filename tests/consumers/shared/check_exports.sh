#!/bin/sh
# The shared library exports only our API: the bridge's C++ functions (safetensors::), the C++ half
# of cxx's runtime the headers call (rust::cxxbridge1::), and the version symbol. Nothing of Rust's
# std, serde, or cxx's Rust-side runtime (cxxbridge1$...), which would collide with other
# Rust libraries in the same program. Also checks the soname.
set -eu
lib="$1"
exports=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//')
count=$(printf '%s\n' "$exports" | grep -c .)
others=$(printf '%s\n' "$exports" | c++filt | grep -v -e '^safetensors::' -e '^rust::cxxbridge1::' \
  -e '^safetensors_library_v' -e '^typeinfo for rust::cxxbridge1::' -e '^typeinfo name for rust::cxxbridge1::' \
  -e '^vtable for rust::cxxbridge1::' -e '^SAFETENSORS_0$' || true)
if [ -n "$others" ]; then
  echo "unexpected exports:"; printf '%s\n' "$others" | head -20; exit 1
fi
printf '%s\n' "$exports" | grep -q '^safetensors_library_v' || { echo "the version symbol is not exported"; exit 1; }
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
case "$soname" in
  libsafetensors.so.*) ;;
  *) echo "unexpected soname '$soname'"; exit 1 ;;
esac
echo "ok: $count exports, all ours; soname $soname"
