"""Weights leave the learner one parameter at a time: no rank ever holds the whole unsharded model.

Two gloo learner ranks with the tiny model sharded over them; rank 0 publishes to one actor (a
``WeightReceiver`` in a thread of rank 0's process) while rank 1 only takes part in the gathers.
Every ``DTensor.full_tensor`` result is tracked with a weak reference, so the peak of unsharded
bytes alive at once on each rank is counted, not estimated.
"""

from __future__ import annotations

import json
import queue
import threading
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from common import protocol
from common.net import free_port
from common.tiny_model import build_tiny_model
from common.weight_sync import _MAX_IN_FLIGHT, WeightBroadcaster, WeightReceiver
from learner.checkpoint import export_hf
from learner.model import UnshardedParameters, full_parameters, init_process_group, load_sharded_model
from learner.weight_publisher import WeightPublisher

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

BUCKET_NBYTES = 32 * 1024  # far below the model's size, so the model travels in many buckets


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny")))


def _count_unsharded_bytes() -> dict[str, int]:
    """Patch ``DTensor.full_tensor`` to record the most unsharded bytes alive at once (``peak``)."""
    original, alive, counts = DTensor.full_tensor, [], {"peak": 0}

    def full_tensor(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        alive.append(weakref.ref(out))
        held = sum(t.numel() * t.element_size() for ref in alive if (t := ref()) is not None)
        counts["peak"] = max(counts["peak"], held)
        return out

    DTensor.full_tensor = full_tensor
    return counts


class _QueuePub:
    """Stands in for the head's PUB socket: what the learner publishes goes to the actor thread."""

    def __init__(self):
        self.messages: queue.Queue[bytes] = queue.Queue()

    def send(self, data: bytes) -> None:
        self.messages.put(data)


def _actor(address: str, messages: queue.Queue, received: dict) -> None:
    receiver = WeightReceiver(address, timeout_s=60)
    receiver.join(1, rank=1, world_size=2)  # the generation the publisher forms for member 1
    while True:
        try:
            announce = protocol.decode(messages.get(timeout=60), protocol.WeightsAnnounce)
            break
        except protocol.ProtocolError:
            continue  # the regroup Control before it
    received.update({name: tensor.clone() for name, tensor in receiver.receive(announce).items()})


def _publish_on_rank(rank: int, port: int, model_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_process_group(rank, 2, "127.0.0.1", port)
    model = load_sharded_model(model_path, "float32")
    counts = _count_unsharded_bytes()
    weights = UnshardedParameters(model, torch.bfloat16)  # float32 masters, bfloat16 actors
    largest = max(t.numel() * t.element_size() for _, t in weights.specs())
    received: dict[str, torch.Tensor] = {}
    if rank == 0:
        broadcaster, pub = WeightBroadcaster("127.0.0.1", BUCKET_NBYTES, timeout_s=60), _QueuePub()
        actor = threading.Thread(target=_actor, args=(broadcaster.address, pub.messages, received))
        actor.start()
        publisher = WeightPublisher(pub, broadcaster, take_join_requests=lambda: {1: 0})
        publisher.publish(weights, version=1)
        actor.join()
        assert publisher.failures == 0
    else:
        weights.drain()
    peak = counts["peak"]
    expected = {name: tensor.to(torch.bfloat16) for name, tensor in full_parameters(model).items()}  # collective
    if rank == 0:
        save_file(received, f"{out_dir}/received.safetensors")
        save_file({k: v.contiguous() for k, v in expected.items()}, f"{out_dir}/expected.safetensors")
    total = sum(t.numel() * t.element_size() for t in expected.values())
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump({"peak": peak, "largest": largest, "total": total}, f)
    dist.destroy_process_group()


@pytest.mark.slow  # two fresh processes importing torch and transformers
def test_weights_stream_to_the_actor_cast_and_no_rank_holds_the_whole_model(model_path, tmp_path):
    mp.spawn(_publish_on_rank, args=(free_port(), model_path, str(tmp_path)), nprocs=2, join=True)
    received, expected = load_file(tmp_path / "received.safetensors"), load_file(tmp_path / "expected.safetensors")
    assert received.keys() == expected.keys()
    for name, tensor in expected.items():
        assert received[name].dtype == torch.bfloat16 and torch.equal(received[name], tensor), name
    head, follower = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # a follower gathers only to take part: one parameter's full tensor at a time, in the actors' dtype
    assert follower["peak"] <= follower["largest"]
    # the head: the bucket being filled, the buckets in flight (a sole tensor flies from its own
    # memory) and the parameter just gathered; never the whole model
    assert head["peak"] <= BUCKET_NBYTES + (_MAX_IN_FLIGHT + 1) * head["largest"]
    assert head["peak"] < head["total"] / 2


def test_the_hf_export_written_shard_by_shard_loads_with_the_same_weights(model_path, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    export_hf(iter(UnshardedParameters(model)), model_path, tmp_path / "hf", shard_bytes=200_000)
    assert len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) > 1
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert loaded.dtype == torch.float32
    original = model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name
