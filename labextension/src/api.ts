/**
 * The jdist server extension's REST API (jdist/server/handlers.py): types and requests.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export type RankState = 'idle' | 'busy' | 'dead' | 'unknown';

export interface IRank {
  rank: number;
  host: string;
  pid: number;
  device: string;
  local_rank?: number;
  engine_id: number;
  state: RankState;
}

export interface ICluster {
  cluster_id: string;
  kernel_id: string | null;
  kernel_pid: number | null;
  kernel_state: string | null;
  managed: boolean;
  notebook: string | null;
  name: string;
  backend: string;
  n: number;
  gpus: boolean;
  timeout: number;
  hosts: string[];
  devices: string[];
  ranks: IRank[];
  status: 'running' | 'degraded' | 'dead';
  problem: string | null;
  started_at: number | null;
  uptime_s: number | null;
  current_run: string | null;
}

/** [steps, values] */
export type Series = [number[], (number | null)[]];

export interface IRunHead {
  run_id: string;
  status: string;
  world_size: number;
  backend: string;
  device_kind: string;
  started: number;
  ended: number | null;
  records: number;
  total_steps: number | null;
  cluster_id: string | null;
  error: string | null;
  notebook: string | null;
  steps_done: number;
}

export interface IRunSummary extends IRunHead {
  loss_name: string | null;
  last_loss: number | null;
  last_step_time_s: number | null;
  spark: { loss: Series; step_time: Series };
}

export interface IPanels {
  loss_name: string | null;
  loss_steps: number[];
  loss_mean: (number | null)[];
  loss_min: (number | null)[];
  loss_max: (number | null)[];
  rank_labels: string[];
  compute_s: (number | null)[];
  comm_s: (number | null)[];
  mem_title: string;
  mem_mib: (number | null)[];
  mem_peak_mib: (number | null)[];
  /** model + optimizer state per rank (MiB), when the server's jdist reports it */
  state_mib?: (number | null)[];
  throughput_title: string;
  throughput_steps: number[];
  throughput: (number | null)[];
}

export interface IRunDetail extends IRunHead {
  code: string;
  path: string;
  eta_s: number | null;
  summary: string;
  panels: IPanels;
}

export interface IActionResult {
  ok: boolean;
  via?: string;
  message: string;
}

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
  clusters: () => requestAPI<{ clusters: ICluster[] }>('clusters').then(d => d.clusters),
  runs: (limit = 12) => requestAPI<{ runs: IRunSummary[] }>(`runs?limit=${limit}`).then(d => d.runs),
  run: (runId: string) => requestAPI<IRunDetail>(`runs/${encodeURIComponent(runId)}`),
  action: (clusterId: string, action: 'interrupt' | 'restart' | 'stop') =>
    requestAPI<IActionResult>(`clusters/${encodeURIComponent(clusterId)}/${action}`, { method: 'POST' })
};
