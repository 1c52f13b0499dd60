"""Building blocks shared by every RWKV version: layer norm, token shift, and projections that hide
whether a weight is dense, int8, or streamed to its device per call."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import ops
from ..ops._checks import ACTIVATIONS
from ..ops.reference import activate, activate_, ln_mix_math, ln_mix_rows_math, rows
from ..strategy import LayerPlacement
from .program import Program, Unsupported, Val, activation_steps, need

GROUP_NORM_EPS = 64e-5  # upstream's ln_x epsilon ("GN(x/8, eps=1e-5)")
LAYER_NORM_EPS = 1e-5  # F.layer_norm's default, which upstream's layer norms use


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Over x's last dimension, w's length."""
    return F.layer_norm(x, (rows(w),), weight=w, bias=b, eps=LAYER_NORM_EPS)


def stacked_mixes(mixes: list) -> tuple:
    """Per-channel mix vectors [C] as one [n, 1, C] tensor, and 1 minus it: one broadcast op then
    mixes a [T, C] activation n ways ([n, T, C]), where n separate ops cost n times the per-op
    overhead that dominates one-token decode. The values are those of the separate ops."""
    mix = torch.stack(mixes).unsqueeze(1)
    return mix, 1 - mix


def concrete_device(device) -> torch.device:
    """``cuda`` (no index) as the CUDA device current now, i.e. where weight placement puts it, so
    later state allocation, state checks and streaming do not follow a changed current device."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def moved(x: torch.Tensor, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """x in dtype on dev; x itself, without a call, when it already is (no no-op conversion per
    layer while decoding)."""
    return x if x.dtype == dtype and x.device == dev else x.to(dtype=dtype, device=dev)


def _compiled(name: str, dispatch_key: str) -> bool:
    """Whether a compiled kernel is registered (loads rwkv._C once; never warns)."""
    from ..ops import _backend

    _backend._load()
    return _backend.has_kernel(name, dispatch_key)


def onednn_linear():
    """torch's oneDNN linear, ``torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], None)``
    with w [M, N] (our column-major weights transposed: no copy), or None when this torch has no
    oneDNN. For fp32 products of several rows on CPU it is faster than ``x @ W``, which torch
    sends to MKL's sgemm (markedly so on AMD CPUs and for few rows; ``benchmarks/bench_gemm.py``
    compares them). bf16 products already go to oneDNN through ``x @ W``."""
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


def native_bf16_gemm() -> bool:
    """Whether torch's bf16 GEMM runs natively on this CPU: the compiled kernels' active ISA is
    avx512bf16 (without compiled kernels: torch's own capability check). Without it (AVX2, plain
    AVX-512), oneDNN's bf16 GEMM is slower than its fp32 one (bf16_product_fp32)."""
    isa = ops.cpu_isa()
    if isa == "none":
        return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
    return isa == "avx512bf16"


#: The most rows a dense CPU product sends to linear_rows (more go to the GEMMs, which reach their
#: multiply-add rate there; fewer read the weight more than once).
ROWS_MAX = 64

#: Elements of a bf16 weight widened to fp32 at a time by bf16_product_fp32 (8 MiB of fp32).
BF16_TILE_ELEMENTS = 1 << 21
#: From this many rows on, bf16 products on a CPU without native bf16 GEMM go through fp32 tiles:
#: there oneDNN's bf16 GEMM falls behind widening tiles to fp32 from about 8 rows on, and by
#: several times at prefill's hundreds of rows.
BF16_VIA_FP32_MIN_ROWS = 8


def bf16_product_fp32(x: torch.Tensor, W: torch.Tensor, linear) -> torch.Tensor:
    """``x @ W`` for bf16 x [T, N] and a column-major bf16 W [N, M] (W.t() contiguous) through
    fp32: tiles of W's columns widened to fp32 (exact), multiplied by the fp32 x with ``linear``
    (onednn_linear, or x @ tile.t() when it is None), each tile's fp32 result rounded to bf16 as
    torch's bf16 GEMM rounds its fp32 accumulators. The same products, summed in another order.
    Used where the CPU has no native bf16 GEMM, on which oneDNN's bf16 GEMM is several times
    slower than its fp32 one."""
    T, N = x.shape
    M = W.shape[1]
    x32 = x.float()
    Wt = W.t()
    tile = min(M, max(16, BF16_TILE_ELEMENTS // max(1, N)))
    y = torch.empty((T, M), dtype=torch.bfloat16)
    for m0 in range(0, M, tile):
        w32 = Wt[m0:m0 + tile].float().contiguous()
        part = linear(x32, w32, None, "none", [], None) if linear is not None else x32 @ w32.t()
        y[:, m0:m0 + tile] = part
    return y


#: The activation dtypes the fused ops take, per device type (they compute in fp32 and give
#: results in it). CUDA has ln_mix and wkv7_block (csrc/cuda/blocks.cu), also for fp16.
FUSED_DTYPES = {"cpu": (torch.float32, torch.bfloat16),
                "cuda": (torch.float32, torch.bfloat16, torch.float16)}


def fused_op(name: str, dd: LayerPlacement, mode: str, *weights: torch.Tensor):
    """The compiled op ``name`` for a layer on ``dd``'s device type when that device has a kernel
    for it and takes the layer's activation dtype (and ``weights``' dtypes), or None:
    kernels="reference", other devices or dtypes, or no compiled kernel. The caller then runs the
    op's math as torch ops, with the bits it always had. The op computes in fp32: with bf16 or
    fp16 activations it rounds once, where the torch ops (and upstream) round after each step, so
    its results are as close or closer to the fp32 ones."""
    kind = torch.device(dd.device).type
    dtypes = FUSED_DTYPES.get(kind, ())
    if (mode != "reference" and dd.atype in dtypes and all(t.dtype in dtypes for t in weights)
            and _compiled(name, kind.upper())):
        return ops.resolve(name, kind, mode)
    return None


def state_buffer(block, dd: LayerPlacement):
    """What makes the new matrix state a compiled block op writes (``block``: its op, or None):
    on CPU the compiled ``pooled_empty_like`` (memory from the ops' block pool, which the previous
    token's freed states go back to, still in the caches), elsewhere ``torch.empty_like``."""
    if block is not None and torch.device(dd.device).type == "cpu" and _compiled("pooled_empty_like", "CPU"):
        return ops.resolve("pooled_empty_like", "cpu", "compiled")
    return torch.empty_like


class LnMix:
    """The start of each half of every block: the layer norm ``prefix`` (ln1 or ln2) of x, the
    token shift and the n mixes of the result with the previous token's, in the lerp form
    (RWKV-4/5) or the delta form (RWKV-6/7). ``__call__(x, sx)`` returns (xx [T, C], the new shift
    state [C] (xx's last row), [mixed_0, ..., mixed_{n-1}] each [T, C]).

    On CPU with fp32 or bf16 activations this is the compiled ``ln_mix_split`` op, which returns
    those as separate tensors; on CUDA (fp32, bf16 or fp16) the compiled ``ln_mix`` op, its
    results then split by views. One call instead of 5-6 small torch ops, each costly while
    decoding (on CPU, streaming the weights evicts torch's code and data from the caches, so
    the split op also spares the selects and the unbind; on CUDA each op is a kernel launch).
    Otherwise the same math as torch ops (ln_mix_math)."""

    def __init__(self, w: dict, prefix: str, mixes: list, lerp: bool, dd: LayerPlacement, mode: str):
        self.ln_w, self.ln_b = w[prefix + ".weight"], w[prefix + ".bias"]
        self.mix, rmix = stacked_mixes(mixes)
        self.rmix = rmix if lerp else None
        self.lerp = lerp
        self.op = fused_op("ln_mix", dd, mode)
        self.split_op = fused_op("ln_mix_split", dd, mode)
        self.rows_op = fused_op("ln_mix_rows", dd, mode) if torch.device(dd.device).type == "cpu" else None
        if self.op is not None or self.split_op is not None:  # the op's parameters: fp32 (bf16 ones widened, exactly), [n, C] mixes
            self.op_params = (self.ln_w.float(), self.ln_b.float(), self.mix.squeeze(1).float())

    def __call__(self, x: torch.Tensor, sx: torch.Tensor) -> tuple:
        if self.split_op is not None:
            xx, shift, *mixed = self.split_op(x, sx, *self.op_params, self.lerp, LAYER_NORM_EPS)
            return xx, shift, mixed
        if self.op is not None:
            xx, mixed = self.op(x, sx, *self.op_params, self.lerp, LAYER_NORM_EPS)
        else:
            xx, mixed = ln_mix_math(x, sx, self.ln_w, self.ln_b, self.mix, self.rmix, LAYER_NORM_EPS)
        return xx, xx[-1], list(mixed.unbind(0))

    def rows(self, x: torch.Tensor, prev: torch.Tensor) -> tuple:
        """The batched case: row b of x [B, C] is one token of sequence b and row b of prev
        [B, C] that sequence's shift state. Returns (xx [B, C], [mixed_0, ...] each [B, C]);
        xx is the new shift state of every row. On CPU the compiled ``ln_mix_rows`` (each row's
        bits those of ln_mix_split on that row alone); elsewhere as the compiled ops compute (in
        fp32, rounded once) where they would run, else as the torch ops do."""
        if self.rows_op is not None:
            xx, *mixed = self.rows_op(x, prev, *self.op_params, self.lerp, LAYER_NORM_EPS)
            return xx, mixed
        if self.op is not None or self.split_op is not None:
            w, b, mix = self.op_params
            m = mix.unsqueeze(1)
            xx, mixed = ln_mix_rows_math(x.float(), prev.float(), w, b, m, 1 - m if self.lerp else None,
                                         LAYER_NORM_EPS)
            xx, mixed = xx.to(x.dtype), mixed.to(x.dtype)
        else:
            xx, mixed = ln_mix_rows_math(x, prev, self.ln_w, self.ln_b, self.mix, self.rmix, LAYER_NORM_EPS)
        return xx, list(mixed.unbind(0))

    def steps(self, p: Program, x: Val, sx: Val) -> tuple:
        """``__call__`` (one row: sx [C]) or ``rows`` (B > 1 rows in place: sx [B, C]) as program
        steps: (xx, the new shift state's value, the mixes). In place, the layer writes the new
        shift state into sx (``Program.update``) once nothing reads sx any more."""
        if p.B == 1:
            xx, shift, *mixed = p.call(need(self.split_op, "ln_mix_split"), x, sx, *self.op_params,
                                       self.lerp, LAYER_NORM_EPS, n=2 + self.mix.shape[0])
            return xx, shift, mixed
        xx, *mixed = p.call(need(self.rows_op, "ln_mix_rows"), x, sx, *self.op_params, self.lerp,
                            LAYER_NORM_EPS, n=1 + self.mix.shape[0])
        return xx, xx, mixed


class Tiled:
    """Per-channel parameters repeated for B rows laid end to end (``make(B)``), for block ops run
    on B sequences at once as one sequence of B*H heads (a batch of one-token steps: the heads of
    different sequences are as independent as the heads of one). The last B's tensors are kept,
    so a steady batch builds them once."""

    def __init__(self, make):
        self.make, self.B, self.value = make, None, None

    def __call__(self, B: int):
        if B != self.B:
            self.B, self.value = B, self.make(B)
        return self.value


def flat(t: torch.Tensor | None) -> torch.Tensor | None:
    """A [B, ...] batch of one-token rows as one row [1, B*...] (a view when t is contiguous)."""
    return None if t is None else t.reshape(1, -1)


class HeadNorm:
    """The layer norm before the head (ln_out) of x [T, C]. On CPU with fp32 or bf16 activations
    it is the compiled ``ln_mix_split`` op with no mixes (its first result; the same kernel as
    every block's layer norm), otherwise torch's layer_norm (what upstream runs). While decoding,
    torch's layer_norm, called through the dispatcher with its code and data flushed from the
    caches by the weights, is slower than the compiled kernel."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor, dd: LayerPlacement, mode: str):
        self.w, self.b = w, b
        self.op = fused_op("ln_mix_split", dd, mode)
        if self.op is not None:  # the op's arguments: a shift state it ignores here, fp32 w and b, no mixes
            C = w.shape[0]
            self.args = (torch.zeros(C, dtype=dd.atype), w.float(), b.float(), torch.zeros(0, C))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.op is None:
            return layer_norm(x, self.w, self.b)
        return self.op(x, *self.args, False, LAYER_NORM_EPS)[0]

    def steps(self, p: Program, x: Val) -> Val:
        """``__call__`` of x [B, C] as program steps (the layer norm of each row: the op's shift
        state and mixes take no part)."""
        return p.call(need(self.op, "the head's layer norm"), x, *self.args, False, LAYER_NORM_EPS, n=2)[0]


class Projection:
    """``x @ W`` for x: [T, in] -> [T, out], W stored (in, out) as upstream does.

    Dense weights use torch's matmul (upstream's CPU path), except one-token bf16/fp32 products on
    CPU, which use our ``linear_one`` matrix-vector kernel. int8 weights use the fused ``mm8`` ops:
    ``mm8_seq`` for several tokens; for one token ``mm8_one_i16`` on CPU when compiled (the
    activation rounded to int16, exact integer dot products: faster decode, error far below the
    int8 weight's own; ``use_exact_int8()`` switches back) and ``mm8_one`` otherwise.
    fp16 weights on CUDA whose output is wanted in fp32 use ``gemm_fp16`` (fp32 accumulation and
    output: upstream's cuBLAS fix for small-model overflow) when it is compiled. Streamed weights
    stay in CPU memory and are copied for each call. A weight stored as row slabs (a 3-D tensor,
    rwkv/slabs.py) is multiplied slab by slab and the products summed: for one token on CPU in
    one ``linear_one_slabs`` call, otherwise one product per slab.
    """

    def __init__(self, w: dict, key: str, dd: LayerPlacement, mode: str, stream: bool = False):
        self.key = key
        self.device = concrete_device(dd.device)
        self.weight = w[key]
        self.int8 = self.weight.dtype == torch.uint8
        self.stream = stream and self.device.type != "cpu"
        dev_type = self.device.type
        self.side = tuple(w[key + s] for s in ("_mx", "_rx", "_my", "_ry")) if self.int8 else ()
        self.one_side = self.side  # the side tensors of one-token int8 products (_use_one)
        # Row slabs (rwkv/slabs.py; CPU only): (its rows of x, the slab, its side tensors) each.
        self.slabs = None
        if self.weight.dim() == 3:
            k = self.weight.shape[1]
            self.slabs = [(slice(i * k, (i + 1) * k), q, _slab_side(self.side, i * k, (i + 1) * k))
                          for i, q in enumerate(self.weight.unbind(0))]
        matrix = self.weight if self.slabs is None else self.slabs[0][1]
        if self.int8:
            self._mode = mode
            fast = dev_type == "cpu" and mode != "reference" and _compiled("mm8_one_i16", "CPU")
            self._use_one("mm8_one_i16" if fast else "mm8_one")
            self._seq = ops.resolve("mm8_seq", dev_type, mode)
        # fp32 products of several rows on CPU: oneDNN (onednn_linear), not MKL's sgemm.
        self._linear_seq = None
        if dev_type == "cpu" and mode != "reference" and self.weight.dtype == torch.float32 \
                and matrix.t().is_contiguous():
            self._linear_seq = onednn_linear()
        # bf16 products of several rows on a CPU without native bf16 GEMM: fp32 tiles
        # (bf16_product_fp32), with oneDNN's fp32 linear when this torch has it.
        self._bf16_seq = False
        self._fp32_linear = None
        if dev_type == "cpu" and mode != "reference" and self.weight.dtype == torch.bfloat16 \
                and matrix.t().is_contiguous():
            self._bf16_seq = True
            self._fp32_linear = onednn_linear()
        self._gemm16 = None
        if dev_type == "cuda" and self.weight.dtype == torch.float16:
            self._gemm16 = ops.resolve("gemm_fp16", dev_type, mode)
        # One-token bf16 and fp32 products on CPU: our matrix-vector kernel reads the column-major
        # weight faster than torch's matmul does (docs/kernels.md). Only when compiled: torch's matmul is
        # the fallback.
        self._dense_one = None
        if (dev_type == "cpu" and mode != "reference" and self.weight.dtype in (torch.bfloat16, torch.float32)
                and matrix.t().is_contiguous()
                and _compiled("linear_one", "CPU")):
            self._dense_one = ops.resolve("linear_one", dev_type, mode)
        # One-token products of row slabs: linear_one_slabs sums the slabs' products in the same
        # call (one call and one parallel region where separate products were one per slab, plus
        # the slicing and the sum between them).
        self._slabs_one = None
        if self.slabs is not None and (self._dense_one is not None or (self.int8 and self._one_act)) \
                and _compiled("linear_one_slabs", "CPU"):
            self._slabs_one = ops.resolve("linear_one_slabs", dev_type, mode)
        # Products of a few rows (the batched engine's B sequences, short sequences) on CPU: our
        # linear_rows reads each weight once for all rows, where oneDNN's and MKL's GEMMs, made for
        # many rows, read it several times over or reorder it first.
        self._rows = None
        if (dev_type == "cpu" and mode != "reference" and self.weight.dtype in (torch.bfloat16, torch.float32)
                and matrix.t().is_contiguous() and _compiled("linear_rows", "CPU")):
            self._rows = ops.resolve("linear_rows", dev_type, mode)
        # add_to's one-token products: the residual add (and the gate) in the product's call.
        self._residual_one = None
        if dev_type == "cpu" and mode != "reference" and _compiled("linear_one_residual", "CPU"):
            self._residual_one = ops.resolve("linear_one_residual", dev_type, mode)

    def _use_one(self, name: str) -> None:
        self.one_token_op = name  # which op one-token int8 products use (the verbose plan shows it)
        self._one = ops.resolve(name, self.device.type, self._mode)
        self._one_act = name == "mm8_one_i16"  # it applies the activation itself
        # Products of a few rows take the same rounding, row by row, in one pass over the weight.
        self._rows_i16 = (ops.resolve("mm8_rows_i16", "cpu", self._mode)
                          if self._one_act and _compiled("mm8_rows_i16", "CPU") else None)
        # mm8_one_i16 computes in fp32 and takes fp32 side tensors: copies made once here (exact)
        # spare a bf16 layer four conversions per one-token product.
        self.one_side = tuple(t.float() for t in self.side) if self._one_act else self.side

    @property
    def groupable(self) -> bool:
        """Whether this product's one-token case may join a linear_one_group call (whose members
        are linear_one and mm8_one_i16 products): one CPU matrix whose one-token op is one of those."""
        if self.slabs is not None:
            return False
        return self._one_act if self.int8 else self._dense_one is not None

    def use_exact_int8(self) -> None:
        """One-token int8 products in fp32 throughout (``mm8_one``), as upstream computes them."""
        if self.int8:
            self._use_one("mm8_one")

    def _rows_take(self, x: torch.Tensor) -> bool:
        """Whether linear_rows computes this product of x (2 to ROWS_MAX rows, x's dtype)."""
        return (self._rows is not None and x.dim() == 2 and 1 < rows(x) <= ROWS_MAX
                and x.dtype == self.weight.dtype)

    def _slabs_take(self, dtype: torch.dtype) -> bool:
        """Whether linear_one_slabs computes this one-token product of x of ``dtype`` (int8:
        unless use_exact_int8() chose mm8_one's fp32 math)."""
        if self.int8:
            return self._one_act and dtype in FUSED_DTYPES["cpu"]
        return dtype == self.weight.dtype

    def _weight(self) -> torch.Tensor:
        if self.stream:
            return self.weight.to(self.device, non_blocking=True)
        return self.weight

    def _product(self, x: torch.Tensor, W: torch.Tensor, side: tuple, one_side: tuple, out_dtype,
                 act: int) -> tuple:
        """(y, whether the activation ``act`` is applied): the one-token kernels apply it to their
        fp32 result, in the same call. one_side: the side tensors for mm8_one_i16 (see _use_one)."""
        # One token: the one-token ops take x [1, N] and give [1, M] (no reshapes: while decoding,
        # each extra op is a measurable share of the token's time).
        if self.int8:
            if rows(x) == 1:
                if self._one_act:
                    return self._one(x, W, *one_side, act), True
                return self._one(x, W, *side), False
            if self._rows_i16 is not None and x.dim() == 2 and rows(x) <= ROWS_MAX:
                return self._rows_i16(x, W, *one_side, act), True
            return self._seq(x, W, *side), False
        if out_dtype == torch.float32 and self._gemm16 is not None:
            return self._gemm16(x, W, True), False
        if self._dense_one is not None and rows(x) == 1 and x.dtype == W.dtype:
            return self._dense_one(x, W, act), True
        if self._rows_take(x):
            return self._rows(x, W).to(x.dtype), False
        if self._linear_seq is not None and x.dtype == torch.float32 and x.dim() == 2 and x.numel():
            try:
                return self._linear_seq(x.contiguous(), W.t(), None, "none", [], None), False
            except RuntimeError:  # a oneDNN build that cannot run it here: torch's matmul from now on
                self._linear_seq = None
        if (self._bf16_seq and x.dtype == torch.bfloat16 and x.dim() == 2
                and rows(x) >= BF16_VIA_FP32_MIN_ROWS and not native_bf16_gemm()):
            try:
                return bf16_product_fp32(x, W, self._fp32_linear), False
            except RuntimeError:  # as above: without oneDNN's linear from now on
                if self._fp32_linear is None:
                    raise
                self._fp32_linear = None
                return bf16_product_fp32(x, W, None), False
        return x @ W, False

    def _one_token_kernel(self, x: torch.Tensor) -> bool:
        """Whether this one-token product of x is one of the compiled kernels linear_one_residual
        runs (linear_one, mm8_one_i16 or linear_one_slabs), as __call__ would choose it."""
        return rows(x) == 1 and self.one_token_kernel_for(x.dtype)

    def one_token_kernel_for(self, dtype: torch.dtype) -> bool:
        """_one_token_kernel for one row of ``dtype``."""
        if self.stream:
            return False
        if self.slabs is not None:
            return self._slabs_one is not None and self._slabs_take(dtype)
        if self.int8:
            return self._one_act
        return self._dense_one is not None and dtype == self.weight.dtype

    def _product_steps(self, p: Program, x: Val, act: int, W=None, side=None, one_side=None) -> tuple:
        """_product of B = p.B rows as program steps: (y, whether act is applied). W, side,
        one_side: a row slab's (default: the whole weight's)."""
        if self.stream or self.device.type != "cpu":
            raise Unsupported(f"{self.key} is not a CPU product")
        W = self.weight if W is None else W
        side = self.side if side is None else side
        one_side = self.one_side if one_side is None else one_side
        if self.int8:
            if p.B == 1:
                if self._one_act:
                    return p.call(need(self._one, "mm8_one_i16"), x, W, *one_side, act), True
                return p.call(need(self._one, "mm8_one"), x, W, *side), False
            if self._rows_i16 is not None and p.B <= ROWS_MAX:
                return p.call(self._rows_i16, x, W, *one_side, act), True
            return p.call(need(self._seq, "mm8_seq"), x, W, *side), False
        if x.dtype != W.dtype:
            raise Unsupported(f"{self.key}: {x.dtype} rows of a {W.dtype} weight")
        if p.B == 1:
            return p.call(need(self._dense_one, "linear_one"), x, W, act), True
        if self._rows is None or p.B > ROWS_MAX:
            raise Unsupported(f"{self.key}: no linear_rows for {p.B} rows")
        return p.to(p.call(self._rows, x, W, dtype=torch.float32), x.dtype), False

    def steps(self, p: Program, x: Val, out_dtype: torch.dtype | None = None, act: int = 0) -> Val:
        """``__call__(x, out_dtype, act)`` of x [p.B, in] as program steps (the ops it runs for that
        many rows; act: an ACTIVATIONS code)."""
        if self.slabs is None:
            y, done = self._product_steps(p, x, act)
        elif p.B == 1 and self._slabs_one is not None and self._slabs_take(x.dtype):
            y, done = p.call(self._slabs_one, x, self.weight, list(self.one_side), act), True
        elif self._rows is not None and 1 < p.B <= ROWS_MAX and x.dtype == self.weight.dtype:
            y, done = p.to(p.call(self._rows, x, self.weight, dtype=torch.float32), x.dtype), False
        else:  # the slabs' products summed in fp32
            aten = torch.ops.aten
            parts = [self._product_steps(p, p.call(aten.slice.Tensor, x, 1, r.start, r.stop, 1), 0, q, side,
                                         side)[0] for r, q, side in self.slabs]
            y, done = p.to(parts[0], torch.float32), False
            for part in parts[1:]:
                y = p.call(aten.add_.Tensor, y, part)
            y = p.to(y, parts[0].dtype)
        if not done:
            y = activation_steps(p, y, act)
        return y if out_dtype is None else p.to(y, out_dtype)

    def add_to_steps(self, p: Program, base: Val, x: Val, gate: Val | None = None) -> Val:
        """``add_to(base, x, gate)`` as program steps."""
        one = (p.B == 1 and self._residual_one is not None and self.one_token_kernel_for(x.dtype)
               and base.dtype == x.dtype and (gate is None or gate.dtype == x.dtype))
        if one:
            side = list(self.one_side) if self.int8 else []
            return p.call(self._residual_one, x, self.weight, side, 0, base, gate)
        y = self.steps(p, x)
        if gate is not None:
            y = p.call(torch.ops.aten.mul.Tensor, gate, y)
        return p.call(torch.ops.aten.add.Tensor, base, y)

    def add_to(self, base: torch.Tensor, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """``base + self(x)``, or ``base + gate * self(x)``: the block's residual add (and the FFN's
        gate). For one token on CPU that is one linear_one_residual call, the same values: while
        decoding, each separate elementwise op is costly (its code and data come back into caches
        the weights have just flushed), and every layer has two such adds."""
        if (self._residual_one is not None and self._one_token_kernel(x) and base.dtype == x.dtype
                and (gate is None or gate.dtype == x.dtype)):
            side = list(self.one_side) if self.int8 else []
            return self._residual_one(x, self.weight, side, 0, base, gate)
        y = self(x)
        return base + (y if gate is None else gate * y)

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None,
                 act: str | None = None) -> torch.Tensor:
        """``x @ W``, then the activation ``act`` (a name of ACTIVATIONS: sigmoid, relu2, tanh,
        silu), then ``out_dtype``."""
        code = ACTIVATIONS[act] if act else 0
        if self.slabs is None:
            y, done = self._product(x, self._weight(), self.side, self.one_side, out_dtype, code)
        elif self._slabs_one is not None and rows(x) == 1 and self._slabs_take(x.dtype):
            y, done = self._slabs_one(x, self.weight, list(self.one_side), code), True
        elif self._rows_take(x):
            y, done = self._rows(x, self.weight).to(x.dtype), False
        else:  # the product is linear in the rows: the slabs' products summed in fp32
            parts = [self._product(x[:, rows], q, side, side, out_dtype, 0)[0]
                     for rows, q, side in self.slabs]
            y, done = parts[0].float(), False
            for part in parts[1:]:
                y += part
            y = y.to(parts[0].dtype)
        if not done:  # y is the product's own new tensor: a sequence's is activated in place
            y = activate_(y, code) if x.dim() == 2 and rows(x) > 1 else activate(y, code)
        return y if out_dtype is None or y.dtype == out_dtype else y.to(out_dtype)


class ProjectionGroup:
    """Independent products of the same token: ``__call__(xs)`` returns [proj(x, out_dtype, act)
    for each member (proj, act, out_dtype) and x of xs], the same values. For one token on CPU,
    when every member's one-token product is a compiled linear_one or mm8_one_i16, that is one
    call of ``linear_one_group``: while decoding, each call costs tens of microseconds beyond its
    weight's reading (its code and data come back into caches the weights have just flushed), so
    a layer's k, v, r, g projections and low-rank first factors cost one call, not several."""

    def __init__(self, members: list, mode: str):
        self.projs = [p for p, _, _ in members]
        self.members = members
        self.acts = [ACTIVATIONS[a] if a else 0 for _, a, _ in members]
        self.out_dtypes = [od for _, _, od in members]
        self.weights = [p.weight for p in self.projs]
        self.side = [t for p in self.projs for t in p.one_side]
        self.op = None
        if mode != "reference" and all(p.device.type == "cpu" for p in self.projs) \
                and _compiled("linear_one_group", "CPU"):
            self.op = ops.resolve("linear_one_group", "cpu", mode)

    def fusable(self, xs: list) -> bool:
        """Whether the products of xs can be one compiled call (linear_one_group's members)."""
        return (self.op is not None and rows(xs[0]) == 1 and all(p.groupable for p in self.projs)
                and all(x.dtype == p.weight.dtype for x, p in zip(xs, self.projs) if not p.int8))

    def finish(self, ys: list) -> list:
        """The compiled call's results in the members' out_dtypes."""
        return [y if od is None or y.dtype == od else y.to(od) for y, od in zip(ys, self.out_dtypes)]

    def __call__(self, xs: list) -> list:
        if self.fusable(xs):
            return self.finish(self.op(xs, self.weights, self.side, self.acts))
        return [p(x, od, act) for (p, act, od), x in zip(self.members, xs)]

    def fusable_steps(self, p: Program, xs: list) -> bool:
        """fusable() for the program's values."""
        return (self.op is not None and p.B == 1 and all(q.groupable for q in self.projs)
                and all(x.dtype == q.weight.dtype for x, q in zip(xs, self.projs) if not q.int8))

    def finish_steps(self, p: Program, ys: list) -> list:
        return [y if od is None else p.to(y, od) for y, od in zip(ys, self.out_dtypes)]

    def steps(self, p: Program, xs: list) -> list:
        """``__call__(xs)`` as program steps."""
        if self.fusable_steps(p, xs):
            return self.finish_steps(p, p.call(self.op, xs, self.weights, self.side, self.acts, n=len(xs)))
        return [q.steps(p, x, od, act) for (q, _, od), act, x in zip(self.members, self.acts, xs)]


class ProjectionChain:
    """Two ProjectionGroups of the same token, the second's inputs being results of the first (the
    low-rank products: RWKV-6's decay and RWKV-7's first factors, then their second factors):
    ``__call__(xs)`` returns ``(first(xs), second([its results at src]))``, the same values. For
    one token on CPU, where each group would make one call, that is one ``linear_one_chain`` call:
    the hop between two calls (the first's results unpacked, the second's argument lists built,
    the dispatch) is costly while decoding, its code and data flushed by the weights."""

    def __init__(self, first: ProjectionGroup, second: ProjectionGroup, src: list, mode: str):
        self.first, self.second, self.src = first, second, list(src)
        self.weights = first.weights + second.weights
        self.side = first.side + second.side
        self.acts = first.acts + second.acts
        self.op = None
        # (A result passed on must be the one the first group returns: no out_dtype conversion.)
        if first.op is not None and second.op is not None and _compiled("linear_one_chain", "CPU") \
                and all(first.out_dtypes[j] is None for j in self.src):
            self.op = ops.resolve("linear_one_chain", "cpu", mode)

    def __call__(self, xs: list) -> tuple:
        # The second products' x are first results, which have their x's dtype and shape.
        if self.op is not None and self.first.fusable(xs) and self.second.fusable([xs[j] for j in self.src]):
            ys = self.op(xs, self.weights, self.side, self.acts, self.src)
            return self.first.finish(ys[:len(xs)]), self.second.finish(ys[len(xs):])
        a = self.first(xs)
        return a, self.second([a[j] for j in self.src])

    def steps(self, p: Program, xs: list) -> tuple:
        """``__call__(xs)`` as program steps."""
        if self.op is not None and self.first.fusable_steps(p, xs) \
                and self.second.fusable_steps(p, [xs[j] for j in self.src]):
            ys = p.call(self.op, xs, self.weights, self.side, self.acts, self.src,
                        n=len(xs) + len(self.second.projs))
            return self.first.finish_steps(p, ys[:len(xs)]), self.second.finish_steps(p, ys[len(xs):])
        a = self.first.steps(p, xs)
        return a, self.second.steps(p, [a[j] for j in self.src])


def _slab_side(side: tuple, r0: int, r1: int) -> tuple:
    """A row slab's int8 side tensors: all of mx and rx (per column), its rows of my and ry."""
    if not side:
        return ()
    mx, rx, my, ry = side
    return mx, rx, my[r0:r1], ry[r0:r1]


def projections(module) -> list:
    """The Projection attributes of a time-mix or channel-mix object (also inside tuples/lists)."""
    found = []
    for value in vars(module).values():
        items = value if isinstance(value, (list, tuple)) else (value,)
        found.extend(v for v in items if isinstance(v, Projection))
    return found
