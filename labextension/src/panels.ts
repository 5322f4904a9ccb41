/**
 * One dashboard panel drawn by its kind (jdist/metrics/panels.py defines them as data): a line
 * panel as a line chart of each of its series (with their min–max bands), a bar panel as bars per
 * rank (or host), a heatmap as a rank × step image, a table as rows of text. The sidebar's run
 * view and the notebook's live dashboard (notebook.ts) draw every panel with this, and thin long
 * lines the way the kernel's static summary does (jdist.metrics.panels.thin).
 */
import { barChart, heatmapChart, lineChart, tableChart } from './charts';
import { fmt } from './dom';
import type { Panel } from './protocol';

/** Values with a unit, short: "12.3 ms", "310 MiB". */
export function formatter(unit: string): (v: number) => string {
  if (unit === 's') {
    return v => `${fmt(v * 1000)} ms`;
  }
  return v => `${fmt(v)} ${unit}`;
}

/** A MiB value small enough to read in KiB (the model+optimizer state beside a process's RSS). */
export function sizeLabel(unit: string): (v: number) => string {
  return unit === 'MiB' ? v => (v < 1 ? `${(v * 1024).toFixed(1)} KiB` : `${v.toFixed(1)} MiB`) : formatter(unit);
}

/** One panel, by its kind. */
export function drawPanel(p: Panel, width: number, height: number): SVGSVGElement {
  const className = `jp-jdist-chart-${p.key}`;
  if (p.kind === 'line') {
    return lineChart({
      width,
      height,
      title: p.title,
      series: p.series.map(s => ({ name: s.name, color: s.color, steps: s.x, values: s.y, low: s.low ?? undefined, high: s.high ?? undefined })),
      xTitle: p.x_title,
      className
    });
  }
  if (p.kind === 'heatmap') {
    const format = p.unit === 's' ? formatter('s') : p.unit ? formatter(p.unit) : (v: number) => `${Math.round(v * 100)}%`;
    return heatmapChart(p, { width, height, format, className });
  }
  if (p.kind === 'table') {
    return tableChart({ width, height, title: p.title, columns: p.columns, rows: p.rows, note: p.note, className });
  }
  return barChart({
    width,
    height,
    title: p.title,
    categories: p.categories,
    stacked: p.stacked,
    series: p.series.map(s => ({ name: s.name, color: s.color, values: s.values, label: s.labels ? sizeLabel(p.unit) : undefined })),
    format: formatter(p.unit),
    className
  });
}


/** The most points a line gets when drawn (jdist.metrics.panels.MAX_POINTS). */
export const MAX_POINTS = 1000;

type Col = (number | null)[];

/**
 * `xs`/`ys` with at most `maxPoints` points: consecutive points in equal buckets, each drawn at its
 * last x with `reduce` of its values (missing ones left out). As jdist.metrics.panels.thin.
 */
export function thin(xs: number[], ys: Col, reduce: (v: number[]) => number, maxPoints = MAX_POINTS): [number[], Col] {
  const n = xs.length;
  const size = Math.ceil(n / maxPoints);
  if (size <= 1) {
    return [xs, ys];
  }
  const ox: number[] = [];
  const oy: Col = [];
  for (let i = 0; i < n; i += size) {
    const bucket: number[] = [];
    for (let j = i; j < Math.min(i + size, n); j++) {
      const v = ys[j];
      if (v !== null && v !== undefined && isFinite(v)) {
        bucket.push(v);
      }
    }
    ox.push(xs[Math.min(i + size, n) - 1]);
    oy.push(bucket.length ? reduce(bucket) : null);
  }
  return [ox, oy];
}

export const mean = (v: number[]): number => v.reduce((a, b) => a + b, 0) / v.length;
export const lowest = (v: number[]): number => Math.min(...v);
export const highest = (v: number[]): number => Math.max(...v);

/** A line panel with every series thinned to `maxPoints` (a band keeps its extremes). */
export function thinPanel(p: Panel, maxPoints = MAX_POINTS): Panel {
  if (p.kind !== 'line') {
    return p;
  }
  return {
    ...p,
    series: p.series.map(s => {
      const [x, y] = thin(s.x, s.y, mean, maxPoints);
      return {
        ...s,
        x,
        y,
        low: s.low ? thin(s.x, s.low, lowest, maxPoints)[1] : null,
        high: s.high ? thin(s.x, s.high, highest, maxPoints)[1] : null
      };
    })
  };
}
