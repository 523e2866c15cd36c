"""The step timeline (views/timeline.py) and what it draws from (analysis/timeline.py), on
hand-built traces: real ranks picked by step time, collectives split into waiting and service,
and no two bars of one row overlapping in time (the overdraw that hid queued buckets and ZeRO-3's
all-gathers)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncviz.dashboard.figures.timeline import lateness_figure
from syncviz import analysis as A
from syncviz.trace import load_run, new_meta, write_run
from syncviz.trace import schema as S
from syncviz.views.timeline import step_origin, timeline_figure
from tracebuild import MS, columns, ev, make_ddp_run


def test_representative_ranks_are_real_ranks_by_step_time(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "r", world=5, straggler=3, straggle_ms=4))
    steps = A.step_metrics(run)
    one = steps[steps["step"] == 1]
    # ranks 0,1,2,4 take 45 ms, rank 3 49 ms: fastest 0 (lowest on ties), lower median 2, slowest 3
    assert A.representative_ranks(one) == [(0, ["fastest step"]), (2, ["median step"]), (3, ["slowest step"])]
    late = A.launch_lateness(run.events[run.events["step"] == 1])
    assert A.latest_launcher(late) == 3                       # launched bucket 1 4 ms after the others
    assert A.representative_ranks(one, late)[-1] == (3, ["slowest step", "launches last"])
    two = A.representative_ranks(one[one["rank"].isin([0, 3])])
    assert two == [(0, ["fastest step", "median step"]), (3, ["slowest step"])]   # a rank is listed once
    assert A.representative_ranks(steps.iloc[:0]) == [] and A.latest_launcher(late.iloc[:0]) is None


def test_the_rank_that_launches_last_from_the_lateness_map():
    """latest_in_matrix (from the rank × step map the summary keeps) gives latest_launcher's rank on
    each step's own rows: the largest mean, the lowest rank of equals, none when no mean is above 0
    or the step has no rows; ranks without rows in a step are not candidates."""
    late = pd.DataFrame({"rank": [0, 0, 1, 1, 2, 0, 1, 2, 0, 1, 3],
                         "step": [1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4],
                         "late_ns": [0, 6, 2, 4, 1, 5, 5, 1, 0, 0, -2]})
    matrix = A.lateness_matrix(late)
    for step in (1, 2, 3, 4, 9):
        rows = late[late["step"] == step]
        assert A.latest_in_matrix(matrix, step) == A.latest_launcher(rows), step
    assert [A.latest_in_matrix(matrix, s) for s in (1, 2, 3, 4, 9)] == [0, 0, None, None, None]
    one = pd.DataFrame({"rank": [0, 1, 2], "step_ns": [3, 2, 1]})
    assert A.representative_ranks(one, latest=1) == A.representative_ranks(one, late[late["step"] == 1].assign(
        late_ns=lambda t: np.where(t["rank"] == 1, 9, 0)))


def test_waiting_and_service_split(tmp_path):
    """Rank 1 launches bucket 1 3 ms late (33 vs 30): rank 0's bucket 1 [30, 40] waited 3 ms for
    it and was served 7 ms; bucket 0 [16, 26] was served from its start."""
    run = load_run(make_ddp_run(tmp_path / "s", straggler=1, straggle_ms=3))
    comm = A.comm_metrics(run, kinds=S.COMM_KINDS)
    parts = A.collective_parts(comm)
    r0 = comm.join(parts)[(comm["rank"] == 0) & (comm["step"] == 1)].set_index("bucket")
    assert r0.loc[1, "wait_ns"] == 3 * MS and r0.loc[1, "service_ns"] == 7 * MS
    assert r0.loc[0, "wait_ns"] == 0 and r0.loc[0, "service_ns"] == 10 * MS
    assert (parts["lane"] == 0).all()            # one bucket at a time on each rank


def zero3_like_run(path):
    """One rank, one step: backward all-gathers issued while a reduce-scatter is in flight."""
    evs = [ev("step", 0, 60), ev("forward", 0, 20), ev("backward", 20, 50), ev("optimizer", 50, 60),
           ev("collective", 1, 5, op="all_gather", nbytes=1_000_000),
           ev("collective", 22, 40, op="reduce_scatter", nbytes=2_000_000),
           ev("collective", 25, 30, op="all_gather", nbytes=1_000_000),     # under the reduce-scatter
           ev("collective", 28, 35, op="all_gather", nbytes=1_000_000),     # and under the one before
           ev("collective", 41, 52, op="reduce_scatter", nbytes=2_000_000)]
    for e in evs:
        e["group_size"] = 1
    meta = new_meta(path.name, 1, strategy="zero3", backend="gloo", device="cpu")
    return write_run(path, meta, {0: [columns(evs)]})


def bars_by_row(fig) -> dict:
    """(start, end) of every primary bar per row: the hollow whole span of collectives and the
    compute bars (role "bar"); service parts sit inside their own collective's bar. In SVG a
    collective's whole span is drawn by a layout shape and held by its hover points' customdata
    (start [2], end [3]); test_hollow_spans_are_one_path_an_op checks that the two agree."""
    rows: dict[float, list] = {}
    for t in fig["data"]:
        if t.get("meta", {}).get("role") != "bar":
            continue
        if t["type"] == "bar":
            spans = [(float(b), float(b) + float(x)) for b, x in zip(t["base"], t["x"])]
        else:
            spans = [(float(c[2]), float(c[3])) for c in t["customdata"]]
        for y, (a, b) in zip(t["y"], spans):
            rows.setdefault(float(y), []).append((a, b, t["name"]))
    return rows


def shape_spans(shape) -> list[tuple[float, float, float]]:
    """(row, start, end) of each bar of a layout shape drawn by views.timeline_marks.rect_path."""
    import re
    from syncviz.views.timeline import BAND
    out = []
    for a, y0, b, y1, a2 in re.findall(r"M([^,]+),([^H]+)H([^V]+)V([^H]+)H([^Z]+)Z", shape["path"]):
        assert a == a2 and np.isclose(float(y1) - float(y0), BAND), shape["path"][:200]
        out.append(((float(y0) + float(y1)) / 2, float(a), float(b)))
    return out


def assert_no_overlap(fig):
    for y, bars in bars_by_row(fig).items():
        bars.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(bars, bars[1:]):
            assert s1 >= e0 - 1e-9, f"row {fig['layout']['meta']['rows'][int(y)]}: {n0} [{s0}, {e0}] and {n1} [{s1}, {e1}] overlap"


def test_zero3_all_gathers_get_their_own_rows(tmp_path):
    run = load_run(zero3_like_run(tmp_path / "z"))
    ev_ = run.events
    comp, comm, exp = A.compute_intervals(ev_), A.comm_metrics(ev_, kinds=S.COMM_KINDS), A.exposed_intervals(ev_)
    fig = timeline_figure(comp, comm, exp, ranks=[0], t0=step_origin(comp, comm))
    assert_no_overlap(fig)
    rows = fig["layout"]["meta"]["rows"]
    assert rows == ["rank 0 · compute", "rank 0 · comm", "rank 0 · comm 2", "rank 0 · comm 3"]
    ag = next(t for t in fig["data"] if t["name"] == "all_gather waiting (hollow)" and t["meta"]["role"] == "bar")
    assert len(ag["y"]) == 3 and len(set(np.asarray(ag["y"])[1:].tolist())) == 2   # the two backward AGs apart
    # hover: start, end and duration, not "start + end"
    c = ag["customdata"][1]
    assert "start %{customdata[2]:.3f} ms · end %{customdata[3]:.3f} ms · duration %{customdata[4]:.3f}" in ag["hovertemplate"]
    assert (c[2], c[3], c[4]) == (25.0, 30.0, 5.0) and c[1] == "1.00 MB"


def test_hollow_spans_are_one_path_an_op(tmp_path):
    """In SVG each op's hollow whole spans are one layout shape (a path), the gradient-ready marks
    another, and the spans the path draws are exactly those its hover points carry; a legend entry
    per op (a bar trace with no bar) shares their legendgroup (Plotly toggles a group as one). On a
    DDP run with a straggler: waiting spans and gradient-ready times on both ranks."""
    run = load_run(make_ddp_run(tmp_path / "h", straggler=1, straggle_ms=3))
    ev_ = run.events[run.events["step"] == 1]
    comp, comm, exp = A.compute_intervals(ev_), A.comm_metrics(ev_, kinds=S.COMM_KINDS), A.exposed_intervals(ev_)
    fig = timeline_figure(comp, comm, exp, ranks=[0, 1], t0=step_origin(comp, comm))
    shapes = fig["layout"]["shapes"]
    hollow = [sh for sh in shapes if sh["name"].endswith("(hollow)")]
    assert [sh["name"] for sh in hollow] == ["all_reduce waiting (hollow)"] and hollow[0]["layer"] == "between"
    spans = next(t for t in fig["data"] if t["meta"]["role"] == "bar" and t["type"] == "scatter")
    assert spans["mode"] == "none" and spans["legendgroup"] == hollow[0]["legendgroup"]
    held = sorted((float(y), float(c[2]), float(c[3])) for y, c in zip(spans["y"], spans["customdata"]))
    assert sorted(shape_spans(hollow[0])) == held and len(held) == 4          # 2 ranks × 2 buckets, exact
    assert any(c[5] != "0.000 ms" for c in spans["customdata"]), "the straggler makes rank 0 wait"
    legend = [t for t in fig["data"] if t["meta"]["role"] == "legend"]
    assert [(t["name"], t["type"], t["legendgroup"]) for t in legend] == [("all_reduce waiting (hollow)", "bar", hollow[0]["name"])]
    assert "showlegend" not in hollow[0] or not hollow[0]["showlegend"]
    # outlined in 1 px, which the browser draws as hairlines (views/timeline.py OUTLINE: at 1.5 px
    # rasterizing a 1,024-rank ZeRO-3 step's timeline took 2.4 times as long), the legend alike
    assert hollow[0]["line"]["width"] == legend[0]["marker"]["line"]["width"] == 1.0
    ticks = [sh for sh in shapes if sh["name"] == "gradients ready"]
    ready = comm.loc[(comm["rank"].isin([0, 1])) & (comm["ready_ns"] >= 0)]
    assert len(ticks) == 1 and ticks[0]["path"].count("M") == len(ready) > 0
    assert not [t for t in fig["data"] if t["type"] == "scatter" and t.get("mode") == "markers"]    # no marker per point


@pytest.mark.parametrize("x_range,paths", [(None, False), (1e9, False), (None, True)])
def test_every_span_is_hovered_just_inside_both_ends(tmp_path, monkeypatch, x_range, paths):
    """Each collective's hover points (SVG) lie inside its own span, and two of them lie within
    LABEL_MIN_SPAN × HOVER_EDGE of the axis inside its start and its end, so a cursor anywhere inside is
    nearer one of its own points than a neighbour's (the browser check: test_dashboard_browser's
    test_replay_hover_names_the_bar_under_the_cursor). With service parts wide enough to be bar traces
    (no x_range), narrow ones in a path (x_range 1e9 ms), and every bar in a path (``paths``: above
    PATH_BARS), where compute and exposed bars are held the same way. Between its ends no two of a
    span's points are farther apart than 1.5 LABEL_MIN_SPAN of the axis (half a waiting part's
    spacing and a narrow service part): a cursor is then within ~13 px of one on a 1,175 px plot,
    inside Plotly's hover distance (20 px)."""
    from syncviz.views import timeline as VT
    if paths:
        monkeypatch.setattr(VT, "PATH_BARS", 0)
    run = load_run(make_ddp_run(tmp_path / "e", straggler=1, straggle_ms=3))
    ev_ = run.events[run.events["step"] == 1]
    comp, comm, exp = A.compute_intervals(ev_), A.comm_metrics(ev_, kinds=S.COMM_KINDS), A.exposed_intervals(ev_)
    fig = timeline_figure(comp, comm, exp, ranks=[0, 1], t0=step_origin(comp, comm), x_range=x_range)
    points: dict = {}
    for t in fig["data"]:
        if t["type"] == "scatter" and t["meta"]["role"] in ("bar", "hover", "service", "exposed"):
            at = (1, 2) if "forward" in t["name"] or "backward" in t["name"] or "optimizer" in t["name"] else \
                 (0, 1) if "exposed" in t["name"] else (2, 3)
            for x, y, c in zip(t["x"], t["y"], t["customdata"]):
                points.setdefault((t["name"].split(" ")[0], float(y), float(c[at[0]]), float(c[at[1]])), []).append(float(x))
    held = {k[0] for k in points}
    assert sum(k[0] == "all_reduce" for k in points) == 4                       # 2 ranks × 2 buckets
    assert held == ({"all_reduce", "forward", "backward", "optimizer", "exposed"} if paths else {"all_reduce"})
    span = x_range or VT._span_ms(comp[comp["rank"].isin([0, 1])], comm[comm["rank"].isin([0, 1])])
    eps, every = VT.LABEL_MIN_SPAN * span * VT.HOVER_EDGE, VT.LABEL_MIN_SPAN * span
    for (_, _, start, end), xs in points.items():
        xs = sorted(xs)
        assert start <= xs[0] <= start + eps * 1.000001 and end - eps * 1.000001 <= xs[-1] <= end, (start, end, xs)
        assert max(np.diff(xs), default=0.0) <= 1.5 * every * 1.000001, (start, end, xs)


def test_old_single_row_layout_would_overlap(tmp_path):
    """The check above can fail: the same bars on one row per rank (as drawn before) overlap."""
    run = load_run(zero3_like_run(tmp_path / "z"))
    comm = A.comm_metrics(run.events, kinds=S.COMM_KINDS)
    s, e = comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy()
    order = np.argsort(s)
    assert (s[order][1:] < np.maximum.accumulate(e[order])[:-1]).any()
    assert A.lanes(s, e).max() == 2


def test_exposed_is_marked_on_the_compute_row(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "d"))
    ev_ = run.events[run.events["step"] == 1]
    comp, comm, exp = A.compute_intervals(ev_), A.comm_metrics(ev_, kinds=S.COMM_KINDS), A.exposed_intervals(ev_)
    fig = timeline_figure(comp, comm, exp, ranks=[0, 1], labels={1: "rank 1 · slowest"}, t0=step_origin(comp, comm))
    assert_no_overlap(fig)
    ex = next(t for t in fig["data"] if t["meta"]["role"] == "exposed")
    rows = fig["layout"]["meta"]["rows"]
    assert [rows[int(y)] for y in ex["y"]] == ["rank 0 · compute", "rank 1 · slowest · compute"]
    assert np.allclose(ex["base"], [30.0, 30.0]) and np.allclose(ex["x"], [10.0, 10.0])   # bucket 1 after backward
    assert all("−" not in t and not t.lstrip("-").replace(".", "").isdigit() for t in fig["layout"]["yaxis"]["ticktext"])


def test_bucket_map_hover_gives_each_parameters_own_size(tmp_path):
    """A stacked bar with a base hovers %{y} as its top (base + size): the hover must read the
    parameter's own size from customdata (a 0.59 MB parameter showed as 5.12 MB)."""
    from syncviz.dashboard.figures.charts import bucket_map_figure
    run = load_run(make_ddp_run(tmp_path / "b"))
    fig = bucket_map_figure(A.bucket_map(run.layouts))
    t = fig["data"][0]
    assert "%{y" not in t["hovertemplate"] and "%{customdata[5]:.2f} MB" in t["hovertemplate"]
    sizes = [round(c[5], 6) for c in t["customdata"]]
    assert sorted(sizes) == [2.0, 4.0]          # fc1.weight 500k floats, fc2.weight 1M floats, in MB
    assert np.allclose(sorted(t["y"]), [2.0, 4.0])


def zero3_ranks_run(path, late_rank=2, late_ms=3.0, world=3, steps=2):
    """ZeRO-3-like steps on ``world`` ranks (no buckets): per step two all-gathers, a
    reduce-scatter, a third all-gather; ``late_rank`` launches every collective ``late_ms`` late."""
    per_rank = {}
    for r in range(world):
        d = late_ms if r == late_rank else 0.0
        evs = []
        for s in range(steps):
            t = 100.0 * s
            evs += [ev("step", t, t + 60, step=s), ev("forward", t, t + 20, step=s), ev("backward", t + 20, t + 50, step=s),
                    ev("collective", t + 1 + d, t + 6 + d, step=s, op="all_gather", nbytes=1000),
                    ev("collective", t + 8 + d, t + 12 + d, step=s, op="all_gather", nbytes=1000),
                    ev("collective", t + 22 + d, t + 40 + d, step=s, op="reduce_scatter", nbytes=2000),
                    ev("collective", t + 25 + d, t + 30 + d, step=s, op="all_gather", nbytes=1000)]
        for e in evs:
            e["group_size"] = world
        per_rank[r] = [columns(evs)]
    meta = new_meta(path.name, world, strategy="zero3", backend="gloo", device="cpu")
    return write_run(path, meta, per_rank)


def test_sync_lateness_without_buckets_matches_collectives_across_ranks(tmp_path):
    """A step without gradient buckets (ZeRO-3) gets lateness per collective: the n-th all-gather of
    each rank meets the n-th of the others, the late rank is late by exactly its delay on every
    one, and it is the straggler the replay labels. A step alone gives the same rows."""
    run = load_run(zero3_ranks_run(tmp_path / "z3"))
    assert not len(A.launch_lateness(run))           # no buckets: the bucket-only table is empty
    late = A.sync_lateness(run)
    assert len(late) == 3 * 2 * 4
    assert sorted(late["label"].unique()) == ["all_gather #0", "all_gather #1", "all_gather #3", "reduce_scatter #2"]
    by_rank = late.groupby("rank")["late_ns"]
    assert by_rank.min()[2] == by_rank.max()[2] == 3_000_000 and by_rank.max()[0] == by_rank.max()[1] == 0
    steps = A.step_metrics(run)
    assert A.latest_launcher(late) == 2
    assert any("launches last" in roles and r == 2 for r, roles in A.representative_ranks(steps, late))
    alone = A.sync_lateness(run.events[run.events["step"] == 1]).reset_index(drop=True)
    pd.testing.assert_frame_equal(alone, late[late["step"] == 1].reset_index(drop=True))
    fig = lateness_figure(late[late["step"] == 1], "per rank and {what}")
    assert fig["layout"]["title"]["text"] == "per rank and collective"
    assert fig["data"][0]["x"] == ["all_gather #0", "all_gather #1", "reduce_scatter #2", "all_gather #3"]
    assert fig["layout"]["xaxis"]["type"] == "category" and "%{x}" in fig["data"][0]["hovertemplate"]
    # many collectives: the axis numbers every k-th column (the names stay in the hover)
    many = pd.DataFrame({"rank": np.repeat([0, 1], 243), "step": 1, "micro": 0, "bucket": np.tile(np.arange(243), 2),
                         "late_ns": 1_000_000, "label": np.tile([f"all_gather #{i}" for i in range(243)], 2)})
    axis = lateness_figure(many)["layout"]["xaxis"]
    assert axis["tickvals"][:2] == ["all_gather #0", "all_gather #20"] and axis["ticktext"][:3] == ["0", "20", "40"]
    assert len(axis["ticktext"]) == 13
    assert fig["data"][0]["z"][2].tolist() == [3.0, 3.0, 3.0, 3.0]
    # to the µs (the JSON a step change sends): 1,234,567 ns late is 1.235 ms
    odd = lateness_figure(many.assign(late_ns=np.where(many["bucket"] == 5, 1_234_567, 1_000_000)))["data"][0]["z"]
    assert odd[0][5] == odd[1][5] == 1.235 and odd[0][4] == 1.0


def test_sync_lateness_is_launch_lateness_on_ddp(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "ddp", steps=3, world=3, straggler=1, straggle_ms=2.0))
    pd.testing.assert_frame_equal(A.sync_lateness(run).drop(columns="label"), A.launch_lateness(run))


def test_many_bars_are_drawn_as_paths_and_many_rows_with_webgl(tmp_path, monkeypatch):
    """Above PATH_BARS bars (a ZeRO-3 step of four ranks has ~3,200) every bar is in a path, one per
    op and kind (layout shapes), with a hover point just inside each bar's start (role "bar", or
    "exposed") and more (role "hover"); no bar trace is left but the legend's. Above GL_ROWS rows
    the timeline is WebGL segments with a hover point per bar. The same rows every way."""
    from syncviz.views import timeline as VT
    run = load_run(make_ddp_run(tmp_path / "d", straggler=1, straggle_ms=3))
    ev_ = run.events[run.events["step"] == 1]
    comp, comm, exp = A.compute_intervals(ev_), A.comm_metrics(ev_, kinds=S.COMM_KINDS), A.exposed_intervals(ev_)
    args = dict(ranks=[0, 1], t0=step_origin(comp, comm))
    n_coll = len(VT.comm_bars(comm))
    n_bars = len(comp) + len(exp) + 2 * n_coll          # what PATH_BARS counts: a collective is two bars
    assert len(exp) and n_bars <= VT.PATH_BARS
    svg = timeline_figure(comp, comm, exp, **args)
    assert any(t["type"] == "bar" and len(t["x"]) > 1 for t in svg["data"])
    monkeypatch.setattr(VT, "PATH_BARS", n_bars - 1)
    paths = timeline_figure(comp, comm, exp, **args)
    assert {t["type"] for t in paths["data"]} == {"bar", "scatter"}
    assert all(t["meta"]["role"] == "legend" and t["x"] == [None] for t in paths["data"] if t["type"] == "bar")
    drawn = {}
    for sh in paths["layout"]["shapes"]:
        drawn[sh["name"]] = drawn.get(sh["name"], 0) + sh["path"].count("Z")
    assert drawn["exposed comm (no compute)"] == len(exp)
    assert sum(drawn[k] for k in ("forward", "backward compute", "optimizer") if k in drawn) == len(comp)
    assert drawn["all_reduce waiting (hollow)"] == drawn["all_reduce"] == n_coll
    first = {r: sum(len(t["x"]) for t in paths["data"] if t["meta"]["role"] == r) for r in ("bar", "exposed")}
    assert first == {"bar": len(comp) + n_coll, "exposed": len(exp)}
    assert paths["layout"]["meta"]["rows"] == svg["layout"]["meta"]["rows"]
    monkeypatch.setattr(VT, "PATH_BARS", n_bars)
    assert any(t["type"] == "bar" and len(t["x"]) > 1 for t in timeline_figure(comp, comm, exp, **args)["data"])
    monkeypatch.setattr(VT, "GL_ROWS", len(svg["layout"]["meta"]["rows"]) - 1)
    gl = timeline_figure(comp, comm, exp, **args)
    assert {t["type"] for t in gl["data"]} == {"scattergl"} and "shapes" not in gl["layout"]
    assert gl["layout"]["meta"]["rows"] == svg["layout"]["meta"]["rows"]
    hover = [t for t in gl["data"] if t["meta"]["role"] == "hover"]
    assert sum(len(t["x"]) for t in hover) == len(comp) + n_coll      # one per compute bar and collective


def test_lateness_of_many_ranks_is_binned_with_the_latest_of_each_row():
    """Above MAX_HEAT_ROWS ranks a heatmap row holds k ranks (named "first–last") and their latest
    launch: the straggler stays the hot row, in the row that holds it; fewer ranks keep a row each."""
    from syncviz.dashboard.figures.timeline import MAX_HEAT_ROWS

    def late(n, slow):
        f = pd.DataFrame({"rank": np.repeat(np.arange(n), 3), "step": 1, "micro": 0, "bucket": np.tile([0, 1, 2], n),
                          "late_ns": np.tile([0, 250_000, 500_000], n)})
        f.loc[f["rank"] == slow, "late_ns"] += 5_000_000
        return f
    fig = lateness_figure(late(1024, 517), "lateness")
    tr = fig["data"][0]
    assert len(tr["y"]) == 256 and tr["y"][:2] == ["0–3", "4–7"] and tr["y"][-1] == "1020–1023"
    hot = np.argwhere(tr["z"] >= 5.0)
    assert hot[:, 0].tolist() == [129, 129, 129] and tr["y"][129] == "516–519"
    assert tr["z"][129].tolist() == [5.0, 5.25, 5.5] and tr["z"][0].tolist() == [0.0, 0.25, 0.5]
    assert "a row per 4 ranks" in fig["layout"]["title"]["text"] and tr["hovertemplate"].startswith("ranks %{y}")
    axis = fig["layout"]["yaxis"]
    assert axis["type"] == "category" and axis["title"]["text"] == "ranks, 4 a row"
    # every 20th row labelled (13 of 256): Plotly lays out every label it draws on every redraw
    assert axis["tickvals"] == tr["y"][::20] == axis["ticktext"] and axis["tickvals"][:2] == ["0–3", "80–83"]
    # an odd count: the last row holds what is left
    assert lateness_figure(late(MAX_HEAT_ROWS + 1, 0))["data"][0]["y"][-1] == f"{MAX_HEAT_ROWS}–{MAX_HEAT_ROWS}"
    few = lateness_figure(late(MAX_HEAT_ROWS, 7))["data"][0]          # a row a rank: as before
    assert len(few["y"]) == MAX_HEAT_ROWS and few["z"][7].max() == 5.5 and few["hovertemplate"].startswith("rank %{y}")


def test_many_collectives_of_few_ranks_keep_the_narrow_rank_margin():
    """A ZeRO-3 step of 2 ranks and 60 collectives: every 5th collective is labelled on x, and the
    rows are still one a rank, so the left margin stays the 70 px of rank numbers (the x labels'
    stride once reused the name of ranks-a-row, and widened it to the 100 px of "512–515")."""
    n = 60
    f = pd.DataFrame({"rank": np.repeat([0, 1], n), "step": 1, "micro": 0, "bucket": np.tile(np.arange(n), 2),
                      "late_ns": np.tile(np.arange(n) * 1000, 2), "label": np.tile([f"all_gather #{i}" for i in range(n)], 2)})
    fig = lateness_figure(f, "lateness of {what}")
    x = fig["layout"]["xaxis"]
    assert x["type"] == "category" and x["ticktext"] == [str(b) for b in range(0, n, 5)]
    assert fig["layout"]["margin"]["l"] == 70 and fig["data"][0]["hovertemplate"].startswith("rank %{y}")
    binned = lateness_figure(f.assign(rank=f["rank"] * 1000).pipe(
        lambda g: pd.concat([g.assign(rank=g["rank"] + i) for i in range(300)])), "lateness of {what}")
    assert binned["layout"]["margin"]["l"] == 100        # "0–3"-style row names


def test_ratios_rank_step_map_of_many_ranks_is_binned_with_the_latest_of_each_row():
    """The Ratios page's rank × step map (analysis.lateness_matrix) bins ranks as the Replay's heatmap:
    above MAX_HEAT_ROWS ranks a row holds k ranks and, per step, the latest of them (a rank with no
    value in a step is skipped, not a gap); to the µs, gaps where no rank of the row has a value."""
    from syncviz.dashboard.figures.charts import skew_heatmap_figure
    from syncviz.dashboard.figures.timeline import MAX_HEAT_ROWS

    def matrix(n, slow):
        m = pd.DataFrame(np.tile([0.0, 250_000.4, 500_000.0], (n, 1)), index=pd.Index(np.arange(n), name="rank"),
                         columns=pd.Index([3, 4, 5], name="step"))
        m.loc[slow] += 5_000_000
        return m
    table = matrix(1024, 517)
    table.loc[516, 4] = np.nan                              # a rank without a value in one step
    table.loc[[1020, 1021, 1022, 1023], 5] = np.nan         # no rank of the last row in step 5
    fig = skew_heatmap_figure(table)
    tr = fig["data"][0]
    assert len(tr["y"]) == 256 and tr["y"][:2] == ["0–3", "4–7"] and tr["y"][-1] == "1020–1023"
    assert np.argwhere(tr["z"] >= 5.0)[:, 0].tolist() == [129, 129, 129] and tr["y"][129] == "516–519"
    assert tr["z"][129].tolist() == [5.0, 5.25, 5.5] and tr["z"][0].tolist() == [0.0, 0.25, 0.5]
    assert np.isnan(tr["z"][255, 2]) and tr["z"][255, :2].tolist() == [0.0, 0.25]
    assert "a row per 4 ranks" in fig["layout"]["title"]["text"] and tr["hovertemplate"].startswith("ranks %{y}")
    assert fig["layout"]["yaxis"]["type"] == "category" and tr["x"] == [3, 4, 5]
    assert fig["layout"]["yaxis"]["tickvals"] == tr["y"][::20]        # labelled as the Replay's heatmap
    assert skew_heatmap_figure(matrix(MAX_HEAT_ROWS + 1, 0))["data"][0]["y"][-1] == f"{MAX_HEAT_ROWS}–{MAX_HEAT_ROWS}"
    few = skew_heatmap_figure(matrix(MAX_HEAT_ROWS, 7))["data"][0]     # a row a rank: as before
    assert few["y"] == list(range(MAX_HEAT_ROWS)) and few["z"][7].max() == 5.5
    assert few["hovertemplate"].startswith("rank %{y}")


def test_heatmaps_do_not_measure_their_tick_labels_for_overflow():
    """Both lateness heatmaps (the Replay's, the Ratios page's) ask for ticklabeloverflow "allow" on
    both axes and the colour bar: Plotly's default on a linear axis and a colour bar ("hide past
    div") measures every label once for each label drawn, on every redraw (LABELS_UNMEASURED)."""
    from syncviz.dashboard.figures.charts import skew_heatmap_figure
    late = pd.DataFrame({"rank": np.repeat(np.arange(64), 3), "step": 1, "micro": 0, "bucket": np.tile([0, 1, 2], 64),
                         "late_ns": np.tile([0, 250_000, 500_000], 64)})
    matrix = pd.DataFrame(np.tile([0.0, 1e5], (64, 1)), index=pd.Index(np.arange(64), name="rank"),
                          columns=pd.Index([3, 4], name="step"))
    for fig in (lateness_figure(late, "lateness"), skew_heatmap_figure(matrix)):
        for where in (fig["layout"]["xaxis"], fig["layout"]["yaxis"], fig["data"][0]["colorbar"]):
            assert where["ticklabeloverflow"] == "allow"
    a, b = lateness_figure(late)["data"][0]["colorbar"], lateness_figure(late)["data"][0]["colorbar"]
    assert a == b and a is not b and a["title"] is not b["title"]        # each figure its own


def test_bucket_labels_only_where_they_fit(tmp_path):
    """A bucket's service part is a labelled bar ("b1") only where it spans LABEL_MIN_SPAN of the
    time axis: Plotly shrinks a label into any bar, unreadable on a narrow one, and the labels cost
    most of a redraw of a DDP step of many buckets. Narrower service parts are drawn in their op's
    path (a layout shape) and hovered at their middle, with the same customdata."""
    from syncviz.views import timeline as VT
    run = load_run(make_ddp_run(tmp_path / "l", straggler=1, straggle_ms=3))
    ev_ = run.events[run.events["step"] == 1]
    comp, comm, exp = A.compute_intervals(ev_), A.comm_metrics(ev_, kinds=S.COMM_KINDS), A.exposed_intervals(ev_)
    args = dict(ranks=[0, 1], t0=step_origin(comp, comm))

    def service(fig):
        return [t for t in fig["data"] if t["meta"]["role"] == "service"]

    def labels(fig):
        return [t for tr in service(fig) if tr["type"] == "bar" for t in tr["text"]]

    def service_ms(fig):
        return [w for tr in service(fig) if tr["type"] == "bar" for w in tr["x"]]

    def in_path(fig):
        """(row, start, end) of the service parts drawn in a path, and of their hover points."""
        drawn = sorted(v for sh in fig["layout"]["shapes"] if sh["name"] == "all_reduce" for v in shape_spans(sh))
        points = [t for t in service(fig) if t["type"] == "scatter"]
        held = sorted((float(y), float(c[3]) - float(c[6].split()[0]), float(c[3])) for t in points
                      for y, c in zip(t["y"], t["customdata"]))
        assert np.allclose(drawn, held) and all(t["mode"] == "none" for t in points)
        return drawn

    fig = timeline_figure(comp, comm, exp, **args)
    assert labels(fig) == ["b0", "b1", "b0", "b1"] and not in_path(fig)      # 10 and 7 ms service bars of a ~45 ms step
    narrow = min(service_ms(fig))
    assert labels(timeline_figure(comp, comm, exp, x_range=narrow / VT.LABEL_MIN_SPAN, **args)) == ["b0", "b1"] * 2
    wide = timeline_figure(comp, comm, exp, x_range=narrow / VT.LABEL_MIN_SPAN * 1.01, **args)
    # every service part lasts 10 ms but rank 0's bucket 1 (7 ms: it waited 3 ms for rank 1, the
    # straggler): that one goes into the path, the others stay labelled bars
    assert sorted(labels(wide)) == ["b0", "b0", "b1"] and service_ms(wide) == [10.0] * 3
    assert [round(e - s, 6) for _, s, e in in_path(wide)] == [7.0]
    everything = timeline_figure(comp, comm, exp, x_range=1e9, **args)
    assert labels(everything) == [] and len(in_path(everything)) == 4
    # the op's legend entry stays (a bar trace with no bar), and toggles the path with it
    legend = [t for t in everything["data"] if t["meta"]["role"] == "legend" and t["name"] == "all_reduce"]
    assert len(legend) == 1 and legend[0]["legendgroup"] == "all_reduce"
