"""The idle-GPU culler: returns GPUs of idle notebook servers to the pool, never kills running work.

- :mod:`.policy` — pure, time-seamed decision logic (also replayed by benchmarks/culler_bench.py)
- :mod:`.service` — the JupyterHub-managed service process (``python -m trainhub.services.culler``)
- :mod:`.handlers` — its small HTTP API (metrics, decisions, keep, warnings)
- :mod:`.models` — the ``culler_events`` audit-trail table

See docs/culler.md.
"""
