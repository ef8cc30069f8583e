"""If and Loop: their bodies are compiled once (``SubgraphKernel``) and run by the executor's
lean subgraph loop, with the outer-scope values they read passed in as feeds.

Loop (spec pseudo-code): ``for (i = 0; (M omitted or i < M) and (cond omitted or cond); ++i)
{cond, v..., scan... = body(i, cond, v...)}``; the final ``v...`` and each scan output stacked
along a new axis 0 are the outputs. With neither ``M`` nor ``cond`` the loop never ends.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.executor import NumpyExecutable, SubgraphKernel
from edgeinfer.backends.numpy.kernels._general import scalar_of
from edgeinfer.backends.numpy.registry import kernel
from edgeinfer.errors import EdgeInferError, ModelValidationError, UnsupportedOpError
from edgeinfer.ir import Node, dtypes


def stack_outputs(items: list, body: NumpyExecutable, index: int) -> np.ndarray:
    """Stack per-iteration values along a new axis 0; with no iteration, an empty tensor of
    the body output's declared type (shape ``(0, *declared)`` where the declared shape is static)."""
    if items:
        return np.stack(items)
    declared = body.graph.outputs[index]
    dtype = dtypes.numpy_dtype(declared.dtype) if dtypes.is_tensor_type(declared.dtype) else np.float32
    static = declared.shape is not None and all(isinstance(d, int) for d in declared.shape)
    return np.zeros((0, *declared.shape) if static else (0,), dtype=dtype)


def check_arity(node: Node, body: NumpyExecutable, inputs: int, min_outputs: int) -> None:
    found_in, found_out = len(body.input_names), len(body.output_names)
    if found_in != inputs or found_out < min_outputs:
        raise ModelValidationError(f"{node.label}: expected a body with {inputs} inputs and at least "
                                   f"{min_outputs} outputs, found {found_in} inputs and {found_out} outputs")


@kernel("If", since=1)
class If(SubgraphKernel):
    def __init__(self, node: Node, scope: NumpyExecutable):
        super().__init__(node, scope)
        self.then_branch = self.compile(scope, "then_branch")
        self.else_branch = self.compile(scope, "else_branch")
        for branch in (self.then_branch, self.else_branch):
            check_arity(node, branch, len(branch.input_names), len(node.outputs))

    def __call__(self, values: dict) -> tuple:
        taken = bool(scalar_of(values[self.node.inputs[0]], "cond"))
        branch = self.then_branch if taken else self.else_branch
        try:
            return tuple(branch.evaluate({n: values[n] for n in branch.outer_names}))
        except EdgeInferError as exc:
            raise self.body_error(exc, "then_branch" if taken else "else_branch") from exc


@kernel("Loop", since=1)
class Loop(SubgraphKernel):
    def __init__(self, node: Node, scope: NumpyExecutable):
        super().__init__(node, scope)
        self.body = body = self.compile(scope, "body")
        padded = list(node.inputs) + [""] * (2 - len(node.inputs))
        self.trip_count, self.condition, self.carried = padded[0], padded[1], padded[2:]
        if not self.trip_count and not self.condition:
            raise UnsupportedOpError(f"{node.label}: expected a trip count M or a cond input, found neither: "
                                     "the Loop never ends (with no cond input the spec ignores the body's "
                                     "cond output)")
        check_arity(node, body, 2 + len(self.carried), 1 + len(self.carried))
        self.scan_count = len(body.output_names) - 1 - len(self.carried)

    def __call__(self, values: dict) -> tuple:
        body, carried_count = self.body, len(self.carried)
        trip = int(scalar_of(values[self.trip_count], "M")) if self.trip_count else None
        going = bool(scalar_of(values[self.condition], "cond")) if self.condition else True
        state = [values[n] if n else None for n in self.carried]
        scans: list[list] = [[] for _ in range(self.scan_count)]
        feeds = {n: values[n] for n in body.outer_names}
        iteration_name, condition_name, *carried_names = body.input_names
        iteration = 0
        try:
            while going and (trip is None or iteration < trip):
                feeds[iteration_name] = np.array(iteration, dtype=np.int64)
                feeds[condition_name] = np.array(going)
                feeds.update(zip(carried_names, state))
                outputs = body.evaluate(feeds)
                if self.condition:  # with no cond input the body's cond output is ignored (spec)
                    going = bool(scalar_of(outputs[0], "the body's cond output"))
                state = outputs[1:1 + carried_count]
                for items, value in zip(scans, outputs[1 + carried_count:]):
                    items.append(value)
                iteration += 1
        except EdgeInferError as exc:
            raise self.body_error(exc, f"body, iteration {iteration}") from exc
        stacked = [stack_outputs(items, body, 1 + carried_count + k) for k, items in enumerate(scans)]
        return (*state, *stacked)
