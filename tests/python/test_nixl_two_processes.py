# SPDX-License-Identifier: Apache-2.0
"""kvxfer.nixl between two processes over backend "UCX", shaped like vLLM's
NixlConnector (READs of scattered blocks of 2 regions x 4 layers) and like
SGLang's NIXL backend (WRITEs from Nx3 lists, handles never released), on
the tcp lane, the same-host (cma) lane and the UCX lane (over UCX's tcp
transport with KVXFER_RMA=on, as no RDMA device is here). The same two
sides also run as two threads of this process over LOOPBACK ("loopback")."""

import multiprocessing
import threading

import pytest

import _nixl_peer

LANES = ["tcp", "cma", "ucx", "loopback"]


class Peers:
    def __init__(self, roles, lanes):
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for role in roles:
            mine, theirs = ctx.Pipe()
            if lanes == "loopback":
                proc = threading.Thread(target=_nixl_peer.run, args=(role, theirs, lanes), daemon=True)
            else:
                proc = ctx.Process(target=_nixl_peer.run, args=(role, theirs, lanes), daemon=True)
            proc.start()
            self.conns.append(mine)
            self.procs.append(proc)

    def recv(self, i, timeout=60):
        if not self.conns[i].poll(timeout):
            pytest.fail(f"process {i} did not answer")
        message = self.conns[i].recv()
        if message[0] == "skip":
            pytest.skip(message[1])
        if message[0] == "error":
            pytest.fail(message[1])
        return message

    def close(self):
        for conn in self.conns:
            conn.send("close")
        results = [self.recv(i) for i in range(len(self.conns))]
        for proc in self.procs:
            proc.join(30)
            assert not proc.is_alive() and getattr(proc, "exitcode", 0) == 0
        return results

    def kill(self):
        for proc in self.procs:
            if proc.is_alive() and hasattr(proc, "kill"):
                proc.kill()


@pytest.mark.parametrize("lanes", LANES)
def test_vllm_shaped_reads_between_two_processes(lanes):
    peers = Peers(["vllm_prefill", "vllm_decode"], lanes)
    try:
        _, metadata, addrs = peers.recv(0)
        peers.conns[1].send((metadata, addrs))
        peers.conns[0].send("vllm-decode")
        assert peers.recv(1) == ("ok", "0 wrong blocks, 0 stray")
        assert peers.recv(0) == ("ok", sorted([*_nixl_peer.READS, _nixl_peer.PREFIX_HIT]))
        assert peers.close() == [("ok", "closed")] * 2
    finally:
        peers.kill()


@pytest.mark.parametrize("lanes", LANES)
def test_sglang_shaped_writes_between_two_processes(lanes):
    peers = Peers(["sglang_decode", "sglang_prefill"], lanes)
    try:
        _, metadata, addrs = peers.recv(0)
        peers.conns[1].send((metadata, addrs))
        peers.conns[0].send("sglang-prefill")
        assert peers.recv(1) == ("ok", "written")
        assert peers.recv(0) == ("ok", "0 wrong blocks, aux True")
        assert peers.close() == [("ok", "closed")] * 2
    finally:
        peers.kill()
