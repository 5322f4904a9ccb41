/**
 * The notebook's live dashboard, drawn in the browser (bundled on its own into
 * jdist/kernel/dashboard/charts.js by dashboard.config.js; the labextension does not load it).
 *
 * The kernel loads this module once per page, as the ES module of one hidden widget
 * (jdist.kernel.dashboard.widget.ChartsLib), which registers it under its version key. Each
 * dashboard's own module (jdist/kernel/dashboard/live.js) is a few lines: it keeps the messages
 * that arrive, waits for this module and calls `render`. The kernel sends only new points
 * (ILivePoints, float64 buffers) a few times a second and the panels' layout, bars and header
 * as widget state; this module keeps the points and draws every panel with drawPanel, like the
 * sidebar's run view.
 */
import { h, setChildren } from './dom';
import { drawPanel, thinPanel } from './panels';
import type { IDashboardHead, ILiveLine, ILivePoints, Panel } from './protocol';

type Col = (number | null)[];

interface ILine {
  x: number[];
  y: Col;
  low: Col | null;
  high: Col | null;
}

/** A dashboard's received data, shared by its views (kept by live.js per widget model). */
export interface IStore {
  queue: [unknown, DataView[]][];
  views: Set<() => void>;
  lines?: Record<string, ILine>;
  seq?: number;
  gaps?: number;
}

/** The part of an anywidget model this module uses. */
interface IModel {
  get(name: string): any;
  on(event: string, cb: () => void): void;
  off(event: string, cb: () => void): void;
}

/** Milliseconds between two redraws at most (the kernel sends at most every 250 ms). */
const MIN_REDRAW_MS = 200;

function column(buffer: DataView, n: number): Col {
  // a copy: the buffer's offset in its ArrayBuffer need not be a multiple of 8
  const values = new Float64Array(buffer.buffer.slice(buffer.byteOffset, buffer.byteOffset + 8 * n));
  return Array.from(values, v => (Number.isNaN(v) ? null : v));
}

/** Apply one kernel message to the store's lines. */
/** Where a series' points are kept: by panel and series name. */
function lineKey(panel: string, series: string): string {
  return `${panel}\u0000${series}`;
}

function applyPoints(store: IStore, msg: ILivePoints, buffers: DataView[]): void {
  const lines = (store.lines ??= {});
  if (store.seq !== undefined && msg.seq !== store.seq + 1) {
    store.gaps = (store.gaps ?? 0) + 1;
  } else if (store.seq === undefined && msg.seq !== 0) {
    store.gaps = (store.gaps ?? 0) + 1;
  }
  store.seq = msg.seq;
  let b = 0;
  msg.lines.forEach((d: ILiveLine) => {
    const x = column(buffers[b++], d.n) as number[];
    const y = column(buffers[b++], d.n);
    const low = d.band ? column(buffers[b++], d.n) : null;
    const high = d.band ? column(buffers[b++], d.n) : null;
    const key = lineKey(d.panel, d.series);
    let line = lines[key];
    if (!line || d.reset) {
      line = lines[key] = { x: [], y: [], low: d.band ? [] : null, high: d.band ? [] : null };
    } else if (d.replace_from !== null) {
      const from = d.replace_from;
      let keep = line.x.findIndex(v => v >= from);
      keep = keep < 0 ? line.x.length : keep;
      line.x.length = keep;
      line.y.length = keep;
      if (line.low && line.high) {
        line.low.length = keep;
        line.high.length = keep;
      }
    }
    line.x.push(...x);
    line.y.push(...y);
    if (line.low && line.high && low && high) {
      line.low.push(...low);
      line.high.push(...high);
    }
  });
}

/** The panels to draw: the layout's line panels, each series filled with the store's points; the rest as sent. */
function currentPanels(layout: Panel[], whole: Panel[], lines: Record<string, ILine>): Panel[] {
  const byKey = new Map(whole.map(p => [p.key, p]));
  return layout.map(p => {
    const sent = byKey.get(p.key);
    if (sent) {
      return sent;
    }
    if (p.kind !== 'line') {
      return p;
    }
    return thinPanel({
      ...p,
      series: p.series.map(s => {
        const line = lines[lineKey(p.key, s.name)];
        return line ? { ...s, ...line, low: s.low ? line.low : null, high: s.high ? line.high : null } : s;
      })
    });
  });
}

/** Draw one dashboard into `el` and keep it current; returns the clean-up. */
function render({ model, el, store }: { model: IModel; el: HTMLElement; store: IStore }): () => void {
  el.classList.add('jp-jdist-dash');
  const head = h('div', { class: 'jp-jdist-dash-head' });
  const bar = h('div', { class: 'jp-jdist-progress-bar' });
  const track = h('div', { class: 'jp-jdist-progress' }, bar);
  const progress = h('span', { class: 'jp-jdist-dash-progress-text' });
  const grid = h('div', { class: 'jp-jdist-grid' });
  el.append(head, h('div', { class: 'jp-jdist-dash-progress' }, track, progress), grid);
  let draws = 0;
  let last = 0;
  let timer: number | null = null;

  const draw = () => {
    while (store.queue.length) {
      const [msg, buffers] = store.queue.shift()!;
      if ((msg as ILivePoints)?.type === 'points') {
        applyPoints(store, msg as ILivePoints, buffers);
      }
    }
    const info = model.get('head') as IDashboardHead | null;
    if (info) {
      setChildren(head, h('b', {}, 'jdist'), ` ${info.title} · `, h('b', {}, info.status), info.problem ? `: ${info.problem}` : '');
      track.style.display = info.total ? '' : 'none';
      bar.style.width = info.total ? `${Math.min(100, (100 * info.done) / Math.max(1, info.total)).toFixed(1)}%` : '0';
      progress.textContent = info.progress;
    }
    const width = el.clientWidth || 800;
    const panelWidth = Math.max(260, Math.floor(width > 720 ? width / 2 : width) - 18);
    const panels = currentPanels(model.get('layout') ?? [], model.get('whole') ?? [], store.lines ?? {});
    setChildren(grid, ...panels.map(p => h('div', { class: 'jp-jdist-chartbox', 'data-panel': p.key }, drawPanel(p, panelWidth, 230))));
    draws += 1;
    el.dataset.draws = String(draws);
    el.dataset.seq = String(store.seq ?? -1);
    el.dataset.gaps = String(store.gaps ?? 0);
  };
  const schedule = () => {
    if (timer !== null) {
      return;
    }
    const wait = Math.max(0, last + MIN_REDRAW_MS - performance.now());
    timer = window.setTimeout(() => {
      requestAnimationFrame(() => {
        timer = null;
        last = performance.now();
        draw();
      });
    }, wait);
  };
  const events = 'change:layout change:whole change:head';
  store.views.add(schedule);
  model.on(events, schedule);
  let lastWidth = -1;
  const ro = new ResizeObserver(entries => {
    const w = Math.round(entries[0].contentRect.width);
    if (w !== lastWidth) {
      lastWidth = w;
      schedule();
    }
  });
  ro.observe(el);
  draw();
  return () => {
    store.views.delete(schedule);
    model.off(events, schedule);
    ro.disconnect();
    if (timer !== null) {
      clearTimeout(timer);
    }
  };
}

const REGISTRY = '__jdist_dashboard';
const LOADS = '__jdist_dashboard_loads';
const g = globalThis as any;
g[LOADS] = (g[LOADS] ?? 0) + 1; // how often a page evaluated this module (the browser test reads it)

/** The hidden library widget's hooks: register this module under the widget's version key. */
export default {
  initialize({ model }: { model: IModel }): void {
    (g[REGISTRY] ??= {})[model.get('key')] = { render, applyPoints };
  }
};
