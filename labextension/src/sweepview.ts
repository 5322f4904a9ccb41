/**
 * The full view of one jdist.tune sweep in the main area: the view the notebook shows (slot
 * timeline, curves, best so far, parallel coordinates, trials table; HTML and SVG written by the
 * kernel, jdist/metrics/sweep.py), updated every second while the sweep runs. The page is shown
 * in a sandboxed frame (no scripts, no access to JupyterLab): it is a file of the run log.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { api, ISweepDetail } from './api';
import { duration, h, runTime, setChildren } from './dom';
import { jdistIcon } from './icon';
import { sweepLine } from './sweeps';

const POLL_MS = 1000;

export class SweepView extends Widget {
  constructor(readonly name: string) {
    super();
    this.addClass('jp-jdist-sweepview');
    this.head = h('div', { class: 'jp-jdist-runview-head' }, `Loading sweep ${name}…`);
    this.frame = h('iframe', { class: 'jp-jdist-sweep-frame', sandbox: '', title: `jdist sweep ${name}` });
    this.node.append(this.head, this.frame);
  }

  protected onAfterAttach(msg: Message): void {
    void this.update_();
  }

  protected onBeforeDetach(msg: Message): void {
    this.stopPolling();
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
    let error: string | null = null;
    try {
      this.data = await api.sweep(this.name);
    } catch (e) {
      error = (e as Error).message;
    }
    if (this.isDisposed) {
      return;
    }
    if (this.data) {
      this.draw(this.data);
    }
    if (error) {
      this.head.classList.add('jp-jdist-error');
      this.head.textContent = `Sweep ${this.name}: ${error}`;
    }
    if ((!this.data || this.data.status === 'running') && this.isAttached) {
      this.timer = window.setTimeout(() => void this.update_(), POLL_MS);
    }
  }

  private draw(d: ISweepDetail): void {
    this.node.dataset.status = d.status;
    this.head.classList.remove('jp-jdist-error');
    const elapsed = (d.ended ?? Date.now() / 1000) - d.started;
    setChildren(
      this.head,
      h(
        'div',
        { class: 'jp-jdist-runview-title' },
        h('span', { class: `jp-jdist-badge jp-jdist-run-${d.status}` }, d.status),
        h('span', {}, `jdist sweep ${d.name}`),
        d.notebook ? h('span', { class: 'jp-jdist-meta' }, d.notebook.split('/').pop() ?? '') : null
      ),
      h('div', { class: 'jp-jdist-meta' }, `${sweepLine(d)} · started ${runTime(d.started)} · ${duration(elapsed)}`),
      h('div', { class: 'jp-jdist-meta', title: 'Optuna journal: optuna-dashboard and jupyterlab-optuna open it' }, `journal ${d.journal}`)
    );
    if (d.html !== this.shown) {
      this.shown = d.html;
      this.frame.srcdoc = `<!doctype html><meta charset="utf-8"><body style="margin:8px;background:#fff">${d.html}</body>`;
    }
  }

  private head: HTMLElement;
  private frame: HTMLIFrameElement;
  private data: ISweepDetail | null = null;
  private shown: string | null = null;
  private timer: number | null = null;
}

/** The sweep view in a main-area tab. */
export function createSweepWidget(name: string): MainAreaWidget<SweepView> {
  const content = new SweepView(name);
  const widget = new MainAreaWidget({ content });
  widget.id = `jdist-sweep-${name}`;
  widget.title.label = `Sweep ${name.replace(/^sweep-/, '')}`;
  widget.title.caption = `jdist sweep ${name}`;
  widget.title.icon = jdistIcon;
  widget.title.closable = true;
  return widget;
}
