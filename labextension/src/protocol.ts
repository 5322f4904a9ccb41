/**
 * The jdist server extension's REST models. GENERATED from jdist/protocol.py by
 * tools/gen_protocol_ts.py: do not edit (tests/test_protocol.py checks it is current).
 */

export type RankState = 'idle' | 'busy' | 'paused' | 'dead' | 'unknown';

export type ClusterStatus = 'running' | 'degraded' | 'dead';

export type Panel = ILinePanel | IBarPanel | IHeatmapPanel | ITablePanel;

export type SweepStatus = 'running' | 'done' | 'interrupted' | 'stopped' | 'lost';

export interface IRank {
  rank: number;
  host: string;
  pid: number;
  device: string;
  local_rank: number | null;
  engine_id: number | null;
  state: RankState;
}

export interface IOption {
  name: string;
  flag: string;
  value: string;
  scope: string;
  help: string;
}

export interface ICluster {
  cluster_id: string;
  kernel_id: string | null;
  kernel_pid: number | null;
  kernel_state: string | null;
  managed: boolean;
  notebook: string | null;
  name: string;
  launcher: string;
  backend: string;
  n: number;
  gpus: boolean;
  timeout: number;
  hosts: string[];
  devices: string[];
  ranks: IRank[];
  options: IOption[];
  status: ClusterStatus;
  problem: string | null;
  started_at: number | null;
  uptime_s: number | null;
  current_run: string | null;
}

export interface IClustersReply {
  clusters: ICluster[];
}

export interface ISpark {
  key: string;
  label: string;
  color: string;
  unit: string;
  x: number[];
  y: (number | null)[];
  last: number | null;
}

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

export interface IRunSummary {
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
  sparks: ISpark[];
}

export interface IRunsReply {
  runs: IRunSummary[];
}

export interface ILineSeries {
  name: string;
  color: string;
  x: number[];
  y: (number | null)[];
  low: (number | null)[] | null;
  high: (number | null)[] | null;
}

export interface ILinePanel {
  key: string;
  kind: 'line';
  title: string;
  x_title: string;
  series: ILineSeries[];
}

export interface IBarSeries {
  name: string;
  color: string;
  values: (number | null)[];
  labels: boolean;
}

export interface IBarPanel {
  key: string;
  kind: 'bars';
  title: string;
  unit: string;
  stacked: boolean;
  categories: string[];
  series: IBarSeries[];
}

export interface IHeatmapPanel {
  key: string;
  kind: 'heatmap';
  title: string;
  unit: string;
  x_title: string;
  rows: string[];
  groups: [string, number, number][];
  x: number[];
  cells: string;
  low: number | null;
  high: number | null;
  colors: string[];
  legend: [string, string][];
}

export interface ITablePanel {
  key: string;
  kind: 'table';
  title: string;
  columns: string[];
  rows: string[][];
  note: string;
}

export interface IRunDetail {
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
  code: string;
  path: string;
  eta_s: number | null;
  summary: string;
  panels: Panel[];
}

export interface IActionResult {
  ok: boolean;
  via: string | null;
  message: string;
}

export interface ILiveLine {
  panel: string;
  series: string;
  n: number;
  band: boolean;
  reset: boolean;
  replace_from: number | null;
}

export interface ILivePoints {
  type: 'points';
  seq: number;
  lines: ILiveLine[];
}

export interface IDashboardHead {
  title: string;
  status: string;
  problem: string | null;
  done: number;
  total: number | null;
  progress: string;
}

export interface ISweepSummary {
  name: string;
  status: SweepStatus;
  cluster_id: string | null;
  notebook: string | null;
  started: number;
  ended: number | null;
  updated: number;
  trials: number;
  per_trial: number;
  slots: number;
  metric: string | null;
  direction: string;
  counts: Record<string, number>;
  best_trial: number | null;
  best_value: number | null;
  best_params: Record<string, any> | null;
  journal: string;
}

export interface ISweepsReply {
  sweeps: ISweepSummary[];
}

export interface ISweepDetail {
  name: string;
  status: SweepStatus;
  cluster_id: string | null;
  notebook: string | null;
  started: number;
  ended: number | null;
  updated: number;
  trials: number;
  per_trial: number;
  slots: number;
  metric: string | null;
  direction: string;
  counts: Record<string, number>;
  best_trial: number | null;
  best_value: number | null;
  best_params: Record<string, any> | null;
  journal: string;
  html: string;
}
