// sluice-sign.ts — the request-signature core shared by the TypeScript and
// ArkTS kits: the canonical string, the HMAC, a fresh nonce and timestamp.
//
// Written within ArkTS's rules (declared types, classes, no `any`, no
// destructuring, no structural typing) so that clients/arkts/SluiceSign.ets
// is this same code; tests/integration/test_client_kits.py checks that the
// two stay identical and runs this one against clients/vectors.json
// (signatures made by `sluice sign`). The crypto primitives differ per
// platform and come in through SluiceCrypto.
//
// The rules (docs/auth.md, auth/auth_sig.c): HMAC-SHA256 keyed with the
// signing key AS TEXT (its 64 hex characters, UTF-8 bytes — never
// hex-decoded) over five lines joined by "\n", no trailing newline:
//   METHOD \n PATH_WITH_QUERY \n TIMESTAMP \n NONCE \n hex(SHA-256(body))
// A nonce is accepted once per token: every attempt of a request, retries
// included, needs its own timestamp, nonce and signature.

export const SLUICE_HEADER_TIMESTAMP: string = 'X-Sluice-Timestamp';
export const SLUICE_HEADER_NONCE: string = 'X-Sluice-Nonce';
export const SLUICE_HEADER_SIGNATURE: string = 'X-Sluice-Signature';

export interface SluiceCrypto {
  utf8(s: string): Uint8Array;
  sha256(data: Uint8Array): Promise<Uint8Array>;
  hmacSha256(key: Uint8Array, data: Uint8Array): Promise<Uint8Array>;
  randomBytes(n: number): Uint8Array;
}

export class SluiceSignature {
  timestamp: string = '';
  nonce: string = '';
  signature: string = '';
  canonical: string = '';
}

const HEX_DIGITS: string = '0123456789abcdef';

// Lowercase hex, as sluice compares it.
export function sluiceHex(b: Uint8Array): string {
  let s = '';
  for (let i = 0; i < b.length; i++) {
    s += HEX_DIGITS.charAt(b[i] >> 4) + HEX_DIGITS.charAt(b[i] & 15);
  }
  return s;
}

export function sluiceCanonical(method: string, pathWithQuery: string, timestamp: string,
                                nonce: string, bodySha256Hex: string): string {
  return method + '\n' + pathWithQuery + '\n' + timestamp + '\n' + nonce + '\n' + bodySha256Hex;
}

// 16 random bytes as 32 hex characters: inside sluice's 16..64 of
// [A-Za-z0-9_-], and 128 bits make a collision within the window moot.
export function sluiceNewNonce(c: SluiceCrypto): string {
  return sluiceHex(c.randomBytes(16));
}

// The signature for given inputs; deterministic (the vectors use it).
// pathWithQuery exactly as it goes on the request line; body the exact bytes sent.
export async function sluiceSignWith(c: SluiceCrypto, signingKey: string, method: string,
                                     pathWithQuery: string, body: Uint8Array, timestamp: string,
                                     nonce: string): Promise<SluiceSignature> {
  const out = new SluiceSignature();
  out.timestamp = timestamp;
  out.nonce = nonce;
  out.canonical = sluiceCanonical(method, pathWithQuery, timestamp, nonce,
                                  sluiceHex(await c.sha256(body)));
  out.signature = sluiceHex(await c.hmacSha256(c.utf8(signingKey), c.utf8(out.canonical)));
  return out;
}

// A fresh signature for one attempt: now's timestamp, a new nonce.
export async function sluiceSign(c: SluiceCrypto, signingKey: string, method: string,
                                 pathWithQuery: string, body: Uint8Array,
                                 nowMs: number): Promise<SluiceSignature> {
  const ts = Math.floor(nowMs / 1000).toString();
  return sluiceSignWith(c, signingKey, method, pathWithQuery, body, ts, sluiceNewNonce(c));
}
