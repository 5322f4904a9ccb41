/**
 * The jdist server extension's REST API (jdist/server/handlers.py): requests. The types of its
 * replies are generated from the Python models (./protocol.ts).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  IActionResult,
  ICluster,
  IClustersReply,
  IRunDetail,
  IRunsReply,
  IRunSummary,
  ISweepDetail,
  ISweepsReply,
  ISweepSummary
} from './protocol';

// The REST models are generated from jdist/protocol.py (tools/gen_protocol_ts.py).
export * from './protocol';

export class APIError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }
}

/** Call the jdist REST API; throws APIError with the server's message on failure. */
export async function requestAPI<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'jdist', 'api', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new APIError(`The Jupyter server cannot be reached: ${error}`, 0);
  }
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { message: text };
  }
  if (!response.ok) {
    const msg =
      (data && (data.message || data.reason)) || `${response.status} ${response.statusText}`;
    throw new APIError(msg, response.status);
  }
  return data as T;
}

export const api = {
  clusters: (): Promise<ICluster[]> => requestAPI<IClustersReply>('clusters').then(d => d.clusters),
  runs: (limit = 12): Promise<IRunSummary[]> => requestAPI<IRunsReply>(`runs?limit=${limit}`).then(d => d.runs),
  run: (runId: string) => requestAPI<IRunDetail>(`runs/${encodeURIComponent(runId)}`),
  sweeps: (limit = 6): Promise<ISweepSummary[]> => requestAPI<ISweepsReply>(`sweeps?limit=${limit}`).then(d => d.sweeps),
  sweep: (name: string) => requestAPI<ISweepDetail>(`sweeps/${encodeURIComponent(name)}`),
  action: (clusterId: string, action: 'interrupt' | 'restart' | 'stop') =>
    requestAPI<IActionResult>(`clusters/${encodeURIComponent(clusterId)}/${action}`, { method: 'POST' })
};
