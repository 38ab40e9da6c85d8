"""The schema-driven FlatBuffers codec: round trips, defaults, and hostile bytes."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mnntool.format.flatbuf import FormatError, decode, encode


def test_round_trip_keeps_fields_and_defaults():
    op = {"type": "Convolution", "name": "c", "inputIndexes": [0], "outputIndexes": [1], "main_type": "Convolution2D",
          "main": {"common": {"kernelX": 3, "kernelY": 3, "outputCount": 8, "inputCount": 3, "relu": True,
                              "pads": [1, 1, 1, 1], "padMode": "SAME"},
                   "weight": np.arange(216, dtype=np.float32), "bias": np.zeros(8, np.float32)}}
    net = {"oplists": [op], "tensorName": ["x", "y"], "outputName": ["y"], "sourceType": "ONNX", "bizCode": "t"}
    back = decode(encode("Net", net), "Net")
    o = back["oplists"][0]
    assert o["type"] == "Convolution" and o["main_type"] == "Convolution2D"
    c = o["main"]["common"]
    assert (c["kernelX"], c["outputCount"], c["relu"], c["padMode"]) == (3, 8, True, "SAME")
    assert c["strideX"] == 1 and c["dilateY"] == 1 and c["group"] == 1  # schema defaults
    assert o["defaultDimentionFormat"] == "NHWC"
    np.testing.assert_array_equal(o["main"]["weight"], np.arange(216, dtype=np.float32))
    assert back["tensorName"] == ["x", "y"] and back["sourceType"] == "ONNX"


def _sample():
    op = {"type": "ReLU", "inputIndexes": [0], "outputIndexes": [1], "main_type": "Relu", "main": {"slope": 0.5}}
    return encode("Net", {"oplists": [op], "tensorName": ["a", "b"], "outputName": ["b"]})


def test_truncations_raise_format_error():
    data = _sample()
    for n in range(len(data)):
        try:
            decode(data[:n], "Net")
        except FormatError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_random_bytes_never_crash(data):
    try:
        decode(data, "Net")
    except FormatError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 255))
def test_flipped_bytes_never_crash(pos, value):
    data = bytearray(_sample())
    data[pos % len(data)] = value
    try:
        decode(bytes(data), "Net")
    except FormatError:
        pass


def test_unknown_enum_name_is_rejected():
    with pytest.raises(ValueError):
        encode("Net", {"sourceType": "NOPE"})
