"""Plain-text formatting shared by the CLI, the dashboard and the diagnosis (bytes, durations, rank lists)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def human_bytes(value: float | None) -> str:
    """1536 -> '1.5K'; None -> '-'."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(size) < 1024 or unit == "T":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}P"


def human_duration(seconds: float | None) -> str:
    """75 -> '1m15s'; None -> '-'; under a millisecond '<1ms' (never "about 0ms")."""
    if seconds is None:
        return "-"
    if 0 < seconds < 0.0005:
        return "<1ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for r in ordered:
        if start is None:
            start = prev = r
        elif prev is not None and r == prev + 1:
            prev = r
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def percent(value: float | None) -> str:
    """0.256 -> '26%' for fractions."""
    return "-" if value is None else f"{value * 100:.0f}%"


def number(value: float | None, fmt: str = "{:.0f}") -> str:
    """A cell's number in *fmt*; None -> '-' (not available, never a made-up 0)."""
    return "-" if value is None else fmt.format(value)


def pending_text(op: str, seq: int, age_s: float | None) -> str:
    """A collective a rank waits in: 'all_reduce #223 9.0s' (the table's and snapshot's cell)."""
    return f"{op} #{seq} {human_duration(age_s)}"


def usage_text(used: float | None, total: float | None) -> str:
    """Used of total bytes: '1.0K/8.8K'; '-' when unknown."""
    return "-" if used is None else f"{human_bytes(used)}/{human_bytes(total)}"


# Flight Recorder's dtype names (c10's ScalarType) as a person reads them in torch.
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def dtype_text(dtype: str) -> str:
    """'Float' -> 'float32'; torch's own names ('torch.float16') lose the prefix."""
    return _DTYPES.get(dtype, dtype.removeprefix("torch."))


def tensor_text(shapes: Sequence[Sequence[int]], dtype: str = "") -> str:
    """[[4, 6922]], 'Float' -> '[4, 6922] float32'; several tensors joined by ' + '."""
    dims = " + ".join(f"[{', '.join(str(d) for d in shape)}]" for shape in shapes)
    return f"{dims} {dtype_text(dtype)}".strip() if dims else dtype_text(dtype)


def op_tensors(sizes: Sequence[Sequence[Sequence[int]]], dtype: str = "") -> str:
    """A collective's [inputs, outputs] as a person reads them: '[6922] -> [4, 6922] float32'
    (outputs only where they differ from the inputs: an all_gather, a reduce_scatter)."""
    if not sizes or not sizes[0]:
        return dtype_text(dtype)
    inputs = tensor_text(sizes[0])
    if len(sizes) > 1 and sizes[1] and [list(s) for s in sizes[1]] != [list(s) for s in sizes[0]]:
        inputs = f"{inputs} -> {tensor_text(sizes[1])}"
    return f"{inputs} {dtype_text(dtype)}".strip()


def op_text(op: object) -> str:
    """A collective as a person reads it: 'all_reduce [64] float32' (the backend prefix dropped)."""
    name = str(getattr(op, "op", "?")).split(":", 1)[-1]
    sizes = getattr(op, "sizes", None) or []
    tensors = op_tensors(sizes, str(getattr(op, "dtype", ""))) if sizes and sizes[0] else ""
    return f"{name} {tensors}".strip()
