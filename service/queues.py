"""The Celery queues' names: one spelling for the workers' app and the status that counts them.

``control`` carries orchestration, ``cpu`` the CPU benchmarks, ``gpu.<class>`` a GPU class's
(``gpu.default`` when the class is not named).
"""

from __future__ import annotations

GPU_CLASSES = ("a100", "h100", "h200", "l4", "t4")
QUEUE_NAMES = ("cpu", "control", "gpu.default", *(f"gpu.{c}" for c in GPU_CLASSES))
