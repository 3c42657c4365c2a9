// The console: sign in with a token, then views that follow the event log.
//
// The token is kept in sessionStorage (this tab, this browser session) and sent only in the
// Authorization header. Every number shown is a field of an RPC result, as the CLI prints it.

import { Api, Feed, RpcError } from './api.js';
import { visible } from './dom.js';
import { FeedView } from './events.js';
import { renderNodes } from './nodes.js';
import { renderPools } from './pools.js';
import { ReserveForm } from './reserve.js';
import { renderReservations } from './reservations.js';

const TOKEN_KEY = 'better-compute.token';
const VIEWS = ['pools', 'nodes', 'reservations', 'events'];
const HISTORY = 200; // events shown from before the page opened
const POLL_MS = 10000; // GPU telemetry has no events: read the nodes again this often

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
  showView(location.hash.slice(1));
  await refresh();
  await startFeed();
  app.poll = setInterval(refreshSoon, POLL_MS);
}

function signOut(message = '') {
  sessionStorage.removeItem(TOKEN_KEY);
  if (app.feed) app.feed.stop();
  if (app.feedView) app.feedView.dispose();
  clearInterval(app.poll);
  clearTimeout(app.timer);
  Object.assign(app, { api: null, me: null, feed: null, feedView: null, reserveForm: null,
    data: null, poll: null, timer: null });
  for (const id of ['pools-list', 'nodes-list', 'reserve', 'reservations-list', 'feed', 'feed-status', 'who-text', 'live']) {
    $(id).replaceChildren();
  }
  for (const v of VIEWS) $(`view-${v}`).hidden = true;
  $('who').hidden = true;
  $('nav').hidden = true;
  $('sign-in').hidden = false;
  $('token').value = '';
  $('sign-in-error').textContent = visible(message);
  $('token').focus();
}

// ----------------------------------------------------------------- views and data

function showView(name) {
  const view = VIEWS.includes(name) ? name : 'pools';
  for (const v of VIEWS) $(`view-${v}`).hidden = v !== view;
  for (const link of document.querySelectorAll('#nav a')) {
    if (link.dataset.view === view) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
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
  return { pools, sites, capacity, nodes, reservations };
}

async function refresh() {
  if (app.refreshing) {
    app.again = true;
    return app.refreshing;
  }
  const api = app.api;
  app.refreshing = (async () => {
    try {
      const data = await load(api, app.me);
      if (api !== app.api) return; // signed out meanwhile
      app.data = data;
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
  renderPools($('pools-list'), app.data);
  renderNodes($('nodes-list'), app.data, app.can, actions);
  renderReservations($('reservations-list'), app.data, app.can, actions);
  if (app.reserveForm) app.reserveForm.setPools(app.data.pools);
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
    const view = location.hash.slice(1);
    if (!app.me || !VIEWS.includes(view)) return;
    showView(view);
    $(`${view}-title`).focus(); // the keyboard and screen readers continue from the new view
  });
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) {
    signIn(saved).catch((err) => signOut(`Signed out (${err.code}): ${err.message}`));
  } else {
    $('token').focus();
  }
}

boot();
