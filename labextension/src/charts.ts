/**
 * Small SVG charts drawn from plain arrays: sparklines for the sidebar, and a line chart (with an
 * optional min-max band) and a bar chart (stacked or grouped) that draw the run view's panels.
 * The panels' colours come with their data (jdist/metrics/panels.py), as in the notebook.
 */
import { fmt } from './dom';
import type { IHeatmapPanel } from './protocol';

const SVG = 'http://www.w3.org/2000/svg';
/** The colour of a series that gives none (every panel of jdist/metrics/panels.py gives its own). */
const DEFAULT_COLOR = '#1f77b4';

type Num = number | null | undefined;

function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number> = {},
  text?: string
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, String(v));
  }
  if (text !== undefined) {
    el.textContent = text;
  }
  return el;
}

function ok(v: Num): v is number {
  return v !== null && v !== undefined && isFinite(v);
}

function extent(values: Num[]): [number, number] | null {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (ok(v)) {
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
  }
  return lo <= hi ? [lo, hi] : null;
}

/** About `count` round tick values covering [lo, hi]. */
export function niceTicks(lo: number, hi: number, count = 5): number[] {
  if (!(hi > lo)) {
    const pad = Math.abs(lo) * 0.1 || 1;
    lo -= pad;
    hi += pad;
  }
  const raw = (hi - lo) / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(st => st >= raw) ?? 10 * mag;
  const first = Math.ceil(lo / step - 1e-9) * step;
  const ticks: number[] = [];
  for (let v = first; v <= hi + step * 1e-9; v += step) {
    ticks.push(Math.abs(v) < step * 1e-9 ? 0 : Number(v.toPrecision(12)));
  }
  return ticks;
}

/** Path "d" through (x, y) points, broken where y is missing. */
function linePath(xs: number[], ys: Num[], sx: (x: number) => number, sy: (y: number) => number): string {
  let d = '';
  let pen = false;
  xs.forEach((x, i) => {
    const y = ys[i];
    if (!ok(y)) {
      pen = false;
      return;
    }
    d += `${pen ? 'L' : 'M'}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`;
    pen = true;
  });
  return d;
}

/** A sparkline: `data-points` holds the number of points drawn (tests read it). */
export function sparkline(
  xs: number[],
  ys: Num[],
  opts: { width?: number; height?: number; color?: string; label: string }
): SVGSVGElement {
  const width = opts.width ?? 120;
  const height = opts.height ?? 30;
  const svg = s('svg', {
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    class: 'jp-jdist-spark',
    role: 'img',
    'aria-label': opts.label
  });
  const points = ys.filter(ok).length;
  svg.dataset.points = String(points);
  svg.dataset.lastX = xs.length ? String(xs[xs.length - 1]) : '';
  svg.appendChild(s('title', {}, opts.label));
  const ex = extent(ys);
  if (!ex || xs.length === 0) {
    svg.appendChild(s('line', { x1: 2, x2: width - 2, y1: height / 2, y2: height / 2, class: 'jp-jdist-spark-empty' }));
    return svg;
  }
  const [x0, x1] = [xs[0], xs[xs.length - 1]];
  const sx = (x: number) => 2 + ((x - x0) / (x1 - x0 || 1)) * (width - 4);
  const sy = (y: number) => height - 3 - ((y - ex[0]) / (ex[1] - ex[0] || 1)) * (height - 6);
  svg.appendChild(
    s('path', { d: linePath(xs, ys, sx, sy), fill: 'none', stroke: opts.color ?? DEFAULT_COLOR, 'stroke-width': 1.5, class: 'jp-jdist-spark-line' })
  );
  const last = [...ys.keys()].reverse().find(i => ok(ys[i]));
  if (last !== undefined) {
    svg.appendChild(s('circle', { cx: sx(xs[last]), cy: sy(ys[last] as number), r: 2, fill: opts.color ?? DEFAULT_COLOR }));
  }
  return svg;
}

interface IFrame {
  svg: SVGSVGElement;
  plot: { left: number; top: number; width: number; height: number };
}

const MARGIN = { left: 52, right: 12, top: 26, bottom: 30 };

function frame(width: number, height: number, title: string, legend: [string, string][]): IFrame {
  const svg = s('svg', { width, height, viewBox: `0 0 ${width} ${height}`, class: 'jp-jdist-chart', role: 'img', 'aria-label': title });
  svg.appendChild(s('text', { x: 4, y: 14, class: 'jp-jdist-chart-title' }, title));
  // legend right of the title, or on its own line when both do not fit (estimated text widths)
  const legendWidth = legend.reduce((acc, [name]) => acc + name.length * 6.2 + 22, 0);
  const ownLine = title.length * 7.2 + legendWidth + 16 > width;
  const ly = ownLine ? 30 : 14;
  let lx = width - MARGIN.right;
  for (const [name, color] of [...legend].reverse()) {
    svg.appendChild(s('text', { x: lx, y: ly, 'text-anchor': 'end', class: 'jp-jdist-chart-legend' }, name));
    lx -= name.length * 6.2 + 4;
    svg.appendChild(s('rect', { x: lx - 10, y: ly - 8, width: 10, height: 10, fill: color, rx: 1 }));
    lx -= 18;
  }
  const top = MARGIN.top + (ownLine ? 16 : 0);
  const plot = {
    left: MARGIN.left,
    top,
    width: Math.max(20, width - MARGIN.left - MARGIN.right),
    height: Math.max(20, height - top - MARGIN.bottom)
  };
  return { svg, plot };
}

function yAxis(f: IFrame, lo: number, hi: number): (y: number) => number {
  const ticks = niceTicks(lo, hi, Math.max(2, Math.floor(f.plot.height / 35)));
  const y0 = Math.min(lo, ticks[0]);
  const y1 = Math.max(hi, ticks[ticks.length - 1]);
  const sy = (y: number) => f.plot.top + f.plot.height - ((y - y0) / (y1 - y0 || 1)) * f.plot.height;
  for (const t of ticks) {
    const y = sy(t);
    f.svg.appendChild(s('line', { x1: f.plot.left, x2: f.plot.left + f.plot.width, y1: y, y2: y, class: 'jp-jdist-grid' }));
    f.svg.appendChild(s('text', { x: f.plot.left - 6, y: y + 4, 'text-anchor': 'end', class: 'jp-jdist-tick' }, fmt(t, 3)));
  }
  return sy;
}

function noData(f: IFrame, text = 'no data yet'): SVGSVGElement {
  f.svg.appendChild(
    s('text', { x: f.plot.left + f.plot.width / 2, y: f.plot.top + f.plot.height / 2, 'text-anchor': 'middle', class: 'jp-jdist-nodata' }, text)
  );
  return f.svg;
}

/** One line of a line chart: values over steps, optionally with a min–max band around it. */
export interface IChartLine {
  name: string;
  color?: string;
  steps: number[];
  values: Num[];
  low?: Num[];
  high?: Num[];
}

/** Lines over steps on one chart (a series with a band: the loss; its validation beside it), each
 * named in the legend, a band as "min–max" (as the static summary, jdist/kernel/dashboard/static.py). */
export function lineChart(opts: {
  width: number;
  height: number;
  title: string;
  series: IChartLine[];
  xTitle?: string;
  className?: string;
}): SVGSVGElement {
  const legend: [string, string][] = [];
  for (const s of opts.series) {
    const color = s.color ?? DEFAULT_COLOR;
    legend.push([s.name, color]);
    if (s.low && s.high) {
      legend.push(['min–max', `${color}4d`]);
    }
  }
  const f = frame(opts.width, opts.height, opts.title, legend);
  if (opts.className) {
    f.svg.classList.add(opts.className);
  }
  const all = opts.series.flatMap(s => [...s.values, ...(s.low ?? []), ...(s.high ?? [])]);
  const ey = extent(all);
  const steps = opts.series.flatMap(s => s.steps);
  if (!ey || steps.length === 0) {
    return noData(f);
  }
  const sy = yAxis(f, ey[0], ey[1]);
  const [x0, x1] = [Math.min(...steps), Math.max(...steps)];
  const sx = (x: number) => f.plot.left + ((x - x0) / (x1 - x0 || 1)) * f.plot.width;
  const xticks = niceTicks(x0, x1 === x0 ? x0 + 1 : x1, Math.max(2, Math.floor(f.plot.width / 70))).filter(t => t >= x0 && t <= x1);
  for (const t of xticks) {
    f.svg.appendChild(
      s('text', { x: sx(t), y: f.plot.top + f.plot.height + 14, 'text-anchor': 'middle', class: 'jp-jdist-tick' }, fmt(t, 4))
    );
  }
  f.svg.appendChild(
    s('text', { x: f.plot.left + f.plot.width, y: f.plot.top + f.plot.height + 27, 'text-anchor': 'end', class: 'jp-jdist-axis-label' }, opts.xTitle ?? 'step')
  );
  for (const series of opts.series) {
    drawSeries(f.svg, series, sx, sy);
  }
  return f.svg;
}

/** A series' band (along the max forward, back along the min, in runs of points where both
 * exist), then its line; `data-series`/`data-points` name it and count its points (tests read them). */
function drawSeries(svg: SVGSVGElement, series: IChartLine, sx: (x: number) => number, sy: (y: number) => number): void {
  const color = series.color ?? DEFAULT_COLOR;
  const xs = series.steps;
  const { low, high } = series;
  if (low && high) {
    let run: number[] = [];
    const flush = () => {
      if (run.length) {
        const up = run.map(i => `${sx(xs[i]).toFixed(1)},${sy(high[i] as number).toFixed(1)}`);
        const down = [...run].reverse().map(i => `${sx(xs[i]).toFixed(1)},${sy(low[i] as number).toFixed(1)}`);
        svg.appendChild(s('path', { d: `M${up.join('L')}L${down.join('L')}Z`, fill: color, 'fill-opacity': 0.25, stroke: 'none', class: 'jp-jdist-band' }));
      }
      run = [];
    };
    xs.forEach((_, i) => (ok(low[i]) && ok(high[i]) ? run.push(i) : flush()));
    flush();
  }
  const line = s('path', { d: linePath(xs, series.values, sx, sy), fill: 'none', stroke: color, 'stroke-width': 1.8, class: 'jp-jdist-line' });
  line.dataset.series = series.name;
  line.dataset.points = String(series.values.filter(ok).length);
  svg.appendChild(line);
}

/** Label every k-th bar so the labels do not overlap (as label_every in jdist/kernel/dashboard/static.py). */
export function labelEvery(categories: string[], width: number): number {
  const longest = Math.max(0, ...categories.map(c => c.length)) * 6.2 + 8;
  return Math.max(1, Math.ceil((categories.length * longest) / Math.max(width, 1)));
}

/** Bars per category: `stacked` puts the series on top of each other, else side by side. */
export function barChart(opts: {
  width: number;
  height: number;
  title: string;
  categories: string[];
  series: { name: string; color: string; values: Num[]; label?: (v: number) => string }[];
  stacked: boolean;
  format?: (v: number) => string;
  className?: string;
}): SVGSVGElement {
  const f = frame(opts.width, opts.height, opts.title, opts.series.map(x => [x.name, x.color]));
  if (opts.className) {
    f.svg.classList.add(opts.className);
  }
  const n = opts.categories.length;
  const totals = opts.categories.map((_, i) =>
    opts.stacked
      ? opts.series.reduce((acc, x) => acc + (ok(x.values[i]) ? (x.values[i] as number) : 0), 0)
      : Math.max(0, ...opts.series.map(x => (ok(x.values[i]) ? (x.values[i] as number) : 0)))
  );
  const hi = Math.max(0, ...totals);
  if (n === 0 || !(hi > 0)) {
    return noData(f);
  }
  const sy = yAxis(f, 0, hi * 1.08);
  const band = f.plot.width / n;
  const barW = Math.min(60, band * 0.7);
  const every = labelEvery(opts.categories, f.plot.width);
  opts.categories.forEach((cat, i) => {
    const cx = f.plot.left + band * (i + 0.5);
    if (i % every === 0) {
      f.svg.appendChild(s('text', { x: cx, y: f.plot.top + f.plot.height + 14, 'text-anchor': 'middle', class: 'jp-jdist-tick' }, cat));
    }
    let base = 0;
    opts.series.forEach((x, j) => {
      const v = x.values[i];
      if (!ok(v)) {
        return;
      }
      const w = opts.stacked ? barW : barW / opts.series.length;
      const left = opts.stacked ? cx - barW / 2 : cx - barW / 2 + j * w;
      const y0 = opts.stacked ? base : 0;
      const rect = s('rect', { x: left, y: sy(y0 + v), width: Math.max(1, w - (opts.stacked ? 0 : 2)), height: Math.max(0, sy(y0) - sy(y0 + v)), fill: x.color, class: 'jp-jdist-bar' });
      rect.appendChild(s('title', {}, `${cat} ${x.name}: ${opts.format ? opts.format(v) : fmt(v)}`));
      f.svg.appendChild(rect);
      if (x.label) {
        // values too small to see next to the others (model+optimizer state beside a process's RSS)
        f.svg.appendChild(
          s('text', { x: left + w / 2, y: sy(y0 + v) - 3, 'text-anchor': 'middle', fill: x.color, class: 'jp-jdist-barlabel' }, x.label(v))
        );
      }
      if (opts.stacked) {
        base += v;
      }
    });
  });
  return f.svg;
}

/** A heatmap's 256 colours (RGB): byte 0..254 along `colors` (evenly spaced stops), 255 light grey
 * (as palette in jdist/kernel/dashboard/static.py). */
export function palette(colors: string[]): [number, number, number][] {
  const stops = colors.map(c => [1, 3, 5].map(i => parseInt(c.slice(i, i + 2), 16)));
  const table: [number, number, number][] = [];
  for (let b = 0; b < 255; b++) {
    const at = (b / 254) * (stops.length - 1);
    const i = Math.min(Math.floor(at), stops.length - 2);
    const t = at - i;
    table.push([0, 1, 2].map(k => Math.round(stops[i][k] + (stops[i + 1][k] - stops[i][k]) * t)) as [number, number, number]);
  }
  table.push([0xee, 0xee, 0xee]);
  return table;
}

/** At most `most` rows of a heatmap's cells, for an image not that many pixels high: each pooled
 * cell is the one of its rows farthest from the median of all cells, so a rank that stands out
 * still shows (as pool_rows in jdist/kernel/dashboard/static.py). */
export function poolRows(cells: Uint8Array, rows: number, cols: number, most: number): [number, Uint8Array] {
  if (rows <= most || most < 1) {
    return [rows, cells];
  }
  const per = Math.ceil(rows / most);
  const valid = Array.from(cells).filter(b => b !== 255).sort((a, b) => a - b);
  const median = valid.length ? valid[Math.floor(valid.length / 2)] : 0;
  const out = new Uint8Array(Math.ceil(rows / per) * cols);
  let o = 0;
  for (let first = 0; first < rows; first += per) {
    for (let c = 0; c < cols; c++) {
      let best = 255;
      for (let r = first; r < Math.min(first + per, rows); r++) {
        const b = cells[r * cols + c];
        if (b !== 255 && (best === 255 || Math.abs(b - median) > Math.abs(best - median))) {
          best = b;
        }
      }
      out[o++] = best;
    }
  }
  return [Math.ceil(rows / per), out];
}

/** A heatmap of at most this many rows (on one host) names each row (a pipeline's stages), as
 * ROW_LABELS in jdist/kernel/dashboard/static.py. */
const ROW_LABELS = 12;

/** A value per row (rank) and column (steps) as colour: one pixelated image (a pixel per cell),
 * the rows' host groups on the left (or each row's name, when few), the colour scale on the right,
 * or the legend of its categories (`legend`: the pipeline's actions). `data-rows`/`data-columns`
 * on the image count its cells (tests read them). */
export function heatmapChart(p: IHeatmapPanel, opts: { width: number; height: number; format: (v: number) => string; className?: string }): SVGSVGElement {
  const legend = (p.legend ?? []) as [string, string][];
  const f = frame(opts.width, opts.height, p.title, legend);
  if (opts.className) {
    f.svg.classList.add(opts.className);
  }
  const cols = p.x.length;
  const rows = p.rows.length;
  if (!cols || !rows || p.low === null || p.high === null) {
    return noData(f);
  }
  const [pooled, bytes] = poolRows(Uint8Array.from(atob(p.cells), c => c.charCodeAt(0)), rows, cols, Math.floor(f.plot.height));
  const table = palette(p.colors);
  const canvas = document.createElement('canvas');
  canvas.width = cols;
  canvas.height = pooled;
  const ctx = canvas.getContext('2d');
  if (ctx) {
    const img = ctx.createImageData(cols, pooled);
    bytes.forEach((b, i) => {
      const [r, g, bl] = table[b] ?? table[255];
      img.data.set([r, g, bl, 255], i * 4);
    });
    ctx.putImageData(img, 0, 0);
  }
  const left = f.plot.left + 20;
  const plotW = f.plot.width - 70;
  const image = s('image', {
    x: left,
    y: f.plot.top,
    width: plotW,
    height: f.plot.height,
    preserveAspectRatio: 'none',
    style: 'image-rendering:pixelated',
    href: canvas.toDataURL('image/png'),
    class: 'jp-jdist-heat'
  });
  image.dataset.rows = String(rows);
  image.dataset.columns = String(cols);
  f.svg.appendChild(image);
  const rowH = f.plot.height / rows;
  const groups: [string, number, number][] = p.groups.length
    ? p.groups
    : rows <= ROW_LABELS
      ? p.rows.map((name, i): [string, number, number] => [name, i, 1])
      : [[`${p.rows[0]}–${p.rows[rows - 1]}`, 0, rows]];
  let lastLabel = -Infinity;
  for (const [host, first, count] of groups) {
    const mid = f.plot.top + (first + count / 2) * rowH;
    const label = s('text', { x: left - 4, y: mid + 3, 'text-anchor': 'end', class: 'jp-jdist-tick jp-jdist-heat-group' }, host);
    if (mid - lastLabel >= 11) {
      lastLabel = mid;
    } else {
      label.setAttribute('visibility', 'hidden'); // it would overlap the one above (kept for its name)
    }
    f.svg.appendChild(label);
    if (first && count * rowH >= 3) {
      const y = f.plot.top + first * rowH;
      f.svg.appendChild(s('line', { x1: left, x2: left + plotW, y1: y, y2: y, stroke: 'white' }));
    }
  }
  for (const i of [...new Set([0, Math.floor(cols / 2), cols - 1])]) {
    f.svg.appendChild(
      s('text', { x: left + ((i + 0.5) / cols) * plotW, y: f.plot.top + f.plot.height + 14, 'text-anchor': 'middle', class: 'jp-jdist-tick' }, fmt(p.x[i], 4))
    );
  }
  f.svg.appendChild(s('text', { x: left + plotW, y: f.plot.top + f.plot.height + 27, 'text-anchor': 'end', class: 'jp-jdist-axis-label' }, p.x_title));
  if (legend.length) {
    return f.svg;
  }
  const sx = left + plotW + 8;
  const steps = 20;
  for (let k = 0; k < steps; k++) {
    const [r, g, b] = table[Math.round((k / (steps - 1)) * 254)];
    f.svg.appendChild(
      s('rect', { x: sx, y: f.plot.top + f.plot.height * (1 - (k + 1) / steps), width: 10, height: f.plot.height / steps + 0.5, fill: `rgb(${r},${g},${b})` })
    );
  }
  f.svg.appendChild(s('text', { x: sx + 12, y: f.plot.top + 8, class: 'jp-jdist-tick' }, opts.format(p.high)));
  f.svg.appendChild(s('text', { x: sx + 12, y: f.plot.top + f.plot.height, class: 'jp-jdist-tick' }, opts.format(p.low)));
  return f.svg;
}

/** Rows of text under column titles, a note below (the slowest ranks); each row a `g` with
 * `data-rank` (tests read it). */
export function tableChart(opts: { width: number; height: number; title: string; columns: string[]; rows: string[][]; note: string; className?: string }): SVGSVGElement {
  const f = frame(opts.width, opts.height, opts.title, []);
  if (opts.className) {
    f.svg.classList.add(opts.className);
  }
  if (!opts.rows.length) {
    return noData(f);
  }
  const left = 8;
  const colW = (opts.width - 16) / opts.columns.length;
  const lineH = Math.min(20, (f.plot.height - 10) / (opts.rows.length + 1));
  let y = f.plot.top + 4;
  opts.columns.forEach((title, j) => f.svg.appendChild(s('text', { x: left + j * colW, y, class: 'jp-jdist-table-head' }, title)));
  for (const row of opts.rows) {
    y += lineH;
    const g = s('g', { class: 'jp-jdist-table-row' });
    g.dataset.rank = row[0];
    row.forEach((cell, j) => g.appendChild(s('text', { x: left + j * colW, y, class: 'jp-jdist-table-cell' }, cell)));
    f.svg.appendChild(g);
  }
  if (opts.note) {
    f.svg.appendChild(s('text', { x: left, y: opts.height - 8, class: 'jp-jdist-tick jp-jdist-table-note' }, opts.note));
  }
  return f.svg;
}
