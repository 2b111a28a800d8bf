/**
 * This server's GPUs in the status bar (plugin `trainhub:gpu-status`).
 *
 * Polls `<server>/trainhub/gpu/status` (the storage server extension forwards it to the culler's
 * `api/gpus` with the server's own token): the devices the culler samples for this server, with
 * their utilisation and memory ("GPU 0 (sim) 37% · 2.1/16 GiB"), and, while the culler's idle clock
 * runs, how long until the GPUs are released ("idle 42 min, released in 18 min — keep"). "keep"
 * posts `trainhub/culler/keep`, the same keep as the idle-GPU notification's "Keep my GPU".
 * The tooltip has the details (device names, memory, the culler's reason, the local time of the release).
 *
 * The item is hidden while the server holds no GPU. Poll interval: 5 s, paused while the page is
 * hidden; `localStorage` key `trainhub:gpustatus:poll-ms` or page config option
 * `trainhubGpuStatusPollInterval` (milliseconds, at least 1 s) change it. The status bar is optional:
 * without it (a minimal JupyterLab) the plugin does nothing.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { pollSetting, request } from './api';
import { el, humanDuration, shortTime } from './dom';

export const GPU_POLL_INTERVAL_MS = 5_000;
export const GPU_POLL_STORAGE_KEY = 'trainhub:gpustatus:poll-ms';
export const GPU_POLL_PAGE_CONFIG = 'trainhubGpuStatusPollInterval';

/** One device of `GET api/gpus` (see docs/culler.md). */
export interface IGPUDevice {
  index: number;
  name: string | null;
  simulated: boolean;
  utilization: number | null;
  memory_used_mb: number | null;
  memory_total_mb: number | null;
  sampled_at: string | null;
}

/** The culler's idle clock for this server (`CullPolicy.clock`). */
export interface IGPUClock {
  running: boolean;
  reason: string;
  dry_run: boolean;
  action: 'release' | 'stop';
  timeout_s: number | null;
  idle_since: string | null;
  idle_s: number | null;
  away: boolean;
  warned_at: string | null;
  act_at: string | null;
}

export interface IGPUStatus {
  at?: string;
  devices: IGPUDevice[];
  clock: IGPUClock | null;
  can_keep: boolean;
  checked_at?: string | null;
  culler?: boolean;
}

function gib(mb: number, digits: number): string {
  const v = mb / 1024;
  return Number.isInteger(v) ? String(v) : v.toFixed(digits);
}

/** "GPU 0 (sim) 37% · 2.1/16 GiB"; "–" where the culler could not measure. */
export function deviceText(d: IGPUDevice): string {
  const label = `GPU ${d.index}${d.simulated ? ' (sim)' : ''}`;
  if (d.utilization === null) {
    return `${label} –`;
  }
  const mem =
    d.memory_used_mb !== null && d.memory_total_mb ? ` · ${(d.memory_used_mb / 1024).toFixed(1)}/${gib(d.memory_total_mb, 0)} GiB` : '';
  return `${label} ${Math.round(d.utilization)}%${mem}`;
}

/** Seconds until the release, counted on the culler's clock (`at`), so a skewed browser clock does not matter. */
export function secondsLeft(status: IGPUStatus): number | null {
  const act = status.clock?.act_at ? Date.parse(status.clock.act_at) : NaN;
  const now = status.at ? Date.parse(status.at) : Date.now();
  return Number.isNaN(act) ? null : Math.max(0, (act - now) / 1000);
}

/** "idle 42 min, released in 18 min" while the clock runs (not in dry run); "" otherwise. */
export function clockText(status: IGPUStatus): string {
  const c = status.clock;
  if (!c || !c.running || c.dry_run) {
    return '';
  }
  const left = secondsLeft(status);
  const verb = c.action === 'stop' ? 'stopped' : 'released';
  const when = left === null ? '' : left < 1 ? `, ${verb} at the next check` : `, ${verb} in ${humanDuration(left)}`;
  return `idle ${humanDuration(c.idle_s ?? 0)}${when}`;
}

/** The tooltip: one line per device, then the culler's view. */
export function tooltipText(status: IGPUStatus): string {
  const lines = status.devices.map(d => {
    const name = `GPU ${d.index}${d.name ? ` (${d.name})` : ''}${d.simulated ? ', simulated: utilisation is scripted' : ''}`;
    if (d.utilization === null) {
      return `${name}: not measured`;
    }
    const mem = d.memory_used_mb !== null && d.memory_total_mb ? `, memory ${gib(d.memory_used_mb, 2)} of ${gib(d.memory_total_mb, 1)} GiB` : '';
    return `${name}: ${Math.round(d.utilization)}% busy${mem}`;
  });
  const c = status.clock;
  if (c) {
    lines.push(`Idle-GPU culler: ${c.reason}`);
    if (c.running && !c.dry_run && c.act_at) {
      const what = c.action === 'stop' ? 'the server stops' : 'the server restarts without GPUs (variables kept, open files and generators not)';
      lines.push(`Unless a GPU is used, a cell runs or you press keep, ${what} at ${shortTime(c.act_at)}.`);
    }
  }
  return lines.join('\n');
}

/** The status bar item: a line of text and, while the culler's clock runs, a "keep" link. */
export class GPUStatusItem extends Widget {
  private text = el('span', { class: 'th-gpustatus-text' });
  private keepButton = el(
    'button',
    { class: 'th-gpustatus-keep', type: 'button', title: 'Restart the idle clock: the culler leaves this server and its GPUs alone for now' },
    'keep'
  );
  private _status: IGPUStatus | null = null;
  private _stateChanged = new Signal<this, void>(this);
  private keeping = false;

  constructor(private settings: ServerConnection.ISettings) {
    super();
    this.addClass('th-gpustatus');
    this.addClass('jp-StatusBar-TextItem');
    this.node.append(this.text, this.keepButton);
    this.keepButton.addEventListener('click', ev => {
      ev.stopPropagation();
      void this.keep();
    });
    this.render();
  }

  /** Emitted when the item appears or disappears (the server took or gave back its GPUs). */
  get stateChanged(): ISignal<this, void> {
    return this._stateChanged;
  }

  get active(): boolean {
    return !!this._status && this._status.devices.length > 0;
  }

  get status(): IGPUStatus | null {
    return this._status;
  }

  async refresh(): Promise<void> {
    try {
      this.setStatus(await request<IGPUStatus>(this.settings, 'trainhub/gpu/status'));
    } catch (error) {
      this.setStatus(null); // nothing rather than numbers that stopped moving; the poll backs off
      throw error;
    }
  }

  setStatus(status: IGPUStatus | null): void {
    const was = this.active;
    this._status = status;
    this.render();
    if (was !== this.active) {
      this._stateChanged.emit();
    }
  }

  async keep(): Promise<void> {
    if (this.keeping) {
      return;
    }
    this.keeping = true;
    this.keepButton.disabled = true;
    try {
      await request(this.settings, 'trainhub/culler/keep', { method: 'POST', body: JSON.stringify({}) });
      await this.refresh();
    } catch (error) {
      Notification.error(`Could not keep the GPU: ${(error as Error).message}`, { autoClose: 8000 });
    } finally {
      this.keeping = false;
      this.keepButton.disabled = false;
    }
  }

  private render(): void {
    const s = this._status;
    if (!s || !s.devices.length) {
      this.text.textContent = '';
      this.keepButton.hidden = true;
      return;
    }
    const clock = clockText(s);
    const keep = !!clock && s.can_keep;
    this.text.textContent = [...s.devices.map(deviceText), clock].filter(Boolean).join(' · ') + (keep ? ' —' : '');
    this.keepButton.hidden = !keep;
    this.node.classList.toggle('th-mod-warned', !!(clock && s.clock?.warned_at));
    this.node.title = tooltipText(s);
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'trainhub:gpu-status',
  description: "This server's GPUs (utilisation, memory) and the idle-GPU culler's countdown in the status bar.",
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    if (!statusBar) {
      return;
    }
    const item = new GPUStatusItem(app.serviceManager.serverSettings);
    statusBar.registerStatusItem('trainhub:gpu-status', {
      item,
      align: 'left',
      rank: 1000,
      isActive: () => item.active,
      activeStateChanged: item.stateChanged
    });
    const interval = pollSetting(GPU_POLL_STORAGE_KEY, GPU_POLL_PAGE_CONFIG, GPU_POLL_INTERVAL_MS);
    const poll = new Poll({
      auto: false,
      factory: () => item.refresh(),
      frequency: { interval, backoff: true, max: Math.max(interval, 5 * 60_000) },
      name: 'trainhub:gpu-status',
      standby: 'when-hidden'
    });
    void app.restored.then(() => poll.start());
  }
};

export default plugin;
