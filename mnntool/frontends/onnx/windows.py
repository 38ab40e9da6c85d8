"""Window geometry shared by the 1-D, 2-D and 3-D convolution and pooling converters: ONNX's kernel,
strides, dilations, pads and auto_pad as MNN's Convolution2DCommon fields."""
from __future__ import annotations

from ...errors import MnnToolError


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def spatial(ctx, node, a, kernel, x=None):
    """Kernel, stride, dilation and pads of a 1-D or 2-D window op as 2-D values (a 1-D op runs on
    [N, C, L, 1]), with auto_pad turned into explicit pads where the input size is known.
    Returns (kernel, strides, dilations, pads (t, l, b, r), padMode)."""
    rank = len(kernel)
    if rank not in (1, 2):
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': {rank}-D windows are not supported yet "
                           "(1-D and 2-D are)")
    strides = [int(v) for v in a.get("strides", [1] * rank)]
    dil = [int(v) for v in a.get("dilations", [1] * rank)]
    pads = [int(v) for v in a.get("pads", [0] * (2 * rank))]
    auto = _s(a.get("auto_pad", b"NOTSET"))
    mode = "CAFFE"
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        shape = ctx.shape(x or node.input[0])
        sizes = list(shape[2:]) if shape is not None else [None] * rank
        if all(isinstance(d, int) for d in sizes):
            pads = [0] * (2 * rank)
            for i, (n, k, st, d) in enumerate(zip(sizes, kernel, strides, dil)):
                out = -(-n // st)
                total = max((out - 1) * st + (k - 1) * d + 1 - n, 0)
                small, big = total // 2, total - total // 2
                pads[i], pads[i + rank] = (small, big) if auto == "SAME_UPPER" else (big, small)
        elif auto == "SAME_UPPER":
            mode = "SAME"
        else:
            raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': auto_pad SAME_LOWER needs a known input size")
    elif auto == "VALID":
        pads = [0] * (2 * rank)
    if rank == 1:
        return [int(kernel[0]), 1], [strides[0], 1], [dil[0], 1], (pads[0], 0, pads[1], 0), mode
    return [int(k) for k in kernel], strides, dil, (pads[0], pads[1], pads[2], pads[3]), mode


def conv_common(kernel, strides, dil, pads, mode, cout, cin, group) -> dict:
    t, l, b, r = pads
    return {"padX": int(l), "padY": int(t), "kernelX": int(kernel[1]), "kernelY": int(kernel[0]),
            "strideX": int(strides[1]), "strideY": int(strides[0]), "dilateX": int(dil[1]),
            "dilateY": int(dil[0]), "padMode": mode, "group": int(group), "outputCount": int(cout),
            "inputCount": int(cin), "relu": False, "relu6": False, "pads": [int(t), int(l), int(b), int(r)]}


def lift_1d(ctx, node, name, tag):
    """[N, C, L] -> [N, C, L, 1] for a 1-D op run as 2-D."""
    out = ctx.tmp(f"{node.name}_{tag}4d")
    ctx.emit("Unsqueeze", [name], [out], {"squeezeDims": [3]}, out)
    return out
