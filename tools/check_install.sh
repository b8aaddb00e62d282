#!/usr/bin/env bash
# Install a configured build tree into BUILD/_install and build the README's
# example (examples/hello.c) against it, as a user would: once through
# find_package(fa3c) and once through pkg-config. Usage: check_install.sh BUILD
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
case $build in /*) prefix=$build/_install ;; *) prefix=$PWD/$build/_install ;; esac   # BUILD may be absolute
rm -rf "$prefix" "$build/_consumer"
cmake --install "$build" --prefix "$prefix" > /dev/null

echo "-- find_package(fa3c)"
cmake -S examples -B "$build/_consumer" -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$build/_consumer" > /dev/null
"$build/_consumer/hello"

echo "-- pkg-config fa3c"
if command -v pkg-config > /dev/null; then
    # The .pc finds its prefix relative to its own location (${pcfiledir}), so an
    # install moved with --prefix must work as shipped: no --define-prefix here.
    pc() { PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib64/pkgconfig" pkg-config "$@" fa3c; }
    libdir=$(pc --variable=libdir)
    # shellcheck disable=SC2046  # pkg-config prints flags meant to be split
    cc -std=c11 -o "$build/_consumer/hello_pc" examples/hello.c $(pc --cflags --libs) -lm -Wl,-rpath,"$libdir"
    "$build/_consumer/hello_pc"
else
    echo "pkg-config not installed: skipped"
fi
