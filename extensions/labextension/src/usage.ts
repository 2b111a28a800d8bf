/**
 * The usage chart (a main-area view): GPU-hours held vs. used per UTC day from
 * `GET {api}/usage?by=day`, every day of the period drawn (days without use as zero), with the
 * totals and the numbers as a table. Users see their own; admins (the API answers them with
 * scope "all") get a user selector with everyone who used GPUs in the period, and "everyone".
 */
import { PageConfig } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { IUsage, TrainhubAPI } from './api';
import { barChart, legend } from './chart';
import { button, el, plural, StatusLine } from './dom';
import { refreshIcon } from './icons';

export const PERIODS = [7, 30, 90];
const EVERYONE = '*';

/** The UTC day `days - 1` days before `now`, as YYYY-MM-DD (so the period includes today). */
export function sinceDay(days: number, now = new Date()): string {
  return new Date(now.getTime() - (days - 1) * 86_400_000).toISOString().slice(0, 10);
}

/** Every day from `since` to `until` (YYYY-MM-DD, inclusive). */
export function daysBetween(since: string, until: string): string[] {
  const out: string[] = [];
  const end = Date.parse(`${until}T00:00:00Z`);
  for (let t = Date.parse(`${since}T00:00:00Z`); t <= end && out.length < 3660; t += 86_400_000) {
    out.push(new Date(t).toISOString().slice(0, 10));
  }
  return out;
}

const pct = (x: number | null | undefined) => (x === null || x === undefined ? '–' : `${x.toFixed(0)} %`);
const hours = (seconds: number) => (seconds / 3600).toFixed(2);

/** Totals, a per-day bar chart and a table for one usage answer (shared with the side panel). */
export function usageFigure(u: IUsage, compact = false): HTMLElement[] {
  const who = u.user ?? 'everyone';
  const summary = el(
    'div',
    { class: 'th-usage-total' },
    `${u.since} – ${u.until} (${who}): ${hours(u.totals.gpu_seconds_allocated)} GPU-h held, `,
    `${hours(u.totals.gpu_seconds_used)} used (${pct(u.totals.utilization)})`
  );
  const byDay = new Map(u.items.map(r => [r.day ?? '', r]));
  const days = daysBetween(u.since, u.until);
  const chart = barChart({
    title: `GPU-hours held and used per day, ${who}`,
    series: ['held', 'used'],
    unit: 'GPU-h',
    width: compact ? 240 : undefined,
    height: compact ? 150 : undefined,
    groups: days.map(d => {
      const r = byDay.get(d);
      return { key: d, label: d.slice(5), values: [r?.gpu_hours_allocated ?? 0, r?.gpu_hours_used ?? 0] };
    })
  });
  const table = el('table', { class: 'th-usage' });
  const gpuh = () => el('span', { class: 'th-nowrap' }, 'GPU-h');
  table.append(el('tr', {}, el('th', {}, 'day'), el('th', {}, gpuh(), ' held'), el('th', {}, gpuh(), ' used'), el('th', {}, 'use')));
  for (const r of u.items.slice().reverse()) {
    table.append(
      el(
        'tr',
        { class: 'th-usage-row', 'data-day': r.day ?? '' },
        el('td', { title: r.day ?? '' }, compact ? (r.day ?? '').slice(5) : (r.day ?? '')),
        el('td', {}, r.gpu_hours_allocated.toFixed(2)),
        el('td', {}, r.gpu_hours_used.toFixed(2)),
        el('td', {}, pct(r.utilization))
      )
    );
  }
  const figure = el('figure', { class: `th-figure th-usage-chart${compact ? ' th-compact' : ''}` }, chart, legend(['GPU-hours held', 'GPU-hours used']));
  return [summary, figure, table];
}

export class UsageView extends Widget {
  constructor(private api: TrainhubAPI) {
    super();
    this.addClass('th-view');
    this.addClass('th-usage-view');
    this.me = PageConfig.getOption('hubUser') || '';
    this.period = el('select', { class: 'th-period', 'aria-label': 'Period' });
    for (const d of PERIODS) {
      const o = el('option', { value: String(d) }, `last ${plural(d, 'day')}`);
      o.selected = d === 30;
      this.period.append(o);
    }
    this.period.addEventListener('change', () => void this.refresh());
    this.userSelect = el('select', { class: 'th-usage-user', 'aria-label': 'User' });
    this.userSelect.addEventListener('change', () => void this.load());
    this.userField = el('label', { class: 'th-field th-usage-user-field', hidden: '' }, 'User ', this.userSelect);
    this.content = el('div', { class: 'th-view-body' });
    this.node.append(
      el(
        'div',
        { class: 'th-toolbar' },
        el('strong', { class: 'th-view-title' }, 'GPU usage'),
        el('label', { class: 'th-field' }, 'Period ', this.period),
        this.userField,
        button({ title: 'Reload', icon: refreshIcon, label: 'Refresh', className: 'th-refresh' }, () => void this.refresh())
      ),
      this.status.node,
      this.content
    );
  }

  private me: string;
  private period: HTMLSelectElement;
  private userSelect: HTMLSelectElement;
  private userField: HTMLElement;
  readonly status = new StatusLine();
  private content: HTMLElement;
  /** The last answer drawn (tests and the side panel read what is shown). */
  usage: IUsage | null = null;

  protected onAfterAttach(): void {
    void this.refresh();
  }

  private since(): string {
    return sinceDay(Number(this.period.value) || 30);
  }

  /** Find out whether the caller sees everyone (admins: fill the user list), then draw. */
  async refresh(): Promise<void> {
    try {
      const users = await this.api.usage({ by: 'user', since: this.since() });
      if (users.scope === 'all') {
        const current = this.userSelect.value || this.me || EVERYONE;
        const names = new Set(users.items.map(r => r.user ?? '').filter(Boolean));
        if (this.me) {
          names.add(this.me);
        }
        this.userSelect.replaceChildren(el('option', { value: EVERYONE }, 'everyone'));
        for (const n of Array.from(names).sort()) {
          this.userSelect.append(el('option', { value: n }, n === this.me ? `${n} (you)` : n));
        }
        this.userSelect.value = names.has(current) || current === EVERYONE ? current : EVERYONE;
        this.userField.hidden = false;
      } else {
        this.userField.hidden = true;
      }
      await this.load();
    } catch (error) {
      this.status.fail(error);
    }
  }

  private async load(): Promise<void> {
    this.status.set('Loading…');
    try {
      const choice = this.userField.hidden ? this.me : this.userSelect.value;
      const user = choice === EVERYONE ? null : choice || null;
      const u = await this.api.usage({ by: 'day', since: this.since(), user });
      this.usage = u;
      this.node.dataset.user = u.user ?? EVERYONE;
      this.content.replaceChildren(...usageFigure(u));
      this.status.set(u.items.length ? `${plural(u.items.length, 'day')} with GPU use` : 'no GPU use in this period');
    } catch (error) {
      this.status.fail(error);
    }
  }
}
