"""The `trainhub` hub service: batch jobs (and, on top of them, sweeps).

Modules: ``models`` (tables), ``spec`` (validating job specs), ``store`` (database access,
off the event loop), ``launcher`` (the back-end contract) and ``local`` (local processes),
``engine`` (queue, gang start, monitoring), ``handlers`` (REST API), ``app`` (the service).
"""
