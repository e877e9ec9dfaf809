"""Issues: what a filed issue says, its Markdown, filing, sync, trackers.

- ``model``: the issue as plain data; ``markers``: its fingerprint and hidden markers.
- ``markdown``, ``render``: its text.
- ``causes``: the bisection's findings and the regressions grouped by cause; ``report``: an
  issue's content read from stored results.
- ``github``, ``outbox``: the two trackers, behind ``tracker`` (the protocol and the choice).
- ``filing``: file, or comment on, the issues of an alert; ``sync``: triage read back.
"""
