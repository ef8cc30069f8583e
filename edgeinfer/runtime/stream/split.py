"""The stage planner's arithmetic (PipeDream's partition): the contiguous split into K stages
that minimises the slowest stage, the cost of each cut, and replicas for a bottleneck stage.

Nodes are taken in the graph's topological order; a stage is a contiguous run of them. With
``cost[i]`` the time of node i (measured on its backend, one thread) and ``cross[j]`` the cost
of handing the values live across a cut before node j to the next stage (``cut_seconds``: a
thread hand-off, the host <-> device copies the cut adds, bytes over the network for Ray
stages), the split solves

    best[k][j] = min over i < j of max(best[k-1][i], sum(cost[i:j]) + cross[i])

by dynamic programming (O(K n^2)). Throughput is 1 / max_k(stage_k / replicas_k); spare
workers go one at a time to the stage with the largest stage_k / replicas_k while that lowers
the maximum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from edgeinfer.backend import Backend
from edgeinfer.ir import Graph, dtypes

HANDOFF_SECONDS = 50e-6  # a queue hand-off between two threads, measured order of magnitude
HOST = "cpu"
# Host <-> accelerator copies where no backend measured its link: PCIe 3.0 x16 moves about
# 12 GB/s from pinned memory and half that from pageable memory; 8 GB/s lies between.
DEFAULT_LINK_BYTES_PER_SECOND = 8e9


def crossing_bytes(graph: Graph) -> list[int]:
    """``cross[j]``: bytes of the values (graph inputs included) that must be handed across a
    cut just before node j: made before j and read at or after j. Graph outputs count as read
    at the end. Symbolic dims count as 1."""
    index = {id(node): i for i, node in enumerate(graph.nodes)}
    n = len(graph.nodes)
    delta = [0] * (n + 2)
    outputs = set(graph.output_names)
    for value in graph.values.values():
        if value.const is not None or (value.producer is None and value.name not in graph.input_names):
            continue
        born = index[id(value.producer)] + 1 if value.producer is not None else 0
        last = n if value.name in outputs else max(
            (index[id(node)] for node, _ in value.uses if id(node) in index), default=-1)
        if last >= born:
            size = _nbytes(value)
            delta[born] += size
            delta[last + 1] -= size
    cross, running = [], 0
    for j in range(n):
        running += delta[j]
        cross.append(running)
    return cross


def link_bandwidth(src: str, dst: str, links: Mapping[tuple[str, str], float]) -> float:
    """Bytes per second copying from device ``src`` to ``dst`` (one device: no copy, infinite);
    two accelerators go through the host."""
    if src == dst:
        return math.inf
    if HOST not in (src, dst):
        return 1.0 / (1.0 / link_bandwidth(src, HOST, links) + 1.0 / link_bandwidth(HOST, dst, links))
    return links.get((src, dst), DEFAULT_LINK_BYTES_PER_SECOND)


def device_links(backends: Sequence[Backend]) -> dict[tuple[str, str], float]:
    """The copy bandwidths the backends measured for their devices."""
    links: dict[tuple[str, str], float] = {}
    for backend in backends:
        links.update(backend.link_bytes_per_second())
    return links


def device_cut_seconds(graph: Graph, devices: Sequence[str],
                       links: Mapping[tuple[str, str], float] | None = None) -> list[float]:
    """``cut[j]``: the copies a pipeline cut just before node j adds, in seconds, with node i's
    values living on ``devices[i]`` (``Backend.value_device``; graph inputs and outputs on the
    host) and ``links`` the bandwidth per (source, destination) device (``link_bandwidth``).

    Stages hand values to each other on the host, while inside a stage a value stays on its
    device and is copied once to each other device that reads it (those copies are part of the
    stage's measured time, cut or no cut). So a value made on device s before the cut and read
    after it on devices D costs, with the cut, s -> host plus host -> d for every accelerator d
    in D; without it, s -> d for each d in D it is not yet on; the cut adds the difference.
    A cut inside a run of GPU nodes pays two copies of what crosses it, a cut where the values
    go to the CPU anyway pays nothing more, and on a plan all on the host every cut is free.
    A value crossing several cuts is costed at each as if it were the first (it is on the host
    after the first: an overestimate, only where it was made on an accelerator)."""
    links = links or {}
    n = len(graph.nodes)
    if all(device == HOST for device in devices):
        return [0.0] * n
    index = {id(node): i for i, node in enumerate(graph.nodes)}
    outputs = set(graph.output_names)
    delta = [0.0] * (n + 1)  # cut[j] = sum of delta[:j + 1]: each value's cost is constant between its reads
    for value in graph.values.values():
        if value.const is not None or (value.producer is None and value.name not in graph.input_names):
            continue
        size = _nbytes(value)
        if not size:
            continue
        born = index[id(value.producer)] + 1 if value.producer is not None else 0
        source = devices[born - 1] if value.producer is not None else HOST
        reads = sorted({(index[id(node)], devices[index[id(node)]]) for node, _ in value.uses if id(node) in index})
        if value.name in outputs:
            reads.append((n, HOST))
        first_read: dict[str, int] = {}  # device -> where the value is first read on it
        for position, device in reads:
            first_read.setdefault(device, position)
        start = born
        for position in sorted({position for position, _ in reads}):
            end = min(position, n - 1)  # cuts start..end all see the reads at or after ``position``
            if end >= start:
                after = {device for at, device in reads if at >= position}
                with_cut = (0.0 if source == HOST else size / link_bandwidth(source, HOST, links)) + sum(
                    size / link_bandwidth(HOST, d, links) for d in after if d != HOST)
                without = sum(size / link_bandwidth(source, d, links) for d in after if first_read[d] >= position)
                added = max(0.0, with_cut - without)
                delta[start] += added
                delta[end + 1] -= added
            start = max(start, position + 1)
    cut, running = [], 0.0
    for j in range(n):
        running += delta[j]
        cut.append(running)
    return cut


def cut_seconds(graph: Graph, node_backends: Sequence[Backend],
                network_bytes_per_second: float | None = None) -> list[float]:
    """What a cut before each node costs the stage after it: a hand-off between threads, the
    device copies it adds (``device_cut_seconds``, the backends' measured links), and with
    ``network_bytes_per_second`` (stages on other machines) every byte crossing it."""
    devices = [backend.value_device() for backend in node_backends]
    moved = device_cut_seconds(graph, devices, device_links(list({id(b): b for b in node_backends}.values())))
    network = crossing_bytes(graph) if network_bytes_per_second else [0] * len(graph.nodes)
    return [HANDOFF_SECONDS + copies + (size / network_bytes_per_second if network_bytes_per_second else 0.0)
            for copies, size in zip(moved, network)]


def _nbytes(value) -> int:
    if value.shape is None or not dtypes.is_tensor_type(value.dtype) or value.dtype == "str":
        return 0
    return math.prod(d if isinstance(d, int) else 1 for d in value.shape) * dtypes.numpy_dtype(value.dtype).itemsize


def split(costs: Sequence[float], stages: int, cross_seconds: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """The contiguous split of ``costs`` into ``stages`` non-empty ranges [start, end) that
    minimises the slowest stage (a stage after a cut also pays ``cross_seconds[cut]``)."""
    n = len(costs)
    stages = max(1, min(stages, n))
    cross = list(cross_seconds) if cross_seconds is not None else [0.0] * n
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    best = np.full((stages + 1, n + 1), math.inf)
    cut = np.zeros((stages + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n + 1):
            starts = np.arange(k - 1, j)
            segment = prefix[j] - prefix[starts] + np.where(starts > 0, np.asarray(cross)[starts], 0.0)
            candidates = np.maximum(best[k - 1][starts], segment)
            pick = int(np.argmin(candidates))
            best[k][j], cut[k][j] = candidates[pick], starts[pick]
    ranges, end = [], n
    for k in range(stages, 0, -1):
        start = int(cut[k][end])
        ranges.append((start, end))
        end = start
    return ranges[::-1]


def replicate(stage_seconds: Sequence[float], workers: int, fixed: Sequence[int] | int | None = None) -> list[int]:
    """Workers per stage: ``fixed`` as given, else one each and then spare workers, one at a
    time, to the stage with the largest time per replica while that lowers the maximum."""
    k = len(stage_seconds)
    if fixed is not None:
        replicas = [fixed] * k if isinstance(fixed, int) else list(fixed)
        return replicas
    replicas = [1] * k
    while sum(replicas) < workers:
        per = [t / r for t, r in zip(stage_seconds, replicas)]
        worst = int(np.argmax(per))
        replicas[worst] += 1
        if max(t / r for t, r in zip(stage_seconds, replicas)) >= max(per):
            replicas[worst] -= 1
            break
    return replicas


def throughput(stage_seconds: Sequence[float], replicas: Sequence[int]) -> float:
    """Requests per second of a pipeline whose stage k takes ``stage_seconds[k]`` per request."""
    slowest = max(t / r for t, r in zip(stage_seconds, replicas))
    return math.inf if slowest <= 0 else 1.0 / slowest
