#!/bin/sh
# A C program built with nothing but the compiler and pkg-config against the installed package
# (safetensors-c.pc), then run.
#   pkg_config.sh CC PKG_CONFIG_DIR main.c WORK_DIR
set -eu
cc="$1" pcdir="$2" main="$3" work="$4"
mkdir -p "$work"
flags="$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs safetensors-c)"
echo "$cc -std=c99 -Wall -Wextra -Werror -pedantic $main $flags"
# shellcheck disable=SC2086 # the flags are words
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic "$main" $flags -o "$work/consumer_c"
"$work/consumer_c" "$work"
