#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One libFuzzer target for SECONDS on its seed corpus (tests/fuzz/corpus/NAME)
# and what it found before (BUILD/corpus/NAME). Prints libFuzzer's totals;
# on a finding, the log's tail, and exits non-zero. `make fuzz` runs it.
#   fuzz-one.sh BUILD NAME SECONDS
set -euo pipefail
build=$1 name=$2 seconds=$3
mkdir -p "$build/corpus/$name"
log="$build/$name.log"
if ! "$build/tests/fuzz/${name}_fuzz" -max_total_time="$seconds" -max_len=8192 \
    -print_final_stats=1 "$build/corpus/$name" "tests/fuzz/corpus/$name/valid" \
    "tests/fuzz/corpus/$name/invalid" > "$log" 2>&1; then
  tail -n 80 "$log"
  echo "fuzz: $name FAILED"
  exit 1
fi
runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
echo "fuzz: $name ran ${runs:-?} inputs in $seconds s, no finding"
