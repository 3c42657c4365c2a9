// The same API as the CLI: JSON-RPC 2.0 at /api/compute/rpc and the /events/watch stream,
// with the token in the Authorization header (never in a URL, never logged).

const RPC_URL = '/api/compute/rpc';
const WATCH_URL = '/api/compute/events/watch';

/** A JSON-RPC error: `code` is the stable data.code (docs/api.md#errors). */
export class RpcError extends Error {
  constructor(code, message, data) {
    super(message);
    this.code = code;
    this.data = data;
  }
}

export class Api {
  constructor(token) {
    this.token = token;
    this.nextId = 1;
  }

  headers() {
    return { Authorization: `Bearer ${this.token}` };
  }

  /** Call one method; resolves to its result, rejects with an RpcError. */
  async call(method, params = {}) {
    const body = JSON.stringify({ jsonrpc: '2.0', id: this.nextId++, method, params });
    let response;
    try {
      response = await fetch(RPC_URL, {
        method: 'POST',
        headers: { ...this.headers(), 'Content-Type': 'application/json' },
        body,
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (err) {
      throw new RpcError('unavailable', `the server did not answer (${err.message})`);
    }
    let answer;
    try {
      answer = await response.json();
    } catch {
      throw new RpcError('unavailable', `the server answered HTTP ${response.status}, not JSON`);
    }
    if (answer.error) {
      const data = answer.error.data || {};
      throw new RpcError(data.code || 'error', answer.error.message, data);
    }
    return answer.result;
  }
}

const RETRY_DELAYS_MS = [250, 500, 1000, 2000];

/**
 * Follows /events/watch: every event once, in sequence order, across reconnects.
 *
 * `position` is the last sequence read (an event's, or a heartbeat's `head`, which says every
 * event up to it that this token may see was sent). A reconnect asks for `since=position`, so
 * the server sends exactly what was missed: no gap, no duplicate; an event at or below the
 * position is dropped all the same.
 */
export class Feed {
  constructor(api, { since, onEvent, onStatus, onUnauthenticated }) {
    this.api = api;
    this.position = since;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.onUnauthenticated = onUnauthenticated;
    this.abort = new AbortController();
    this.stopped = false;
  }

  stop() {
    this.stopped = true;
    this.abort.abort();
  }

  async run() {
    let attempt = 0;
    while (!this.stopped) {
      let reason = 'the stream ended';
      try {
        const ok = await this.readOnce();
        if (ok) attempt = 0;
      } catch (err) {
        if (this.stopped) return;
        reason = err instanceof RpcError ? err.message : `the server did not answer (${err.message})`;
        if (err instanceof RpcError && err.code === 'unauthenticated') {
          this.stopped = true;
          this.onUnauthenticated(err);
          return;
        }
      }
      if (this.stopped) return;
      const delay = RETRY_DELAYS_MS[Math.min(attempt, RETRY_DELAYS_MS.length - 1)];
      attempt += 1;
      this.onStatus('reconnecting', `${reason}; reconnecting after sequence ${this.position}`);
      await sleep(delay, this.abort.signal);
    }
  }

  /** One connection: true when it opened (so the next retry starts quickly again). */
  async readOnce() {
    const url = this.position === null ? WATCH_URL : `${WATCH_URL}?since=${this.position}`;
    const response = await fetch(url, {
      headers: this.api.headers(),
      cache: 'no-store',
      credentials: 'omit',
      signal: this.abort.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      const error = body.error || {};
      if (error.code === 'expired') {
        // The position is no longer in the log (a rebuilt store): start again from its head.
        this.position = null;
      }
      throw new RpcError(error.code || 'error', error.message || `HTTP ${response.status}`);
    }
    this.onStatus('live', `following the event log (connected after sequence ${this.position ?? 'head'})`);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return true;
      buffer += value;
      let newline;
      while ((newline = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, newline).trim();
        buffer = buffer.slice(newline + 1);
        if (line) this.line(JSON.parse(line));
      }
    }
  }

  line(message) {
    if (message.heartbeat) {
      if (this.position === null || message.head > this.position) this.position = message.head;
      return;
    }
    if (message.error) {
      if (message.error.code === 'expired') this.position = null;
      throw new RpcError(message.error.code, message.error.message);
    }
    if (this.position !== null && message.sequence <= this.position) return;
    this.position = message.sequence;
    this.onEvent(message);
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/** Event-type globs as the server reads them: `*` matches any run of characters. */
export function typeMatcher(text) {
  const globs = String(text || '').split(',').map((g) => g.trim()).filter(Boolean);
  if (!globs.length) return () => true;
  const patterns = globs.map((g) => new RegExp('^' + g.split('*').map(escapeRegExp).join('.*') + '$'));
  return (type) => patterns.some((p) => p.test(type));
}

function escapeRegExp(s) {
  return s.replace(/[.+?^${}()|[\]\\]/g, '\\$&');
}
