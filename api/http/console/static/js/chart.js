// A pool's utilisation over time: capacity.history's points as a small SVG chart, allocated
// GPUs as a filled area and available GPUs as a line, each point held until the next (the
// figures change only at events). Drawn with SVG elements and attributes only: no style
// attribute, no markup.

import { h, svg } from './dom.js';

export const WINDOWS = [['24h', '24 h'], ['7d', '7 d']];
const W = 600;
const H = 150;
const PAD = { left: 34, right: 8, top: 8, bottom: 22 };

/** The chart of `history` (null while it is read), with the window buttons. */
export function utilisationChart(poolId, history, window, setWindow) {
  const buttons = h('div', { class: 'chart-windows', role: 'group', 'aria-label': 'Chart window' },
    WINDOWS.map(([value, label]) => h('button', {
      type: 'button', dataset: { window: value, key: `window:${poolId}:${value}` },
      'aria-pressed': String(value === window), onclick: () => setWindow(poolId, value),
    }, label)));
  const title = `GPUs over the last ${WINDOWS.find(([v]) => v === window)?.[1] || window}`;
  if (!history || !history.points?.length) {
    return h('figure', { class: 'chart', dataset: { chart: poolId } },
      h('figcaption', {}, h('span', { class: 'chart-title' }, title), buttons),
      h('p', { class: 'empty' }, !history ? 'Reading the history…'
        : history.error ? `No history: ${history.error}` : 'No history.'));
  }
  const points = history.points;
  const allocated = points.map((p) => p.allocated);
  const available = points.map((p) => p.available);
  const top = Math.max(1, ...points.map((p) => p.total));
  const t0 = Date.parse(history.from);
  const t1 = Date.parse(history.to);
  const x = (at) => PAD.left + ((Date.parse(at) - t0) / Math.max(1, t1 - t0)) * (W - PAD.left - PAD.right);
  const y = (n) => PAD.top + (1 - n / top) * (H - PAD.top - PAD.bottom);
  const steps = (values) => values.map((v, i) => {
    const here = x(points[i].at);
    const next = i + 1 < points.length ? x(points[i + 1].at) : here;
    return `${i ? 'L' : 'M'}${here.toFixed(1)} ${y(v).toFixed(1)}H${next.toFixed(1)}`;
  }).join('');
  const base = y(0).toFixed(1);
  const area = `${steps(allocated)}V${base}H${x(points[0].at).toFixed(1)}Z`;
  const text = describeSeries(allocated, available, points[points.length - 1].total, title);
  return h('figure', { class: 'chart', dataset: { chart: poolId, window } },
    h('figcaption', {}, h('span', { class: 'chart-title' }, title), buttons),
    svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': text, class: 'chart-svg' },
      svg('title', {}, text),
      svg('line', { class: 'axis', x1: PAD.left, x2: W - PAD.right, y1: base, y2: base }),
      svg('line', { class: 'grid', x1: PAD.left, x2: W - PAD.right, y1: y(top), y2: y(top) }),
      svg('text', { class: 'tick', x: PAD.left - 4, y: y(top) + 4, 'text-anchor': 'end' }, String(top)),
      svg('text', { class: 'tick', x: PAD.left - 4, y: Number(base) + 4, 'text-anchor': 'end' }, '0'),
      svg('text', { class: 'tick', x: PAD.left, y: H - 4 }, shortTime(history.from)),
      svg('text', { class: 'tick', x: W - PAD.right, y: H - 4, 'text-anchor': 'end' }, 'now'),
      svg('path', { class: 'series allocated', d: area, dataset: { series: 'allocated', values: allocated.join(',') } }),
      svg('path', { class: 'series available', d: steps(available), fill: 'none', dataset: { series: 'available', values: available.join(',') } })),
    h('p', { class: 'chart-legend' },
      h('span', { class: 'key allocated' }, 'allocated'), ' now ',
      h('strong', { dataset: { chartField: 'allocated.now' } }, String(allocated[allocated.length - 1])),
      ', peak ', h('strong', { dataset: { chartField: 'allocated.peak' } }, String(Math.max(...allocated))),
      ' · ', h('span', { class: 'key available' }, 'available'), ' now ',
      h('strong', { dataset: { chartField: 'available.now' } }, String(available[available.length - 1])),
      ', lowest ', h('strong', { dataset: { chartField: 'available.lowest' } }, String(Math.min(...available))),
      ` · one point every ${history.step}`));
}

function describeSeries(allocated, available, total, title) {
  return `${title}: allocated now ${allocated[allocated.length - 1]}, peak ${Math.max(...allocated)}; ` +
    `available now ${available[available.length - 1]}, lowest ${Math.min(...available)}; ${total} GPUs now`;
}

function shortTime(text) {
  return String(text).replace('T', ' ').replace(/:\d\d(\.\d+)?Z$/, 'Z');
}
