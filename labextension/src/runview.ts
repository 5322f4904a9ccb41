/**
 * The full view of one run in the main area: the notebook dashboard's four panels (loss mean
 * with min–max band across ranks, compute vs communication time per rank, memory per rank,
 * throughput), updated every second while the run goes, readable after it ended.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { api, IRunDetail } from './api';
import { BLUE, GREEN, ORANGE, barChart, lineChart } from './charts';
import { duration, fmt, h, runTime, setChildren } from './dom';
import { jdistIcon } from './icon';

const POLL_MS = 1000;

export class RunView extends Widget {
  constructor(readonly runId: string) {
    super();
    this.addClass('jp-jdist-runview');
    this.head = h('div', { class: 'jp-jdist-runview-head' }, `Loading run ${runId}…`);
    this.grid = h('div', { class: 'jp-jdist-grid' });
    this.summary = h('pre', { class: 'jp-jdist-summary' });
    this.code = h('pre', { class: 'jp-jdist-code' });
    this.node.append(
      this.head,
      this.grid,
      h('details', { class: 'jp-jdist-details', open: true }, h('summary', {}, 'Summary'), this.summary),
      h('details', { class: 'jp-jdist-details' }, h('summary', {}, 'Cell code'), this.code)
    );
  }

  protected onAfterAttach(msg: Message): void {
    void this.update_();
  }

  protected onBeforeDetach(msg: Message): void {
    this.stopPolling();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    if (this.data) {
      this.draw(this.data);
    }
  }

  dispose(): void {
    this.stopPolling();
    super.dispose();
  }

  private stopPolling(): void {
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private async update_(): Promise<void> {
    this.stopPolling();
    try {
      this.data = await api.run(this.runId);
      this.error = null;
    } catch (error) {
      this.error = (error as Error).message;
    }
    if (this.isDisposed) {
      return;
    }
    if (this.data) {
      this.draw(this.data);
    }
    if (this.error) {
      this.head.classList.add('jp-jdist-error');
      this.head.textContent = `Run ${this.runId}: ${this.error}`;
    }
    // keep following while the run goes (and retry after errors); an ended run is final
    const running = !this.data || this.data.status === 'running';
    if (running && this.isAttached) {
      this.timer = window.setTimeout(() => void this.update_(), POLL_MS);
    }
  }

  private draw(d: IRunDetail): void {
    this.node.dataset.status = d.status;
    this.node.dataset.records = String(d.records);
    this.head.classList.remove('jp-jdist-error');
    const elapsed = (d.ended ?? Date.now() / 1000) - d.started;
    const progress = d.total_steps
      ? `step ${d.steps_done} / ${d.total_steps}` + (d.status === 'running' ? `, ETA ${duration(d.eta_s)}` : '')
      : `${d.steps_done} steps`;
    const pct = d.total_steps ? Math.min(100, (100 * d.steps_done) / d.total_steps) : null;
    setChildren(
      this.head,
      h(
        'div',
        { class: 'jp-jdist-runview-title' },
        h('span', { class: `jp-jdist-badge jp-jdist-run-${d.status}` }, d.status),
        h('span', {}, `jdist run ${d.run_id}`),
        d.notebook ? h('span', { class: 'jp-jdist-meta' }, d.notebook.split('/').pop() ?? '') : null
      ),
      h(
        'div',
        { class: 'jp-jdist-meta' },
        `${d.world_size} ranks · ${d.backend || 'no backend'} on ${d.device_kind} · started ${runTime(d.started)} · ${progress} · elapsed ${duration(elapsed)} · ${d.records} records`
      ),
      pct !== null ? h('div', { class: 'jp-jdist-progress' }, h('div', { class: 'jp-jdist-progress-bar', style: `width: ${pct.toFixed(1)}%` })) : null,
      d.error && d.status !== 'interrupted' ? h('div', { class: 'jp-jdist-problem' }, d.error) : null
    );
    const p = d.panels;
    const width = Math.max(260, Math.floor((this.grid.clientWidth || this.node.clientWidth || 800) / (this.grid.clientWidth > 720 ? 2 : 1)) - 18);
    const height = 240;
    const time = `time per step (s), last 20 steps`;
    setChildren(
      this.grid,
      h(
        'div',
        { class: 'jp-jdist-chartbox', 'data-panel': 'loss' },
        lineChart({ width, height, title: p.loss_name ?? 'loss', steps: p.loss_steps, values: p.loss_mean, low: p.loss_min, high: p.loss_max, className: 'jp-jdist-chart-loss' })
      ),
      h(
        'div',
        { class: 'jp-jdist-chartbox', 'data-panel': 'time' },
        barChart({
          width,
          height,
          title: time,
          categories: p.rank_labels,
          stacked: true,
          series: [
            { name: 'compute', color: BLUE, values: p.compute_s },
            { name: 'communication', color: ORANGE, values: p.comm_s }
          ],
          format: v => `${fmt(v * 1000)} ms`,
          className: 'jp-jdist-chart-time'
        })
      ),
      h(
        'div',
        { class: 'jp-jdist-chartbox', 'data-panel': 'memory' },
        barChart({
          width,
          height,
          title: p.mem_title,
          categories: p.rank_labels,
          stacked: false,
          series: [
            { name: 'current', color: BLUE, values: p.mem_mib },
            { name: 'peak', color: ORANGE, values: p.mem_peak_mib },
            ...(p.state_mib
              ? [{ name: 'model+optimizer', color: GREEN, values: p.state_mib, label: (v: number) => (v < 1 ? `${(v * 1024).toFixed(1)} KiB` : `${v.toFixed(1)} MiB`) }]
              : [])
          ],
          format: v => `${fmt(v)} MiB`,
          className: 'jp-jdist-chart-memory'
        })
      ),
      h(
        'div',
        { class: 'jp-jdist-chartbox', 'data-panel': 'throughput' },
        lineChart({ width, height, title: p.throughput_title, steps: p.throughput_steps, values: p.throughput, className: 'jp-jdist-chart-throughput' })
      )
    );
    this.summary.textContent = d.summary;
    this.code.textContent = d.code;
  }

  private head: HTMLElement;
  private grid: HTMLElement;
  private summary: HTMLElement;
  private code: HTMLElement;
  private data: IRunDetail | null = null;
  private error: string | null = null;
  private timer: number | null = null;
}

/** The run view in a main-area tab. */
export function createRunWidget(runId: string): MainAreaWidget<RunView> {
  const content = new RunView(runId);
  const widget = new MainAreaWidget({ content });
  widget.id = `jdist-run-${runId}`;
  widget.title.label = `Run ${runId.split('-').slice(0, 2).join('-')}`;
  widget.title.caption = `jdist run ${runId}`;
  widget.title.icon = jdistIcon;
  widget.title.closable = true;
  return widget;
}
