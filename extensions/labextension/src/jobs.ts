/**
 * The jobs table (a main-area view): the user's jobs (an admin's: everyone's), sortable by every
 * column, filtered by state through the jobs API and by id/name in the page; each row opens its
 * logs and metrics, registers a succeeded job's outputs as a model, and opens TensorBoard; rows
 * can be selected to compare several jobs in one TensorBoard.
 * While any shown job is queued or running the table refreshes itself every 15 s.
 */
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { IJob, JOB_STATES, TrainhubAPI } from './api';
import { button, el, humanDuration, noun, plural, shortTime, StatusLine } from './dom';
import { logsIcon, metricsIcon, refreshIcon, registerIcon, tensorboardIcon } from './icons';
import { ITensorBoardStatus, tensorboardStatus } from './tensorboard';

/** What a row's buttons do (the views module opens tabs and dialogs). */
export interface IJobActions {
  logs(job: string): void;
  metrics(job: string): void;
  /** Ask for a model name and register the job's outputs; resolves when done or cancelled. */
  register(job: string): Promise<unknown>;
  tensorboard(jobs: string[]): Promise<void>;
}

export type SortKey = 'id' | 'name' | 'user' | 'state' | 'gpus' | 'created' | 'duration';
export type SortDir = 'ascending' | 'descending';

const COLUMNS: [SortKey, string][] = [
  ['id', 'Job'],
  ['name', 'Name'],
  ['user', 'User'],
  ['state', 'State'],
  ['gpus', 'GPUs'],
  ['created', 'Created'],
  ['duration', 'Duration']
];
const ACTIVE = new Set(['queued', 'running']);
const REFRESH_MS = 15_000;

/** Seconds a job ran (so far, when running); null before it started. */
export function jobDuration(j: IJob, now = Date.now()): number | null {
  if (!j.started) {
    return null;
  }
  const end = j.finished ? Date.parse(j.finished) : now;
  return Math.max(0, (end - Date.parse(j.started)) / 1000);
}

function sortValue(j: IJob, key: SortKey): string | number {
  switch (key) {
    case 'id':
      return parseInt(j.id.replace(/\D/g, ''), 10) || 0;
    case 'gpus':
      return j.gpus * j.workers;
    case 'duration':
      return jobDuration(j) ?? -1;
    case 'created':
      return j.created ?? '';
    default:
      return String(j[key] ?? '').toLowerCase();
  }
}

/** `jobs` ordered by `key` (ties: newest job first). */
export function sortJobs(jobs: IJob[], key: SortKey, dir: SortDir): IJob[] {
  const sign = dir === 'ascending' ? 1 : -1;
  return jobs.slice().sort((a, b) => {
    const va = sortValue(a, key);
    const vb = sortValue(b, key);
    if (va < vb) {
      return -sign;
    }
    if (va > vb) {
      return sign;
    }
    return (sortValue(b, 'id') as number) - (sortValue(a, 'id') as number);
  });
}

/** Wrap a button that may be disabled, so its tooltip still shows (disabled buttons get no hover). */
function withTooltip(b: HTMLButtonElement): HTMLElement {
  return el('span', { class: 'th-tip', title: b.title }, b);
}

/** A TensorBoard button, disabled with the reason as tooltip when the server has none. */
export function tensorboardButton(tb: ITensorBoardStatus | null, jobs: () => string[], open: (jobs: string[]) => void, label = 'TensorBoard'): HTMLElement {
  const b = button(
    { title: tb?.available ? 'Open TensorBoard for this job' : (tb?.reason ?? 'checking whether TensorBoard is available…'), icon: tensorboardIcon, label, className: 'th-tensorboard' },
    () => {
      const ids = jobs();
      if (ids.length) {
        open(ids);
      }
    }
  );
  b.disabled = !tb?.available;
  return withTooltip(b);
}

export class JobsTable extends Widget {
  constructor(
    private api: TrainhubAPI,
    private actions: IJobActions
  ) {
    super();
    this.addClass('th-view');
    this.addClass('th-jobs-view');
    this.stateFilter = el('select', { class: 'th-state-filter', 'aria-label': 'Show jobs in state' });
    this.stateFilter.append(el('option', { value: '' }, 'all states'));
    for (const s of JOB_STATES) {
      this.stateFilter.append(el('option', { value: s }, s));
    }
    this.stateFilter.addEventListener('change', () => void this.refresh());
    this.search = el('input', { type: 'search', class: 'th-job-search', placeholder: 'Filter by id or name', 'aria-label': 'Filter by id or name' });
    this.search.addEventListener('input', () => this.render());
    this.compare = el('span', { class: 'th-compare' });
    this.sweepChip = el('span', { class: 'th-sweep-filter' });
    const toolbar = el(
      'div',
      { class: 'th-toolbar' },
      el('label', { class: 'th-field' }, 'State ', this.stateFilter),
      this.search,
      this.sweepChip,
      this.compare,
      button({ title: 'Reload the jobs', icon: refreshIcon, label: 'Refresh', className: 'th-refresh' }, () => void this.refresh())
    );
    this.table = el('table', { class: 'th-table th-jobs-table' });
    this.node.append(toolbar, this.status.node, el('div', { class: 'th-table-wrap' }, this.table));
    this.poll = new Poll({
      factory: async () => {
        if (this.jobs.some(j => ACTIVE.has(j.state))) {
          await this.refresh();
        }
      },
      frequency: { interval: REFRESH_MS, backoff: false },
      standby: 'when-hidden',
      name: 'trainhub:jobs-table'
    });
  }

  private stateFilter: HTMLSelectElement;
  private search: HTMLInputElement;
  private sweepChip: HTMLElement;
  /** Only this sweep's trials (its id, "s-000003"), or every job. */
  private sweep: string | null = null;
  private compare: HTMLElement;
  readonly status = new StatusLine();
  private table: HTMLTableElement;
  private poll: Poll;
  private jobs: IJob[] = [];
  private total = 0;
  private tb: ITensorBoardStatus | null = null;
  private selected = new Set<string>();
  private sortKey: SortKey = 'created';
  private sortDir: SortDir = 'descending';
  private loading: Promise<void> | null = null;
  private stale = false;

  dispose(): void {
    this.poll.dispose();
    super.dispose();
  }

  protected onAfterAttach(): void {
    void this.refresh();
  }

  /**
   * Show one job (the search box set to its id) or one sweep's trials (`sweep`; "" for every job again): what a
   * `%%train`/`%%sweep` output's "Jobs table" button and a `lab?trainhub-job=ID` link open.
   */
  focus(f: { job?: string; sweep?: string }): void {
    if (f.sweep !== undefined) {
      this.sweep = f.sweep || null;
      this.search.value = '';
    }
    if (f.job) {
      this.sweep = null;
      this.search.value = f.job;
    }
    this.drawSweepChip();
    void this.reload();
  }

  private drawSweepChip(): void {
    if (!this.sweep) {
      this.sweepChip.replaceChildren();
      return;
    }
    const sweep = this.sweep;
    this.sweepChip.replaceChildren(
      `trials of ${sweep} `,
      button({ title: 'Show every job again', label: 'show all jobs', className: 'th-sweep-clear' }, () => this.focus({ sweep: '' }))
    );
  }

  /** Load the jobs (with the state filter) and TensorBoard's availability, then redraw. */
  async refresh(): Promise<void> {
    if (this.loading) {
      return this.loading;
    }
    this.loading = (async () => {
      do {
        this.stale = false;
        await this.load();
      } while (this.stale);
    })().finally(() => {
      this.loading = null;
    });
    return this.loading;
  }

  /** Load again with the filters as they are now, also when a load with the old ones is under way. */
  private reload(): Promise<void> {
    this.stale = true;
    return this.refresh();
  }

  private async load(): Promise<void> {
    this.status.set('Loading…');
    try {
      const sweep = this.sweep ? parseInt(this.sweep.replace(/\D/g, ''), 10) : null;
      const [page, tb] = await Promise.all([
        this.api.jobs({ limit: 500, state: this.stateFilter.value, sweep: Number.isFinite(sweep) ? sweep : null }),
        tensorboardStatus(this.api)
      ]);
      this.jobs = page.items;
      this.total = page.total;
      this.tb = tb;
      const ids = new Set(this.jobs.map(j => j.id));
      for (const id of Array.from(this.selected)) {
        if (!ids.has(id)) {
          this.selected.delete(id);
        }
      }
      this.render();
    } catch (error) {
      this.status.fail(error);
    }
  }

  private visible(): IJob[] {
    const q = this.search.value.trim().toLowerCase();
    const shown = q ? this.jobs.filter(j => j.id.toLowerCase().includes(q) || j.name.toLowerCase().includes(q)) : this.jobs;
    return sortJobs(shown, this.sortKey, this.sortDir);
  }

  private sortBy(key: SortKey): void {
    if (this.sortKey === key) {
      this.sortDir = this.sortDir === 'ascending' ? 'descending' : 'ascending';
    } else {
      this.sortKey = key;
      this.sortDir = key === 'created' || key === 'id' || key === 'duration' ? 'descending' : 'ascending';
    }
    this.render();
  }

  render(): void {
    const rows = this.visible();
    const head = el('tr');
    const all = el('input', { type: 'checkbox', class: 'th-select-all', 'aria-label': 'Select every shown job' });
    all.checked = rows.length > 0 && rows.every(j => this.selected.has(j.id));
    all.addEventListener('change', () => {
      for (const j of rows) {
        if (all.checked) {
          this.selected.add(j.id);
        } else {
          this.selected.delete(j.id);
        }
      }
      this.render();
    });
    head.append(el('th', { class: 'th-col-select' }, all));
    for (const [key, label] of COLUMNS) {
      const sorted = key === this.sortKey;
      const th = el('th', { 'data-key': key, 'aria-sort': sorted ? this.sortDir : 'none' });
      const b = el('button', { class: 'th-sort', type: 'button', title: `Sort by ${label.toLowerCase()}` }, label);
      b.append(el('span', { class: 'th-sort-mark', 'aria-hidden': 'true' }, sorted ? (this.sortDir === 'ascending' ? ' ▲' : ' ▼') : ''));
      b.addEventListener('click', () => this.sortBy(key));
      th.append(b);
      head.append(th);
    }
    head.append(el('th', {}, 'Actions'), el('th', {}, 'Reason'));
    const body = el('tbody');
    for (const j of rows) {
      body.append(this.row(j));
    }
    this.table.replaceChildren(el('thead', {}, head), body);
    this.renderCompare();
    const filter = (this.stateFilter.value ? ` ${this.stateFilter.value}` : '') + (this.sweep ? ` ${this.sweep}` : '');
    const more = this.total > this.jobs.length ? ` (the newest ${this.jobs.length} of ${this.total} loaded)` : '';
    this.status.set(`${rows.length}${filter} ${noun(rows.length, 'job')} shown${more}`);
  }

  private row(j: IJob): HTMLTableRowElement {
    const tr = el('tr', { class: `th-job-row th-state-${j.state}`, 'data-id': j.id, 'data-state': j.state });
    const check = el('input', { type: 'checkbox', class: 'th-select', 'aria-label': `Select ${j.id}` });
    check.checked = this.selected.has(j.id);
    check.addEventListener('change', () => {
      if (check.checked) {
        this.selected.add(j.id);
      } else {
        this.selected.delete(j.id);
      }
      this.renderCompare();
    });
    const duration = jobDuration(j);
    tr.append(
      el('td', { class: 'th-col-select' }, check),
      el('td', { 'data-key': 'id' }, j.id),
      el('td', { 'data-key': 'name' }, j.name),
      el('td', { 'data-key': 'user' }, j.user),
      el('td', { 'data-key': 'state' }, el('span', { class: 'th-state' }, j.state)),
      el('td', { 'data-key': 'gpus', class: 'th-num' }, String(j.gpus * j.workers)),
      el('td', { 'data-key': 'created', title: j.created ?? '' }, shortTime(j.created)),
      el('td', { 'data-key': 'duration', class: 'th-num' }, duration === null ? '' : humanDuration(duration))
    );
    const register = button(
      {
        title: j.state === 'succeeded' ? `Register the outputs of ${j.id} as a model version` : 'Only the outputs of a succeeded job can be registered',
        icon: registerIcon,
        className: 'th-register'
      },
      () => void this.actions.register(j.id)
    );
    register.disabled = j.state !== 'succeeded';
    const actions = el(
      'td',
      {},
      el(
        'div',
        { class: 'th-row-actions' },
        button({ title: `Open the logs of ${j.id}`, icon: logsIcon, className: 'th-logs' }, () => this.actions.logs(j.id)),
        button({ title: `Chart the metrics of ${j.id}`, icon: metricsIcon, className: 'th-metrics-btn' }, () => this.actions.metrics(j.id)),
        tensorboardButton(this.tb, () => [j.id], ids => void this.actions.tensorboard(ids), ''),
        withTooltip(register)
      )
    );
    tr.append(actions, el('td', { class: 'th-reason', title: j.reason }, j.reason));
    return tr;
  }

  private renderCompare(): void {
    const n = this.selected.size;
    const b = tensorboardButton(this.tb, () => Array.from(this.selected), ids => void this.actions.tensorboard(ids), n ? `Compare ${n} in TensorBoard` : 'Compare in TensorBoard');
    const inner = b.querySelector('button') as HTMLButtonElement;
    inner.classList.add('th-compare-btn');
    if (this.tb?.available) {
      inner.disabled = n === 0;
      inner.title = n ? `Open one TensorBoard with the ${plural(n, 'selected job')} side by side` : 'Select jobs to compare them in one TensorBoard';
      b.title = inner.title;
    }
    this.compare.replaceChildren(b);
  }
}
