/** Tiny DOM helpers (text is always set as text: no HTML injection from run data). */

export type Child = Node | string | number | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number | boolean | undefined | null> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el: Element, children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function setChildren(el: Element, ...children: Child[]): void {
  el.textContent = '';
  append(el, children);
}

/** "0.0123" / "1.23e-5" / "1234": short numbers for labels. */
export function fmt(value: number | null | undefined, digits = 3): string {
  if (value === null || value === undefined || !isFinite(value)) {
    return '–';
  }
  const abs = Math.abs(value);
  if (abs !== 0 && (abs >= 1e5 || abs < 1e-3)) {
    return value.toExponential(digits - 1);
  }
  if (Number.isInteger(value)) {
    return String(value);
  }
  return String(Number(value.toPrecision(digits)));
}

/** Seconds as "mm:ss" or "h:mm:ss". */
export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '--:--';
  }
  const s = Math.max(0, Math.round(seconds));
  const hh = Math.floor(s / 3600);
  const mm = Math.floor((s % 3600) / 60);
  const ss = s % 60;
  const two = (n: number) => String(n).padStart(2, '0');
  return hh ? `${hh}:${two(mm)}:${two(ss)}` : `${two(mm)}:${two(ss)}`;
}

/** Seconds as "12 ms" / "1.2 s". */
export function seconds(value: number | null | undefined): string {
  if (value === null || value === undefined || !isFinite(value)) {
    return '–';
  }
  return value < 1 ? `${fmt(value * 1000, 3)} ms` : `${fmt(value, 3)} s`;
}

/** A run's start time: "06:19:53" today, else "Nov 22 06:19". */
export function runTime(started: number): string {
  const d = new Date(started * 1000);
  const today = new Date().toDateString() === d.toDateString();
  return today
    ? d.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false })
    : d.toLocaleString(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', hour12: false });
}
