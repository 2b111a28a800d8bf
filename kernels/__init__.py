"""trainhub's IPython extension: ``%load_ext trainhub.kernels`` adds ``%%train``, ``%train`` and ``%%sweep``.

Loaded automatically in platform notebooks by the startup file that
:func:`trainhub.kernels.startup.install_ipython_startup` writes. Importing this package does
nothing else: the magics, widgets and API client load when the extension does.
"""


def load_ipython_extension(ipython):
    from trainhub.kernels.magics import TrainMagics, help_cells

    ipython.register_magics(TrainMagics)
    if help_cells not in ipython.input_transformers_cleanup:  # `%%train --help` alone in a cell prints the usage
        ipython.input_transformers_cleanup.append(help_cells)

    from trainhub.kernels.sweep import SweepMagics

    ipython.register_magics(SweepMagics)


def unload_ipython_extension(ipython):
    from trainhub.kernels.magics import help_cells

    if help_cells in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(help_cells)
    # IPython has no unregister: drop the names this extension added
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("train", None)
        ipython.magics_manager.magics[kind].pop("sweep", None)
