// sluice-fetch.ts — a `fetch` that signs every call it makes for sluice.
//
// Give it to an SDK that takes a fetch (the official `openai` package:
// `new OpenAI({ fetch })`; the Vercel AI SDK: `createOpenAI({ fetch })`).
// The SDK's own retries call fetch again, and each call gets a new
// timestamp, nonce and signature: sluice uses a nonce up even when it answers
// 429 (a replay must never pass later), so re-sending the first attempt's
// headers would be refused as `signature_replay`.
//
// No dependencies: the runtime's fetch and WebCrypto (globalThis.crypto, or
// node:crypto's webcrypto on Node 18, where it is not global yet).

import {
  SLUICE_HEADER_NONCE,
  SLUICE_HEADER_SIGNATURE,
  SLUICE_HEADER_TIMESTAMP,
  type SluiceCrypto,
  sluiceSign,
} from './sluice-sign.js';

// ---- crypto -------------------------------------------------------------------

export class WebSluiceCrypto implements SluiceCrypto {
  private readonly subtle: SubtleCrypto;
  private readonly rng: Crypto;
  // The imported HMAC key of the last signing key: one import per token, not per request.
  private lastKey: string = '';
  private lastCryptoKey: Promise<CryptoKey> | null = null;

  constructor(webcrypto: Crypto) {
    this.subtle = webcrypto.subtle;
    this.rng = webcrypto;
  }

  utf8(s: string): Uint8Array {
    return new TextEncoder().encode(s);
  }

  async sha256(d: Uint8Array): Promise<Uint8Array> {
    return new Uint8Array(await this.subtle.digest('SHA-256', new Uint8Array(d)));
  }

  async hmacSha256(k: Uint8Array, d: Uint8Array): Promise<Uint8Array> {
    const text = new TextDecoder().decode(k);
    if (this.lastCryptoKey === null || text !== this.lastKey) {
      this.lastKey = text;
      this.lastCryptoKey = this.subtle.importKey('raw', new Uint8Array(k),
                                                 { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
    }
    const key = await this.lastCryptoKey;
    return new Uint8Array(await this.subtle.sign('HMAC', key, new Uint8Array(d)));
  }

  randomBytes(n: number): Uint8Array {
    return this.rng.getRandomValues(new Uint8Array(n));
  }
}

let defaultCrypto: Promise<SluiceCrypto> | null = null;

// WebCrypto of the runtime: global in browsers, Node >= 19, Deno, Bun, React
// Native with a polyfill; on Node 18 it is node:crypto's `webcrypto`.
export function sluiceDefaultCrypto(): Promise<SluiceCrypto> {
  if (defaultCrypto === null) {
    defaultCrypto = (async (): Promise<SluiceCrypto> => {
      const g = (globalThis as { crypto?: Crypto }).crypto;
      if (g && g.subtle) return new WebSluiceCrypto(g);
      // Not a literal: bundlers for browsers and React Native leave it alone.
      const name = 'node:crypto';
      const m = (await import(name)) as { webcrypto?: Crypto };
      if (!m.webcrypto || !m.webcrypto.subtle)
        throw new Error('sluice: no WebCrypto here; pass `crypto` to signingFetch');
      return new WebSluiceCrypto(m.webcrypto);
    })();
    defaultCrypto.catch(() => {
      defaultCrypto = null; // not remembered: a later call may pass `crypto`
    });
  }
  return defaultCrypto;
}

// ---- tokens -------------------------------------------------------------------

// What the app holds: the bearer token and its signing key (POST /v1/auth/token
// answers both, called by the app's backend).
export interface SluiceToken {
  accessToken: string;
  signingKey: string;
  // ms since the epoch; absent = never refreshed on time (only after a 401)
  expiresAt?: number;
}

// The endpoint's JSON, as the app's backend passes it on.
export interface SluiceTokenResponse {
  access_token: string;
  signing_key: string;
  expires_in?: number;
}

export interface SluiceTokenSource {
  // The token to use now (called once per attempt: keep it cheap).
  get(): Promise<SluiceToken>;
  // sluice refused the token (401 invalid_token): get a new one next time.
  invalidate?(): void;
}

export interface CachedTokenOptions {
  // refresh this long before expiry (default 60 s), so that a token does not
  // expire between signing and sluice's check
  refreshMarginMs?: number;
  now?: () => number;
}

// A token source over a mint callback (the app's backend, or sluiceTokenEndpoint
// in a backend): caches the token, mints again near expiry or after a 401,
// and shares one mint among the calls that need it at the same time.
export function cachedTokenSource(mint: () => Promise<SluiceTokenResponse | SluiceToken>,
                                  opts: CachedTokenOptions = {}): SluiceTokenSource {
  const margin = opts.refreshMarginMs ?? 60_000;
  const now = opts.now ?? Date.now;
  let current: SluiceToken | null = null;
  let pending: Promise<SluiceToken> | null = null;
  return {
    async get(): Promise<SluiceToken> {
      if (current && (current.expiresAt === undefined || now() < current.expiresAt - margin))
        return current;
      if (!pending) {
        const started = now();
        pending = mint()
          .then((t) => {
            current = normaliseToken(t, started);
            return current;
          })
          .finally(() => {
            pending = null;
          });
      }
      return pending;
    },
    invalidate(): void {
      current = null;
    },
  };
}

function normaliseToken(t: SluiceTokenResponse | SluiceToken, mintedAt: number): SluiceToken {
  if ('accessToken' in t) return t;
  if (typeof t.access_token !== 'string' || typeof t.signing_key !== 'string')
    throw new Error('sluice: the token response lacks access_token or signing_key');
  const out: SluiceToken = { accessToken: t.access_token, signingKey: t.signing_key };
  if (typeof t.expires_in === 'number') out.expiresAt = mintedAt + t.expires_in * 1000;
  return out;
}

export interface TokenEndpointRequest {
  clientId: string;
  clientSecret: string;
  sub: string;
  ttl?: number;
}

// POST /v1/auth/token — for the app's BACKEND (it holds the client secret;
// an app never does). `url` is the endpoint's full URL.
export function sluiceTokenEndpoint(url: string, req: TokenEndpointRequest,
                                    fetchImpl: typeof fetch = fetch):
    () => Promise<SluiceTokenResponse> {
  return async () => {
    const body: Record<string, string | number> = {
      client_id: req.clientId,
      client_secret: req.clientSecret,
      sub: req.sub,
    };
    if (req.ttl !== undefined) body.ttl = req.ttl;
    const r = await fetchImpl(url, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
    });
    const text = await r.text();
    if (!r.ok) throw new Error(`sluice token endpoint: ${r.status} ${text.slice(0, 300)}`);
    return JSON.parse(text) as SluiceTokenResponse;
  };
}

// ---- the fetch ----------------------------------------------------------------

export interface SigningFetchOptions {
  tokens: SluiceTokenSource | (() => Promise<SluiceToken>);
  // the fetch that sends (default: the global one)
  fetch?: typeof fetch;
  crypto?: SluiceCrypto;
  now?: () => number;
}

// The path and query exactly as they go on the request line: WHATWG URL
// serialisation, which is what fetch sends (an empty "?" is kept, the
// fragment never goes out).
export function sluicePathWithQuery(url: string): string {
  const u = new URL(url);
  const href = u.href;
  const hashAt = href.indexOf('#');
  const noHash = hashAt >= 0 ? href.slice(0, hashAt) : href;
  const q = noHash.indexOf('?');
  return u.pathname + (q >= 0 ? noHash.slice(q) : '');
}

type Body = NonNullable<RequestInit['body']>;

// The exact bytes that will be sent, and the Content-Type a body object
// implies (FormData's boundary, URLSearchParams'), which must go with them.
async function bodyBytes(body: Body | null | undefined):
    Promise<{ bytes: Uint8Array<ArrayBuffer>; type: string | null }> {
  if (body === null || body === undefined) return { bytes: new Uint8Array(0), type: null };
  if (typeof body === 'string') return { bytes: new TextEncoder().encode(body), type: null };
  if (body instanceof ArrayBuffer) return { bytes: new Uint8Array(body.slice(0)), type: null };
  if (ArrayBuffer.isView(body)) {
    const copy = new Uint8Array(body.byteLength);
    copy.set(new Uint8Array(body.buffer, body.byteOffset, body.byteLength));
    return { bytes: copy, type: null };
  }
  // Blob, FormData, URLSearchParams, streams: serialised once, here, so that
  // the hash and the wire see the same bytes (a stream is buffered: a
  // signature covers the whole body).
  const r = new Response(body as BodyInit);
  return { bytes: new Uint8Array(await r.arrayBuffer()), type: r.headers.get('content-type') };
}

export function signingFetch(opts: SigningFetchOptions): typeof fetch {
  const base = opts.fetch ?? fetch;
  const now = opts.now ?? Date.now;
  const source: SluiceTokenSource =
    typeof opts.tokens === 'function' ? { get: opts.tokens } : opts.tokens;

  const signed = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    let url: string;
    let method: string;
    let headers: Headers;
    let body: Body | null | undefined;
    let rest: RequestInit = {};
    if (typeof input === 'string' || input instanceof URL) {
      url = input.toString();
      method = (init?.method ?? 'GET').toUpperCase();
      headers = new Headers(init?.headers);
      body = init?.body;
      rest = { ...init };
    } else {
      // A Request: folded with init into one, whose body is read once here.
      const r = new Request(input, init);
      url = r.url;
      method = r.method;
      headers = new Headers(r.headers);
      body = r.body === null ? null : new Uint8Array(await r.arrayBuffer());
      rest = { signal: r.signal, redirect: r.redirect, credentials: r.credentials };
    }
    const crypto = opts.crypto ?? (await sluiceDefaultCrypto());
    const b = await bodyBytes(body);
    const token = await source.get();
    const sig = await sluiceSign(crypto, token.signingKey, method, sluicePathWithQuery(url), b.bytes,
                                 now());
    if (b.type !== null && !headers.has('content-type')) headers.set('Content-Type', b.type);
    headers.set('Authorization', 'Bearer ' + token.accessToken);
    headers.set(SLUICE_HEADER_TIMESTAMP, sig.timestamp);
    headers.set(SLUICE_HEADER_NONCE, sig.nonce);
    headers.set(SLUICE_HEADER_SIGNATURE, sig.signature);
    const sendInit: RequestInit = { ...rest, method, headers };
    if (method !== 'GET' && method !== 'HEAD') sendInit.body = b.bytes;
    else delete sendInit.body;
    delete (sendInit as { duplex?: string }).duplex; // the body is bytes now, not a stream
    const resp = await base(url, sendInit);
    if (resp.status === 401 && source.invalidate &&
        (resp.headers.get('www-authenticate') ?? '').includes('error="invalid_token"'))
      source.invalidate(); // expired or revoked: the next attempt mints a new one
    return resp;
  };
  return signed as typeof fetch;
}
