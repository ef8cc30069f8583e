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
from edgeinfer.ir.names import fresh_name
from edgeinfer.model import Model
from edgeinfer.quantize.dynamic import _weight_of
from edgeinfer.quantize.qdq import layer_name
from edgeinfer.quantize.static import _graph_of, prepare_graph

BLOCK_SIZES = (16, 32, 64, 128, 256)
MIN_SCALE = float(np.finfo(np.float32).tiny)  # a block of zeros keeps a normal scale


def quantize_blocks(weight: np.ndarray, *, bits: int, block_size: int, zero_points: bool,
                    chunk_rows: int = 1024) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """[K, N] float weight -> (B uint8 [N, k_blocks, block_size * bits / 8], scales float32
    [N * k_blocks], zero points uint8 packed [N * ceil(k_blocks * bits / 8)] or None).

    Works on ``chunk_rows`` output columns at a time so that a large weight is never copied
    whole in float64."""
    k, n = weight.shape
    k_blocks = -(-k // block_size)
    qmax = 2 ** bits - 1
    b = np.empty((n, k_blocks, block_size * bits // 8), np.uint8)
    scales = np.empty((n, k_blocks), np.float32)
    zp_count = -(-k_blocks * bits // 8) if bits == 4 else k_blocks
    zps = np.empty((n, zp_count), np.uint8) if zero_points else None
    for start in range(0, n, chunk_rows):
        stop = min(n, start + chunk_rows)
        w = np.zeros((stop - start, k_blocks * block_size), np.float32)
        w[:, :k] = weight[:, start:stop].T
        w = w.reshape(stop - start, k_blocks, block_size)
        if zero_points:
            low = np.minimum(w.min(axis=-1), 0.0)
            high = np.maximum(w.max(axis=-1), 0.0)
            scale = np.maximum((high - low) / qmax, MIN_SCALE)
            zp = np.clip(np.rint(-low / scale), 0, qmax)
        else:  # the block's value of largest magnitude maps to the lowest level, -2**(bits-1)
            extreme = np.take_along_axis(w, np.abs(w).argmax(axis=-1)[..., None], axis=-1)[..., 0]
            scale = extreme / -(2 ** (bits - 1))
            scale = np.where(np.abs(scale) < MIN_SCALE, MIN_SCALE, scale)
            zp = np.full(scale.shape, 2 ** (bits - 1), np.float32)
        q = np.clip(np.rint(w / scale[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
        b[start:stop] = pack(q, bits)
        scales[start:stop] = scale
        if zps is not None:
            zp8 = zp.astype(np.uint8)
            if bits == 4 and zp8.shape[1] % 2:
                zp8 = np.concatenate([zp8, np.zeros((zp8.shape[0], 1), np.uint8)], axis=1)
            zps[start:stop] = pack(zp8, bits)
    return b, scales.reshape(-1), None if zps is None else zps.reshape(-1)


def quantize_weight_only(model, *, bits: int = 4, block_size: int = 32, zero_points: bool = False,
                         exclude: Iterable[str] = (), min_elements: int = 4096) -> Model:
    """``model`` with every MatMul/Gemm over a constant float32 2-D weight of at least
    ``min_elements`` elements as MatMulNBits (``bits`` 4 or 8, ``block_size`` a power of two
    from 16 to 256)."""
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
    nodes: list[Node] = []
    layers: list[str] = []
    for node in graph.nodes:
        weight = None if layer_name(node) in excluded else _weight_of(node, graph)
        if weight is None or weight.size < min_elements:
            nodes.append(node)
            continue
        alpha = float(node.attrs.get("alpha", 1.0)) if node.op_type == "Gemm" else 1.0
        k, n = weight.shape
        b, scales, zps = quantize_blocks(weight, bits=bits, block_size=block_size, zero_points=zero_points)
        names = [node.inputs[0], fresh(f"{node.inputs[1]}_q{bits}"), fresh(f"{node.inputs[1]}_scales")]
        inits[names[1]], inits[names[2]] = b, (scales * np.float32(alpha)).astype(np.float32)
        if zps is not None:
            names.append(fresh(f"{node.inputs[1]}_zero_points"))
            inits[names[-1]] = zps
        y = node.outputs[0]
        bias = node.inputs[2] if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] else ""
        product = fresh(f"{y}_unbiased") if bias else y
        nodes.append(Node("MatMulNBits", names, [product], {"K": k, "N": n, "bits": bits, "block_size": block_size},
                          domain=MS_DOMAIN, name=fresh(f"{layer_name(node)}_MatMulNBits")))
        if bias:
            beta = float(node.attrs.get("beta", 1.0))
            if beta != 1.0:
                beta_name = fresh(f"{y}_beta")
                inits[beta_name] = np.array(beta, np.float32)
                scaled = fresh(f"{bias}_beta")
                nodes.append(Node("Mul", [bias, beta_name], [scaled]))
                bias = scaled
            nodes.append(Node("Add", [product, bias], [y]))
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


def weight_error(float_model: Model, quantized: Model, feeds: Iterable[dict], backend: str = "numpy") -> list[dict]:
    """Per output: SQNR (dB), cosine and max relative error of ``quantized`` against
    ``float_model`` on ``feeds`` (the weight-only counterpart of the INT8 report)."""
    from edgeinfer.quantize.report import sqnr_db
    from edgeinfer.session import Session

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
