"""SequenceMap: run a compiled body on each position of the input sequence(s).

Sequence inputs give the body their i-th tensor, tensor inputs are passed whole; each body
output is collected into one output sequence.
"""

from __future__ import annotations

from edgeinfer.backends.numpy.executor import NumpyExecutable, SubgraphKernel
from edgeinfer.backends.numpy.kernels.control_flow import check_arity
from edgeinfer.backends.numpy.registry import kernel
from edgeinfer.errors import EdgeInferError
from edgeinfer.ir import Node


@kernel("SequenceMap", since=17)
class SequenceMap(SubgraphKernel):
    def __init__(self, node: Node, scope: NumpyExecutable):
        super().__init__(node, scope)
        self.body = self.compile(scope, "body")
        check_arity(node, self.body, len(node.inputs), len(node.outputs))

    def __call__(self, values: dict) -> tuple:
        inputs = [values[n] for n in self.node.inputs]
        length = len(inputs[0])
        lengths = {len(v) for v in inputs if isinstance(v, list)}
        if lengths != {length}:
            raise ValueError(f"every input sequence must have the length of the first ({length}), "
                             f"found lengths {sorted(lengths)}")
        feeds = {n: values[n] for n in self.body.outer_names}
        outputs: list[list] = [[] for _ in self.body.output_names]
        i = 0
        try:
            for i in range(length):
                feeds.update((n, v[i] if isinstance(v, list) else v) for n, v in zip(self.body.input_names, inputs))
                for items, value in zip(outputs, self.body.evaluate(feeds)):
                    items.append(value)
        except EdgeInferError as exc:
            raise self.body_error(exc, f"body, position {i}") from exc
        return tuple(outputs)
