"""A rank's fd 2 through a file (jdist/rank/stderr.py, jdist/common/last_words.py): what it forwards, in order,
and what is left for the kernel when it dies. Each case runs in a child process (capture moves fd 2); the
stream there stands in for an engine's ipykernel OutStream (its write, flush and fd watch flag). In a real
engine, with the kernel's error: test_faults.py (a cell), test_cli.py (a script), test_cluster.py (set-up),
test_multinode.py (a rank on another host), test_launch_remote.py (the remote shell)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from jdist.common.last_words import unshown

CHILD = """
import os, sys, time, types
from jdist.rank import stderr
got = []
stream = types.SimpleNamespace(_should_watch={watching}, write=got.append, flush=lambda: None)
assert stderr.capture({path!r}, stream) and not stderr.capture({path!r}, stream)
"""


def child(tmp_path: Path, body: str, watching: bool = True) -> tuple[subprocess.CompletedProcess, Path]:
    path = tmp_path / "stderr-1"
    code = CHILD.format(path=str(path), watching=watching) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60), path


def test_what_a_rank_wrote_just_before_it_aborted_is_left_for_the_kernel_and_nothing_it_sent(tmp_path):
    out, path = child(tmp_path, """
        os.write(2, b"warming up\\n")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:  # the thread forwards within 0.1 s
            time.sleep(0.01)
        print(got, flush=True)
        os.write(2, b"terminate called after throwing an instance of 'c10::Error'\\n  what():  boom\\n")
        os.abort()
    """)
    assert out.returncode == -6 and out.stdout.strip() == "['warming up\\n']", out
    assert out.stderr == ""  # fd 2 went to the file
    assert unshown(str(path)) == "terminate called after throwing an instance of 'c10::Error'\n  what():  boom"


def test_a_flush_forwards_at_once_in_order_and_the_file_starts_again_after_rotate_bytes(tmp_path):
    out, path = child(tmp_path, """
        stderr.ROTATE_BYTES = 1000
        for i in range(30):
            os.write(2, f"line {i:03d} ".encode() + b"x" * 90 + b"\\n")
            if i % 7 == 0:
                stream.flush()  # as the kernel does before a cell's reply
        stream.flush()
        text = "".join(got)
        assert text == "".join(f"line {i:03d} " + "x" * 90 + "\\n" for i in range(30)), text
        assert os.path.getsize({path!r}) < 1000  # started again
        os.write(2, "été\\n".encode())
        os._exit(3)
    """.replace("{path!r}", repr(str(tmp_path / "stderr-1"))))
    assert out.returncode == 3, out
    assert unshown(str(path)) == "été"


def test_a_stream_that_did_not_watch_fd_2_echoes_to_the_original_and_other_streams_are_left_alone(tmp_path):
    # ipykernel's OutStream does not watch fd 2 under pytest: C-level output went to the original fd 2 only
    out, _ = child(tmp_path, """
        os.write(2, b"to both\\n"); stream.flush()
        stderr._capture = None
        print(got, stderr.capture({path!r}, types.SimpleNamespace(write=print, flush=print)))
    """.replace("{path!r}", repr(str(tmp_path / "again"))), watching=False)
    assert out.stdout.strip() == "['to both\\n'] False" and out.stderr == "to both\n", out


def test_a_file_that_cannot_be_made_leaves_fd_2_as_it_was_with_one_line(tmp_path):
    code = ("import os, types; from jdist.rank import stderr\n"
            "s = types.SimpleNamespace(_should_watch=True, write=print, flush=lambda: None)\n"
            f"print(stderr.capture({str(tmp_path / 'no' / 'such' / 'f')!r}, s)); os.write(2, b'still fd 2\\n')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out
    assert out.stderr.splitlines()[0].startswith("jdist: the rank's stderr stays a pipe (")
    assert out.stderr.splitlines()[1:] == ["still fd 2"], out


def test_ipykernels_own_fd_2_reader_sends_what_it_held_then_ends_and_the_stream_closes(tmp_path):
    # an engine's real OutStream, watching fd 2 as it does outside pytest (watchfd="force" here: ipykernel does
    # not watch under pytest); what was in its pipe at the switch still arrives, before what follows
    code = textwrap.dedent(f"""
        import os, time, zmq
        from ipykernel.iostream import IOPubThread, OutStream
        from jupyter_client.session import Session
        from jdist.rank import stderr
        pub = IOPubThread(zmq.Context.instance().socket(zmq.PUB)); pub.start()
        stream = OutStream(Session(), pub, "stderr", watchfd="force")
        got = []
        stream.write = got.append
        os.write(2, b"in ipykernel's pipe\\n")
        assert stderr.capture({str(tmp_path / "stderr-0")!r}, stream)
        os.write(2, b"in the file\\n"); stream.flush()
        assert "".join(got) == "in ipykernel's pipe\\nin the file\\n", got
        assert not stream.watch_fd_thread.is_alive() and stream._fid is None
        t = time.monotonic(); stream.close(); print("closed in", round(time.monotonic() - t, 1), "s")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "closed in 0.0 s", out


def test_a_forked_child_writes_to_the_same_file_and_the_rank_alone_forwards_it(tmp_path):
    # a DataLoader worker: it inherits fd 2 and the read descriptor (one offset); its exit flushes sys.stderr
    out, path = child(tmp_path, """
        pid = os.fork()
        if pid == 0:
            os.write(2, b"from the worker\\n"); stream.flush(); os._exit(0)
        os.waitpid(pid, 0)
        os.write(2, b"from the rank\\n"); stream.flush()
        print(got, open({path!r} + ".pos").read().strip(), flush=True)
    """.replace("{path!r}", repr(str(tmp_path / "stderr-1"))))
    assert out.stdout.strip() == "['from the worker\\nfrom the rank\\n'] 30", out
    assert unshown(str(path)) == ""
