"""The boundary between users, and between users and the platform (the embedded back end).

Every per-user file, process and network action of the platform goes through this package:

- :mod:`.accounts`: each user's Unix account (``useradd`` on demand) and :func:`~.accounts.fs_identity`;
- :mod:`.files`: :class:`~.files.UserTree`, a user's folder opened once and walked with directory
  descriptors as that user (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``), never by path;
- :mod:`.isolation`: the bubblewrap sandbox and account switch of every server and job worker;
- :mod:`.network`: each user's own network namespace and the gate, the only way out of it;
- :mod:`.envexec`: a job's environment handed over after the switch to its account;
- :mod:`.warmsandbox`: what pre-started (warm) servers and workers take on when claimed;
- :mod:`.procs`: finding and ending the processes of a user, a job or a platform run.

:class:`~.asuser.AsUser` is the one "act as this user" primitive the services and the spawner use. Nothing
outside this package calls ``setfsuid``, ``setpriv``, ``bwrap`` or ``nsenter``, or walks a user's folder by
path (tests/architecture/test_boundary.py says so).
"""
