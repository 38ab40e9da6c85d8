"""The safetensors reader and the model-folder checkpoint: values equal to the safetensors library's, and
every malformed input (built by hand, bytes at a time) refused as one line naming the file and the tensor."""
from __future__ import annotations

import json
import pickle
import struct

import numpy as np
import pytest

from mnntool.errors import MnnToolError
from mnntool.llm.checkpoint import Checkpoint
from mnntool.llm.safetensors import SafetensorsFile, to_float32

st_numpy = pytest.importorskip("safetensors.numpy")


def fails(fn, *parts: str) -> str:
    with pytest.raises(MnnToolError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for part in parts:
        assert part in msg, msg
    return msg


def raw_file(path, header, data: bytes = b"", length: int | None = None):
    """A safetensors file from a header (dict, or bytes taken as they are) and a data buffer."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def one(dtype="F32", shape=(2,), offsets=(0, 8), name="w") -> dict:
    return {name: {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}}


# ---------------------------------------------------------------- round trips against the library

NUMPY_VALUES = {
    "f32": np.array([[1.5, -2.25, np.inf], [-0.0, 3e-41, np.finfo(np.float32).max]], np.float32),
    "f16": np.array([1.0, -65504.0, 6e-8, np.inf], np.float16),
    "f64": np.arange(5, dtype=np.float64) / 3,
    "i64": np.array([-(2 ** 63), 2 ** 63 - 1, 0], np.int64),
    "i32": np.arange(-6, 6, dtype=np.int32).reshape(3, 2, 2),
    "i16": np.array([-32768, 7], np.int16),
    "i8": np.array([-128, 127], np.int8),
    "u8": np.array([0, 255], np.uint8),
    "u16": np.array([65535], np.uint16),
    "u32": np.array([2 ** 32 - 1], np.uint32),
    "u64": np.array([2 ** 64 - 1], np.uint64),
    "bool": np.array([True, False, True]),
    "scalar": np.array(7.0, np.float32),
    "empty": np.zeros((0, 4), np.float32),
}


def test_numpy_round_trip(tmp_path):
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(NUMPY_VALUES, str(path), metadata={"format": "np"})
    with SafetensorsFile(path) as f:
        assert sorted(f.names) == sorted(NUMPY_VALUES) and f.metadata == {"format": "np"}
        for name, want in NUMPY_VALUES.items():
            got = f.get(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert np.array_equal(got, want), name
            assert not got.flags.writeable
            assert f.info(name).shape == want.shape
        assert f.info("f16").dtype == "F16" and f.info("bool").dtype == "BOOL"
        assert not f.get("i32").flags.owndata          # a view of the map, not a copy
        assert np.array_equal(to_float32(f.get("f16"), "F16"), NUMPY_VALUES["f16"].astype(np.float32))


def test_bf16_round_trip_with_torch(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-40, 3.0e38, -1.5])
    values = {"w": torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16),
              "s": special.to(torch.bfloat16)}
    path = tmp_path / "bf.safetensors"
    st_torch.save_file(values, str(path))
    with SafetensorsFile(path) as f:
        for name, t in values.items():
            assert f.info(name).dtype == "BF16" and f.get(name).dtype == np.uint16
            got = to_float32(f.get(name), "BF16")
            want = t.float().numpy()
            assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


def test_views_outlive_close(tmp_path):
    path = tmp_path / "m.safetensors"
    st_numpy.save_file({"a": np.arange(4, dtype=np.float32)}, str(path))
    f = SafetensorsFile(path)
    view = f.get("a")
    f.close()
    assert view.tolist() == [0, 1, 2, 3]             # the map stays until the view goes
    fails(lambda: f.get("a"), "m.safetensors", "closed")
    fails(lambda: SafetensorsFile(path).get("zz"), "m.safetensors", "'zz'")


def test_gaps_are_allowed(tmp_path):
    data = np.array([1, 2], np.float32).tobytes() + b"\0" * 8 + np.array([3], np.float32).tobytes()
    header = {**one("F32", (2,), (0, 8), "a"), **one("F32", (1,), (16, 20), "b")}
    with SafetensorsFile(raw_file(tmp_path / "g.safetensors", header, data)) as f:
        assert f.get("a").tolist() == [1, 2] and f.get("b").tolist() == [3]


# ---------------------------------------------------------------- malformed files

@pytest.mark.parametrize("content, words", [
    (b"", "0 bytes"),
    (b"\x01\x02\x03", "3 bytes"),
    (struct.pack("<Q", 100) + b'{"a":', "runs past the end"),                     # truncated header
    (struct.pack("<Q", 2 ** 40) + b"{}", "absurd"),
    (struct.pack("<Q", 200 << 20) + b"{}", "absurd"),
    (struct.pack("<Q", 5) + b"{nope", "not valid JSON"),
    (struct.pack("<Q", 2) + b"\xff\xfe", "not UTF-8"),
    (struct.pack("<Q", 2) + b"[]", "expected an object"),
    (struct.pack("<Q", 3000) + b"[" * 3000, "not valid JSON"),                      # nesting too deep
    (struct.pack("<Q", 5000) + b'{"w":' + b"9" * 4994 + b"}", "not valid JSON"),   # int too long
])
def test_bad_framing(tmp_path, content, words):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    fails(lambda: SafetensorsFile(path), str(path), words)


def test_not_a_file(tmp_path):
    fails(lambda: SafetensorsFile(tmp_path / "none.safetensors"), "none.safetensors", "no such file")
    fails(lambda: SafetensorsFile(tmp_path), str(tmp_path), "directory")


F32x2 = np.zeros(2, np.float32).tobytes()


@pytest.mark.parametrize("header, data, words", [
    ({"w": [1, 2]}, F32x2, "JSON list entry"),
    ({"w": {"shape": [2], "data_offsets": [0, 8]}}, F32x2, "no 'dtype'"),
    ({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, F32x2, "no 'shape'"),
    ({"w": {"dtype": "F32", "shape": [2]}}, F32x2, "no 'data_offsets'"),
    (one(dtype=3), F32x2, "dtype that is not a string"),
    (one(dtype="Q7"), F32x2, "unknown dtype 'Q7'"),
    (one(dtype="F4"), F32x2, "packed below a byte"),
    ({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, F32x2, "not a list"),
    (one(shape=(-2,)), F32x2, "negative dim -2"),
    (one(shape=(2.0,)), F32x2, "non-integer dim 2.0"),
    (one(shape=(True, 2)), F32x2, "non-integer dim true"),
    (one(shape=(2 ** 64,)), F32x2, "absurd dim"),
    (one(shape=[1] * 65), F32x2, "65 dims"),
    (one(shape=(10 ** 6, 10 ** 6)), F32x2, "1000000000000 elements need 4000000000000 bytes"),
    (one(shape=(3,)), F32x2, "need 12 bytes, data_offsets give 8"),                 # dtype/shape mismatch
    (one(dtype="F16"), F32x2, "need 4 bytes, data_offsets give 8"),
    (one(offsets=(0, 8, 9)), F32x2, "not two integers"),
    (one(offsets=(0, "8")), F32x2, "not two integers"),
    (one(offsets=(8, 0)), F32x2, "begin must be"),
    (one(offsets=(-8, 0)), F32x2, "begin must be"),
    (one(offsets=(8, 16)), F32x2, "past the end of the data (8 bytes)"),
])
def test_bad_entries(tmp_path, header, data, words):
    path = raw_file(tmp_path / "bad.safetensors", header, data)
    fails(lambda: SafetensorsFile(path), "bad.safetensors", "tensor 'w'", words)


def test_bad_header_objects(tmp_path):
    path = raw_file(tmp_path / "dup.safetensors", b'{"w": {}, "w": {}}')
    fails(lambda: SafetensorsFile(path), "dup.safetensors", "'w' appears twice")
    path = raw_file(tmp_path / "meta.safetensors", {"__metadata__": {"a": 1}})
    fails(lambda: SafetensorsFile(path), "meta.safetensors", "__metadata__")
    path = raw_file(tmp_path / "over.safetensors", {**one("F32", (2,), (0, 8), "a"), **one("F32", (2,), (4, 12), "b")},
                    bytes(12))
    fails(lambda: SafetensorsFile(path), "over.safetensors", "'a'", "'b'", "overlap")
    evil = "x\nFAKE LINE" + "y" * 500
    path = raw_file(tmp_path / "name.safetensors", one(dtype="Q", name=evil), F32x2)
    assert len(fails(lambda: SafetensorsFile(path), "name.safetensors", "unknown dtype")) < 400


def test_fp8_is_refused_when_read(tmp_path):
    path = raw_file(tmp_path / "fp8.safetensors", one(dtype="F8_E4M3", shape=(8,)), bytes(8))
    with SafetensorsFile(path) as f:
        assert f.info("w").dtype == "F8_E4M3"
        fails(lambda: f.get("w"), "fp8.safetensors", "tensor 'w'", "FP8")


# ---------------------------------------------------------------- model folders

def model_dir(tmp_path, config=None, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config or {"model_type": "llama", "hidden_size": 4}))
    return d


def test_single_file_folder(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    d = model_dir(tmp_path, {"model_type": "x", "auto_map": {"AutoModel": "evil.Model"}})
    # code in the folder that would leave a mark if anything imported it
    (d / "evil.py").write_text(f"open({str(d / 'ran')!r}, 'w')\n")
    (d / "generation_config.json").write_text('{"eos_token_id": 2}')
    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    st_torch.save_file({"w": w.to(torch.bfloat16), "h": w.to(torch.float16), "ids": torch.arange(3),
                        "mask": torch.tensor([True, False])}, str(d / "model.safetensors"))
    with Checkpoint.open(d) as ck:
        assert ck.dir == d and ck.config["model_type"] == "x" and ck.generation_config == {"eos_token_id": 2}
        assert sorted(ck.names()) == ["h", "ids", "mask", "w"] and ck.has("w") and not ck.has("v")
        assert ck.shape("w") == (4, 3) and ck.dtype("w") == "BF16" and ck.dtype("ids") == "I64"
        got = ck.get("w")
        assert got.dtype == np.float32 and got.flags.writeable
        assert np.array_equal(got, w.to(torch.bfloat16).float().numpy())
        assert np.array_equal(ck.get("h"), w.to(torch.float16).float().numpy())
        assert ck.get("ids").dtype == np.int64 and ck.get("ids").tolist() == [0, 1, 2]
        assert ck.get("mask").tolist() == [True, False]
        assert ck.raw("w").dtype == np.uint16
        ck.expect_shape("w", (4, 3))
        fails(lambda: ck.expect_shape("w", [3, 4]), "model.safetensors", "tensor 'w' has shape [4, 3], the config says [3, 4]")
        fails(lambda: ck.expect_shape("v", [3]), str(d), "no tensor 'v'")
        fails(lambda: ck.get("v"), str(d), "no tensor 'v'")
    assert not (d / "ran").exists()


def shard(d, name, values):
    st_numpy.save_file({k: np.full(2, v, np.float32) for k, v in values.items()}, str(d / name))


def write_index(d, weight_map):
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_folder(tmp_path):
    d = model_dir(tmp_path)
    shard(d, "model-00001-of-00002.safetensors", {"a": 1, "b": 2})
    shard(d, "model-00002-of-00002.safetensors", {"c": 3})
    shard(d, "consolidated.safetensors", {"a": 9, "b": 9, "c": 9})     # Mistral's duplicate: not in the index
    write_index(d, {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                    "c": "model-00002-of-00002.safetensors"})
    with Checkpoint.open(d) as ck:
        assert sorted(ck.names()) == ["a", "b", "c"] and ck.generation_config == {}
        assert [ck.get(n)[0] for n in "abc"] == [1, 2, 3]
        assert ck.file("c").name == "model-00002-of-00002.safetensors"


def test_unindexed_shards(tmp_path):
    d = model_dir(tmp_path)
    shard(d, "one.safetensors", {"a": 1})
    shard(d, "two.safetensors", {"b": 2})
    with Checkpoint.open(d) as ck:
        assert sorted(ck.names()) == ["a", "b"]
    shard(d, "three.safetensors", {"a": 3})
    fails(lambda: Checkpoint.open(d), "'a'", "is also in", "one.safetensors")


@pytest.mark.parametrize("name, words", [
    ("../x.safetensors", "outside the model folder"),
    ("/etc/x.safetensors", "outside the model folder"),
    ("..\\x.safetensors", "outside the model folder"),
    ("sub/../../x.safetensors", "outside the model folder"),
    ("missing.safetensors", "does not exist"),
    ("pytorch_model.bin", "not a .safetensors file"),
    (3, "not a file name"),
])
def test_bad_index_shards(tmp_path, name, words):
    d = model_dir(tmp_path)
    shard(tmp_path, "x.safetensors", {"a": 1})      # beside the folder, where '../x' would reach
    write_index(d, {"a": name})
    parts = [str(d / "model.safetensors.index.json"), words] + ([str(name)] if isinstance(name, str) else [])
    fails(lambda: Checkpoint.open(d), *parts)


def test_index_lists_a_missing_tensor(tmp_path):
    d = model_dir(tmp_path)
    shard(d, "s1.safetensors", {"a": 1})
    shard(d, "s2.safetensors", {"b": 2})
    write_index(d, {"a": "s1.safetensors", "b": "s1.safetensors"})
    fails(lambda: Checkpoint.open(d), "model.safetensors.index.json", "tensor 'b'", "'s1.safetensors'", "does not have it")
    write_index(d, {"a": "s1.safetensors", "b": "s2.safetensors"})
    shard(d, "s2.safetensors", {"a": 5, "b": 2})     # 'a' in two shards
    fails(lambda: Checkpoint.open(d), "s2.safetensors", "tensor 'a'", "also in s1.safetensors")
    (d / "model.safetensors.index.json").write_text('{"weight_map": []}')
    fails(lambda: Checkpoint.open(d), "model.safetensors.index.json", "weight_map")


class _Trap:
    """Unpickling this creates a file: the test proves the reader never unpickles."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_pickle_only_folder(tmp_path):
    d = model_dir(tmp_path)
    marker = tmp_path / "unpickled"
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Trap(str(marker))))
    fails(lambda: Checkpoint.open(d), str(d), "pytorch_model.bin", "pickle", "safe_serialization=True")
    assert not marker.exists()


def test_bad_folders(tmp_path):
    fails(lambda: Checkpoint.open(tmp_path / "nope"), "nope", "no such folder")
    d = model_dir(tmp_path)
    fails(lambda: Checkpoint.open(d / "config.json"), "config.json", "not a folder")
    fails(lambda: Checkpoint.open(d), str(d), "no weights")
    shard(d, "model.safetensors", {"a": 1})
    (d / "config.json").unlink()
    fails(lambda: Checkpoint.open(d), str(d / "config.json"), "no such file")
    (d / "config.json").write_text('{"model_type": ')
    fails(lambda: Checkpoint.open(d), str(d / "config.json"), "not valid JSON")
    (d / "config.json").write_text('["llama"]')
    fails(lambda: Checkpoint.open(d), str(d / "config.json"), "expected an object")
    (d / "config.json").write_bytes(b"\xff{}")
    fails(lambda: Checkpoint.open(d), str(d / "config.json"), "not UTF-8")
    (d / "config.json").write_text("{}")
    (d / "generation_config.json").write_text("[1]")
    fails(lambda: Checkpoint.open(d), "generation_config.json", "expected an object")


def test_unsupported_dtypes_refused_at_open(tmp_path):
    d = model_dir(tmp_path)
    raw_file(d / "model.safetensors", one(dtype="F8_E5M2", shape=(8,), name="q"), bytes(8))
    fails(lambda: Checkpoint.open(d), "model.safetensors", "tensor 'q'", "F8_E5M2", "dequantize")
    st_numpy.save_file({"z": np.zeros(2, np.complex64)}, str(d / "model.safetensors"))
    fails(lambda: Checkpoint.open(d), "model.safetensors", "tensor 'z'", "C64")
    raw_file(d / "model.safetensors", one(dtype="F32", shape=(-1,)), F32x2)
    fails(lambda: Checkpoint.open(d), "model.safetensors", "tensor 'w'", "negative dim")
