"""The rewrite report as a table: the same columns as ``equarx rewrite
--report`` (the CLI's ``src/tables.rs``), made from the report dicts that
:func:`equarx.rewrite` and :func:`equarx.jax.last_report` return.

One row per collective:

============  ==============================================================
column        what it says
============  ==============================================================
collective    the instruction's name in the module
op            its opcode (``all-reduce``, ``reduce-scatter``, ...)
shape         its result shape
P             devices per group
mode          how its groups name devices (``flattened ids``, ...)
plan          the plan of a rewrite: algorithm, ``+hadamard`` when rotated,
              ``/loop`` or ``/unrolled`` when it repeats steps
decision      ``rewritten`` or ``skipped``
wire before   bytes each device sends, the collective done the
              bandwidth-optimal way in its own type
wire after    bytes each device sends in the emitted collectives
ratio         wire before / wire after
rel.err       predicted relative RMS error against the exact sum, on the
              data column's basis
data          what rel.err assumed of the data: ``prior`` (fitted to a real
              LLM's all-reduce inputs), ``profile`` (this op's own,
              measured by calibration), ``prior*`` (a profile was given but
              holds nothing for this op; the report's ``prediction`` says
              why)
model         the time model's speedup on the ``topology`` option (a model,
              not a measurement)
reason        why it was skipped (or a note, e.g. forced)
============  ==============================================================

Example (no jax needed)::

    import equarx
    result = equarx.rewrite(open("module.pb", "rb").read(), {"min_payload_bytes": 0})
    print(equarx.format_report(result.report))
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

#: The columns, as the CLI names them, and whether they align right.
COLUMNS: tuple[tuple[str, bool], ...] = (
    ("collective", False),
    ("op", False),
    ("shape", False),
    ("P", True),
    ("mode", False),
    ("plan", False),
    ("decision", False),
    ("wire before", True),
    ("wire after", True),
    ("ratio", True),
    ("rel.err", True),
    ("data", False),
    ("model", True),
    ("reason", False),
)


def plan_cell(plan: Mapping[str, Any] | None) -> str:
    """``two-shot+hadamard``, ``ring/loop``: a plan's algorithm, rotation
    and form; ``-`` without a plan."""
    if not plan:
        return "-"
    rotation = "+hadamard" if plan.get("rotation") == "hadamard" else ""
    form = f"/{plan['form']}" if plan.get("form") else ""
    return f"{plan['algorithm']}{rotation}{form}"


#: The ``data`` column's word for each ``basis`` a report names.
BASIS_WORDS = {"prior": "prior", "profile": "profile", "prior-unmatched": "prior*"}


def _count(v: Any) -> str:
    return "-" if v is None else str(v)


def row(op: Mapping[str, Any]) -> list[str]:
    """One report dict as the table's cells."""
    before, after = op.get("wire_bytes_before"), op.get("wire_bytes_after")
    ratio = f"{before / after:.3f}" if before is not None and after else "-"
    err = op.get("predicted_rel_rms")
    time = op.get("predicted_time")
    return [
        op["name"],
        op["opcode"],
        op["shape"],
        _count(op.get("group_size")),
        op["mode"],
        plan_cell(op.get("plan")),
        "rewritten" if op["rewritten"] else "skipped",
        _count(before),
        _count(after),
        ratio,
        "-" if err is None else f"{err * 100:.2f}%",
        "-" if op.get("basis") is None else BASIS_WORDS.get(op["basis"], op["basis"]),
        "-" if time is None else f"{time['speedup']:.2f}x",
        op.get("reason") or "",
    ]


def format_report(report: Iterable[Mapping[str, Any]]) -> str:
    """The report as the CLI's ``--report`` table, with a closing line: how
    many collectives were rewritten and the pipeline stage the module was
    taken to be at. Every line ends in a newline, none in spaces."""
    report = list(report)
    rows = [[name for name, _ in COLUMNS]] + [row(op) for op in report]
    widths = [max(len(r[k]) for r in rows) for k in range(len(COLUMNS))]
    lines = []
    for r in rows:
        cells = (
            cell.rjust(w) if right else cell.ljust(w)
            for cell, w, (_, right) in zip(r, widths, COLUMNS)
        )
        lines.append(" ".join(cells).rstrip() + "\n")
    rewritten = sum(1 for op in report if op["rewritten"])
    stage = (
        f", the module taken to be {report[0]['stage']} (option stage), emitted for "
        f"{report[0]['platform']} (option platform)"
        if report
        else ""
    )
    lines.append(
        f"{rewritten} of {len(report)} collectives rewritten{stage}; rel.err: predicted "
        "on the data column's basis (prior: fitted to a real LLM's all-reduce inputs; "
        "profile: this op's own, option profile; prior*: the profile holds nothing for "
        "it, the report's prediction says why); model: the time model's speedup on the "
        "topology option, a model, not a measurement\n"
    )
    return "".join(lines)


__all__ = ["COLUMNS", "format_report", "plan_cell", "row"]
