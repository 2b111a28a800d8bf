# JupyterHub configuration used by `trainhub up` (the embedded, single-machine back end).
#
# Everything machine-specific comes from the data dir (``$TRAINHUB_DATA_DIR``):
# trainhub.json written by `trainhub up`, then the admin's trainhub_config.py.
import os

from trainhub.hub_config.embedded import configure

c = get_config()  # noqa: F821
configure(c, os.environ["TRAINHUB_DATA_DIR"])
