"""The wide speed set: 50 public architectures at their real sizes, for the speed issue's rule "tune on
the whole set, never on one model". Every timm family with a small member, torchvision detection and
segmentation heads, real-size transformers (BERT-base, GPT-2 small, ViT-base, Whisper-tiny's encoder, a
0.5B-class decoder's prefill), and models with open H/W run at several shapes. Random weights, seeded;
nothing is downloaded.

    SET[name] -> Case(build, inputs, names, dynamic, shapes)

`shapes` lists the further input shapes an open-H/W model is timed at (each a row of its own).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from fixtures.zoo import _hf, _image, _timm, _tv, _without_torchvision_ops


@dataclass
class Case:
    build: Callable
    inputs: Callable                    # seed -> tuple of example tensors
    names: tuple = ("x",)
    dynamic: dict = field(default_factory=dict)     # input position -> {axis: name} left open in the export
    shapes: list = field(default_factory=list)      # further first-input shapes to time (open dims only)
    group: str = "timm"


def _ids(t: int, vocab: int):
    def make(seed=0):
        import torch
        return (torch.randint(0, vocab, (1, t), generator=torch.Generator().manual_seed(seed)),)
    return make


def _mel(frames=3000):
    def make(seed=0):
        import torch
        return (torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(seed)),)
    return make


def _whisper_encoder():
    _without_torchvision_ops()
    import transformers
    cfg = transformers.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4,
                                     decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
                                     num_mel_bins=80, vocab_size=51865)
    return transformers.WhisperModel(cfg).get_encoder()


def _ssdlite():
    _without_torchvision_ops()
    import torch
    import torchvision.models.detection as det
    m = det.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)

    class Heads(torch.nn.Module):
        """Backbone and heads: the part a deployment runs in the engine (boxes decoded after it)."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            feats = list(self.m.backbone(x).values())
            out = self.m.head(feats)
            return torch.cat([out["bbox_regression"], out["cls_logits"]], dim=-1)
    return Heads(m)


_HW = {0: {2: "H", 3: "W"}}
_TIMM_224 = [
    "resnet50", "levit_128s", "hrnet_w18_small", "fastvit_t8", "efficientvit_b0", "edgenext_xx_small",
    "mobileone_s0", "repvgg_a0", "rexnet_100", "mnasnet_100", "lcnet_050", "tinynet_a", "dla34",
    "cspresnet50", "res2net50_14w_8s", "resnest14d", "coat_lite_tiny", "pvt_v2_b0", "poolformer_s12",
    "mixer_s16_224", "swin_tiny_patch4_window7_224", "efficientformer_l1", "efficientformerv2_s0",
    "regnetx_002", "mobilevitv2_050", "tiny_vit_5m_224", "mobilenetv4_conv_small", "ese_vovnet19b_dw",
    "selecsls42b", "hgnetv2_b0", "xcit_nano_12_p16_224", "gcvit_xxtiny", "convnextv2_atto",
    "efficientnetv2_rw_t", "nf_resnet26", "inception_next_atto", "fasternet_t0", "starnet_s1",
    "repghostnet_050", "pit_ti_224", "visformer_tiny", "ghostnetv2_100",
]

SET: dict[str, Case] = {name: Case(_timm(name), _image()) for name in _TIMM_224}
SET.update({
    "inception_v3": Case(_timm("inception_v3"), _image(1, 299, 299)),
    "maxvit_nano_rw_256": Case(_timm("maxvit_nano_rw_256"), _image(1, 256, 256)),
    # open H/W, timed at the export shape and at the further shapes (OCR/detection see new shapes)
    "resnet18_hw": Case(_timm("resnet18"), _image(), dynamic=_HW, shapes=[(1, 3, 320, 480), (1, 3, 512, 384)]),
    "mobilenetv3_hw": Case(_timm("mobilenetv3_large_100"), _image(1, 256, 256), dynamic=_HW,
                           shapes=[(1, 3, 384, 640)]),
    "squeezenet1_1": Case(_tv("squeezenet1_1"), _image(), group="torchvision"),
    "fcn_resnet50": Case(_tv("fcn_resnet50", weights_backbone=None, aux_loss=False), _image(1, 256, 256),
                         group="torchvision"),
    "ssdlite320_heads": Case(_ssdlite, _image(1, 320, 320), group="torchvision"),
    "bert_base_128": Case(_hf("BertConfig", "BertModel"), _ids(128, 30522), ("input_ids",), group="transformers"),
    "gpt2_small_prefill_128": Case(_hf("GPT2Config", "GPT2LMHeadModel"), _ids(128, 50257), ("input_ids",),
                                   group="transformers"),
    "vit_base_224": Case(_hf("ViTConfig", "ViTModel"), _image(), ("pixel_values",), group="transformers"),
    "whisper_tiny_encoder": Case(_whisper_encoder, _mel(), ("input_features",), group="transformers"),
    # Qwen2.5-0.5B's layer shapes (24 layers, 896 wide, 14 heads, 2 KV heads) with a 32k vocabulary, so
    # the ONNX file stays under protobuf's 2 GB; prefill of 128 tokens, no cache
    "qwen05b_prefill_128": Case(_hf("Qwen2Config", "Qwen2Model", vocab_size=32000, hidden_size=896,
                                    intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                    num_key_value_heads=2, max_position_embeddings=512, use_cache=False),
                                _ids(128, 32000), ("input_ids",), group="transformers"),
})
