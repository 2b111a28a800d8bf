/**
 * Two small SVG charts (no charting library: the bundle stays small and themed by CSS):
 * a line chart (metrics over steps) and a grouped bar chart (GPU-hours per day).
 * Every point or bar carries its values in data attributes and a <title> tooltip, so what the
 * chart shows can be read back exactly.
 */

const NS = 'http://www.w3.org/2000/svg';
/** Default drawing width in CSS pixels (the SVG scales to its box; text stays readable near this width). */
const WIDTH = 520;
const HEIGHT = 220;
const M = { left: 52, right: 12, top: 12, bottom: 34 };

function s<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number> = {}, ...children: (Node | string)[]): SVGElementTagNameMap[K] {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  for (const c of children) {
    node.append(c);
  }
  return node;
}

/** About `count` round tick values covering [min, max]. */
export function niceTicks(min: number, max: number, count = 5): number[] {
  if (!(max > min)) {
    return [min];
  }
  const raw = (max - min) / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(f => f * mag).find(st => st >= raw) ?? 10 * mag;
  const ticks: number[] = [];
  for (let t = Math.ceil(min / step) * step; t <= max + step * 1e-9; t += step) {
    ticks.push(Number(t.toPrecision(12)));
  }
  return ticks;
}

/** Shortest readable form of a number for axes and tooltips. */
export function fmt(x: number): string {
  if (!Number.isFinite(x)) {
    return String(x);
  }
  const a = Math.abs(x);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) {
    return x.toExponential(2);
  }
  return String(Number(x.toPrecision(4)));
}

function scale(d0: number, d1: number, r0: number, r1: number): (v: number) => number {
  if (d1 === d0) {
    return () => (r0 + r1) / 2;
  }
  return v => r0 + ((v - d0) / (d1 - d0)) * (r1 - r0);
}

function frame(title: string, className: string, W: number, H: number): SVGSVGElement {
  return s('svg', { class: `th-chart ${className}`, viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title, preserveAspectRatio: 'xMinYMin meet' });
}

function yAxis(svg: SVGSVGElement, W: number, H: number, ticks: number[], y: (v: number) => number, format: (v: number) => string): void {
  for (const t of ticks) {
    svg.append(
      s('line', { class: 'th-grid', x1: M.left, x2: W - M.right, y1: y(t), y2: y(t) }),
      s('text', { class: 'th-tick', x: M.left - 6, y: y(t) + 4, 'text-anchor': 'end' }, format(t))
    );
  }
  svg.append(s('line', { class: 'th-axis', x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom }));
}

export interface IPoint {
  x: number;
  y: number;
}

export interface ISeries {
  name: string;
  points: IPoint[];
}

export interface ILineChart {
  title: string;
  xLabel: string;
  series: ISeries[];
  /** How x values print on the axis and in tooltips (default: numbers). */
  xFormat?: (x: number) => string;
  width?: number;
  height?: number;
}

/** One line (and its points) per series, sharing the axes. */
export function lineChart(opts: ILineChart): SVGSVGElement {
  const W = opts.width ?? WIDTH;
  const H = opts.height ?? HEIGHT;
  const svg = frame(opts.title, 'th-line-chart', W, H);
  const all = opts.series.flatMap(se => se.points);
  const xf = opts.xFormat ?? fmt;
  if (!all.length) {
    svg.append(s('text', { class: 'th-empty', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no data'));
    return svg;
  }
  const xs = all.map(p => p.x);
  const ys = all.map(p => p.y);
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) {
    [y0, y1] = [y0 - (Math.abs(y0) || 1) / 2, y1 + (Math.abs(y1) || 1) / 2];
  }
  const yticks = niceTicks(y0, y1, 4);
  y0 = Math.min(y0, yticks[0]);
  y1 = Math.max(y1, yticks[yticks.length - 1]);
  const x = scale(Math.min(...xs), Math.max(...xs), M.left + 8, W - M.right - 8);
  const y = scale(y0, y1, H - M.bottom, M.top);
  yAxis(svg, W, H, yticks, y, fmt);
  svg.append(s('line', { class: 'th-axis', x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom }));
  const xticks = xs.length > 1 ? niceTicks(Math.min(...xs), Math.max(...xs), Math.max(2, Math.floor(W / 100))) : xs;
  for (const t of xticks) {
    svg.append(s('text', { class: 'th-tick', x: x(t), y: H - M.bottom + 14, 'text-anchor': 'middle' }, xf(t)));
  }
  svg.append(s('text', { class: 'th-axis-label', x: (M.left + W - M.right) / 2, y: H - 4, 'text-anchor': 'middle' }, opts.xLabel));
  opts.series.forEach((se, i) => {
    const g = s('g', { class: `th-series th-series-${i % 6}`, 'data-series': se.name });
    const pts = se.points.slice().sort((a, b) => a.x - b.x);
    if (pts.length > 1) {
      g.append(s('polyline', { class: 'th-line', points: pts.map(p => `${x(p.x).toFixed(1)},${y(p.y).toFixed(1)}`).join(' ') }));
    }
    for (const p of pts) {
      g.append(
        s(
          'circle',
          { class: 'th-point', cx: x(p.x).toFixed(1), cy: y(p.y).toFixed(1), r: pts.length > 60 ? 1.5 : 3, 'data-x': p.x, 'data-y': p.y },
          s('title', {}, `${se.name}: ${fmt(p.y)} at ${opts.xLabel} ${xf(p.x)}`)
        )
      );
    }
    svg.append(g);
  });
  return svg;
}

export interface IBarGroup {
  /** Category key, e.g. a day "2026-11-23". */
  key: string;
  /** Short label under the group, e.g. "11-23". */
  label: string;
  values: number[];
}

export interface IBarChart {
  title: string;
  /** Names of the bars in each group, e.g. ["held", "used"]. */
  series: string[];
  groups: IBarGroup[];
  unit: string;
  width?: number;
  height?: number;
}

/** Grouped bars: one group per category, one bar per series. */
export function barChart(opts: IBarChart): SVGSVGElement {
  const W = opts.width ?? WIDTH;
  const H = opts.height ?? HEIGHT;
  const svg = frame(opts.title, 'th-bar-chart', W, H);
  const max = Math.max(0, ...opts.groups.flatMap(g => g.values));
  const ticks = niceTicks(0, max > 0 ? max : 1, 4);
  const top = Math.max(max, ticks[ticks.length - 1]);
  const y = scale(0, top, H - M.bottom, M.top);
  yAxis(svg, W, H, ticks, y, fmt);
  svg.append(s('line', { class: 'th-axis', x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom }));
  svg.append(s('text', { class: 'th-axis-label', x: 12, y: M.top + 2, 'text-anchor': 'start', transform: `rotate(90 12 ${M.top + 2})` }, opts.unit));
  const n = Math.max(1, opts.groups.length);
  const slot = (W - M.left - M.right) / n;
  const bar = Math.max(1, (slot * 0.8) / Math.max(1, opts.series.length));
  const every = Math.ceil(n / Math.max(1, Math.floor((W - M.left - M.right) / 44)));
  opts.groups.forEach((grp, gi) => {
    const x0 = M.left + gi * slot + slot * 0.1;
    const g = s('g', { class: 'th-bar-group', 'data-key': grp.key });
    grp.values.forEach((v, si) => {
      const h = Math.max(0, y(0) - y(v));
      g.append(
        s(
          'rect',
          {
            class: `th-bar th-series-${si % 6}`,
            x: (x0 + si * bar).toFixed(1),
            y: (y(0) - h).toFixed(1),
            width: Math.max(0.5, bar - 0.5).toFixed(1),
            height: h.toFixed(1),
            'data-key': grp.key,
            'data-series': opts.series[si],
            'data-value': v
          },
          s('title', {}, `${grp.key}: ${fmt(v)} ${opts.unit} ${opts.series[si]}`)
        )
      );
    });
    if (gi % every === 0) {
      g.append(s('text', { class: 'th-tick', x: (x0 + (bar * opts.series.length) / 2).toFixed(1), y: H - M.bottom + 14, 'text-anchor': 'middle' }, grp.label));
    }
    svg.append(g);
  });
  return svg;
}

/** A legend row for the series of a chart (same colour classes). */
export function legend(names: string[]): HTMLElement {
  const div = document.createElement('div');
  div.className = 'th-legend';
  names.forEach((name, i) => {
    const item = document.createElement('span');
    item.className = `th-legend-item th-series-${i % 6}`;
    const swatch = document.createElement('span');
    swatch.className = 'th-swatch';
    item.append(swatch, name);
    div.append(item);
  });
  return div;
}
