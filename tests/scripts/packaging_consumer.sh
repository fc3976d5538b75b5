#!/bin/sh
# packaging_consumer.sh SOURCE_DIR BUILD_DIR: what a C or C++ user of an installed onebit gets.
# `cmake --install` of the build tree into a fresh prefix must hold every shipped library,
# onebit-info, the headers, onebitConfig.cmake with its version file, and onebit.pc; then the
# external project tests/packaging/consumer finds it with find_package(onebit 0.2), links
# onebit::onebit and runs a 2-rank allreduce; a find_package(onebit 99) must fail (the version file
# decides); and the same program built with `pkg-config --cflags --libs onebit` runs too.
set -eu
src=$1 build=$2
work=$build/packaging-consumer
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }

libdir=$(cd "$prefix" && ls -d lib* | head -n 1)
for f in "$libdir/libonebit.so" "$libdir/libnccl-net-onebit.so" bin/onebit-info include/onebit/onebit.h \
         include/onebit/onebit_types.h \
         "$libdir/cmake/onebit/onebitConfig.cmake" "$libdir/cmake/onebit/onebitConfigVersion.cmake" \
         "$libdir/pkgconfig/onebit.pc"; do
  [ -e "$prefix/$f" ] || { echo "FAIL: cmake --install left no $f in the prefix"; find "$prefix"; exit 1; }
done
# The front doors the build made are installed too (the build tree's configure decided which).
for door in libonebit-nccl-preload.so libonebit-preload.so; do
  if [ -e "$build/$door" ] && [ ! -e "$prefix/$libdir/$door" ]; then
    echo "FAIL: $door was built but not installed"; exit 1
  fi
done
"$prefix/bin/onebit-info" >"$work/info.txt" 2>&1 || { echo "FAIL: the installed onebit-info"; cat "$work/info.txt"; exit 1; }

cmake -S "$src/tests/packaging/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  >"$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; exit 1; }
cmake --build "$work/consumer" >>"$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; exit 1; }
"$work/consumer/allreduce2"

if cmake -S "$src/tests/packaging/consumer" -B "$work/too-new" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
     -DONEBIT_WANT_VERSION=99 >"$work/too-new.log" 2>&1; then
  echo "FAIL: find_package(onebit 99) succeeded against onebit $(grep -o 'PACKAGE_VERSION "[^"]*"' \
    "$prefix/$libdir/cmake/onebit/onebitConfigVersion.cmake")"
  exit 1
fi
grep -q "onebitConfig.cmake, version: 0.2" "$work/too-new.log" ||
  { echo "FAIL: find_package(onebit 99) failed without naming the version found:"; cat "$work/too-new.log"; exit 1; }

export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs onebit)
pc_include=$(realpath "$(pkg-config --variable=includedir onebit)")
pc_lib=$(realpath "$(pkg-config --variable=libdir onebit)")
if [ "$pc_include" != "$(realpath "$prefix/include")" ] || [ "$pc_lib" != "$(realpath "$prefix/$libdir")" ]; then
  echo "FAIL: onebit.pc points at $pc_include and $pc_lib, not into the prefix $prefix"; exit 1
fi
case "$flags" in
  *-lonebit*) ;;
  *) echo "FAIL: pkg-config --cflags --libs onebit gave '$flags', without -lonebit"; exit 1 ;;
esac
# shellcheck disable=SC2086  # the flags are words
cc -o "$work/allreduce2-pc" "$src/tests/packaging/consumer/allreduce2.c" $flags \
  -Wl,-rpath,"$pc_lib"
"$work/allreduce2-pc"
echo "OK: cmake --install, find_package(onebit) -> onebit::onebit, the version check and pkg-config all work from $prefix"
