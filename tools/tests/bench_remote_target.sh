#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A target started alone (`kvxfer bench --role target --listen`) on the
# loopback interface: an initiator with the same block length and config is
# served and verified; one with another block length, and one with another
# config fingerprint, are refused with a message that says why.
#   bench_remote_target.sh path/to/kvxfer work_dir check_bench_json.cmake
set -euo pipefail
kvxfer=$1
work=$2
check=$3
rm -rf "$work"
mkdir -p "$work"

"$kvxfer" bench --role target --listen 127.0.0.1:0 --sessions 3 --block-len 64K --region 64M \
  >"$work/target.out" 2>"$work/target.err" &
target=$!
trap 'kill "$target" 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  grep -q 'listening on' "$work/target.out" && break
  sleep 0.05
done
addr=$(sed -n 's/.*listening on //p' "$work/target.out")
[ -n "$addr" ] || { echo "target did not listen"; cat "$work/target.err"; exit 1; }
common=(--peer "$addr" --region 64M --total 16M --no-perftest --quiet)

# Same block length and config: served, and every block checked is right.
"$kvxfer" bench "${common[@]}" --cases layer --json "$work/served.json"
cmake -DJSON="$work/served.json" -DCASES=layer -P "$check"

# Another block length: refused, and the initiator says why.
if "$kvxfer" bench "${common[@]}" --cases big >"$work/block_len.out" 2>&1; then
  echo "a 2 MiB initiator was served by a 64 KiB target"; exit 1
fi
grep -q "refused: block length 2097152 differs from this target's 65536" "$work/block_len.out" ||
  { cat "$work/block_len.out"; exit 1; }

# Another config (transports): refused on the fingerprint.
if "$kvxfer" bench "${common[@]}" --cases layer --tls tcp >"$work/fingerprint.out" 2>&1; then
  echo "a tcp initiator was served by an sm target"; exit 1
fi
grep -q "refused: config fingerprint .* differs from this target's" "$work/fingerprint.out" ||
  { cat "$work/fingerprint.out"; exit 1; }

# Three sessions served: the target exits on its own, cleanly.
for _ in $(seq 100); do kill -0 "$target" 2>/dev/null || break; sleep 0.1; done
wait "$target"
echo "remote target: served, refused a block length, refused a fingerprint"
