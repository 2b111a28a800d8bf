/**
 * Typed request helpers: one `request` built on the server connection settings, and the
 * shapes of the storage extension's and the trainhub service's answers (see the OpenAPI
 * documents in trainhub/services/registry/openapi.json and services/jobs/openapi.json).
 */
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { plural } from './dom';

export type Stage = 'none' | 'staging' | 'production' | 'archived';
export const STAGES: Stage[] = ['none', 'staging', 'production', 'archived'];

export interface IArea {
  name: string;
  label: string;
  url: string;
  writable: boolean;
}

export interface IEntry {
  name: string;
  path: string;
  type: 'file' | 'directory';
  size: number;
  modified: string | null;
  url: string;
}

export interface IListing {
  area: string;
  path: string;
  url: string;
  writable: boolean;
  entries: IEntry[];
  next_after: string | null;
}

export interface IPreview {
  area: string;
  path: string;
  url: string;
  size: number;
  type: 'file' | 'directory';
  mime?: string;
  kind?: 'text' | 'image' | 'binary';
  text?: string | null;
  truncated?: boolean;
}

export interface IDatasetVersion {
  name: string;
  version: number;
  url: string;
  format: string;
  description: string;
  metadata: Record<string, unknown>;
  owner: string;
  created: string;
  status: 'pending' | 'ready' | 'failed';
  size: number;
  file_count: number;
  deprecated: boolean;
  deprecation_message: string | null;
  progress?: { files: number; bytes: number };
}

export interface IDataset {
  name: string;
  owner: string;
  description: string;
  versions: number[];
  latest: IDatasetVersion | null;
  deprecated: boolean;
  items?: IDatasetVersion[];
}

export interface IStageEvent {
  time: string;
  user: string;
  from: Stage;
  to: Stage;
  comment: string;
}

export interface IModelVersion {
  name: string;
  version: number;
  owner: string;
  url: string;
  description: string;
  metrics: Record<string, number>;
  params: Record<string, unknown>;
  lineage: { job?: string; sweep?: number; datasets?: { name: string; version: number }[] };
  files: { path: string; size: number }[];
  size: number;
  stage: Stage;
  status: string;
  created_by: string;
  created: string;
  stage_history?: IStageEvent[];
}

export interface IModel {
  name: string;
  owner: string;
  description: string;
  versions: number[];
  stages: Record<string, number[]>;
  latest: IModelVersion | null;
  items?: IModelVersion[];
}

export const JOB_STATES = ['queued', 'running', 'succeeded', 'failed', 'cancelled', 'lost'] as const;
export type JobState = (typeof JOB_STATES)[number];

export interface IJob {
  id: string;
  name: string;
  user: string;
  state: JobState;
  reason: string;
  gpus: number;
  workers: number;
  devices?: number[][];
  attempt?: number;
  profile?: string | null;
  created: string | null;
  started?: string | null;
  finished: string | null;
  outputs_url: string;
  sweep_id: number | null;
}

export const SWEEP_STATES = ['running', 'completed', 'failed', 'cancelled'] as const;
export type SweepState = (typeof SWEEP_STATES)[number];

/** `GET {api}/sweeps/{id}` (docs/sweeps.md). */
export interface ISweep {
  id: string;
  name: string;
  user: string;
  state: SweepState;
  reason: string;
  trials: number;
  parallel: number;
  metric: string;
  mode: 'min' | 'max';
  sampler?: string | null;
  pruner?: string | null;
  progress: Record<string, number>;
  best: { number: number; value: number; params: Record<string, unknown>; job_id: string | null } | null;
  created?: string | null;
  finished?: string | null;
}

/** One trial of `GET {api}/sweeps/{id}/trials`. */
export interface ITrial {
  number: number;
  state: string;
  value: number | null;
  params: Record<string, unknown>;
  job_id: string | null;
  reason?: string;
}

/** `GET {api}/jobs/{id}/metrics`: scalars from trainhub.log_metrics and GPU samples. */
export interface IMetrics {
  metrics: { time: string; step: number | null; worker: number; values: Record<string, number> }[];
  gpu: { time: string; worker: number; device: number; utilization: number; memory_used_mb?: number; simulated?: boolean }[];
}

/** One row of `GET {api}/usage` (see docs/usage.md). */
export interface IUsageRow {
  day?: string;
  user?: string;
  gpu_hours_allocated: number;
  gpu_hours_used: number;
  utilization: number | null;
}

export interface IUsage {
  since: string;
  until: string;
  by: string;
  /** The user the figures are filtered to; null = everyone (admins). */
  user: string | null;
  /** "all" when the caller may see everyone's usage (admins), else "user". */
  scope: 'all' | 'user';
  items: IUsageRow[];
  totals: { gpu_seconds_allocated: number; gpu_seconds_used: number; utilization: number | null };
}

export interface IPage<T> {
  items: T[];
  total: number;
}

export class APIError extends Error {
  constructor(
    public status: number,
    message: string
  ) {
    super(message);
  }
}

/** `GET {api}/profiles`: a profile the caller may use, with what a job on it may ask for. */
export interface IProfile {
  slug: string;
  display_name: string;
  description: string;
  /** GPUs per worker a job gets by default */
  gpus: number;
  /** GPUs per worker a job may ask for at most (the GPUs of the pool this profile runs on) */
  max_gpus: number;
  /** workers a job may have at most */
  max_workers: number;
}

export type Query = Record<string, string | number | undefined | null>;

/** `path` under the server's base URL with the non-empty `query` values. */
export function serverUrl(settings: ServerConnection.ISettings, path: string, query: Query = {}): string {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v !== undefined && v !== null && v !== '') {
      params.set(k, String(v));
    }
  }
  const qs = params.toString();
  return URLExt.join(settings.baseUrl, path) + (qs ? `?${qs}` : '');
}

async function send(settings: ServerConnection.ISettings, path: string, init: RequestInit, query: Query): Promise<[Response, string]> {
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(serverUrl(settings, path, query), init, settings);
  } catch (error) {
    throw new APIError(0, `cannot reach the server: ${error}`);
  }
  const text = await response.text();
  if (!response.ok) {
    let message = response.statusText || 'request failed';
    try {
      message = JSON.parse(text).message || message;
    } catch {
      // not JSON: keep the status text
    }
    throw new APIError(response.status, message);
  }
  return [response, text];
}

/** One JSON call to the single-user server (same origin, with its auth and XSRF handling). */
export async function request<T>(settings: ServerConnection.ISettings, path: string, init: RequestInit = {}, query: Query = {}): Promise<T> {
  const [, text] = await send(settings, path, init, query);
  if (!text) {
    return null as T;
  }
  try {
    return JSON.parse(text) as T;
  } catch {
    return text as T;
  }
}

/** The same for a plain-text answer (job logs). */
export async function requestText(settings: ServerConnection.ISettings, path: string, query: Query = {}): Promise<string> {
  const [, text] = await send(settings, path, {}, query);
  return text;
}

export function storageUrl(settings: ServerConnection.ISettings, path: string, query: Record<string, string>): string {
  return URLExt.join(settings.baseUrl, 'trainhub/storage', path) + '?' + new URLSearchParams(query).toString();
}

/** The storage extension and the trainhub API (through the extension's proxy). */
export class TrainhubAPI {
  constructor(public settings: ServerConnection.ISettings) {}

  areas(): Promise<{ areas: IArea[] }> {
    return request(this.settings, 'trainhub/storage/areas');
  }

  list(area: string, path: string, after?: string | null, limit = 200): Promise<IListing> {
    return request(this.settings, 'trainhub/storage/list', {}, { area, path, after, limit });
  }

  preview(area: string, path: string): Promise<IPreview> {
    return request(this.settings, 'trainhub/storage/preview', {}, { area, path });
  }

  upload(area: string, path: string, body: Blob): Promise<IEntry> {
    return request(this.settings, 'trainhub/storage/files', { method: 'PUT', body }, { area, path });
  }

  remove(area: string, path: string, recursive = false): Promise<void> {
    return request(this.settings, 'trainhub/storage/files', { method: 'DELETE' }, { area, path, recursive: recursive ? 1 : 0 });
  }

  downloadUrl(area: string, path: string): string {
    return storageUrl(this.settings, 'files', { area, path });
  }

  profiles(): Promise<{ items: IProfile[]; default: string | null }> {
    return request(this.settings, 'trainhub/api/profiles');
  }

  datasets(q = ''): Promise<IPage<IDataset>> {
    return request(this.settings, 'trainhub/api/datasets', {}, { q });
  }

  dataset(name: string): Promise<IDataset> {
    return request(this.settings, `trainhub/api/datasets/${encodeURIComponent(name)}`);
  }

  models(q = ''): Promise<IPage<IModel>> {
    return request(this.settings, 'trainhub/api/models', {}, { q });
  }

  model(name: string): Promise<IModel> {
    return request(this.settings, `trainhub/api/models/${encodeURIComponent(name)}`);
  }

  modelVersion(name: string, version: number): Promise<IModelVersion> {
    return request(this.settings, `trainhub/api/models/${encodeURIComponent(name)}/versions/${version}`);
  }

  setStage(name: string, version: number, stage: Stage, comment = ''): Promise<IModelVersion> {
    return request(this.settings, `trainhub/api/models/${encodeURIComponent(name)}/versions/${version}`, {
      method: 'PATCH',
      body: JSON.stringify({ stage, comment })
    });
  }

  registerModel(body: { name: string; job: string; path?: string; description?: string }): Promise<IModelVersion> {
    return request(this.settings, 'trainhub/api/models', { method: 'POST', body: JSON.stringify(body) });
  }

  exportUrl(name: string, version: number): string {
    return URLExt.join(this.settings.baseUrl, 'trainhub/api/models', encodeURIComponent(name), 'versions', String(version), 'export');
  }

  /** Newest first; `state` filters (comma-separated states), `sweep` (a sweep's number) its trials, `limit` at most 500. */
  jobs(query: { limit?: number; state?: string; user?: string; sweep?: number | null } = {}): Promise<IPage<IJob>> {
    return request(this.settings, 'trainhub/api/jobs', {}, { limit: 50, ...query });
  }

  job(id: string): Promise<IJob> {
    return request(this.settings, `trainhub/api/jobs/${encodeURIComponent(id)}`);
  }

  /** Cancel a job (`DELETE {api}/jobs/{id}`): the job as the service answers (202). */
  cancelJob(id: string): Promise<IJob> {
    return request(this.settings, `trainhub/api/jobs/${encodeURIComponent(id)}`, { method: 'DELETE' });
  }

  sweep(id: string): Promise<ISweep> {
    return request(this.settings, `trainhub/api/sweeps/${encodeURIComponent(id)}`);
  }

  sweepTrials(id: string): Promise<{ items: ITrial[] }> {
    return request(this.settings, `trainhub/api/sweeps/${encodeURIComponent(id)}/trials`);
  }

  /** Cancel a sweep (`DELETE {api}/sweeps/{id}`): no new trials, the unfinished ones cancelled. */
  cancelSweep(id: string): Promise<ISweep> {
    return request(this.settings, `trainhub/api/sweeps/${encodeURIComponent(id)}`, { method: 'DELETE' });
  }

  jobMetrics(id: string): Promise<IMetrics> {
    return request(this.settings, `trainhub/api/jobs/${encodeURIComponent(id)}/metrics`);
  }

  /** The last `tail` lines of a job's workers' output ("<ISO time> [<rank>] <text>"). */
  jobLogs(id: string, tail = 2000): Promise<string> {
    return requestText(this.settings, `trainhub/api/jobs/${encodeURIComponent(id)}/logs`, { tail });
  }

  /**
   * GPU usage (allocated vs. used GPU-hours) grouped `by`; users see their own, admins everyone's
   * unless `user` is given. `since`/`until` are UTC days (YYYY-MM-DD).
   */
  usage(query: { by?: string; user?: string | null; since?: string; until?: string } = {}): Promise<IUsage> {
    return request(this.settings, 'trainhub/api/usage', {}, { by: 'day', ...query });
  }

  /**
   * Its study in optuna-dashboard, through this server (trainhub.extensions.optunadash: a read-only copy of the
   * user's own studies); the kernel side's `sweep_links` gives the same URL.
   */
  optunaDashboardUrl(sweep: string): string {
    return serverUrl(this.settings, 'trainhub/optuna/open', { sweep });
  }

  jobLogsUrl(id: string): string {
    return URLExt.join(this.settings.baseUrl, 'trainhub/api/jobs', id, 'logs');
  }
}

/** Python code that loads a dataset version, for "insert loading code". */
export function loadingSnippet(v: IDatasetVersion): string {
  const lines = [
    `# dataset ${v.name} v${v.version}${v.format ? ` (${v.format})` : ''}: ${plural(v.file_count, 'file')}, ${humanSize(v.size)}`,
    'from trainhub.client import TrainhubClient',
    `ds = TrainhubClient().dataset(${JSON.stringify(v.name)}, ${v.version})`
  ];
  const fmt = (v.format || '').toLowerCase();
  if (fmt === 'shards' || fmt === 'webdataset' || fmt === 'trainhub-shards') {
    lines.push('from trainhub.data import ShardReader', 'reader = ShardReader(ds["url"], shuffle_buffer=1000)');
  } else {
    lines.push('fs, root = ds.filesystem()  # fsspec filesystem and path of the version', 'files = fs.find(root)');
  }
  return lines.join('\n');
}

export function humanSize(n: number): string {
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  let x = n;
  while (x >= 1000 && i < units.length - 1) {
    x /= 1000;
    i++;
  }
  return `${i === 0 ? x : x.toFixed(1)} ${units[i]}`;
}

/**
 * A poll interval in milliseconds: the `localStorage` key (per browser; tests set it), else the
 * page config option (per environment), else `defaultMs`; never below 1 s.
 */
export function pollSetting(storageKey: string, pageConfigOption: string, defaultMs: number): number {
  let raw: string | null = null;
  try {
    raw = window.localStorage.getItem(storageKey);
  } catch {
    raw = null;
  }
  if (!raw) {
    raw = PageConfig.getOption(pageConfigOption) || null;
  }
  const ms = raw ? Number(raw) : NaN;
  return Number.isFinite(ms) && ms > 0 ? Math.max(1_000, ms) : defaultMs;
}
