// ark_stub_crypto.ts — stands in for clients/arkts/SluiceCryptoArk.ets, whose
// CryptoArchitectureKit does not exist under Node: the tests pass
// SluiceHttpClient a WebCrypto implementation instead, so this one is never
// constructed (it throws if it is).
import { SluiceCrypto } from './SluiceSign.js';

export class ArkSluiceCrypto implements SluiceCrypto {
  constructor() {
    throw new Error('stub: CryptoArchitectureKit is not available here; pass a SluiceCrypto');
  }
  utf8(_s: string): Uint8Array {
    return new Uint8Array(0);
  }
  async sha256(_d: Uint8Array): Promise<Uint8Array> {
    return new Uint8Array(0);
  }
  async hmacSha256(_k: Uint8Array, _d: Uint8Array): Promise<Uint8Array> {
    return new Uint8Array(0);
  }
  randomBytes(_n: number): Uint8Array {
    return new Uint8Array(0);
  }
}
