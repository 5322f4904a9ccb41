/**
 * The full view of one run in the main area: the notebook dashboard's panels (as data from the
 * server: jdist/metrics/panels.py), each drawn by its kind (a line panel, a bar panel), updated
 * every second while the run goes, readable after it ended. A new panel needs no change here.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { api, IRunDetail } from './api';
import { duration, h, runTime, setChildren } from './dom';
import { jdistIcon } from './icon';
import { drawPanel } from './panels';

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
    const width = Math.max(260, Math.floor((this.grid.clientWidth || this.node.clientWidth || 800) / (this.grid.clientWidth > 720 ? 2 : 1)) - 18);
    setChildren(this.grid, ...d.panels.map(p => h('div', { class: 'jp-jdist-chartbox', 'data-panel': p.key }, drawPanel(p, width, 240))));
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
