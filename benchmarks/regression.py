"""A regression check over bench_model.py runs: each ratio the benchmark reports, held to a bound.

    python benchmarks/regression.py LOG [LOG ...] [--size 1.5b] [--min-int8-over-fp32 3.5] ...

Each LOG is the output of one bench_model.py run (its JSON lines; anything else is skipped). For
each run, every check below is listed with the number of rows it applies to, the worst of them and
whether the run passed it; with several runs, a last table gives how many runs passed each check,
each run's worst row, and the lowest of the rows' medians over the runs (what a typical run gives).
The bounds are options (``--help`` lists them with their defaults), so a machine or a change can be
held to what it is expected to reach:

- decode's share of the measured memory bandwidth (``--min-bandwidth-share-fp32`` for fp32,
  ``--min-bandwidth-share`` for bf16 and int8 weights): held against the run's best read ("% BW"),
  and shown beside it against the bandwidth at the moments the row decoded ("% moment"), which on
  a shared machine moves by a third from one 5-second reading to the next;
- int8 decode against our fp32 decode (both int8 strategies against `cpu fp32`, timed interleaved
  in the same rounds) and against upstream's `cpu fp32i8` (upstream's RWKV-7 has no int8, so
  RWKV-7 rows have no such figure);
- every strategy against upstream's, decode and prefill (an upstream row stopped in its prefill
  gives a lower bound on our ratio: it passes when that bound is above the minimum);
- our int8 prefill against our fp32 prefill.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Bounds:
    """The bounds of the checks (the defaults are ``--help``'s)."""
    bandwidth_share_fp32: float = 80.0  # % of the best read, `cpu fp32` decode
    bandwidth_share: float = 85.0  # % of the best read, bf16 and int8 decode
    int8_over_fp32: float = 3.5  # int8 decode speed / our fp32 decode speed
    int8_over_upstream_int8: float = 10.0  # int8 decode speed / upstream's `cpu fp32i8`
    over_upstream: float = 1.0  # decode and prefill speed / upstream's, same strategy (must exceed)
    int8_prefill_over_fp32: float = 0.7  # int8 prefill speed / our fp32 prefill speed

    def share_for(self, strategy: str):
        """The bandwidth-share bound of a strategy, or None for strategies not checked."""
        if strategy not in ("cpu fp32", "cpu bf16", "cpu fp32i8", "cpu bf16i8"):
            return None
        return self.bandwidth_share_fp32 if strategy == "cpu fp32" else self.bandwidth_share


@dataclass
class Check:
    """One check of one run: per row (a label), its value, the bound it must reach and a note
    shown beside it. The worst row is the one with the least margin over its bound."""
    name: str
    short_name: str
    strict: bool = False  # the value must exceed the bound, not only reach it
    counted: bool = True  # counted in the verdict (False: shown for comparison)
    rows: dict = field(default_factory=dict)  # label -> (value, bound, note)

    def add(self, label: str, value: float, bound: float, note: str = "") -> None:
        self.rows[label] = (value, bound, note)

    @property
    def worst(self):
        """(label, value, bound, note) of the row with the least margin, or None."""
        if not self.rows:
            return None
        label = min(self.rows, key=lambda k: self.rows[k][0] - self.rows[k][1])
        return (label, *self.rows[label])

    @property
    def met(self):
        """True or False; None when no row has the figure."""
        return None if not self.rows else not self.short()

    def short(self) -> list:
        """(label, value, bound, note) of every row below its bound."""
        return [(k, v, b, n) for k, (v, b, n) in self.rows.items()
                if (v <= b if self.strict else v < b)]


def model_rows(lines) -> list:
    """The final "model" records of one bench_model.py log (lines of text)."""
    rows = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") == "model":
            rows.append(rec)
    return rows


def _number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def check(rows: list, size: str = "1.5b", bounds: Bounds = Bounds()) -> list:
    """The checks of one run's rows of checkpoints of ``size``, then the bandwidth share against
    the moment readings, for comparison (not counted)."""
    b = bounds
    share = Check(f"decode % of the best read bandwidth (fp32 >= {b.bandwidth_share_fp32:g}, "
                   f"others >= {b.bandwidth_share:g})", "bandwidth share")
    moment = Check("for comparison, not counted: decode % of the bandwidth at its moments "
                    "(same bounds)", "moment bandwidth share", counted=False)
    ratio = Check(f"int8 decode / our fp32 decode >= {b.int8_over_fp32:g}", "int8 / fp32 decode")
    vs_up8 = Check(f"int8 decode / upstream's cpu fp32i8 >= {b.int8_over_upstream_int8:g}",
                    "int8 / upstream int8 decode")
    decode = Check(f"decode / upstream's same strategy > {b.over_upstream:g}", "decode vs upstream",
                    strict=True)
    prefill = Check(f"prefill / upstream's same strategy > {b.over_upstream:g}", "prefill vs upstream",
                     strict=True)
    pre8 = Check(f"int8 prefill / our fp32 prefill >= {b.int8_prefill_over_fp32:g}", "int8 / fp32 prefill")
    by_version = {}
    for r in rows:
        if r["size"] == size:
            by_version.setdefault(r["version"], {})[r["strategy"]] = r
    for version, strategies in by_version.items():
        fp32 = strategies.get("cpu fp32")
        up_int8 = _number(strategies.get("cpu fp32i8", {}).get("upstream_decode_ms"))
        for strategy, r in strategies.items():
            label = f"{size} v{version} {strategy}"
            need, pct = b.share_for(strategy), _number(r.get("pct_of_bandwidth"))
            if need is not None and pct is not None:
                share.add(label, pct, need,
                          f"moment {r.get('pct_of_decode_moment_bandwidth')}")
            moment_pct = _number(r.get("pct_of_decode_moment_bandwidth"))
            if need is not None and moment_pct is not None:
                moment.add(label, moment_pct, need)
            speedup = _number(r.get("decode_speedup"))
            if speedup is not None:
                decode.add(label, speedup, b.over_upstream)
            pre, above = _number(r.get("prefill_speedup")), _number(r.get("prefill_speedup_above"))
            if pre is not None:
                prefill.add(label, pre, b.over_upstream)
            elif above is not None:
                prefill.add(label, above, b.over_upstream, "lower bound: upstream stopped in its prefill")
            if "i8" not in strategy:
                continue
            if fp32 is not None:
                ratio.add(label, fp32["ours_decode_ms"] / r["ours_decode_ms"], b.int8_over_fp32)
                pre8.add(label, r["ours_prefill_tps"] / fp32["ours_prefill_tps"], b.int8_prefill_over_fp32)
            if up_int8 is not None:
                vs_up8.add(label, up_int8 / r["ours_decode_ms"], b.int8_over_upstream_int8)
    return [share, ratio, vs_up8, decode, prefill, pre8, moment]


def _verdict(met) -> str:
    return "no rows" if met is None else "passed" if met else "FAILED"


def _figure(value, note: str) -> str:
    return f"{value:.4g} ({note})" if note else f"{value:.4g}"


def report(checks: list) -> str:
    """One run's checks as markdown: a line per check with its worst row, then every row below its
    bound."""
    out = ["| check | rows | worst | worst row | |", "|---|---:|---|---|---|"]
    for t in checks:
        if t.worst is None:
            out.append(f"| {t.name} | 0 | | | {_verdict(None)} |")
            continue
        label, value, _, note = t.worst
        out.append(f"| {t.name} | {len(t.rows)} | {_figure(value, note)} | {label} | {_verdict(t.met)} |")
    counted = [t for t in checks if t.counted]
    met = sum(1 for t in counted if t.met)
    out += ["", f"{met} of {len(counted)} checks passed in this run"
            + (f" ({sum(1 for t in counted if t.met is None)} without rows)"
               if any(t.met is None for t in counted) else "") + "."]
    short = [(t, row) for t in counted for row in t.short()]
    if short:
        out += ["", "Below a bound:"]
        out += [f"- {label}: {_figure(v, note)}, needs {b:g} ({t.short_name})" for t, (label, v, b, note) in short]
    return "\n".join(out)


def summary(runs: list) -> str:
    """Several runs' checks (lists of Check, in check's order) as one markdown table: each
    check's worst row per run and how many runs passed it."""
    out = ["| check | runs passed | worst row per run | lowest median over the runs (its row) |",
           "|---|---:|---|---|"]
    for k, first in enumerate(runs[0]):
        worsts = [run[k].worst for run in runs if run[k].worst is not None]
        met = sum(1 for run in runs if run[k].met)
        cells = "; ".join(f"{v:.4g} ({label})" for label, v, _, _ in worsts)
        # Each row's median over the runs that have it, held to its bound like one run's value.
        per_row = {}
        for run in runs:
            for label, (v, b, _) in run[k].rows.items():
                per_row.setdefault(label, ([], b))[0].append(v)
        medians = Check(first.name, first.short_name, first.strict)
        for label, (vs, b) in per_row.items():
            medians.add(label, statistics.median(vs), b, f"{len(vs)} runs")
        typical = "" if medians.worst is None else "{1:.4g} ({0}, {3})".format(*medians.worst)
        out.append(f"| {first.name} | {met} of {len(worsts)} | {cells} | {typical} |")
    return "\n".join(out)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Check bench_model.py logs against bounds on their ratios.")
    p.add_argument("logs", nargs="+", metavar="LOG", help="output of one bench_model.py run each")
    p.add_argument("--size", default="1.5b", help="the checkpoint size whose rows are checked (default 1.5b)")
    d = Bounds()
    for name, help_ in (("bandwidth_share_fp32", "minimum %% of the best read for cpu fp32 decode"),
                        ("bandwidth_share", "minimum %% of the best read for bf16 and int8 decode"),
                        ("int8_over_fp32", "minimum int8 / our fp32 decode speed"),
                        ("int8_over_upstream_int8", "minimum int8 / upstream's cpu fp32i8 decode speed"),
                        ("over_upstream", "decode and prefill speed / upstream's must exceed this"),
                        ("int8_prefill_over_fp32", "minimum int8 / our fp32 prefill speed")):
        p.add_argument("--min-" + name.replace("_", "-"), dest=name, type=float, default=getattr(d, name),
                       help=f"{help_} (default %(default)g)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    bounds = Bounds(**{k: getattr(a, k) for k in Bounds.__dataclass_fields__})
    runs = []
    for path in a.logs:
        with open(path) as f:
            rows = model_rows(f)
        if not rows:
            print(f"{path}: no bench_model.py rows (a run that did not finish?)", file=sys.stderr)
            return 1
        runs.append(check(rows, a.size, bounds))
        print(f"## {path}\n\n{report(runs[-1])}\n")
    if len(runs) > 1:
        print(f"## {len(runs)} runs\n\n{summary(runs)}")
    return 0 if all(t.met is not False for run in runs for t in run if t.counted) else 3


if __name__ == "__main__":
    sys.exit(main())
