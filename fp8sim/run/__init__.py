"""``fp8sim run``: unchanged TransformerEngine scripts on fp8sim.

:mod:`.shim` makes ``import transformer_engine`` resolve to :mod:`fp8sim.pytorch` (``install()``,
``uninstall()``); ``_runargs`` parses the command line of ``fp8sim run``; ``_device_map`` routes
CUDA device arguments to the CPU (``--device-map cuda=cpu``).  ``fp8sim.shim`` is this room's
:mod:`.shim` under its old name.
"""
