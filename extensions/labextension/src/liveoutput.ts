/**
 * The output of a `%%train` or `%%sweep` cell, live whatever became of the kernel that made it.
 *
 * The kernel side (trainhub.kernels.widget, kernels/sweep.py) displays one MIME bundle per panel: the ipywidgets
 * view, `text/plain` and `text/html` (a static form of the job: state, metrics summary, last log lines) and
 * `application/vnd.trainhub.job+json` (or `...sweep+json`: the same as JSON, with the job's id). A widget lives only
 * as long as its kernel: after a kernel restart, or in a notebook reopened later, JupyterLab's widget renderer would
 * read "Error displaying widget: model not found". This renderer is ranked ahead of the widget's (-10), so
 * JupyterLab hands it these outputs; it shows
 *
 * - the live widget, as long as the kernel holds its model (the ipywidgets renderer, from the notebook's own
 *   rendermime, in this output; a page reloaded with the kernel alive restores it), and otherwise
 * - a live view of the job (or sweep) drawn first from the saved JSON, then from the jobs API every few seconds
 *   until the job ends: state, elapsed time, devices, reason, last metric values, the last log lines, and buttons to
 *   its logs, metrics, TensorBoard, the jobs table and Cancel while it runs.
 *
 * It switches between the two as the widget appears or goes (a MutationObserver on the widget renderer). Only the
 * JSON's ids and texts are read (as text), never its HTML or links, so the factory is safe for untrusted notebooks
 * (the widget is shown for trusted outputs only, as JupyterLab does).
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { Panel, Widget } from '@lumino/widgets';

import { IJob, IMetrics, ISweep, ITrial, TrainhubAPI } from './api';
import { button, el, noun, plural } from './dom';
import { jobsIcon, logsIcon, metricsIcon, stopIcon, tensorboardIcon } from './icons';

export const JOB_MIME = 'application/vnd.trainhub.job+json';
export const SWEEP_MIME = 'application/vnd.trainhub.sweep+json';
export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';
/** Ahead of ipywidgets' renderer (rank -10), so these outputs come here first. */
export const LIVE_OUTPUT_RANK = -20;
/** Seconds between two reads of a running job or sweep. */
const REFRESH_MS = 2_000;
/** Metrics are read every so many refreshes (they are the biggest answer), and once the job has ended. */
const METRICS_EVERY = 3;
const LOG_LINES = 10;
const ACTIVE = new Set(['queued', 'running']);

/** What a live output may do besides reading the API (the side panel's views). */
export interface ILiveOutputActions {
  /** The jobs table on one job, or on a sweep's trials. */
  jobsTable(focus: { job?: string; sweep?: string }): void;
  logs(job: string): void;
  metrics(job: string): void;
  tensorboard(jobs: string[]): Promise<void>;
}

export interface IStaticJob {
  version: number;
  kind: 'job';
  id: string;
  job: Partial<IJob>;
  logs: string[];
  metrics: Record<string, [number, number]>;
}

export interface IStaticSweep {
  version: number;
  kind: 'sweep';
  id: string;
  sweep: Partial<ISweep>;
  trials: Record<string, unknown>[];
}

/** "2026-11-21T20:01:02.123Z [0] text" -> "20:01:02 [0] text" (as the kernel side shortens them). */
export function shortLogLine(line: string): string {
  const m = /^(\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d))\S*\s+(\[\d+\])\s?(.*)$/.exec(line);
  return m ? `${m[2]} ${m[3]} ${m[4]}` : line;
}

/** {metric: [step, last value]} of worker 0 (the lead) when several report, as the kernel side charts them. */
export function lastMetrics(m: IMetrics): Record<string, [number, number]> {
  const workers = new Set(m.metrics.map(r => r.worker ?? 0));
  const lead = workers.has(0) ? 0 : Math.min(...Array.from(workers));
  const out: Record<string, [number, number]> = {};
  m.metrics.forEach((r, i) => {
    if (workers.size > 1 && (r.worker ?? 0) !== lead) {
      return;
    }
    for (const [k, v] of Object.entries(r.values)) {
      if (typeof v === 'number' && Number.isFinite(v)) {
        out[k] = [r.step ?? i, v];
      }
    }
  });
  return out;
}

function num(v: number): string {
  return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
}

/** "elapsed 1:02:03", "waiting 02:05" (the kernel side's clock style). */
export function timing(job: Partial<IJob>, now = Date.now()): string {
  const clock = (s: number) => {
    const t = Math.max(0, Math.floor(s));
    const h = Math.floor(t / 3600);
    const m = Math.floor((t % 3600) / 60);
    const sec = t % 60;
    const mm = String(m).padStart(2, '0');
    const ss = String(sec).padStart(2, '0');
    return h ? `${h}:${mm}:${ss}` : `${mm}:${ss}`;
  };
  if (job.started) {
    const end = job.finished ? Date.parse(job.finished) : now;
    return `elapsed ${clock((end - Date.parse(job.started)) / 1000)}`;
  }
  if (job.created && job.state && ACTIVE.has(job.state)) {
    return `waiting ${clock((now - Date.parse(job.created)) / 1000)}`;
  }
  return 'elapsed -';
}

/** "1 GPU x 2 workers (devices 0 | 1)". */
export function devicesText(job: Partial<IJob>): string {
  const gpus = job.gpus ?? null;
  const text = `${gpus === null ? '? GPUs' : plural(gpus, 'GPU')} x ${plural(job.workers ?? 1, 'worker')}`;
  const devices = job.devices ?? [];
  return devices.length ? `${text} (devices ${devices.map(w => w.join(',') || '-').join(' | ')})` : text;
}

/** A live view's refreshing: a lumino Poll while the job or sweep is active, stopped once it has ended. */
abstract class LiveCard extends Widget {
  constructor(
    protected api: TrainhubAPI,
    protected actions: ILiveOutputActions,
    readonly itemId: string,
    kind: string
  ) {
    super();
    this.addClass('th-live-card');
    this.addClass(`th-live-${kind}`);
    this.node.dataset.id = itemId;
    this.note = el('div', { class: 'th-live-note' });
    this.poll = new Poll({
      factory: () => this.refresh(),
      frequency: { interval: REFRESH_MS, backoff: true, max: 30_000 },
      // only while this view is on screen (the live widget shown instead, a hidden browser tab: no reads)
      standby: () => !this.isVisible || document.hidden,
      name: `trainhub:live-output:${itemId}`
    });
  }

  /** Read at once when first shown (the saved form is on show until then). */
  protected onAfterShow(): void {
    if (!this.reads && !this.poll.isDisposed) {
      void this.poll.refresh();
    }
  }

  protected onAfterAttach(): void {
    this.onAfterShow();
  }

  protected note: HTMLElement;
  private poll: Poll;
  protected reads = 0;

  dispose(): void {
    this.poll.dispose();
    super.dispose();
  }

  /** One read of the API; the view then says "live"; an error keeps the last form and says why. */
  async refresh(): Promise<void> {
    try {
      const active = await this.load();
      this.reads++;
      this.note.textContent = active ? `live: read every ${REFRESH_MS / 1000} s from the jobs API` : 'final: read from the jobs API';
      this.note.classList.remove('th-error');
      if (!active) {
        this.poll.dispose();
      }
    } catch (error) {
      this.note.textContent = `as saved in the notebook (the jobs API did not answer: ${error instanceof Error ? error.message : error})`;
      this.note.classList.add('th-error');
      throw error; // the poll backs off
    }
  }

  /** Read and draw; resolves whether the job or sweep is still active. */
  protected abstract load(): Promise<boolean>;
}

export class JobCard extends LiveCard {
  constructor(api: TrainhubAPI, actions: ILiveOutputActions, data: IStaticJob) {
    super(api, actions, data.id, 'job');
    this.job = { ...data.job, id: data.id };
    this.lines = data.logs ?? [];
    this.last = data.metrics ?? {};
    this.draw();
  }

  private job: Partial<IJob>;
  private lines: string[];
  private last: Record<string, [number, number]>;

  setStatic(data: IStaticJob): void {
    if (!this.reads) {
      this.job = { ...data.job, id: data.id };
      this.lines = data.logs ?? [];
      this.last = data.metrics ?? {};
      this.draw();
    }
  }

  protected async load(): Promise<boolean> {
    const job = await this.api.job(this.itemId);
    const active = ACTIVE.has(job.state);
    const [text, metrics] = await Promise.all([
      this.api.jobLogs(this.itemId, LOG_LINES * 4),
      active && this.reads % METRICS_EVERY ? Promise.resolve(null) : this.api.jobMetrics(this.itemId)
    ]);
    this.job = job;
    this.lines = text.split('\n').filter(l => l.trim()).slice(-LOG_LINES).map(shortLogLine);
    if (metrics) {
      this.last = lastMetrics(metrics);
    }
    this.draw();
    return active;
  }

  private draw(): void {
    const j = this.job;
    const state = j.state ?? '?';
    const head = el(
      'div',
      { class: 'th-live-head' },
      el('strong', {}, this.itemId),
      j.name ? ` ${j.name}` : '',
      ' · ',
      el('span', { class: `th-live-state th-live-state-${state}` }, state),
      ` · ${timing(j)} · ${devicesText(j)}`,
      j.profile ? ` · profile ${j.profile}` : '',
      (j.attempt ?? 1) > 1 ? ` · attempt ${j.attempt}` : ''
    );
    const parts: HTMLElement[] = [head];
    if (j.reason && state !== 'running') {
      parts.push(el('div', { class: 'th-live-reason' }, j.reason));
    }
    if (j.outputs_url && !ACTIVE.has(state)) {
      parts.push(el('div', { class: 'th-live-reason' }, 'outputs: ', el('code', {}, j.outputs_url)));
    }
    const metrics = Object.entries(this.last);
    if (metrics.length) {
      parts.push(el('div', { class: 'th-live-metrics' }, 'metrics: ' + metrics.map(([k, [x, v]]) => `${k} ${num(v)} (step ${num(x)})`).join(', ')));
    }
    parts.push(el('pre', { class: 'th-live-log' }, this.lines.length ? this.lines.join('\n') : '(no log output yet)'));
    const actions = el('div', { class: 'th-live-actions' });
    actions.append(
      button({ title: `Show ${this.itemId} in the jobs table`, icon: jobsIcon, label: 'Jobs table', className: 'th-live-jobs' }, () =>
        this.actions.jobsTable({ job: this.itemId })
      ),
      button({ title: `Open the logs of ${this.itemId}`, icon: logsIcon, label: 'Logs', className: 'th-live-logs' }, () => this.actions.logs(this.itemId)),
      button({ title: `Chart the metrics of ${this.itemId}`, icon: metricsIcon, label: 'Metrics', className: 'th-live-metrics-btn' }, () =>
        this.actions.metrics(this.itemId)
      )
    );
    if (state !== 'queued') {
      actions.append(
        button({ title: `Open TensorBoard for ${this.itemId}`, icon: tensorboardIcon, label: 'TensorBoard', className: 'th-live-tensorboard' }, () =>
          void this.actions.tensorboard([this.itemId])
        )
      );
    }
    if (ACTIVE.has(state)) {
      actions.append(
        button({ title: `Cancel ${this.itemId}`, icon: stopIcon, label: 'Cancel', className: 'th-live-cancel' }, () => void this.cancel())
      );
    }
    parts.push(actions, this.note);
    this.node.replaceChildren(...parts);
  }

  private async cancel(): Promise<void> {
    try {
      this.job = await this.api.cancelJob(this.itemId);
      this.draw();
      this.note.textContent = 'cancel requested';
    } catch (error) {
      this.note.textContent = `cancel failed: ${error instanceof Error ? error.message : error}`;
      this.note.classList.add('th-error');
    }
  }
}

export class SweepCard extends LiveCard {
  constructor(api: TrainhubAPI, actions: ILiveOutputActions, data: IStaticSweep) {
    super(api, actions, data.id, 'sweep');
    this.sweep = { ...data.sweep, id: data.id };
    this.rows = data.trials ?? [];
    this.draw();
  }

  private sweep: Partial<ISweep>;
  private rows: Record<string, unknown>[];

  setStatic(data: IStaticSweep): void {
    if (!this.reads) {
      this.sweep = { ...data.sweep, id: data.id };
      this.rows = data.trials ?? [];
      this.draw();
    }
  }

  protected async load(): Promise<boolean> {
    const [sweep, trials] = await Promise.all([this.api.sweep(this.itemId), this.api.sweepTrials(this.itemId)]);
    this.sweep = sweep;
    this.rows = trials.items.slice(-LOG_LINES).map((t: ITrial) => ({
      number: t.number,
      state: t.state,
      value: t.value,
      ...t.params,
      job_id: t.job_id
    }));
    this.draw();
    return sweep.state === 'running';
  }

  private draw(): void {
    const s = this.sweep;
    const p = s.progress ?? {};
    const total = s.trials ?? 0;
    const progress = [`${p.done ?? 0}/${total} ${noun(total, 'trial')} done`];
    for (const k of ['complete', 'pruned', 'failed', 'cancelled']) {
      if (p[k]) {
        progress.push(`${p[k]} ${k}`);
      }
    }
    progress.push(`${(p.running ?? 0) + (p.pending ?? 0)} running`);
    const state = s.state ?? '?';
    const parts: HTMLElement[] = [
      el(
        'div',
        { class: 'th-live-head' },
        el('strong', {}, this.itemId),
        s.name ? ` ${s.name}` : '',
        ' · ',
        el('span', { class: `th-live-state th-live-state-${state}` }, state),
        ` · ${progress.join(', ')} · ${s.mode ?? '?'} ${s.metric ?? '?'}`
      )
    ];
    if (s.best) {
      const params = Object.entries(s.best.params ?? {})
        .map(([k, v]) => `${k}=${typeof v === 'number' ? num(v) : String(v)}`)
        .join(', ');
      parts.push(el('div', {}, `best ${s.metric} = ${num(s.best.value)} (trial ${s.best.number}, ${s.best.job_id ?? '-'}: ${params})`));
    }
    if (s.reason && state !== 'running') {
      parts.push(el('div', { class: 'th-live-reason' }, s.reason));
    }
    if (this.rows.length) {
      const cols = Object.keys(this.rows[0]).filter(c => c !== 'reason' && c !== 'steps');
      const table = el('table', { class: 'th-live-trials' });
      table.append(el('tr', {}, ...cols.map(c => el('th', {}, c))));
      for (const r of this.rows) {
        table.append(
          el('tr', {}, ...cols.map(c => el('td', {}, r[c] === null || r[c] === undefined ? '' : typeof r[c] === 'number' ? num(r[c] as number) : String(r[c]))))
        );
      }
      parts.push(table);
    } else {
      parts.push(el('div', { class: 'th-live-reason' }, '(no trials yet)'));
    }
    const actions = el('div', { class: 'th-live-actions' });
    actions.append(
      button({ title: `Show the trials of ${this.itemId} in the jobs table`, icon: jobsIcon, label: 'Trials in the jobs table', className: 'th-live-jobs' }, () =>
        this.actions.jobsTable({ sweep: this.itemId })
      ),
      el(
        'a',
        {
          class: 'th-live-optuna',
          href: this.api.optunaDashboardUrl(this.itemId),
          target: '_blank',
          rel: 'noopener',
          title: 'Open this sweep in optuna-dashboard: a read-only copy of your own studies (trainhub.optuna_storage())'
        },
        'Open in Optuna dashboard'
      )
    );
    if (state === 'running') {
      actions.append(
        button({ title: `Cancel ${this.itemId} and its running trials`, icon: stopIcon, label: 'Cancel sweep', className: 'th-live-cancel' }, () =>
          void this.cancel()
        )
      );
    }
    parts.push(actions, this.note);
    this.node.replaceChildren(...parts);
  }

  private async cancel(): Promise<void> {
    try {
      this.sweep = await this.api.cancelSweep(this.itemId);
      this.draw();
      this.note.textContent = 'cancel requested: running trials are being stopped';
    } catch (error) {
      this.note.textContent = `cancel failed: ${error instanceof Error ? error.message : error}`;
      this.note.classList.add('th-error');
    }
  }
}

/**
 * What a notebook's outputs need to know about its widgets: whether its widget manager is in place (ipywidgets adds
 * its renderer to the notebook's rendermime once the session is ready; a renderer made before that, from the
 * application's factory, never gets the manager and stays at "Loading widget..."), and its kernels, counted: a
 * restart, a shut-down kernel or another kernel ends every widget model of the one before (ipywidgets leaves their
 * views on the page, frozen), so a view rendered under an earlier count is not live.
 */
export class NotebookWidgets {
  /**
   * @param rendermime the notebook's own
   * @param global the application's: while the notebook's widget factory is still the one it cloned from there,
   *   its widget manager is not in place
   */
  constructor(
    readonly rendermime: IRenderMimeRegistry,
    private global: IRenderMimeRegistry | null
  ) {}

  private count = 0;
  private signal = new Signal<this, void>(this);
  private managed = false;

  /** How many kernels ended since the page opened the notebook. */
  get epoch(): number {
    return this.count;
  }

  /** Emitted when a kernel ended and when the widget manager came. */
  get changed(): ISignal<this, void> {
    return this.signal;
  }

  /** The notebook's widget renderer has its manager (it is no longer the application's). */
  get ready(): boolean {
    if (!this.managed) {
      const own = this.rendermime.getFactory(WIDGET_MIME);
      this.managed = !!own && (!this.global || own !== this.global.getFactory(WIDGET_MIME));
    }
    return this.managed;
  }

  kernelEnded(): void {
    this.count++;
    this.signal.emit();
  }

  /** Look for the widget manager for a while (`tries` x 250 ms) after the session is ready; say when it came. */
  watch(tries = 120): void {
    if (this.ready) {
      this.signal.emit();
      return;
    }
    let left = tries;
    const timer = window.setInterval(() => {
      if (this.ready || --left <= 0) {
        window.clearInterval(timer);
        if (this.managed) {
          this.signal.emit();
        }
      }
    }, 250);
  }
}

/** The live widget's renderer holds a widget view (not "Loading widget..." nor "model not found"). */
function holdsView(renderer: Widget | null): boolean {
  return !!renderer && !renderer.isDisposed && renderer instanceof Panel && renderer.widgets.length > 0;
}

/** The renderer of a `%%train`/`%%sweep` output (see the module comment). */
export class LiveOutput extends Panel implements IRenderMime.IRenderer {
  constructor(
    private mimeType: string,
    private api: TrainhubAPI,
    private actions: ILiveOutputActions,
    private notebook: NotebookWidgets | null
  ) {
    super();
    this.addClass('th-live-output');
    notebook?.changed.connect(this.notebookChanged, this);
  }

  private model: IRenderMime.IMimeModel | null = null;
  private card: JobCard | SweepCard | null = null;
  private view: Widget | null = null;
  private viewModel = '';
  private viewEpoch = 0;
  /** The widget model whose kernel is gone: never shown again in this output. */
  private deadModel = '';
  private observer: MutationObserver | null = null;

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[this.mimeType] as unknown as IStaticJob | IStaticSweep;
    if (!data || typeof data.id !== 'string') {
      this.node.textContent = 'trainhub: this output names no job';
      return;
    }
    this.model = model;
    this.node.dataset.trainhubId = data.id;
    if (this.card && this.card.itemId !== data.id) {
      this.card.dispose();
      this.card = null;
    }
    if (!this.card) {
      this.card = data.kind === 'sweep' ? new SweepCard(this.api, this.actions, data as IStaticSweep) : new JobCard(this.api, this.actions, data as IStaticJob);
      this.card.hide();
      this.addWidget(this.card);
    } else if (data.kind === 'sweep') {
      (this.card as SweepCard).setStatic(data as IStaticSweep);
    } else {
      (this.card as JobCard).setStatic(data as IStaticJob);
    }
    await this.ensureView();
    this.choose();
  }

  /** The widget's view of this output's model: made once the notebook's widget manager is in place. */
  private async ensureView(): Promise<void> {
    const model = this.model;
    const widget = model?.data[WIDGET_MIME] as { model_id?: string } | undefined;
    const modelId = model?.trusted && widget?.model_id && widget.model_id !== this.deadModel ? widget.model_id : '';
    if (modelId === this.viewModel) {
      return;
    }
    this.dropView();
    const notebook = this.notebook;
    if (!model || !modelId || !notebook || !notebook.ready) {
      return; // the live view meanwhile; notebookChanged() comes back here when the manager comes
    }
    this.viewModel = modelId;
    this.viewEpoch = notebook.epoch;
    const view = notebook.rendermime.createRenderer(WIDGET_MIME);
    this.view = view;
    view.hide();
    this.addWidget(view);
    this.observer = new MutationObserver(() => this.choose());
    this.observer.observe(view.node, { childList: true });
    try {
      await view.renderModel(model);
    } catch (error) {
      console.warn('trainhub: the widget of this output could not be rendered', error);
    }
  }

  /** A kernel ended (the shown widget, if made under it, is dead for good) or the widget manager came. */
  private notebookChanged(): void {
    const notebook = this.notebook!;
    if (this.view && this.viewEpoch !== notebook.epoch) {
      this.deadModel = this.viewModel;
      this.dropView();
    }
    void this.ensureView().then(() => this.choose());
  }

  /** The widget while it holds a view, else the live card (whose poll runs only while it is shown). */
  private choose(): void {
    if (this.isDisposed) {
      return;
    }
    const live = holdsView(this.view);
    if (live) {
      this.card?.hide();
      this.view!.show();
    } else {
      this.view?.hide();
      this.card?.show();
    }
    this.node.dataset.showing = live ? 'widget' : 'card';
  }

  private dropView(): void {
    this.observer?.disconnect();
    this.observer = null;
    this.view?.dispose();
    this.view = null;
    this.viewModel = '';
  }

  dispose(): void {
    this.notebook?.changed.disconnect(this.notebookChanged, this);
    this.dropView();
    super.dispose();
  }
}

/**
 * The renderer factory: `notebook` for a notebook's own rendermime (its widgets), null elsewhere (an output view, a
 * console: the live view only).
 */
export function liveOutputFactory(api: TrainhubAPI, actions: ILiveOutputActions, notebook: NotebookWidgets | null): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [JOB_MIME, SWEEP_MIME],
    defaultRank: LIVE_OUTPUT_RANK,
    createRenderer: options => new LiveOutput(options.mimeType, api, actions, notebook)
  };
}
