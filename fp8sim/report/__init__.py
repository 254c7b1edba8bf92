"""Evidence: the reports, the conformance sweep and the studies (the room above the integrations).

- :mod:`.build`: ``formats_table``, ``write_compare_report`` (a capture against the emulator) and
  ``build_default_report`` (``fp8sim report``, the main job), published whole by ``publish_dir``;
- :mod:`.conformance`: the backend sweep of ``fp8sim verify``;
- :mod:`.training_study`: ``fp8sim study``, a small model trained under every recipe (was ``fp8sim.study``);
- :mod:`.distributed_study`: ``fp8sim study --distributed`` (was ``fp8sim.distributed.study``).

The error-vs-K study of the GEMM models stays with them (:mod:`fp8sim.gemm.study`).
"""

from __future__ import annotations

from .build import DEFAULT_OUT, build_default_report, formats_table, publish_dir, write_compare_report

__all__ = ["formats_table", "write_compare_report", "build_default_report", "publish_dir", "DEFAULT_OUT"]
