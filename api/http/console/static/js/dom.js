// Building the DOM safely: every value goes in as text (textContent) or as an attribute
// value, never as markup, and shown by `visible`. No function here parses HTML.

// THE rule of domain/visible.py (docs/security.md, "Text from nodes and tenants"): a
// character of the Unicode categories Cc (controls), Cf (bidi controls, zero-width), Cs (lone
// surrogates), Zl and Zp (line and paragraph separators) is shown escaped, as \xHH below
// U+0100, else \uHHHH or \UHHHHHHHH. tests/unit/test_text_shown.py holds the two equal.
const HIDDEN = /[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]/gu;

function escape(char) {
  const code = char.codePointAt(0);
  const [mark, width] = code < 0x100 ? ['\\x', 2] : code < 0x10000 ? ['\\u', 4] : ['\\U', 8];
  return mark + code.toString(16).padStart(width, '0');
}

/** Text as a person may read it: every hidden character escaped (see HIDDEN). */
export function visible(text) {
  return String(text).replace(HIDDEN, escape);
}

/**
 * h('td', {class: 'num', dataset: {field: 'gpu.total'}}, 8) -> <td class="num" data-field=…>8</td>
 * Children: nodes, strings and numbers (as text), null/undefined/false (skipped), arrays.
 */
export function h(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** The same as h() for SVG elements (charts): svg('path', {d: 'M0 0H10', class: 'line'}). */
export function svg(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

function build(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'dataset') {
      for (const [k, v] of Object.entries(value)) el.dataset[k] = visible(v);
    } else if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'class') {
      el.setAttribute('class', String(value));
    } else if (value === true) {
      el.setAttribute(name, '');
    } else {
      el.setAttribute(name, visible(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(visible(child)));
  }
}

/** An RFC 3339 time, shown to the second in UTC, the full value in the title. */
export function time(value) {
  if (!value) return h('span', { class: 'muted' }, '—');
  const text = String(value);
  const shown = text.replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  return h('time', { datetime: text, title: text }, shown);
}

/** A value as the API gave it: numbers as JavaScript prints them, null as a dash. */
export function value(v) {
  if (v === null || v === undefined) return '—';
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

/** Replace a container's children, keeping the focus on the element with the same data-key. */
export function replace(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.key : undefined;
  container.replaceChildren();
  append(container, children);
  if (key) {
    const again = [...container.querySelectorAll('[data-key]')].find((e) => e.dataset.key === key);
    if (again) again.focus();
  }
}

/** A short opaque id for idempotency keys: console-<20 hex digits>. */
export function newKey() {
  const bytes = new Uint8Array(10);
  crypto.getRandomValues(bytes);
  return 'console-' + [...bytes].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** A definition list of an object's fields, nested objects flattened as a.b. */
export function fields(obj, prefix = '') {
  const rows = [];
  for (const [k, v] of Object.entries(obj || {})) {
    const name = prefix + k;
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      rows.push(...fields(v, name + '.'));
    } else {
      rows.push(h('div', {}, h('dt', {}, name), h('dd', { dataset: { field: name } }, value(v))));
    }
  }
  return prefix ? rows : h('dl', { class: 'fields' }, rows);
}

/** A link to a place in the page (a fragment from route.js), its text as text. */
export function link(fragment, ...children) {
  return h('a', { href: fragment }, ...children);
}

/** An answer's JSON, one click away: a closed disclosure that shows it indented, a line per
 * block (the line breaks are the layout's; text never carries one, by `visible`). */
export function rawJson(value, label = 'Raw JSON') {
  const lines = JSON.stringify(value ?? null, null, 2).split('\n');
  return h('details', { class: 'raw' }, h('summary', {}, label),
    h('pre', { class: 'data', dataset: { raw: '' } }, lines.map((line) => h('span', { class: 'line' }, line))));
}

/**
 * An object as nested fields, as `kubectl describe` prints one: a definition list whose nested
 * objects are definition lists, lists of plain values one line, lists of objects one block
 * each. `data-field` names each value by its path (`binding.nodeId`).
 */
export function describe(obj, prefix = '') {
  return h('dl', { class: 'describe' }, Object.entries(obj || {}).map(([k, v]) => {
    const path = prefix + k;
    let shown;
    if (Array.isArray(v) && v.some((x) => x && typeof x === 'object')) {
      shown = h('ol', { class: 'describe-list' },
        v.map((x, i) => h('li', {}, x && typeof x === 'object' ? describe(x, `${path}.${i}.`) : value(x))));
    } else if (Array.isArray(v)) {
      shown = v.length ? v.map(value).join(', ') : '—';
    } else if (v && typeof v === 'object') {
      shown = Object.keys(v).length ? describe(v, `${path}.`) : '—';
    } else {
      shown = value(v);
    }
    return h('div', {}, h('dt', {}, k), h('dd', { dataset: { field: path } }, shown));
  }));
}
