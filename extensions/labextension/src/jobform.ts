/**
 * trainhub's fields in JupyterLab's Create Notebook Job form (plugin `trainhub:notebook-job-options`): GPUs per
 * worker, workers and a time limit, in the form's "Additional options" part. jupyter-scheduler lets a lab extension
 * replace that part (the `Scheduler.IAdvancedOptions` token, whose own provider package.json disables); the values go
 * to the back end as the job's `runtime_environment_parameters` (`{"gpus": 1, "workers": 2, "time_limit": "1h"}`,
 * read by trainhub.extensions.notebookjobs).
 *
 * The defaults and bounds are the chosen profile's (`GET {api}/profiles`: its GPUs per worker, the GPUs of its pool,
 * the most workers a job may have); a value outside them is shown as an error under its field and the form's Create
 * button stays disabled until it is fixed. A field left at its default is not sent: the job gets the profile's.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Scheduler } from '@jupyterlab/scheduler';
import * as React from 'react';

import { IProfile, TrainhubAPI } from './api';

const h = React.createElement;

/** jupyter-scheduler's JobsView values in which the form is edited (CreateForm, CreateFromJobDescriptionForm,
 * EditJobDefinition); in the others (JobDetail, JobDefinitionDetail) the values are shown read only. */
const EDITABLE = new Set([1, 2, 7]);

/** A duration as the jobs API reads one (trainhub.jobspec.parse_duration): seconds, or "90s", "30m", "2h", "1h30m". */
const DURATION =
  /^ *(?:([0-9]{1,4}(?:\.[0-9]{1,6})?) *d)? *(?:([0-9]{1,6}(?:\.[0-9]{1,6})?) *h)? *(?:([0-9]{1,7}(?:\.[0-9]{1,6})?) *m)? *(?:([0-9]{1,9}(?:\.[0-9]{1,6})?) *s?)? *$/;

export type Field = 'gpus' | 'workers' | 'time_limit';
export type RunValues = Record<Field, string>;

/** The form's error keys of the fields (the form disables Create while any is non-empty). */
const ERROR_KEYS: Record<Field, string> = {
  gpus: 'trainhubGpus',
  workers: 'trainhubWorkers',
  time_limit: 'trainhubTimeLimit'
};

function wholeNumber(text: string, what: string, min: number, max: number): string {
  if (!/^\s*\d+\s*$/.test(text)) {
    return `${what} must be a whole number from ${min} to ${max}`;
  }
  const n = parseInt(text, 10);
  if (n < min || n > max) {
    return `${what} must be from ${min} to ${max}, not ${n}`;
  }
  return '';
}

/** What is wrong with each field for `profile` ('' = nothing). */
export function checkRunOptions(values: RunValues, profile: IProfile | null): Record<Field, string> {
  const maxGpus = profile ? profile.max_gpus : 4096;
  const maxWorkers = profile ? profile.max_workers : 64;
  const where = profile ? ` on ${profile.slug}` : '';
  const gpus = wholeNumber(values.gpus, 'GPUs per worker', 0, maxGpus);
  return {
    gpus: gpus && profile && maxGpus === 0 ? `${profile.slug} has no GPUs: choose a GPU profile, or 0` : gpus && gpus + where,
    workers: wholeNumber(values.workers, 'Workers', 1, maxWorkers),
    time_limit:
      values.time_limit.trim() && (!DURATION.test(values.time_limit) || !/[0-9]/.test(values.time_limit))
        ? 'Time limit: give seconds (3600) or a duration like 90s, 30m, 2h, 1h30m; empty for none'
        : ''
  };
}

/** The profile's defaults, as the fields show them. */
function defaults(profile: IProfile | null): RunValues {
  return { gpus: String(profile ? profile.gpus : 0), workers: '1', time_limit: '' };
}

/** `runtime_environment_parameters`: the fields that differ from the profile's defaults. */
function parameters(values: RunValues, profile: IProfile | null): { [key: string]: string | number } {
  const out: { [key: string]: string | number } = {};
  const base = defaults(profile);
  if (values.gpus.trim() !== base.gpus) {
    out.gpus = parseInt(values.gpus, 10);
  }
  if (values.workers.trim() !== base.workers) {
    out.workers = parseInt(values.workers, 10);
  }
  if (values.time_limit.trim()) {
    out.time_limit = values.time_limit.trim();
  }
  return out;
}

const LABELS: Record<Field, string> = { gpus: 'GPUs per worker', workers: 'Workers', time_limit: 'Time limit' };

function hint(field: Field, profile: IProfile | null): string {
  if (field === 'time_limit') {
    return 'e.g. 2h or 1h30m; empty: no limit';
  }
  if (!profile) {
    return '';
  }
  return field === 'gpus'
    ? `${profile.slug}: ${profile.gpus} by default, at most ${profile.max_gpus}`
    : `1 by default, at most ${profile.max_workers}`;
}

/** The form's part: three labelled inputs, each with its hint or its error. */
export function runOptions(loadProfiles: () => Promise<IProfile[]>): Scheduler.IAdvancedOptions {
  return (props: Scheduler.IAdvancedOptionsProps) => {
    const editable = EDITABLE.has(props.jobsView);
    const [profiles, setProfiles] = React.useState<IProfile[] | null>(null);
    const [loadError, setLoadError] = React.useState('');
    // what the user typed; a field not typed in shows (and follows) the profile's default
    const [typed, setTyped] = React.useState<Partial<RunValues>>({});
    React.useEffect(() => {
      loadProfiles().then(setProfiles, (e: Error) => setLoadError(`cannot read your profiles: ${e.message}`));
    }, []);
    const slug = props.model.computeType || props.model.environment || '';
    const profile = (profiles || []).find(p => p.slug === slug) || null;
    const shown: RunValues = editable
      ? { ...defaults(profile), ...typed }
      : {
          ...defaults(profile),
          ...Object.fromEntries(
            Object.entries(props.model.runtimeEnvironmentParameters || {}).map(([k, v]) => [k, String(v ?? '')])
          )
        };
    const errors = editable ? checkRunOptions(shown, profile) : { gpus: '', workers: '', time_limit: '' };
    const key = JSON.stringify([shown, profile && profile.slug, errors]);
    React.useEffect(() => {
      if (!editable || (profiles === null && !loadError)) {
        return;
      }
      const next = { ...props.errors };
      for (const f of Object.keys(ERROR_KEYS) as Field[]) {
        next[ERROR_KEYS[f]] = errors[f];
      }
      props.handleErrorsChange(next);
      props.handleModelChange({ ...props.model, runtimeEnvironmentParameters: parameters(shown, profile) });
    }, [key, loadError]);

    const field = (f: Field) => {
      const id = `trainhub-job-${f.replace('_', '-')}`;
      return h(
        'div',
        { className: 'th-jobform-field', key: f },
        h('label', { htmlFor: id, className: 'th-jobform-label' }, LABELS[f]),
        h('input', {
          id,
          name: f,
          className: 'jp-mod-styled th-jobform-input' + (errors[f] ? ' th-jobform-invalid' : ''),
          type: 'text',
          inputMode: f === 'time_limit' ? 'text' : 'numeric',
          value: shown[f],
          disabled: !editable,
          'aria-invalid': errors[f] ? true : undefined,
          'aria-describedby': `${id}-hint`,
          onChange: (e: React.ChangeEvent<HTMLInputElement>) => {
            const value = e.target.value;
            setTyped(t => ({ ...t, [f]: value }));
          }
        }),
        h(
          'div',
          { id: `${id}-hint`, className: errors[f] ? 'th-jobform-error' : 'th-jobform-hint' },
          errors[f] || hint(f, profile)
        )
      );
    };
    return h(
      'div',
      { className: 'th-jobform' },
      h('div', { className: 'th-jobform-title' }, 'trainhub: resources of the job'),
      loadError ? h('div', { className: 'th-jobform-error' }, loadError) : null,
      field('gpus'),
      field('workers'),
      field('time_limit')
    );
  };
}

const plugin: JupyterFrontEndPlugin<Scheduler.IAdvancedOptions> = {
  id: 'trainhub:notebook-job-options',
  description: "GPUs, workers and a time limit in JupyterLab's Create Notebook Job form (trainhub as its back end).",
  autoStart: true,
  provides: Scheduler.IAdvancedOptions,
  activate: (app: JupyterFrontEnd): Scheduler.IAdvancedOptions => {
    const api = new TrainhubAPI(app.serviceManager.serverSettings);
    let loaded: Promise<IProfile[]> | null = null;
    const load = () => {
      if (loaded === null) {
        loaded = api.profiles().then(r => r.items);
        loaded.catch(() => (loaded = null)); // asked again by the next form
      }
      return loaded;
    };
    return runOptions(load);
  }
};

export default plugin;
