"""Models as torch.onnx.export writes them, by both exporters (the default dynamo one at opset 18 and
dynamo=False at 17): converted, run in mnntool's runtime and in MNN, compared with eager torch
(cosine >= 0.9999, max abs <= 1e-3 x output scale)."""
import numpy as np
import pytest

from tests.conftest import assert_close, mnn_run

torch = pytest.importorskip("torch")


class TinyViT(torch.nn.Module):
    """Patch embedding, class token, position slice (the 'Slice ends must be a constant' case), two
    pre-norm encoder layers, head."""
    def __init__(self, dim=32, depth=2, heads=4, patch=8, img=32, classes=10):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, dim, patch, patch)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, dim))
        self.pos = torch.nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, dim))
        layer = torch.nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout=0.0, batch_first=True, norm_first=True,
                                                 activation="gelu")
        self.enc = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos[:, : x.shape[1] + 1]
        return self.head(self.norm(self.enc(x))[:, 0])


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_vit_exports_convert_and_match(tmp_path, dynamo):
    pytest.importorskip("onnxscript") if dynamo else None
    from mnntool.api import convert
    from mnntool.format import reader
    from mnntool.runtime.session import Session
    torch.manual_seed(0)
    model = TinyViT().eval()
    x = torch.randn(2, 3, 32, 32)
    ref = model(x).detach().numpy()
    src = tmp_path / "vit.onnx"
    torch.onnx.export(model, (x,), str(src), dynamo=dynamo, input_names=["x"], output_names=["y"],
                      opset_version=18 if dynamo else 17)
    convert(src, tmp_path / "vit.mnn")
    g = reader.load(tmp_path / "vit.mnn")
    feeds = {g.inputs[0]: x.numpy()}
    assert_close(ref, Session(g).run(feeds)[g.outputs[0]])
    assert_close(ref, mnn_run(tmp_path / "vit.mnn", g.inputs, g.outputs, feeds)[g.outputs[0]])
