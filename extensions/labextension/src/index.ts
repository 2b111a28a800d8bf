/**
 * trainhub JupyterLab extension: the side panel (plugin `trainhub:panel`) and the idle-GPU
 * warning (plugin `trainhub:culler-notification`, in culler.ts).
 * Nothing is awaited in `activate`: the panel loads its data when first shown.
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin, ILayoutRestorer } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { TrainhubAPI } from './api';
import cullerNotification from './culler';
import { TrainhubPanel } from './panel';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16"><path class="jp-icon3" fill="#616161" d="M4 4h16v4H4zm0 6h10v4H4zm0 6h16v4H4z"/></svg>';
const icon = new LabIcon({ name: 'trainhub:icon', svgstr: ICON_SVG });

/** Put `code` into a new cell below the active one of the current notebook. */
function insertCode(app: JupyterFrontEnd, code: string): boolean {
  const current: any = app.shell.currentWidget;
  const notebook = current?.content;
  if (!notebook || typeof notebook.activeCellIndex !== 'number' || !notebook.model?.sharedModel) {
    return false;
  }
  const index = notebook.widgets.length ? notebook.activeCellIndex + 1 : 0;
  notebook.model.sharedModel.insertCell(index, { cell_type: 'code', source: code });
  notebook.activeCellIndex = index;
  return true;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'trainhub:panel',
  description: 'trainhub side panel: storage, datasets, models, jobs.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, ILabShell],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null, palette: ICommandPalette | null) => {
    const api = new TrainhubAPI(app.serviceManager.serverSettings);
    const panel = new TrainhubPanel({ api, insertCode: code => insertCode(app, code) });
    panel.title.icon = icon;
    app.shell.add(panel, 'left', { rank: 600 });
    if (restorer) {
      restorer.add(panel, 'trainhub-panel');
    }
    app.commands.addCommand('trainhub:open-panel', {
      label: 'Show the trainhub panel',
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: 'trainhub:open-panel', category: 'trainhub' });
  }
};

export default [plugin, cullerNotification];
