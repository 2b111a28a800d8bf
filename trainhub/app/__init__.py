"""The composition root: where trainhub's parts are wired together.

The parts (``trainhub.services``, ``trainhub.spawner``, ``trainhub.extensions``,
``trainhub.kernels``) never import one another; the modules here, and the hub's configuration
(``trainhub.hub_config``), may import every part:

- :mod:`trainhub.app.up`: ``trainhub up``, the embedded platform in the foreground;
- :mod:`trainhub.app.chart_config`: the Helm chart's ``trainhub.json`` as traitlets config for
  the services that run in the cluster (the chart's ``services_config.py`` applies it).

docs/architecture.md lists the layers and the arrows allowed between them.
"""
