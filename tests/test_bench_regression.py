"""benchmarks/regression.py: bounds on bench_model.py's ratios, checked against its rows (no timing
here: the rows are made up, to see each check pass and fail at its bound)."""

import json

import pytest

from benchmarks import regression

STRATEGIES = ("cpu fp32", "cpu bf16", "cpu fp32i8", "cpu bf16i8")


def _row(version, strategy, **over):
    """A "model" record of bench_model.py that passes every check at the default bounds."""
    i8 = "i8" in strategy
    row = {"kind": "model", "size": "1.5b", "version": version, "strategy": strategy,
           "ours_decode_ms": 40.0 if i8 else 160.0, "upstream_decode_ms": 8000.0 if i8 else 300.0,
           "decode_speedup": 200.0 if i8 else 1.9, "ours_prefill_tps": 45.0,
           "upstream_prefill_tps": 30.0, "prefill_speedup": 1.5, "pct_of_bandwidth": 90.0,
           "pct_of_decode_moment_bandwidth": 95.0}
    if version == "7" and i8:  # upstream's RWKV-7 has no int8
        row.update(upstream_decode_ms="n/a (upstream v7 has no int8)", decode_speedup=None,
                   upstream_prefill_tps=None, prefill_speedup=None)
    row.update(over)
    return row


def _run(changes=None):
    """Rows of versions 4, 6 and 7 in every strategy; changes: (version, strategy) -> fields."""
    changes = changes or {}
    return [_row(v, s, **changes.get((v, s), {})) for v in ("4", "6", "7") for s in STRATEGIES]


def _by_name(result):
    return {t.short_name: t for t in result}


def test_a_run_passing_everything_passes_all_six_checks():
    result = regression.check(_run())
    assert [t.met for t in result if t.counted] == [True] * 6
    assert "6 of 6 checks passed in this run." in regression.report(result)
    t = _by_name(result)
    assert len(t["bandwidth share"].rows) == 12
    assert t["int8 / fp32 decode"].rows["1.5b v6 cpu bf16i8"][0] == 4.0  # 160 / 40
    # RWKV-7 has no upstream int8 to compare with; its int8 rows have no upstream figures
    assert sorted(t["int8 / upstream int8 decode"].rows) == [
        "1.5b v4 cpu bf16i8", "1.5b v4 cpu fp32i8", "1.5b v6 cpu bf16i8", "1.5b v6 cpu fp32i8"]
    assert len(t["decode vs upstream"].rows) == 10


@pytest.mark.parametrize("change, name, met", [
    ((("4", "cpu fp32"), {"pct_of_bandwidth": 80.0}), "bandwidth share", True),
    ((("4", "cpu fp32"), {"pct_of_bandwidth": 79.9}), "bandwidth share", False),
    ((("6", "cpu bf16"), {"pct_of_bandwidth": 84.9}), "bandwidth share", False),
    ((("7", "cpu bf16i8"), {"pct_of_bandwidth": 85.0}), "bandwidth share", True),
    ((("6", "cpu fp32i8"), {"ours_decode_ms": 45.8}), "int8 / fp32 decode", False),  # 3.49
    ((("7", "cpu fp32"), {"ours_decode_ms": 140.0}), "int8 / fp32 decode", True),  # 3.5
    ((("4", "cpu fp32i8"), {"upstream_decode_ms": 399.0}), "int8 / upstream int8 decode", False),
    ((("4", "cpu fp32i8"), {"upstream_decode_ms": 400.0}), "int8 / upstream int8 decode", True),
    ((("6", "cpu fp32"), {"decode_speedup": 1.0}), "decode vs upstream", False),
    ((("6", "cpu fp32"), {"decode_speedup": 1.01}), "decode vs upstream", True),
    ((("4", "cpu fp32"), {"prefill_speedup": 0.96}), "prefill vs upstream", False),
    ((("7", "cpu fp32i8"), {"ours_prefill_tps": 31.0}), "int8 / fp32 prefill", False),
    ((("7", "cpu fp32i8"), {"ours_prefill_tps": 31.5}), "int8 / fp32 prefill", True),
])
def test_each_check_is_held_to_its_bound(change, name, met):
    key, fields = change
    result = _by_name(regression.check(_run({key: fields})))
    assert result[name].met is met
    others = [t.met for n, t in result.items() if n != name and t.counted]
    assert others == [True] * len(others)
    report = regression.report(list(result.values()))
    label = f"1.5b v{key[0]} {key[1]}"
    assert (f"- {label}:" in report) is (not met)


def test_a_stopped_upstream_prefill_counts_by_its_bound():
    stopped = {"upstream_prefill_tps": None, "prefill_speedup": None}
    result = _by_name(regression.check(_run({("7", "cpu bf16"): {**stopped, "prefill_speedup_above": 53.4}})))
    assert result["prefill vs upstream"].rows["1.5b v7 cpu bf16"] == (
        53.4, 1.0, "lower bound: upstream stopped in its prefill")
    assert result["prefill vs upstream"].met
    result = _by_name(regression.check(_run({("7", "cpu bf16"): {**stopped, "prefill_speedup_above": 0.9}})))
    assert not result["prefill vs upstream"].met  # a bound below 1 proves nothing


def test_the_moment_share_is_shown_but_not_counted():
    result = _by_name(regression.check(_run({("4", "cpu fp32i8"): {"pct_of_decode_moment_bandwidth": 70.0}})))
    assert result["moment bandwidth share"].met is False
    assert not result["moment bandwidth share"].counted
    assert "6 of 6 checks passed" in regression.report(list(result.values()))


def test_only_the_given_size_and_final_records_count():
    rows = _run() + [_row("6", "cpu fp32i8", size="0.1b", pct_of_bandwidth=10.0)]
    assert all(t.met for t in regression.check(rows) if t.counted)
    assert not regression.check(rows, size="0.1b")[0].met
    lines = ["not json", "{broken", json.dumps({**_row("4", "cpu fp32"), "kind": "model (progress)"}),
             json.dumps(_row("4", "cpu fp32"))]
    assert regression.model_rows(lines) == [_row("4", "cpu fp32")]


def test_several_logs_give_a_summary(tmp_path, capsys):
    good, bad = tmp_path / "good.log", tmp_path / "bad.log"
    good.write_text("header text\n" + "\n".join(json.dumps(r) for r in _run()) + "\n")
    slow = {("6", "cpu fp32i8"): {"ours_decode_ms": 50.0}}  # 3.2x fp32
    bad.write_text("\n".join(json.dumps(r) for r in _run(slow)) + "\n")
    assert regression.main([str(good)]) == 0
    capsys.readouterr()
    assert regression.main([str(good), str(bad)]) == 3  # a check failed in one run
    out = capsys.readouterr().out
    assert "| int8 decode / our fp32 decode >= 3.5 | 1 of 2 | 4 (1.5b v4 cpu fp32i8); 3.2 (1.5b v6 cpu fp32i8) |" in out
    assert "- 1.5b v6 cpu fp32i8: 3.2, needs 3.5 (int8 / fp32 decode)" in out
    empty = tmp_path / "empty.log"
    empty.write_text("no rows\n")
    assert regression.main([str(empty)]) == 1
    assert "no bench_model.py rows" in capsys.readouterr().err


def test_the_bounds_are_options(tmp_path, capsys):
    log = tmp_path / "run.log"
    slow = {("6", "cpu fp32i8"): {"ours_decode_ms": 50.0}}  # 3.2x fp32
    log.write_text("\n".join(json.dumps(r) for r in _run(slow)) + "\n")
    assert regression.main([str(log)]) == 3
    assert "- 1.5b v6 cpu fp32i8: 3.2, needs 3.5" in capsys.readouterr().out
    assert regression.main([str(log), "--min-int8-over-fp32", "3.0"]) == 0
    out = capsys.readouterr().out
    assert "| int8 decode / our fp32 decode >= 3 |" in out and "6 of 6 checks passed" in out
    bounds = regression.Bounds(bandwidth_share=95.0)
    result = _by_name(regression.check(_run(), bounds=bounds))
    assert result["bandwidth share"].met is False  # the rows read at 90%
