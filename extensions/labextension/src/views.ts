/**
 * Opening the main-area views (jobs table, usage chart, a job's logs and metrics, TensorBoard) and
 * the job actions they share with the side panel. One tab per view and job: opening it again
 * brings the open tab to the front. Views other than TensorBoard are restored with the layout.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget, Notification, showErrorMessage, WidgetTracker } from '@jupyterlab/apputils';
import { IFrame, LabIcon, ToolbarButton } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IModelVersion, TrainhubAPI } from './api';
import { askModelName } from './dom';
import { IJobActions, JobsTable } from './jobs';
import { LogView, MetricsView } from './jobviews';
import { jobsIcon, launchIcon, logsIcon, metricsIcon, tensorboardIcon, usageIcon } from './icons';
import { startTensorBoard, tensorboardStatus } from './tensorboard';
import { UsageView } from './usage';

/** The command that reopens a view from its saved arguments (used by the layout restorer). */
export const OPEN_VIEW_COMMAND = 'trainhub:open-view';

export type ViewName = 'jobs' | 'usage' | 'logs' | 'metrics';

export interface IViewArgs {
  view: ViewName;
  job?: string;
}

export class Views implements IJobActions {
  constructor(
    private app: JupyterFrontEnd,
    readonly api: TrainhubAPI,
    readonly tracker: WidgetTracker<MainAreaWidget>
  ) {}

  private args = new WeakMap<Widget, IViewArgs>();
  private frames = new Map<string, IFrame>();

  /** The saved arguments of a tracked view (for the layout restorer). */
  argsOf(w: Widget): IViewArgs | undefined {
    return this.args.get(w);
  }

  private show(id: string, label: string, icon: LabIcon, make: () => Widget, args: IViewArgs | null): MainAreaWidget {
    const existing = this.tracker.find(w => w.id === id);
    if (existing) {
      this.app.shell.activateById(id);
      return existing;
    }
    const w = new MainAreaWidget({ content: make() });
    w.id = id;
    w.title.label = label;
    w.title.icon = icon;
    w.title.closable = true;
    if (args) {
      this.args.set(w, args);
    }
    this.app.shell.add(w, 'main');
    void this.tracker.add(w);
    this.app.shell.activateById(id);
    return w;
  }

  open(args: IViewArgs): MainAreaWidget {
    switch (args.view) {
      case 'usage':
        return this.usage();
      case 'logs':
        return this.show(`trainhub-logs-${args.job}`, `Logs ${args.job}`, logsIcon, () => new LogView(this.api, args.job!), args);
      case 'metrics':
        return this.show(`trainhub-metrics-${args.job}`, `Metrics ${args.job}`, metricsIcon, () => new MetricsView(this.api, args.job!), args);
      default:
        return this.jobsTable();
    }
  }

  /** The jobs table; `focus`: on one job, or on one sweep's trials (see JobsTable.focus). */
  jobsTable(focus?: { job?: string; sweep?: string }): MainAreaWidget {
    const w = this.show('trainhub-jobs', 'Jobs', jobsIcon, () => new JobsTable(this.api, this), { view: 'jobs' });
    if (focus) {
      (w.content as JobsTable).focus(focus);
    }
    return w;
  }

  usage(): MainAreaWidget {
    return this.show('trainhub-usage', 'GPU usage', usageIcon, () => new UsageView(this.api), { view: 'usage' });
  }

  logs(job: string): void {
    this.open({ view: 'logs', job });
  }

  metrics(job: string): void {
    this.open({ view: 'metrics', job });
  }

  /** Ask for a model name (JupyterLab dialog) and register the job's outputs under it. */
  async register(job: string): Promise<IModelVersion | null> {
    const name = await askModelName(job);
    if (!name) {
      return null;
    }
    try {
      const v = await this.api.registerModel({ name, job });
      Notification.success(`Registered the outputs of ${job} as ${v.name} v${v.version}`, { autoClose: 5000 });
      return v;
    } catch (error) {
      void showErrorMessage('Model not registered', error as Error);
      return null;
    }
  }

  /** One TensorBoard for `jobs` side by side, in a main-area tab (see tensorboard.ts for the API). */
  async tensorboard(jobs: string[]): Promise<void> {
    const status = await tensorboardStatus(this.api);
    if (!status.available) {
      void showErrorMessage('TensorBoard is not available', status.reason ?? '');
      return;
    }
    try {
      const session = await startTensorBoard(this.api, jobs);
      const id = `trainhub-tensorboard-${session.jobs.join('-')}`;
      const open = this.frames.get(id);
      if (open && !open.isDisposed) {
        open.url = session.url;
        this.app.shell.activateById(id);
        return;
      }
      const frame = new IFrame({ sandbox: ['allow-scripts', 'allow-same-origin', 'allow-forms', 'allow-downloads', 'allow-popups'] });
      frame.url = session.url;
      frame.addClass('th-tensorboard-frame');
      this.frames.set(id, frame);
      const w = new MainAreaWidget({ content: frame });
      w.id = id;
      w.title.label = `TensorBoard ${session.jobs.join(', ')}`;
      w.title.icon = tensorboardIcon;
      w.title.closable = true;
      w.toolbar.addItem(
        'open-tab',
        new ToolbarButton({ icon: launchIcon, label: 'Open in a browser tab', tooltip: session.url, onClick: () => window.open(session.url, '_blank') })
      );
      this.app.shell.add(w, 'main');
      this.app.shell.activateById(id);
    } catch (error) {
      void showErrorMessage('TensorBoard not opened', error as Error);
    }
  }
}
