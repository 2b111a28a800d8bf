/**
 * TensorBoard hand-off: the one place that knows how the panel asks the user's own server for a
 * TensorBoard. The server side (started in the user's server, event files from the jobs' documented
 * folder, served through the server's proxy) answers this contract:
 *
 *   GET  {server}/trainhub/tensorboard
 *        200 {"available": true}
 *        200 {"available": false, "reason": "<why, one sentence a user can act on>"}
 *        404: the route does not exist (the server side is not installed) = not available
 *   POST {server}/trainhub/tensorboard      body {"jobs": ["j-000042", "j-000043"]}
 *        200 or 201 {"url": "<where TensorBoard for exactly these jobs is served: absolute,
 *                    root-relative ("/user/NAME/..."), or relative to the server's base URL>",
 *                    "jobs": ["j-000042", "j-000043"]}
 *        4xx/5xx {"status": <code>, "message": "<shown to the user as is>"}
 *
 * Several jobs in one POST are shown side by side (one run per job) in one TensorBoard.
 */
import { URLExt } from '@jupyterlab/coreutils';

import { APIError, request, TrainhubAPI } from './api';

export const TENSORBOARD_PATH = 'trainhub/tensorboard';

export interface ITensorBoardStatus {
  available: boolean;
  reason?: string;
}

export interface ITensorBoardSession {
  url: string;
  jobs: string[];
}

const NOT_INSTALLED = 'TensorBoard is not set up on this server (ask your admin to enable the TensorBoard hand-off)';

/** Whether this server can show TensorBoard; never throws (an error reads as "not available"). */
export async function tensorboardStatus(api: TrainhubAPI): Promise<ITensorBoardStatus> {
  try {
    const s = await request<ITensorBoardStatus>(api.settings, TENSORBOARD_PATH);
    if (s && typeof s.available === 'boolean') {
      return s.available ? { available: true } : { available: false, reason: s.reason || 'TensorBoard is not available' };
    }
    return { available: false, reason: 'the server answered the TensorBoard check without a status' };
  } catch (error) {
    if (error instanceof APIError && error.status === 404) {
      return { available: false, reason: NOT_INSTALLED };
    }
    return { available: false, reason: `TensorBoard check failed: ${error instanceof Error ? error.message : error}` };
  }
}

/** Ask for a TensorBoard showing `jobs` side by side; resolves with the absolute URL to show. */
export async function startTensorBoard(api: TrainhubAPI, jobs: string[]): Promise<ITensorBoardSession> {
  const s = await request<ITensorBoardSession>(api.settings, TENSORBOARD_PATH, {
    method: 'POST',
    body: JSON.stringify({ jobs })
  });
  if (!s || typeof s.url !== 'string' || !s.url) {
    throw new APIError(502, 'the server started no TensorBoard (its answer has no "url")');
  }
  const url = URLExt.isLocal(s.url) ? URLExt.join(api.settings.baseUrl, s.url) : s.url;
  return { url, jobs: s.jobs ?? jobs };
}
