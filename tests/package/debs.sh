#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make package` end to end, without touching the machine's system dirs:
# builds the four .debs, checks their Depends, unpacks them (dpkg-deb -x)
# into one scratch root, and uses that root as each package's user would:
# a find_package(kvxfer) consumer (tests/install/consumer), `kvxfer info`,
# and `import kvxfer`. Then lintian, which must report no errors.
#   debs.sh SOURCE_DIR WORK_DIR VERSION [BUILD_DIR]
# BUILD_DIR: the package tree to build in (default WORK_DIR/build); the pip
# test builds the wheel in the same tree afterwards, reusing its objects.
set -euo pipefail
src=$1 work=$2 version=$3
build=${4:-$work/build}
deb_version="$version-1"
soversion=${version%%.*}

rm -rf "$work/root" "$work/consumer" "$work/elsewhere"
mkdir -p "$work/root" "$work/elsewhere"
unset PYTHONPATH LD_LIBRARY_PATH MAKEFLAGS MFLAGS

rm -f "$build"/*.deb
make -C "$src" --no-print-directory package PKG_BUILD="$build" NO_DEPS=1
shopt -s nullglob
debs=("$build"/*.deb)
[ ${#debs[@]} -eq 4 ] || { echo "expected 4 packages, got: ${debs[*]}"; exit 1; }

# What each package must depend on (a substring of its Depends line).
declare -A needs=(
  [libkvxfer$soversion]="libucx0"
  [libkvxfer-dev]="libkvxfer$soversion (= $deb_version)"
  [python3-kvxfer]="libkvxfer$soversion (= $deb_version)|python3 (|python3-numpy"
  [kvxfer]="libkvxfer$soversion (= $deb_version)|libucx0"
)
for deb in "${debs[@]}"; do
  name=$(dpkg-deb -f "$deb" Package)
  depends=$(dpkg-deb -f "$deb" Depends)
  echo "== $(basename "$deb"): Depends: $depends"
  [ -n "${needs[$name]+x}" ] || { echo "unexpected package $name"; exit 1; }
  IFS='|' read -ra wanted <<< "${needs[$name]}"
  for w in "${wanted[@]}"; do
    [[ "$depends" == *"$w"* ]] || { echo "$name: Depends lacks '$w'"; exit 1; }
  done
  [ -f "$work/root/usr/share/doc/$name/copyright" ] || dpkg-deb -x "$deb" "$work/root"
  [ -f "$work/root/usr/share/doc/$name/copyright" ] || { echo "$name: no copyright file"; exit 1; }
done

root=$work/root
libdir=$(dirname "$(find "$root/usr/lib" -name "libkvxfer.so.$soversion" | head -n1)")
[ -f "$libdir/libkvxfer.so.$soversion" ] || { echo "no libkvxfer.so.$soversion in $root"; exit 1; }
export LD_LIBRARY_PATH=$libdir

# libkvxfer-dev: find_package(kvxfer) against the unpacked root.
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$root/usr" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"

# kvxfer: the tool runs, and says it runs the packaged library.
info=$("$root/usr/bin/kvxfer" info)
echo "$info"
grep -qx "library: $libdir/libkvxfer.so.$soversion" <<< "$info" \
  || { echo "kvxfer info does not name $libdir/libkvxfer.so.$soversion"; exit 1; }

# python3-kvxfer: import from the unpacked dist-packages, from elsewhere.
cd "$work/elsewhere"
PYTHONPATH=$root/usr/lib/python3/dist-packages /usr/bin/python3 "$src/tests/package/smoke.py" "$root" "$version"

# lintian: errors fail the test; warnings are printed (see the README).
lintian --fail-on error --tag-display-limit 0 "${debs[@]}"
echo "debs: ${#debs[@]} packages built, unpacked, used and lintian-clean of errors"
