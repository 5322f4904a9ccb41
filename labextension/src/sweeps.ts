/**
 * jdist.tune sweeps in the "Distributed" sidebar: one card per sweep (status, trials ended out of the
 * budget, trials per state, best so far) with a button that opens its full view.
 */
import type { ISweepSummary } from './protocol';
import { fmt, h, runTime, setChildren } from './dom';

/** Trial states that count towards a sweep's budget (jdist/kernel/tune.py _counts). */
const ENDED = ['COMPLETE', 'PRUNED', 'FAIL'];
const STATES: [string, string][] = [
  ['RUNNING', 'running'],
  ['QUEUED', 'queued'],
  ['COMPLETE', 'complete'],
  ['PRUNED', 'pruned'],
  ['FAIL', 'failed'],
  ['INTERRUPTED', 'interrupted']
];

/** Trials ended out of the budget. */
export function trialsEnded(s: ISweepSummary): number {
  return ENDED.reduce((n, k) => n + (s.counts[k] ?? 0), 0);
}

/** "12 / 32 trials · 4 slots × 2 ranks · 2 running, 9 complete, 1 pruned". */
export function sweepLine(s: ISweepSummary): string {
  const states = STATES.filter(([k]) => s.counts[k]).map(([k, label]) => `${s.counts[k]} ${label}`);
  const slots = `${s.slots} slot${s.slots === 1 ? '' : 's'} × ${s.per_trial} rank${s.per_trial === 1 ? '' : 's'}`;
  return [`${trialsEnded(s)} / ${s.trials} trials`, slots, states.join(', ')].filter(Boolean).join(' · ');
}

function bestLine(s: ISweepSummary): string {
  if (s.best_trial === null || s.best_value === null) {
    return 'no trial completed yet';
  }
  const params = Object.entries(s.best_params ?? {})
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k}=${typeof v === 'number' ? fmt(v, 4) : String(v)}`)
    .join(', ');
  return `best ${s.metric ?? 'value'} ${fmt(s.best_value, 4)} (trial ${s.best_trial}${params ? `: ${params}` : ''})`;
}

/** The sweep cards, keyed by name so that a card keeps its element across refreshes. */
export class SweepList {
  constructor(
    readonly el: HTMLElement,
    private openSweep: (name: string) => void
  ) {}

  render(sweeps: ISweepSummary[]): void {
    this.el.hidden = sweeps.length === 0; // no section until the first sweep
    const order: HTMLElement[] = [h('h3', { class: 'jp-jdist-section-title' }, 'Sweeps')];
    const seen = new Set<string>();
    for (const s of sweeps) {
      seen.add(s.name);
      let card = this.cards.get(s.name);
      if (!card) {
        const open = h('button', { class: 'jp-jdist-button jp-jdist-open', title: 'Open the sweep view (timeline, curves, trials)' }, 'Open');
        open.addEventListener('click', () => this.openSweep(s.name));
        const head = h('div', { class: 'jp-jdist-card-head' });
        const body = h('div', { class: 'jp-jdist-run-body' });
        card = { el: h('div', { class: 'jp-jdist-card jp-jdist-sweep', 'data-sweep': s.name }, h('div', { class: 'jp-jdist-run-top' }, head, open), body), head, body };
        this.cards.set(s.name, card);
      }
      this.fill(card, s);
      order.push(card.el);
    }
    for (const key of [...this.cards.keys()]) {
      if (!seen.has(key)) {
        this.cards.delete(key);
      }
    }
    setChildren(this.el, ...order);
  }

  private fill(card: { el: HTMLElement; head: HTMLElement; body: HTMLElement }, s: ISweepSummary): void {
    card.el.dataset.status = s.status;
    const ended = trialsEnded(s);
    card.el.dataset.ended = String(ended);
    const lost = s.status === 'lost' ? 'Its kernel stopped while it ran: jdist.tune(..., resume=True) goes on from the journal.' : null;
    setChildren(
      card.head,
      h('span', { class: `jp-jdist-badge jp-jdist-run-${s.status}` }, s.status),
      h('span', { class: 'jp-jdist-runid', title: `sweep ${s.name}, started ${runTime(s.started)}` }, s.name)
    );
    setChildren(
      card.body,
      h('div', { class: 'jp-jdist-meta jp-jdist-sweep-progress', title: s.notebook ?? '' }, `${s.notebook ? `${s.notebook.split('/').pop()} · ` : ''}${sweepLine(s)}`),
      h('div', { class: 'jp-jdist-sweep-bar' }, h('div', { style: `width: ${Math.min(100, (100 * ended) / Math.max(1, s.trials)).toFixed(1)}%` })),
      h('div', { class: 'jp-jdist-sweep-best', title: bestLine(s) }, bestLine(s)),
      lost ? h('div', { class: 'jp-jdist-problem' }, lost) : null
    );
  }

  private cards = new Map<string, { el: HTMLElement; head: HTMLElement; body: HTMLElement }>();
}
