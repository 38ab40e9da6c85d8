"""Models as older deployment pipelines hold them: transformers and timm traced with torch.jit.trace (random
weights from small configs, seeded; nothing downloaded), converted and run in mnntool's runtime and MNN
against eager torch: cosine >= 0.9999 and max abs <= 1e-3 x the output's scale. The transformers are
traced with an attention mask that pads the end of the sequence (the mask functions, boolean indexing and
in-place writes it brings are what these cases exercise)."""
import pytest

torch = pytest.importorskip("torch")

from fixtures.zoo import _without_torchvision_ops  # noqa: E402

_without_torchvision_ops()      # torchvision's CUDA build beside the CPU torch: its ops skipped
transformers = pytest.importorskip("transformers")

import mnntool  # noqa: E402
from mnntool import api  # noqa: E402
from tests.conftest import assert_close, mnn_run  # noqa: E402

TXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _hf(config, model, **cfg):
    torch.manual_seed(0)
    return getattr(transformers, model)(getattr(transformers, config)(**cfg)).eval()


def _tokens(t=16, pad=3):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (1, t), generator=g)
    mask = torch.ones_like(ids)
    mask[:, t - pad:] = 0
    return ids, mask


class Text(torch.nn.Module):
    """The first output of a transformers model called with input_ids and attention_mask."""
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        extra = {"use_cache": False} if "use_cache" in self.m.forward.__code__.co_varnames else {}
        return self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False, **extra)[0]


class Ids(Text):
    """input_ids alone, no cache: transformers then looks for packed sequences in the positions
    (aten::diff, and index lists over them)."""
    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False, return_dict=False)[0]


class Audio(Text):
    def forward(self, input_values, attention_mask):
        return self.m(input_values=input_values, attention_mask=attention_mask, return_dict=False)[0]


def _wav2vec2():
    m = _hf("Wav2Vec2Config", "Wav2Vec2Model", **TXT, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_feat_extract_layers=2, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            feat_extract_norm="layer", do_stable_layer_norm=True)
    x = torch.randn(1, 800, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(1, 800, dtype=torch.long)
    mask[:, 600:] = 0
    return Audio(m), (x, mask)


def _image():
    return torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3)),


def _timm(name, **kw):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **kw).eval()


MODELS = {
    "bert": lambda: (Text(_hf("BertConfig", "BertModel", vocab_size=100, **TXT)), _tokens()),
    "distilbert": lambda: (Text(_hf("DistilBertConfig", "DistilBertModel", vocab_size=100, dim=32, n_layers=2,
                                    n_heads=4, hidden_dim=64)), _tokens()),
    "gpt2": lambda: (Text(_hf("GPT2Config", "GPT2LMHeadModel", vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                              n_positions=32)), _tokens()),
    "gpt2_ids": lambda: (Ids(_hf("GPT2Config", "GPT2LMHeadModel", vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                                 n_positions=32)), _tokens()[:1]),
    "llama": lambda: (Text(_hf("LlamaConfig", "LlamaForCausalLM", vocab_size=100, num_key_value_heads=2, **TXT)),
                      _tokens()),
    # T5's relative-position buckets: aten::min of two tensors
    "t5_encoder": lambda: (Text(_hf("T5Config", "T5EncoderModel", vocab_size=100, d_model=32, d_kv=8, d_ff=64,
                                    num_layers=2, num_heads=4)), _tokens()),
    "wav2vec2": _wav2vec2,
    "levit": lambda: (_timm("levit_128s", img_size=64), _image()),
    "edgenext": lambda: (_timm("edgenext_xx_small"), _image()),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_traced_model_matches_torch_in_both_runtimes(tmp_path, name):
    model, inputs = MODELS[name]()
    with torch.no_grad():
        traced = torch.jit.trace(model, inputs, check_trace=False)
        ref = model(*inputs).numpy()
    if name == "gpt2_ids":
        assert "aten::diff" in {n.kind() for n in traced.inlined_graph.nodes()}
    src, dst = tmp_path / f"{name}.pt", tmp_path / f"{name}.mnn"
    traced.save(str(src))
    names = [v.debugName().split(".")[0] for v in list(traced.graph.inputs())[1:]]
    api.convert(src, dst, input_shapes={n: tuple(x.shape) for n, x in zip(names, inputs)})
    g = api.load_graph(dst)
    feeds = {n: x.numpy() for n, x in zip(names, inputs)}
    assert_close(ref, mnntool.load(dst).run(feeds)[g.outputs[0]])
    assert_close(ref, mnn_run(dst, list(feeds), [g.outputs[0]], feeds)[g.outputs[0]])


def test_traced_model_output_dict(tmp_path):
    """A transformers model traced as is (strict=False): its ModelOutput is a dict in the graph
    (prim::DictConstruct); each value becomes an output, in order."""
    model = _hf("BertConfig", "BertModel", vocab_size=100, **TXT)
    inputs = _tokens()
    with torch.no_grad():
        traced = torch.jit.trace(model, inputs, strict=False, check_trace=False)
        ref = model(*inputs)
    assert "prim::DictConstruct" in {n.kind() for n in traced.inlined_graph.nodes()}
    src, dst = tmp_path / "bert.pt", tmp_path / "bert.mnn"
    traced.save(str(src))
    api.convert(src, dst, input_shapes={"input_ids": (1, 16), "attention_mask": (1, 16)})
    g = api.load_graph(dst)
    feeds = {"input_ids": inputs[0].numpy(), "attention_mask": inputs[1].numpy()}
    ours, theirs = mnntool.load(dst).run(feeds), mnn_run(dst, list(feeds), list(g.outputs), feeds)
    for name, r in zip(g.outputs, (ref.last_hidden_state, ref.pooler_output)):
        assert_close(r.numpy(), ours[name])
        assert_close(r.numpy(), theirs[name])
