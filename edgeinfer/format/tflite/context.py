"""``OpContext``: what an export rule sees of one IR node and how it writes TFLite operators.

A rule reads inputs as tensors in the axis order it needs (``input(k, perm)``), declares the
tensors of its outputs in the order it writes them (``output(k, perm)``) and adds operators
(``op``). In integer mode (``ctx.int8``) inputs are the int8 tensors the float inputs view
and output 0 is the int8 value the node's ``QuantizeLinear`` consumer writes; ``finish``
adds the requantization where the op's integer kernel fixes its output parameters (pooling,
reshape, concatenation keep the input's; softmax and logistic have fixed ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeinfer.format.tflite.export import ExportError, ExportRule, QuantInfo, identity, quant_info
from edgeinfer.format.tflite.exporter import FLOAT_TYPES, Exporter, _permuted, dequantize
from edgeinfer.ir import Node


class OpContext:
    def __init__(self, exporter: Exporter, node: Node, rule: ExportRule, int8_target: str | None):
        self.exp, self.node, self.rule = exporter, node, rule
        self.int8 = int8_target is not None
        self._target = int8_target
        self._pending: list[tuple[int, int, tuple[int, ...]]] = []  # (op output, final tensor, perm)
        self._written: set[int] = set()
        if self.int8:
            exporter.views[node.outputs[0]] = int8_target

    # -- reading ------------------------------------------------------------------------------------
    @property
    def attrs(self):
        return self.node.attrs

    def has(self, k: int) -> bool:
        return k < len(self.node.inputs) and bool(self.node.inputs[k])

    def name(self, k: int) -> str:
        if not self.has(k):
            raise ExportError(f"expected input {k}, found it omitted")
        return self.node.inputs[k]

    def shape(self, k: int) -> tuple:
        return self.exp.shape(self.name(k))

    def rank(self, k: int) -> int:
        return len(self.shape(k))

    def out_shape(self, k: int = 0) -> tuple:
        return self.exp.shape(self.node.outputs[k])

    def dtype(self, k: int) -> str:
        return self.exp.dtype(self.name(k))

    def const(self, k: int) -> np.ndarray | None:
        """Input ``k``'s data if it is a constant (a view of a constant is dequantized)."""
        if not self.has(k) or not self.exp.is_const(self.name(k)):
            return None
        name = self.name(k)
        raw = self.exp.views.get(name, name)
        data = self.exp.values[raw].const
        return dequantize(data, self.exp.quant.get(raw)) if raw != name else data

    def const_required(self, k: int, what: str) -> np.ndarray:
        data = self.const(k)
        if data is None:
            raise ExportError(f"{what} (input {k}) must be a constant, found a tensor computed at run time")
        return data

    def quant(self, k: int) -> QuantInfo:
        """Quantization of the int8 value input ``k`` views (integer mode)."""
        name = self.name(k)
        return self.exp.quant[self.exp.views.get(name, name)]

    def out_quant(self) -> QuantInfo:
        return self.exp.quant[self._target]

    def layout(self, *ks: int) -> tuple[int, ...]:
        """An axis order that the first computed input of ``ks`` (all of the output's rank)
        already has: the one a layout-agnostic op should work in (identity when none)."""
        rank = len(self.out_shape())
        for k in ks:
            if not self.has(k) or self.exp.is_const(self.name(k)):
                continue
            if self.rank(k) != rank:
                return identity(rank)
        for k in ks:
            if self.has(k) and not self.exp.is_const(self.name(k)):
                perms = [p for p in self.exp.perms(self.name(k)) if len(p) == rank]
                if perms:
                    return next((p for p in perms if p != identity(rank)), perms[0])
        return identity(rank)

    def input(self, k: int, perm: Sequence[int] | None = None) -> int:
        """Input ``k`` as a tensor in axis order ``perm`` (default: as the IR holds it). In
        integer mode a float input is the int8 tensor it views."""
        name = self.name(k)
        perm = identity(self.rank(k)) if perm is None else tuple(perm)
        if len(perm) != self.rank(k) and not self.exp.is_const(name):
            raise ExportError(f"input {k} ({name!r}) has rank {self.rank(k)}, expected {len(perm)}")
        want = "raw" if self.int8 and self.exp.dtype(name) in FLOAT_TYPES else "float"
        return self.exp.tensor(name, perm, want)

    def float_input(self, k: int, perm: Sequence[int] | None = None) -> int:
        name = self.name(k)
        return self.exp.tensor(name, identity(self.rank(k)) if perm is None else tuple(perm), "float")

    # -- writing ------------------------------------------------------------------------------------
    def constant(self, array: Any, hint: str = "const", quant: QuantInfo | None = None,
                 perm: Sequence[int] | None = None) -> int:
        return self.exp.const_tensor(np.asarray(array), f"{self.node.outputs[0]}__{hint}", quant=quant, perm=perm)

    def int32(self, values: Sequence[int], hint: str) -> int:
        return self.constant(np.asarray(values, np.int32), hint)

    def temp(self, shape: Sequence, hint: str, *, dtype: str | None = None, quant: QuantInfo | None = None) -> int:
        """An intermediate tensor (float32 unless ``dtype``; int8 when ``quant`` is given)."""
        if quant is not None:
            dtype = "int8"
        return self.exp.new_tensor(self.exp.fresh(f"{self.node.outputs[0]}__{hint}"), tuple(shape),
                                   dtype or "float32", quant=quant)

    def output(self, k: int = 0, perm: Sequence[int] | None = None, *, quant: QuantInfo | None = None) -> int:
        """The tensor a rule writes output ``k`` into, in axis order ``perm``. In integer mode
        ``quant`` forces the op's own output parameters; ``finish`` requantizes to the node's."""
        name = self.node.outputs[k]
        perm = identity(len(self.out_shape(k))) if perm is None else tuple(perm)
        shape = _permuted(self.out_shape(k), perm)
        if not (self.int8 and k == 0):
            tensor = self.exp.new_tensor(self.exp.tensor_name(name, perm), shape, self.exp.dtype(name),
                                         quant=self.exp.quant.get(name), perm=perm)
            self.exp.reps.setdefault(name, {})[perm] = tensor
            self._written.add(k)
            return tensor
        target = self._target
        wanted = self.out_quant()
        own = quant if quant is not None else self._rule_quant(wanted)
        final = self.exp.new_tensor(self.exp.tensor_name(target, perm), shape, "int8", quant=wanted)
        self.exp.reps.setdefault(target, {})[perm] = final
        self._written.add(k)
        if own.same(wanted):
            return final
        tensor = self.temp(shape, "requant", quant=own)
        self._pending.append((tensor, final, perm))
        return tensor

    def _rule_quant(self, wanted: QuantInfo) -> QuantInfo:
        if self.rule.int8 == "same":
            return self.quant(0)
        if self.rule.int8 == "fixed":
            scale, zero = self.rule.fixed
            return quant_info(np.float32(scale), np.int64(zero), "int8", None)
        return wanted

    def op(self, opcode: str, inputs: Sequence[int], outputs: Sequence[int], *, version: int | None = None,
           options: str | None = None, **values: Any) -> None:
        if version is None:
            version = 2 if self.int8 else 1
        self.exp.writer.add_operator(opcode, inputs, outputs, version=version, options=options, **values)

    def skip_output(self, k: int) -> None:
        """Output ``k`` gets no tensor: its only reader was absorbed into this op (a fused
        activation, ``Exporter.absorb``)."""
        self._written.add(k)

    def alias(self, k: int, source: int) -> None:
        """Output ``k`` is input ``source`` unchanged (float mode)."""
        self.exp._alias(self.name(source), self.node.outputs[k])
        self._written.add(k)

    def finish(self) -> None:
        for tensor, final, _ in self._pending:
            self.op("QUANTIZE", [tensor], [final], version=2)
        for k, name in enumerate(self.node.outputs):
            if name and k not in self._written:
                raise ExportError(f"the export rule wrote no tensor for output {k} ({name!r})")

    # -- common patterns ----------------------------------------------------------------------------
    def activation(self, tensor: int, shape: Sequence, perm: Sequence[int], out: int) -> None:
        """Apply the node's (unfusable) IR activation to ``tensor``, writing ``out``."""
        from edgeinfer.format.tflite.ops.elementwise import write_activation

        write_activation(self, tensor, tuple(shape), tuple(perm), out,
                         str(self.attrs.get("activation", "")), tuple(self.attrs.get("activation_params", ())))
