"""The ``edgeinfer`` command line.

Every ``EdgeInferError`` (bad file, bad argument, bad input) prints one line to stderr and
exits with status 2; anything else is a bug in edgeinfer: one line, status 1, and the
traceback only with ``--debug`` or ``EDGEINFER_DEBUG=1``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgeinfer.cli.precision import precision_lines, precision_options, session_precision
from edgeinfer.cli.quantize import apply_quantization, quantize_command, quantize_options
from edgeinfer.cli.shapes import ALLOW_UNIT_DIMS, Binding, bind, format_shapes, parse_shapes
from edgeinfer.cli.support import (
    auto_progress,
    choice_lines,
    flush_notes,
    handle_errors,
    note,
    one_line,
    parse_backend,
    placement_line,
    session_options,
)
from edgeinfer.errors import InputError
from edgeinfer.runtime.options import RunOptions

if TYPE_CHECKING:
    import numpy as np

WEIGHTS_HELP = "Weights file of a Caffe MODEL (.caffemodel), converted first."


def _require_model(path: Path) -> None:
    """A missing model file is said before the converters (and onnx) are imported."""
    if not path.exists():
        raise InputError(f"{path}: no such file (expected a model: .eim, .onnx, .pt2, .pt, .tflite, "
                         ".keras, .h5, .prototxt or a SavedModel folder)")


def _load_model(model_path: Path, weights: Path | None):
    """An .eim file is loaded; any other model file is converted (a Caffe one with ``--weights``)."""
    _require_model(model_path)
    from edgeinfer.api import convert, load_any
    from edgeinfer.engine_logs import quiet_onnxruntime

    quiet_onnxruntime()
    if weights is None:
        return load_any(model_path)
    if not weights.is_file():
        raise InputError(f"--weights {weights}: no such file")
    return convert(model_path, weights=weights)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgeinfer")
@click.option("-v", "--verbose", is_flag=True,
              help="Show the engines' own log lines (onnxruntime, LiteRT, TensorFlow, Ray); also EDGEINFER_DEBUG=1.")
def main(verbose: bool) -> None:
    """edgeinfer: convert models from any framework into one compact .eim file, optimize
    them, and run them on the best backend."""
    import os

    from edgeinfer.engine_logs import quiet_engine_environment, quiet_teardown_errors

    if verbose:
        os.environ["EDGEINFER_VERBOSE"] = "1"
    quiet_engine_environment()
    quiet_teardown_errors()


@main.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The .eim file to write.")
@click.option("--weights", type=click.Path(path_type=Path), help="Weights file (Caffe .caffemodel).")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:1x3x224x224",
              help="Fix an input's shape where the file does not (repeatable).")
@click.option("--dynamic-batch", is_flag=True, help="Make the first dim of every input a symbol N.")
@click.option("--optimize", type=click.IntRange(0, 2), default=1, show_default=True,
              help="Optimization level (0: none).")
@click.option("--report", is_flag=True, help="Print what each optimization pass did.")
@click.option("--verify", is_flag=True,
              help="Run the source framework and edgeinfer on the same random inputs and compare every output; "
                   "on a mismatch name the first diverging node (nothing is written).")
@click.option("--tolerance", type=click.FloatRange(0), default=None, metavar="REL",
              help="For --verify: largest error allowed, relative to the reference's largest magnitude "
                   "[default: 1e-4 float, 5e-2 quantized].")
@click.option("--repro-dir", type=click.Path(path_type=Path),
              help="For --verify: save the first diverging node as a minimal ONNX model with its inputs here.")
@click.option("--backend", default="numpy", show_default=True, help="For --verify: the backend edgeinfer runs on.")
@click.option("-i", "--input", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="For --verify: a real input from a .npy file (repeatable; inputs not given are random).")
@click.option("--shape", "shape_specs", multiple=True, metavar="NAME:1x3x640x640",
              help="For --verify: the shape of an input's random data, binding its symbolic dims (repeatable).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar; print only the line saying what was written.")
@click.option("--strict", is_flag=True, help="Refuse weights that hold NaN or infinities (default: a warning).")
@quantize_options
@handle_errors
def convert(source: Path, output: Path, weights: Path | None, input_shapes: tuple[str, ...],
            dynamic_batch: bool, optimize: int, report: bool, verify: bool, tolerance: float | None,
            repro_dir: Path | None, backend: str, inputs: tuple[str, ...], shape_specs: tuple[str, ...],
            quiet: bool, strict: bool,
            quantization: dict | None) -> None:
    """Convert SOURCE (.onnx, .pt2/.pt, .tflite, SavedModel dir, .keras, .h5, .prototxt) to an .eim file.

    Example: edgeinfer convert models/sample_cnn.onnx -o sample.eim --verify
    """
    import edgeinfer as ei
    from edgeinfer.cli.progress import step_reporter

    options: dict[str, Any] = {}
    if weights is not None:
        options["weights"] = weights
    if input_shapes:
        options["input_shapes"] = parse_shapes(input_shapes, option="--input-shape")
    if dynamic_batch:
        options["dynamic_batch"] = True
    if output.suffix.lower() != ".eim":
        raise InputError(f"-o {output}: expected a path ending in .eim")
    if not verify and (repro_dir is not None or tolerance is not None or inputs or shape_specs):
        raise InputError("--repro-dir, --tolerance, --input and --shape go with --verify")
    _require_model(source)
    from edgeinfer.engine_logs import quiet_onnxruntime

    quiet_onnxruntime()
    started = time.perf_counter()
    passes: list = []
    with step_reporter(f"converting {source.name}", quiet=quiet) as steps:
        model = ei.convert(source, optimize=optimize, pass_report=passes if report else None, strict=strict,
                           progress=steps, **options)
    model = apply_quantization(model, quantization, quiet=quiet)  # calibration's progress is rendered there
    seconds = time.perf_counter() - started
    if report:
        _print_pass_report(passes)
    if verify:
        feeds = _load_feeds(model, inputs, True, 1, shape_specs)
        _verify(source, model, options, feeds, backend=parse_backend(backend), quantized=quantization is not None,
                tolerance=tolerance, repro_dir=repro_dir, quiet=quiet, given=bool(inputs))
    with step_reporter(f"writing {output.name}", quiet=quiet) as steps:
        model.save(output, progress=steps)
    summary = model.summary()
    click.echo(f"wrote {output} ({output.stat().st_size:,} bytes): {summary['nodes']} nodes, "
               f"{summary['parameters']:,} parameters, converted in {seconds:.2f} s")


def _verify(source: Path, model, options: dict[str, Any], feeds: dict, *, backend, quantized: bool,
            tolerance: float | None, repro_dir: Path | None, quiet: bool, given: bool = False) -> None:
    """Print the error of every output against the source framework; a mismatch is an error."""
    from edgeinfer.cli.parity import ABSOLUTE_FLOOR, DEFAULT_TOLERANCE, verify
    from edgeinfer.cli.progress import progress_bar, shows_progress
    from edgeinfer.errors import ModelValidationError

    if tolerance is None:
        tolerance = 5e-2 if quantized else DEFAULT_TOLERANCE
    extra = {"weights": options["weights"]} if "weights" in options else {}
    with progress_bar(f"verifying {source.name}", 3, enabled=shows_progress(quiet)) as progress:
        result = verify(source, model, backend=backend, tolerance=tolerance, feeds=feeds, repro_dir=repro_dir,
                        progress=progress, **extra)
    flush_notes()
    shown = format_shapes({k: v.shape for k, v in feeds.items()})
    click.echo(f"verify: {result.engine} vs edgeinfer ({result.backend}) on {'given' if given else 'random'} "
               f"inputs {shown}, tolerance {tolerance:g} relative to the reference's largest magnitude "
               f"(plus {ABSOLUTE_FLOOR:g} absolute)")
    for error in result.outputs:
        click.echo(f"  output {error.name}: max abs error {error.max_abs:.3g}, relative {error.max_rel:.3g}  "
                   f"{'ok' if error.ok else 'MISMATCH'}")
    for remark in result.notes:
        click.echo(f"  {remark}")
    found = result.divergence
    if found is not None:
        click.echo(f"  first diverging node: {found.node} (output {found.output!r}: max abs error "
                   f"{found.max_abs:.3g}, relative {found.max_rel:.3g}; {found.compared} values compared "
                   f"against {found.reference})")
        if found.repro:
            click.echo(f"  reproducer: {found.repro} (+ .npz with its inputs and outputs)")
    if not result.ok:
        bad = ", ".join(e.name for e in result.outputs if not e.ok)
        where = f"; first diverging node {found.node}" if found is not None else ""
        raise ModelValidationError(f"--verify: output(s) {bad} differ from {result.engine} by more than "
                                   f"{tolerance:g}{where}; nothing written")


def _print_pass_report(passes: list) -> None:
    if not passes:
        click.echo("passes: nothing to rewrite")
        return
    for entry in passes:
        fired = ", ".join(f"{k} x{v}" for k, v in entry.fired.items()) or "-"
        click.echo(f"pass {entry.name:28s} nodes {entry.nodes_before:5d} -> {entry.nodes_after:5d}  {fired}")


def _image_feed(model, name: str, path: Path, shape_specs: tuple[str, ...], image: dict) -> np.ndarray:
    """An image file as the input ``name``: resized to its --shape or declared spatial size (else
    kept at its own), RGB in [0, 1], then (x - mean) / std, in the input's layout."""
    from edgeinfer.cli.quantize import _floats
    from edgeinfer.quantize.data import _guess_layout, image_array

    value = next(v for v in model.graph.inputs if v.name == name) if name in model.graph.input_names else None
    if value is None:
        raise InputError(f"--input {name}={path}: the model has no input {name!r} (inputs {model.graph.input_names})")
    layout = image.get("layout") or _guess_layout(value.shape)
    given = parse_shapes(shape_specs, input_names=model.graph.input_names, symbols=False).get(name)
    declared = given or value.shape or ()
    spatial = tuple(declared[2:] if layout == "NCHW" else declared[1:3])
    size = spatial if len(spatial) == 2 and all(isinstance(d, int) for d in spatial) else None
    if size is None:
        import cv2

        pixels = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if pixels is None:
            raise InputError(f"--input {name}={path}: OpenCV cannot decode it")
        size = pixels.shape[:2]
    mean = _floats(image.get("mean"), "mean") or (0.0,)
    std = _floats(image.get("std"), "std") or (1.0,)
    return image_array(path, value, size=size, mean=mean, std=std, layout=layout)


def image_options(fn):
    """--mean/--std/--layout for ``-i NAME=photo.jpg``, passed on as one keyword ``image``."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["image"] = {key: kwargs.pop(key) for key in ("mean", "std", "layout")}
        return fn(*args, **kwargs)

    for option in reversed([
        click.option("--mean", help="For an image given with -i: per-channel mean on [0,1] RGB, e.g. 0.485,0.456,0.406."),
        click.option("--std", help="For an image given with -i: per-channel std, e.g. 0.229,0.224,0.225."),
        click.option("--layout", type=click.Choice(["NCHW", "NHWC"]),
                     help="For an image given with -i: the input's layout (default: guessed from where it has 3 channels)."),
    ]):
        wrapper = option(wrapper)
    return wrapper


def _load_feeds(model, specs: tuple[str, ...], random_inputs: bool, batch: int, shape_specs: tuple[str, ...] = (),
                *, timed: str | None = None, allow_unit_dims: bool = False,
                image: dict | None = None) -> dict[str, np.ndarray]:
    """Feeds from ``-i NAME=FILE`` (.npy, or an image with ``image``'s mean, std and layout) and,
    with ``random_inputs``, random data for the rest, shaped by
    ``--shape`` and the files' shapes (``edgeinfer.cli.shapes``); a symbol bound by default is said
    on stderr, and refused at 1 past the first dim where ``timed`` names the command."""
    import numpy as np

    from edgeinfer.quantize.data import IMAGE_SUFFIXES

    names = [t.name for t in model.inputs]
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep:
            if len(names) != 1:
                raise InputError(f"--input {spec!r}: expected NAME=FILE.npy (the model has inputs {names})")
            name, file = names[0], spec
        path = Path(file)
        if not path.is_file():
            raise InputError(f"--input {spec!r}: no such file {path}")
        if path.suffix.lower() in IMAGE_SUFFIXES:
            feeds[name] = _image_feed(model, name, path, shape_specs, image or {})
            continue
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"--input {spec!r}: {path} is not a readable .npy file without pickles, nor an image "
                             f"({', '.join(IMAGE_SUFFIXES)}) ({one_line(exc)})") from exc
    missing = [info for info in model.inputs if info.name not in feeds]
    if random_inputs and missing:
        binding = _bind(model, shape_specs, batch, known={k: v.shape for k, v in feeds.items()},
                        refuse=timed if not allow_unit_dims else None)
        generated = model.random_feeds(batch=batch, shapes=binding.shapes)
        feeds.update({info.name: generated[info.name] for info in missing})
    elif shape_specs and not any(Path(spec.partition("=")[2] or spec).suffix.lower() in IMAGE_SUFFIXES
                                 for spec in specs):
        raise InputError("--shape shapes random inputs and images: every input is given with --input as .npy")
    return feeds


def _bind(model, shape_specs: tuple[str, ...], batch: int, known=None, refuse: str | None = None) -> Binding:
    """The binding of the model's symbolic dims (refused for the command ``refuse`` names when it
    leaves a dim past the first at 1); the default line goes to stderr."""
    binding = bind(model.inputs, parse_shapes(shape_specs, input_names=[t.name for t in model.inputs],
                                              symbols=False), batch=batch, known=known)
    if refuse:
        binding.refuse_unit_dims(refuse)
    line = binding.default_line()
    if line:
        note(line, explains_errors=bool(binding.unit_spatial))
    return binding


def delegate_options(fn):
    """``--delegate PATH`` (and ``--delegate-option KEY=VALUE``) for the tflite backend, passed on as
    one keyword ``backend_options`` ({"tflite": {...}}, or None)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        delegate, pairs = kwargs.pop("delegate"), kwargs.pop("delegate_option")
        if delegate is None and pairs:
            raise InputError("--delegate-option goes with --delegate PATH")
        kwargs["backend_options"] = None
        if delegate is not None:
            if not delegate.is_file():
                raise InputError(f"--delegate {delegate}: no such file (expected a TFLite delegate library, "
                                 "e.g. libedgetpu.so.1 or libtensorflowlite_gpu_delegate.so)")
            settings: dict[str, Any] = {"delegate": str(delegate)}
            if pairs:
                settings["delegate_options"] = dict(_key_value(pair) for pair in pairs)
            kwargs["backend_options"] = {"tflite": settings}
        return fn(*args, **kwargs)

    wrapper = click.option("--delegate-option", multiple=True, metavar="KEY=VALUE",
                           help="An option for the --delegate library (repeatable).")(wrapper)
    return click.option("--delegate", type=click.Path(path_type=Path), metavar="PATH",
                        help="A TFLite delegate library for the tflite backend (an NPU, GPU or Edge TPU), "
                             "e.g. --device npu --backend tflite --delegate libedgetpu.so.1.")(wrapper)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InputError(f"--delegate-option {text!r}: expected KEY=VALUE")
    return key, value


def _check_delegate_backends(backend_options: dict | None, contenders: list) -> None:
    if backend_options is None:
        return
    names = {name for c in contenders for name in ([c] if isinstance(c, str) else c or ["numpy"])}  # None: numpy
    if not names & {"tflite", "auto"}:
        raise InputError(f"--delegate is for the tflite backend; the backends asked for are {sorted(names)}")


def shape_options(fn):
    """``--shape`` and ``--allow-unit-dims``, for commands that make inputs."""
    fn = click.option(ALLOW_UNIT_DIMS, "allow_unit_dims", is_flag=True,
                      help="Time a symbolic dim past the first (height, width, length) at 1 when nothing binds it "
                           "(refused by default).")(fn)
    return click.option("--shape", "shape_specs", multiple=True, metavar="NAME:1x3x640x640",
                        help="Shape of an input's random data, binding its symbolic dims (repeatable; "
                             "a bare 1x3x640x640 for a model with one input).")(fn)


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("-i", "--input", "inputs", multiple=True, metavar="NAME=FILE",
              help="An input tensor from a .npy file or an image (.jpg, .png, ...; see --mean) (repeatable).")
@image_options
@click.option("--random-inputs", is_flag=True, help="Feed random data to inputs not given with --input.")
@click.option("--batch", type=click.IntRange(1), default=1, show_default=True,
              help="Size of a symbolic leading (batch) dim for --random-inputs.")
@shape_options
@session_options
@click.option("--repeat", type=click.IntRange(1), default=10, show_default=True,
              help="Timed runs after one warm-up run.")
@click.option("--output-dir", type=click.Path(path_type=Path), help="Write each output as NAME.npy here.")
@click.option("--profile", is_flag=True, help="Print the slowest nodes of the last run with their shapes.")
@click.option("--json", "json_path", type=click.Path(path_type=Path),
              help="Write the outputs' summary and the latency as JSON here ('-': to stdout, nothing else printed).")
@click.option("--weights", type=click.Path(path_type=Path), help=WEIGHTS_HELP)
@precision_options
@handle_errors
@delegate_options  # inside handle_errors: its checks are one-line errors
def run(model_path: Path, inputs: tuple[str, ...], image: dict, random_inputs: bool, batch: int, shape_specs: tuple[str, ...],
        allow_unit_dims: bool, backend: str,
        threads: int | None, device: str, fallback: bool, executor: str, repeat: int, output_dir: Path | None,
        profile: bool, json_path: Path | None, weights: Path | None, backend_options: dict | None,
        precision: dict) -> None:
    """Run MODEL (.eim, or any convertible file) and print outputs and timing.

    Example: edgeinfer run model.eim --random-inputs --backend onnxruntime --threads 2
    """
    model = _load_model(model_path, weights)
    import numpy as np

    import edgeinfer as ei

    feeds = _load_feeds(model, inputs, random_inputs, batch, shape_specs, timed="run", allow_unit_dims=allow_unit_dims,
                        image=image)
    asked = parse_backend(backend)
    _check_delegate_backends(backend_options, [asked])
    reduced = session_precision(model, precision, feeds, _all_from_files(model, inputs),
                                lambda spec: _load_feeds(model, (spec,), False, 1, shape_specs, image=image))
    from edgeinfer.runtime.aot import DEFERRED_KEY

    deferred = asked is None and DEFERRED_KEY in model.metadata  # compiled here by its first run, written back
    with auto_progress(asked == "auto" or executor == "auto" or bool(reduced) or deferred):
        session = ei.Session(model_path if deferred else model, backend=asked, threads=threads, device=device,
                             executor=executor,
                             options=RunOptions(fallback=fallback, debug=profile or None, backend_options=backend_options, example_feeds=feeds),  # auto decides on these shapes, not on guessed dims
                             **reduced)
    to_stdout = json_path is not None and str(json_path) == "-"
    for line in [*choice_lines(session), *precision_lines(session)]:
        click.echo(line, err=True)
    placement = placement_line(session, asked)
    if placement:
        click.echo(placement, err=to_stdout)
    outputs = _run_naming_warnings(session, feeds)  # warm-up, also validates the feeds
    flush_notes()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        outputs = session.run(feeds)
        times.append(time.perf_counter() - start)
    times_ms = np.array(times) * 1000
    if not to_stdout:
        for name, array in outputs.items():
            click.echo(f"output {name}: {array.dtype}{list(array.shape)} {_preview(array)}")
        click.echo(f"latency ({session.backend_name}, threads={threads or 'default'}): median "
                   f"{np.median(times_ms):.3f} ms, min {times_ms.min():.3f} ms over {repeat} runs")
    if profile and not to_stdout:
        _print_profile(session.stats())
    if output_dir is not None:
        from edgeinfer.format.atomic import atomic_write

        output_dir.mkdir(parents=True, exist_ok=True)
        for name, array in outputs.items():
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            atomic_write(output_dir / f"{safe}.npy",
                         lambda handle, a=array: np.save(handle, a, allow_pickle=False))
        if not to_stdout:
            click.echo(f"wrote {len(outputs)} output(s) to {output_dir}")
    if json_path is not None:
        _write_run_json(json_path, outputs, times_ms, session.backend_name, threads)


def _all_from_files(model, specs: tuple[str, ...]) -> bool:
    """Whether ``-i`` gave every input of ``model`` (real data, not random)."""
    names = [info.name for info in model.inputs]
    given = {spec.partition("=")[0] if "=" in spec else names[0] for spec in specs}
    return set(names) <= given


def _run_naming_warnings(session, feeds: dict) -> dict:
    """One run. numpy's floating-point warnings ("invalid value encountered in divide") name no
    node: when one comes, the run is repeated once with those conditions raised, and the numpy
    backend's error names the node, which the warning then says."""
    import re
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = session.run(feeds)
    numeric = []
    for caught_warning in caught:
        text = str(caught_warning.message)
        if issubclass(caught_warning.category, RuntimeWarning) and " encountered in " in text:
            numeric.append(text) if text not in numeric else None
        else:
            warnings.warn_explicit(caught_warning.message, caught_warning.category, caught_warning.filename,
                                   caught_warning.lineno)
    if numeric:
        where = _node_raising_numeric_error(session, feeds)
        for text in numeric:
            warnings.warn(f"{where}: {text} (the outputs may hold NaN or inf)", RuntimeWarning, stacklevel=2)
            warnings.filterwarnings("ignore", message=re.escape(text), category=RuntimeWarning)  # said once
    return outputs


def _node_raising_numeric_error(session, feeds: dict) -> str:
    import re

    import numpy as np

    with np.errstate(divide="raise", over="raise", invalid="raise", under="ignore"):
        try:
            session.run(feeds)
        except Exception as exc:  # the numpy backend names the failing node
            found = re.search(r"node '[^']*' \([^)]*\)", str(exc))
            if found:
                return found.group(0)
    return f"a node on {session.backend_name} (its engine does not say which)"


def _write_run_json(path: Path, outputs: dict[str, np.ndarray], times_ms: np.ndarray, backend: str,
                    threads: int | None) -> None:
    import json

    from edgeinfer.cli.bench import percentiles
    from edgeinfer.format.atomic import atomic_write_bytes

    def described(array: np.ndarray) -> dict[str, Any]:
        facts: dict[str, Any] = {"dtype": str(array.dtype), "shape": list(array.shape)}
        if array.dtype.kind in "fiub" and array.size:
            facts.update(mean=float(array.mean()), std=float(array.std()), min=float(array.min()),
                         max=float(array.max()))
        return facts

    document = {"backend": backend, "threads": threads, "outputs": {k: described(v) for k, v in outputs.items()},
                "latency_ms": percentiles(times_ms / 1000), "runs": len(times_ms)}
    text = json.dumps(document, indent=1)
    if str(path) == "-":
        click.echo(text)
    else:
        atomic_write_bytes(path, text.encode())


def _print_profile(stats: dict, top: int = 15) -> None:
    timings = stats.get("node_timings")
    if not timings:
        click.echo("profile: this backend reports no per-node timings")
        return
    total = sum(t for _, t, _ in timings)
    click.echo(f"profile: {len(timings)} nodes, {total * 1000:.3f} ms in kernels; slowest {top}:")
    for label, seconds, shapes in sorted(timings, key=lambda row: -row[1])[:top]:
        click.echo(f"  {seconds * 1000:9.3f} ms {100 * seconds / total:5.1f}%  {label} -> {shapes}")
    if stats.get("peak_intermediate_bytes") is not None:
        click.echo(f"peak intermediate memory: {stats['peak_intermediate_bytes']:,} bytes")
    if stats.get("fallback_ops"):
        click.echo(f"onnx.reference fallback ops: {stats['fallback_ops']}")


def _preview(array: np.ndarray) -> str:
    import numpy as np

    flat = array.reshape(-1)
    if array.dtype.kind in "fc" and flat.size:
        top = f" argmax={int(flat.argmax())}" if array.ndim <= 2 else ""
        head = np.array2string(flat[:6], precision=4, separator=", ")
        return f"{head}{' ...' if flat.size > 6 else ''} (mean {flat.mean():.4g}, std {flat.std():.4g}){top}"
    return np.array2string(flat[:8], separator=", ") + (" ..." if flat.size > 8 else "")


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("--graph", "show_graph", is_flag=True, help="Also print the whole graph as text.")
@click.option("--plan", "show_plan", is_flag=True,
              help="Print where each part of the graph would run (with --backend ...) and why ops fell back.")
@click.option("--backend", default="numpy", show_default=True,
              help="For --plan: a backend or a priority list such as openvino+onnxruntime.")
@click.option("--device", type=click.Choice(["cpu", "gpu", "npu"]), default="cpu", show_default=True,
              help="For --plan: where accelerated backends run.")
@click.option("--executor", type=click.Choice(["sequential", "dag"]), default="sequential", show_default=True,
              help="For --plan: dag also cuts at forks and joins.")
@click.option("--dot", "dot_path", type=click.Path(path_type=Path),
              help="Write the graph as Graphviz dot here (render with: dot -Tsvg model.dot -o model.svg).")
@click.option("--html", "html_path", type=click.Path(path_type=Path),
              help="Write a self-contained HTML view of the graph here (no network needed to open it).")
@click.option("--json", "json_path", type=click.Path(path_type=Path),
              help="Write the summary as JSON here ('-': to stdout, nothing else printed).")
@click.option("--shape", "shape_specs", multiple=True, metavar="NAME:1x3x640x640",
              help="Count FLOPs at this input shape, binding its symbolic dims (repeatable).")
@click.option("--weights", type=click.Path(path_type=Path), help=WEIGHTS_HELP)
@handle_errors
def inspect(model_path: Path, show_graph: bool, show_plan: bool, backend: str, device: str, executor: str,
            dot_path: Path | None, html_path: Path | None, json_path: Path | None, shape_specs: tuple[str, ...],
            weights: Path | None) -> None:
    """Summarize MODEL (.eim or any convertible file): inputs, outputs, ops, parameters, FLOPs,
    weight bytes, quantization; draw its graph.

    Example: edgeinfer inspect models/sample_cnn.onnx --html sample.html --plan --backend openvino+onnxruntime
    """
    import json

    for path, suffix in ((dot_path, ".dot"), (html_path, ".html")):
        if path is not None and path.suffix.lower() not in (suffix, ".gv" if suffix == ".dot" else ".htm"):
            raise InputError(f"--{suffix[1:]} {path}: expected a path ending in {suffix}")
    model = _load_model(model_path, weights)
    from edgeinfer.cli import graphview
    from edgeinfer.format.atomic import atomic_write_bytes

    summary = model.summary()
    summary["flops"], flops_at = _flops(model, shape_specs, summary["flops"])
    quantized = graphview.quantization(model.graph)
    lines = [f"model   {model_path}"]
    lines += [f"meta    {key} = {value}" for key, value in model.metadata.items()]
    lines += [f"input   {info}" for info in model.inputs] + [f"output  {info}" for info in model.outputs]
    lines += [f"nodes   {summary['nodes']}",
              f"params  {summary['parameters']:,} ({summary['weight_bytes']:,} bytes: "
              + ", ".join(f"{k} {v:,}" for k, v in summary["weight_dtypes"].items()) + ")",
              f"flops   {summary['flops']:,.0f} ({_si(summary['flops'])}) {flops_at}",
              f"quant   {quantized}",
              "ops     " + ", ".join(f"{op} x{count}" for op, count in summary["ops"].items())]
    if json_path is not None:
        tensors = {kind: [{"name": t.name, "dtype": t.dtype, "shape": None if t.shape is None else list(t.shape)}
                          for t in infos] for kind, infos in (("inputs", model.inputs), ("outputs", model.outputs))}
        document = {**summary, **tensors, "flops_at": flops_at, "quantized": quantized, "metadata": model.metadata}
        text = json.dumps(document, indent=1, default=str)
        if str(json_path) == "-":
            click.echo(text)
            return
        atomic_write_bytes(json_path, text.encode())
    click.echo("\n".join(lines))
    if model_path.suffix.lower() == ".eim":
        from edgeinfer.format.sizes import size_breakdown

        click.echo("\n".join(size_breakdown(model_path).lines()))
    if show_graph:
        click.echo(str(model.graph))
    if show_plan:
        _print_plan(model, parse_backend(backend), device, executor)
    if dot_path is not None:
        atomic_write_bytes(dot_path, graphview.to_dot(model.graph).encode())
        click.echo(f"wrote {dot_path}")
    if html_path is not None:
        page = graphview.to_html(model.graph, title=model_path.name, summary_lines=lines[1:])
        atomic_write_bytes(html_path, page.encode())
        click.echo(f"wrote {html_path}")
    if json_path is not None:
        click.echo(f"wrote {json_path}")


def _check_backend_names(contenders: list) -> None:
    """A misspelt backend is an error at once; one that fails to run is a row of the table."""
    from edgeinfer.backend import available_backends
    from edgeinfer.errors import BackendError

    known = available_backends()
    for contender in contenders:
        for name in [contender] if isinstance(contender, str) else contender:
            if name != "auto" and name.partition("@")[0] not in known:  # torch@cuda:0: torch on that device
                raise BackendError(f"unknown backend {name!r}: expected one of {', '.join(known)} or auto")


def _flops(model, shape_specs: tuple[str, ...], declared: float) -> tuple[float, str]:
    """The FLOPs at ``--shape`` (types inferred again from those input shapes), or at the declared
    shapes, and a phrase saying which binding of the symbolic dims was used."""
    from edgeinfer.cli.shapes import free_symbols

    symbols = free_symbols(model.inputs)
    if not shape_specs:
        if not symbols:
            return declared, "at the declared shapes"
        return declared, (f"with symbolic dims {', '.join(symbols)} counted as 1 "
                          "(--shape NAME:D1xD2x... counts them at a real size)")
    from edgeinfer.api import redeclare_inputs
    from edgeinfer.ir.cost import graph_summary
    from edgeinfer.ir.infer import infer_types

    binding = bind(model.inputs, parse_shapes(shape_specs, input_names=[t.name for t in model.inputs],
                                              symbols=False))
    graph = infer_types(redeclare_inputs(model.graph, binding.shapes, False))
    defaults = f"; {', '.join(f'{k}={v}' for k, v in binding.defaults.items())} by default" if binding.defaults else ""
    return graph_summary(graph)["flops"], f"at {binding.describe()}{defaults}"


def _si(count: float) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f}"


def _print_plan(model, backend: str | list[str], device: str, executor: str) -> None:
    """The partition, from each backend's ``supports``: nothing is compiled or run."""
    from edgeinfer.runtime import placement

    if backend == "auto":
        raise InputError("--plan --backend auto: auto measures candidates by running them; give a backend "
                         "or a priority list (run `edgeinfer bench MODEL --backend auto` to see its choice)")
    names = placement.backend_priority(backend)
    backends = placement.make_backends(names, device=device, fallback=True)
    plan = placement.make_plan(model.graph, backends, branches=executor == "dag")
    counts = ", ".join(f"{name} {count}" for name, count in plan.node_counts().items())
    click.echo(f"plan    {len(plan.parts)} part(s) over {'+'.join(names)} on {device}; nodes: {counts}")
    click.echo(plan.describe())


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The file to write: .onnx, or .tflite (full-integer INT8 for a quantized model).")
@click.option("--weights", type=click.Path(path_type=Path), help=WEIGHTS_HELP)
@handle_errors
def export(model_path: Path, output: Path, weights: Path | None) -> None:
    """Export MODEL (.eim, or any convertible file) to ONNX or TFLite, by the suffix of -o.

    Example: edgeinfer export model.int8.eim -o model.tflite
    """
    import edgeinfer as ei

    ei.export(_load_model(model_path, weights), output)
    click.echo(f"wrote {output} ({output.stat().st_size:,} bytes)")


BENCH_EXECUTORS = ("local", "sequential", "dag", "auto", "ray")


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("--backend", "backends", default="numpy,onnxruntime", show_default=True,
              help="Comma-separated contenders; each a backend, auto, or a priority list such as openvino+onnxruntime.")
@click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads per session.")
@click.option("--device", type=click.Choice(["cpu", "gpu", "npu"]), default="cpu", show_default=True)
@click.option("--fallback", is_flag=True, help="Run on the CPU if --device is missing (with a warning).")
@click.option("--executor", type=click.Choice(BENCH_EXECUTORS), default="local", show_default=True,
              help="local: sequential sessions, --stream on local threads; dag: branches at once; "
                   "auto: sequential or dag, whichever measures faster; "
                   "ray: --stream also on Ray actors, beside the local pipeline.")
@click.option("-i", "--input", "inputs", multiple=True, metavar="NAME=FILE",
              help="Feed from a .npy file or an image (see --mean) (default: random feeds of the declared shapes).")
@image_options
@click.option("--batch", type=click.IntRange(1), default=1, show_default=True,
              help="Size of a symbolic leading (batch) dim.")
@shape_options
@click.option("--runs", type=click.IntRange(1), default=50, show_default=True, help="Timed runs per backend.")
@click.option("--warmup", type=click.IntRange(0), default=5, show_default=True, help="Untimed runs first.")
@click.option("--peers", is_flag=True,
              help="Also time the original file on its own engine (LiteRT for .tflite, onnxruntime for .onnx, "
                   "torch for TorchScript; for an .eim, its source file if it lies next to it), the baseline of "
                   "'vs original', and the raw engines installed (onnxruntime, OpenVINO, LiteRT) on the same model.")
@click.option("--top", type=click.IntRange(0), default=5, show_default=True,
              help="Slowest ops (numpy) or parts (several backends) to show per backend; 0: no profile.")
@click.option("--stream", "stream_requests", type=click.IntRange(1), default=None, metavar="N",
              help="Also serve N requests through the pipeline planner (first backend) and show its plan.")
@click.option("--stages", default="auto", show_default=True, help="Pipeline stages for --stream (or auto).")
@click.option("--json", "json_path", type=click.Path(path_type=Path),
              help="Write every figure and the machine's facts as JSON here ('-': to stdout, no table).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path),
              help="Write a PNG: latency distribution per backend and the slowest ops.")
@click.option("--memory", type=click.Choice(["inline", "isolated"]), default="inline", show_default=True,
              help="Peak RSS per backend measured in this process (alone, before timing), or each in a fresh "
                   "process (slower; nothing one engine loaded counts for another).")
@click.option("--weights", type=click.Path(path_type=Path), help=WEIGHTS_HELP)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no notes: the tables only.")
@precision_options
@handle_errors
@delegate_options  # inside handle_errors: its checks are one-line errors
def bench(model_path: Path, backends: str, threads: int | None, device: str, fallback: bool, executor: str,
          inputs: tuple[str, ...], image: dict, batch: int, shape_specs: tuple[str, ...], allow_unit_dims: bool, runs: int, warmup: int, peers: bool, top: int,
          stream_requests: int | None, stages: str, json_path: Path | None, plot_path: Path | None,
          memory: str, weights: Path | None, quiet: bool, backend_options: dict | None, precision: dict) -> None:
    """Measure MODEL (.eim, or any file edgeinfer converts) on this device, backend by backend.

    Per backend: compile time, first run, latency min/median/p90/p99/max over interleaved rounds,
    throughput, the peak resident memory it added, and where the time goes (per op on numpy,
    per part for a plan over several backends).

    Example: edgeinfer bench models/sample_cnn.onnx --backend numpy,onnxruntime,auto --peers --plot bench.png
    """
    import json

    contenders = [parse_backend(text) for text in backends.split(",") if text.strip()]
    if not contenders:
        raise InputError(f"--backend {backends!r}: expected at least one backend")
    _check_backend_names(contenders)
    _check_delegate_backends(backend_options, contenders)
    if stages != "auto" and not (stages.isdigit() and int(stages) > 0):
        raise InputError(f"--stages {stages!r}: expected a positive number or auto")
    if plot_path is not None and plot_path.suffix.lower() != ".png":
        raise InputError(f"--plot {plot_path}: expected a path ending in .png")
    to_stdout = json_path is not None and str(json_path) == "-"
    quiet = quiet or to_stdout
    model = _load_model(model_path, weights)
    from edgeinfer.cli import bench as measure
    from edgeinfer.cli import tables
    from edgeinfer.cli.peers import PEERS
    from edgeinfer.cli.progress import progress_bar, shows_progress
    from edgeinfer.format.atomic import atomic_write_bytes

    feeds = _load_feeds(model, inputs, True, batch, shape_specs, timed="bench", allow_unit_dims=allow_unit_dims,
                        image=image)
    options = {"device": device, "fallback": fallback,
               "executor": executor if executor in ("dag", "auto") else "sequential",
               **session_precision(model, precision, feeds, _all_from_files(model, inputs),
                                   lambda spec: _load_feeds(model, (spec,), False, 1, shape_specs, image=image))}
    if backend_options is not None:
        options["backend_options"] = backend_options
    peer_names = list(PEERS) if peers else []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    total = measure.steps(contenders, peer_names, runs, top > 0, memory) + (2 if stream_requests else 0)
    with progress_bar(f"bench {model_path.name}", total, enabled=shows_progress(quiet)) as progress:
        reports = measure.latency(model, contenders, feeds, threads=threads, runs=runs, warmup=warmup,
                                  peers=peer_names, source=model_path, profile=top > 0, progress=progress,
                                  skipped=skipped, failed=failed, memory=memory, **options)
        streams = []
        if stream_requests:
            choice = int(stages) if stages.isdigit() else "auto"
            streamed_backend = next(c for c in contenders if measure.backend_label(c) not in failed)
            for where in ("local", "ray") if executor == "ray" else ("local",):
                progress.describe(f"stream on {where} ({stream_requests} requests)")
                streams.append(measure.stream(model, streamed_backend, feeds, threads=threads,
                                              requests=stream_requests, stages=choice, executor=where,
                                              device=device, fallback=fallback))
                progress.advance()
    document = measure.as_json(reports, streams, skipped_peers=skipped, failed=failed, settings={
        "model": str(model_path), "backends": backends, "threads": threads, "device": device, "batch": batch,
        "runs": runs, "warmup": warmup, "executor": executor, "memory": memory, "feeds": {k: list(v.shape) for k, v in feeds.items()},
        "precision": precision["precision"]})
    flush_notes()
    if to_stdout:
        click.echo(json.dumps(document, indent=1))
        return
    out = tables.console()
    shown = format_shapes({k: v.shape for k, v in feeds.items()})
    out.print(f"{model_path.name}: {shown}, threads {threads or 'default'}, {runs} interleaved runs "
              f"after {warmup} warm-up", highlight=False)
    latency_table = tables.latency_table(reports, failed, width=out.width)
    out.print(latency_table)
    for line in [*tables.integer_lines(reports, latency_table), *tables.precision_lines(reports, latency_table)]:
        out.print(line, highlight=False, soft_wrap=True)
    for line in tables.failure_lines(failed, reports):
        out.print(line, highlight=False, soft_wrap=True)
    for heading, table, footnote in tables.profile_tables(reports, top):
        out.print(heading, highlight=False)
        out.print(table)
        if footnote:
            out.print(footnote, highlight=False)
    table = tables.peer_table(reports)
    if table is not None:
        out.print(tables.PEER_HEADING, highlight=False)
        out.print(table)
    for line in tables.peer_lines(reports, skipped):
        out.print(line, highlight=False, soft_wrap=True)
    for streamed in streams:
        click.echo("\n".join(tables.stream_lines(streamed)))
    if not quiet:
        method = next((r.memory_method for r in reports if r.memory_method), "")
        click.echo(f"peak RSS: the resident memory each contender added while compiling and warming up ({method})")
    if json_path is not None:
        atomic_write_bytes(json_path, json.dumps(document, indent=1).encode())
        if not quiet:
            click.echo(f"wrote {json_path}")
    if plot_path is not None:
        measure.plot(reports, plot_path, title=f"{model_path.name} on {measure.machine_facts()['machine']}")
        if not quiet:
            click.echo(f"wrote {plot_path}")


main.add_command(quantize_command)


@main.command("compile")
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The compiled .eim to write.")
@click.option("--backend", default="auto", show_default=True,
              help="auto (measured here), a backend name, or a priority list such as openvino+onnxruntime.")
@click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads the device will run it on.")
@click.option("--shape", "shape_specs", multiple=True, metavar="NAME:1x3x224x224",
              help="Static shape of an input, binding its symbolic dims (repeatable; a bare 1x3x224x224 for a "
                   "model with one input).")
@click.option("-i", "--input", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="An example input to decide on (repeatable); a model with symbolic dims keeps them.")
@click.option("--weights", type=click.Path(path_type=Path), help=WEIGHTS_HELP)
@click.option("--on-device", is_flag=True,
              help="Leave the plan to the device: its first Session decides (auto measured there) and writes the "
                   "compiled file back in place of this one.")
@precision_options
@handle_errors
def compile_command(model_path: Path, output: Path, backend: str, threads: int | None, shape_specs: tuple[str, ...],
                    inputs: tuple[str, ...], weights: Path | None, on_device: bool, precision: dict) -> None:
    """Compile MODEL ahead of time into one .eim: the plan (auto measured on this machine) and
    each part's engine-ready artifact, so a device loads it with no export and no measuring.

    Example: edgeinfer compile model.onnx -o model.eim --backend auto --threads 2
    """
    model = _load_model(model_path, weights)
    import edgeinfer as ei

    asked = parse_backend(backend)
    shapes = parse_shapes(shape_specs, input_names=[t.name for t in model.inputs], symbols=False)
    if on_device:
        if inputs or precision["precision"] != "fp32" or precision["samples"]:
            raise InputError("compile --on-device: -i inputs and --precision/--sample are for compiling here; the "
                             "device decides on its own inputs, in fp32")
        ei.compile(model, output, backend=asked, threads=threads, shapes=shapes, on_device=True)
        click.echo(f"wrote {output}: the IR, {output.stat().st_size / 2**20:.2f} MiB, to be compiled on the device by "
                   f"its first Session (backend {backend}, written back in place where the file is writable)")
        return
    feeds = _load_feeds(model, inputs, False, 1) if inputs else None
    reduced = session_precision(model, precision, feeds, True, lambda spec: _load_feeds(model, (spec,), False, 1))
    with auto_progress(asked == "auto" or bool(reduced)):
        compiled = ei.compile(model, output, backend=asked, threads=threads, shapes=shapes, example_feeds=feeds,
                              **reduced)
    section = compiled.compiled
    if section.auto is not None:
        click.echo(f"auto: {','.join(section.auto['backends'])} ({section.auto['reason']})", err=True)
    from edgeinfer.runtime.precision import describe as precision_lines

    for line in precision_lines(section.precision):
        click.echo(line, err=True)
    made = sum(1 for part in section.parts if part["artifact"] is not None)
    placed = ", ".join(f"{part['backend']} {len(part['nodes'])} node(s)" for part in section.parts)
    click.echo(f"wrote {output}: {len(section.parts)} part(s) ({placed}), {made} engine artifact(s), "
               f"{output.stat().st_size / 2**20:.2f} MiB, for {section.machine}")


@main.command()
@click.option("--json", "json_path", type=click.Path(path_type=Path),
              help="Write the facts as JSON here ('-': to stdout, nothing else printed).")
@handle_errors
def devices(json_path: Path | None) -> None:
    """Show this machine's CPU and the ISA features that matter (AVX2, AVX-512, VNNI, AMX, BF16, FP16;
    NEON, dotprod on ARM), the engines installed with their providers or devices, and the INT8 path
    each engine takes here.

    Example: edgeinfer devices
    """
    import json

    from edgeinfer.cli.devices import lines, machine_facts
    from edgeinfer.engine_logs import quiet_onnxruntime
    from edgeinfer.format.atomic import atomic_write_bytes

    quiet_onnxruntime()
    facts = machine_facts()
    if json_path is not None:
        text = json.dumps(facts.as_json(), indent=1)
        if str(json_path) == "-":
            click.echo(text)
            return
        atomic_write_bytes(json_path, text.encode())
    click.echo("\n".join(lines(facts)))
    if json_path is not None:
        click.echo(f"wrote {json_path}")
