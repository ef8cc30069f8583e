"""TFLite sparse tensors (``SparsityParameters``), densified on import.

A sparse tensor of dense shape ``S`` (rank ``n``) with ``k`` block dims is stored as a tree of
``n + k`` levels, visited in ``traversal_order`` (a permutation of ``0 .. n+k-1``; dims
``n .. n+k-1`` are the inner dims of the blocks, ``block_map[j]`` the original dim that block
dim ``n + j`` splits). Level ``l`` describes dim ``traversal_order[l]``:

- ``DENSE`` with ``dense_size`` d: every coordinate ``0 .. d-1``; child ``i`` of node ``p``
  is node ``p * d + i``;
- ``SPARSE_CSR``: node ``p``'s children are positions ``segments[p] .. segments[p+1]-1``, whose
  coordinates are ``indices[position]``; the child node is the position itself.

The buffer holds one value per leaf, in traversal order (what TFLite's
``FormatConverter::SparseToDense`` walks depth-first). Original coordinate of dim ``i``:
``c[i] * block_size + c[n + j]`` where ``i = block_map[j]``, else ``c[i]``. Here the tree is
expanded one level at a time with numpy (stable, so leaves stay in depth-first order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeinfer.errors import ModelFormatError

DENSE, SPARSE_CSR = 0, 1
# SparseIndexVector union: NONE, Int32Vector, Uint16Vector, Uint8Vector (each a table of `values`)
_INDEX_TYPES = {1: "i4", 2: "u2", 3: "u1"}
_TRAVERSAL_ORDER, _BLOCK_MAP, _DIM_METADATA = 4, 6, 8
_FORMAT, _DENSE_SIZE, _SEGMENTS_TYPE, _SEGMENTS, _INDICES_TYPE, _INDICES = 4, 6, 8, 10, 12, 14
_VALUES = 4


@dataclass(frozen=True)
class DimensionMetadata:
    format: int
    dense_size: int
    segments: np.ndarray | None
    indices: np.ndarray | None


@dataclass(frozen=True)
class Sparsity:
    traversal_order: tuple[int, ...]
    block_map: tuple[int, ...]
    dims: tuple[DimensionMetadata, ...]


def read_sparsity(table, what: str, fail) -> Sparsity:
    """Parse a ``SparsityParameters`` table (``fail(message)`` makes the error to raise)."""
    order = table.numbers(_TRAVERSAL_ORDER, "i4", "traversal_order")
    block_map = table.numbers(_BLOCK_MAP, "i4", "block_map")
    dims = []
    for i, dim in enumerate(table.tables(_DIM_METADATA, "dim_metadata")):
        kind = dim.scalar(_FORMAT, "b", DENSE, "format")
        if kind == DENSE:
            dims.append(DimensionMetadata(DENSE, dim.scalar(_DENSE_SIZE, "i", 0, "dense_size"), None, None))
        elif kind == SPARSE_CSR:
            dims.append(DimensionMetadata(SPARSE_CSR, 0, _index_vector(dim, _SEGMENTS_TYPE, _SEGMENTS, what, i, fail),
                                          _index_vector(dim, _INDICES_TYPE, _INDICES, what, i, fail)))
        else:
            raise fail(f"{what} sparsity dim_metadata[{i}] has format {kind}, expected DENSE (0) or SPARSE_CSR (1)")
    return Sparsity(tuple(int(v) for v in (order if order is not None else ())),
                    tuple(int(v) for v in (block_map if block_map is not None else ())), tuple(dims))


def _index_vector(dim, type_slot: int, slot: int, what: str, i: int, fail) -> np.ndarray:
    kind = dim.scalar(type_slot, "B", 0, "array type")
    vector = dim.table(slot, "array")
    if kind not in _INDEX_TYPES or vector is None:
        raise fail(f"{what} sparsity dim_metadata[{i}] is SPARSE_CSR without an index vector (type {kind})")
    values = vector.numbers(_VALUES, _INDEX_TYPES[kind], "values")
    return np.zeros(0, np.int64) if values is None else values.astype(np.int64)


def densify(values: np.ndarray, shape: tuple[int, ...], sparsity: Sparsity, where: str) -> np.ndarray:
    """The dense array of ``shape`` that the sparse ``values`` (one per leaf) encode."""
    rank, blocks = len(shape), len(sparsity.block_map)
    levels = rank + blocks
    order, dims = sparsity.traversal_order, sparsity.dims
    if sorted(order) != list(range(levels)) or len(dims) != levels:
        raise ModelFormatError(f"{where}: sparsity traversal_order {list(order)} and {len(dims)} dim_metadata "
                               f"do not describe {rank} dims with {blocks} block dims")
    block_size = {}
    for j, dim in enumerate(sparsity.block_map):
        size = dims[order.index(rank + j)].dense_size
        if not (0 <= dim < rank) or size < 1 or shape[dim] % size:
            raise ModelFormatError(f"{where}: block dim {j} (size {size}) does not divide dim {dim} of {list(shape)}")
        block_size[dim] = size
    parents = np.zeros(1, np.int64)
    coords = np.zeros((1, 0), np.int64)
    for level in range(levels):
        dim = dims[level]
        if dim.format == DENSE:
            size = dim.dense_size
            parents = (parents[:, None] * size + np.arange(size)).reshape(-1)
            coords = np.concatenate([np.repeat(coords, size, axis=0),
                                     np.tile(np.arange(size), len(coords))[:, None]], axis=1)
            continue
        segments, indices = dim.segments, dim.indices
        if parents.size and (parents.max() + 1 >= segments.size or np.any(np.diff(segments) < 0)
                             or segments[-1] > indices.size):
            raise ModelFormatError(f"{where}: sparsity level {level} has inconsistent segments")
        starts, ends = segments[parents], segments[parents + 1]
        counts = ends - starts
        positions = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        coords = np.concatenate([np.repeat(coords, counts, axis=0), indices[positions][:, None]], axis=1)
        parents = positions
    if len(coords) != values.size:
        raise ModelFormatError(f"{where}: the sparse buffer holds {values.size} values, its sparsity describes "
                               f"{len(coords)}")
    expanded = np.empty_like(coords)
    expanded[:, list(order)] = coords  # columns in dim order 0 .. n+k-1
    original = expanded[:, :rank].copy()
    for j, dim in enumerate(sparsity.block_map):
        original[:, dim] = original[:, dim] * block_size[dim] + expanded[:, rank + j]
    if original.size and (np.any(original < 0) or np.any(original >= np.asarray(shape))):
        raise ModelFormatError(f"{where}: a sparse index lies outside shape {list(shape)}")
    dense = np.zeros(shape, values.dtype)
    dense[tuple(original.T)] = values.reshape(-1)
    return dense
