/**
 * trainhub JupyterLab extension: the side panel (plugin `trainhub:panel`), its main-area views
 * (jobs table, usage chart, a job's logs and metrics, TensorBoard; views.ts) and the idle-GPU
 * warning (plugin `trainhub:culler-notification`, in culler.ts) and this server's GPUs in the status bar
 * (plugin `trainhub:gpu-status`, in gpustatus.ts), and moves of this server by trainhub (plugins `trainhub:server-move`
 * and `trainhub:connection-lost`, in move.ts: one notice with progress, no "Server unavailable" dialog, the page
 * reconnects by itself).
 * Nothing is awaited in `activate`: the panel loads its data when first shown.
 *
 * Commands (also in the command palette, category "trainhub"): `trainhub:open-panel`,
 * `trainhub:open-jobs`, `trainhub:open-usage`; `trainhub:open-view` ({view, job}) reopens a view.
 */
import { ILabShell, ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';

import { TrainhubAPI } from './api';
import cullerNotification from './culler';
import gpuStatus from './gpustatus';
import { connectionLost, serverMove } from './move';
import { jobsIcon, trainhubIcon, usageIcon } from './icons';
import { TrainhubPanel } from './panel';
import { IViewArgs, OPEN_VIEW_COMMAND, Views } from './views';

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
  description: 'trainhub side panel (storage, datasets, models, jobs, usage) and its main-area views.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, ILabShell],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null, palette: ICommandPalette | null) => {
    const api = new TrainhubAPI(app.serviceManager.serverSettings);
    const tracker = new WidgetTracker<MainAreaWidget>({ namespace: 'trainhub-views' });
    const views = new Views(app, api, tracker);
    const panel = new TrainhubPanel({ api, views, insertCode: code => insertCode(app, code) });
    panel.title.icon = trainhubIcon;
    app.shell.add(panel, 'left', { rank: 600 });

    app.commands.addCommand('trainhub:open-panel', {
      label: 'Show the trainhub panel',
      icon: trainhubIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    app.commands.addCommand('trainhub:open-jobs', {
      label: 'Open the jobs table',
      caption: 'Your trainhub jobs: sort, filter by state, logs, metrics, TensorBoard, register models',
      icon: jobsIcon,
      execute: () => views.jobsTable()
    });
    app.commands.addCommand('trainhub:open-usage', {
      label: 'Open the GPU usage chart',
      caption: 'GPU-hours held vs. used per day',
      icon: usageIcon,
      execute: () => views.usage()
    });
    app.commands.addCommand(OPEN_VIEW_COMMAND, {
      label: 'Open a trainhub view',
      execute: args => views.open(args as unknown as IViewArgs)
    });
    for (const command of ['trainhub:open-panel', 'trainhub:open-jobs', 'trainhub:open-usage']) {
      palette?.addItem({ command, category: 'trainhub' });
    }
    if (restorer) {
      restorer.add(panel, 'trainhub-panel');
      void restorer.restore(tracker, {
        command: OPEN_VIEW_COMMAND,
        args: w => ({ ...(views.argsOf(w) ?? { view: 'jobs' }) }),
        name: w => w.id
      });
    }
  }
};

export default [plugin, cullerNotification, gpuStatus, serverMove, connectionLost];
