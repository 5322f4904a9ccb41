"""The SIGINT count every driver's wait loop keeps (jdist.kernel.supervise.sigint): in this process, no cluster."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from conftest import sigint_in_a_destructor

from jdist.kernel.supervise.sigint import SigintCount


def test_an_interrupt_python_dropped_in_a_destructor_is_raised_again(monkeypatch):
    # in this process, no cluster: a SIGINT whose handler runs inside a destructor (as inside pyzmq's Frame
    # __dealloc__ in the kernel, seen in test runs) has its KeyboardInterrupt printed and dropped by Python
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))

    with SigintCount() as sigints:
        sigint_in_a_destructor()
        assert dropped == [KeyboardInterrupt]  # Python's own handling: lost
        with pytest.raises(KeyboardInterrupt):
            sigints.check()  # the wait loop's next turn raises it again
        sigints.handled()
        sigints.check()  # once
    assert signal.getsignal(signal.SIGINT) != sigints._on_sigint  # the handler before is back


def test_the_sigint_count_leaves_the_decision_to_the_handler_before():
    # jdist run's handler: the first Ctrl-C is a KeyboardInterrupt, a second ends the ranks (its own exception),
    # and once it is ending, more are ignored
    class Ending(Exception):
        pass

    calls = []

    def before(signum, frame):
        calls.append(signum)
        if len(calls) == 1:
            raise KeyboardInterrupt
        if len(calls) == 2:
            raise Ending

    old = signal.signal(signal.SIGINT, before)
    try:
        with SigintCount() as sigints:
            for expected in (KeyboardInterrupt, Ending, None):
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.5)
                except (KeyboardInterrupt, Ending) as exc:
                    assert type(exc) is expected
                else:
                    assert expected is None
            assert (sigints.count, len(calls)) == (1, 3)  # only the KeyboardInterrupt is the wait loop's
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, old)
