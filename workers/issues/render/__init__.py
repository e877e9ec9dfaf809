"""Every issue's Markdown, one module per kind: data in (:mod:`workers.issues.model`), text out.

- ``markdown``: the pieces (numbers with units, sparklines, cells, commit and PR links).
- ``regression``: a regression's issue and its recurrence comment; ``back``: the comment when
  its series is back.
- ``missing``: a missing-data issue and the comment when data arrived.
- ``failing``: a failing benchmark's issue and the comments when it runs again or its
  bisection answered.

Pure: no database, no network, no settings read.
"""
