// index.ts — the TypeScript kit's public surface (see README.md).
export * from './sluice-sign.js';
export * from './sluice-fetch.js';
