"""Weight-only quantization for big models: int4 or int8 MatMul/Gemm weights, float compute.

Each constant [K, N] weight becomes onnxruntime's ``com.microsoft::MatMulNBits`` (math and
packing in ``edgeinfer.ir.contrib_ops``): blocks of ``block_size`` consecutive K elements per
output column share one scale and, with ``zero_points=True``, one zero point (asymmetric:
``scale = (max - min) / (2**bits - 1)``, the range widened to include 0). Without them the
zero point is the fixed mid point ``2**(bits-1)`` (symmetric) and the scale is signed, so
that the block's value of largest magnitude lands on the lowest level: ``scale = extreme /
-2**(bits-1)``, all 2**bits levels in use, as onnxruntime's own blockwise quantizer does. onnxruntime runs the op natively; the numpy backend dequantizes a slab
of rows at a time.

The packed weights are written to the ``.eim`` as uint8 (int4: 0.125 bytes per weight plus a
float scale per block, so block 32 stores 0.156x the float32 bytes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.ir import Graph, Node
from edgeinfer.ir.contrib_ops import MS_DOMAIN, NBITS, pack
from edgeinfer.ir.infer import infer_types
from edgeinfer.ir.mapped import release_pages
from edgeinfer.ir.names import fresh_name
from edgeinfer.model import Model
from edgeinfer.progress import Step, Steps, steps
from edgeinfer.quantize.dynamic import _weight_of
from edgeinfer.quantize.qdq import layer_name
from edgeinfer.quantize.static import _graph_of, prepare_graph

BLOCK_SIZES = (16, 32, 64, 128, 256)
MIN_SCALE = float(np.finfo(np.float32).tiny)  # a block of zeros keeps a normal scale
SLAB_BYTES = 4 << 20  # float32 bytes of weight quantized at once (a few temporaries this size; fits a cache)


def quantize_blocks(weight: np.ndarray, *, bits: int, block_size: int, zero_points: bool,
                    slab_bytes: int = SLAB_BYTES, step: Step | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """[K, N] float weight -> (B uint8 [N, k_blocks, block_size * bits / 8], scales float32
    [N * k_blocks], zero points uint8 packed [N * ceil(k_blocks * bits / 8)] or None).

    Streams: the outputs are allocated at their packed size, and the weight is read in tiles
    of about ``slab_bytes`` (whole blocks along K, an even number of them), in the order of its
    memory (rows of a row-major [K, N]; columns of the transposed view of an [N, K], as a
    Gemm with transB gives), each tile quantized by vectorized numpy. The pages of each stripe
    of a memory-mapped weight are released once it is packed (``edgeinfer.ir.mapped``), so a
    mapped model's float weights never become resident at once. ``step`` is advanced by the
    float bytes done."""
    k, n = weight.shape
    k_blocks = -(-k // block_size)
    b = np.empty((n, k_blocks, block_size * bits // 8), np.uint8)
    scales = np.empty((n, k_blocks), np.float32)
    zp_count = -(-k_blocks * bits // 8) if bits == 4 else k_blocks
    zps = np.empty((n, zp_count), np.uint8) if zero_points else None
    rows_major = not (weight.flags.f_contiguous and not weight.flags.c_contiguous)
    tile_rows, tile_cols = _tile_shape(k, n, 2 * block_size, max(1, slab_bytes // 4), rows_major)
    row_starts, col_starts = range(0, k, tile_rows), range(0, n, tile_cols)
    for major in (row_starts if rows_major else col_starts):  # a stripe of the weight's memory
        for minor in (col_starts if rows_major else row_starts):
            r0, c0 = (major, minor) if rows_major else (minor, major)
            tile = weight[r0:r0 + tile_rows, c0:c0 + tile_cols]
            kb0, cols = r0 // block_size, slice(c0, c0 + tile.shape[1])
            packed, scale, zp = _quantize_tile(tile, bits, block_size, zero_points, rows_major)
            b[cols, kb0:kb0 + scale.shape[1]] = packed
            scales[cols, kb0:kb0 + scale.shape[1]] = scale
            if zps is not None:
                zp8 = zp.astype(np.uint8)
                if bits == 4 and zp8.shape[1] % 2:  # the last blocks of an odd count: a zero nibble pads
                    zp8 = np.concatenate([zp8, np.zeros((zp8.shape[0], 1), np.uint8)], axis=1)
                zp8 = pack(zp8, bits)
                zps[cols, kb0 * bits // 8:kb0 * bits // 8 + zp8.shape[1]] = zp8
            if step is not None:
                step.advance(int(tile.size) * weight.itemsize)
        release_pages(weight[major:major + tile_rows] if rows_major else weight[:, major:major + tile_cols])
    return b, scales.reshape(-1), None if zps is None else zps.reshape(-1)


def _tile_shape(k: int, n: int, align: int, elements: int, rows_major: bool) -> tuple[int, int]:
    """(rows, columns) of the tiles of a [K, N] weight: about ``elements`` each, rows a multiple
    of ``align`` (whole blocks, an even number of them), and whole lines of the weight's memory
    order (all columns of a row-major weight, all rows of a column-major one) where they fit."""
    if rows_major:
        cols = n if align * n <= elements else max(1, elements // align)
        return max(align, elements // cols // align * align), cols
    padded = -(-k // align) * align
    rows = padded if padded <= elements else max(align, elements // align * align)
    return rows, max(1, elements // rows)


def _quantize_tile(tile: np.ndarray, bits: int, block_size: int, zero_points: bool, rows_major: bool
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[rows, cols] of a [K, N] weight (rows from a block boundary) -> (packed codes [cols,
    blocks, block_size * bits / 8], scales float32 [cols, blocks], zero points float [cols,
    blocks]); a last partial block is padded with zeros.

    The tile is copied once in its own memory order (``rows_major``: [blocks, block, cols],
    reduced across rows; else [cols, blocks, block]), so no float transpose is made; only the
    packed codes (1/8 or 1/4 of the bytes) are transposed at the end."""
    rows, cols = tile.shape
    blocks = -(-rows // block_size)
    qmax = 2 ** bits - 1
    if rows_major:
        w = np.empty((blocks * block_size, cols), np.float32)
        w[:rows], w[rows:] = tile, 0.0
        w, axis = w.reshape(blocks, block_size, cols), 1
    else:
        w = np.empty((cols, blocks * block_size), np.float32)
        w[:, :rows], w[:, rows:] = tile.T, 0.0
        w, axis = w.reshape(cols, blocks, block_size), 2
    high, low = w.max(axis=axis), w.min(axis=axis)
    if zero_points:
        low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
        scale = np.maximum((high - low) / qmax, MIN_SCALE)
        zp = np.clip(np.rint(-low / scale), 0, qmax)
    else:  # the block's value of largest magnitude maps to the lowest level, -2**(bits-1)
        extreme = np.where(high >= -low, high, low)
        tied = ((high == -low) & (high != 0)) | np.isnan(high)  # +-x both there: the first one counts
        if tied.any():
            ties = np.moveaxis(w, axis, -1)[tied]
            extreme[tied] = np.take_along_axis(ties, np.abs(ties).argmax(axis=-1)[:, None], axis=-1)[:, 0]
        scale = extreme / -(2 ** (bits - 1))
        scale = np.where(np.abs(scale) < MIN_SCALE, MIN_SCALE, scale)
        zp = np.full(scale.shape, 2 ** (bits - 1), np.float32)
    w /= np.expand_dims(scale, axis)  # in place, the float32 operations of rint(w / scale) + zp
    np.rint(w, out=w)
    w += np.expand_dims(zp, axis)
    np.clip(w, 0, qmax, out=w)
    q = w.astype(np.uint8)
    if bits == 4:  # low nibble first, along the block (contrib_ops.pack, on the block's axis)
        even, odd = ([slice(None)] * 3 for _ in range(2))
        even[axis], odd[axis] = slice(0, None, 2), slice(1, None, 2)
        q = (q[tuple(even)] & 0x0F) | ((q[tuple(odd)] & 0x0F) << 4)
    if rows_major:
        return q.transpose(2, 0, 1), scale.T, zp.T
    return q, scale, zp


def quantize_weight_only(model, *, bits: int = 4, block_size: int = 32, zero_points: bool = False,
                         exclude: Iterable[str] = (), min_elements: int = 4096,
                         progress: Steps | None = None) -> Model:
    """``model`` with every MatMul/Gemm over a constant float32 2-D weight of at least
    ``min_elements`` elements as MatMulNBits (``bits`` 4 or 8, ``block_size`` a power of two
    from 16 to 256). One weight at a time, streamed (``quantize_blocks``); ``progress``
    (``edgeinfer.progress.Steps``) gets one step counted in float bytes quantized."""
    if bits not in NBITS:
        raise InputError(f"weight-only quantization: bits={bits!r}, expected one of {NBITS}")
    if block_size not in BLOCK_SIZES:
        raise InputError(f"weight-only quantization: block_size={block_size!r}, expected one of {BLOCK_SIZES}")
    source = model if isinstance(model, Model) else Model(_graph_of(model))
    graph = prepare_graph(_graph_of(model))
    excluded = set(exclude)
    known = {layer_name(n) for n in graph.nodes}
    missing = sorted(excluded - known)
    if missing:
        raise InputError(f"weight-only quantization: exclude names {missing} are not layers of the model "
                         f"(layers are node names, e.g. {sorted(known)[:3]})")
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}

    def fresh(base: str) -> str:
        return fresh_name(base, taken)

    inits = dict(graph.initializers)
    chosen = {id(node): weight for node in graph.nodes
              if (weight := None if layer_name(node) in excluded else _weight_of(node, graph)) is not None
              and weight.size >= min_elements}
    total = sum(int(w.nbytes) for w in chosen.values())
    label = f"quantize weights to int{bits}, block {block_size}"
    nodes: list[Node] = []
    layers: list[str] = []
    with steps(progress).step(label, total) as step:
        for node in graph.nodes:
            weight = chosen.get(id(node))
            if weight is None:
                nodes.append(node)
                continue
            nodes.extend(_nbits_nodes(node, weight, inits, fresh, bits=bits, block_size=block_size,
                                      zero_points=zero_points, step=step))
            layers.append(layer_name(node))
    used = {i for nd in nodes for i in nd.inputs if i} | set(graph.output_names)
    inits = {k: v for k, v in inits.items() if k in used}
    produced = {o for nd in nodes for o in nd.outputs if o}
    summary = {"mode": "weight-only", "weights": f"int{bits} block {block_size}"
               + (" asymmetric" if zero_points else " symmetric"), "layers": len(layers),
               "excluded": sorted(excluded)}
    metadata = {**graph.metadata, "quantization": json.dumps(summary, sort_keys=True)}
    opset = {**graph.opset, MS_DOMAIN: 1}
    result = Graph(nodes, list(graph.inputs), list(graph.outputs), inits,
                   value_info=[v.typed_like() for v in graph.value_info() if v.name in produced],
                   opset=opset, name=graph.name, metadata=metadata)
    result = infer_types(result)
    result.verify()
    return Model(result, {**source.metadata, "quantization": metadata["quantization"]})


def _nbits_nodes(node: Node, weight: np.ndarray, inits: dict[str, np.ndarray], fresh, *, bits: int,
                 block_size: int, zero_points: bool, step: Step) -> list[Node]:
    """The MatMulNBits (and bias Add) replacing one MatMul/Gemm; its packed weights go to ``inits``."""
    alpha = float(node.attrs.get("alpha", 1.0)) if node.op_type == "Gemm" else 1.0
    k, n = weight.shape
    b, scales, zps = quantize_blocks(weight, bits=bits, block_size=block_size, zero_points=zero_points, step=step)
    if alpha != 1.0:
        scales *= np.float32(alpha)
    names = [node.inputs[0], fresh(f"{node.inputs[1]}_q{bits}"), fresh(f"{node.inputs[1]}_scales")]
    inits[names[1]], inits[names[2]] = b, scales
    if zps is not None:
        names.append(fresh(f"{node.inputs[1]}_zero_points"))
        inits[names[-1]] = zps
    y = node.outputs[0]
    bias = node.inputs[2] if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] else ""
    product = fresh(f"{y}_unbiased") if bias else y
    nodes = [Node("MatMulNBits", names, [product], {"K": k, "N": n, "bits": bits, "block_size": block_size},
                  domain=MS_DOMAIN, name=fresh(f"{layer_name(node)}_MatMulNBits"))]
    if bias:
        beta = float(node.attrs.get("beta", 1.0))
        if beta != 1.0:
            beta_name = fresh(f"{y}_beta")
            inits[beta_name] = np.array(beta, np.float32)
            scaled = fresh(f"{bias}_beta")
            nodes.append(Node("Mul", [bias, beta_name], [scaled]))
            bias = scaled
        nodes.append(Node("Add", [product, bias], [y]))
    return nodes


def weight_error(float_model: Model, quantized: Model, feeds: Iterable[dict], backend: str = "numpy") -> list[dict]:
    """Per output: SQNR (dB), cosine and max relative error of ``quantized`` against
    ``float_model`` on ``feeds`` (the weight-only counterpart of the INT8 report)."""
    from edgeinfer.quantize.report import sqnr_db
    from edgeinfer.runtime.session import Session

    rows: dict[str, list] = {}
    with Session(float_model, backend=backend) as ref_session, Session(quantized, backend=backend) as q_session:
        for feed in feeds:
            ref, got = ref_session.run(feed), q_session.run(feed)
            for name in ref:
                rows.setdefault(name, []).append((ref[name], got[name]))
    report = []
    for name, pairs in rows.items():
        ref = np.concatenate([r.reshape(-1) for r, _ in pairs]).astype(np.float64)
        got = np.concatenate([g.reshape(-1) for _, g in pairs]).astype(np.float64)
        cosine = float(ref @ got / max(np.linalg.norm(ref) * np.linalg.norm(got), 1e-30))
        report.append({"output": name, "sqnr_db": sqnr_db(ref, got), "cosine": cosine,
                       "max_relative_error": float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))})
    return report


__all__ = ["quantize_weight_only", "quantize_blocks", "weight_error", "BLOCK_SIZES"]
