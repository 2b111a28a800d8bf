/**
 * Moves are invisible: when trainhub moves this server to another profile (the culler's idle release, "Give my GPU
 * back", "Get a GPU again"), the page shows one notice with the move's progress and reconnects by itself; JupyterLab
 * never offers to restart a server that trainhub is moving.
 *
 * - plugin `trainhub:server-move` (provides {@link IServerMove}): a {@link MoveTracker}. A move begins when the
 *   server announces it (the culler's `POST trainhub/move` emits {@link MOVE_SCHEMA} on jupyter-server's event bus,
 *   `serviceManager.events`; a page that loads meanwhile reads `GET trainhub/move`), or when this page asked for it.
 *   The tracker saves every open document while the server still answers, then looks at the server's `api/status`
 *   every second: the old server (its `started` time; a 401/403 while the hub stops it), gone (the hub's 424, the
 *   proxy's 50x, no answer), a new server once it was gone (another `started`, or a 401/403: the new server does not
 *   know this page's login yet; see {@link classify}). It then reloads the page
 *   (the hub logs it in to the new server; each notebook's new kernel loads its variables) and says where the server
 *   runs now. It closes the page's kernel connections first (each would otherwise open JupyterLab's "Kernel died
 *   unexpectedly" dialog as the server goes away). A move that does not end within {@link MOVE_TIMEOUT_MS} says so,
 *   with the way to the hub.
 * - plugin `trainhub:connection-lost` (provides JupyterLab's `IConnectionLost`, in place of
 *   `@jupyterlab/hub-extension:connectionlost`, which package.json's `disabledExtensions` turns off): silent while a
 *   move is under way; otherwise the hub's own dialog ("Server unavailable or unreachable", Restart / Dismiss), and
 *   JupyterLab's default dialog outside a hub. A dialog already open when a move begins is closed.
 */
import { IConnectionLost, JupyterFrontEnd, JupyterFrontEndPlugin, JupyterLab, ConnectionLost } from '@jupyterlab/application';
import { Dialog, ISessionContext, Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Token } from '@lumino/coreutils';
import { ISignal, Signal } from '@lumino/signaling';

import { request } from './api';

/** The event the server emits when trainhub announces a move (extensions/storage/move.py). */
export const MOVE_SCHEMA = 'https://schema.trainhub.dev/events/server-move';
/** Milliseconds between two looks at the server during a move. */
export const MOVE_POLL_MS = 1000;
/** A move that has not ended after this long is reported as stuck. */
export const MOVE_TIMEOUT_MS = 10 * 60_000;
/** sessionStorage key: the move this page reloaded for (the notice after the reload). */
export const MOVED_KEY = 'trainhub:move:done';
/** A move announced longer ago than this (seconds) is not taken up by a page that loads later. */
const ANNOUNCED_FRESH_S = 120;

export interface IMove {
  action: 'release' | 'regain';
  profile: string;
  message?: string;
  variables?: boolean;
  at?: number;
}

/** Where the move stands, as this page can see it. */
export type MovePhase = 'saving' | 'restarting' | 'reconnecting' | 'stuck';

/** What one look at the server's `api/status` found. */
export type ServerSeen = { kind: 'old' } | { kind: 'leaving' } | { kind: 'down' } | { kind: 'new' };

/** The move tracker of this page (plugin `trainhub:server-move`). */
export interface IServerMove {
  /** A move of this server is under way (JupyterLab's connection-lost dialog stays away). */
  readonly active: boolean;
  /** Emitted when a move begins. */
  readonly began: ISignal<IServerMove, IMove>;
  /** A move begins (again: ignored); ``notice``: a notification of this page to turn into the move's notice. */
  begin(move: IMove, notice?: string): void;
  /** A notification of this page that the next move's notice should replace (null: none any more). */
  offerNotice(id: string | null): void;
}

export const IServerMove = new Token<IServerMove>('trainhub:server-move', 'A move of this server by trainhub.');

/** "onto the CPU (cpu)" / "onto gpu-1" (``on``: "on the CPU (cpu)", "on gpu-1") */
function where(move: IMove, preposition: 'onto' | 'on' = 'onto'): string {
  return move.action === 'release' ? `${preposition} the CPU (${move.profile})` : `${preposition} ${move.profile}`;
}

/** The notice's text for each phase (JupyterLab cuts notifications at 140 characters). */
export function describeMove(move: IMove, phase: MovePhase): string {
  const kept = move.variables === false ? '' : ', variables kept';
  switch (phase) {
    case 'saving':
      return `Moving this server ${where(move)}${kept}. Step 1 of 3: saving your work. The page reconnects by itself.`;
    case 'restarting':
      return `Moving this server ${where(move)}${kept}. Step 2 of 3: restarting it. The page reconnects by itself.`;
    case 'reconnecting':
      return `Moving this server ${where(move)}${kept}. Step 3 of 3: reconnecting this page...`;
    case 'stuck':
      return `This server did not come back ${where(move)} within ${MOVE_TIMEOUT_MS / 60_000} minutes. Open the hub to start it.`;
  }
}

/**
 * What the server's answer to `api/status` says during a move (`started`: the old server's start time; `seenDown`:
 * the server was seen gone since the move began).
 *
 * Gone: no answer, the proxy's 502/503, or the hub, which answers for a server without a route (a redirect to
 * /hub/user/..., then its 424): the hub takes the route away before it stops the server and adds it once the new one
 * listens, so there are seconds of this between the two servers. A 401/403 comes from a server that does not accept
 * this page's login: the new server (its cookie secret is new); it counts only once the server was seen gone.
 */
export function classify(
  status: number,
  type: string,
  body: { started?: string } | null,
  started: string | null,
  seenDown: boolean
): ServerSeen {
  if (type === 'opaqueredirect') {
    return { kind: 'down' }; // the hub (the proxy's default route once the server's route is gone) sends it on
  }
  if (status === 401 || status === 403) {
    return seenDown ? { kind: 'new' } : { kind: 'leaving' };
  }
  if (status === 200) {
    if (started !== null && body?.started) {
      return body.started !== started ? { kind: 'new' } : { kind: 'old' };
    }
    return seenDown ? { kind: 'new' } : { kind: 'old' };
  }
  return { kind: 'down' };
}

export class MoveTracker implements IServerMove {
  constructor(
    private app: JupyterFrontEnd,
    private settings: ServerConnection.ISettings
  ) {}

  private move: IMove | null = null;
  private notice: string | null = null;
  private offered: string | null = null;
  private started: string | null = null;
  private seenDown = false;
  private deadline = 0;
  private phase: MovePhase = 'saving';
  private _began = new Signal<IServerMove, IMove>(this);

  get active(): boolean {
    return this.move !== null && this.phase !== 'stuck';
  }

  get began(): ISignal<IServerMove, IMove> {
    return this._began;
  }

  offerNotice(id: string | null): void {
    this.offered = id;
  }

  begin(move: IMove, notice?: string): void {
    notice = notice ?? this.offered ?? undefined;
    this.offered = null;
    if (this.move !== null) {
      if (notice && notice !== this.notice) {
        Notification.dismiss(notice); // one notice per move
      }
      return;
    }
    this.move = { ...move };
    this.phase = 'saving';
    this.seenDown = false;
    this.deadline = Date.now() + MOVE_TIMEOUT_MS;
    const text = describeMove(this.move, 'saving');
    if (notice) {
      this.notice = notice;
      Notification.update({ id: notice, message: text, type: 'in-progress', autoClose: false, actions: [] });
    } else {
      this.notice = Notification.emit(text, 'in-progress', { autoClose: false });
    }
    this._began.emit(this.move);
    void this.start();
  }

  private async start(): Promise<void> {
    const first = await this.look(true);
    if (first.kind === 'old') {
      await this.saveAll(); // while the old server still answers (and accepts this page)
    } else if (first.kind === 'down') {
      this.seenDown = true;
    }
    this.letGoOfKernels();
    this.schedule();
  }

  /**
   * Close this page's connections to the server's kernels (the kernels themselves save their variables and stop with
   * the server). Left open, each would try to reconnect as the server goes away, get a refusal from the stopping
   * server and open JupyterLab's "Error Starting Kernel: Kernel died unexpectedly" dialog. The page reloads once
   * the new server answers; its notebooks then connect to their new kernels.
   */
  private letGoOfKernels(): void {
    for (const widget of this.app.shell.widgets('main')) {
      const w = widget as unknown as { sessionContext?: ISessionContext; context?: { sessionContext?: ISessionContext } };
      const kernel = (w.sessionContext ?? w.context?.sessionContext)?.session?.kernel;
      if (kernel && !kernel.isDisposed) {
        kernel.dispose();
      }
    }
  }

  private schedule(): void {
    window.setTimeout(() => void this.step(), MOVE_POLL_MS);
  }

  private async step(): Promise<void> {
    if (this.move === null) {
      return;
    }
    const seen = await this.look(false);
    if (seen.kind === 'down' || seen.kind === 'leaving') {
      this.seenDown = this.seenDown || seen.kind === 'down';
      this.show('restarting');
    } else if (seen.kind === 'new') {
      this.show('reconnecting');
      this.reload();
      return;
    }
    if (Date.now() > this.deadline) {
      this.show('stuck');
      if (this.notice) {
        Notification.update({
          id: this.notice,
          message: describeMove(this.move, 'stuck'),
          type: 'error',
          autoClose: false,
          actions: [{ label: 'Open the hub', callback: () => void this.app.commands.execute('hub:control-panel') }]
        });
      }
      return;
    }
    this.schedule();
  }

  private show(phase: MovePhase): void {
    if (this.phase === phase || this.move === null || this.notice === null) {
      return;
    }
    this.phase = phase;
    Notification.update({ id: this.notice, message: describeMove(this.move, phase), type: 'in-progress', autoClose: false });
  }

  /** One look at the server; ``first``: remember the old server's start time. */
  private async look(first: boolean): Promise<ServerSeen> {
    let response: Response;
    try {
      // the server's own request helper: the login cookie and the XSRF header every API request needs
      response = await ServerConnection.makeRequest(
        URLExt.join(this.settings.baseUrl, 'api/status'),
        { cache: 'no-store', redirect: 'manual', headers: { Accept: 'application/json' } },
        this.settings
      );
    } catch {
      return { kind: 'down' }; // no answer at all
    }
    let body: { started?: string } | null = null;
    if (response.status === 200) {
      try {
        body = await response.json();
      } catch {
        body = null;
      }
      if (first && body?.started) {
        this.started = body.started;
        return { kind: 'old' };
      }
    }
    return classify(response.status, response.type, body, this.started, this.seenDown);
  }

  private reload(): void {
    try {
      window.sessionStorage.setItem(MOVED_KEY, JSON.stringify(this.move));
    } catch {
      // no storage: no notice after the reload
    }
    window.location.reload();
  }

  private async saveAll(): Promise<void> {
    try {
      if (this.app.commands.hasCommand('docmanager:save-all')) {
        await this.app.commands.execute('docmanager:save-all');
      }
    } catch (error) {
      console.warn('trainhub: save all before the move failed', error);
    }
  }
}

/** After the reload a move ended with: say where the server runs now, once; the notification's id. */
function noticeAfterMove(): string | null {
  let raw: string | null = null;
  try {
    raw = window.sessionStorage.getItem(MOVED_KEY);
    window.sessionStorage.removeItem(MOVED_KEY);
  } catch {
    raw = null;
  }
  if (!raw) {
    return null;
  }
  try {
    const move = JSON.parse(raw) as IMove;
    const vars =
      move.variables === false
        ? 'Kernels started afresh.'
        : "Each notebook's variables are back in its new kernel (not open files or generators).";
    return Notification.success(`This server now runs ${where(move, 'on')}. ${vars}`, { autoClose: 15_000 });
  } catch {
    return null; // an old or foreign value: nothing to say
  }
}

export const serverMove: JupyterFrontEndPlugin<IServerMove> = {
  id: 'trainhub:server-move',
  description: 'Shows a move of this server by trainhub as one notice with progress; the page reconnects by itself.',
  autoStart: true,
  provides: IServerMove,
  activate: (app: JupyterFrontEnd): IServerMove => {
    const settings = app.serviceManager.serverSettings;
    const tracker = new MoveTracker(app, settings);
    app.serviceManager.events.stream.connect((_, event) => {
      if (event.schema_id === MOVE_SCHEMA) {
        tracker.begin(event as unknown as IMove);
      }
    });
    // nothing awaited here: a move announced before this page loaded, and the notice after a move's reload
    void app.restored.then(async () => {
      const done = noticeAfterMove();
      if (done) {
        tracker.began.connect(() => Notification.dismiss(done)); // the next move's notice is the only one
      }
      try {
        const answer = await request<{ move: IMove | null }>(settings, 'trainhub/move');
        const move = answer?.move;
        if (move && move.at && Date.now() / 1000 - move.at < ANNOUNCED_FRESH_S) {
          tracker.begin(move);
        }
      } catch {
        // no trainhub server extension here: no moves either
      }
    });
    return tracker;
  }
};

export const connectionLost: JupyterFrontEndPlugin<IConnectionLost> = {
  id: 'trainhub:connection-lost',
  description: "JupyterLab's connection-lost dialog, except while trainhub moves this server (the move has its own notice).",
  autoStart: true,
  provides: IConnectionLost,
  requires: [JupyterFrontEnd.IPaths, IServerMove],
  optional: [JupyterLab.IInfo],
  activate: (app: JupyterFrontEnd, paths: JupyterFrontEnd.IPaths, moves: IServerMove, info: JupyterLab.IInfo | null) => {
    const hubPrefix = paths.urls.hubPrefix || '';
    let open: Dialog<unknown> | null = null;
    moves.began.connect(() => open?.reject()); // the move's notice says what happens now
    const handler: IConnectionLost = async (manager, error, translator) => {
      if (moves.active) {
        return; // trainhub is moving this server: the page reconnects by itself
      }
      if (!hubPrefix) {
        return ConnectionLost(manager, error, translator);
      }
      if (open) {
        return;
      }
      // as @jupyterlab/hub-extension:connectionlost, which this replaces
      const trans = translator?.load('jupyterlab');
      const __ = (text: string, ...args: string[]) => (trans ? trans.__(text, ...args) : text.replace('%1', args[0] ?? ''));
      open = new Dialog({
        title: __('Server unavailable or unreachable'),
        body: __('Your server at %1 is not running.\nWould you like to restart it?', paths.urls.base),
        buttons: [Dialog.okButton({ label: __('Restart') }), Dialog.cancelButton({ label: __('Dismiss') })]
      });
      if (info) {
        info.isConnected = false;
      }
      try {
        const result = await open.launch();
        if (result.button.accept && !moves.active) {
          await app.commands.execute('hub:restart');
        }
      } finally {
        if (info) {
          info.isConnected = true;
        }
        open.dispose();
        open = null;
      }
    };
    return handler;
  }
};
