"""A pull request's A/B: its merge base and its head built, measured interleaved, and judged.

- :mod:`workers.ab.verdicts`: per benchmark and metric, the ratio head/base with its interval,
  the p-value over processes and the verdict at the metric's threshold (pure).
- :mod:`workers.ab.measure`: the two builds measured side by side (A B, B A, … one process a
  turn), latency and peak memory from each suite process, instructions from a counted one.
- :mod:`workers.ab.run`: builds, measures and judges one A/B (:func:`~workers.ab.run.run_ab`).
- :mod:`workers.ab.store`: the ``ab_tests`` row and its two runs of kind ``ab``.
- :mod:`workers.ab.report`: the PR comment and the commit status it is reported as.
- :mod:`workers.ab.github`: reading the PR and writing the comment and the status (PyGithub).
- :mod:`workers.ab.reporting`: reporting durably: an A/B whose report GitHub refused is kept
  and retried.
"""
