"""``jdist run`` as a front end: the options it honours, and why it refuses the others (one line each).

>>> from jdist.plugins import option_table
>>> option_table().refusal(SCRIPT, "targets")
'jdist run does not take --targets: the script runs on every rank (select ranks inside it: if rank == 0).'
"""

from __future__ import annotations

from jdist.options import Frontend

#: ``jdist run`` as a front end (:class:`jdist.options.Frontend`): the options it honours; the others are
#: refused with one line each (an option added later is refused until this says otherwise).
SCRIPT = Frontend(
    "jdist run",
    honours=frozenset({"n", "gpus", "backend", "launcher", "encrypt", "timeout", "port", "threads", "precision",
                       "watchdog", "interrupt_grace", "start_timeout", "output", "run_dir", "cluster",
                       "auto_metrics", "mesh", "elastic"}),
    plugins=frozenset({"launcher", "backend", "sink"}),
    refuses={
        "targets": "the script runs on every rank (select ranks inside it: if rank == 0)",
        "no_dashboard": "the terminal shows the live panel or plain lines instead (--no-live)",
        "restart": "each jdist run starts its own ranks",
        "auto_restart": "the run ends when a rank dies (jdist run again, or train with jdist.checkpoint_every)",
        "debug_ranks": "breakpoint() prompts need a notebook (%%distributed --debug-ranks, or %dist attach a "
                       "jdist run --keep)",
    },
)
