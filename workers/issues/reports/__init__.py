"""What each kind of issue says, read from stored rows: queries only, returning
:mod:`workers.issues.model` dataclasses.

- ``regression``: a regression alert's issues, one per cause; ``causes``: the stored bisection's
  answer and the regressions grouped by it.
- ``missing``: a missing-data alert's issues and the data that came since.
- ``failing``: a failing-benchmark alert's issues, the benchmarks running again, the failure
  bisections' answers.
"""
