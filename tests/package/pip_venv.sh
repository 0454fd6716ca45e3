#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `pip install .` as the README says, end to end: a fresh venv on Debian's
# python3 (system site packages: Debian's setuptools, wheel and numpy),
# offline, then the installed package and its `kvxfer` command used from
# another directory.
#   pip_venv.sh SOURCE_DIR WORK_DIR VERSION [BUILD_DIR]
# BUILD_DIR: a package tree to build the wheel in (setup.py's
# KVXFER_CMAKE_BUILD_DIR), e.g. the one the debs test built: its objects are
# reused, so the route is tested without building the tree once more.
set -euo pipefail
src=$1 work=$2 version=$3
if [ -n "${4:-}" ]; then export KVXFER_CMAKE_BUILD_DIR=$4; fi

rm -rf "$work"
mkdir -p "$work/elsewhere"
trap 'rm -rf "$work/venv"' EXIT
# Nothing of a build tree or of the caller's environment may leak in.
unset PYTHONPATH PYTHONHOME MAKEFLAGS MFLAGS
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1

/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --no-build-isolation --no-index --no-cache-dir -q "$src"
# The wheel's metadata carries the project version too.
"$work/venv/bin/python" -c 'import importlib.metadata as m, sys; v = m.version("kvxfer"); assert v == sys.argv[1], v' "$version"

cd "$work/elsewhere"
"$work/venv/bin/python" "$src/tests/package/smoke.py" "$work/venv" "$version"

# The kvxfer command from the venv: the console script (and python -m kvxfer)
# runs the C++ tool shipped in the package, which loads the package's
# libkvxfer, and a short bench (a target it spawns, blocks verified) runs.
venv=$(realpath "$work/venv")
info=$("$work/venv/bin/kvxfer" info)
echo "$info"
tool=$(sed -n 's/^tool: //p' <<< "$info")
[[ "$(realpath "$tool")" == "$venv"/*/kvxfer/bin/kvxfer ]] || { echo "tool $tool is not the venv's"; exit 1; }
libraries=$(sed -n 's/^library: //p' <<< "$info")
[ "$(wc -l <<< "$libraries")" -eq 2 ] || { echo "expected the package's and the tool's library: lines"; exit 1; }
while read -r library; do
  [[ "$(realpath "$library")" == "$venv"/* ]] || { echo "library $library is not the venv's"; exit 1; }
done <<< "$libraries"
grep -q '^lanes: ' <<< "$info" || { echo "kvxfer info names no lanes"; exit 1; }
"$work/venv/bin/python" -m kvxfer bench --help | grep -q 'Usage: kvxfer bench'
"$work/venv/bin/kvxfer" bench --cases small --region 16M --total 4M --no-perftest \
  --verify-blocks 64 --quiet --json "$work/bench.json"
"$work/venv/bin/python" -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["all_verified"], d' \
  "$work/bench.json"
echo "pip_venv: kvxfer $version installed, imported, and its command run from $work/venv"
