"""A BERT exported by torch's legacy ONNX exporter (dynamo=False, opset 17, batch and sequence left open,
input_ids and attention_mask): its padding mask is read as Flatten(mask, axis=2) on the [batch, seq]
mask -> [batch*seq, 1] and gathered by flat index. Flatten's axis may equal the rank (everything into the
first dim); reading it modulo the rank made [1, batch*seq] and a gather out of range in mnntool's runtime
(issue 51). Compared with torch (cosine >= 0.9999, max abs <= 1e-3 x scale) in both runtimes, at the
exported shape and another; the op alone against onnxruntime."""
import contextlib
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fixtures.zoo import _without_torchvision_ops  # noqa: E402

_without_torchvision_ops()
transformers = pytest.importorskip("transformers")

import mnntool  # noqa: E402
from mnntool import api  # noqa: E402
from tests.conftest import assert_close, mnn_run  # noqa: E402


class Bert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.m = transformers.BertModel(transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                                num_attention_heads=4, intermediate_size=64))

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask)[0]


def _tokens(batch, t, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (batch, t), generator=g)
    mask = torch.ones_like(ids)
    mask[0, t - 3:] = 0
    return ids, mask


def test_legacy_exported_bert_with_mask_matches_torch_in_both_runtimes(tmp_path):
    model = Bert().eval()
    src, dst = tmp_path / "bert.onnx", tmp_path / "bert.mnn"
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        torch.onnx.export(model, _tokens(1, 16, 1), str(src), input_names=["input_ids", "attention_mask"],
                          output_names=["y"], dynamo=False, opset_version=17, dynamic_axes=axes)
    model.eval()        # the exporter puts back the mode it found
    api.convert(src, dst)
    for batch, t in ((1, 16), (2, 9)):
        ids, mask = _tokens(batch, t, batch + t)
        with torch.no_grad():
            ref = model(ids, mask).numpy()
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        assert_close(ref, mnntool.load(dst).run(feeds)["y"])
        assert_close(ref, mnn_run(dst, list(feeds), ["y"], feeds)["y"])


@pytest.mark.parametrize("axis", [2, 1, 0, -1])
def test_flatten_axis_up_to_rank_on_open_dims(tmp_path, axis):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    from tests.conftest import save_onnx
    graph = helper.make_graph([helper.make_node("Flatten", ["x"], ["y"], axis=axis)], "flat",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    src, dst = tmp_path / "flat.onnx", tmp_path / "flat.mnn"
    save_onnx(graph, src)
    api.convert(src, dst)
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    ref = ort.InferenceSession(str(src)).run(None, {"x": x})[0]
    ours = mnntool.load(dst).run({"x": x})["y"]
    theirs = mnn_run(dst, ["x"], ["y"], {"x": x})["y"]
    assert ours.shape == ref.shape and theirs.shape == ref.shape, (ref.shape, ours.shape, theirs.shape)
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(theirs, ref)
