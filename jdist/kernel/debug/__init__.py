"""Debugging ranks from the notebook (the kernel's side; the ranks' side is :mod:`jdist.rank.debug.relay` and
:mod:`jdist.rank.debug.dap`):

- :mod:`~jdist.kernel.debug.hooks`: what a running cell does for the debuggers, as hooks the cell supervisor
  polls (:class:`~jdist.kernel.debug.hooks.PdbHook`: ``breakpoint()`` with a pdb prompt in the notebook;
  :class:`~jdist.kernel.debug.hooks.DapHook`: JupyterLab's Debugger panel);
- :mod:`~jdist.kernel.debug.dapbridge`: the Debugger panel's protocol bridged to the ranks;
- :mod:`~jdist.kernel.debug.postmortem`: ``%dist debug``, pdb on a failed cell's frames.
"""
