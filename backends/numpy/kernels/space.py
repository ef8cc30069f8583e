"""DepthToSpace and SpaceToDepth: one reshape, one transpose, one reshape.

DCR ("depth-column-row") takes the block offsets from the outer part of the channel axis,
CRD ("column-row-depth") from the inner part; SpaceToDepth is the inverse in either mode.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.registry import kernel


def _check(op: str, x: np.ndarray, blocksize) -> int:
    if x.ndim != 4:
        raise ValueError(f"{op}: expected a 4-D input (N, C, H, W), found shape {list(x.shape)}")
    if blocksize is None or blocksize < 1:
        raise ValueError(f"{op}: expected a blocksize attribute >= 1, found {blocksize}")
    return int(blocksize)


@kernel("DepthToSpace", since=1)
def depth_to_space(x, *, blocksize=None, mode="DCR"):
    b = _check("DepthToSpace", x, blocksize)
    n, c, h, w = x.shape
    if c % (b * b):
        raise ValueError(f"DepthToSpace: expected channels ({c}) divisible by blocksize^2 ({b * b})")
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"DepthToSpace: expected mode DCR or CRD, found {mode!r}")
    return y.reshape(n, c // (b * b), h * b, w * b)


@kernel("SpaceToDepth", since=1)
def space_to_depth(x, *, blocksize=None, mode="DCR"):
    """The inverse of DepthToSpace in the same ``mode`` (opset 28 added CRD)."""
    b = _check("SpaceToDepth", x, blocksize)
    n, c, h, w = x.shape
    if h % b or w % b:
        raise ValueError(f"SpaceToDepth: expected H ({h}) and W ({w}) divisible by blocksize ({b})")
    blocks = x.reshape(n, c, h // b, b, w // b, b)
    if mode == "DCR":
        y = blocks.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        y = blocks.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"SpaceToDepth: expected mode DCR or CRD, found {mode!r}")
    return y.reshape(n, c * b * b, h // b, w // b)
