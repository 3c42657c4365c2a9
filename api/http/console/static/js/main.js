// The console: sign in with a token, then views that follow the event log.
//
// The token is kept in sessionStorage (this tab, this browser session) and sent only in the
// Authorization header. Every number shown is a field of an RPC result, as the CLI prints it.
// Where the page is (a view, its search and filters, or one object) is the URL's fragment
// (route.js), so a link opens it and a reload keeps it.

import { Api, Feed, RpcError } from './api.js';
import { loadObject, renderObject } from './detail.js';
import { h, visible } from './dom.js';
import { FeedView } from './events.js';
import { NODE_FILTERS, NODE_SORTS, renderNodes } from './nodes.js';
import { renderPools } from './pools.js';
import { ReserveForm } from './reserve.js';
import { STATE_FILTERS, renderReservations } from './reservations.js';
import { VIEWS, href, parseRoute } from './route.js';

const TOKEN_KEY = 'better-compute.token';
const HISTORY = 200; // events shown from before the page opened
const POLL_MS = 10000; // GPU telemetry has no events: read the nodes again this often
// A pool's chart is read again after an event (a reservation, a node's change), at most once
// a CHART_MS, and every poll: with events streaming in, a shown pool costs one call a second.
const CHART_MS = 1000;
const TOOLS = { nodes: ['q', 'state', 'sort'], reservations: ['q', 'state', 'pool'] };

const $ = (id) => document.getElementById(id);

const app = {
  api: null,
  me: null,
  feed: null,
  feedView: null,
  reserveForm: null,
  data: null,
  refreshing: null,
  again: false,
  timer: null,
  poll: null,
  route: parseRoute(location.hash),
  object: null, // what the object's page read (a reservation and its events)
  history: new Map(), // `${poolId}:${window}` -> {at, events, answer}
  events: 0, // events read from the stream so far
  polls: 0, // polls so far
  windows: new Map(), // poolId -> the chart's window
  chartTimer: null,
};

function can(me) {
  const write = me.role !== 'read-only';
  return {
    reserve: write,
    changeReservation: (r) => write && (me.rootAdministrator || r.tenantId === me.tenantId),
    cordon: (node) => me.role === 'admin' && (me.rootAdministrator || node.tenantId === me.tenantId),
  };
}

// ----------------------------------------------------------------- signing in and out

async function signIn(token) {
  const api = new Api(token);
  const me = await api.call('system.whoami');
  sessionStorage.setItem(TOKEN_KEY, token);
  app.api = api;
  app.me = me;
  app.can = can(me);
  $('who-text').textContent = visible(`${me.tenantId} · ${me.role}${me.rootAdministrator ? ' · root administrator' : ''}`);
  $('sign-in').hidden = true;
  $('who').hidden = false;
  $('nav').hidden = false;
  app.feedView = new FeedView($('feed'), $('feed-status'), $('feed-types'));
  app.reserveForm = app.can.reserve ? new ReserveForm($('reserve'), app, refreshSoon) : null;
  if (!app.reserveForm) $('reserve').replaceChildren();
  showView(parseRoute(location.hash));
  await refresh();
  await startFeed();
  app.poll = setInterval(() => {
    app.polls += 1;
    refreshSoon();
  }, POLL_MS);
}

function signOut(message = '') {
  sessionStorage.removeItem(TOKEN_KEY);
  if (app.feed) app.feed.stop();
  if (app.feedView) app.feedView.dispose();
  clearInterval(app.poll);
  clearTimeout(app.timer);
  clearTimeout(app.chartTimer);
  Object.assign(app, { api: null, me: null, feed: null, feedView: null, reserveForm: null,
    data: null, poll: null, timer: null, object: null });
  app.history.clear();
  for (const id of ['pools-list', 'nodes-list', 'nodes-count', 'reserve', 'reservations-list',
    'reservations-count', 'feed', 'feed-status', 'who-text', 'live', 'object-title', 'object-body']) {
    $(id).replaceChildren();
  }
  for (const v of [...VIEWS, 'object']) $(`view-${v}`).hidden = true;
  $('who').hidden = true;
  $('nav').hidden = true;
  $('sign-in').hidden = false;
  $('token').value = '';
  $('sign-in-error').textContent = visible(message);
  $('token').focus();
}

// ----------------------------------------------------------------- views and data

function showView(route) {
  app.route = route;
  const shown = route.id ? 'object' : route.view;
  for (const v of [...VIEWS, 'object']) $(`view-${v}`).hidden = v !== shown;
  for (const link of document.querySelectorAll('#nav a')) {
    if (link.dataset.view === route.view) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  syncTools(route);
  if (route.id && app.object?.id !== route.id) app.object = null;
}

/** The list view's controls show its query (a link or a reload opens the list as it was). */
function syncTools(route) {
  for (const name of TOOLS[route.view] || []) {
    if (route.id) return;
    const control = $(`${route.view}-${name}`);
    const want = route.params[name] || '';
    if (control.value !== want) control.value = want;
  }
}

/** The list views' search, filter and sort, as the controls hold them, into the URL (without a
 * new history entry per keystroke) and the list. */
function toolsChanged(view) {
  const params = Object.fromEntries(TOOLS[view].map((n) => [n, $(`${view}-${n}`).value]));
  if (view === 'reservations') params.sort = app.route.params.sort || '';
  history.replaceState(null, '', href(view, null, params));
  app.route = parseRoute(location.hash);
  if (app.data) render();
}

function setSort(value) {
  history.replaceState(null, '', href('reservations', null, { ...app.route.params, sort: value }));
  app.route = parseRoute(location.hash);
  if (app.data) render();
}

function options(select, entries) {
  const chosen = select.value;
  select.replaceChildren(...entries.map(([value, label]) => h('option', { value }, label)));
  select.value = entries.some(([value]) => value === chosen) ? chosen : '';
}

/** Every reservation of tenant ``t`` (the caller's own when null): the server answers a page
 * of at most RESERVATION_PAGE a call, oldest first; a shorter page is the last (docs/api.md). */
const RESERVATION_PAGE = 1000;
async function allReservations(api, t) {
  const all = [];
  let after;
  for (;;) {
    const page = await api.call('reservations.list', {
      ...(t ? { tenantId: t } : {}), limit: RESERVATION_PAGE, ...(after ? { after } : {}) });
    all.push(...page);
    if (page.length < RESERVATION_PAGE) return all;
    after = page[page.length - 1].id;
  }
}

/** Everything the views show, read with the caller's token (so with its isolation). */
async function load(api, me) {
  const [pools, sites, nodeList] = await Promise.all([
    api.call('pools.list'), api.call('sites.list'), api.call('nodes.list'),
  ]);
  const capacity = new Map(await Promise.all(
    pools.map(async (p) => [p.id, await api.call('capacity.get', { poolId: p.id })])));
  // nodes.get adds the node's newest report: GPU health, temperature and utilisation.
  const nodes = await Promise.all(nodeList.map((n) => api.call('nodes.get', { nodeId: n.id })));
  // A root-tenant token reads every tenant's reservations; any other token its own.
  const tenants = me.tenantId === 'root' ? (await api.call('tenants.list')).map((t) => t.id) : [null];
  const lists = await Promise.all(tenants.map((t) => allReservations(api, t)));
  const reservations = lists.flat();
  const route = app.route;
  const object = route.id ? await loadObject(api, route).then((o) => o && { id: route.id, ...o },
    (err) => {
      if (err instanceof RpcError && err.code === 'unauthenticated') throw err;
      return { id: route.id, error: err };
    }) : null;
  const charted = route.view !== 'pools' ? [] : route.id ? [route.id] : pools.map((p) => p.id);
  await loadHistory(api, charted.filter((id) => pools.some((p) => p.id === id)));
  return { data: { pools, sites, capacity, nodes, reservations }, object };
}

function chartWindow(poolId) {
  return app.windows.get(poolId) || '24h';
}

/** The charted pools' capacity.history: read again when an event or a poll came since, at
 * most once a CHART_MS (then a later refresh reads it). */
async function loadHistory(api, poolIds) {
  await Promise.all(poolIds.map(async (poolId) => {
    const span = chartWindow(poolId);
    const key = `${poolId}:${span}`;
    const cached = app.history.get(key);
    const seen = `${app.events}/${app.polls}`;
    if (cached && cached.seen === seen) return;
    const wait = cached ? cached.at + CHART_MS - Date.now() : 0;
    if (wait > 0) {
      clearTimeout(app.chartTimer);
      app.chartTimer = setTimeout(refreshSoon, wait);
      return;
    }
    let answer;
    try {
      answer = await api.call('capacity.history', { poolId, window: span });
    } catch (err) {
      if (err instanceof RpcError && err.code === 'unauthenticated') throw err;
      answer = { error: `${err.code}: ${err.message}` };
    }
    app.history.set(key, { at: Date.now(), seen, answer });
  }));
}

const charts = {
  history: (poolId) => app.history.get(`${poolId}:${chartWindow(poolId)}`)?.answer ?? null,
  window: chartWindow,
  setWindow: (poolId, span) => {
    app.windows.set(poolId, span);
    render();
    refresh();
  },
};

async function refresh() {
  if (app.refreshing) {
    app.again = true;
    return app.refreshing;
  }
  const api = app.api;
  app.refreshing = (async () => {
    try {
      const { data, object } = await load(api, app.me);
      if (api !== app.api) return; // signed out meanwhile
      app.data = data;
      app.object = object;
      render();
    } catch (err) {
      if (api !== app.api) return;
      if (err instanceof RpcError && err.code === 'unauthenticated') {
        signOut(`Signed out (${err.code}): ${err.message}`);
        return;
      }
      setLive('error', `could not read the views: ${err.message}`);
    } finally {
      app.refreshing = null;
    }
    if (app.again && api === app.api) {
      app.again = false;
      await refresh();
    }
  })();
  return app.refreshing;
}

/** Read the views again shortly; events come in bursts, one read follows a burst. */
function refreshSoon() {
  clearTimeout(app.timer);
  app.timer = setTimeout(refresh, 150);
}

function render() {
  const actions = { app, refreshSoon };
  const { data, route } = app;
  renderPools($('pools-list'), data, charts);
  const list = route.view === 'nodes' && !route.id ? route.params : {};
  const nodes = renderNodes($('nodes-list'), data, app.can, actions, list);
  $('nodes-count').textContent = `${nodes} of ${data.nodes.length} nodes`;
  const rsv = route.view === 'reservations' && !route.id ? route.params : {};
  options($('reservations-pool'), [['', 'every pool'],
    ...data.pools.map((p) => [p.id, `${p.name || p.key || p.id} (${p.id})`])]);
  syncTools(route);
  const shown = renderReservations($('reservations-list'), data, app.can, actions, rsv, setSort);
  $('reservations-count').textContent = `${shown} of ${data.reservations.length} reservations`;
  if (app.reserveForm) app.reserveForm.setPools(data.pools);
  if (route.id) {
    const parts = { back: $('object-back'), title: $('object-title'), body: $('object-body') };
    const object = app.object?.id === route.id ? app.object : null;
    if (route.view === 'reservations' && !object) {
      parts.title.textContent = route.id;
      parts.body.replaceChildren(h('p', { class: 'hint' }, 'Reading…'));
    } else if (object?.error) {
      parts.title.textContent = route.id;
      parts.body.replaceChildren(h('p', { class: 'error', role: 'alert' },
        `${object.error.code || 'error'}: ${object.error.message}`));
    } else {
      renderObject(parts, route, object, data, { can: app.can, actions, charts });
    }
  }
}

function setLive(state, detail) {
  const live = $('live');
  live.dataset.state = state;
  live.textContent = state === 'live' ? 'live' : state;
  live.title = detail;
  app.feedView?.status(state, detail);
}

async function startFeed() {
  // Start a little before the head, so the feed shows what just happened.
  const page = await app.api.call('events.list', { limit: 1 });
  const since = Math.max(0, page.head - HISTORY);
  const feed = new Feed(app.api, {
    since,
    onEvent: (event) => {
      app.feedView.add(event);
      app.events += 1;
      refreshSoon();
    },
    onStatus: (state, detail) => {
      if (state === 'live') refreshSoon(); // what changed while the stream was away
      setLive(state, detail);
    },
    onUnauthenticated: (err) => signOut(`Signed out (${err.code}): ${err.message}`),
  });
  app.feed = feed;
  feed.run();
}

// ----------------------------------------------------------------- start

function boot() {
  $('sign-in-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const token = $('token').value.trim();
    $('sign-in-error').textContent = '';
    if (!token) {
      $('sign-in-error').textContent = 'Paste an API token first.';
      return;
    }
    try {
      await signIn(token);
      $('token').value = '';
      $('main').focus();
    } catch (err) {
      signOut(err instanceof RpcError ? `${err.code}: ${err.message}` : String(err));
    }
  });
  $('sign-out').addEventListener('click', () => signOut('Signed out: the token is forgotten.'));
  window.addEventListener('hashchange', () => {
    if (!app.me) return;
    const route = parseRoute(location.hash);
    showView(route);
    if (app.data) render();
    if (route.id || route.view === 'pools') refresh(); // the object, the charts
    // The keyboard and screen readers continue from the new view.
    $(route.id ? 'object-title' : `${route.view}-title`).focus();
  });
  options($('nodes-state'), Object.entries(NODE_FILTERS).map(([v, [label]]) => [v, label]));
  options($('nodes-sort'), Object.entries(NODE_SORTS).map(([v, [label]]) => [v, label]));
  options($('reservations-state'), Object.entries(STATE_FILTERS).map(([v, [label]]) => [v, label]));
  for (const view of Object.keys(TOOLS)) {
    const form = $(`${view}-tools`);
    form.addEventListener('input', () => toolsChanged(view));
    form.addEventListener('submit', (event) => event.preventDefault());
  }
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) {
    signIn(saved).catch((err) => signOut(`Signed out (${err.code}): ${err.message}`));
  } else {
    $('token').focus();
  }
}

boot();
