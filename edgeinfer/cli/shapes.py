"""Input shapes on the command line: ``--shape NAME:1x3x640x640`` and the binding of symbolic dims.

A model's input may declare symbolic dims (``N``, ``height``). Every command that makes inputs
(``run``, ``bench``, ``convert --verify``, ``inspect`` for its FLOPs) binds them, in this order:

1. ``--shape NAME:D1xD2x...`` (repeatable; the syntax of ``convert --input-shape``; a bare
   ``1x3x640x640`` when the model has one input) fixes an input's whole shape, and so every
   symbol that input declares;
2. a feed given from a file (``-i x=photo.npy``) binds the symbols of its input the same way;
3. any symbol still free is a *default*: ``--batch`` (1 unless given) for a leading dim, 1 for
   any other. The command prints one line naming each such symbol, because a default is rarely
   what the model was made for.

A free symbol past the first dim (a height, a width, a sequence length) bound to 1 by default is
refused where something is timed (``run``, ``bench``): a 1x3x1x1 image times nothing useful and
often fails deep inside the model. ``--allow-unit-dims`` times it anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edgeinfer.errors import InputError

Shape = tuple[int | str, ...]
ALLOW_UNIT_DIMS = "--allow-unit-dims"


def format_shapes(shapes: Mapping[str, Sequence[int]]) -> str:
    """{x: (1, 3, 640, 640)} -> ``x:1x3x640x640`` (what ``--shape`` takes)."""
    return ", ".join(f"{name}:{'x'.join(map(str, shape)) or 'scalar'}" for name, shape in shapes.items())


def parse_shapes(values: Sequence[str], *, option: str = "--shape", input_names: Sequence[str] | None = None,
                 symbols: bool = True) -> dict[str, Shape]:
    """``name:1x3x224x224`` -> {name: (1, 3, 224, 224)}; a dim may be a symbol such as N where
    ``symbols``; with ``input_names`` of one input, the name may be left out."""
    shapes: dict[str, Shape] = {}
    for text in values:
        name, sep, dims = text.rpartition(":")
        if not sep and input_names is not None and len(input_names) == 1:
            name, dims = input_names[0], text
        if not name or not dims:
            raise InputError(f"{option} {text!r}: expected NAME:D1xD2x..., e.g. input:1x3x224x224")
        parsed: list[int | str] = []
        for dim in dims.lower().split("x") if dims != "scalar" else []:
            if dim.isdigit():
                parsed.append(int(dim))
            elif dim.isidentifier() and symbols:
                parsed.append(dim.upper() if len(dim) == 1 else dim)
            else:
                expected = "neither a number nor a symbol" if symbols else "not a number"
                raise InputError(f"{option} {text!r}: dim {dim!r} is {expected}")
        shapes[name] = tuple(parsed)
    return shapes


@dataclass
class Binding:
    """Concrete shapes for every input, and how each symbol got its value."""

    shapes: dict[str, tuple[int, ...]]
    symbols: dict[str, int] = field(default_factory=dict)
    defaults: dict[str, int] = field(default_factory=dict)  # symbol -> value, bound by default
    unit_spatial: list[str] = field(default_factory=list)  # "input[dim] (symbol)" bound to 1 by default

    def default_line(self) -> str | None:
        """The one line saying which symbols took a default, or None when none did."""
        if not self.defaults:
            return None
        bound = ", ".join(f"{symbol}={value}" for symbol, value in self.defaults.items())
        return (f"shapes: symbolic dims {bound} by default (inputs {self.describe()}); "
                "set them with --shape NAME:D1xD2x...")

    def describe(self) -> str:
        return format_shapes(self.shapes)

    def refuse_unit_dims(self, command: str) -> None:
        """Raise when a dim past the first is 1 only because nothing bound its symbol."""
        if self.unit_spatial:
            raise InputError(f"{command}: {', '.join(self.unit_spatial)} would be timed at 1 ({self.describe()}), "
                             f"a size the model is rarely made for: give --shape NAME:D1xD2x... "
                             f"(or {ALLOW_UNIT_DIMS} to time it at 1)")


def bind(inputs: Sequence, shapes: Mapping[str, Shape], *, batch: int = 1,
         known: Mapping[str, Sequence[int]] | None = None) -> Binding:
    """Bind every input's dims: ``shapes`` (from ``--shape``) first, then ``known`` (the shapes of
    feeds read from files), then ``batch`` for any symbol left. ``inputs`` are ``TensorInfo``s."""
    by_name = {info.name: info for info in inputs}
    unknown = sorted(set(shapes) - set(by_name))
    if unknown:
        raise InputError(f"--shape names {unknown}: expected names among {list(by_name)}")
    bound: dict[str, tuple[int, str]] = {}
    fixed: dict[str, tuple[int, ...]] = {}
    for source, given in (("--shape", shapes), ("--input", known or {})):
        for name, shape in given.items():
            if name in fixed or name not in by_name:
                continue
            fixed[name] = _match(by_name[name], tuple(shape), source, bound)
    symbols = {symbol: value for symbol, (value, _) in bound.items()}
    binding = Binding(shapes={}, symbols=symbols)
    for info in inputs:
        if info.name in fixed:
            binding.shapes[info.name] = fixed[info.name]
            continue
        if info.shape is None or any(d is None for d in info.shape):
            raise InputError(f"input {info.name!r} has unknown dims ({info.shape}): give it with --shape "
                             f"{info.name}:D1xD2x... or --input {info.name}=FILE")
        concrete = []
        for index, dim in enumerate(info.shape):
            if isinstance(dim, int):
                concrete.append(dim)
                continue
            if dim not in symbols:  # --batch sizes a leading dim; any other free dim defaults to 1
                symbols[dim] = binding.defaults[dim] = batch if index == 0 else 1
            if index > 0 and dim in binding.defaults and symbols[dim] == 1:
                binding.unit_spatial.append(f"{info.name} dim {index} ({dim})")
            concrete.append(symbols[dim])
        binding.shapes[info.name] = tuple(concrete)
    return binding


def _match(info, shape: tuple, source: str, bound: dict[str, tuple[int, str]]) -> tuple[int, ...]:
    """``shape`` checked against what ``info`` declares (as ``Session`` checks a feed); its symbols
    recorded in ``bound`` ({symbol: (value, input name)})."""
    from edgeinfer.runtime.feeds import _check_shape

    if any(not isinstance(d, int) for d in shape):
        raise InputError(f"{source} {info.name}: {shape} has a symbolic dim; give numbers")
    if info.shape is not None:
        try:
            _check_shape(info.name, tuple(info.shape), shape, bound)
        except InputError as exc:
            raise InputError(f"{source} {info.name}:{'x'.join(map(str, shape)) or 'scalar'}: {exc}") from None
    return shape


def free_symbols(inputs: Sequence) -> list[str]:
    """The symbolic dims the inputs declare, in order of first appearance."""
    seen: list[str] = []
    for info in inputs:
        for dim in info.shape or ():
            if isinstance(dim, str) and dim not in seen:
                seen.append(dim)
    return seen
