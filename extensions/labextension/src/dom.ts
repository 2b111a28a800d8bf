/**
 * Small DOM helpers shared by the side panel and the main-area views: elements, buttons with a
 * JupyterLab icon, and the JupyterLab dialogs the panel uses instead of the browser's.
 */
import { Dialog, InputDialog, showDialog } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') {
      node.className = v;
    } else {
      node.setAttribute(k, v);
    }
  }
  for (const c of children) {
    node.append(c);
  }
  return node;
}

/** An icon as an inline SVG element (themed like JupyterLab's own icons). */
export function iconNode(icon: LabIcon, className = 'th-icon'): HTMLElement {
  return icon.element({ tag: 'span', className, elementSize: 'normal' });
}

export interface IButtonOptions {
  /** Tooltip, and the accessible name of an icon-only button. */
  title: string;
  icon?: LabIcon;
  /** Visible text; none = an icon-only button. */
  label?: string;
  className?: string;
}

/** A JupyterLab-styled button with an optional icon; clicks do not reach the row behind it. */
export function button(options: IButtonOptions, onClick: () => void): HTMLButtonElement {
  const b = el('button', {
    class: `jp-Button jp-mod-styled jp-mod-minimal th-btn ${options.label ? '' : 'th-icon-btn'} ${options.className ?? ''}`.trim(),
    title: options.title,
    type: 'button'
  });
  if (!options.label) {
    b.setAttribute('aria-label', options.title);
  }
  if (options.icon) {
    b.append(iconNode(options.icon));
  }
  if (options.label) {
    b.append(el('span', { class: 'th-btn-label' }, options.label));
  }
  b.addEventListener('click', ev => {
    ev.stopPropagation();
    onClick();
  });
  return b;
}

/** The one-line status under a toolbar (announced to screen readers); errors in the error colour. */
export class StatusLine {
  readonly node = el('div', { class: 'th-status', 'aria-live': 'polite' });

  set(text: string, error = false): void {
    this.node.textContent = text;
    this.node.classList.toggle('th-error', error);
  }

  fail(error: unknown): void {
    this.set(error instanceof Error ? error.message : String(error), true);
  }
}

/** Ask for a model name to register a job's outputs under (a JupyterLab input dialog). */
export async function askModelName(job: string): Promise<string | null> {
  const result = await InputDialog.getText({
    title: 'Register model',
    label: `Register the outputs of job ${job} as a new version of the model:`,
    placeholder: 'model name, e.g. resnet-flowers',
    okLabel: 'Register'
  });
  const name = result.button.accept ? (result.value ?? '').trim() : '';
  return name || null;
}

/** A JupyterLab confirmation dialog; resolves true when the user accepts. */
export async function confirmDialog(title: string, body: string, okLabel: string, danger = false): Promise<boolean> {
  const result = await showDialog({
    title,
    body,
    buttons: [Dialog.cancelButton(), danger ? Dialog.warnButton({ label: okLabel }) : Dialog.okButton({ label: okLabel })]
  });
  return result.button.accept;
}

/** Plurals that are not the word plus "s" (as trainhub.fmt.IRREGULAR_PLURALS). */
const IRREGULAR: Record<string, string> = { retry: 'retries', process: 'processes', entry: 'entries', child: 'children' };

/** The noun alone, singular for exactly one: `noun(3, 'job')` is "jobs". */
export function noun(n: number, word: string, many?: string): string {
  return n === 1 ? word : (many ?? IRREGULAR[word] ?? `${word}s`);
}

/**
 * "1 job", "2 jobs", "0 retries": a count and its noun, the one pluralisation of the panel (trainhub.fmt.plural
 * in Python); never "(s)" or "1 items".
 */
export function plural(n: number, word: string, many?: string): string {
  return `${n} ${noun(n, word, many)}`;
}

/** "3 min", "1 h 20 min" for a duration in seconds. */
export function humanDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) {
    return '';
  }
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const h = Math.floor(minutes / 60);
  const m = minutes % 60;
  return m ? `${h} h ${m} min` : `${h} h`;
}

/** A job or usage time as the user's local "YYYY-MM-DD HH:MM". */
export function shortTime(iso: string | null | undefined): string {
  if (!iso) {
    return '';
  }
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) {
    return iso;
  }
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}
