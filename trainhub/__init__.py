"""trainhub: a JupyterHub-based notebook platform for deep-learning teams.

The core package holds what every part shares (settings, state, GPU pool, storage);
the design card's folders import beside it as ``trainhub.spawner``,
``trainhub.kernels``, ``trainhub.extensions``, ``trainhub.hub_config`` and
``trainhub.services``.
"""

__version__ = "0.1.0"
