"""The recorded trajectory stream survives a kill in the middle of a write."""

from common import protocol
from common.protocol import Control
from common.recording import Recorder, read_messages


def test_round_trip_and_torn_tail_is_cut_before_appending(tmp_path):
    path = tmp_path / "trajectories.msgpack"
    recorder = Recorder(path)
    for generation in (3, 4):
        recorder.write(protocol.encode(Control(command="regroup", generation=generation, members=[])))
    recorder.close()
    with open(path, "ab") as f:  # a write cut short by a kill
        f.write(b"\x40\x00\x00\x00partial")
    assert [m.generation for m in read_messages(path)] == [3, 4]
    recorder = Recorder(path)  # a resumed run appends after the last complete record
    recorder.write(protocol.encode(Control(command="regroup", generation=5, members=[])))
    recorder.close()
    assert [m.generation for m in read_messages(path)] == [3, 4, 5]
