"""The edgeinfer IR: ``Graph``, ``Node``, ``Value`` and their helpers."""

from edgeinfer.ir.dtypes import TypeSpec
from edgeinfer.ir.graph import EDGEINFER_DOMAIN, ONNX_DOMAIN, Graph, Node, Value

__all__ = ["Graph", "Node", "Value", "TypeSpec", "ONNX_DOMAIN", "EDGEINFER_DOMAIN"]
