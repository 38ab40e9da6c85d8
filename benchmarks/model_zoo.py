"""The model zoo (fixtures/zoo.py) through every export path, converted by mnntool and run in mnntool's
runtime and MNN's, against torch eager; MNN's own converter on the same ONNX files beside it.

    python benchmarks/model_zoo.py [--models bert gpt2 ...] [--paths dynamo legacy ts pt2 script] [--out build/zoo]

Beside fixtures/zoo.py's small models (every path, and `script`, torch.jit.script, for the timm and
torchvision ones), the cases older deployment pipelines hold (EXTRA below): transformers at their real
sizes traced with input_ids and a padding attention mask (and BERT through the legacy ONNX exporter with
both inputs open), timm LeViT and EdgeNeXt traced and scripted, and silero-vad's scripted .jit as its
wheel ships it (the sample rate fixed by a scripted wrapper).

A case passes when every checked input shape gives cosine >= 0.9999 and max abs error <= 1e-3 x max|ref|
(the issue's bar). The example shape is always checked; a second one where the export leaves dims open.
Each case runs in a child process (a native crash in either runtime costs one case). Writes
<out>/zoo.json and zoo.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PATHS = ["dynamo", "legacy", "ts", "pt2", "script"]
SUFFIX = {"dynamo": ".onnx", "legacy": ".onnx", "ts": ".pt", "pt2": ".pt2", "script": ".pt"}
SCRIPTABLE = ("timm", "torchvision")     # transformers' models do not script (torch.jit.script refuses them)


def _hf_text(config: str, model: str, vocab: int, mask: bool = True):
    """A transformers model at its config's default (real) size, called with input_ids and attention_mask
    (or input_ids alone, no cache: GPT-2 then checks the positions for packed sequences)."""
    def build():
        import torch
        from fixtures.zoo import _without_torchvision_ops
        _without_torchvision_ops()
        import transformers
        m = getattr(transformers, model)(getattr(transformers, config)())

        class Text(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask):
                out = self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False,
                             **({"use_cache": False} if "GPT" in model else {}))
                return out[0]

        class Ids(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, input_ids):
                return self.m(input_ids=input_ids, use_cache=False, return_dict=False)[0]
        return Text() if mask else Ids()
    return build


def _text_inputs(t=16, vocab=30522, pad=4):
    """input_ids and an attention mask padding the first sequence's end (`shape`: another batch x length)."""
    def make(seed=0, shape=(1, t)):
        import torch
        ids = torch.randint(0, vocab, tuple(shape), generator=torch.Generator().manual_seed(seed))
        mask = torch.ones_like(ids)
        mask[0, shape[1] - pad:] = 0
        return ids, mask
    return make


def _ids_only(vocab: int, t: int = 16):
    def make(seed=0):
        import torch
        return torch.randint(0, vocab, (1, t), generator=torch.Generator().manual_seed(seed)),
    return make


def _wav2vec2_base():
    import torch
    from fixtures.zoo import _without_torchvision_ops
    _without_torchvision_ops()
    import transformers
    m = transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(feat_extract_norm="layer", do_stable_layer_norm=True))

    class Audio(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, input_values, attention_mask):
            return self.m(input_values=input_values, attention_mask=attention_mask, return_dict=False)[0]
    return Audio()


def _audio_inputs(seed=0, n=8000, valid=6000):
    import torch
    x = torch.randn(1, n, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(1, n, dtype=torch.long)
    mask[:, valid:] = 0
    return x, mask


def _silero():
    """silero-vad's shipped TorchScript (scripted, stateful), the sample rate fixed as users wrap it."""
    import importlib.resources
    import torch
    vad = torch.jit.load(str(importlib.resources.files("silero_vad").joinpath("data/silero_vad.jit")),
                         map_location="cpu").eval()

    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = vad

        def forward(self, x):
            return self.m(x, 16000)
    return Fixed()


def _speech_chunk(seed=0):
    """512 samples at 16 kHz: a voiced-like tone with noise (silero-vad's chunk size)."""
    import torch
    t = torch.arange(512) / 16000
    g = torch.Generator().manual_seed(seed)
    return (0.3 * torch.sin(2 * torch.pi * 220 * t) + 0.05 * torch.randn(512, generator=g))[None],


def _extra():
    """Cases beyond fixtures/zoo.py, as its Entry (build, inputs, ...) with the paths each takes; RoBERTa
    and T5's encoder beside the zoo's transformers (T5's relative positions bring aten::min)."""
    from fixtures.zoo import Entry, _image, _timm
    text = dict(shapes=[(2, 9)], names=("input_ids", "attention_mask"),
                dynamic={0: {0: "B", 1: "T"}, 1: {0: "B", 1: "T"}}, group="transformers")
    return {
        "bert_base+mask": (Entry(_hf_text("BertConfig", "BertModel", 30522), _text_inputs(), **text), ("ts", "legacy")),
        "distilbert_base+mask": (Entry(_hf_text("DistilBertConfig", "DistilBertModel", 30522), _text_inputs(), **text),
                                 ("ts", "legacy")),
        "gpt2_small+mask": (Entry(_hf_text("GPT2Config", "GPT2LMHeadModel", 50257), _text_inputs(vocab=50257), **text),
                            ("ts", "legacy")),
        "roberta_base+mask": (Entry(_hf_text("RobertaConfig", "RobertaModel", 50265), _text_inputs(vocab=50265),
                                    **text), ("ts", "legacy")),
        "t5_small_encoder+mask": (Entry(_hf_text("T5Config", "T5EncoderModel", 32128), _text_inputs(vocab=32128),
                                        **text), ("ts", "legacy")),
        "gpt2_small": (Entry(_hf_text("GPT2Config", "GPT2LMHeadModel", 50257, mask=False), _ids_only(50257),
                             names=("input_ids",), group="transformers"), ("ts",)),
        "wav2vec2_base+mask": (Entry(_wav2vec2_base, _audio_inputs, names=("input_values", "attention_mask"),
                                     group="transformers"), ("ts",)),
        "levit_128s": (Entry(_timm("levit_128s"), _image()), ("ts", "script", "dynamo")),
        "edgenext_xx_small": (Entry(_timm("edgenext_xx_small"), _image()), ("ts", "script", "dynamo")),
        "silero_vad": (Entry(_silero, _speech_chunk, group="audio"), ("script",)),
    }


def cases() -> dict[str, tuple]:
    """Every case: name -> (entry, its paths, whether the entry's model takes all inputs itself)."""
    from fixtures.zoo import ZOO
    out = {name: (e, tuple(p for p in PATHS if p != "script" or e.group in SCRIPTABLE), False)
           for name, e in ZOO.items()}
    out.update({name: (e, paths, True) for name, (e, paths) in _extra().items()})
    return out


def _export_own(entry, model, path, how: str) -> None:
    """EXTRA's models take all their inputs: traced, scripted (silero ships scripted: kept so) or legacy ONNX."""
    import contextlib
    import io
    import torch
    x = entry.inputs()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        if how == "ts":
            torch.jit.save(torch.jit.trace(model, x, check_trace=False), str(path))
        elif how == "script":
            torch.jit.save(model if isinstance(model, torch.jit.ScriptModule) else torch.jit.script(model), str(path))
        elif how == "legacy":
            axes = {entry.names[k]: entry.dynamic.get(k, {}) for k in range(len(x)) if entry.dynamic.get(k)}
            torch.onnx.export(model, x, str(path), input_names=list(entry.names), output_names=["y"], dynamo=False,
                              opset_version=17, dynamic_axes=axes or None)
        else:
            raise ValueError(f"path {how} is not one this case takes")


def _score(got, ref) -> tuple[float, float, bool]:
    import numpy as np
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return 0.0, float("inf"), False
    cos = float(got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref) + 1e-30))
    err = float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()), 1e-12)
    return cos, err, cos >= 0.9999 and err <= 1e-3


def one(name: str, how: str, out: Path) -> dict:
    """Export, convert and check one case (runs in the child)."""
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    from fixtures.zoo import export, first_output, wrapped
    from mnntool import api
    from mnntool.runtime.mnn_backend import MnnSession
    from mnntool.runtime.session import Session
    entry, paths, own = cases()[name]
    torch.manual_seed(0)
    res: dict = {"model": name, "path": how, "group": entry.group}
    t0 = time.perf_counter()
    try:
        if how not in paths:
            raise ValueError(f"{name} is not exported by {how}")
        built = entry.build().eval()
        # scripted as users script them: the model itself (its dict or tuple output read as traced ones are)
        model = torch.jit.script(built) if how == "script" else (built if own else wrapped(built))
        src = out / f"{name}.{how}{SUFFIX[how]}"
        if not src.exists():
            mine = how == "script" or (own and how in ("ts", "legacy"))
            (_export_own if mine else export)(entry, model, src, how)
    except Exception as e:      # noqa: BLE001 - the exporter's failure is a row, not a crash
        return {**res, "stage": "export", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
    x = entry.inputs()
    shapes = [tuple(x[0].shape)]
    open_dims = set(entry.dynamic.get(0, {})) - ({0} if how == "dynamo" else set())
    if how in ("dynamo", "legacy") and open_dims:
        for s in entry.shapes:
            shapes.append(tuple(s[a] if a in open_dims else shapes[0][a] for a in range(len(s))))
    dst = src.with_suffix(src.suffix + ".mnn")
    try:
        shape_arg = None
        if how in ("ts", "script"):     # the inputs as the saved module names them
            names = [v.debugName().split(".")[0] for v in list(torch.jit.load(str(src)).graph.inputs())[1:]]
            shape_arg = {n: tuple(v.shape) for n, v in zip(names, x)}
        api.convert(src, dst, input_shapes=shape_arg)
    except Exception as e:      # noqa: BLE001
        return {**res, "stage": "convert", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
    res["convert_s"] = round(time.perf_counter() - t0, 1)
    g = api.load_graph(dst)
    runs = {"mnntool": Session(g)}
    try:
        runs["mnn"] = MnnSession(str(dst), g.inputs, g.outputs)
    except Exception as e:      # noqa: BLE001
        res["mnn_error"] = str(e)[:200]
    theirs = None
    if SUFFIX[how] == ".onnx":
        from mnntool.mnn_tools import mnnconvert
        theirs_path = src.with_suffix(".mnnconvert.mnn")
        try:
            if not theirs_path.exists():
                mnnconvert("-f", "ONNX", "--modelFile", str(src), "--MNNModel", str(theirs_path), "--bizCode", "zoo")
            theirs = MnnSession(str(theirs_path), [i.name for i in _onnx_inputs(src)], ["y"])
        except Exception as e:      # noqa: BLE001
            res["mnnconvert_error"] = str(e)[:200]
    for k, shape in enumerate(shapes):
        if own:
            xs = entry.inputs(k + 1) if k == 0 else entry.inputs(k + 1, shape=shape)
        else:
            gen = torch.Generator().manual_seed(k + 1)
            xs = (torch.randint(0, 100, shape, generator=gen) if x[0].dtype == torch.int64
                  else torch.randn(*shape, generator=gen),)
        with torch.no_grad():
            ref = first_output(_fresh(entry, own, how, model)(*xs)).numpy()
        feeds = {n: v.numpy() for n, v in zip(g.inputs, xs)}
        for rt, sess in list(runs.items()) + ([("mnnconvert", theirs)] if theirs is not None else []):
            try:
                got = sess.run(feeds if rt != "mnnconvert" else dict(zip(sess.inputs, feeds.values())))
                cos, err, ok = _score(list(got.values())[0], ref)
            except Exception as e:      # noqa: BLE001
                cos, err, ok = 0.0, float("inf"), False
                res[f"{rt}_error"] = str(e)[:200]
            row = res.setdefault(rt, {"ok": True, "cos": 1.0, "err": 0.0})
            row["ok"] &= ok
            row["cos"], row["err"] = min(row["cos"], cos), max(row["err"], err)
    res["shapes"] = [list(s) for s in shapes]
    return res


def _fresh(entry, own, how, model):
    """The reference: the eager model, except a stateful scripted one (silero-vad), which a converted file
    holds as its first call: a fresh instance for each check."""
    if entry.group == "audio" and own:
        return entry.build()
    return model


def _onnx_inputs(path):
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    return [i for i in m.graph.input if i.name not in init]


def _cell(r: dict, rt: str) -> str:
    if "stage" in r:
        return f"{r['stage']} failed" if rt != "mnnconvert" else "-"
    v = r.get(rt)
    if v is None:
        return "-" if rt == "mnnconvert" else "not run"
    return ("pass" if v["ok"] else "FAIL") + f" ({v['cos']:.6f})"


def markdown(rows: list[dict]) -> str:
    lines = ["| model | export | mnntool runtime | MNN runtime | MNN's converter + runtime | shapes | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        note = r.get("error") or r.get("mnntool_error") or r.get("mnn_error") or r.get("mnnconvert_error") or ""
        shapes = " ".join("x".join(map(str, s)) for s in r.get("shapes", []))
        lines.append(f"| {r['model']} | {r['path']} | {_cell(r, 'mnntool')} | {_cell(r, 'mnn')} | "
                     f"{_cell(r, 'mnnconvert')} | {shapes} | {note[:120].replace('|', '/')} |")
    for rt in ("mnntool", "mnn", "mnnconvert"):
        for how in PATHS:
            sel = [r for r in rows if r["path"] == how]
            if sel:
                n = sum(1 for r in sel if (r.get(rt) or {}).get("ok"))
                lines.append(f"\n{rt}, {how}: {n}/{len(sel)} pass" if rt != "mnnconvert" or how in ("dynamo", "legacy")
                             else "")
    return "\n".join(x for x in lines if x != "")


def main():
    all_cases = cases()
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=list(all_cases))
    ap.add_argument("--paths", nargs="*", default=PATHS, choices=PATHS)
    ap.add_argument("--out", default=str(ROOT / "build" / "zoo"))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        print("ZOO-RESULT " + json.dumps(one(args.one[0], args.one[1], out)))
        return
    rows = []
    for name in args.models:
        for how in [p for p in args.paths if p in all_cases[name][1]]:
            t0 = time.perf_counter()
            try:
                p = subprocess.run([sys.executable, __file__, "--out", str(out), "--one", name, how],
                                   capture_output=True, text=True, timeout=args.timeout)
                line = next((x for x in p.stdout.splitlines() if x.startswith("ZOO-RESULT ")), None)
                r = json.loads(line[11:]) if line else {"model": name, "path": how, "stage": "crash",
                                                       "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
            except subprocess.TimeoutExpired:
                r = {"model": name, "path": how, "stage": "timeout", "error": f"over {args.timeout:.0f} s"}
            rows.append(r)
            print(f"{name:28s} {how:7s} {_cell(r, 'mnntool'):24s} {_cell(r, 'mnn'):24s} {_cell(r, 'mnnconvert'):24s} "
                  f"{time.perf_counter() - t0:5.0f}s {(r.get('error') or '')[:100]}", flush=True)
    (out / "zoo.json").write_text(json.dumps(rows, indent=1))
    (out / "zoo.md").write_text(markdown(rows) + "\n")
    print(f"wrote {out / 'zoo.md'}")


if __name__ == "__main__":
    main()
