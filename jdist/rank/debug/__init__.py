"""Debugging on a rank (the kernel's side is :mod:`jdist.kernel.debug`):

- :mod:`~jdist.rank.debug.relay`: pdb on the last failed cell's traceback (``%dist debug``), and
  ``breakpoint()`` in a running cell relayed to the notebook's input box;
- :mod:`~jdist.rank.debug.dap`: debugpy in the rank for JupyterLab's Debugger panel.
"""
