"""jdist extended from outside the package: a launcher with its own option, a backend whose engine
owns accumulation and comes back from ``jdist.prepare``, a panel with two series, an automatic
metric and a cell option (a record sink), each one module of ``tests/extensions/`` plus one entry
point (its ``jdist_ext-0.1.dist-info``, as ``pip install`` would leave it). A real kernel with that
folder on PYTHONPATH starts real ranks with them; each shows where it applies: ``%%distributed?``,
the checks, the ranks, the dashboard, the static summary, the sidebar's models (the same functions
the server calls) and the state file the sidebar lists options from.

The "where to change what" table of docs/architecture.md is checked against these files too.
"""

from __future__ import annotations

import csv
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import KernelSession

REPO = Path(__file__).resolve().parents[1]
EXTENSIONS = Path(__file__).parent / "extensions"
SVG = "{http://www.w3.org/2000/svg}"
#: Each kind of plugin: its entry point group and the module that defines it (and nothing else).
PLUGINS = {"launcher": ("jdist.launchers", "jdist_ext_launcher"), "backend": ("jdist.backends", "jdist_ext_backend"),
           "dashboard panel": ("jdist.panels", "jdist_ext_panel"), "automatic metric": ("jdist.metrics", "jdist_ext_metric"),
           "cell option": ("jdist.sinks", "jdist_ext_sink")}


def entry_points() -> dict[str, list[str]]:
    """group -> its entry lines, from the example package's entry_points.txt."""
    out: dict[str, list[str]] = {}
    group = None
    for line in (EXTENSIONS / "jdist_ext-0.1.dist-info" / "entry_points.txt").read_text().splitlines():
        if line.startswith("["):
            group = line.strip("[]")
        elif line.strip() and group:
            out.setdefault(group, []).append(line)
    return out


def test_each_plugin_is_its_own_module_and_one_entry_point_as_the_architecture_table_says():
    eps = entry_points()
    modules = sorted(p.stem for p in EXTENSIONS.glob("*.py"))
    assert modules == sorted(module for _, module in PLUGINS.values())
    table = (REPO / "docs" / "architecture.md").read_text().split("## Where to change what", 1)[1]
    for kind, (group, module) in PLUGINS.items():
        assert len(eps[group]) == 1 and f"= {module}:" in eps[group][0], (kind, eps[group])
        row = next(line for line in table.splitlines() if line.startswith(f"| **{kind}**"))
        assert "1 module + 1 entry point" in row and group in row, (kind, row)


@pytest.fixture(scope="module")
def ext(kernel_env: dict[str, str]):
    env = {**kernel_env, "PYTHONPATH": os.pathsep.join(filter(None, [str(EXTENSIONS), kernel_env.get("PYTHONPATH")]))}
    k = KernelSession(env)
    k.run("%load_ext jdist")
    yield k
    k.run("%dist stop", allow_error=True)
    k.shutdown()


def test_plugin_options_are_in_the_help_and_checked_by_their_owners(ext):
    help_text = ext.run("%%distributed?").pager
    for flag in ("--tag", "--average", "--csv"):
        assert flag in help_text, flag
    for line, says in [("-n 2 --launcher tagged", "--launcher tagged needs the tag: give --tag NAME."),
                       ("-n 2 --tag x --launcher local-mpi", "--tag starts the ranks with --launcher tagged; "
                                                             "drop --launcher local-mpi."),
                       ("-n 2 --average sum", "--average is an option of --backend engine, not of --backend ddp"),
                       ("--gpus 2 --backend engine", "--backend engine runs on CPU ranks only: use -n N")]:
        out = ext.run(f"%%distributed {line}\npass", allow_error=True)
        assert out.error and out.error["ename"] == "UsageError" and says in out.shown, (line, out.shown)


def test_the_plugins_run_on_real_ranks_and_show_everywhere(ext, tmp_path):
    # --tag selects the tagged launcher; --average is the engine backend's own option
    out = ext.run("%%distributed -n 2 --tag blue --backend engine --average sum --timeout 30 --output all\n"
                  "import copy, os, torch, torch.nn as nn\nprint('tag', os.environ['JDIST_TAG'])")
    assert "tagged blue" in out.stdout and out.stdout.count("tag blue") == 2, out.stdout
    cluster = "__import__('jdist.kernel.cluster', fromlist=['x']).current()"
    assert ext.value(f"{cluster}.launcher.tags") == ["blue", "blue"]  # back from each rank (RankInfo["launcher"])
    options = {o["flag"]: o["value"] for o in json.loads(Path(ext.value(f"str({cluster}.state_file)")).read_text())["options"]}
    assert options["--launcher"] == "tagged" and options["--tag"] == "blue" and options["--average"] == "sum"

    # training: the engine comes back from jdist.prepare and owns accumulation; --csv is the sink's cell option
    path = tmp_path / "records.csv"
    out = ext.run(f"%%distributed --csv {path}\n" + TRAIN)
    assert "ENGINE Engine 8 4 True" in out.stdout, out.stdout  # 8 micro-steps, 4 steps, weights as computed by hand
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 16 and {r["rank"] for r in rows} == {"0", "1"}

    # the automatic metric: in every record, not a user metric, reserved for jdist.log
    history = "jdist.last_run().history"
    assert ext.value(f"sorted({history}[{history}['rank'] == 0]['log_index'].tolist())") == list(range(8))
    assert ext.value("'log_index' in jdist.AUTO_METRICS and 'log_index' not in jdist.last_run().metric_names")
    bad = ext.run("%%distributed\njdist.log(log_index=1)", allow_error=True)
    assert "'log_index' is a reserved metric name" in bad.shown

    # the panel, with its two series: in the live dashboard, the static summary and its text, the sidebar
    layout = ext.value("[(p['key'], [s['name'] for s in p['series']]) for p in "
                       "__import__('jdist.metrics.panels', fromlist=['x']).panels(jdist.last_run())]")
    assert layout[-1] == ("parameters", ["weight_norm", "bias_abs"])
    svg = next(d["data"]["image/svg+xml"] for d in reversed(out.displays) if "image/svg+xml" in d.get("data", {}))
    panel = next(g for g in ET.fromstring(svg).iter(f"{SVG}g") if g.get("data-panel") == "parameters")
    lines = {p.get("data-series"): int(p.get("data-points")) for p in panel.iter(f"{SVG}path") if p.get("class") == "line"}
    assert lines == {"weight_norm": 8, "bias_abs": 8}
    assert re.search(r"\n  weight norm: [0-9.e+-]+ at step 7", ext.value("jdist.last_run().summary()"))
    runs = "__import__('jdist.server.runs', fromlist=['x'])"  # what the server's /runs and /runs/<id> return
    sparks = ext.value(f"[(s['key'], len(s['x'])) for s in {runs}.run_summary(jdist.read_run(jdist.last_run().path), "
                       "set(), None)['sparks']]")
    assert sparks == [("loss", 8), ("time", 8), ("parameters", 8)]
    detail = ext.value(f"[p['key'] for p in {runs}.run_detail(jdist.read_run(jdist.last_run().path), set(), None, "
                       "jdist.last_run().path)['panels']]")
    assert detail == ["loss", "time", "memory", "throughput", "state", "parameters"]


TRAIN = """
def batch(r, i):
    g = torch.Generator().manual_seed(100 * r + i)
    return torch.randn(3, 4, generator=g), torch.randn(3, 1, generator=g)

torch.manual_seed(0)
model = nn.Linear(4, 1)
start = copy.deepcopy(model.state_dict())
engine, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_accum=2)
for i in range(8):
    x, y = batch(rank, i)
    loss = ((engine(x) - y) ** 2).mean()
    jdist.backward(loss)
    opt.step(); opt.zero_grad()
    jdist.log(step=i, loss=loss.item(), weight_norm=float(model.weight.norm()), bias_abs=float(model.bias.abs()))

# the same by hand: per optimizer step, the gradients of both ranks' two micro-batches, each loss / 2,
# summed across ranks (--average sum)
ref = nn.Linear(4, 1)
ref.load_state_dict(start)
for step in range(4):
    ref.zero_grad()
    for r in range(world_size):
        for i in (2 * step, 2 * step + 1):
            x, y = batch(r, i)
            (((ref(x) - y) ** 2).mean() / 2).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
same = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ref.parameters(), model.parameters()))
print("ENGINE", type(engine).__name__, engine.micro_steps, engine.steps, same)
"""
