"""The pieces every convolution strategy uses: the layer's Geometry, what it is built from (Layer),
the Strategy unit, and the small helpers their kernels share."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import numpy as np

from .....errors import InvalidModel
from .....ir.ops.nn import pads_of, same_pads
from ... import Kernel, Scratch, SharedZeros, sized, writes
from ...micro.epilogue import NO_GRID, NO_POST, to_grid
from ...micro.float_gemm import crop_rows, fitted, phase_split

COLS = "conv_cols"      # the work buffer (kernels.scratch) im2col matrices, strided picks and wide outputs share


@dataclass(frozen=True)
class Geometry:
    """A convolution layer's shapes and window, all a strategy needs to decide."""
    n: int
    cin: int
    h: int
    w: int
    cout: int
    oh: int
    ow: int
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    t: int = 0
    l: int = 0      # noqa: E741
    b: int = 0
    r: int = 0
    group: int = 1

    @classmethod
    def of(cls, c: dict, in_shape, out_shape) -> Geometry:
        """From MNN's Convolution2DCommon table and the NCHW input and output shapes."""
        n, cin, h, w = (int(d) for d in in_shape)
        _, cout, oh, ow = (int(d) for d in out_shape)
        kh, kw = c.get("kernelY", 1), c.get("kernelX", 1)
        sh, sw = c.get("strideY", 1), c.get("strideX", 1)
        dh, dw = c.get("dilateY", 1), c.get("dilateX", 1)
        if c.get("padMode") == "SAME":      # from the output size shape inference gave
            (t, b), (l, r) = same_pads(h, oh, kh, sh, dh), same_pads(w, ow, kw, sw, dw)
        elif c.get("padMode") == "VALID":
            t = l = b = r = 0
        else:
            t, l, b, r = pads_of(c)
        return cls.made((n, cin, h, w, cout, oh, ow, kh, kw, sh, sw, dh, dw, t, l, b, r, c.get("group", 1) or 1))

    @classmethod
    def made(cls, values: tuple) -> Geometry:
        """Geometry(*values), every field given, without the frozen dataclass's __init__ (a setattr a field:
        ~2 us, made for every convolution at each new input shape); equal to it (the test compares)."""
        g = object.__new__(cls)
        g.__dict__.update(zip(_FIELDS, values))
        return g

    def check(self, weight_size: int, where: str) -> None:
        """What MNN's resize checks, before any kernel indexes memory with these numbers."""
        d = self.__dict__       # every field good (the usual case, at each new input shape): one expression
        kh, kw, sh, sw, dh, dw, group = d["kh"], d["kw"], d["sh"], d["sw"], d["dh"], d["dw"], d["group"]
        cin, cout = d["cin"], d["cout"]
        if (kh > 0 and kw > 0 and sh > 0 and sw > 0 and dh > 0 and dw > 0 and group > 0
                and d["t"] >= 0 and d["l"] >= 0 and d["b"] >= 0 and d["r"] >= 0
                and not cin % group and not cout % group and weight_size == cout * (cin // group) * kh * kw
                and d["n"] > 0 and cin > 0 and d["h"] > 0 and d["w"] > 0 and cout > 0 and d["oh"] > 0 and d["ow"] > 0
                and (d["oh"] - 1) * sh + (kh - 1) * dh + 1 <= d["h"] + d["t"] + d["b"]
                and (d["ow"] - 1) * sw + (kw - 1) * dw + 1 <= d["w"] + d["l"] + d["r"]):
            return
        bad = None
        if min(self.kh, self.kw, self.sh, self.sw, self.dh, self.dw, self.group) < 1:
            bad = f"kernel {self.kh}x{self.kw}, stride {self.sh}x{self.sw}, dilation {self.dh}x{self.dw}, group {self.group}"
        elif min(self.t, self.l, self.b, self.r) < 0:
            bad = f"negative padding {[self.t, self.l, self.b, self.r]}"
        elif self.cin % self.group or self.cout % self.group:
            bad = f"group {self.group} does not divide {self.cin} input and {self.cout} output channels"
        elif weight_size != self.cout * (self.cin // self.group) * self.kh * self.kw:
            bad = (f"{weight_size} weights for {self.cout} x {self.cin // self.group} x {self.kh} x {self.kw}")
        elif min(self.n, self.cin, self.h, self.w, self.cout, self.oh, self.ow) < 1:
            bad = f"empty input {[self.n, self.cin, self.h, self.w]} or output {[self.n, self.cout, self.oh, self.ow]}"
        elif ((self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1 > self.h + self.t + self.b
              or (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1 > self.w + self.l + self.r):
            bad = f"output {self.oh}x{self.ow} reads past the padded {self.h}x{self.w} input"
        if bad:
            raise InvalidModel(f"{where}: {bad}")

    @property
    def window(self) -> tuple:
        """(kh, kw, sh, sw, dh, dw, t, l, b, r) as the Numba kernels take it."""
        return self.kh, self.kw, self.sh, self.sw, self.dh, self.dw, self.t, self.l, self.b, self.r

    @property
    def padded(self) -> bool:
        return bool(self.t or self.l or self.b or self.r)

    @property
    def depthwise(self) -> bool:
        return self.group == self.cin == self.cout and self.group > 1

    @property
    def k3(self) -> bool:
        """3x3, undilated, the same stride both ways."""
        return self.kh == self.kw == 3 and self.dh == self.dw == 1 and self.sh == self.sw

    @property
    def fully_connected(self) -> bool:
        """A matmul's rows as a 1x1 convolution on 1x1 maps."""
        return self.kh == self.kw == 1 and self.h == self.w == self.oh == self.ow == 1 and self.group == 1

    @property
    def one_by_one(self) -> bool:
        """1x1, unpadded, group 1: a GEMM on (every sh-th row and sw-th column of) the input."""
        return self.kh == self.kw == 1 and not self.padded and self.group == 1

    @property
    def phase_planes(self) -> tuple[int, int]:
        """(hq, wq): the size of the phase planes (float_gemm.phase_split) that hold every tap of every
        output pixel, their zero border the padding."""
        hq = max(-(-(self.h + self.t + self.b) // self.sh), self.oh + (self.kh - 1) * self.dh // self.sh)
        wq = max(-(-(self.w + self.l + self.r) // self.sw), self.ow + (self.kw - 1) * self.dw // self.sw)
        return hq, wq

    @property
    def out_size(self) -> int:
        return self.cout * self.oh * self.ow

    @property
    def weight_bytes(self) -> int:
        return self.cout * (self.cin // self.group) * self.kh * self.kw * 4


_FIELDS = tuple(f.name for f in fields(Geometry))


def _live_taps(k: int, d: int, s: int, pad: int, size: int, out: int) -> tuple[int, int]:
    """The first and last tap along one axis that some output reads inside the input, the first kept
    at most pad // d so the trimmed padding stays >= 0."""
    live = [i for i in range(k) if any(0 <= y * s - pad + i * d < size for y in range(out))]
    if not live:
        return 0, k - 1
    return min(live[0], pad // d), live[-1]


def trimmed(g: Geometry, weight: np.ndarray) -> tuple[Geometry, np.ndarray]:
    """The layer without the kernel rows and columns that read only padding for every output pixel:
    DeepLab's ASPP branches (3x3, dilation 24 and 36 on a 16x16 map) are 1x1 convolutions in
    disguise, and computing their other eight taps multiplies zeros (exact: only zero products go)."""
    i0, i1 = _live_taps(g.kh, g.dh, g.sh, g.t, g.h, g.oh)
    j0, j1 = _live_taps(g.kw, g.dw, g.sw, g.l, g.w, g.ow)
    if (i0, i1, j0, j1) == (0, g.kh - 1, 0, g.kw - 1):
        return g, weight
    kh, kw = i1 - i0 + 1, j1 - j0 + 1
    t, l = g.t - i0 * g.dh, g.l - j0 * g.dw
    b = max(0, (g.oh - 1) * g.sh + (kh - 1) * g.dh + 1 - g.h - t)
    r = max(0, (g.ow - 1) * g.sw + (kw - 1) * g.dw + 1 - g.w - l)
    w = weight.reshape(g.cout, g.cin // g.group, g.kh, g.kw)[:, :, i0:i1 + 1, j0:j1 + 1]
    g2 = replace(g, kh=kh, kw=kw, t=t, l=l, b=b, r=r, dh=g.dh if kh > 1 else 1, dw=g.dw if kw > 1 else 1)
    return g2, np.ascontiguousarray(w.reshape(g.cout, -1))


class Layer(NamedTuple):
    """What a strategy builds from besides the geometry."""
    weight: np.ndarray      # (cout, cin/group * kh * kw)
    bias: np.ndarray
    act: int                # epilogue.RELU / RELU6 / 0
    grid: tuple = NO_GRID   # the int8 grid the output is rounded to, or NO_GRID
    threads: int = 1
    post: tuple = NO_POST   # the activation fused after the bias and ReLU bounds (epilogue.POST_*, alpha, beta)


class Strategy:
    name = ""
    avx512 = False      # needs AVX-512
    fuses_post = False  # applies Layer.post in its own epilogue (else `with_post` runs it after the kernel)
    no_post = False     # not for layers with a fused activation past the ReLU bounds (a later strategy runs them)
    post_only = False   # only for layers with such an activation (without one a later strategy runs them)

    def suits(self, g: Geometry) -> bool:
        raise NotImplementedError

    def build(self, g: Geometry, layer: Layer) -> Kernel:
        raise NotImplementedError


def per_image(g: Geometry, one):
    """A kernel running `one(x_i, y_i)` over the batch."""
    def run(inputs, outputs):
        x, y = inputs[0], outputs[0]
        for i in range(g.n):
            one(x[i], y[i])
    return writes(run)


def regrid_of(g: Geometry, layer: Layer):
    """Rounding to the output grid, for the paths whose own epilogue does not round."""
    rounding = sized(to_grid, g.n * g.out_size, layer.threads)

    def regrid(y):
        if layer.grid[1] > 0:
            flat = y.reshape(-1, y.shape[-1])
            rounding(flat, layer.grid, flat)
    return regrid


def padder(g: Geometry):
    """x in a zero border; the bordered buffer is shared by the layers of one geometry (SharedZeros)."""
    if not g.padded:
        return lambda x: x
    padded_of = SharedZeros((g.h, g.w, g.t, g.l), (g.cin, g.h + g.t + g.b, g.w + g.l + g.r))

    def pad(x):
        padded = padded_of()
        padded[:, g.t:g.t + g.h, g.l:g.l + g.w] = x
        return padded
    return pad


def phase_splitter(g: Geometry, threads: int, spare_row: bool = False):
    """fn(x) -> x's phase planes (float_gemm.phase_split: big enough for every tap of every output pixel,
    their zero border the padding), in a buffer the layers of the geometry share; with `spare_row`, one
    zero row past each plane, for kernels whose thrown-away columns of the last rows read into it."""
    hq, wq = g.phase_planes
    phases_of = SharedZeros((g.h, g.w, g.t, g.l, g.sh, g.sw), (g.cin * g.sh * g.sw, hq + spare_row, wq))
    split = fitted(phase_split, g.cin * g.h * g.w, threads)

    def split_phases(x):
        phases = phases_of()
        split(np.ascontiguousarray(x), g.t, g.l, g.sh, g.sw, phases)
        return phases
    return split_phases


def on_wide_rows(g: Geometry, threads: int, fill):
    """A kernel for the kernels that read the phase planes (with their spare row) on the planes' width:
    fill(phases, wide) writes every column of the wide output (cout, oh, wq), the thrown-away ones too,
    which is then cropped to the output's width (float_gemm.crop_rows)."""
    split = phase_splitter(g, threads, spare_row=True)
    if g.phase_planes[1] == g.ow:       # no thrown-away columns (a kh x 1 window): written in place
        return per_image(g, lambda x, y: fill(split(x), y))
    wide_of = Scratch(COLS, (g.cout, g.oh, g.phase_planes[1]))
    crop = fitted(crop_rows, g.out_size, threads)

    def one(x, y):
        wide = wide_of()
        fill(split(x), wide)
        crop(wide, y)
    return per_image(g, one)


def with_post(k: Kernel, post: tuple, size: int, threads: int) -> Kernel:
    """The kernel followed by the fused activation over its output (`size` floats), for strategies
    without an IR epilogue (the activation still costs no step and no tensor of its own)."""
    if not post[0]:
        return k
    from ...micro.activation_ir import post_flat
    kind, alpha, beta = int(post[0]), np.float32(post[1]), np.float32(post[2])
    fn, apply = k.fn, sized(post_flat, size * 8, threads)

    def run(inputs, outputs):
        fn(inputs, outputs)
        apply(outputs[0].reshape(-1), kind, alpha, beta)
    return Kernel(run, True, k.out_grid)
