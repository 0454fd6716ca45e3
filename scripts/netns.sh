#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Three "hosts" for the multi-host tests, as network namespaces:
#
#   kvx-h1 (10.203.0.1) --\
#   kvx-h2 (10.203.0.2) ---+-- bridge kvx-br in namespace kvx-sw
#   kvx-h3 (10.203.0.3) --/
#
# Each host has `lo` and one veth, kvx0, on 10.203.0.0/24. The subnet exists
# only inside these namespaces: the bridge lives in its own namespace, so the
# root namespace gets no interface, address or route from this script.
#
#   scripts/netns.sh up     # idempotent: tears down a partial setup first
#   scripts/netns.sh down   # idempotent
#   scripts/netns.sh status
#
# Needs root and iproute2. Processes run on a host with
# `ip netns exec kvx-h2 CMD`; UCX should be told UCX_TLS=tcp and
# UCX_NET_DEVICES=kvx0.
set -euo pipefail

HOSTS=(kvx-h1 kvx-h2 kvx-h3)
SWITCH=kvx-sw
SUBNET_PREFIX=10.203.0

exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

down() {
  for ns in "${HOSTS[@]}" "$SWITCH"; do
    if exists "$ns"; then ip netns del "$ns"; fi
  done
}

up() {
  # A half-built set (an earlier run killed mid-way) is rebuilt from scratch.
  local complete=1
  for ns in "${HOSTS[@]}" "$SWITCH"; do exists "$ns" || complete=0; done
  if [[ $complete == 1 ]] && ip -n kvx-h1 addr show kvx0 2>/dev/null | grep -q "$SUBNET_PREFIX"; then
    return 0
  fi
  down
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link set lo up
  ip -n "$SWITCH" link add kvx-br type bridge
  ip -n "$SWITCH" link set kvx-br up
  local i=0
  for ns in "${HOSTS[@]}"; do
    i=$((i + 1))
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Created inside the host namespace, its peer moved to the switch: the
    # root namespace never holds either end.
    ip -n "$ns" link add kvx0 type veth peer name "port$i"
    ip -n "$ns" link set "port$i" netns "$SWITCH"
    ip -n "$ns" addr add "$SUBNET_PREFIX.$i/24" dev kvx0
    ip -n "$ns" link set kvx0 up
    ip -n "$SWITCH" link set "port$i" master kvx-br
    ip -n "$SWITCH" link set "port$i" up
  done
}

status() {
  for ns in "${HOSTS[@]}"; do
    if exists "$ns"; then
      echo "$ns: $(ip -n "$ns" -br addr show kvx0 2>/dev/null || echo 'no kvx0')"
    else
      echo "$ns: absent"
    fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
