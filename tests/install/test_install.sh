#!/usr/bin/env bash
# test_install.sh BUILD_DIR C_COMPILER - installs a PersistentKV build into a fresh prefix and uses it as
# a project outside the repository would: tests/install/consumer.c built by CMake with
# find_package(PersistentKV) and by the compiler with pkg-config's flags, both run; then the installed
# pkv tool (the lab linked in statically) runs from the prefix.
set -euo pipefail
build=${1:?usage: test_install.sh BUILD_DIR C_COMPILER}
cc=${2:?usage: test_install.sh BUILD_DIR C_COMPILER}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

echo "== cmake --install into a fresh prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
libdir=$(dirname "$(find "$prefix" -name 'libpersistentkv.so' | head -n 1)")
for f in include/persistentkv.h bin/pkv; do
  [ -e "$prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done
for f in libpersistentkv.so cmake/PersistentKV/PersistentKVConfig.cmake cmake/PersistentKV/PersistentKVConfigVersion.cmake \
         pkgconfig/persistentkv.pc; do
  [ -e "$libdir/$f" ] || { echo "missing after install: $libdir/$f"; exit 1; }
done
echo "installed: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

echo "== find_package(PersistentKV) from a separate CMake project"
cmake -S "$here" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" >"$tmp/consumer.log" 2>&1 &&
  cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; exit 1; }
"$tmp/consumer/consumer"
if [ -x "$tmp/consumer/consumer_cpp" ]; then "$tmp/consumer/consumer_cpp"; else echo "SKIP: no C++ compiler; the C++ consumer did not run"; fi
# a version the package does not satisfy is refused
mkdir -p "$tmp/old"
printf 'cmake_minimum_required(VERSION 3.24)\nproject(p LANGUAGES C)\nfind_package(PersistentKV 9.0 REQUIRED)\n' \
  >"$tmp/old/CMakeLists.txt"
if cmake -S "$tmp/old" -B "$tmp/old/b" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/old.log" 2>&1; then
  echo "find_package(PersistentKV 9.0) was accepted by version $(grep -m1 PACKAGE_VERSION "$libdir/cmake/PersistentKV/PersistentKVConfigVersion.cmake")"
  exit 1
fi
echo "find_package(PersistentKV 9.0): refused, as it should be"

echo "== pkg-config"
if command -v pkg-config >/dev/null; then
  flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs persistentkv)
  echo "pkg-config --cflags --libs persistentkv: $flags"
  # shellcheck disable=SC2086
  "$cc" -std=c11 -o "$tmp/consumer_pc" "$here/consumer.c" $flags -lm -Wl,-rpath,"$libdir"
  "$tmp/consumer_pc"
else
  echo "SKIP: pkg-config not found; the pkg-config build of the consumer did not run"
fi

echo "== the installed pkv tool"
needed=$(readelf -d "$prefix/bin/pkv" 2>/dev/null | grep -E "NEEDED" || true)
case "$needed" in *persistentkv*) echo "installed pkv loads a PersistentKV library (it should carry its own): $needed"; exit 1 ;; esac
"$prefix/bin/pkv" check --backend cpu --count 2 | tail -n 1
echo "== the Python binding from an environment the library was installed into"
if command -v python3 >/dev/null && python3 -m venv --without-pip "$tmp/venv" 2>/dev/null; then
  cmake --install "$build" --prefix "$tmp/venv" >/dev/null
  mkdir -p "$tmp/site" && cp -r "$here/../../python/persistentkv" "$tmp/site/"  # as pip would place it
  got=$(env -u PKV_LIBRARY PYTHONPATH="$tmp/site" PYTHONDONTWRITEBYTECODE=1 "$tmp/venv/bin/python" -c \
        "import persistentkv as p; print(p.library_path); print(p.status_string(p.Status.PAGE_OUT_OF_RANGE))")
  echo "$got"
  case "$got" in "$tmp/venv/lib"*"/libpersistentkv.so"*"page id out of range"*) ;;
    *) echo "the binding did not load the library installed into its environment"; exit 1 ;; esac
else
  echo "SKIP: python3 -m venv is not available; the installed-binding check did not run"
fi
echo "test_install: passed"
