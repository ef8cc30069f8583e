"""Scan: run a compiled body once per step of one or more scan inputs, carrying state.

Scan-9+ iterates ``scan_input_axes`` (default 0) in ``scan_input_directions`` and stacks each
scan output along ``scan_output_axes``, prepended when its direction is 1. Scan-8 has a batch
axis 0 and a scan axis 1, an optional ``sequence_lens`` per batch entry and ``directions``;
each batch entry runs on its own and scan outputs past its length are zero padding (the spec
leaves them undefined).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.executor import NumpyExecutable, SubgraphKernel
from edgeinfer.backends.numpy.kernels._general import int_list, normalize_axis
from edgeinfer.backends.numpy.kernels.control_flow import check_arity, stack_outputs
from edgeinfer.backends.numpy.registry import kernel
from edgeinfer.errors import EdgeInferError, ModelValidationError
from edgeinfer.ir import Node


def scan_steps(kernel: _ScanBase, feeds: dict, states: list, sequences: list, reverse: list[bool],
               length: int) -> tuple[list, list[list]]:
    """Run the body ``length`` times over ``sequences`` (scan axis first): final states and the
    per-step scan outputs in iteration order."""
    body = kernel.body
    state_names = body.input_names[:len(states)]
    slice_names = body.input_names[len(states):]
    outputs: list[list] = [[] for _ in range(len(body.output_names) - len(states))]
    t = 0
    try:
        for t in range(length):
            feeds.update(zip(state_names, states))
            feeds.update((n, x[length - 1 - t] if back else x[t])
                         for n, x, back in zip(slice_names, sequences, reverse))
            results = body.evaluate(feeds)
            states = results[:len(states)]
            for items, value in zip(outputs, results[len(states):]):
                items.append(value)
    except EdgeInferError as exc:
        raise kernel.body_error(exc, f"body, step {t}") from exc
    return states, outputs


class _ScanBase(SubgraphKernel):
    def __init__(self, node: Node, scope: NumpyExecutable, *, num_scan_inputs: int, skip: int):
        super().__init__(node, scope)
        if num_scan_inputs < 1:
            raise ModelValidationError(f"{node.label}: expected num_scan_inputs >= 1, found {num_scan_inputs}")
        self.body = self.compile(scope, "body")
        self.state_count = len(node.inputs) - skip - num_scan_inputs
        self.scan_inputs = num_scan_inputs
        check_arity(node, self.body, self.state_count + num_scan_inputs, self.state_count)
        self.scan_outputs = len(self.body.output_names) - self.state_count


@kernel("Scan", since=9)
class Scan(_ScanBase):
    def __init__(self, node: Node, scope: NumpyExecutable):
        super().__init__(node, scope, num_scan_inputs=node.attrs["num_scan_inputs"], skip=0)
        attrs = node.attrs
        self.input_axes = list(attrs.get("scan_input_axes", [0] * self.scan_inputs))
        self.input_reverse = [d == 1 for d in attrs.get("scan_input_directions", [0] * self.scan_inputs)]
        self.output_axes = list(attrs.get("scan_output_axes", [0] * self.scan_outputs))
        self.output_reverse = [d == 1 for d in attrs.get("scan_output_directions", [0] * self.scan_outputs)]

    def __call__(self, values: dict) -> tuple:
        names = self.node.inputs
        states = [values[n] for n in names[:self.state_count]]
        sequences = [np.moveaxis(values[n], normalize_axis(axis, np.ndim(values[n])), 0)
                     for n, axis in zip(names[self.state_count:], self.input_axes)]
        lengths = {len(x) for x in sequences}
        if len(lengths) != 1:
            raise ValueError(f"every scan input must have the same length on its scan axis, found {sorted(lengths)}")
        feeds = {n: values[n] for n in self.body.outer_names}
        states, outputs = scan_steps(self, feeds, states, sequences, self.input_reverse, lengths.pop())
        stacked = []
        for k, (items, axis, back) in enumerate(zip(outputs, self.output_axes, self.output_reverse)):
            out = stack_outputs(items[::-1] if back else items, self.body, self.state_count + k)
            stacked.append(np.moveaxis(out, 0, normalize_axis(axis, out.ndim)))
        return (*states, *stacked)


@kernel("Scan", since=8)
class ScanBatched(_ScanBase):
    def __init__(self, node: Node, scope: NumpyExecutable):
        super().__init__(node, scope, num_scan_inputs=node.attrs["num_scan_inputs"], skip=1)
        self.reverse = [d == 1 for d in node.attrs.get("directions", [0] * self.scan_inputs)]

    def __call__(self, values: dict) -> tuple:
        names = self.node.inputs
        initial = [values[n] for n in names[1:1 + self.state_count]]
        scanned = [values[n] for n in names[1 + self.state_count:]]
        batch, max_length = scanned[0].shape[:2]
        if any(x.shape[:2] != (batch, max_length) for x in scanned) or any(len(s) != batch for s in initial):
            raise ValueError(f"expected batch {batch} on every input and length {max_length} on every scan input")
        lengths = int_list(values[names[0]], "sequence_lens") if names[0] else [max_length] * batch
        if len(lengths) != batch or not all(0 <= n <= max_length for n in lengths):
            raise ValueError(f"sequence_lens must hold {batch} lengths in [0, {max_length}], found {lengths}")
        feeds = {n: values[n] for n in self.body.outer_names}
        finals, per_batch = [], []
        for b, length in enumerate(lengths):
            states, outputs = scan_steps(self, feeds, [s[b] for s in initial],
                                         [x[b, :length] for x in scanned], self.reverse, length)
            finals.append(states)
            per_batch.append(outputs)
        results = [np.stack([states[i] for states in finals]) for i in range(self.state_count)]
        for k in range(self.scan_outputs):
            filled = [stack_outputs(outputs[k], self.body, self.state_count + k) for outputs in per_batch]
            # a batch entry of length 0 knows no element shape (unless the body declares it)
            like = next((f for f in filled if len(f)), filled[0])
            padded = np.zeros((batch, max_length, *like.shape[1:]), dtype=like.dtype)
            for b, part in enumerate(filled):
                padded[b, :len(part)] = part
            results.append(padded)
        return tuple(results)
