"""The AMX int8 GEMM (int8_amx) and its host check (amx_host).

Everywhere: the decision (no AMX flags, MNNTOOL_AMX=0, no permission -> the VNNI path; arch_prctl
refused on a host without AMX), the inline asm compiling to the tile instructions, the NumPy twins of the
tile's blocking (blocks and grid planes) against independent integer references (exact), and the hook in
int8_convolution with the AMX kernel stood in by VNNI's (plumbing only: the blocks with their slack, the
grid's step table, the same bytes). On a host with AMX and the tile permission: the tile's int32 sums
against NumPy's (exact) and whole int8 convolutions with AMX on and off (bit for bit); skipped elsewhere.
"""
import numpy as np
import pytest

from mnntool.runtime.kernels import amx_host
from mnntool.runtime.kernels.micro import int8_amx, int8_conv, int8_gemm
from mnntool.runtime.kernels.ops.conv import Int8Grids
from tests.runtime.test_int8_grid import conv_inputs


@pytest.fixture
def fresh(monkeypatch):
    """amx_host's cached decision dropped before and after (the env read again)."""
    amx_host.forget()
    yield monkeypatch
    amx_host.forget()


def test_decision_without_flags(fresh):
    fresh.setattr(amx_host, "cpu_flags", lambda: frozenset({"avx512f", "avx512_vnni"}))
    fresh.delenv("MNNTOOL_AMX", raising=False)
    s = amx_host.state()
    assert not s["amx"] and not amx_host.available() and "cpuinfo" in s["reason"]
    assert amx_host.report()["kernel"] in ("vnni", "float")


def test_decision_env_off_and_permission(fresh):
    fresh.setattr(amx_host, "cpu_flags", lambda: frozenset({"amx_tile", "amx_int8", "amx_bf16"}))
    fresh.setattr(amx_host, "request_tiles", lambda: (False, "arch_prctl(ARCH_REQ_XCOMP_PERM, 18) = -1, errno 95"))
    fresh.setenv("NUMBA_CPU_NAME", "host")
    fresh.setenv("MNNTOOL_AMX", "0")
    assert amx_host.state()["reason"] == "MNNTOOL_AMX=0" and not amx_host.available()
    amx_host.forget()
    fresh.setenv("MNNTOOL_AMX", "1")
    s = amx_host.state()
    assert not s["amx"] and "errno 95" in s["reason"]          # flags but no permission: VNNI
    amx_host.forget()
    fresh.setattr(amx_host, "request_tiles", lambda: (True, "granted (permitted xfeatures 0x602e7)"))
    assert amx_host.available() and amx_host.report()["kernel"] == "amx"
    amx_host.forget()
    fresh.setenv("NUMBA_CPU_NAME", "generic")                  # code for another CPU: no AMX
    assert not amx_host.available()


def test_request_tiles_matches_flags():
    """The real arch_prctl: refused (an errno, no crash) where the CPU has no AMX; granted where it has."""
    granted, why = amx_host.request_tiles()
    has = {"amx_tile", "amx_int8"} <= amx_host.cpu_flags()
    if not has:
        assert not granted and why
    else:
        assert granted or "errno" in why


def test_tile_asm_compiles():
    """The inline asm assembles on any x86-64 host (LLVM does not check the CPU's features for it):
    ldtilecfg, the K loop of tile loads and TDPBSUDs, the stores and tilerelease are in the code."""
    import numba
    from numba import typeof
    prod, begin, end = int8_amx._products.real(), int8_amx._begin.real(), int8_amx._end.real()

    @numba.njit
    def one_tile(x, x0, x1, xs, w, woff, steps, ns, buf):
        begin(buf)
        prod(x, x0, x1, xs, w, woff, steps, ns, buf)
        end(buf)
    args = (np.zeros(64, np.uint8), 0, 0, 64, np.zeros(64, np.int8), 0, np.zeros(1, np.int64), 1,
            np.zeros(int8_amx.BUF, np.int32))
    sig = tuple(typeof(a) for a in args)
    one_tile.compile(sig)
    asm = one_tile.inspect_asm(sig)
    for op in ("ldtilecfg", "tilezero", "tileloadd", "tdpbsud", "tilestored", "tilerelease"):
        assert op in asm, op
    assert asm.count("tdpbsud") == 4


def _blocks(X, k4, slack):
    """(P, K) uint8 -> int8_gemm's packed blocks with `slack` extra blocks, flat (independent packing)."""
    P, K = X.shape
    nb = int8_gemm.pixel_blocks(P) + slack
    full = np.full((nb * 16, k4 * 4), 128, np.uint8)
    full[:P, :K] = X
    return np.ascontiguousarray(full.reshape(nb, 16, k4, 4).transpose(0, 2, 1, 3)).reshape(-1)


SHAPES = [(4, 1, 1), (12, 5, 49), (68, 40, 50), (100, 17, 37), (256, 33, 33), (1020, 3, 20)]


@pytest.mark.parametrize("K,oc,P", SHAPES)
def test_twin_blocks_exact(K, oc, P):
    """The tile's blocking (A tiles from pack_weights, 16-row B tiles reading past K into the next block
    or the slack) gives W @ X exactly (int64 reference)."""
    rng = np.random.default_rng(K + oc + P)
    k4 = -(-K // 4)
    X = rng.integers(0, 256, (P, K), dtype=np.uint8)
    W = rng.integers(-128, 128, (oc, K), dtype=np.int8)
    x = _blocks(X, k4, int8_amx.slack_blocks(k4))
    assert x.size - int8_gemm.pixel_blocks(P) * k4 * 64 >= int8_amx.AMX_SLACK
    got = int8_amx.twin_products(x, int8_amx.pack_weights(W), k4, oc, P)
    np.testing.assert_array_equal(got, W.astype(np.int64) @ X.astype(np.int64).T)


@pytest.mark.skipif(not int8_gemm.HAS_VNNI, reason="the grid reference is the VNNI kernel (AVX-512 VNNI)")
@pytest.mark.parametrize("geo,h,w", [((3, 3, 1, 1, 1, 1, 1, 1, 1, 1), 9, 13), ((3, 3, 2, 2, 1, 1, 1, 1, 1, 1), 11, 10)])
def test_twin_planes_exact(geo, h, w):
    """gemm_amx_planes' step table (offs every 16 words, a plane apart) read by the NumPy twin gives the
    VNNI grid kernel's sums (an epilogue that passes them through as floats, exact below 2^24)."""
    kh, kw, sh, sw, dh, dw, t, l, b, r = geo
    cin, cout = 64, 40
    oh, ow = (h + t + b - kh) // sh + 1, (w + l + r - kw) // sw + 1
    rng = np.random.default_rng(h * w)
    q = rng.integers(-20, 21, (cout, cin * kh * kw)).astype(np.int8)
    x = rng.standard_normal((1, cin, h, w)).astype(np.float32) * 60
    grids = Int8Grids((1.0, -127, 127), None, 0, 0)        # steps of 1: y is the integer sum itself
    seen = {}
    orig = int8_gemm.Int8Weights.matmul_grid

    def spy(self, g, offs, epf, out, blk, tab=int8_gemm.NO_TABLE):
        seen.update(g=g.copy(), offs=offs.copy(), blk=blk.copy(), wq=self)
        orig(self, g, offs, epf, out, blk, tab)
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(int8_gemm.Int8Weights, "matmul_grid", spy)
        mp.setattr(int8_conv, "GRID_FILL", 0.0)
        mp.setattr(int8_conv, "OC_LANES", np.inf)
        # alpha 1, no bias, a float output: y = float(sum(w u)) - sum(w) * 128, the sums exact in float32
        fn = int8_conv.int8_convolution(geo, q, np.ones(cout, np.float32), np.zeros(cout, np.float32), 0, grids,
                                        x.shape, (1, cout, oh, ow), 1)
        y = np.empty((1, cout, oh, ow), np.float32)
        fn([x], [y])
    finally:
        mp.undo()
    wk = q.reshape(cout, cin, kh, kw).transpose(0, 2, 3, 1).reshape(cout, -1)
    offs = seen["offs"]
    steps = np.ascontiguousarray(offs[::16] * 4, np.int64)
    twin = int8_amx.twin_planes(seen["g"], int8_amx.pack_weights(wk), steps, int(offs[1] - offs[0]) * 4, cout,
                                seen["blk"], oh * ow)
    expect = twin.astype(np.int64) - wk.astype(np.int64).sum(1, keepdims=True) * 128
    np.testing.assert_array_equal(y.reshape(cout, -1).astype(np.int64), expect)


CASES = {   # cin, cout, (kh, kw, sh, sw, dh, dw, t, l, b, r), (h, w), batch
    "3x3_64ch_grid": (64, 40, (3, 3, 1, 1, 1, 1, 1, 1, 1, 1), (9, 30), 1),
    "3x3_s2_64ch_grid": (64, 24, (3, 3, 2, 2, 1, 1, 1, 1, 1, 1), (15, 17), 2),
    "3x3_cin12_im2col": (12, 33, (3, 3, 1, 1, 1, 1, 1, 1, 1, 1), (7, 7), 1),
    "stem_7x7_s2": (3, 16, (7, 7, 2, 2, 1, 1, 3, 3, 3, 3), (30, 30), 1),
    "1x1_direct_40ch": (20, 40, (1, 1, 1, 1, 1, 1, 0, 0, 0, 0), (7, 7), 2),
    "1x1_s2_direct": (12, 33, (1, 1, 2, 2, 1, 1, 0, 0, 0, 0), (13, 13), 1),
}


def _conv(case, act=1):
    geo, q, alpha, bias, x, grids, out_shape, _ = conv_inputs(CASES[case])
    fn = int8_conv.int8_convolution(geo, q, alpha, bias, act, grids, x.shape, out_shape, 1)
    y = np.full(out_shape, np.nan, np.float32)
    fn([x], [y])
    return y


@pytest.mark.skipif(not int8_gemm.HAS_VNNI, reason="the stand-in kernel is VNNI's")
@pytest.mark.parametrize("case", sorted(CASES))
def test_hook_plumbing(fresh, case):
    """int8_convolution with AMX 'granted' and the AMX kernels stood in by VNNI's on the same buffers
    (the blocks with AMX_SLACK after them, the grid with the derived step table): the same bytes as the
    VNNI path, and the AMX weights used (blocks for C/4 not a multiple of 16, the grid else)."""
    fresh.setenv("MNNTOOL_AMX", "0")
    ref = _conv(case)
    fresh.setenv("MNNTOOL_AMX_MIN_K", "0")         # every K on the AMX path here (the threshold: test_min_k)
    used = []

    def blocks(self, x, epf, out, tab=int8_gemm.NO_TABLE):
        blocks_ = int8_gemm.pixel_blocks(out.shape[1])
        assert x.size >= blocks_ * self.k4 * 64 + int8_amx.AMX_SLACK
        used.append("blocks")
        int8_gemm.gemm_vnni.dispatcher()(x, self.vnni.data, self.k4, self.oc, self.ep, epf, out, tab)

    def grid(self, g, offs, epf, out, blk, tab=int8_gemm.NO_TABLE):
        assert len(offs) % 16 == 0 and np.all(np.diff(offs.reshape(-1, 16), axis=1) == offs[1] - offs[0])
        used.append("grid")
        self.vnni.matmul_grid(g, offs, epf, out, blk, tab)
    init = int8_amx.AmxWeights.__init__

    def init2(self, weights, wq, work, threads):
        init(self, weights, wq, work, threads)
        self.vnni = weights
    fresh.setattr(int8_amx.AmxWeights, "__init__", init2)
    fresh.setattr(int8_amx.AmxWeights, "matmul", blocks)
    fresh.setattr(int8_amx.AmxWeights, "matmul_grid", grid)
    fresh.setattr(amx_host, "available", lambda: True)
    got = _conv(case)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, ref)
    cin, geo = CASES[case][0], CASES[case][2]
    want = "grid" if geo[0] * geo[1] > 1 and -(-cin // 4) % 16 == 0 else "blocks"
    assert used and set(used) == {want}


def test_min_k_and_chunks(fresh):
    """AMX only from K = min_k() (MNNTOOL_AMX_MIN_K overrides), the VNNI path below; chunks: one on one
    thread, about four a thread at most CHUNK_MAX tiles each above."""
    fresh.setattr(amx_host, "available", lambda: True)
    fresh.delenv("MNNTOOL_AMX_MIN_K", raising=False)
    k = int8_amx.AMX_MIN_K
    rows = (np.ones(8, np.float32), np.zeros(8, np.float32))
    for kk, want in ((k - 4, False), (k, True)):
        wq = np.ones((8, kk), np.int8)
        got = int8_amx.amx_weights(int8_gemm.Int8Weights(wq, *rows, 1, 1), wq, 1, 1)
        assert (got is not None) == want
    fresh.setenv("MNNTOOL_AMX_MIN_K", "8")
    wq = np.ones((8, 8), np.int8)
    assert int8_amx.amx_weights(int8_gemm.Int8Weights(wq, *rows, 1, 1), wq, 1, 1) is not None
    assert int8_amx.chunk_of(196, 1) == 196 and int8_amx.chunk_of(196, 4) == 12
    assert int8_amx.chunk_of(3, 8) == 1 and int8_amx.chunk_of(10 ** 6, 4) == int8_amx.CHUNK_MAX
    at = int8_amx.tile_at.dispatcher()
    for nob, npt in ((1, 1), (3, 7), (16, 2)):
        for major in (False, True):         # every (channel block, pixel tile) once, in either order
            seen = [at(t, nob, npt, major) for t in range(nob * npt)]
            assert sorted(seen) == [(o, p) for o in range(nob) for p in range(npt)]
            assert nob * npt == 1 or seen[1] == ((1 % nob, 1 // nob) if major else (1 // npt, 1 % npt))


needs_amx = pytest.mark.skipif(not amx_host.available(), reason="needs AMX (amx_tile, amx_int8) and Linux's tile "
                               "permission: " + amx_host.state()["reason"])


@needs_amx
@pytest.mark.parametrize("K,oc,P", SHAPES + [(576, 64, 196)])
def test_amx_products_exact(K, oc, P):
    rng = np.random.default_rng(K * P)
    k4 = -(-K // 4)
    X = rng.integers(0, 256, (P, K), dtype=np.uint8)
    W = rng.integers(-128, 128, (oc, K), dtype=np.int8)
    x = _blocks(X, k4, int8_amx.slack_blocks(k4))
    got = np.empty((oc, P), np.int32)
    int8_amx.products_all.dispatcher()(x, int8_amx.pack_weights(W), int8_amx.block_steps(k4), k4, oc, got)
    np.testing.assert_array_equal(got.astype(np.int64), W.astype(np.int64) @ X.astype(np.int64).T)


@needs_amx
@pytest.mark.parametrize("case", sorted(CASES))
def test_amx_conv_bit_identical(fresh, case):
    fresh.setenv("MNNTOOL_AMX_MIN_K", "0")
    fresh.setenv("MNNTOOL_AMX", "0")
    ref = _conv(case)
    amx_host.forget()
    fresh.setenv("MNNTOOL_AMX", "1")
    np.testing.assert_array_equal(_conv(case), ref)


def test_bench_reports_int8_kernel(tmp_path):
    """`bench --json` says which int8 GEMM the process uses (amx, vnni or float) and why."""
    import onnx
    from onnx import TensorProto, helper as h, numpy_helper as nh
    from mnntool.api import convert
    from mnntool.timing import bench
    w = nh.from_array(np.random.RandomState(0).randn(4, 3, 3, 3).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    r = bench(tmp_path / "m.mnn", runs=1, warmup=0)["int8_kernel"]
    want = "amx" if amx_host.available() else "vnni" if int8_gemm.HAS_VNNI else "float"
    assert r["kernel"] == want and r["amx_reason"] == amx_host.state()["reason"]


def test_gemm_kernels_compile():
    """gemm_amx and gemm_amx_planes type and compile on any host at the types int8_convolution passes
    (they run only with AMX)."""
    from numba import typeof
    rows, epf = int8_gemm.epilogue(np.ones(8, np.float32), np.zeros(8, np.float32), np.zeros(8), 0.1, 0,
                                   (0.2, -128, 127, 0), 1)
    ep = tuple(np.zeros(32, np.float32) for _ in rows)
    out, tab = np.zeros((8, 4), np.float32), int8_gemm.NO_TABLE
    wa, steps = np.zeros(64, np.int8), np.zeros(1, np.int64)
    for fn, args in ((int8_amx.gemm_amx, (np.zeros(64, np.uint8), wa, steps, 1, 8, ep, epf, out, tab, 1)),
                     (int8_amx.gemm_amx_planes, (np.zeros(64, np.uint32), wa, steps, 64, 8, ep, epf, out, tab,
                                                 np.zeros((1, 4), np.int64), 1))):
        d = fn.dispatcher()
        d.compile(tuple(typeof(a) for a in args))
        assert d.signatures


def test_small_signal_stack_is_replaced_and_faulthandler_still_reports():
    """The ENOSPC remedy (amx_host._grow_alt_stack): faulthandler's signal stack replaced by a 256 KB one,
    and a crash still reported by faulthandler from it (in a child process)."""
    import subprocess
    import sys
    code = ("import ctypes, faulthandler; faulthandler.enable()\n"
            "from mnntool.runtime.kernels import amx_host as a\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print(a._grow_alt_stack(libc), a._grow_alt_stack(libc), flush=True)\n"
            "s = a._Stack(); libc.sigaltstack(None, ctypes.byref(s)); print(s.ss_size, flush=True)\n"
            "ctypes.string_at(0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["True", "False", str(amx_host.ALT_STACK)], (r.stdout, r.stderr)
    assert "Segmentation fault" in r.stderr and r.returncode != 0


def test_min_k_override(monkeypatch):
    """MNNTOOL_AMX_MIN_K: unset the measured default, a number that number, anything else one clear error
    (as MNNTOOL_PARALLEL_MIN_WORK), never silently the default."""
    from mnntool.errors import MnnToolError
    monkeypatch.delenv("MNNTOOL_AMX_MIN_K", raising=False)
    assert int8_amx.min_k() == int8_amx.AMX_MIN_K
    monkeypatch.setenv("MNNTOOL_AMX_MIN_K", "512")
    assert int8_amx.min_k() == 512
    monkeypatch.setenv("MNNTOOL_AMX_MIN_K", "abc")
    with pytest.raises(MnnToolError, match="MNNTOOL_AMX_MIN_K"):
        int8_amx.min_k()
