# trainhub: loads the %%train magics in every kernel of a platform notebook pod.
# Mounted by the hub's spawner (GPUKubeSpawner.kernel_config_map) at /etc/ipython/ipython_kernel_config.py,
# a system-wide IPython config path, so no file in the user's home is needed. Only where the spawner set
# $TRAINHUB_API_URL; a kernel without trainhub installed logs the failed extension and runs on.
import os

if os.environ.get("TRAINHUB_API_URL"):
    c.InteractiveShellApp.extensions.append("trainhub.kernels")  # noqa: F821 (IPython's config object)
# a notebook's variables kept across a release come back in its next kernel (trainhub.kernels.snapshot)
if os.environ.get("TRAINHUB_SNAPSHOT_DIR") and os.environ.get("JPY_SESSION_NAME"):
    c.InteractiveShellApp.extensions.append("trainhub.kernels.snapshot")  # noqa: F821
