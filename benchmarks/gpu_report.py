"""The GPU check's report: MFU, shares of the measured matmul peak and the ratios to HF for every row, written as
gpu_check.json and the markdown table gpu_check.md."""
from __future__ import annotations

import datetime
import json
from pathlib import Path

from gpu_flops import mfu, peak_bf16_tflops

COMPARED_WITH_HF = ("bert", "bert_compile", "gpt", "gpt_compile", "decode")


def write_report(rows: list[dict], skipped: dict[str, str], device: str, args) -> dict:
    """MFU and shares of the measured matmul peak for every row, the HF ratios, and the report."""
    peak = peak_bf16_tflops(device)
    peak_tflops, peak_source = (args.peak_tflops, "--peak-tflops") if args.peak_tflops else (peak or (None, None))
    measured = {r["dtype"]: r["matmul_flops_per_s"] for r in rows if r["model"] == "matmul"}
    for r in rows:
        if r.get("flops_per_step"):
            achieved = r["flops_per_step"] / r["step_s"]
            r["tflops"] = achieved / 1e12
            if peak_tflops and r["dtype"] == "bf16":
                r["mfu"] = mfu(r["flops_per_step"], r["step_s"], peak_tflops)
            if r["dtype"] in measured:
                r["of_matmul_peak"] = achieved / measured[r["dtype"]]
        # against HF's row of the same model, batch and decoding mode ("ours, beam-4" and "HF generate, beam-4")
        hf = [x for x in rows if x["model"] == r["model"] and x["impl"].startswith("HF")
              and x.get("batch") == r.get("batch") and x["impl"].split(", ")[1:] == r["impl"].split(", ")[1:]]
        if hf and r["phase"] in COMPARED_WITH_HF and r is not hf[0]:
            r["vs_hf"] = r["tokens_per_s"] / hf[0]["tokens_per_s"]
    report = {"device": device, "date": datetime.date.today().isoformat(), "quick": args.quick,
              "peak_bf16_tflops": peak_tflops, "peak_source": peak_source, "rows": rows, "skipped": skipped,
              "anchors": "docs/gpu.md"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    table = markdown(report)
    (out / "gpu_check.md").write_text(table)
    print("\n" + table, flush=True)
    return report


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    return "" if value is None else format(value * scale, spec)


def _tflops(value: float | None) -> str:
    """One decimal on a GPU; three significant digits for the CPU's fractions of a TFLOP/s."""
    return "" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def markdown(report: dict) -> str:
    peak = (f"{report['peak_bf16_tflops']:g} TFLOP/s dense bf16 ({report['peak_source']})"
            if report["peak_bf16_tflops"] else "not in the table: MFU left empty (pass --peak-tflops)")
    quick = " (--quick: tiny sizes, a check of the script, not a measurement)" if report["quick"] else ""
    lines = [f"{report['device']}, {report['date']}{quick}; peak {peak}", "",
             "| phase | model | implementation | batch x seq | dtype | ms/step | tokens/s | seq/s | TFLOP/s | MFU "
             "| of matmul peak | vs HF | harness overhead | peak mem GiB | 1st step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        if r["model"] == "matmul":
            lines.append(f"| {r['phase']} | matmul | {r['impl']} | | {r['dtype']} | | | | "
                         f"{_tflops(r['matmul_flops_per_s'] / 1e12)} | | 100% | | | | |")
            continue
        lines.append(
            f"| {r['phase']} | {r['model']} | {r['impl']} | {r['batch']} x {r['seq']} | {r['dtype']} "
            f"| {_fmt(r.get('step_s'), '.1f', 1e3)} | {_fmt(r.get('tokens_per_s'), ',.0f')} "
            f"| {_fmt(r.get('sequences_per_s'), ',.1f')} "
            f"| {_tflops(r.get('tflops'))} | {_fmt(r.get('mfu'), '.1%')} | {_fmt(r.get('of_matmul_peak'), '.1%')} "
            f"| {_fmt(r.get('vs_hf'), '.2f')}{'x' if r.get('vs_hf') else ''} "
            f"| {_fmt(r.get('overhead_vs_bare'), '+.1%')} | {_fmt(r.get('peak_mem_gib'), '.1f')} "
            f"| {_fmt(r.get('first_step_s'), '.1f')} |")
    notes = [f"- {r['phase']} / {r['impl']}: {r['note']}" for r in report["rows"] if r.get("note")]
    skipped = [f"- {name}: {reason}" for name, reason in report["skipped"].items()]
    return "\n".join([*lines, "", *(["Notes:", *notes, ""] if notes else []),
                      *(["Skipped:", *skipped] if skipped else ["Skipped: none"])]) + "\n"
