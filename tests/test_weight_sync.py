"""Bucketed weight broadcast over real gloo groups between real processes, failures included."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common import protocol
from common.weight_sync import (
    BroadcastFailed,
    WeightBroadcaster,
    _sole_tensor,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

REPO = Path(__file__).resolve().parents[1]

RECEIVER = """
import os, sys
import torch
from safetensors.torch import save_file
from common import protocol
from common.weight_sync import BroadcastFailed, WeightReceiver, _finish, _start_broadcast
address, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
receiver = WeightReceiver(address, timeout_s=3)
print("ready", flush=True)  # imports done: the deadlines below start now on both sides
if mode == "after-failed-generation":
    try:
        receiver.join(1, rank=1, world_size=3)  # a member that never comes: this generation fails
    except BroadcastFailed:
        pass
    receiver.join(2, rank=1, world_size=2)
else:
    receiver.join(1, rank=1, world_size=2)
announce = protocol.decode(sys.stdin.buffer.read(), protocol.WeightsAnnounce)
if mode == "die-mid-broadcast":
    first = torch.empty(announce.bucket_nbytes[0], dtype=torch.uint8)
    _finish(_start_broadcast(receiver._group, first), first, 3)
    os._exit(1)  # killed after the first bucket
save_file(receiver.receive(announce), out)
# Leave without interpreter teardown: destroying a gloo group while its threads wind down can
# abort ("terminate called without an active exception"); the received file is what counts.
os._exit(0)
"""


def sample_tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(300, 64, generator=g),
        "norm": torch.randn(64, generator=g).to(torch.bfloat16),
        "big": torch.randn(700, 100, generator=g),  # larger than one bucket
        "count": torch.arange(5, dtype=torch.int64),
        "odd": torch.randn(3, generator=g),  # 12 bytes: the next slot must stay aligned
        "half": torch.randn(7, 3, generator=g).half(),
    }


def start_receiver(sender: WeightBroadcaster, out: Path, mode: str = "plain") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, sender.address, str(out), mode],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO)
    assert proc.stdout.readline().strip() == b"ready"  # a slow interpreter start must not eat a deadline
    return proc


def send_announce(proc: subprocess.Popen, announce) -> None:
    proc.stdin.write(protocol.encode(announce))
    proc.stdin.close()


def test_plan_and_pack_round_trip_preserve_dtype_and_values():
    tensors = sample_tensors()
    announce = plan_buckets(tensors.items(), bucket_nbytes=100_000, version=3)
    assert len(announce.bucket_nbytes) == 2  # "big" alone, then the five others packed together
    out = {}
    for bucket in range(len(announce.bucket_nbytes)):
        out.update(unpack_bucket(announce, bucket, pack_bucket(announce, bucket, tensors)))
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)


def test_a_tensor_as_large_as_a_bucket_travels_alone_from_its_own_memory():
    tensors = sample_tensors()
    announce = plan_buckets(tensors.items(), bucket_nbytes=100_000, version=3)
    big = next(slot for slot in announce.slots if slot.name == "big")
    assert big.bucket == 0  # first: it leaves at once while the shared bucket is packed
    assert [slot.name for slot in announce.slots if slot.bucket == big.bucket] == ["big"]
    assert announce.bucket_nbytes[big.bucket] == big.nbytes  # no padding to send or receive
    sent = _sole_tensor(announce, big.bucket, tensors)
    assert sent.data_ptr() == tensors["big"].data_ptr()  # zero-copy: no packing of a sole tensor
    assert _sole_tensor(announce, 1, tensors) is None  # a shared bucket is packed


def test_broadcast_reaches_another_process(tmp_path):
    tensors = sample_tensors()
    sender = WeightBroadcaster("127.0.0.1", bucket_nbytes=100_000, timeout_s=30)
    proc = start_receiver(sender, tmp_path / "received.safetensors")
    try:
        sender.regroup([0])
        announce = sender.plan(tensors, version=1)
        send_announce(proc, announce)
        sender.send(announce, tensors)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    received = load_file(tmp_path / "received.safetensors")
    for name, tensor in tensors.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor)


def test_a_member_that_never_joins_fails_the_generation_within_the_deadline(tmp_path):
    tensors = sample_tensors()
    sender = WeightBroadcaster("127.0.0.1", bucket_nbytes=100_000, timeout_s=3)
    proc = start_receiver(sender, tmp_path / "received.safetensors", "after-failed-generation")
    try:
        started = time.monotonic()
        with pytest.raises(BroadcastFailed):
            sender.regroup([0, 1])  # actor 1 is dead
        assert time.monotonic() - started < 30
        assert not sender.connected and sender.members == []
        sender.regroup([0])  # the survivor joins the next generation
        announce = sender.plan(tensors, version=2)
        assert announce.generation == 2
        send_announce(proc, announce)
        sender.send(announce, tensors)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert torch.equal(load_file(tmp_path / "received.safetensors")["big"], tensors["big"])


def test_a_receiver_killed_mid_broadcast_never_hangs_the_sender(tmp_path):
    tensors = {f"w{i}": torch.randn(64, 1024) for i in range(16)}  # 16 buckets of 256 KiB
    sender = WeightBroadcaster("127.0.0.1", bucket_nbytes=64 * 1024 * 4, timeout_s=3)
    proc = start_receiver(sender, tmp_path / "never.safetensors", "die-mid-broadcast")
    try:
        sender.regroup([0])
        announce = sender.plan(tensors, version=1)
        send_announce(proc, announce)
        started = time.monotonic()
        with pytest.raises(BroadcastFailed):
            sender.send(announce, tensors)
        assert time.monotonic() - started < 30
        assert not sender.connected
    finally:
        proc.kill()
