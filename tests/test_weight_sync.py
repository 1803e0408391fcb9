"""Bucketed weight broadcast over a real gloo group between two real processes."""

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from common import protocol
from common.weight_sync import WeightBroadcaster, pack_bucket, plan_buckets, unpack_bucket

REPO = Path(__file__).resolve().parents[1]

RECEIVER = """
import sys
from safetensors.torch import save_file
from common import protocol
from common.weight_sync import WeightReceiver
address, out = sys.argv[1], sys.argv[2]
receiver = WeightReceiver(address, rank=1, world_size=2, timeout_s=30)
receiver.connect()
announce = protocol.decode(sys.stdin.buffer.read(), protocol.WeightsAnnounce)
save_file(receiver.receive(announce), out)
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


def test_plan_and_pack_round_trip_preserve_dtype_and_values():
    tensors = sample_tensors()
    announce = plan_buckets(tensors.items(), bucket_nbytes=100_000, version=3)
    assert len(announce.bucket_nbytes) >= 3
    assert all(s.nbytes <= 100_000 or announce.bucket_nbytes[s.bucket] >= s.nbytes for s in announce.slots)
    out = {}
    for bucket in range(len(announce.bucket_nbytes)):
        out.update(unpack_bucket(announce, bucket, pack_bucket(announce, bucket, tensors)))
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)


def test_broadcast_reaches_another_process(tmp_path):
    tensors = sample_tensors()
    sender = WeightBroadcaster("127.0.0.1", num_actors=1, bucket_nbytes=100_000, timeout_s=30)
    out = tmp_path / "received.safetensors"
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, sender.address, str(out)],
                            stdin=subprocess.PIPE, env=env, cwd=REPO)
    try:
        sender.connect()
        announce = sender.plan(tensors, version=1)
        proc.stdin.write(protocol.encode(announce))
        proc.stdin.close()
        sender.send(announce, tensors)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    received = load_file(out)
    for name, tensor in tensors.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor)
