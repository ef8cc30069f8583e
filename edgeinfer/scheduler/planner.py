"""The stage planner (PipeDream's profile -> partition): per-node times, the contiguous split
into K stages that minimises the slowest stage, and replicas for a bottleneck stage.

Nodes are taken in the graph's topological order; a stage is a contiguous run of them. With
``cost[i]`` the time of node i (measured on its backend, one thread) and ``cross[j]`` the cost
of handing the values live across a cut before node j to the next stage, the split solves

    best[k][j] = min over i < j of max(best[k-1][i], sum(cost[i:j]) + cross[i])

by dynamic programming (O(K n^2)). Throughput is 1 / max_k(stage_k / replicas_k); spare
workers go one at a time to the stage with the largest stage_k / replicas_k while that lowers
the maximum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from edgeinfer.backend import Backend, CompileOptions
from edgeinfer.ir import Graph, dtypes

HANDOFF_SECONDS = 50e-6  # a queue hand-off between two threads, measured order of magnitude


def profile_nodes(graph: Graph, placed: Sequence[str], backends: Mapping[str, Backend],
                  feeds: Mapping[str, Any], *, repeats: int = 3) -> tuple[list[float], dict[str, Any]]:
    """Seconds per node, each compiled alone on its backend with one thread and run on the real
    values the nodes before it produced (best of ``repeats``); also every value computed."""
    env: dict[str, Any] = {**graph.initializers, **feeds}
    costs = []
    options = CompileOptions(threads=1)
    for node, name in zip(graph.nodes, placed):
        sub = graph.subgraph([node], name=f"profile_{node.name or node.outputs[0]}")
        executable = backends[name].compile(sub, options)
        node_feeds = {n: env[n] for n in sub.input_names}
        outputs = executable.run(node_feeds)  # warm-up, and the values the next nodes read
        costs.append(best_time(lambda e=executable, f=node_feeds: e.run(f), repeats))
        env.update(outputs)
    return costs, env


def best_time(call: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls, in seconds (the least disturbed by the machine)."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


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
