"""``%dist debug`` (a post-mortem) and ``breakpoint()`` with ``--debug-ranks`` on real ranks, typed into the
notebook's input box (jupyter_client's stdin channel, as JupyterLab's input box sends it). A real 2-rank MPI
cluster with DDP; nothing is mocked."""

from __future__ import annotations

import re
import time

import pytest
from conftest import INTERRUPT, KernelSession, Panel, strip_ansi

pytestmark = pytest.mark.cluster

FAILING = """%%distributed
import torch, torch.distributed as dist
def scale(batch, factor):
    total = batch.sum() * factor
    if rank == 1:
        limit = 3
        raise ValueError(f"rank {rank}: total {float(total)} over the limit {limit}")
    return total
t = torch.ones(1); dist.all_reduce(t)
result = scale(torch.arange(4.0), factor=2)
"""


def test_before_any_failure_it_says_what_it_is_for(cluster_kernel):
    out = cluster_kernel.run("%dist debug", allow_error=True)
    assert "no cell failed on any rank (since the ranks started): it opens pdb after a %%distributed cell raised" \
        in strip_ansi(out.stderr), out.shown
    out = cluster_kernel.run("%dist debug --ranks 0,5", allow_error=True)
    assert "rank 5 does not exist (ranks 0-1)" in strip_ansi(out.stderr), out.shown


@pytest.fixture(scope="module")
def failed(cluster_kernel: KernelSession) -> KernelSession:
    out = cluster_kernel.run(FAILING, allow_error=True)
    assert out.error and out.error["ename"] == "RankError" and "rank 1" in out.error["evalue"], out.shown
    return cluster_kernel


def test_post_mortem_on_the_failed_rank_shows_its_frames_and_locals(failed):
    out = failed.run("%dist debug", replies=["p factor, limit", "p float(total)", "a", "l", "w", "u", "p t", "q"])
    text = strip_ansi(out.stdout)
    assert not out.replies_ran_out and not out.error, out.shown
    assert out.prompts and all(p == "(Pdb r1) " for p in out.prompts)
    assert "Post-mortem on rank 1: ValueError: rank 1: total 12.0 over the limit 3" in text, text
    assert "(2, 3)" in text and "12.0" in text  # the failing frame's locals
    assert 'raise ValueError(f"rank {rank}: total' in text  # `l`: the cell's source around the line
    assert "scale(torch.arange(4.0), factor=2)" in text  # `w` and `u`: the cell's frame that called it
    assert "interactiveshell.py" not in text  # `w` starts at the cell: no IPython or engine frames above it
    assert "batch = tensor([0., 1., 2., 3.])" in text  # `a`: the arguments of the frame
    assert "tensor([2.])" in text  # `u`, then `p t`: the cell's own variable, after the all_reduce
    assert "Post-mortem ended; rank 1 and the others are as they were." in text
    # the ranks are untouched: the cell's state is there, the process group works
    failed.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t)\nafter = (float(t), 'scale' in globals())")
    failed.run("%dist pull after")
    assert [tuple(a) for a in failed.value("after")] == [(2.0, True)] * 2


def test_several_ranks_answer_labelled_and_stepping_is_refused(failed):
    # rank 0 failed too? No: it finished; a post-mortem of rank 0 alone is refused with who has a failure
    out = failed.run("%dist debug --rank 0", allow_error=True)
    assert "no cell failed on rank(s) 0; these have a failure: 1." in strip_ansi(out.stderr), out.shown
    failed.run("%%distributed\nif rank == 0:\n    oops = {'rank': rank}\n    oops['missing']", allow_error=True)
    out = failed.run("%dist debug --ranks 0,1", replies=["p rank", "n", "q"])
    text = strip_ansi(out.stdout)
    assert out.prompts[0] == "(Pdb r0,1) " and not out.replies_ran_out
    assert "Post-mortem on rank 0: KeyError: 'missing'" in text and "Post-mortem on rank 1: ValueError" in text
    assert "[r0] 0" in text and "[r1] 1" in text  # each rank's own answer, labelled
    assert "[r0] *** n: the traceback's frames have finished" in text


BREAK = """%%distributed --debug-ranks 1 --watchdog 2
x = torch.full((2,), float(rank + 1))
if rank == 1:
    secret = x * 10
    breakpoint()
    x = x + 100
t = x.clone(); dist.all_reduce(t)
total = t.tolist()
"""


def test_breakpoint_on_rank_1_while_rank_0_waits_in_all_reduce(failed):
    # a 3 s pause, longer than the 2 s hang watchdog: rank 0 waits in all_reduce the whole time, no HangError
    out = failed.run(BREAK, replies=["p secret", (3.0, "n"), "p x", "c"], timeout=120)
    text = strip_ansi(out.stdout)
    assert not out.error and not out.replies_ran_out, out.shown
    assert out.prompts == ["(Pdb r1) "] * 4
    assert "jdist: rank 1 stopped at breakpoint(). Rank(s) 0 go on until they need it" in text, text
    assert "--timeout 30 s" in text
    assert "tensor([20., 20.])" in text  # p secret
    assert "tensor([102., 102.])" in text  # after `n`: the next line ran
    failed.run("%dist pull total")
    assert failed.value("total") == [[103.0, 103.0]] * 2  # the cell went on: 1 + 102 on both ranks
    # without --debug-ranks, breakpoint() does not stop; the notebook says how to make it stop
    out = failed.run("%%distributed\nbreakpoint()\ndone = rank")
    assert "breakpoint() does not stop rank 0: %%distributed --debug-ranks 0 stops there." in out.stdout, out.stdout


def test_an_interrupt_during_a_pause_ends_the_cell_and_the_ranks_go_on(failed):
    out = failed.run("%%distributed --debug-ranks 0\nif rank == 0:\n    pdb_seen = 1\n    breakpoint()\n"
                     "dist.all_reduce(torch.ones(1))", replies=["p pdb_seen", INTERRUPT], allow_error=True, timeout=120)
    assert out.error and out.error["ename"] == "KeyboardInterrupt", out.shown
    assert out.prompts == ["(Pdb r0) ", "(Pdb r0) "] and not out.replies_ran_out  # no input box after the interrupt
    assert "Interrupted" in strip_ansi(out.stderr + out.traceback), out.shown
    failed.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t)\nafter = float(t)")
    failed.run("%dist pull after")
    assert failed.value("after") == [2.0, 2.0]


def test_pdb_steps_through_the_cell_labels_several_ranks_and_q_stops_the_cell_cleanly(failed):
    """Both ranks stop (--debug-ranks all): each answer labelled; ``n`` goes from statement to statement of the
    cell (IPython runs each as its own code) with no "--Return--" stop, no engine frame in ``w`` and no stale
    ``->None`` later, and stepping past the last line ends the pause. Then ``q`` on rank 1 stops the cell
    there: an interrupt, not a crash; rank 0 is released; the next cell runs on both."""
    out = failed.run("%%distributed --debug-ranks all --output all\nbreakpoint()\nstepped = rank\n"
                     "stepped += 10", replies=["p ('at', rank)", "p ('at', rank)", "n", "n", "w", "w", "n", "n",
                                               "n", "n"], timeout=120)
    text = strip_ansi(out.stdout)
    assert not out.error, out.shown
    assert sorted(set(out.prompts)) == ["(Pdb r0) ", "(Pdb r1) "], out.prompts
    assert "[rank 0] ('at', 0)" in text and "[rank 1] ('at', 1)" in text, text
    assert "--Return--" not in text and "->None" not in text and "interactiveshell.py" not in text, text
    failed.run("%dist pull stepped")
    assert failed.value("stepped") == [10, 11]
    out = failed.run("%%distributed --debug-ranks 1\nif rank == 1:\n    breakpoint()\nt = torch.ones(1); "
                     "dist.all_reduce(t)", replies=["q"], allow_error=True, timeout=120)
    assert out.error and out.error["ename"] == "KeyboardInterrupt", out.shown
    shown = strip_ansi(out.shown)
    assert shown.startswith("KeyboardInterrupt: Stopped: pdb's q on rank 1 ended the cell there (the other ranks "
                            "were released); variables on the ranks are kept."), shown
    assert "rank 0: released because of pdb's q on rank 1" in shown, shown
    assert "BdbQuit" not in shown and "RankError" not in shown and "magics.py" not in shown, shown
    out = failed.run("%%distributed --output all\nt = torch.ones(1); dist.all_reduce(t)\nprint(float(t))")
    assert sorted(out.stdout.strip().splitlines()) == ["[rank 0] 2.0", "[rank 1] 2.0"], out.stdout
    out = failed.run("%%distributed --targets 0 --debug-ranks 1\nx = 1", allow_error=True)
    assert "--debug-ranks 1: rank(s) 1 do not run this cell (--targets 0)" in strip_ansi(out.shown), out.shown


# -- JupyterLab's Debugger panel (the Jupyter debug protocol on the kernel's control channel, as the panel
#    sends it; jdist.kernel.debug.dapbridge passes a %%distributed cell's part on to debugpy on the ranks) -----------
PANEL_CELL = """%%distributed --debug-ranks 1
import torch, torch.distributed as dist
seen = 40 + rank; jdist.log(step=0, seen=float(seen))
t = torch.ones(1) * seen
dist.all_reduce(t)
print("sum", float(t))
"""


def test_the_debugger_panel_stops_rank_1_at_a_gutter_breakpoint_with_its_stack_and_variables(failed):
    panel = Panel(failed)
    assert panel("initialize", clientID="jupyterlab", adapterID="python", pathFormat="path", linesStartAt1=True,
                 columnsStartAt1=True, supportsVariableType=True)["success"]
    assert panel("attach")["success"]
    try:
        path = panel("dumpCell", code=PANEL_CELL)["body"]["sourcePath"]
        info = panel("debugInfo")["body"]
        assert path.startswith(info["tmpFilePrefix"])  # the panel's own name for the cell
        answer = panel("setBreakpoints", source={"path": path}, breakpoints=[{"line": 4}], sourceModified=False)
        assert answer["success"] and answer["body"]["breakpoints"][0]["verified"], answer
        assert panel("configurationDone")["success"]
        assert {"source": path, "breakpoints": [{"line": 4}]} in panel("debugInfo")["body"]["breakpoints"]

        msg_id = failed.start(PANEL_CELL)
        stopped = panel.wait_event("stopped", timeout=120)["body"]
        thread = stopped["threadId"]
        assert thread >= 2 << 32  # rank 1's thread, renumbered for the panel
        assert thread in panel("debugInfo")["body"]["stoppedThreads"]
        # the cell's live dashboard says so in its progress line
        panel.wait_iopub(lambda m: m["msg_type"] == "comm_msg" and "rank 1 paused in the debugger" in str(m["content"]),
                         30, "the dashboard's header with rank 1 paused")
        time.sleep(3)  # longer than the 2 s hang watchdog: rank 0 waits in all_reduce, no HangError
        frames = panel("stackTrace", threadId=thread)["body"]["stackFrames"]
        assert (frames[0]["source"]["path"], frames[0]["line"]) == (path, 4), frames[:2]
        scopes = panel("scopes", frameId=frames[0]["id"])["body"]["scopes"]
        variables = panel("variables", variablesReference=scopes[0]["variablesReference"])["body"]["variables"]
        values = {v["name"]: v["value"] for v in variables}
        assert values["seen"] == "41" and values["rank"] == "1", values  # rank 1's own state
        assert panel("evaluate", expression="seen * 2", frameId=frames[0]["id"], context="repl")["body"]["result"] == "82"
        assert not [f for f in frames if re.search(r"/(IPython|ipykernel|ipyparallel|jdist)/", f["source"].get("path", ""))]
        assert [f["source"].get("path") for f in frames] == [path], frames  # no engine start-up frame (<string>) below
        # step over: rank 1 stops again on the next line, with the line's effect in its variables
        assert panel("next", threadId=thread)["success"]
        assert panel.wait_event("stopped")["body"]["threadId"] == thread
        frames = panel("stackTrace", threadId=thread)["body"]["stackFrames"]
        assert frames[0]["line"] == 5, [(f["name"], f["source"], f["line"]) for f in frames[:4]]
        assert panel("evaluate", expression="float(t)", frameId=frames[0]["id"], context="repl")["body"]["result"] == "41.0"
        # JupyterLab's continue names the next stopped thread, else thread 1, after forgetting this one
        assert panel("continue", threadId=1)["success"]
        out = failed.collect(msg_id, timeout=120)
        text = "".join(m["content"].get("text", "") for m in panel.iopub if m["msg_type"] == "stream") + out.stdout
        assert not out.error, out.shown
        assert "jdist: rank 1 stopped at a breakpoint (the Debugger panel shows its stack and variables). " \
               "Rank(s) 0 go on until they need it" in text, text
        assert text.count("jdist: rank 1 stopped") == 1, text  # not again at the step
        assert "sum 81.0" in text  # the cell went on after the stop: 40 + 41
        # a cell without breakpoints runs as before with the panel open, and untraced (debugpy's tracer slows
        # every Python line): rank 1 traced only the cell that had breakpoints
        out = failed.run("%%distributed --output all\nimport sys\nt = torch.ones(1); dist.all_reduce(t)\n"
                         "print(float(t), sys.gettrace())")
        assert sorted(out.stdout.strip().splitlines()) == ["[rank 0] 2.0 None", "[rank 1] 2.0 None"], out.stdout
        # a rank that cannot run debugpy: one line, and the cell runs without stopping
        failed.run("%%distributed --targets 0\nimport sys\n_debugpy, sys.modules['debugpy'] = sys.modules['debugpy'], None")
        cell = "%%distributed --debug-ranks 0\nafter = 1\nafter += 1"
        path = panel("dumpCell", code=cell)["body"]["sourcePath"]
        panel("setBreakpoints", source={"path": path}, breakpoints=[{"line": 3}])
        out = failed.run(cell)
        assert "jdist: the Debugger panel cannot stop rank(s) 0: ModuleNotFoundError: import of debugpy halted" \
            in out.stdout and "(pip install debugpy into the ranks' Python)" in out.stdout, out.stdout
        assert "This cell runs without its breakpoints" in out.stdout and not out.error
        failed.run("%%distributed --targets 0\nsys.modules['debugpy'] = _debugpy")
        # the notebook's interrupt while rank 1 is stopped in the panel ends the cell; the ranks go on
        msg_id = failed.start(PANEL_CELL)
        panel.wait_event("stopped", timeout=120)
        failed.km.interrupt_kernel()
        out = failed.collect(msg_id, timeout=60)
        assert out.error and out.error["ename"] == "KeyboardInterrupt", out.shown
        assert "Interrupted: every rank received SIGINT and stopped" in out.shown, out.shown
        out = failed.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t)\nprint(float(t))")
        assert out.stdout.strip() == "2.0"
    finally:
        panel("disconnect", restart=False, terminateDebuggee=False)
