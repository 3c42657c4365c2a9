// One modal dialog for the actions that change something: it names the object, asks for what
// the call needs, runs it and shows the API's error in place (the dialog stays open).

import { h, visible } from './dom.js';

const $ = (id) => document.getElementById(id);
let current = null;

/**
 * confirmAction({title, text, ok, fields: [{name, label, value, hint}], run(values), done(result)})
 * `run` returns a promise (the RPC call); its RpcError is shown as "code: message".
 */
export function confirmAction(spec) {
  const dialog = $('confirm');
  const opener = document.activeElement;
  current = spec;
  $('confirm-title').textContent = visible(spec.title);
  $('confirm-text').textContent = visible(spec.text || '');
  $('confirm-error').textContent = '';
  $('confirm-ok').textContent = spec.ok;
  $('confirm-fields').replaceChildren(...(spec.fields || []).map((f) => {
    const id = `confirm-field-${f.name}`;
    return h('div', { class: 'stack' },
      h('label', { for: id }, f.label),
      h('input', { id, name: f.name, type: 'text', value: f.value ?? '', autocomplete: 'off',
        spellcheck: 'false', placeholder: f.placeholder }),
      f.hint ? h('span', { class: 'hint' }, f.hint) : null);
  }));
  const key = opener?.dataset?.key;
  dialog.addEventListener('close', () => {
    current = null;
    // Back to the button that opened it, or to its successor when the views were redrawn.
    const back = opener?.isConnected ? opener
      : [...document.querySelectorAll('[data-key]')].find((e) => e.dataset.key === key);
    if (back) back.focus();
  }, { once: true });
  dialog.showModal();
  const first = dialog.querySelector('#confirm-fields input');
  (first || $('confirm-ok')).focus();
}

async function submit(event) {
  event.preventDefault();
  const spec = current;
  if (!spec) return;
  const values = {};
  for (const input of $('confirm-fields').querySelectorAll('input')) values[input.name] = input.value.trim();
  $('confirm-ok').disabled = true;
  $('confirm-error').textContent = '';
  try {
    const result = await spec.run(values);
    $('confirm').close();
    if (spec.done) spec.done(result);
  } catch (err) {
    $('confirm-error').textContent = visible(err.code ? `${err.code}: ${err.message}` : String(err));
  } finally {
    $('confirm-ok').disabled = false;
  }
}

$('confirm-form').addEventListener('submit', submit);
$('confirm-cancel').addEventListener('click', () => $('confirm').close());
