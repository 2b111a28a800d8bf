/**
 * Main-area views of one job (both refreshed every 5 s while the job is queued or running): its
 * logs, and its metrics as charts (one chart per scalar from trainhub.log_metrics, one line per worker,
 * and GPU utilisation per device over time).
 */
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { IJob, IMetrics, TrainhubAPI } from './api';
import { fmt, ISeries, legend, lineChart } from './chart';
import { button, el, plural, StatusLine } from './dom';
import { refreshIcon } from './icons';

const ACTIVE = new Set(['queued', 'running']);
const REFRESH_MS = 5_000;

abstract class JobView extends Widget {
  constructor(
    protected api: TrainhubAPI,
    readonly job: string,
    kind: string
  ) {
    super();
    this.addClass('th-view');
    this.addClass(`th-${kind}-view`);
    this.node.dataset.job = job;
    this.content = el('div', { class: 'th-view-body' });
    const title = `${kind[0].toUpperCase()}${kind.slice(1)} of ${job}`;
    const toolbar = el('div', { class: 'th-toolbar' }, el('strong', { class: 'th-view-title' }, title));
    toolbar.append(button({ title: 'Reload', icon: refreshIcon, label: 'Refresh', className: 'th-refresh' }, () => void this.refresh()));
    this.node.append(toolbar, this.status.node, this.content);
    this.poll = new Poll({
      factory: async () => {
        if (this.state && ACTIVE.has(this.state)) {
          await this.refresh();
        }
      },
      frequency: { interval: REFRESH_MS, backoff: false },
      standby: 'when-hidden',
      name: `trainhub:${kind}:${job}`
    });
  }

  readonly status = new StatusLine();
  protected content: HTMLElement;
  protected state: IJob['state'] | null = null;
  private poll: Poll;

  dispose(): void {
    this.poll.dispose();
    super.dispose();
  }

  /** "running, refreshed every 5 s" while the job is active, else its state. */
  protected stateText(): string {
    return this.state && ACTIVE.has(this.state) ? `${this.state}, refreshed every ${REFRESH_MS / 1000} s` : String(this.state);
  }

  protected onAfterAttach(): void {
    void this.refresh();
  }

  async refresh(): Promise<void> {
    try {
      this.state = (await this.api.job(this.job)).state;
      await this.load();
    } catch (error) {
      this.status.fail(error);
    }
  }

  protected abstract load(): Promise<void>;
}

export class LogView extends JobView {
  constructor(api: TrainhubAPI, job: string) {
    super(api, job, 'logs');
    this.pre = el('pre', { class: 'th-log' });
    this.content.append(this.pre);
  }

  private pre: HTMLElement;

  protected async load(): Promise<void> {
    const text = await this.api.jobLogs(this.job);
    const atBottom = this.content.scrollTop + this.content.clientHeight >= this.content.scrollHeight - 4;
    this.pre.textContent = text || (this.state && ACTIVE.has(this.state) ? '(no output yet)' : '(the job wrote no output)');
    if (atBottom) {
      this.content.scrollTop = this.content.scrollHeight;
    }
    const lines = text ? text.replace(/\n$/, '').split('\n').length : 0;
    this.status.set(`${this.stateText()}: ${plural(lines, 'line')}`);
  }
}

/** Chart series from the metrics API: per scalar name, one series per worker (x = step). */
export function metricSeries(m: IMetrics): Map<string, ISeries[]> {
  const byKey = new Map<string, Map<number, ISeries>>();
  m.metrics.forEach((row, i) => {
    for (const [key, value] of Object.entries(row.values)) {
      if (typeof value !== 'number' || !Number.isFinite(value)) {
        continue;
      }
      let workers = byKey.get(key);
      if (!workers) {
        workers = new Map();
        byKey.set(key, workers);
      }
      let se = workers.get(row.worker);
      if (!se) {
        se = { name: `worker ${row.worker}`, points: [] };
        workers.set(row.worker, se);
      }
      se.points.push({ x: row.step ?? se.points.length, y: value });
    }
  });
  const out = new Map<string, ISeries[]>();
  for (const key of Array.from(byKey.keys()).sort()) {
    out.set(key, Array.from(byKey.get(key)!.entries()).sort((a, b) => a[0] - b[0]).map(([, se]) => se));
  }
  return out;
}

export class MetricsView extends JobView {
  constructor(api: TrainhubAPI, job: string) {
    super(api, job, 'metrics');
  }

  protected async load(): Promise<void> {
    const m = await this.api.jobMetrics(this.job);
    const series = metricSeries(m);
    const charts: HTMLElement[] = [];
    for (const [key, se] of series) {
      const last = se[0].points.slice().sort((a, b) => a.x - b.x).pop();
      const fig = el('figure', { class: 'th-figure th-metric', 'data-metric': key });
      fig.append(
        el('figcaption', {}, el('strong', {}, key), last ? ` · last ${fmt(last.y)} at step ${fmt(last.x)}` : ''),
        lineChart({ title: `${key} of ${this.job}`, xLabel: 'step', series: se })
      );
      if (se.length > 1) {
        fig.append(legend(se.map(s => s.name)));
      }
      charts.push(fig);
    }
    if (m.gpu.length) {
      const t0 = Math.min(...m.gpu.map(g => Date.parse(g.time)));
      const devices = new Map<string, ISeries>();
      for (const g of m.gpu) {
        const name = `worker ${g.worker} GPU ${g.device}`;
        if (!devices.has(name)) {
          devices.set(name, { name, points: [] });
        }
        devices.get(name)!.points.push({ x: (Date.parse(g.time) - t0) / 1000, y: g.utilization });
      }
      const se = Array.from(devices.values());
      const fig = el('figure', { class: 'th-figure th-metric th-gpu', 'data-metric': 'gpu-utilization' });
      fig.append(
        el('figcaption', {}, el('strong', {}, 'GPU utilisation %'), m.gpu.some(g => g.simulated) ? ' · simulated devices' : ''),
        lineChart({ title: `GPU utilisation of ${this.job}`, xLabel: 'seconds', series: se }),
        legend(se.map(s => s.name))
      );
      charts.push(fig);
    }
    this.content.replaceChildren(...charts);
    const points = m.metrics.length;
    this.status.set(
      points || m.gpu.length
        ? `${this.stateText()}: ${plural(series.size, 'metric')} from ${plural(points, 'report')}${m.gpu.length ? `, ${plural(m.gpu.length, 'GPU sample')}` : ''}`
        : `${this.stateText()}: no metrics yet (report them with trainhub.log_metrics(step=..., loss=...))`
    );
  }
}
