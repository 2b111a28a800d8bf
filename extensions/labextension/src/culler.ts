/**
 * The idle-GPU warning (plugin `trainhub:culler-notification`).
 *
 * Polls `<server>/trainhub/culler/warnings` (forwarded by the storage server extension to the
 * culler service with the server's own token), keeps the warning about this server
 * (`PageConfig.getOption('hubServerName')`, "" for the default server) and shows it once per
 * `warned_at` as a JupyterLab warning notification with "Keep my GPU", "Give my GPU back" (a release now:
 * the kernels' variables are kept, see docs/culler.md) and "Save all" buttons. The command
 * `trainhub:give-gpu-back` does the same from the command palette, and `trainhub:get-gpu-again` ("Get a GPU
 * again", next to it in the palette) moves a CPU server back onto GPUs: the request waits in the platform's queue
 * (a notification shows its place in line, with Cancel) while the server runs on, then the server restarts on the
 * GPU profile and each notebook gets its variables back. The move itself (either way) is followed by
 * `trainhub:server-move` (move.ts): one notice with its progress, and the page reconnects by itself.
 * `docmanager:save-all` runs once automatically when a warning first appears. The notification
 * is dismissed when the user keeps the GPU or when the warning disappears from the culler.
 *
 * Poll interval: 30 s; for tests and admins it can be changed (never below 1 s) with the page
 * config option `trainhubCullerPollInterval` or the `localStorage` key `trainhub:culler:poll-ms`
 * (milliseconds; localStorage wins).
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, InputDialog, Notification } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';

import { pollSetting, request } from './api';
import { IServerMove } from './move';

/** Default milliseconds between two warnings requests. */
export const POLL_INTERVAL_MS = 30_000;
/** localStorage key overriding the poll interval (milliseconds). */
export const POLL_STORAGE_KEY = 'trainhub:culler:poll-ms';
/** Page config option overriding the poll interval (milliseconds). */
export const POLL_PAGE_CONFIG = 'trainhubCullerPollInterval';

export interface ICullerWarning {
  user: string;
  server: string;
  devices: number[];
  message: string;
  action: 'release' | 'stop';
  warned_at: string;
  act_at: string;
  keep_url: string;
}

export interface IKeepResponse {
  user: string;
  server: string;
  kept_at: string;
  message: string;
}

export function pollInterval(): number {
  return pollSetting(POLL_STORAGE_KEY, POLL_PAGE_CONFIG, POLL_INTERVAL_MS);
}

/** JupyterLab cuts notification messages at 140 characters: a short summary first, the culler's reason if it fits. */
export function describe(w: ICullerWarning): string {
  const gpus = w.devices.length === 1 ? `GPU ${w.devices[0]}` : `GPUs ${w.devices.join(', ')}`;
  const at = new Date(w.act_at);
  const when = Number.isNaN(at.getTime()) ? 'soon' : `at ${at.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })}`;
  const what =
    w.action === 'stop'
      ? 'this server stops (kernel state is lost)'
      : 'this server restarts without GPUs (variables kept, open files and generators not)';
  const summary = `${gpus} idle: ${when} ${what} unless you keep it.`;
  const full = `${summary} ${w.message}`;
  return full.length <= 140 ? full : summary;
}

export interface IRegainRequest {
  user: string;
  server: string;
  profile: string;
  gpus: number;
  state: 'waiting' | 'granted' | 'restarting' | 'done' | 'cancelled' | 'failed';
  position: number | null;
  waiting: number | null;
  reason: string;
  eta: string | null;
  devices: number[];
  message: string;
}

export interface IRegainInfo {
  request: IRegainRequest | null;
  profiles: { slug: string; display_name: string; gpus: number }[];
}

/** "In line for gpu-1: number 2 of 3 (about 14:05). All 4 GPUs are held." (at most 140 characters) */
export function describeRegain(q: IRegainRequest): string {
  if (q.state !== 'waiting') {
    return `GPUs ${q.devices.join(', ')} are yours: this server restarts on ${q.profile} now (variables kept).`;
  }
  const at = q.eta ? new Date(q.eta) : null;
  const eta = at && !Number.isNaN(at.getTime()) ? ` (about ${at.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })})` : '';
  const place = q.position ? `: number ${q.position} of ${q.waiting ?? q.position}` : '';
  const full = `In line for ${q.profile}${place}${eta}. ${q.reason}`;
  return full.length <= 140 ? full : full.slice(0, 137) + '...';
}

/** Watches this server's warnings and drives the notification. */
export class CullerWatcher {
  constructor(
    private app: JupyterFrontEnd,
    private settings: ServerConnection.ISettings,
    private serverName: string,
    private moves: IServerMove | null = null
  ) {}

  /** `warned_at` of the warning shown now, and its notification id. */
  private shown: { warnedAt: string; id: string } | null = null;
  /** `warned_at` values already notified (shown once each, also after a keep). */
  private seen = new Set<string>();

  async check(): Promise<void> {
    const data = await request<{ items: ICullerWarning[] }>(this.settings, 'trainhub/culler/warnings');
    const item = (data?.items ?? []).find(w => (w.server ?? '') === this.serverName) ?? null;
    if (!item) {
      this.dismiss();
      return;
    }
    if (this.shown && this.shown.warnedAt !== item.warned_at) {
      this.dismiss();
    }
    if (this.seen.has(item.warned_at)) {
      return;
    }
    this.seen.add(item.warned_at);
    const id = Notification.warning(describe(item), {
      autoClose: false,
      actions: [
        {
          label: 'Keep my GPU',
          caption: 'Restart the idle clock: the culler leaves this server and its GPUs alone for now',
          displayType: 'accent',
          callback: event => {
            event.preventDefault();
            void this.keep();
          }
        },
        {
          label: 'Give my GPU back',
          caption: 'Restart this server on the CPU profile now; each notebook gets its variables back',
          callback: event => {
            event.preventDefault();
            void this.giveBack();
          }
        },
        {
          label: 'Save all',
          caption: 'Save every open document',
          callback: event => {
            event.preventDefault();
            void this.saveAll();
          }
        }
      ]
    });
    this.shown = { warnedAt: item.warned_at, id };
    // save the user's work once, in case the server is released before they come back
    void this.saveAll();
  }

  async keep(): Promise<void> {
    try {
      const r = await request<IKeepResponse>(this.settings, 'trainhub/culler/keep', {
        method: 'POST',
        body: JSON.stringify({ server: this.serverName })
      });
      this.dismiss();
      Notification.success(r?.message || 'Your GPUs are kept.', { autoClose: 8000 });
    } catch (error) {
      Notification.error(`Could not keep the GPU: ${(error as Error).message}`, { autoClose: false });
    }
  }

  /** "Give my GPU back": save the documents, then ask the culler (through this server) to release it now. */
  async giveBack(): Promise<void> {
    await this.saveAll();
    try {
      const r = await request<{ message: string; profile: string }>(this.settings, 'trainhub/culler/release', {
        method: 'POST',
        body: JSON.stringify({ server: this.serverName })
      });
      this.dismiss();
      if (this.moves) {
        // one notice with the move's progress; the page reconnects by itself (the server's own announcement of the
        // same move may come first: begin() takes a move once)
        this.moves.begin({ action: 'release', profile: r?.profile || 'cpu', message: r?.message, variables: true });
      } else {
        Notification.info(r?.message || 'Giving your GPUs back: the server restarts on the CPU profile.', { autoClose: false });
      }
    } catch (error) {
      Notification.error(`Could not give the GPU back: ${(error as Error).message}`, { autoClose: false });
    }
  }

  /**
   * "Get a GPU again": pick a GPU profile, save the documents, and ask the culler (through this server) to move
   * this CPU server onto GPUs. The request waits in the platform's queue while the server keeps running here; its
   * position and reason are shown, and once the GPUs are granted the server restarts on them (each notebook
   * gets its variables back).
   */
  async getGpuAgain(): Promise<void> {
    let info: IRegainInfo | undefined;
    try {
      info = await request<IRegainInfo>(this.settings, 'trainhub/culler/regain');
    } catch (error) {
      Notification.error(`Could not ask for a GPU: ${(error as Error).message}`, { autoClose: false });
      return;
    }
    const profiles = info?.profiles ?? [];
    if (!profiles.length) {
      Notification.error('No GPU profile is open to you on this platform.', { autoClose: false });
      return;
    }
    const labels = profiles.map(p => `${p.display_name} (${p.slug})`);
    const choice = await InputDialog.getItem({
      title: 'Get a GPU again',
      label: 'This server restarts on the profile once its GPUs are yours; it runs on the CPU until then.',
      items: labels,
      current: 0,
      okLabel: 'Ask'
    });
    if (!choice.button.accept || choice.value === null) {
      return;
    }
    const profile = profiles[Math.max(0, labels.indexOf(choice.value))];
    await this.saveAll();
    try {
      const r = await request<IRegainRequest>(this.settings, 'trainhub/culler/regain', {
        method: 'POST',
        body: JSON.stringify({ profile: profile.slug })
      });
      this.followRegain(r?.message || `In line for ${profile.display_name}.`, profile.slug);
    } catch (error) {
      Notification.error(`Could not ask for a GPU: ${(error as Error).message}`, { autoClose: false });
    }
  }

  /**
   * Show the request's place in line; once the GPUs are granted, the same notice becomes the move's (its progress,
   * then the page reconnects by itself to the server on the GPU profile).
   */
  private followRegain(first: string, profile: string): void {
    const id = Notification.info(first, {
      autoClose: false,
      actions: [
        {
          label: 'Cancel',
          caption: 'Withdraw the request: the server stays on the CPU',
          callback: () => {
            void request(this.settings, 'trainhub/culler/regain', { method: 'DELETE' }).catch(error =>
              Notification.error(`Could not cancel: ${(error as Error).message}`, { autoClose: false })
            );
          }
        }
      ]
    });
    this.moves?.offerNotice(id); // the server's announcement of the move turns this notice into the move's
    const stop = () => {
      window.clearInterval(timer);
      this.moves?.offerNotice(null);
    };
    const timer = window.setInterval(async () => {
      if (this.moves?.active) {
        stop(); // the move is under way: its notice (this one) follows it
        return;
      }
      let q: IRegainRequest | null = null;
      try {
        q = (await request<IRegainInfo>(this.settings, 'trainhub/culler/regain'))?.request ?? null;
      } catch {
        return; // the server is restarting: the move's notice says so
      }
      if (q && this.moves && (q.state === 'granted' || q.state === 'restarting')) {
        stop();
        this.moves.begin({ action: 'regain', profile: q.profile || profile, variables: true }, id);
        return;
      }
      if (!q || q.state === 'done' || q.state === 'cancelled' || q.state === 'failed') {
        stop();
        Notification.dismiss(id);
        if (q?.state === 'failed') {
          Notification.error(q.message, { autoClose: false });
        }
        return;
      }
      Notification.update({ id, message: describeRegain(q), type: 'info', autoClose: false });
    }, 5000);
  }

  private async saveAll(): Promise<void> {
    try {
      if (this.app.commands.hasCommand('docmanager:save-all')) {
        await this.app.commands.execute('docmanager:save-all');
      }
    } catch (error) {
      console.warn('trainhub: save all failed', error);
    }
  }

  dismiss(): void {
    if (this.shown) {
      Notification.dismiss(this.shown.id);
      this.shown = null;
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'trainhub:culler-notification',
  description: 'Warns before the idle-GPU culler releases this server, with a "Keep my GPU" button.',
  autoStart: true,
  optional: [ICommandPalette, IServerMove],
  activate: (app: JupyterFrontEnd, palette: ICommandPalette | null, moves: IServerMove | null) => {
    const watcher = new CullerWatcher(app, app.serviceManager.serverSettings, PageConfig.getOption('hubServerName') || '', moves);
    app.commands.addCommand('trainhub:give-gpu-back', {
      label: 'Give my GPU back (restart on CPU, keep variables)',
      execute: () => watcher.giveBack()
    });
    app.commands.addCommand('trainhub:get-gpu-again', {
      label: 'Get a GPU again (wait in line, restart on GPUs, keep variables)',
      execute: () => watcher.getGpuAgain()
    });
    for (const command of ['trainhub:give-gpu-back', 'trainhub:get-gpu-again']) {
      palette?.addItem({ command, category: 'trainhub' });
    }
    const interval = pollInterval();
    const poll = new Poll({
      auto: false,
      factory: () => watcher.check(),
      frequency: { interval, backoff: true, max: Math.max(interval, 5 * 60_000) },
      name: 'trainhub:culler-notification',
      standby: 'when-hidden'
    });
    // first check once the shell is up; nothing is awaited here
    void app.restored.then(() => poll.start());
  }
};

export default plugin;
