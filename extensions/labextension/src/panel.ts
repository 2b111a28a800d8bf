/**
 * The trainhub side panel: Storage, Datasets, Models, Jobs and Usage sections in one left-area
 * widget, with labelled icon tabs that wrap instead of being cut off in a narrow sidebar.
 * Plain DOM in a Lumino widget; every section loads when first shown and on "Refresh".
 * The Jobs and Usage sections open the main-area jobs table and usage chart (views.ts).
 */
import { Clipboard, showErrorMessage } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { humanSize, IArea, IDataset, IDatasetVersion, IEntry, IModelVersion, loadingSnippet, Stage, STAGES, TrainhubAPI } from './api';
import { button, confirmDialog, el, iconNode, noun, plural, StatusLine } from './dom';
import {
  copyIcon,
  datasetsIcon,
  deleteIcon,
  downloadIcon,
  fileIcon,
  fileUploadIcon,
  folderIcon,
  jobsIcon,
  logsIcon,
  metricsIcon,
  modelsIcon,
  refreshIcon,
  registerIcon,
  usageIcon
} from './icons';
import { tensorboardButton } from './jobs';
import { tensorboardStatus } from './tensorboard';
import { usageFigure } from './usage';
import { Views } from './views';

type Section = 'storage' | 'datasets' | 'models' | 'jobs' | 'usage';
const SECTIONS: [Section, string, LabIcon][] = [
  ['storage', 'Storage', folderIcon],
  ['datasets', 'Datasets', datasetsIcon],
  ['models', 'Models', modelsIcon],
  ['jobs', 'Jobs', jobsIcon],
  ['usage', 'Usage', usageIcon]
];

export interface IPanelOptions {
  api: TrainhubAPI;
  views: Views;
  /** Insert code into the active notebook as a new cell; false when there is none. */
  insertCode: (code: string) => boolean;
}

/** Thrown when a section's answer arrives after the user moved on to another section. */
class Stale extends Error {}

const refreshButton = (onClick: () => void) => button({ title: 'Reload', icon: refreshIcon, className: 'th-refresh' }, onClick);

/** What an empty registry tab shows: what it is for, and each way to fill it as text to copy. */
function emptyHint(lead: string, ways: [string, string, 'text'?][], after: string): HTMLElement {
  const box = el('div', { class: 'th-empty th-empty-hint' }, el('p', {}, lead));
  const list = el('dl', { class: 'th-ways' });
  for (const [where, what, text] of ways) {
    list.append(el('dt', {}, where), el('dd', {}, text ? el('span', {}, what) : el('pre', { class: 'th-code' }, what)));
  }
  box.append(list, el('p', {}, after));
  return box;
}

export class TrainhubPanel extends Widget {
  constructor(private options: IPanelOptions) {
    super();
    this.id = 'trainhub-panel';
    this.addClass('th-Panel');
    this.title.caption = 'trainhub';
    this.tabs = el('div', { class: 'th-tabs', role: 'tablist' });
    for (const [key, label, icon] of SECTIONS) {
      const tab = el(
        'button',
        { class: 'th-tab', 'data-section': key, role: 'tab', type: 'button', title: label, 'aria-selected': 'false' },
        iconNode(icon, 'th-tab-icon'),
        el('span', { class: 'th-tab-label' }, label)
      );
      tab.addEventListener('click', () => this.show_(key));
      this.tabs.append(tab);
    }
    this.body = el('div', { class: 'th-body' });
    this.node.append(this.tabs, this.status.node, this.body);
  }

  private tabs: HTMLElement;
  private status = new StatusLine();
  private body: HTMLElement;
  private section: Section = 'storage';
  private loaded = false;
  private area = 'home';
  private path = '';
  private areas: IArea[] = [];
  /** Bumped by every show_: a render whose number is no longer current stops at its next await. */
  private gen = 0;

  get api(): TrainhubAPI {
    return this.options.api;
  }

  protected onAfterShow(): void {
    if (!this.loaded) {
      this.loaded = true;
      void this.show_(this.section);
    }
  }

  private setStatus(text: string, error = false): void {
    this.status.set(text, error);
  }

  private fail(error: unknown): void {
    this.status.fail(error);
  }

  /** `value` if render `gen` is still the one shown, else throw Stale (the answer came too late). */
  private current<T>(gen: number, value: T): T {
    if (gen !== this.gen) {
      throw new Stale();
    }
    return value;
  }

  /** Show `section` (with search text `q` for datasets and models), loading it afresh. */
  async show_(section: Section, q = ''): Promise<void> {
    const gen = ++this.gen;
    this.section = section;
    for (const t of Array.from(this.tabs.children)) {
      const active = (t as HTMLElement).dataset.section === section;
      t.classList.toggle('th-active', active);
      t.setAttribute('aria-selected', String(active));
    }
    this.body.replaceChildren();
    this.setStatus('Loading…');
    try {
      if (section === 'storage') {
        await this.renderStorage(gen);
      } else if (section === 'datasets') {
        await this.renderDatasets(gen, q);
      } else if (section === 'models') {
        await this.renderModels(gen, q);
      } else if (section === 'usage') {
        await this.renderUsage(gen);
      } else {
        await this.renderJobs(gen);
      }
    } catch (error) {
      if (!(error instanceof Stale) && gen === this.gen) {
        this.fail(error);
      }
    }
  }

  // -- storage -----------------------------------------------------------------------------
  async openFolder(area: string, path: string): Promise<void> {
    this.area = area;
    this.path = path;
    await this.show_('storage');
  }

  private async renderStorage(gen: number): Promise<void> {
    if (!this.areas.length) {
      this.areas = this.current(gen, await this.api.areas()).areas;
    }
    const bar = el('div', { class: 'th-toolbar' });
    for (const a of this.areas) {
      const b = button({ title: a.url, label: a.label, className: a.name === this.area ? 'th-active' : '' }, () => void this.openFolder(a.name, ''));
      b.dataset.area = a.name;
      bar.append(b);
    }
    const area = this.areas.find(a => a.name === this.area);
    if (area?.writable) {
      const input = el('input', { type: 'file', class: 'th-upload-input', multiple: '' });
      input.addEventListener('change', () => void this.upload(input));
      bar.append(button({ title: 'Upload files into this folder', icon: fileUploadIcon, label: 'Upload', className: 'th-upload' }, () => input.click()), input);
    }
    bar.append(refreshButton(() => void this.show_('storage')));
    const crumbs = el('div', { class: 'th-crumbs' });
    const parts = this.path ? this.path.split('/') : [];
    const rootCrumb = el('a', { href: '#', class: 'th-crumb' }, `${this.area}/`);
    rootCrumb.addEventListener('click', ev => {
      ev.preventDefault();
      void this.openFolder(this.area, '');
    });
    crumbs.append(rootCrumb);
    parts.forEach((p, i) => {
      const c = el('a', { href: '#', class: 'th-crumb' }, `${p}/`);
      c.addEventListener('click', ev => {
        ev.preventDefault();
        void this.openFolder(this.area, parts.slice(0, i + 1).join('/'));
      });
      crumbs.append(c);
    });
    const list = el('ul', { class: 'th-list th-files' });
    const preview = el('div', { class: 'th-preview' });
    this.body.append(bar, crumbs, list, preview);
    await this.loadPage(gen, list, preview, null, area?.writable ?? false);
  }

  private async loadPage(gen: number, list: HTMLElement, preview: HTMLElement, after: string | null, writable: boolean): Promise<void> {
    const page = this.current(gen, await this.api.list(this.area, this.path, after));
    list.querySelector('.th-more')?.remove();
    for (const e of page.entries) {
      list.append(this.entryRow(e, preview, writable));
    }
    const shown = list.querySelectorAll('.th-entry').length;
    if (page.next_after) {
      const more = el('li', { class: 'th-more' });
      more.append(
        button({ title: 'Next page', label: 'Load more' }, () =>
          this.loadPage(this.gen, list, preview, page.next_after, writable).catch(error => {
            if (!(error instanceof Stale)) {
              this.fail(error);
            }
          })
        )
      );
      list.append(more);
    }
    this.setStatus(shown ? `${shown}${page.next_after ? '+' : ''} ${noun(shown, 'item')} in ${page.url}` : `empty: ${page.url}`);
  }

  private entryRow(e: IEntry, preview: HTMLElement, writable: boolean): HTMLElement {
    const isDir = e.type === 'directory';
    const name = el('span', { class: 'th-name', title: e.url }, iconNode(isDir ? folderIcon : fileIcon, 'th-entry-icon'), isDir ? `${e.name}/` : e.name);
    const row = el('li', { class: `th-entry ${isDir ? 'th-dir' : 'th-file'}`, 'data-path': e.path }, name);
    if (!isDir) {
      row.append(el('span', { class: 'th-size' }, humanSize(e.size)));
    }
    const actions = el('span', { class: 'th-actions' });
    actions.append(
      button({ title: 'Copy path', icon: copyIcon, className: 'th-copy' }, () => {
        Clipboard.copyToSystem(e.url);
        this.setStatus(`copied ${e.url}`);
      })
    );
    if (!isDir) {
      actions.append(button({ title: 'Download', icon: downloadIcon, className: 'th-download' }, () => window.open(this.api.downloadUrl(this.area, e.path), '_blank')));
    }
    if (writable) {
      actions.append(button({ title: 'Delete', icon: deleteIcon, className: 'th-delete' }, () => void this.remove(e)));
    }
    row.append(actions);
    name.addEventListener('click', () => {
      if (isDir) {
        void this.openFolder(this.area, e.path);
      } else {
        void this.showPreview(e, preview);
      }
    });
    return row;
  }

  private async showPreview(e: IEntry, preview: HTMLElement): Promise<void> {
    preview.replaceChildren(el('div', { class: 'th-preview-title' }, e.path));
    try {
      const p = await this.api.preview(this.area, e.path);
      if (p.kind === 'image') {
        preview.append(el('img', { src: this.api.downloadUrl(this.area, e.path) + '&download=0', alt: e.name }));
      } else if (p.kind === 'text') {
        preview.append(el('pre', { class: 'th-preview-text' }, (p.text ?? '') + (p.truncated ? '\n…' : '')));
      } else {
        preview.append(el('div', {}, `binary file, ${humanSize(p.size)}`));
      }
    } catch (error) {
      this.fail(error);
    }
  }

  private async upload(input: HTMLInputElement): Promise<void> {
    const files = Array.from(input.files ?? []);
    try {
      for (const f of files) {
        this.setStatus(`uploading ${f.name}…`);
        await this.api.upload(this.area, this.path ? `${this.path}/${f.name}` : f.name, f);
      }
      await this.show_('storage');
      this.setStatus(`uploaded ${plural(files.length, 'file')}`);
    } catch (error) {
      this.fail(error);
    }
  }

  private async remove(e: IEntry): Promise<void> {
    const what = `${e.path}${e.type === 'directory' ? ' and everything in it' : ''}`;
    if (!(await confirmDialog('Delete', `Delete ${what}? This cannot be undone.`, 'Delete', true))) {
      return;
    }
    try {
      await this.api.remove(this.area, e.path, e.type === 'directory');
      await this.show_('storage');
      this.setStatus(`deleted ${e.path}`);
    } catch (error) {
      this.fail(error);
    }
  }

  // -- datasets ----------------------------------------------------------------------------
  private searchBox(section: Section, q: string, onSearch: (q: string) => void): HTMLElement {
    const input = el('input', { type: 'search', class: 'th-search', placeholder: `Search ${section}…` });
    input.value = q;
    input.addEventListener('keydown', ev => {
      if (ev.key === 'Enter') {
        onSearch(input.value);
      }
    });
    return el('div', { class: 'th-toolbar' }, input, refreshButton(() => onSearch(input.value)));
  }

  private async renderDatasets(gen: number, q: string): Promise<void> {
    const list = el('ul', { class: 'th-list th-datasets' });
    this.body.replaceChildren(this.searchBox('datasets', q, text => void this.show_('datasets', text)), list);
    const page = this.current(gen, await this.api.datasets(q));
    for (const d of page.items) {
      list.append(this.datasetRow(d));
    }
    if (!page.items.length) {
      this.body.append(q ? el('div', { class: 'th-empty' }, `No dataset matches "${q}".`) : this.emptyDatasets());
    }
    this.setStatus(plural(page.total, 'dataset'));
  }

  /** An empty registry says how to fill it: the exact command, the Python call and where the data may live. */
  private emptyDatasets(): HTMLElement {
    const user = PageConfig.getOption('hubUser') || '<you>';
    return emptyHint(
      'No datasets registered yet. A dataset version names a folder of storage (yours or the shared datasets/) ' +
        'so others find it, load it by name and see which models used it. Register one:',
      [
        ['in a terminal', `trainhub datasets register mnist users/${user}/data/mnist --format images`],
        ['in a notebook', `from trainhub.client import TrainhubClient
TrainhubClient().register_dataset("mnist", "users/${user}/data/mnist", format="images")`]
      ],
      'Paths are in the Storage tab ("copy path"); datasets/... is the shared, read-only area. Then "Insert code" here loads it.'
    );
  }

  /** The same for models: they come from a succeeded job's outputs. */
  private emptyModels(): HTMLElement {
    return emptyHint(
      "No models registered yet. A model version is a copy of a succeeded job's outputs, with its metrics and lineage. Register one:",
      [
        ['from the jobs', 'the Register button of a succeeded job (Jobs tab, or the jobs table)', 'text'],
        ['in a notebook', 'job.register_model("resnet")   # job: the handle of %%train --as job'],
        ['in a terminal', 'trainhub models register resnet --job j-000042']
      ],
      'Versions get stages (staging, production) and export from here.'
    );
  }

  private datasetRow(d: IDataset): HTMLElement {
    const row = el('li', { class: 'th-item th-dataset', 'data-name': d.name });
    const head = el('div', { class: 'th-item-head' }, el('strong', {}, d.name), ` · ${plural(d.versions.length, 'version')} · ${d.owner}`);
    if (d.deprecated) {
      head.append(el('span', { class: 'th-badge th-deprecated' }, 'deprecated'));
    }
    const details = el('div', { class: 'th-details' });
    head.addEventListener('click', () => void this.expandDataset(d.name, details));
    row.append(head, el('div', { class: 'th-desc' }, d.description || ''), details);
    return row;
  }

  private async expandDataset(name: string, details: HTMLElement): Promise<void> {
    if (details.childElementCount) {
      details.replaceChildren();
      return;
    }
    try {
      const d = await this.api.dataset(name);
      for (const v of (d.items ?? []).slice().reverse()) {
        details.append(this.datasetVersionRow(v));
      }
    } catch (error) {
      this.fail(error);
    }
  }

  private datasetVersionRow(v: IDatasetVersion): HTMLElement {
    const text =
      v.status === 'pending'
        ? `v${v.version} · scanning (${plural(v.progress?.files ?? 0, 'file')} so far)`
        : `v${v.version} · ${plural(v.file_count, 'file')} · ${humanSize(v.size)}${v.format ? ' · ' + v.format : ''}`;
    const row = el('div', { class: 'th-version', 'data-version': String(v.version) }, el('span', { title: v.url }, text));
    if (v.deprecated) {
      row.append(el('span', { class: 'th-badge th-deprecated', title: v.deprecation_message ?? '' }, 'deprecated'));
    }
    row.append(
      button({ title: 'Insert loading code into the active notebook', label: 'Insert code', className: 'th-insert' }, () => {
        if (this.options.insertCode(loadingSnippet(v))) {
          this.setStatus(`inserted loading code for ${v.name} v${v.version}`);
        } else {
          this.setStatus('open a notebook first: the code goes into the active notebook', true);
        }
      }),
      button({ title: 'Copy URL', icon: copyIcon, className: 'th-copy' }, () => {
        Clipboard.copyToSystem(v.url);
        this.setStatus(`copied ${v.url}`);
      })
    );
    return row;
  }

  // -- models ------------------------------------------------------------------------------
  private async renderModels(gen: number, q: string): Promise<void> {
    const list = el('ul', { class: 'th-list th-models' });
    this.body.replaceChildren(this.searchBox('models', q, text => void this.show_('models', text)), list);
    const page = this.current(gen, await this.api.models(q));
    for (const m of page.items) {
      const row = el('li', { class: 'th-item th-model', 'data-name': m.name });
      const stages = Object.entries(m.stages)
        .map(([s, vs]) => `${s}: v${vs.join(', v')}`)
        .join(' · ');
      const head = el('div', { class: 'th-item-head' }, el('strong', {}, m.name), ` · ${plural(m.versions.length, 'version')}${stages ? ' · ' + stages : ''}`);
      const details = el('div', { class: 'th-details' });
      head.addEventListener('click', () => void this.expandModel(m.name, details));
      row.append(head, details);
      list.append(row);
    }
    if (!page.items.length) {
      this.body.append(q ? el('div', { class: 'th-empty' }, `No model matches "${q}".`) : this.emptyModels());
    }
    this.setStatus(plural(page.total, 'model'));
  }

  private async expandModel(name: string, details: HTMLElement): Promise<void> {
    if (details.childElementCount) {
      details.replaceChildren();
      return;
    }
    try {
      const m = await this.api.model(name);
      for (const v of (m.items ?? []).slice().reverse()) {
        details.append(this.modelVersionRow(v));
      }
    } catch (error) {
      this.fail(error);
    }
  }

  private modelVersionRow(v: IModelVersion): HTMLElement {
    const row = el('div', { class: 'th-version th-model-version', 'data-version': String(v.version) });
    const metrics = Object.entries(v.metrics)
      .map(([k, x]) => `${k}=${typeof x === 'number' ? Number(x.toPrecision(4)) : x}`)
      .join(' ');
    row.append(el('div', {}, el('strong', {}, `v${v.version}`), ` · ${humanSize(v.size)} · ${v.created_by}`));
    if (metrics) {
      row.append(el('div', { class: 'th-metrics' }, metrics));
    }
    const lineage = el('div', { class: 'th-lineage' });
    if (v.lineage.job) {
      const a = el('a', { href: this.api.jobLogsUrl(v.lineage.job), target: '_blank', class: 'th-job-link' }, `job ${v.lineage.job}`);
      lineage.append(a);
    }
    if (v.lineage.sweep !== undefined && v.lineage.sweep !== null) {
      lineage.append(` · sweep ${v.lineage.sweep}`);
    }
    for (const d of v.lineage.datasets ?? []) {
      lineage.append(` · dataset ${d.name} v${d.version}`);
    }
    row.append(lineage);
    const select = el('select', { class: 'th-stage', title: 'Stage' });
    for (const s of STAGES) {
      const o = el('option', { value: s }, s);
      if (s === v.stage) {
        o.selected = true;
      }
      select.append(o);
    }
    select.addEventListener('change', async () => {
      try {
        const updated = await this.api.setStage(v.name, v.version, select.value as Stage);
        this.setStatus(`${v.name} v${v.version} is now ${updated.stage}`);
      } catch (error) {
        select.value = v.stage;
        void showErrorMessage('Stage not changed', error as Error);
        this.fail(error);
      }
    });
    const exportLink = el('a', { href: this.api.exportUrl(v.name, v.version), class: 'th-export', download: '' }, 'Export bundle');
    row.append(el('div', { class: 'th-row' }, 'stage ', select, ' ', exportLink));
    return row;
  }

  // -- jobs --------------------------------------------------------------------------------
  private async renderJobs(gen: number): Promise<void> {
    const views = this.options.views;
    const bar = el(
      'div',
      { class: 'th-toolbar' },
      button({ title: 'Open the jobs table in the main area (sort, filter, compare)', icon: jobsIcon, label: 'Open jobs table', className: 'th-open-jobs' }, () =>
        views.jobsTable()
      ),
      refreshButton(() => void this.show_('jobs'))
    );
    const list = el('ul', { class: 'th-list th-jobs' });
    this.body.replaceChildren(bar, list);
    const [page, tb] = this.current(gen, await Promise.all([this.api.jobs(), tensorboardStatus(this.api)]));
    for (const j of page.items) {
      const row = el('li', { class: `th-item th-job th-state-${j.state}`, 'data-id': j.id });
      row.append(
        el('div', {}, el('strong', {}, j.id), ` ${j.name} · `, el('span', { class: 'th-state' }, j.state), ` · ${plural(j.gpus * j.workers, 'GPU')}`),
        el('div', { class: 'th-desc' }, j.reason || '')
      );
      const links = el('div', { class: 'th-row th-job-actions' });
      links.append(
        button({ title: `Open the logs of ${j.id}`, icon: logsIcon, className: 'th-logs' }, () => views.logs(j.id)),
        button({ title: `Chart the metrics of ${j.id}`, icon: metricsIcon, className: 'th-metrics-btn' }, () => views.metrics(j.id)),
        tensorboardButton(tb, () => [j.id], ids => void views.tensorboard(ids), '')
      );
      if (j.state === 'succeeded') {
        links.append(
          button({ title: "Register this job's outputs as a model version", icon: registerIcon, className: 'th-register' }, () => void this.registerFromJob(j.id))
        );
      }
      row.append(links);
      list.append(row);
    }
    this.setStatus(plural(page.total, 'job'));
  }

  private async registerFromJob(job: string): Promise<void> {
    const v = await this.options.views.register(job);
    if (v) {
      this.setStatus(`registered ${v.name} v${v.version}`);
    }
  }

  // -- usage -------------------------------------------------------------------------------
  /** The user's own GPU-hours per day: allocated (held) vs. used (utilisation-weighted). */
  private async renderUsage(gen: number): Promise<void> {
    const bar = el(
      'div',
      { class: 'th-toolbar' },
      button({ title: 'Open the usage chart in the main area (periods; admins: any user)', icon: usageIcon, label: 'Open usage chart', className: 'th-open-usage' }, () =>
        this.options.views.usage()
      ),
      refreshButton(() => void this.show_('usage'))
    );
    const u = this.current(gen, await this.api.usage({ by: 'day', user: PageConfig.getOption('hubUser') || null }));
    this.body.replaceChildren(bar, ...usageFigure(u, true));
    this.setStatus(u.items.length ? `${plural(u.items.length, 'day')} with GPU use` : 'no GPU use in this period');
  }
}
