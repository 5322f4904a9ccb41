/**
 * The "Distributed" sidebar: running clusters (per rank idle/busy/dead, interrupt/restart/stop),
 * jdist.tune sweeps (./sweeps.ts) and recent runs with live sparklines (one per dashboard panel
 * that defines one: loss and step time, and plugins' panels). Polls the REST API every second
 * while it is visible.
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { api, APIError, ICluster, IRunSummary } from './api';
import type { ISpark } from './protocol';
import { sparkline } from './charts';
import { duration, fmt, h, runTime, seconds, setChildren } from './dom';
import { jdistIcon } from './icon';
import { SweepList } from './sweeps';

const POLL_MS = 1000;
type Action = 'interrupt' | 'restart' | 'stop';

interface ICardState {
  el: HTMLElement;
  body: HTMLElement;
  message: HTMLElement;
  buttons: Record<Action, HTMLButtonElement>;
  pending: Action | null;
  cluster: ICluster | null;
  optionsOpen: boolean;
}

interface IRunRow {
  el: HTMLElement;
  head: HTMLElement;
  body: HTMLElement;
}

export class DistributedSidebar extends Widget {
  constructor(
    private openRun: (runId: string) => void,
    openSweep: (name: string) => void
  ) {
    super();
    this.id = 'jdist-sidebar';
    this.title.icon = jdistIcon;
    this.title.caption = 'Distributed: jdist clusters and runs';
    this.addClass('jp-jdist-sidebar');
    const refresh = h('button', { class: 'jp-jdist-iconbutton', title: 'Refresh now', 'aria-label': 'Refresh' }, '⟳');
    refresh.addEventListener('click', () => void this.refresh());
    this.status = h('div', { class: 'jp-jdist-status' });
    this.clustersEl = h('div', { class: 'jp-jdist-clusters' });
    this.runsEl = h('div', { class: 'jp-jdist-runs' });
    this.sweeps = new SweepList(h('div', { class: 'jp-jdist-sweeps', hidden: true }), openSweep);
    this.node.append(
      h('header', { class: 'jp-jdist-header' }, h('span', { class: 'jp-jdist-title' }, 'Distributed'), refresh),
      this.status,
      h('h3', { class: 'jp-jdist-section-title' }, 'Clusters'),
      this.clustersEl,
      this.sweeps.el,
      h('h3', { class: 'jp-jdist-section-title' }, 'Runs'),
      this.runsEl
    );
  }

  protected onAfterShow(msg: Message): void {
    void this.refresh();
    this.schedule();
  }

  protected onAfterAttach(msg: Message): void {
    if (this.isVisible) {
      void this.refresh();
      this.schedule();
    }
  }

  protected onBeforeHide(msg: Message): void {
    this.unschedule();
  }

  protected onBeforeDetach(msg: Message): void {
    this.unschedule();
  }

  dispose(): void {
    this.unschedule();
    super.dispose();
  }

  private schedule(): void {
    this.unschedule();
    this.timer = window.setInterval(() => {
      if (this.isVisible && !this.busy) {
        void this.refresh();
      }
    }, POLL_MS);
  }

  private unschedule(): void {
    if (this.timer !== null) {
      window.clearInterval(this.timer);
      this.timer = null;
    }
  }

  async refresh(): Promise<void> {
    this.busy = true;
    try {
      const [clusters, sweeps, runs] = await Promise.all([api.clusters(), api.sweeps(), api.runs()]);
      setChildren(this.status);
      this.status.classList.remove('jp-jdist-error');
      this.renderClusters(clusters);
      this.sweeps.render(sweeps);
      this.renderRuns(runs);
    } catch (error) {
      this.status.classList.add('jp-jdist-error');
      setChildren(
        this.status,
        error instanceof APIError && error.status === 404
          ? 'The jdist server extension is not enabled in this Jupyter server (jupyter server extension enable jdist.server).'
          : `Cannot update: ${(error as Error).message}`
      );
    } finally {
      this.busy = false;
    }
  }

  // -- clusters ----------------------------------------------------------------------------
  private renderClusters(clusters: ICluster[]): void {
    const seen = new Set<string>();
    const order: HTMLElement[] = [];
    for (const c of clusters) {
      // keyed by kernel: a restarted cluster (new id) keeps its card and message
      const key = c.kernel_id ?? c.cluster_id;
      seen.add(key);
      let card = this.cards.get(key);
      if (!card) {
        card = this.newCard(key);
        this.cards.set(key, card);
      }
      card.cluster = c;
      this.fillCard(card, c);
      order.push(card.el);
    }
    for (const [key, card] of this.cards) {
      if (!seen.has(key) && card.pending === null) {
        this.cards.delete(key);
      } else if (!seen.has(key)) {
        order.push(card.el); // an action is running (restart): keep the card
      }
    }
    if (order.length === 0) {
      setChildren(
        this.clustersEl,
        h('div', { class: 'jp-jdist-empty' }, 'No jdist cluster is running. In a notebook: ', h('code', {}, '%load_ext jdist'), ' then a ', h('code', {}, '%%distributed -n 2'), ' cell.')
      );
      return;
    }
    setChildren(this.clustersEl, ...order);
  }

  private newCard(key: string): ICardState {
    const mk = (action: Action, label: string, title: string) => {
      const b = h('button', { class: `jp-jdist-button jp-jdist-${action}`, 'data-action': action, title }, label);
      b.addEventListener('click', () => void this.act(key, action));
      return b;
    };
    const buttons = {
      interrupt: mk('interrupt', 'Interrupt', 'Send SIGINT to the ranks (through the kernel while it runs a cell); rank variables are kept'),
      restart: mk('restart', 'Restart', 'Start fresh ranks with the same options (%dist restart; rank variables are lost)'),
      stop: mk('stop', 'Stop', 'Stop the ranks (%dist stop)')
    };
    const body = h('div', { class: 'jp-jdist-card-body' });
    const message = h('div', { class: 'jp-jdist-message', role: 'status' });
    const el = h('div', { class: 'jp-jdist-card jp-jdist-cluster' }, body, h('div', { class: 'jp-jdist-actions' }, buttons.interrupt, buttons.restart, buttons.stop), message);
    return { el, body, message, buttons, pending: null, cluster: null, optionsOpen: false };
  }

  private fillCard(card: ICardState, c: ICluster): void {
    card.el.dataset.clusterId = c.cluster_id;
    card.el.dataset.status = c.status;
    const busy = c.ranks.filter(r => r.state === 'busy' || r.state === 'paused').length;
    const kernel = c.kernel_state
      ? h('span', { class: `jp-jdist-badge jp-jdist-kernel-${c.kernel_state}`, title: 'kernel state' }, `kernel ${c.kernel_state}`)
      : h('span', { class: 'jp-jdist-badge', title: 'This kernel was not started by this Jupyter server' }, 'external kernel');
    const rows = c.ranks.map(r =>
      h(
        'tr',
        { 'data-rank': r.rank, 'data-state': r.state },
        h('td', {}, String(r.rank)),
        h('td', { title: r.host }, r.host),
        h('td', {}, r.device),
        h('td', {}, String(r.pid)),
        h('td', {}, h('span', { class: `jp-jdist-dot jp-jdist-state-${r.state}` }), r.state)
      )
    );
    setChildren(
      card.body,
      h(
        'div',
        { class: 'jp-jdist-card-head' },
        h('span', { class: 'jp-jdist-nb', title: c.notebook ?? c.name }, c.name),
        c.status !== 'running' ? h('span', { class: `jp-jdist-badge jp-jdist-status-${c.status}` }, c.status) : null,
        kernel
      ),
      h(
        'div',
        { class: 'jp-jdist-meta' },
        `${c.backend} · `,
        h('span', { class: 'jp-jdist-nranks' }, `${c.ranks.length} rank${c.ranks.length === 1 ? '' : 's'}`),
        ` · ${c.devices.join(', ') || '?'} · ${c.hosts.join(', ')}`,
        c.uptime_s !== null ? ` · up ${duration(c.uptime_s)}` : null
      ),
      c.problem ? h('div', { class: 'jp-jdist-problem' }, c.problem) : null,
      h(
        'table',
        { class: 'jp-jdist-ranks' },
        h('thead', {}, h('tr', {}, h('th', {}, 'rank'), h('th', {}, 'host'), h('th', {}, 'device'), h('th', {}, 'pid'), h('th', {}, 'state'))),
        h('tbody', {}, ...rows)
      ),
      busy && c.current_run ? h('div', { class: 'jp-jdist-meta' }, `running ${c.current_run}`) : null,
      this.optionsTable(card, c)
    );
    const pending = card.pending !== null;
    const kernelIdle = c.kernel_state === 'idle';
    card.buttons.interrupt.disabled = pending || (busy === 0 && c.kernel_state !== 'busy') || c.status === 'dead';
    for (const b of [card.buttons.restart, card.buttons.stop]) {
      b.disabled = pending || !c.managed || !kernelIdle;
      b.title = !c.managed
        ? 'The kernel was not started by this Jupyter server: use %dist in its notebook'
        : !kernelIdle
          ? `The kernel is ${c.kernel_state}: interrupt or wait for the running cell first`
          : b === card.buttons.restart
            ? 'Start fresh ranks with the same options (%dist restart; rank variables are lost)'
            : 'Stop the ranks (%dist stop)';
    }
  }

  /** The cluster's %%distributed options (jdist/options.py), folded; stays open across refreshes. */
  private optionsTable(card: ICardState, c: ICluster): HTMLElement {
    const rows = c.options.map(o =>
      h(
        'tr',
        { 'data-option': o.name, title: o.help },
        h('td', {}, o.flag),
        h('td', {}, o.value),
        h('td', { class: `jp-jdist-scope jp-jdist-scope-${o.scope}` }, o.scope === 'restart' ? 'needs --restart' : 'changes live')
      )
    );
    const details = h(
      'details',
      { class: 'jp-jdist-options', open: card.optionsOpen },
      h('summary', {}, `options (launcher ${c.launcher})`),
      h('table', { class: 'jp-jdist-option-table' }, h('tbody', {}, ...rows))
    );
    details.addEventListener('toggle', () => {
      card.optionsOpen = (details as HTMLDetailsElement).open;
    });
    return details;
  }

  private async act(key: string, action: Action): Promise<void> {
    const card = this.cards.get(key);
    if (!card || !card.cluster || card.pending) {
      return;
    }
    const c = card.cluster;
    if (action !== 'interrupt') {
      const result = await showDialog({
        title: `${action === 'restart' ? 'Restart' : 'Stop'} the ranks of ${c.name}?`,
        body: `The ${c.ranks.length} ranks ${action === 'restart' ? 'are replaced by fresh ones' : 'stop'}; variables on them are lost. This runs %dist ${action} in the notebook's kernel.`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: action === 'restart' ? 'Restart' : 'Stop' })]
      });
      if (!result.button.accept) {
        return;
      }
    }
    card.pending = action;
    card.el.classList.add('jp-jdist-pending');
    const verb = { interrupt: 'Interrupting', restart: 'Restarting (a few seconds)', stop: 'Stopping' }[action];
    this.say(card, `${verb}…`, 'info');
    this.fillCard(card, c);
    try {
      const res = await api.action(c.cluster_id, action);
      this.say(card, res.message, 'ok');
      if (action === 'stop') {
        Notification.success(`${c.name}: ${res.message}`, { autoClose: 5000 });
      }
    } catch (error) {
      this.say(card, (error as Error).message, 'error');
      if (action === 'stop') {
        Notification.error(`${c.name}: ${(error as Error).message}`, { autoClose: 8000 });
      }
    } finally {
      card.pending = null;
      card.el.classList.remove('jp-jdist-pending');
      await this.refresh();
    }
  }

  private say(card: ICardState, text: string, kind: 'info' | 'ok' | 'error'): void {
    card.message.className = `jp-jdist-message jp-jdist-message-${kind}`;
    card.message.textContent = text;
  }

  // -- runs --------------------------------------------------------------------------------
  private renderRuns(runs: IRunSummary[]): void {
    if (runs.length === 0) {
      setChildren(this.runsEl, h('div', { class: 'jp-jdist-empty' }, 'No runs yet: a run is a %%distributed cell that calls jdist.log(...).'));
      this.rows.clear();
      return;
    }
    const seen = new Set<string>();
    const order: HTMLElement[] = [];
    for (const r of runs) {
      seen.add(r.run_id);
      let row = this.rows.get(r.run_id);
      if (!row) {
        const open = h('button', { class: 'jp-jdist-button jp-jdist-open', title: 'Open the full run view (dashboard charts)' }, 'Open');
        open.addEventListener('click', () => this.openRun(r.run_id));
        const head = h('div', { class: 'jp-jdist-card-head' });
        const body = h('div', { class: 'jp-jdist-run-body' });
        const el = h('div', { class: 'jp-jdist-card jp-jdist-run', 'data-run-id': r.run_id }, h('div', { class: 'jp-jdist-run-top' }, head, open), body);
        row = { el, head, body };
        this.rows.set(r.run_id, row);
      }
      this.fillRun(row, r);
      order.push(row.el);
    }
    for (const key of [...this.rows.keys()]) {
      if (!seen.has(key)) {
        this.rows.delete(key);
      }
    }
    setChildren(this.runsEl, ...order);
  }

  private fillRun(row: IRunRow, r: IRunSummary): void {
    row.el.dataset.status = r.status;
    const elapsed = (r.ended ?? Date.now() / 1000) - r.started;
    const steps = r.total_steps ? `step ${r.steps_done} / ${r.total_steps}` : `${r.steps_done} steps`;
    setChildren(
      row.head,
      h('span', { class: `jp-jdist-badge jp-jdist-run-${r.status}`, title: r.error ?? r.status }, r.status),
      h('span', { class: 'jp-jdist-runid', title: `run ${r.run_id}` }, runTime(r.started))
    );
    const notebook = r.notebook ? `${r.notebook.split('/').pop()} · ` : '';
    setChildren(
      row.body,
      h('div', { class: 'jp-jdist-meta jp-jdist-run-progress', 'data-steps': r.steps_done, title: r.notebook ?? '' }, `${notebook}${r.world_size} ranks · ${r.backend || '?'} · ${steps} · ${duration(elapsed)}`),
      h('div', { class: 'jp-jdist-sparks' }, ...r.sparks.map(sparkBox)),
      r.error && r.status !== 'interrupted' ? h('div', { class: 'jp-jdist-problem', title: r.error }, r.error) : null
    );
  }

  private status: HTMLElement;
  private clustersEl: HTMLElement;
  private runsEl: HTMLElement;
  private sweeps: SweepList;
  private cards = new Map<string, ICardState>();
  private rows = new Map<string, IRunRow>();
  private timer: number | null = null;
  private busy = false;
}

/** One sparkline of a run (a panel's, jdist/metrics/panels.py Spark) with its newest value. */
function sparkBox(s: ISpark): HTMLElement {
  const value = s.unit === 's' ? seconds(s.last) : fmt(s.last, 3);
  return h(
    'div',
    { class: `jp-jdist-spark-box jp-jdist-spark-${s.key}` },
    h('div', { class: 'jp-jdist-spark-label' }, `${s.label} `, h('b', {}, value)),
    sparkline(s.x, s.y, { color: s.color, label: `${s.label} (mean over ranks) per step` })
  );
}
