#!/bin/sh
# Builds the Go (cgo) consumer of the C API against include/safetensors.h and libsafetensors.so,
# then runs it. Skipped (exit 77) when `go` is not on PATH. Offline: no module is fetched.
#   run.sh INCLUDE_DIR LIBRARY_DIR WORK_DIR
set -eu
if ! command -v go >/dev/null 2>&1; then
  echo "skipped: no Go toolchain on PATH (the cgo consumer needs one)"
  exit 77
fi
include="$1" libdir="$2" work="$3"
mkdir -p "$work"
cd "$(dirname "$0")"
export CGO_ENABLED=1 GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOCACHE="$work/cache"
export CGO_CFLAGS="-I$include" CGO_LDFLAGS="-L$libdir -lsafetensors -Wl,-rpath,$libdir"
go build -o "$work/consumer" .
"$work/consumer" "$work"
