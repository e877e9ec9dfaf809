"""One night: plan, jobs, finish, triage, stability."""
