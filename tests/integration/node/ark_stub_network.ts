// ark_stub_network.ts — a stand-in for HarmonyOS's `http` (@kit.NetworkKit /
// @ohos.net.http) over Node's fetch, so that clients/arkts/SluiceHttp.ets can
// be compiled (tsc) and run against the real sluice by
// tests/integration/test_client_kits.py. Only the part SluiceHttp uses, with
// the platform's names and shapes; it records every attempt (the headers
// sent, the status) in `http.attempts` for the test to count.
export namespace http {
  export enum RequestMethod {
    OPTIONS = 'OPTIONS',
    GET = 'GET',
    HEAD = 'HEAD',
    POST = 'POST',
    PUT = 'PUT',
    DELETE = 'DELETE',
    TRACE = 'TRACE',
    CONNECT = 'CONNECT',
  }

  export enum HttpDataType {
    STRING = 0,
    OBJECT = 1,
    ARRAY_BUFFER = 2,
  }

  export interface HttpRequestOptions {
    method?: RequestMethod;
    extraData?: string | Object | ArrayBuffer;
    expectDataType?: HttpDataType;
    header?: Object;
    readTimeout?: number;
    connectTimeout?: number;
  }

  export interface HttpResponse {
    result: string | Object | ArrayBuffer;
    resultType: HttpDataType;
    responseCode: number;
    header: Object;
  }

  export class Attempt {
    method: string = '';
    url: string = '';
    header: Record<string, string> = {};
    bodyBytes: number = 0;
    status: number = 0;
  }

  export const attempts: Attempt[] = [];

  export interface HttpRequest {
    request(url: string, options?: HttpRequestOptions): Promise<HttpResponse>;
    destroy(): void;
  }

  class NodeHttpRequest implements HttpRequest {
    private destroyed: boolean = false;

    async request(url: string, options?: HttpRequestOptions): Promise<HttpResponse> {
      if (this.destroyed) throw new Error('stub http: request after destroy');
      const o = options ?? {};
      const a = new Attempt();
      a.method = o.method ?? RequestMethod.GET;
      a.url = url;
      a.header = { ...((o.header ?? {}) as Record<string, string>) };
      const body = o.extraData;
      if (body !== undefined && !(body instanceof ArrayBuffer) && typeof body !== 'string')
        throw new Error('stub http: SluiceHttp sends strings or ArrayBuffers');
      a.bodyBytes = body === undefined ? 0 : typeof body === 'string' ? body.length : body.byteLength;
      attempts.push(a);
      const r = await fetch(url, { method: a.method, headers: a.header, body: body as BodyInit | undefined });
      a.status = r.status;
      const header: Record<string, string> = {};
      r.headers.forEach((v: string, k: string) => {
        header[k] = v;
      });
      return { result: await r.text(), resultType: HttpDataType.STRING, responseCode: r.status, header };
    }

    destroy(): void {
      this.destroyed = true;
    }
  }

  export function createHttp(): HttpRequest {
    return new NodeHttpRequest();
  }
}
