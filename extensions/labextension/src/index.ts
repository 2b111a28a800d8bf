/**
 * trainhub JupyterLab extension: the side panel (plugin `trainhub:panel`), its main-area views
 * (jobs table, usage chart, a job's logs and metrics, TensorBoard; views.ts) and the idle-GPU
 * warning (plugin `trainhub:culler-notification`, in culler.ts) and this server's GPUs in the status bar
 * (plugin `trainhub:gpu-status`, in gpustatus.ts), and moves of this server by trainhub (plugins `trainhub:server-move`
 * and `trainhub:connection-lost`, in move.ts: one notice with progress, no "Server unavailable" dialog, the page
 * reconnects by itself), and trainhub's fields (GPUs, workers, time limit) in JupyterLab's Create Notebook Job form
 * (plugin `trainhub:notebook-job-options`, in jobform.ts).
 * Nothing is awaited in `activate`: the panel loads its data when first shown.
 *
 * Commands (also in the command palette, category "trainhub"): `trainhub:open-panel`,
 * `trainhub:open-jobs`, `trainhub:open-usage`; `trainhub:open-view` ({view, job}) reopens a view.
 *
 * The outputs of `%%train` and `%%sweep` cells are rendered here too (liveoutput.ts): the live widget while its kernel
 * holds it, else a live view of the job from the jobs API. A link `lab?trainhub-job=ID` (`trainhub-sweep=ID`), which
 * those outputs' static HTML carries, opens the jobs table on that job (sweep).
 */
import { ILabShell, ILayoutRestorer, IRouter, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';

import { TrainhubAPI } from './api';
import cullerNotification from './culler';
import gpuStatus from './gpustatus';
import notebookJobOptions from './jobform';
import { connectionLost, serverMove } from './move';
import { jobsIcon, trainhubIcon, usageIcon } from './icons';
import { ILiveOutputActions, liveOutputFactory, LIVE_OUTPUT_RANK, NotebookWidgets } from './liveoutput';
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

/** The command a `lab?trainhub-job=ID` link runs (through JupyterLab's router). */
const OPEN_LINK_COMMAND = 'trainhub:open-link';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'trainhub:panel',
  description: 'trainhub side panel (storage, datasets, models, jobs, usage) and its main-area views.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, ILabShell, IRenderMimeRegistry, IRouter],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    _labShell: ILabShell | null,
    rendermime: IRenderMimeRegistry | null,
    router: IRouter | null
  ) => {
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
    // %%train / %%sweep outputs: in each notebook with its own rendermime (which holds the widget renderer), elsewhere
    // (an output view, a console) with the application's
    const actions: ILiveOutputActions = {
      // after the click's own handling, which gives the notebook the focus (and would bring it back to the front)
      jobsTable: focus => window.setTimeout(() => views.jobsTable(focus), 0),
      logs: job => views.logs(job),
      metrics: job => views.metrics(job),
      tensorboard: jobs => views.tensorboard(jobs)
    };
    rendermime?.addFactory(liveOutputFactory(api, actions, null), LIVE_OUTPUT_RANK);
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel: any) => {
        const own: IRenderMimeRegistry | undefined = panel?.content?.rendermime;
        const session = panel?.sessionContext;
        if (!own || !session) {
          return;
        }
        const notebook = new NotebookWidgets(own, rendermime);
        session.statusChanged.connect((_: unknown, status: string) => {
          if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
            notebook.kernelEnded();
          }
        });
        session.kernelChanged.connect((_: unknown, change: { oldValue: { id: string } | null; newValue: { id: string } | null }) => {
          if (change.oldValue && change.oldValue.id !== change.newValue?.id) {
            notebook.kernelEnded(); // shut down or replaced (not the first kernel of a page)
          }
        });
        void session.ready.then(() => notebook.watch());
        own.addFactory(liveOutputFactory(api, actions, notebook), LIVE_OUTPUT_RANK);
      }
    });
    app.commands.addCommand(OPEN_LINK_COMMAND, {
      label: 'Open a trainhub link',
      execute: args => {
        const search = new URLSearchParams(String((args as any)?.search ?? window.location.search));
        const job = search.get('trainhub-job');
        const sweep = search.get('trainhub-sweep');
        if (job || sweep) {
          // once the restored layout is up, or it would bring its own tab back to the front
          void app.restored.then(() => views.jobsTable(job ? { job } : { sweep: sweep! }));
          search.delete('trainhub-job');
          search.delete('trainhub-sweep');
          const rest = search.toString();
          window.history.replaceState(null, '', window.location.pathname + (rest ? `?${rest}` : '') + window.location.hash);
        }
      }
    });
    router?.register({ command: OPEN_LINK_COMMAND, pattern: /[?&]trainhub-(job|sweep)=/, rank: 30 });
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

export default [plugin, cullerNotification, gpuStatus, serverMove, connectionLost, notebookJobOptions];
