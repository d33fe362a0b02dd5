"""A numpy model of the int8-activation kernels' arithmetic (workers/c/matvec_i8.c, workers/c/gemm_i8.c), step
for step in the same types (int8 codes, exact integer block sums, float32 operations one rounding each, in the
kernels' order), so a kernel built for any target, at any row count, must equal it bit for bit."""
import numpy as np

f32 = np.float32
LANES = 8  # float accumulators per output: block b adds into lane b % 8


def quantize_rows(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """h [T, K] float32 -> int8 codes [T, K/32, 32], scales [T, K/32], scale x code sum [T, K/32] (quantize_row)."""
    x = h.astype(f32).reshape(h.shape[0], -1, 32)
    amax = np.abs(x).max(-1)
    finite = amax <= np.finfo(f32).max  # False for NaN and infinity
    d = np.where(finite, amax / f32(127), f32(np.nan)).astype(f32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inverse = np.where(finite & (d != 0), f32(1) / d, f32(0)).astype(f32)
    inverse = np.where(inverse <= np.finfo(f32).max, inverse, f32(0)).astype(f32)
    with np.errstate(invalid="ignore"):
        v = (x * inverse[..., None]).astype(f32)
        q = np.where(finite[..., None], np.trunc((v + np.where(v >= 0, f32(0.5), f32(-0.5))).astype(f32)), 0)
    q = q.astype(np.int64)
    return q, d, (d * q.sum(-1).astype(f32)).astype(f32)


def two_bit_runs(part: np.ndarray) -> np.ndarray:
    """Q2_K's and Q3_K's 2-bit codes or Q6_K's high bit pairs [N, 8S, 8] (64 bytes a super-block: each half's 32 bytes hold its
    4 blocks, 2 bits each, lowest first) -> [N, 8S, 32] in 0..3."""
    n, blocks = part.shape[:2]
    runs = part.reshape(n, blocks // 8, 2, 1, 32).astype(np.int64)
    return ((runs >> (2 * np.arange(4))[:, None]) & 3).reshape(n, blocks, 32)  # [N, S, half, block, 32] flattened


def weight_codes(kind: str, parts: list[np.ndarray]) -> np.ndarray:
    """The integer values the kernels multiply: [N, K/32, 32] (Q4_0's, Q4_1's and Q4_K's nibbles, Q5_K's with their fifth
    bits, Q8_0's signed bytes, Q6_K's low nibbles and high bit pairs as signed values -32..31, Q3_K's 2-bit codes
    and third bits as signed values -4..3, Q2_K's 2-bit codes)."""
    if kind in ("Q4_0", "Q4_1", "Q4_K", "Q5_K"):
        packed = parts[0].astype(np.int64)
        codes = np.concatenate([packed & 15, packed >> 4], axis=-1)
        if kind == "Q5_K":  # fifth bits [N, S, 32]: bit j of byte e is element e of block j's
            fifth = (parts[1][:, :, None, :].astype(np.int64) >> np.arange(8)[:, None]) & 1
            codes += fifth.reshape(codes.shape) << 4
        return codes
    if kind == "Q2_K":
        return two_bit_runs(parts[0])
    if kind == "Q3_K":  # 2-bit codes [N, 8S, 8], third bits [N, S, 32] as Q5_K's fifth ones
        third = (parts[1][:, :, None, :].astype(np.int64) >> np.arange(8)[:, None]) & 1
        return two_bit_runs(parts[0]) + 4 * third.reshape(parts[0].shape[0], -1, 32) - 4
    if kind == "Q6_K":  # low nibbles [N, 8S, 16] (64 bytes a half: blocks 0, 1 low nibbles, 2, 3 high ones), high
        n, blocks = parts[0].shape[:2]  # bit pairs [N, 8S, 8] as Q3_K's 2-bit codes
        low = parts[0].reshape(n, blocks // 8, 2, 1, 64).astype(np.int64)
        nibble = ((low >> np.array([0, 4])[:, None]) & 15).reshape(n, blocks, 32)
        return nibble + 16 * two_bit_runs(parts[1]) - 32
    return parts[0].astype(np.int64)


def weight_scales(kind: str, parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """Each block's scale and minimum (None for Q8_0) [N, K/32] float32; Q4_K's and Q5_K's as float32 products of the
    super-block's d or dmin and the block's 6-bit codes; Q2_K's the super-block's d and -dmin; Q4_0's minimum -8 d."""
    if kind == "Q2_K":
        dm = np.repeat(parts[-1], 8, axis=1)
        return dm[..., 0].astype(f32), (-dm[..., 1]).astype(f32)
    if kind in ("Q6_K", "Q3_K"):  # the super-block's d (the half-blocks' scales multiply the integer sums)
        return np.repeat(parts[-1][..., 0], 8, axis=1).astype(f32), None
    if kind in ("Q4_K", "Q5_K"):
        codes, dm = parts[-2].astype(f32), np.repeat(parts[-1], 8, axis=1)
        return (dm[..., 0] * codes[..., 0]).astype(f32), (-(dm[..., 1] * codes[..., 1])).astype(f32)
    shape = parts[0].shape[:2]
    if kind == "Q4_0":
        d = parts[1].reshape(shape).astype(f32)
        return d, (d * f32(-8)).astype(f32)
    return parts[1].reshape(shape).astype(f32), parts[2].reshape(shape).astype(f32) if kind == "Q4_1" else None


def int8_matvec(kind: str, h: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    """out [T, N] as the kernels compute it. parts: the DeviceWeight's (codes, d[, m]) as numpy arrays. Per output:
    8 float lanes; block b adds float(its exact integer dot product) * (d_w * d_x) to lane b % 8, then for the nibble
    kinds m_w * (d_x * the block's code sum), for Q2_K float(its halves' code sums times their minimum codes) *
    (m_w * d_x); out = ((L0 + L1) + (L2 + L3)) + ((L4 + L5) + (L6 + L7))."""
    xq, xd, xm = quantize_rows(h)
    w = weight_codes(kind, parts)
    wd, wm = weight_scales(kind, parts)
    mins = None
    if kind in ("Q6_K", "Q3_K", "Q2_K"):  # each 16-element half's exact sum times its integer scale: an exact integer
        x_halves = xq.reshape(*xq.shape[:2], 2, 16)
        halves = np.einsum("tbhe,nbhe->tnbh", x_halves, w.reshape(*w.shape[:2], 2, 16))
        if kind == "Q2_K":  # the byte per half: the scale code in the low 4 bits, the minimum code above
            scale_codes, min_codes = parts[1].astype(np.int64) & 15, parts[1].astype(np.int64) >> 4
            mins = np.einsum("tbh,nbh->tnb", x_halves.sum(-1), min_codes).astype(f32)
        else:
            scale_codes = parts[-2].astype(np.int64)
        dots = (halves * scale_codes[None]).sum(-1).astype(f32)
    else:
        dots = np.einsum("tbe,nbe->tnb", xq, w).astype(f32)  # exact integers (int32 in the kernels), then float32
    lanes = np.zeros((h.shape[0], w.shape[0], LANES), f32)
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(w.shape[1]):
            scale = (wd[None, :, b] * xd[:, None, b]).astype(f32)  # [T, N]
            lanes[..., b % LANES] = (lanes[..., b % LANES] + (dots[..., b] * scale).astype(f32)).astype(f32)
            if mins is not None:
                scale = (wm[None, :, b] * xd[:, None, b]).astype(f32)
                lanes[..., b % LANES] = (lanes[..., b % LANES] + (mins[..., b] * scale).astype(f32)).astype(f32)
            elif wm is not None:
                lanes[..., b % LANES] = (lanes[..., b % LANES] + (wm[None, :, b] * xm[:, None, b]).astype(f32)).astype(f32)
        a = [lanes[..., j] for j in range(LANES)]
        return ((((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])))).astype(f32)
