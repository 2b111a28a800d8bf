"""JupyterHub configuration for trainhub: authenticator, scopes and roles, services.

``jupyterhub_config.py`` is the file `trainhub up` passes to ``jupyterhub -f``; the
Helm chart loads :func:`trainhub.hub_config.scopes.custom_scopes` the same way.
"""

import os

CONFIG_FILE = os.path.join(os.path.dirname(__file__), "jupyterhub_config.py")
