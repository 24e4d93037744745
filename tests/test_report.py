"""`privret report`: contents of the page and Markdown, privacy of the defaults, and a real headless Chromium
render (the plot is visible in a screenshot; the page makes no network request)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import run_cli
from privret.privacy.ledger import PrivacyLedger
from privret.report import build_report, collect

PRIVATE_QUERY = "zebra vitamin secret question"
DOCS = [("d1", "Aspirin", "aspirin can reduce the risk of heart disease in adults"),
        ("d2", "Memory", "mice with the gene show low memory in the brain"),
        ("d3", "Vitamin", "vitamin levels in blood are high in children with a good diet"),
        ("d4", "Sleep", "sleep and exercise increase the immune response to a virus")]
# the plot's line colours (matplotlib tab:blue, tab:red); nothing else on the page uses them
PLOT_COLOURS = [(31, 119, 180), (214, 39, 40)]


def _ledger(epsilon: float, mechanism: str, unit: str = "query") -> PrivacyLedger:
    private = math.isfinite(epsilon)
    return PrivacyLedger(mechanism=mechanism if private else "none", epsilon=epsilon, delta=1e-3 if private else 0.0,
                         noise_multiplier=0.9 if private else 0.0, sample_rate=0.08, steps=120, planned_steps=120,
                         accountant="prv" if private else "none", unit=unit, n_units=800, n_pairs=900,
                         clip_norm=1.0 if private else math.inf, model="smollm2-135m", trainable="lora:top8",
                         data_hash="ab" * 32)


def _metrics(path: Path, ndcg: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"ndcg@10": ndcg, "recall@10": ndcg + 0.1, "recall@100": ndcg + 0.2,
                                "mrr@10": ndcg - 0.02, "queries": 300}))


def _per_query(path: Path, ndcg: list[float]) -> None:
    """``per_query.json`` as the pipeline writes it, for queries t1, t2, ..."""
    path.write_text(json.dumps({f"t{i + 1}": {"ndcg@10": v, "recall@10": v} for i, v in enumerate(ndcg)}))


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_fake_run(root: Path) -> Path:
    """A run directory in the pipeline's layout with every optional file the report understands."""
    private = root / "private"
    _jsonl(private / "corpus.jsonl", [{"_id": i, "title": t, "text": x} for i, t, x in DOCS])
    _jsonl(private / "queries.jsonl", [{"_id": "q1", "text": PRIVATE_QUERY}, {"_id": "q2", "text": "gene memory"}])
    (private / "qrels").mkdir()
    (private / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    run = root / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"name": "fake-scifact", "dataset": str(private),
                                                 "train_split": "train", "eval_split": "test", "unit": "query"}))
    _metrics(run / "zero_shot" / "metrics.json", 0.40)
    _metrics(run / "original" / "metrics.json", 0.62)
    # per-query NDCG@10 whose means are the metrics' (eps-3 and the direct rows have none: an older run)
    _per_query(run / "zero_shot" / "per_query.json", [0.3, 0.5, 0.3, 0.5])
    _per_query(run / "original" / "per_query.json", [0.52, 0.72, 0.52, 0.72])
    _ledger(math.inf, "none").save(_mk(run / "original" / "retriever"))
    for eps, ndcg in (("inf", 0.58), ("16", 0.55), ("8", 0.52), ("3", 0.47)):
        stage = run / f"eps-{eps}"
        _metrics(stage / "metrics.json", ndcg)
        if eps != "3":
            _per_query(stage / "per_query.json", [ndcg - 0.1, ndcg + 0.1, ndcg - 0.07, ndcg + 0.07])
        ledger = _ledger(float(eps), "dp-sgd")
        ledger.save(_mk(stage / "generator"))
        syn = _mk(stage / "synthetic")
        _jsonl(syn / "corpus.jsonl", [{"_id": i, "title": t, "text": x} for i, t, x in DOCS])
        _jsonl(syn / "queries.jsonl", [{"_id": f"syn-{d}-0", "text": f"synthetic query eps{eps} about {t.lower()}"}
                                       for d, t, _ in DOCS])
        _mk(syn / "qrels")
        (syn / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                 + "".join(f"syn-{d}-0\t{d}\t1\n" for d, _, _ in DOCS))
        (syn / "manifest.json").write_text(json.dumps({"ledger": ledger.model_dump(mode="json")}))
    (run / "eps-8" / "mauve.json").write_text(json.dumps({"mauve": 0.41, "featurizer": "minilm-l6"}))  # the pipeline's
    filtered = run / "eps-8-filtered"
    _metrics(filtered / "metrics.json", 0.53)
    _ledger(8.0, "dp-sgd").save(_mk(filtered / "synthetic"))
    for eps, ndcg in (("16", 0.45), ("8", 0.41), ("3", 0.30)):
        stage = run / f"direct-logit-dp-eps-{eps}"
        _metrics(stage / "metrics.json", ndcg)
        _ledger(float(eps), "logit-dp").save(_mk(stage / "retriever"))
    (run / "similarity.json").write_text(json.dumps([
        {"bleu": 0.29, "mauve": 0.97, "pairs": 900, "synthetic": {"epsilon": "Infinity"},
         "mauve_details": {"featurizer": "minilm-l6"}},
        {"bleu": 0.09, "mauve": 0.34, "pairs": 900, "synthetic": {"epsilon": 8.0},
         "mauve_details": {"featurizer": "minilm-l6"}}]))
    (run / "eps-16" / "similarity.json").write_text(json.dumps(  # where `privret evaluate similarity` puts it
        {"bleu": 0.10, "mauve": 0.37, "pairs": 900, "synthetic": {"epsilon": 16.0},
         "mauve_details": {"featurizer": "minilm-l6"}}))
    (run / "zero_shot_datasets.json").write_text(json.dumps({
        "split": "test", "datasets": {"scifact": "/x/scifact", "nfcorpus": "/x/nfcorpus"},
        "rows": [{"source": "zero-shot", "epsilon": None,
                  "metrics": {"scifact": {"ndcg@10": 0.64, "recall@10": 0.78},
                              "nfcorpus": {"ndcg@10": 0.31, "recall@10": 0.15}}}]}))
    row = {"repetitions": 100, "canaries": 9, "rank_mean": 1.0, "rank_std": 0.0, "rank_median": 1,
           "exposure_mean": 6.64, "exposure_std": 0.0, "extracted_fraction": 1.0, "leaked_fraction": 1.0,
           "epsilon_lower_bound": 2.87, "bound_threshold": 1, "comparable_to_ledger": False}
    (run / "canaries.json").write_text(json.dumps({
        "audit": "canary-exposure", "candidates": 100, "kinds": ["a", "b", "c"], "trials": 3, "samples": 10,
        "alpha": 0.05, "subsample": 200, "pairs": 200, "pairs_available": 919,
        "results": [{"epsilon": "inf", "unit": "pair", "rows": [row]},
                    {"epsilon": "16", "unit": "pair", "rows": [{**row, "rank_mean": 47.0, "rank_std": 20.0,
                                                                "exposure_mean": 1.3, "extracted_fraction": 0.0,
                                                                "leaked_fraction": 0.0, "epsilon_lower_bound": 0.0,
                                                                "bound_threshold": None}]}]}))
    return run


def _mk(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture()
def fake_run(tmp_path) -> Path:
    return write_fake_run(tmp_path)


def test_collect_reads_every_row_and_ledger(fake_run):
    run = collect(fake_run)
    methods = [r.method for r in run.rows]
    assert methods.count("dp-synthetic") == 4 and methods.count("direct-logit-dp") == 3
    filtered = [r for r in run.rows if r.method == "dp-synthetic-filtered"]
    assert [(r.key, r.epsilon) for r in filtered] == [("eps-8-filtered", 8.0)]
    assert filtered[0].label.startswith("DP synthetic queries, round-trip filtered")
    assert methods[:2] == ["zero-shot", "original"]
    direct = [r for r in run.rows if r.key == "direct-logit-dp-eps-8"][0]
    assert direct.ledger["mechanism"] == "logit-dp" and direct.epsilon == 8.0
    assert [s["epsilon"] for s in run.similarity] == [math.inf, 16.0, 8.0]
    assert run.similarity[1]["label"] == "eps-16" and run.similarity[1]["mauve"] == 0.37
    assert {r.key: r.mauve for r in run.rows if r.mauve is not None} == {"eps-8": 0.41}  # the pipeline's mauve.json
    assert run.canaries["results"][0]["rows"][0]["exposure_mean"] == 6.64
    assert run.zero_shot_datasets[0]["file"] == "zero_shot_datasets.json"
    assert not run.notes  # every trained row has its ledger


def test_html_is_self_contained_and_private_by_default(fake_run, tmp_path):
    html_path, md_path, markdown = build_report(fake_run)
    page = html_path.read_text()
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page, re.I)
    assert "http://" not in page and "https://" not in page
    for tag in ("<script", "<link", "<iframe", "@import", "url("):
        assert tag not in page.lower()
    assert page.count("data:image/png;base64,") == 1
    for section in ("Privacy-utility", "Retrieval", "Zero-shot across datasets", "Similarity", "Privacy leakage",
                    "Example synthetic queries", "Privacy ledgers"):
        assert section in page, section
    assert "direct logit-dp (ε=8)" in page and "(8, 0.001)-DP per query" in page
    # private text stays out unless asked for; so do the non-private generator's samples
    assert PRIVATE_QUERY not in page and PRIVATE_QUERY not in markdown
    assert "synthetic query eps8 about aspirin" in page and "synthetic query epsinf" not in page
    assert "| DP synthetic queries (ε=3) | 3 | 0.001 | query | 0.4700 |" in md_path.read_text()

    shown, _, _ = build_report(fake_run, out=tmp_path / "with-private.html", show_private_queries=True)
    page = shown.read_text()
    assert PRIVATE_QUERY in page and "synthetic query epsinf about aspirin" in page


def test_the_report_says_which_number_format_the_rows_were_encoded_in(fake_run):
    """Rows with no recorded format say so; one row in another format than the rest gets the warning."""
    _, _, markdown = build_report(fake_run)
    assert "The number format of the rows' evaluations was not recorded" in markdown
    for path in fake_run.glob("*/metrics.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "precision": "float32"}))
    _, _, markdown = build_report(fake_run)
    assert "Every row was encoded in float32 for evaluation." in markdown
    zero_shot = fake_run / "zero_shot" / "metrics.json"
    zero_shot.write_text(json.dumps({**json.loads(zero_shot.read_text()), "precision": "bf16-autocast"}))
    _, _, markdown = build_report(fake_run)
    warning = "Warning: the rows were encoded in different number formats (bf16-autocast: zero-shot (public encoder); "
    assert warning + "float32: original pairs" in markdown
    assert warning in (fake_run / "report.html").read_text()


def test_retention_and_interval_columns(fake_run):
    """Retention = (row - zero-shot) / (original - zero-shot); the interval only where per_query.json exists."""
    _, _, markdown = build_report(fake_run)
    assert "| NDCG@10 | retention | ΔNDCG@10 vs zero-shot [95% CI] | Recall@10 |" in markdown
    assert "| zero-shot (public encoder) | - | - | - | 0.4000 | - | - | 0.5000 |" in markdown
    assert "| original pairs (non-private) | ∞ | - | query | 0.6200 | - | +0.2200 [+0.2200, +0.2200] |" in markdown
    # eps-8: (0.52 - 0.40) / (0.62 - 0.40) = 54.5%; per-query differences 0.12, 0.12, 0.15, 0.09
    assert re.search(r"\| DP synthetic queries \(ε=8\) \| 8 \| 0.001 \| query \| 0.5200 \| 54.5% \| "
                     r"\+0.1200 \[\+0.(09|1[0-4])\d\d, \+0.1[0-5]\d\d\] \|", markdown)
    assert "| DP synthetic queries (ε=3) | 3 | 0.001 | query | 0.4700 | 31.8% | +0.0700 [-] |" in markdown
    assert "| direct logit-dp (ε=3) | 3 | 0.001 | query | 0.3000 | -45.5% | -0.1000 [-] |" in markdown
    page = (fake_run / "report.html").read_text()
    assert "ΔNDCG@10 vs zero-shot [95% CI]" in page and "<td class=\"num\">54.5%</td>" in page


def test_rows_without_private_data_set_the_bar_every_dp_row_is_compared_with(fake_run, monkeypatch):
    """public-prompted (epsilon 0) is a reference line in the plot and the bar of a column and a sentence."""
    from matplotlib.axes import Axes

    from privret.evaluate.statistics import BAR_HEADER
    from privret.report.plot import privacy_utility_png

    assert BAR_HEADER not in build_report(fake_run)[2]  # no row without private data: no bar
    stage = fake_run / "public-prompted"
    _metrics(stage / "metrics.json", 0.45)
    _per_query(stage / "per_query.json", [0.35, 0.55, 0.35, 0.55])
    PrivacyLedger.public("public-prompted", model="smollm2-135m", public_data_hash="cd" * 32,
                         unit="query").save(_mk(stage / "generator"))
    _, _, markdown = build_report(fake_run)
    assert f"| MRR@10 | {BAR_HEADER} |" in markdown
    lines = {line.split(" | ")[0].lstrip("| "): line for line in markdown.splitlines() if line.startswith("| ")}
    assert lines["no private data (prompted)"].startswith("| no private data (prompted) | 0 | - | query | 0.4500 |")
    # eps-8 minus the bar, per query: 0.07, 0.07, 0.10, 0.04
    assert re.search(r"\| \+0\.0700 \[\+0\.0[4-7]\d\d, \+0\.(0[7-9]|10)\d\d\] \|$", lines["DP synthetic queries (ε=8)"])
    assert lines["DP synthetic queries (ε=3)"].endswith("| +0.0200 [-] |")  # no per-query scores
    assert lines["no private data (prompted)"].endswith("| - |")
    assert ("The epsilon = 0 bar is 'no private data (prompted)' (NDCG@10 0.4500), the best row made without "
            "private data") in markdown
    cleared_not = markdown.split("Not cleared by: ")[1].split(" (no gain")[0].split("; ")
    assert cleared_not == ["DP synthetic queries (ε=3)", "DP synthetic queries, round-trip filtered (ε=8)",
                           "direct logit-dp (ε=16)", "direct logit-dp (ε=8)", "direct logit-dp (ε=3)"]
    assert "Not cleared by: DP synthetic queries (ε=3)" in (fake_run / "report.html").read_text()

    lines_drawn = []
    real = Axes.axhline

    def spy(self, y=0, **kwargs):
        lines_drawn.append((kwargs.get("label"), y))
        return real(self, y, **kwargs)

    monkeypatch.setattr(Axes, "axhline", spy)
    assert privacy_utility_png(collect(fake_run)) is not None
    assert ("no private data (prompted): 0.450", 0.45) in lines_drawn  # a line, not a point at log(0)


def test_plot_draws_the_interval_as_error_bars(fake_run, monkeypatch):
    from matplotlib.axes import Axes

    from privret.report.plot import privacy_utility_png

    drawn = []
    real = Axes.errorbar

    def spy(self, x, y, **kwargs):
        drawn.append((list(x), list(y), kwargs["yerr"]))
        return real(self, x, y, **kwargs)

    monkeypatch.setattr(Axes, "errorbar", spy)
    run = collect(fake_run)
    assert privacy_utility_png(run) is not None
    assert len(drawn) == 1  # only the DP synthetic rows have per-query scores, and not eps-3
    x, y, (below, above) = drawn[0]
    assert x[:2] == [8.0, 16.0] and y[:2] == [0.52, 0.55]
    low, high = run.versus["eps-8"].ci
    assert y[0] - below[0] == pytest.approx(0.40 + low) and y[0] + above[0] == pytest.approx(0.40 + high)


def test_privacy_utility_json_shape(fake_run, tmp_path):
    from privret.errors import InputError

    out = tmp_path / "privacy_utility.json"
    build_report(fake_run, utility_out=out)
    data = json.loads(out.read_text())
    assert isinstance(data, list) and len(data) == 1
    entry = data[0]
    assert set(entry) == {"dataset", "zero_shot", "original", "rows"}
    assert entry["dataset"] == "private" and entry["zero_shot"] == {"ndcg10": 0.40} and entry["original"] == {
        "ndcg10": 0.62}
    assert [r["name"] for r in entry["rows"]] == ["eps-inf", "eps-16", "eps-8", "eps-3", "eps-8-filtered",
                                                  "direct-logit-dp-eps-16", "direct-logit-dp-eps-8",
                                                  "direct-logit-dp-eps-3"]
    for row in entry["rows"]:
        assert set(row) == {"name", "epsilon", "ndcg10_mean", "ndcg10_sd", "seeds", "delta_ci95", "retention"}
        assert isinstance(row["epsilon"], float) and isinstance(row["ndcg10_mean"], float)
        assert row["ndcg10_sd"] == 0.0 and row["seeds"] == 1
    eight = entry["rows"][2]
    assert eight["epsilon"] == 8.0 and eight["ndcg10_mean"] == 0.52
    assert eight["retention"] == pytest.approx(0.12 / 0.22)
    assert len(eight["delta_ci95"]) == 2 and 0.09 <= eight["delta_ci95"][0] <= 0.12 <= eight["delta_ci95"][1] <= 0.15
    assert entry["rows"][3]["delta_ci95"] is None  # eps-3 has no per-query scores
    assert entry["rows"][0]["epsilon"] == math.inf
    (fake_run / "zero_shot" / "metrics.json").unlink()
    (fake_run / "report.html").unlink()
    with pytest.raises(InputError, match="needs zero_shot/metrics.json"):
        build_report(fake_run, utility_out=tmp_path / "again.json")
    assert not (tmp_path / "again.json").exists() and not (fake_run / "report.html").exists()


def test_escapes_text_from_the_run(fake_run):
    queries = fake_run / "eps-8" / "synthetic" / "queries.jsonl"
    queries.write_text(queries.read_text().replace("synthetic query eps8 about aspirin",
                                                   "<img src=https://evil.example/x.png>"))
    html_path, _, _ = build_report(fake_run)
    page = html_path.read_text()
    assert "<img src=https" not in page and "&lt;img src=https://evil.example/x.png&gt;" in page


def test_bad_metrics_file_is_one_clear_error(fake_run):
    from privret.errors import InputError

    (fake_run / "eps-8" / "metrics.json").write_text("{not json")
    with pytest.raises(InputError, match=r"eps-8/metrics.json:1: malformed JSON"):
        build_report(fake_run)
    assert not (fake_run / "report.html").exists()
    (fake_run / "eps-8" / "metrics.json").write_text(json.dumps({"ndcg@10": 0.52}))
    (fake_run / "eps-8" / "per_query.json").write_text(json.dumps({"t1": 0.42}))  # not {qid: {metric: value}}
    with pytest.raises(InputError, match=r"eps-8/per_query.json, field 'ndcg@10': expected \{query id"):
        build_report(fake_run)
    (fake_run / "eps-8" / "per_query.json").unlink()
    (fake_run / "eps-8" / "mauve.json").write_text(json.dumps({"mauve": "high"}))
    with pytest.raises(InputError, match=r"eps-8/mauve.json, field 'mauve': expected an object with a numeric"):
        build_report(fake_run)


def test_cli_report_exit_codes(fake_run, tmp_path):
    utility = tmp_path / "privacy_utility.json"
    ok = run_cli("report", str(fake_run), "--utility-json", str(utility))
    assert ok.returncode == 0, ok.stderr
    assert "DP synthetic queries (ε=16)" in ok.stdout and (fake_run / "report.html").is_file()
    assert json.loads(utility.read_text())[0]["dataset"] == "private"
    bad = run_cli("report", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "run directory not found" in bad.stderr


# -- a real browser --------------------------------------------------------------------------------
def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def render_in_chromium(page: Path, shot: Path, netlog: Path, profile: Path) -> subprocess.CompletedProcess:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no chromium: `make install` installs Debian's chromium (apt-get install chromium); "
                    "installing it was not possible on this machine")
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={profile}", '--host-resolver-rules=MAP * ~NOTFOUND',
                           f"--log-net-log={netlog}", f"--screenshot={shot}", "--window-size=1200,2000",
                           page.resolve().as_uri()], capture_output=True, text=True, timeout=120)


def page_requests(netlog: Path) -> list[str]:
    """URLs the *page* asked the network stack for (requests of a file:// document), from Chromium's NetLog.
    Chromium's own background requests (updates, accounts) have another isolation key and are ignored."""
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    out = []
    for event in log["events"]:
        params = event.get("params") or {}
        if event["type"] == start and str(params.get("network_isolation_key", "")).startswith("file://"):
            out.append(params.get("url", ""))
    return [u for u in out if not u.startswith(("file:", "data:"))]


def plot_pixels(shot: Path) -> int:
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    count = 0
    for r, g, b in (image.get_flattened_data() if hasattr(image, "get_flattened_data") else image.getdata()):
        if any(abs(r - cr) + abs(g - cg) + abs(b - cb) < 40 for cr, cg, cb in PLOT_COLOURS):
            count += 1
    return count


@pytest.mark.slow
def test_report_renders_in_headless_chromium(fake_run, tmp_path):
    html_path, _, _ = build_report(fake_run)
    shot, netlog = tmp_path / "shot.png", tmp_path / "net.json"
    result = render_in_chromium(html_path, shot, netlog, tmp_path / "profile")
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    from PIL import Image

    assert Image.open(shot).size == (1200, 2000)
    # the plot's lines are drawn: many pixels in the plot's line colours, inside the plot area
    assert plot_pixels(shot) > 300
    assert page_requests(netlog) == []


@pytest.mark.slow
def test_network_check_catches_a_page_that_loads_something(tmp_path):
    """The NetLog check above can fail: a page with one remote image and no plot is caught on both counts."""
    page = tmp_path / "leaky.html"
    page.write_text("<!DOCTYPE html><html><body><h1>no plot</h1>"
                    "<img src='http://example.invalid/pixel.png'></body></html>")
    shot, netlog = tmp_path / "shot.png", tmp_path / "net.json"
    result = render_in_chromium(page, shot, netlog, tmp_path / "profile")
    assert result.returncode == 0, result.stderr[-2000:]
    assert page_requests(netlog) == ["http://example.invalid/pixel.png"]
    assert plot_pixels(shot) < 300


if os.environ.get("PRIVRET_REQUIRE_CHROMIUM") == "1":  # CI: a missing browser is a failure, not a skip
    def test_chromium_is_installed():
        assert chromium_binary() is not None, "chromium not found (run `make install`)"


def test_epsilon_ticks_merge_ledger_values_of_one_target():
    from privret.report.plot import epsilon_ticks

    assert list(epsilon_ticks([7.9917, 2.997, 7.9955, 15.993]).values()) == ["3", "8", "16"]


def _timed(run: Path, key: str, eval_seconds: float, **stages: float) -> None:
    """``eval_seconds`` in a row's metrics.json and its other stages' seconds in its timing.json."""
    path = run / key / "metrics.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "eval_seconds": eval_seconds}))
    if stages:
        (run / key / "timing.json").write_text(json.dumps({f"{k}_seconds": v for k, v in stages.items()}))


def test_wall_time_per_row_and_what_the_rows_without_private_data_add(fake_run):
    """Stage times from timing.json and metrics.json's eval_seconds; at each epsilon the epsilon-0 rows' seconds
    over the synthetic route's (zero-shot, original, the DP synthetic rows of that epsilon) and over the whole
    grid's (with the direct DP rows); "not timed" where a row lacks a stage its kind runs. Every stage is shown, as
    with --show-private-timings-and-counts."""
    from privret.errors import InputError

    def timed(key: str, eval_seconds: float, **stages: float) -> None:
        _timed(fake_run, key, eval_seconds, **stages)

    def build(run):
        return build_report(run, show_private_timings_and_counts=True)

    _, _, before = build(fake_run)
    assert "## Wall time" not in before  # nothing timed: no section
    stage = fake_run / "public-prompted"
    _metrics(stage / "metrics.json", 0.45)
    PrivacyLedger.public("public-prompted", model="smollm2-135m", public_data_hash="cd" * 32,
                         unit="query").save(_mk(stage / "generator"))
    timed("zero_shot", 60)
    timed("original", 60, retriever=600)
    timed("eps-8", 60, generator=1200, generate=300, retriever=600)
    timed("eps-8-filtered", 60, filter=100, retriever=600)
    timed("direct-logit-dp-eps-8", 60, retriever=1800)
    timed("public-prompted", 60, generator=5, generate=600, retriever=600)
    timed("eps-16", 60, retriever=600)  # its generator and generation stages were never timed
    _, _, markdown = build(fake_run)
    wall = markdown.split("## Wall time")[1].split("\n## ")[0]
    lines = {line.split(" | ")[0].lstrip("| "): line for line in wall.splitlines() if line.startswith("| ")}
    assert lines["training data"] == ("| training data | generator | generation | filter | retriever | evaluation "
                                      "| total |")
    assert lines["DP synthetic queries (ε=8)"] == ("| DP synthetic queries (ε=8) | 20.0 min | 5.0 min | - | 10.0 min "
                                                   "| 1.0 min | 36.0 min |")
    assert lines["zero-shot (public encoder)"].endswith("| - | - | - | - | 1.0 min | 1.0 min |")
    assert lines["DP synthetic queries (ε=16)"].endswith("| not timed |")
    # at epsilon 8: route 60 + 660 + 2160 + 760 = 3640 s, whole grid + 1860 = 5500 s; the prompted row 1265 s
    assert ("At ε = 8: the row without private data (no private data (prompted)) took 21.1 min, +35% on the "
            "synthetic route's 60.7 min (references and DP synthetic rows of this ε), +23% on the whole grid's "
            "91.7 min (with the direct DP rows).") in wall
    assert "At ε = 16: not timed (DP synthetic queries (ε=16), direct logit-dp (ε=16))." in wall
    assert "<h2 id='wall-time'>Wall time</h2>" in (fake_run / "report.html").read_text()
    (fake_run / "direct-logit-dp-eps-8" / "timing.json").unlink()  # the route's share stands alone
    _, _, markdown = build(fake_run)
    assert ("+35% on the synthetic route's 60.7 min (references and DP synthetic rows of this ε); the whole grid of "
            "this ε is not timed (direct logit-dp (ε=8)).") in markdown
    (fake_run / "eps-8" / "timing.json").write_text('{"generator_seconds": "slow"}')
    with pytest.raises(InputError, match="seconds") as err:
        build(fake_run)
    assert err.value.path is not None and str(err.value.path).endswith("eps-8/timing.json")


def test_timings_and_pair_counts_of_the_private_log_only_when_asked_for(fake_run, tmp_path, monkeypatch):
    """How long a stage that read the private log took depends on it, and so does each count of its pairs; no
    guarantee covers them. The default report withholds them: the stage of a DP row that read the log, every stage
    of a row trained on it without DP, what the rows without private data add (a sum over those), the original
    ledger's n_pairs, the canary audit's and the similarity's pair counts. --show-private-timings-and-counts
    shows them."""
    _timed(fake_run, "zero_shot", 61)
    _timed(fake_run, "original", 62, retriever=600)
    _timed(fake_run, "eps-8", 63, generator=1200, generate=300, retriever=660)
    _timed(fake_run, "eps-8-filtered", 66, filter=100, retriever=600)
    _timed(fake_run, "direct-logit-dp-eps-8", 64, retriever=1800)
    stage = fake_run / "public-prompted"
    _metrics(stage / "metrics.json", 0.45)
    PrivacyLedger.public("public-prompted", model="smollm2-135m", public_data_hash="cd" * 32,
                         unit="query", n_pairs=12).save(_mk(stage / "generator"))
    _timed(fake_run, "public-prompted", 65, generator=5, generate=600, retriever=540)

    def wall_time(markdown: str) -> dict[str, str]:
        wall = markdown.split("## Wall time")[1].split("\n## ")[0]
        return {line.split(" | ")[0].lstrip("| "): line for line in wall.splitlines() if line.startswith("| ")}

    html_path, _, markdown = build_report(fake_run)
    page = html_path.read_text()
    lines = wall_time(markdown)
    assert lines["DP synthetic queries (ε=8)"] == ("| DP synthetic queries (ε=8) | withheld | 5.0 min | - | 11.0 min "
                                                   "| 1.1 min | withheld |")
    assert lines["original pairs (non-private)"].endswith("| - | - | - | withheld | withheld | withheld |")
    assert lines["direct logit-dp (ε=8)"].endswith("| - | - | - | withheld | 1.1 min | withheld |")
    # post-processing of a DP release with public data, or public data alone: shown
    assert lines["DP synthetic queries, round-trip filtered (ε=8)"].endswith(
        "| - | - | 1.7 min | 10.0 min | 1.1 min | 12.8 min |")
    assert lines["no private data (prompted)"].endswith("| 0.1 min | 10.0 min | - | 9.0 min | 1.1 min | 20.2 min |")
    for text in (page, markdown):
        assert "20.0 min" not in text and "30.0 min" not in text and "At ε = 8" not in text
        assert "--show-private-timings-and-counts" in text
    assert "<td>n_pairs</td><td>900</td>" not in page and "<td>n_pairs</td><td>12</td>" in page  # public pairs
    assert "of 919" not in page and "Private pairs" not in page  # the canary audit's counts of the log
    assert "<td class=\"num\">900</td>" not in page  # the similarity's pairs

    shown, _, markdown = build_report(fake_run, out=tmp_path / "researcher.html", show_private_timings_and_counts=True)
    page = shown.read_text()
    lines = wall_time(markdown)
    assert lines["DP synthetic queries (ε=8)"] == ("| DP synthetic queries (ε=8) | 20.0 min | 5.0 min | - | 11.0 min "
                                                   "| 1.1 min | 37.0 min |")
    assert lines["original pairs (non-private)"].endswith("| - | - | - | 10.0 min | 1.0 min | 11.0 min |")
    assert "At ε = 8: the row without private data" in markdown
    assert "<td>n_pairs</td><td>900</td>" in page and "Private pairs: 200 (subsample) of 919" in page
    assert "<td class=\"num\">900</td>" in page
    cli = run_cli("report", str(fake_run), "--show-private-timings-and-counts")
    assert cli.returncode == 0 and "20.0 min" in cli.stdout, cli.stderr
    monkeypatch.setenv("COLUMNS", "200")  # --help's options table, wide enough for the whole flag
    assert "--show-private-timings-and-counts" in run_cli("report", "--help").stdout
