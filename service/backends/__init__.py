"""Backends run jobs: `local` (subprocesses) and `argo` (Workflows). One interface, in base.py."""
