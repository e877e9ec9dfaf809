"""Issues: every kind of alert filed through one pipeline, report → render → tracker.

- ``kind``: what a kind is to the pipeline (a row); ``kinds``: the table, one row per kind.
- ``filing``: :func:`~workers.issues.filing.file_alert` for every kind; ``pending``: the
  durable filing state around it (retry, backoff, outbox); ``filing_state``: its moves.
- ``reports/``: queries, returning ``model``'s dataclasses; ``render/``: pure Markdown.
- ``trackers/``: GitHub and the choice of tracker; ``outbox``: Markdown files on disk;
  ``markers``: the fingerprint and comment markers an issue body carries.
- ``records``: a regression's issue as a stored record; ``back``, ``missing``, ``failing``:
  what each kind keeps between nights (told, arrived, streaks); ``failing_bisect``: a failing
  benchmark's bisection started and its answer told; ``sync``: triage read back.
"""
